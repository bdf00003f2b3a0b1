//! How the last reload went, for `dedupd reload` to wait on and report:
//! `systemctl reload` then fails when the server refuses the file, not
//! only when the file alone is wrong (the server also checks it against
//! the running settings, and reads the secret files again).
//!
//! The server writes it to `reload-status` in its runtime directory
//! (`$RUNTIME_DIRECTORY`, which systemd's `RuntimeDirectory=` sets for
//! the service and for `ExecReload=`): when it starts serving, when a
//! reload begins, and with each reload's outcome. Each write replaces the
//! file by a rename, so a reader sees one whole status.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The environment variable naming the runtime directory.
pub const DIR_ENV: &str = "RUNTIME_DIRECTORY";
/// The status file's name in it.
pub const FILE: &str = "reload-status";
/// At most this many of a refused reload's errors are kept.
const MAX_ERRORS: usize = 32;

/// Where the server is in its reloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Serving; no reload yet.
    Serving,
    /// Reload `generation` is under way.
    Reloading,
    /// Reload `generation` put the file in force.
    Reloaded,
    /// Reload `generation` was refused: the settings before stay.
    Refused,
}

/// The status file's contents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// Reloads begun since the start.
    pub generation: u64,
    pub state: State,
    /// A refused reload's errors, as the log has them.
    #[serde(default)]
    pub errors: Vec<String>,
    /// Settings a reload put in force found changed but cannot apply:
    /// they keep their running values until a restart (dotted keys).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub restart_only: Vec<String>,
}

impl Status {
    /// The generation whose outcome answers a SIGHUP sent now: the next
    /// to begin. When one is under way (it may have read the files before
    /// they were changed), that is the one after it, which the signal
    /// makes: signals that come during a reload are answered by one more.
    pub fn answering(&self) -> u64 {
        self.generation.saturating_add(1)
    }

    /// Reload `generation` under way, or none yet (`Serving`).
    pub fn at(generation: u64, state: State) -> Self {
        Self {
            generation,
            state,
            errors: Vec::new(),
            restart_only: Vec::new(),
        }
    }

    /// Reload `generation` put the file in force; `restart_only` named.
    pub fn reloaded(generation: u64, restart_only: &[String]) -> Self {
        Self {
            restart_only: restart_only.iter().take(MAX_ERRORS).cloned().collect(),
            ..Self::at(generation, State::Reloaded)
        }
    }

    /// This status's errors, at most [`MAX_ERRORS`] of them.
    pub fn refused(generation: u64, errors: impl IntoIterator<Item = String>) -> Self {
        Self {
            errors: errors.into_iter().take(MAX_ERRORS).collect(),
            ..Self::at(generation, State::Refused)
        }
    }
}

/// The status file's path, when there is a runtime directory (the first
/// of `$RUNTIME_DIRECTORY`'s, which may list several).
pub fn path() -> Option<PathBuf> {
    let dirs = std::env::var_os(DIR_ENV)?;
    let first = std::env::split_paths(&dirs).next()?;
    (!first.as_os_str().is_empty()).then(|| first.join(FILE))
}

/// Replaces the file at `path` with `status`.
pub fn write(path: &Path, status: &Status) -> std::io::Result<()> {
    let tmp = path.with_file_name(format!(".{FILE}.tmp"));
    let _ = std::fs::remove_file(&tmp);
    let mut text = serde_json::to_vec(status)?;
    text.push(b'\n');
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// What is at the status's path is not a file.
fn not_a_file() -> std::io::Error {
    std::io::Error::other("not a regular file (a server writes its reload status as one)")
}

/// The status at `path`: none when there is no such file.
pub fn read(path: &Path) -> std::io::Result<Option<Status>> {
    use std::os::unix::fs::OpenOptionsExt as _;
    // Only a file is opened (a device's open may act), and without waiting:
    // a FIFO put there (by the service's user, in its runtime directory)
    // blocked root's `ExecReload` in `open` until systemd's timeout,
    // whatever `--wait` said. Looked at again once open, in case it was
    // swapped between.
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
        Ok(meta) if !meta.is_file() => return Err(not_a_file()),
        Ok(_) => {}
    }
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    if !file.metadata()?.is_file() {
        return Err(not_a_file());
    }
    let mut text = Vec::new();
    file.take(1 << 16).read_to_end(&mut text)?;
    serde_json::from_slice(&text)
        .map(Some)
        .map_err(std::io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_is_answered_by_the_next_reload_or_the_one_after_a_reload_under_way() {
        let at = Status::at;
        assert_eq!(at(0, State::Serving).answering(), 1);
        assert_eq!(at(3, State::Reloaded).answering(), 4);
        assert_eq!(at(3, State::Refused).answering(), 4);
        // Reload 3 may have read the old file: 4, which the signal makes
        // once 3 ends, answers it (waiting for 5, which nothing makes,
        // failed a reload that went well).
        assert_eq!(at(3, State::Reloading).answering(), 4);
    }

    /// A FIFO, a directory or a device where the status should be is
    /// refused at once, not waited on (a FIFO blocked the reader's `open`
    /// until a writer came, for ever).
    #[test]
    fn a_status_that_is_not_a_file_is_refused_without_waiting() {
        let dir = tempfile::TempDir::new().unwrap();
        let fifo = dir.path().join("fifo");
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
        )
        .unwrap();
        for path in [fifo.as_path(), dir.path(), Path::new("/dev/zero")] {
            let e = read(path).expect_err("not a file");
            assert!(
                e.to_string().contains("not a regular file"),
                "{path:?}: {e}"
            );
        }
    }

    #[test]
    fn a_status_written_is_read_back_and_a_missing_file_is_none() {
        let dir = tempfile::TempDir::new().unwrap();
        let path = dir.path().join(FILE);
        assert_eq!(read(&path).unwrap(), None);
        let status = Status::refused(2, (0..40).map(|i| format!("error {i}")));
        write(&path, &status).unwrap();
        let back = read(&path).unwrap().unwrap();
        assert_eq!(back, status);
        assert_eq!(back.errors.len(), MAX_ERRORS);
        let status = Status::reloaded(3, &["listen".to_owned()]);
        write(&path, &status).unwrap();
        assert_eq!(read(&path).unwrap().unwrap(), status);
        // A status written by a build from before `restart_only` reads.
        std::fs::write(&path, "{\"generation\":1,\"state\":\"reloaded\"}\n").unwrap();
        assert_eq!(
            read(&path).unwrap().unwrap(),
            Status::at(1, State::Reloaded)
        );
    }
}
