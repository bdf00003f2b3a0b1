//! Standard output for the subcommands. Every line goes through [`outln!`]
//! or [`out!`], which hand back a failed write instead of panicking as
//! `println!` does. A reader that went away (`dedupd events list | head -1`)
//! is not a failure: `main` ends the command quietly with success
//! ([`reader_left`]), as the shell's own tools end on `SIGPIPE` (which Rust
//! ignores, and `#![forbid(unsafe_code)]` keeps us from restoring).

use std::io::ErrorKind;

/// A write to standard output failed.
#[derive(Debug, thiserror::Error)]
#[error("writing to standard output: {0}")]
pub struct StdoutError(pub std::io::Error);

/// What printing returns.
pub type Printed = Result<(), StdoutError>;

/// Whether `e` (or an error in its chain) is standard output's reader
/// having gone away. Only a write through [`outln!`] or [`out!`] counts: a
/// broken pipe to the server is an error like any other.
pub fn reader_left(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<StdoutError>()
            .is_some_and(|s| s.0.kind() == ErrorKind::BrokenPipe)
    })
}

/// `print!` that returns the write's [`Printed`].
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        write!(std::io::stdout().lock(), $($arg)*).map_err($crate::cli::out::StdoutError)
    }};
}

/// `println!` that returns the write's [`Printed`].
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*).map_err($crate::cli::out::StdoutError)
    }};
}

pub(crate) use {out, outln};
