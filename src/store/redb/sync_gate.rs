//! A checkpoint's sync of the data file, handed to another thread so the
//! writer can go on (docs/design/sustained-claims.md, "The next step").
//!
//! The writer arms the gate before a checkpoint's durable commit; redb's
//! commit then calls the backend's `sync_data`, which hands the sync over
//! instead of making it, and returns. Until the syncing thread has made it,
//! every later write to the file, change of its length or other sync waits
//! at the gate: nothing written after the checkpoint reaches the file
//! before the checkpoint is durable, so the pages redb reuses after it
//! (the previous checkpoint's, which a crash could still fall back to) are
//! never overwritten early. A handed-over sync that failed fails every
//! later wait: the file has to be given up and reopened.
//!
//! The checkpoint's page writes are handed over too: while the gate is
//! armed, the backend holds them in memory ([`PendingPages`]) instead of
//! writing them, reads of the file see them laid over it, and the syncing
//! thread writes them out, in order, just before the sync. A write, change
//! of length or sync made while some are still held (one the gate did not
//! hand over) first writes them out where it is made.
//!
//! The log cannot be emptied until the sync is made, while the writer goes
//! on appending: so it is kept in two segments (see [`super::writer`]), and
//! the one a checkpoint covered is emptied only once this gate says the
//! checkpoint's sync was made.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{
    Condvar, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard,
};
use std::time::{Duration, Instant};

use super::pending_pages::PendingPages;

/// What the syncing thread is to do next ([`SyncGate::next_request`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Make the handed-over sync, then [`SyncGate::finish`].
    Sync,
    /// Nothing was handed over in the time given.
    Idle,
    /// Closed, and nothing is pending: stop.
    Stop,
}

/// The gate between the writer, the data file's backend and the thread
/// that makes the handed-over syncs.
#[derive(Debug, Default)]
pub struct SyncGate {
    state: Mutex<State>,
    changed: Condvar,
    /// The page writes made while armed, not yet in the file. Taken after
    /// `state` where both are. Read (shared) while the syncing thread
    /// writes them out, so reads of the file go on meanwhile.
    pages: RwLock<PendingPages>,
    /// Some page writes are held: reads have to look at them.
    held: AtomicBool,
}

#[derive(Debug, Default)]
struct State {
    /// The next sync is handed over.
    armed: bool,
    /// A handed-over sync not yet made.
    pending: bool,
    /// Why a handed-over sync failed; it stays failed (until
    /// [`SyncGate::clear`]).
    failed: Option<String>,
    /// Closed: nothing more is handed over (the syncing thread stops).
    closed: bool,
}

impl SyncGate {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn pages(&self) -> RwLockReadGuard<'_, PendingPages> {
        self.pages.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn pages_mut(&self) -> RwLockWriteGuard<'_, PendingPages> {
        self.pages.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The next sync of the file is handed over instead of made.
    pub fn arm(&self) {
        self.state().armed = true;
    }

    /// Takes back an [`SyncGate::arm`] that no sync used (a commit that
    /// failed before its sync).
    pub fn disarm(&self) {
        self.state().armed = false;
    }

    /// For the backend's `sync_data`: whether this sync is handed over
    /// (the caller returns at once).
    pub fn hand_over(&self) -> bool {
        let mut s = self.state();
        if !std::mem::take(&mut s.armed) || s.closed {
            return false;
        }
        s.pending = true;
        self.changed.notify_all();
        true
    }

    /// Whether a handed-over sync is not made yet: the writer's writes
    /// wait for it.
    pub fn pending(&self) -> bool {
        self.state().pending
    }

    /// For the backend's `write`: while armed, holds a copy of the write
    /// for the syncing thread to make, and says so (the caller returns at
    /// once); otherwise `false`, and the caller writes.
    pub fn hold(&self, offset: u64, data: &[u8]) -> bool {
        let s = self.state();
        if !s.armed || s.closed {
            return false;
        }
        let mut pages = self.pages_mut();
        pages.push(offset, data);
        // Before the lock goes: a read after it takes the overlay.
        self.held.store(true, Ordering::Release);
        true
    }

    /// For the backend's `read`: reads with `read_file`, then lays the
    /// page writes still held over what it read. With some held,
    /// `read_file` is given where they end: the file is that long once
    /// they are written, so a read up to there is not past its end.
    pub fn read(
        &self,
        offset: u64,
        out: &mut [u8],
        read_file: impl FnOnce(&mut [u8], Option<u64>) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        // Cleared once they are in the file (see `finish`), or with the
        // file they were for closed (`clear`).
        if !self.held.load(Ordering::Acquire) {
            return read_file(out, None);
        }
        // Under the lock: they are forgotten only once written (or the
        // file closed), so this reads either the file with them or the
        // overlay.
        let pages = self.pages();
        read_file(out, Some(pages.end()))?;
        pages.overlay(offset, out);
        Ok(())
    }

    /// Where the page writes held end (0 with none): the file's length
    /// counts them.
    pub fn held_end(&self) -> u64 {
        if !self.held.load(Ordering::Acquire) {
            return 0;
        }
        self.pages().end()
    }

    /// For a write, change of length or sync the gate does not hand over:
    /// writes out with `write` the page writes still held (an armed commit
    /// that failed before its sync, or one not handed over), so nothing
    /// reaches the file ahead of them.
    pub fn write_out(
        &self,
        write: impl FnMut(u64, &[u8]) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        if !self.held.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut pages = self.pages_mut();
        if pages.is_empty() {
            return Ok(());
        }
        pages.write_all(write)?;
        pages.clear();
        self.held.store(false, Ordering::Release);
        Ok(())
    }

    /// For the syncing thread: writes out with `write` the page writes to
    /// make before the handed-over sync, in order; returns how many. They
    /// stay held (and read) until [`SyncGate::finish`].
    pub fn write_held(
        &self,
        write: impl FnMut(u64, &[u8]) -> std::io::Result<()>,
    ) -> std::io::Result<usize> {
        let pages = self.pages();
        pages.write_all(write)?;
        Ok(pages.len())
    }

    /// Waits until no handed-over sync is pending. The error of one that
    /// failed, now and from then on.
    pub fn wait(&self) -> std::io::Result<()> {
        let mut s = self.state();
        while s.pending {
            s = self.changed.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
        match &s.failed {
            Some(why) => Err(std::io::Error::other(format!(
                "a checkpoint's sync of the data file failed: {why}"
            ))),
            None => Ok(()),
        }
    }

    /// For the syncing thread: waits up to `timeout` for a handed-over
    /// sync. Decided under one lock, so a sync handed over before the gate
    /// closed is always made: the thread stops only once closed with
    /// nothing pending.
    pub fn next_request(&self, timeout: Duration) -> Next {
        let deadline = Instant::now() + timeout;
        let mut s = self.state();
        while !s.pending {
            if s.closed {
                return Next::Stop;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Next::Idle;
            }
            s = self
                .changed
                .wait_timeout(s, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        Next::Sync
    }

    /// For the syncing thread: the handed-over sync was made (or failed),
    /// and what waits for it goes on.
    pub fn finish(&self, result: std::io::Result<()>) {
        let mut s = self.state();
        if s.pending {
            match result {
                // They are in the file now.
                Ok(()) => {
                    self.pages_mut().clear();
                    self.held.store(false, Ordering::Release);
                }
                // Kept, and read, until the file is given up (`clear`).
                Err(e) => {
                    s.failed.get_or_insert_with(|| e.to_string());
                }
            }
            s.pending = false;
        }
        self.changed.notify_all();
    }

    /// Hands nothing over from now on (syncs are made where they are
    /// asked), and wakes the syncing thread so it can stop; one still
    /// pending is its to make first ([`SyncGate::next_request`] reports it).
    pub fn close(&self) {
        self.state().closed = true;
        self.changed.notify_all();
    }

    /// For a reopen after a disk fault, once the file that failed is
    /// closed: waits out a sync still pending, then forgets a failure and
    /// the page writes still held for that file, so the reopened file
    /// starts with a gate that lets writes through.
    pub fn clear(&self) {
        let _ = self.wait();
        let mut s = self.state();
        s.failed = None;
        s.armed = false;
        self.pages_mut().clear();
        self.held.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    #[test]
    fn only_an_armed_sync_is_handed_over_and_only_once() {
        let gate = SyncGate::default();
        assert!(!gate.hand_over());
        gate.arm();
        assert!(gate.hand_over());
        assert!(!gate.hand_over(), "the arming is used up");
        gate.arm();
        gate.disarm();
        assert!(!gate.hand_over());
    }

    #[test]
    fn a_write_waits_until_the_handed_over_sync_is_made() {
        let gate = Arc::new(SyncGate::default());
        gate.arm();
        assert!(gate.hand_over());
        let passed = Arc::new(AtomicBool::new(false));
        let writer = {
            let (gate, passed) = (gate.clone(), passed.clone());
            std::thread::spawn(move || {
                gate.wait().unwrap();
                passed.store(true, Ordering::SeqCst);
            })
        };
        // The syncing thread takes the request; until it finishes, the
        // write stays at the gate.
        assert_eq!(gate.next_request(Duration::from_secs(5)), Next::Sync);
        assert!(!passed.load(Ordering::SeqCst));
        gate.finish(Ok(()));
        writer.join().unwrap();
        assert!(passed.load(Ordering::SeqCst));
        assert_eq!(
            gate.next_request(Duration::from_millis(1)),
            Next::Idle,
            "nothing is pending once it is made"
        );
    }

    #[test]
    fn a_failed_sync_fails_every_later_wait() {
        let gate = SyncGate::default();
        gate.arm();
        assert!(gate.hand_over());
        gate.finish(Err(std::io::Error::other("no space left on device")));
        for _ in 0..2 {
            let e = gate.wait().unwrap_err();
            assert!(e.to_string().contains("no space left"), "{e}");
        }
        assert_eq!(
            gate.next_request(Duration::from_millis(1)),
            Next::Idle,
            "no longer pending, though it failed: nothing waits for it"
        );
    }

    #[test]
    fn a_closed_gate_hands_nothing_over_and_a_clear_forgets_a_failure() {
        let gate = SyncGate::default();
        gate.arm();
        assert!(gate.hand_over());
        gate.finish(Err(std::io::Error::other("gone")));
        assert!(gate.wait().is_err());
        gate.clear();
        gate.wait().unwrap();
        gate.close();
        gate.arm();
        assert!(!gate.hand_over(), "closed: the sync is made where asked");
        assert_eq!(
            gate.next_request(Duration::from_secs(3600)),
            Next::Stop,
            "a closed gate does not keep its thread waiting"
        );
    }

    #[test]
    fn a_sync_handed_over_before_the_gate_closed_is_made_before_the_thread_stops() {
        let gate = SyncGate::default();
        // The thread's wait ran out just before the hand-over and the close.
        assert_eq!(gate.next_request(Duration::ZERO), Next::Idle);
        gate.arm();
        assert!(gate.hand_over());
        gate.close();
        assert_eq!(gate.next_request(Duration::from_secs(3600)), Next::Sync);
        gate.finish(Ok(()));
        gate.wait().unwrap();
        assert_eq!(gate.next_request(Duration::from_secs(3600)), Next::Stop);
    }

    #[test]
    fn a_finish_with_nothing_pending_records_no_failure() {
        let gate = SyncGate::default();
        gate.finish(Err(std::io::Error::other("a periodic sync failed")));
        gate.wait().unwrap();
    }

    #[test]
    fn with_nothing_handed_over_the_syncing_thread_waits_out_its_timeout() {
        let gate = SyncGate::default();
        assert_eq!(gate.next_request(Duration::from_millis(1)), Next::Idle);
        gate.wait().unwrap();
        gate.finish(Err(std::io::Error::other("a periodic sync failed")));
        gate.wait().unwrap();
    }
}
