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
//! The backend is also where a checkpoint's sync is handed to another
//! thread ([`SyncGate`]): a sync the writer armed returns at once, and
//! every later write, change of length or sync waits until it was made.

use std::fs::File;
use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use redb::backends::FileBackend;
use redb::{BackendError, StorageBackend};

use super::faults::FaultPlan;
use super::sync_gate::SyncGate;

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
        self.gate.wait()
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
        self.inner.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        self.inner.read(offset, out)
    }

    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        self.check(false)?;
        self.inner.set_len(len)
    }

    fn sync_data(&self) -> Result<(), std::io::Error> {
        self.admit()?;
        if self.gate.hand_over() {
            // The syncing thread makes it (and meets the test's faults).
            return Ok(());
        }
        self.check(true)?;
        self.inner.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        self.check(false)?;
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
        let (_dir, b) = backend(&gate);
        let b = Arc::new(b);
        b.write(0, &[1; 4096]).unwrap();
        gate.arm();
        b.sync_data().unwrap();
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
