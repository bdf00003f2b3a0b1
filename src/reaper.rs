//! The reaper: deletes expired records in expiry order, in bounded batches.
//!
//! It sleeps until the earliest stored expiry (never longer than the
//! configured interval, so records written after it fell asleep are not left
//! for long) and then deletes what is due. Each batch is one write
//! transaction of at most `batch_size` deletions, so the writer is never held
//! for long, and each batch reads only due index entries, so the cost follows
//! the number of expired records, not the number stored.
//!
//! Reaping is housekeeping only: expired records already read as absent.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::clock::{Millis, SharedClock};
use crate::store::{PurgeReport, Store, StoreError};

/// The reaper's handle on the store and its limits.
#[derive(Debug, Clone)]
pub struct Reaper {
    store: Arc<dyn Store>,
    clock: SharedClock,
    /// Longest sleep between passes.
    interval: Duration,
    /// Most deletions per write transaction.
    batch_size: u64,
}

impl Reaper {
    /// A reaper over `store`.
    pub fn new(
        store: Arc<dyn Store>,
        clock: SharedClock,
        interval: Duration,
        batch_size: u64,
    ) -> Self {
        Self {
            store,
            clock,
            interval,
            batch_size: batch_size.max(1),
        }
    }

    /// Deletes everything expired at `now`, batch by batch. Returns what was
    /// removed in all.
    pub async fn purge_once(&self, now: Millis) -> Result<PurgeReport, StoreError> {
        let mut total = PurgeReport::default();
        loop {
            let r = self.store.purge_expired(now, self.batch_size).await?;
            total.claims += r.claims;
            total.events += r.events;
            total.heads += r.heads;
            total.inbox += r.inbox;
            if !r.more {
                return Ok(total);
            }
            // Let other writes in between batches.
            tokio::task::yield_now().await;
        }
    }

    /// Runs until `stop` turns true.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        loop {
            let now = self.clock.now_ms();
            let mut failed = false;
            match self.purge_once(now).await {
                Ok(r) if r.total() > 0 => tracing::debug!(
                    claims = r.claims,
                    events = r.events,
                    heads = r.heads,
                    inbox = r.inbox,
                    "reaped expired records"
                ),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "reaper pass failed; will retry after the interval");
                    failed = true;
                }
            }
            let sleep = match self.store.next_expiry().await {
                // A failing store must not turn the reaper into a busy loop.
                _ if failed => self.interval,
                Ok(Some(at)) => {
                    Duration::from_millis(at.saturating_sub(self.clock.now_ms()).max(1))
                        .min(self.interval)
                }
                _ => self.interval,
            };
            tokio::select! {
                () = tokio::time::sleep(sleep) => {}
                _ = stop.changed() => return,
            }
            if *stop.borrow() {
                return;
            }
        }
    }
}
