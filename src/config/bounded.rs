//! Reading the files a configuration names (the settings file, secret and
//! token files) so that no file can hang or exhaust the process: only a
//! plain file, at most a bounded size. A FIFO would block a start, a
//! reload and then the stop waiting on it; `/dev/zero` would grow a
//! string until the kernel kills the process.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use rustix::fs::{FileType, Mode, OFlags};

/// The largest secrets or token file read: thousands of tokens fit.
pub const MAX_SECRETS_FILE: u64 = 1 << 20;
/// The largest settings file read.
pub const MAX_SETTINGS_FILE: u64 = 16 << 20;

/// The text of the plain file at `path` (links followed), refused when
/// it is anything else or longer than `max` bytes. The error says which
/// and is meant to follow "cannot read PATH: ".
pub fn read_text(path: &Path, max: u64) -> Result<String, String> {
    // Without waiting for a writer if it is a FIFO: it is refused below.
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::empty(),
    )
    .map_err(|e| std::io::Error::from(e).to_string())?;
    let stat = rustix::fs::fstat(&fd).map_err(|e| std::io::Error::from(e).to_string())?;
    let kind = FileType::from_raw_mode(stat.st_mode);
    if kind != FileType::RegularFile {
        return Err(format!(
            "it is not a plain file (a {}): name a file",
            match kind {
                FileType::Directory => "directory",
                FileType::Fifo => "FIFO",
                FileType::CharacterDevice | FileType::BlockDevice => "device",
                FileType::Socket => "socket",
                _ => "special file",
            }
        ));
    }
    let too_long = || format!("it is longer than {max} bytes");
    if u64::try_from(stat.st_size).unwrap_or(u64::MAX) > max {
        return Err(too_long());
    }
    let mut bytes = Vec::new();
    File::from(fd)
        .take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > max {
        return Err(too_long());
    }
    String::from_utf8(bytes).map_err(|_| "it is not UTF-8 text".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_file_is_read_and_anything_else_refused_at_once() {
        let dir = tempfile::TempDir::new().unwrap();
        let file = dir.path().join("tokens");
        std::fs::write(&file, "one\ntwo\n").unwrap();
        assert_eq!(read_text(&file, 100).unwrap(), "one\ntwo\n");
        assert_eq!(
            read_text(&file, 4).unwrap_err(),
            "it is longer than 4 bytes"
        );
        assert!(
            read_text(dir.path(), 100)
                .unwrap_err()
                .contains("directory")
        );
        assert!(
            read_text(Path::new("/dev/zero"), 100)
                .unwrap_err()
                .contains("device")
        );
        let fifo = dir.path().join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        // Refused at once: no writer ever comes.
        assert!(read_text(&fifo, 100).unwrap_err().contains("FIFO"));
        std::fs::write(&file, [0xff, 0xfe]).unwrap();
        assert_eq!(read_text(&file, 100).unwrap_err(), "it is not UTF-8 text");
    }
}
