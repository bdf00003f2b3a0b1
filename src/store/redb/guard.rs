//! The data file's storage backend: the file behind a switch that refuses
//! every later write, and (in tests) a [`FaultPlan`] that fails writes and
//! syncs on demand.
//!
//! Commits to redb are not durable until a checkpoint; the write-ahead log
//! holds what was answered. When the writer gives a file up — a failed log
//! sync, a disk fault — the commits after the last answered batch must not
//! survive: redb's clean close would make them durable. Throwing the switch
//! first makes that close fail, so the next open starts from the last
//! checkpoint and the log is replayed onto it up to the last batch answered
//! `Ok`.
//!
//! The backend is also where a checkpoint's page writes and sync are
//! handed to another thread ([`SyncGate`]): while the writer has the gate
//! armed, writes are held in memory and reads see them; the armed sync
//! returns at once, and every later write, change of length or sync waits
//! until the held writes and the sync were made. Except a read's: redb's
//! readers write too, to reclaim buffer space from pages a non-durable
//! commit left in its write buffer, but only as best effort (a page whose
//! write fails stays buffered, and the read goes on), so on a thread
//! running a read ([`reading`]) such a write is refused at once rather
//! than waiting. A read can still wait behind the writer when the writer
//! itself waits at the gate holding one of redb's locks (a growth of the
//! file, a write-buffer stripe).

use std::cell::Cell;
use std::fs::File;
use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redb::backends::FileBackend;
use redb::{BackendError, StorageBackend};

use super::faults::FaultPlan;
use super::sync_gate::SyncGate;

thread_local! {
    /// Set while this thread runs a read of the store ([`reading`]).
    static READING: Cell<bool> = const { Cell::new(false) };
}

/// Marks this thread as running a read of the store until the returned
/// guard is dropped: its writes to the file (redb's best-effort reclaims
/// of buffer space) are refused while a checkpoint's sync is being made,
/// instead of waiting for it. Other threads' writes wait, as the writer's
/// must.
pub fn reading() -> Reading {
    READING.with(|r| r.set(true));
    Reading(())
}

/// See [`reading`].
#[must_use]
pub struct Reading(());

impl Drop for Reading {
    fn drop(&mut self) {
        READING.with(|r| r.set(false));
    }
}

fn on_reading_thread() -> bool {
    READING.with(Cell::get)
}

/// The backend with its switch.
#[derive(Debug)]
pub struct GuardedBackend {
    inner: FileBackend,
    /// Once set, writes, syncs and resizes fail.
    refuse: Arc<AtomicBool>,
    /// Faults to inject (tests only).
    faults: Option<Arc<FaultPlan>>,
    /// Where a checkpoint's sync is handed over, and later writes wait.
    gate: Arc<SyncGate>,
}

impl GuardedBackend {
    /// Wraps `file`; `refuse` is the switch, `faults` the test's plan,
    /// `gate` where checkpoints' syncs are handed over.
    pub fn new(
        file: File,
        faults: Option<Arc<FaultPlan>>,
        refuse: Arc<AtomicBool>,
        gate: Arc<SyncGate>,
    ) -> Result<Self, redb::DatabaseError> {
        Ok(Self {
            inner: FileBackend::new(file)?,
            refuse,
            faults,
            gate,
        })
    }

    /// Refused once the file was given up; otherwise waits out a
    /// handed-over sync (failing if it failed).
    fn admit(&self) -> Result<(), std::io::Error> {
        if self.refuse.load(Ordering::SeqCst) {
            return Err(std::io::Error::other(
                "the data file was given up: commits after the last answered batch are discarded",
            ));
        }
        let started = Instant::now();
        let waited = self.gate.wait();
        let took = started.elapsed();
        if took >= Duration::from_millis(1) {
            // Not a checkpoint's own time: a write of redb's (an eviction
            // from its buffer, a growth of the file, the next checkpoint)
            // that came while the last one's pages and sync were made.
            tracing::debug!(
                ms = took.as_millis() as u64,
                "a write to the data file waited for a checkpoint's page writes and sync"
            );
        }
        waited
    }

    /// Writes out page writes still held, ahead of what is about to reach
    /// the file (see [`SyncGate::write_out`]).
    fn write_out_held(&self) -> Result<(), std::io::Error> {
        self.gate
            .write_out(|offset, data| self.inner.write(offset, data))
    }

    /// Reads `out` from `offset` of a file that held writes make `end`
    /// long: what lies past the file's end so far reads as zeros (the
    /// held writes are laid over it). Past `end` too, it is the file's
    /// error, as without held writes.
    fn read_to(&self, offset: u64, out: &mut [u8], end: u64) -> Result<(), std::io::Error> {
        let len = self.inner.len()?;
        if offset + out.len() as u64 > len.max(end) {
            return self.inner.read(offset, out);
        }
        let have = len.saturating_sub(offset).min(out.len() as u64) as usize;
        out[have..].fill(0);
        if have == 0 {
            return Ok(());
        }
        self.inner.read(offset, &mut out[..have])
    }

    /// Whether a write (or, with `sync`, a sync) may go to the file.
    fn check(&self, sync: bool) -> Result<(), std::io::Error> {
        self.admit()?;
        match &self.faults {
            Some(plan) if plan.trip(sync) => Err(FaultPlan::disk_full()),
            _ => Ok(()),
        }
    }
}

impl StorageBackend for GuardedBackend {
    fn len(&self) -> Result<u64, std::io::Error> {
        Ok(self.inner.len()?.max(self.gate.held_end()))
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        self.gate.read(offset, out, |out, held_end| {
            match (self.inner.read(offset, out), held_end) {
                // Past the file's end so far, but not past the held writes.
                (Err(e), Some(end)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    self.read_to(offset, out, end)
                }
                (read, _) => read,
            }
        })
    }

    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        self.check(false)?;
        self.write_out_held()?;
        self.inner.set_len(len)
    }

    fn sync_data(&self) -> Result<(), std::io::Error> {
        self.admit()?;
        if self.gate.hand_over() {
            // The syncing thread writes what was held, makes the sync, and
            // meets the test's faults.
            return Ok(());
        }
        self.check(true)?;
        self.write_out_held()?;
        self.inner.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        if on_reading_thread() && self.gate.pending() {
            // A reader's reclaim of buffer space (best effort in redb): the
            // page stays in redb's buffer, and the read goes on.
            return Err(std::io::Error::new(
                std::io::ErrorKind::WouldBlock,
                "a checkpoint's sync of the data file is being made: the page stays buffered",
            ));
        }
        self.check(false)?;
        if self.gate.hold(offset, data) {
            return Ok(());
        }
        self.write_out_held()?;
        self.inner.write(offset, data)
    }

    fn close(&self) -> Result<(), std::io::Error> {
        self.inner.close()
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.try_lock_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_range(start, end)
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
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;

    fn backend(gate: &Arc<SyncGate>) -> (tempfile::TempDir, GuardedBackend) {
        let dir = tempfile::TempDir::new().unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.path().join("d"))
            .unwrap();
        let b = GuardedBackend::new(file, None, Arc::default(), gate.clone()).unwrap();
        (dir, b)
    }

    #[test]
    fn an_armed_sync_returns_at_once_and_the_next_write_waits_for_it() {
        let gate = Arc::new(SyncGate::default());
        let (dir, b) = backend(&gate);
        let b = Arc::new(b);
        b.write(0, &[1; 4096]).unwrap();
        gate.arm();
        b.sync_data().unwrap();
        // A read's write (a reclaim of buffer space in redb) is refused at
        // once, and changes nothing.
        let other = std::thread::spawn({
            let b = b.clone();
            move || {
                let _reading = reading();
                b.write(4096, &[3; 4096])
            }
        });
        let refused = other.join().unwrap().unwrap_err();
        assert_eq!(refused.kind(), std::io::ErrorKind::WouldBlock);
        let (done, written) = mpsc::channel();
        let writer = {
            let b = b.clone();
            std::thread::spawn(move || {
                let r = b.write(4096, &[2; 4096]);
                let _ = done.send(());
                r
            })
        };
        // Until the handed-over sync is made, the write stays at the gate.
        assert!(
            written.recv_timeout(Duration::from_millis(200)).is_err(),
            "a write went ahead of the checkpoint's sync"
        );
        assert_eq!(
            gate.next_request(Duration::from_secs(5)),
            super::super::sync_gate::Next::Sync
        );
        gate.finish(Ok(()));
        writer.join().unwrap().unwrap();
        assert_eq!(b.len().unwrap(), 8192);
        assert_eq!(on_disk(&dir)[4096..], [2; 4096], "the writer's write");
    }

    fn on_disk(dir: &tempfile::TempDir) -> Vec<u8> {
        std::fs::read(dir.path().join("d")).unwrap()
    }

    /// What the flusher thread does with a handed-over sync: writes the
    /// held pages through a handle of its own, then finishes.
    fn make_handed_over(dir: &tempfile::TempDir, gate: &SyncGate) {
        use std::os::unix::fs::FileExt;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.path().join("d"))
            .unwrap();
        assert_eq!(
            gate.next_request(Duration::from_secs(5)),
            super::super::sync_gate::Next::Sync
        );
        let made = gate
            .write_held(|offset, data| file.write_all_at(data, offset))
            .map(|_| ());
        gate.finish(made);
    }

    #[test]
    fn while_armed_writes_are_held_read_back_and_written_before_the_sync() {
        let gate = Arc::new(SyncGate::default());
        let (dir, b) = backend(&gate);
        b.write(0, &[1; 4096]).unwrap();
        gate.arm();
        b.write(4096, &[2; 4096]).unwrap();
        b.write(8, &[3; 16]).unwrap();
        assert_eq!(
            on_disk(&dir),
            vec![1; 4096],
            "a held write reached the file"
        );
        assert_eq!(b.len().unwrap(), 8192, "the length counts held writes");
        // Reads see the file as it will be, the later write winning.
        let mut out = vec![0; 8192];
        b.read(0, &mut out).unwrap();
        let mut want = vec![1; 4096];
        want[8..24].fill(3);
        want.extend([2; 4096]);
        assert_eq!(out, want);
        assert!(
            b.read(8190, &mut [0; 4]).is_err(),
            "past every write: the file's error"
        );
        b.sync_data().unwrap();
        make_handed_over(&dir, &gate);
        assert_eq!(on_disk(&dir), want);
        // Written: reads go to the file alone again.
        b.read(0, &mut out).unwrap();
        assert_eq!(out, want);
        b.write(0, &[4; 8]).unwrap();
        want[..8].fill(4);
        assert_eq!(on_disk(&dir), want, "not armed: written at once");
    }

    #[test]
    fn held_writes_no_sync_took_reach_the_file_before_anything_after_them() {
        let gate = Arc::new(SyncGate::default());
        let (dir, b) = backend(&gate);
        // A commit that failed before its sync leaves its writes held.
        gate.arm();
        b.write(0, b"aaaa").unwrap();
        gate.disarm();
        b.write(2, b"bb").unwrap();
        assert_eq!(on_disk(&dir), b"aabb");
        gate.arm();
        b.write(4, b"cccc").unwrap();
        gate.disarm();
        b.set_len(6).unwrap();
        assert_eq!(
            on_disk(&dir),
            b"aabbcc",
            "cut after the held write, not before"
        );
        gate.arm();
        b.write(0, b"d").unwrap();
        gate.disarm();
        b.sync_data().unwrap();
        assert_eq!(on_disk(&dir), b"dabbcc", "a sync makes the held writes too");
    }

    #[test]
    fn a_failed_handed_over_sync_keeps_its_writes_readable_until_the_file_is_given_up() {
        let gate = Arc::new(SyncGate::default());
        let (dir, b) = backend(&gate);
        b.write(0, b"old").unwrap();
        gate.arm();
        b.write(0, b"new").unwrap();
        b.sync_data().unwrap();
        assert_eq!(
            gate.next_request(Duration::from_secs(5)),
            super::super::sync_gate::Next::Sync
        );
        gate.finish(Err(std::io::Error::other("no space left on device")));
        let mut out = [0; 3];
        b.read(0, &mut out).unwrap();
        assert_eq!(&out, b"new", "what redb wrote still reads back");
        assert!(b.write(3, b"x").is_err());
        // The reopen forgets them with the file that failed.
        gate.clear();
        b.read(0, &mut out).unwrap();
        assert_eq!(&out, b"old");
        assert_eq!(on_disk(&dir), b"old");
    }

    #[test]
    fn after_a_failed_handed_over_sync_writes_syncs_and_resizes_fail() {
        let gate = Arc::new(SyncGate::default());
        let (_dir, b) = backend(&gate);
        gate.arm();
        b.sync_data().unwrap();
        gate.finish(Err(std::io::Error::other("EIO")));
        assert!(b.write(0, &[1; 16]).is_err());
        assert!(b.sync_data().is_err());
        assert!(b.set_len(0).is_err());
    }
}
