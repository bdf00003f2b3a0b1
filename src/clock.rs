//! Time as the store sees it: wall-clock Unix milliseconds, as in Redis.
//!
//! Everything that decides expiry reads a [`Clock`], so tests move time by
//! hand with [`ManualClock`] instead of sleeping.

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

/// Unix time in milliseconds.
pub type Millis = u64;

/// A source of wall-clock time.
pub trait Clock: Send + Sync + Debug + 'static {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> Millis;

    /// For a clock moved by hand: a receiver that sees every move, so a
    /// task waiting for a time wakes when the clock is moved rather than on
    /// its next real-time poll. `None` for a clock that moves by itself.
    fn moves(&self) -> Option<watch::Receiver<Millis>> {
        None
    }
}

/// The system's real-time clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> Millis {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            // A clock before 1970 is a broken machine; treat it as the epoch.
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// A clock that only moves when told to. Cheap to clone; clones share time.
#[derive(Debug, Clone)]
pub struct ManualClock {
    /// Current time in Unix milliseconds, shared by every clone.
    now: Arc<AtomicU64>,
    /// Tells waiters that the clock moved.
    moved: Arc<watch::Sender<Millis>>,
}

impl ManualClock {
    /// A clock standing at `start_ms`.
    pub fn new(start_ms: Millis) -> Self {
        Self {
            now: Arc::new(AtomicU64::new(start_ms)),
            moved: Arc::new(watch::Sender::new(start_ms)),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let ms = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        let now = self.now.fetch_add(ms, Ordering::SeqCst).saturating_add(ms);
        self.moved.send_replace(now);
    }

    /// Sets the clock to `ms`, which may be earlier than now.
    pub fn set(&self, ms: Millis) {
        self.now.store(ms, Ordering::SeqCst);
        self.moved.send_replace(ms);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> Millis {
        self.now.load(Ordering::SeqCst)
    }

    fn moves(&self) -> Option<watch::Receiver<Millis>> {
        Some(self.moved.subscribe())
    }
}

/// The clock type the application holds.
pub type SharedClock = Arc<dyn Clock>;
