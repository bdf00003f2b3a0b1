//! The subcommands beside `serve`, one file per family:
//!
//! - `backup`: `backup`, `verify` and `restore` of the data file;
//! - `check_config`: print the effective settings or what is wrong;
//! - `init`: write a commented `dedupd.toml` with one source and fresh secrets;
//! - `trigger`: post a signed sample event to a running server;
//! - `receive`: a local application that verifies and prints deliveries;
//! - `reload`: check the configuration and send SIGHUP to a serving dedupd
//!   (what the unit's `ExecReload=` runs);
//! - `credentials`: `stage-credentials`, root-only secrets copied for the
//!   service's dynamic user before each start and reload;
//! - `inbox`: `inbox migrate`, a local inbox into the shared one;
//! - `operator`: the `/v1` operator API from the terminal (`events`,
//!   `claims`, `streams`);
//! - `jobs`: bulk redelivery and erasure (`events redeliver|erase` with a
//!   filter) and `jobs list|show|cancel`;
//! - `docs`: `completions` and `man`, what the package installs;
//!
//! and below them, what they share, none importing the ones above:
//!
//! - `call`: an operator command's flags, its request and its answer
//!   printed;
//! - `client`: where the server is, which token, and errors that say what
//!   to do;
//! - `filter`: which events a count or a bulk job means;
//! - `table`: tables, times and JSON values for a terminal;
//! - `out`: standard output that reports a failed write (a reader gone
//!   away ends a command quietly) instead of panicking.

pub mod backup;
mod call;
pub mod check_config;
pub mod client;
pub mod credentials;
pub mod docs;
mod filter;
pub mod inbox;
pub mod init;
pub mod jobs;
pub mod operator;
pub mod out;
pub mod receive;
pub mod reload;
mod table;
pub mod trigger;

use std::path::Path;
use std::sync::Arc;

use dedupd::config::{ConfigErrors, Loaded, Settings};
use dedupd::gateway::Source;
use dedupd::gateway::sources::build_sources;

/// Loads the settings and builds the sources from them: every mistake of
/// either kind, each naming its key and where its value came from.
pub fn load(file: Option<&Path>) -> Result<(Loaded, Vec<Arc<Source>>), ConfigErrors> {
    let loaded = Settings::load_checked(file, |l| build_sources(l).map(|_| ()))?;
    let sources = build_sources(&loaded)?;
    Ok((loaded, sources))
}

/// A runtime for a client command: one thread is plenty.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// The longest `--wait` a command takes: far past any reload or delivery,
/// and within what a deadline can hold (`--wait 300000000000y` parsed,
/// then overflowed the deadline after the signal had gone).
const MAX_WAIT: std::time::Duration = std::time::Duration::from_secs(365 * 24 * 3600);

/// A `--wait` duration (`30s`, `2m`), at most a year.
pub fn parse_wait(text: &str) -> Result<std::time::Duration, String> {
    let wait = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if wait > MAX_WAIT {
        return Err(format!(
            "{text} is longer than the most a command waits, {}",
            humantime::format_duration(MAX_WAIT)
        ));
    }
    Ok(wait)
}

/// Now, in Unix seconds: what signatures carry.
pub fn now_unix_s() -> i64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(now.as_secs()).unwrap_or(i64::MAX)
}

/// An error and its causes on one line, as `{:#}` writes them (`a: b: c`),
/// but a cause whose text the line already holds left out: many errors
/// name their cause in their own message too, and the line said it twice
/// ("No space left on device: No space left on device").
pub fn error_text(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let said = cause.to_string();
        if text.contains(&said) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&said);
    }
    text
}

#[cfg(test)]
mod error_text_tests {
    use super::error_text;

    #[derive(Debug, thiserror::Error)]
    #[error("writing the backup failed: {0}")]
    struct Wrapped(#[source] std::io::Error);

    #[test]
    fn a_cause_the_message_already_names_is_said_once() {
        let io = std::io::Error::other("No space left on device");
        let e = anyhow::Error::new(Wrapped(io)).context("no backup was written to /b");
        assert_eq!(
            error_text(&e),
            "no backup was written to /b: writing the backup failed: No space left on device"
        );
        // A cause the messages do not hold is still said.
        let e = anyhow::Error::new(std::io::Error::other("disk on fire")).context("reading x");
        assert_eq!(error_text(&e), "reading x: disk on fire");
    }
}
