//! A data file opened by redb without a byte written to it: for `verify`,
//! and to read the schema of a file a crash left before it is opened for
//! writing ([`super::migrate::refuse_newer`]).
//!
//! redb's read-only open refuses a file a crash left (it would have to be
//! repaired), and only a writable open checks every page's checksum
//! (`Builder::set_check_integrity_on_open`), which ends in a commit. So
//! `verify` opens the file writable through [`Overlay`]: reads come from
//! the file, and whatever redb writes (the repair, the check's commit)
//! stays in memory, a 4 KiB page at a time, and is dropped with it. The
//! file is opened read-only; its locks are taken shared, so a server that
//! has it open (an exclusive lock) makes the open fail as in use, and a
//! server cannot start while it is verified.

use std::collections::HashMap;
use std::fs::File;
use std::ops::Bound;
use std::sync::Mutex;

use redb::backends::FileBackend;
use redb::{BackendError, StorageBackend};

/// Bytes of a page of the overlay.
const PAGE: u64 = 4096;
/// Most bytes redb may write to the overlay (a repair and the check's
/// commit write the allocator's state: a few MiB for a file of gigabytes).
const MOST: usize = 512 << 20;

/// The file, with redb's writes kept in memory.
#[derive(Debug)]
pub struct Overlay {
    inner: FileBackend,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// The length redb sees.
    len: u64,
    /// Bytes of the file that still show through (a shrink hides the rest).
    file_len: u64,
    /// Pages written, by their offset.
    pages: HashMap<u64, Box<[u8]>>,
}

impl Overlay {
    /// The file `file` (opened read-only), nothing written yet.
    pub fn new(file: File) -> std::io::Result<Self> {
        let len = file.metadata()?.len();
        Ok(Self {
            inner: FileBackend::new(file).map_err(std::io::Error::other)?,
            state: Mutex::new(State {
                len,
                file_len: len,
                pages: HashMap::new(),
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl State {
    /// Reads `out` at `offset` from the file (zeros past what shows of it).
    fn read_file(&self, inner: &FileBackend, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        let end = offset + out.len() as u64;
        let shown = self.file_len.clamp(offset, end);
        let (from_file, zeros) = out.split_at_mut((shown - offset) as usize);
        if !from_file.is_empty() {
            inner.read(offset, from_file)?;
        }
        zeros.fill(0);
        Ok(())
    }
}

impl StorageBackend for Overlay {
    fn len(&self) -> Result<u64, std::io::Error> {
        Ok(self.lock().len)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        let state = self.lock();
        let end = offset + out.len() as u64;
        if end > state.len {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "read past the end",
            ));
        }
        state.read_file(&self.inner, offset, out)?;
        let mut page = offset / PAGE * PAGE;
        while page < end {
            if let Some(bytes) = state.pages.get(&page) {
                let from = offset.max(page);
                let to = end.min(page + PAGE);
                out[(from - offset) as usize..(to - offset) as usize]
                    .copy_from_slice(&bytes[(from - page) as usize..(to - page) as usize]);
            }
            page += PAGE;
        }
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        let mut state = self.lock();
        if len < state.len {
            state.file_len = state.file_len.min(len);
            state.pages.retain(|&p, _| p < len);
            let edge = len / PAGE * PAGE;
            if let Some(bytes) = state.pages.get_mut(&edge) {
                bytes[(len - edge) as usize..].fill(0);
            }
        }
        state.len = len;
        Ok(())
    }

    fn sync_data(&self) -> Result<(), std::io::Error> {
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        let mut state = self.lock();
        let end = offset + data.len() as u64;
        let mut page = offset / PAGE * PAGE;
        while page < end {
            if !state.pages.contains_key(&page) {
                if state.pages.len() * PAGE as usize >= MOST {
                    return Err(std::io::Error::other(
                        "verifying would hold more than 512 MiB of redb's writes in memory",
                    ));
                }
                let mut bytes = vec![0u8; PAGE as usize].into_boxed_slice();
                state.read_file(&self.inner, page, &mut bytes)?;
                state.pages.insert(page, bytes);
            }
            let from = offset.max(page);
            let to = end.min(page + PAGE);
            if let Some(bytes) = state.pages.get_mut(&page) {
                bytes[(from - page) as usize..(to - page) as usize]
                    .copy_from_slice(&data[(from - offset) as usize..(to - offset) as usize]);
            }
            page += PAGE;
        }
        state.len = state.len.max(end);
        Ok(())
    }

    fn close(&self) -> Result<(), std::io::Error> {
        self.inner.close()
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_shared_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.query_lock_range(start, end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_stay_in_memory_and_read_back_over_the_file() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("f");
        std::fs::write(&path, vec![7u8; 10_000]).expect("write");
        let o = Overlay::new(File::open(&path).expect("open")).expect("overlay");
        o.write(4090, &[1; 20]).expect("write");
        o.set_len(12_000).expect("grow");
        let mut out = vec![0u8; 12_000];
        o.read(0, &mut out).expect("read");
        assert!(out[..4090].iter().all(|&b| b == 7));
        assert!(out[4090..4110].iter().all(|&b| b == 1));
        assert!(out[4110..10_000].iter().all(|&b| b == 7));
        assert!(out[10_000..].iter().all(|&b| b == 0), "grown with zeros");
        o.set_len(5000).expect("shrink");
        o.set_len(12_000).expect("grow");
        o.read(0, &mut out).expect("read");
        assert!(out[5000..].iter().all(|&b| b == 0), "a shrink forgets");
        assert!(o.read(11_000, &mut [0u8; 2000]).is_err());
        assert_eq!(std::fs::read(&path).expect("read"), vec![7u8; 10_000]);
    }
}
