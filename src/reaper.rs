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
use crate::store::redb::RedbStore;
use crate::store::{PurgeReport, Store, StoreError};
use crate::telemetry::metrics::Metrics;

/// Pending events of sources that left the configuration: never delivered,
/// so they never settle and never get an expiry. They go once they are
/// older than the dead-event retention.
#[derive(Debug, Clone)]
pub struct Orphans {
    /// The inbox.
    pub inbox: Arc<RedbStore>,
    /// The configured source names.
    pub configured: Vec<String>,
    /// How long after receipt they are kept, ms (`gateway.dead_retention`).
    pub retention_ms: u64,
}

/// The reaper's handle on the store and its limits.
#[derive(Debug, Clone)]
pub struct Reaper {
    store: Arc<dyn Store>,
    clock: SharedClock,
    /// Longest sleep between passes.
    interval: Duration,
    /// Most deletions per write transaction.
    batch_size: u64,
    /// Pending events of removed sources, if the reaper looks after them.
    orphans: Option<Orphans>,
    /// Where deletions are counted, if anywhere.
    metrics: Option<Arc<Metrics>>,
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
            orphans: None,
            metrics: None,
        }
    }

    /// Counts deletions in `dedupd_reaper_deleted_total`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    fn count(&self, table: &'static str, n: u64) {
        if let Some(m) = &self.metrics {
            m.reaped(table, n);
        }
    }

    /// Also removes pending events of sources that left the configuration
    /// once they are older than their retention; names those sources (and
    /// their pending counts) in the log when it starts.
    pub fn with_orphans(mut self, orphans: Orphans) -> Self {
        self.orphans = Some(orphans);
        self
    }

    /// The removed sources that still have events, named in the log.
    async fn removed_sources(&self) -> Vec<String> {
        let Some(o) = &self.orphans else {
            return Vec::new();
        };
        match o.inbox.inbox_sources().await {
            Ok(found) => found
                .into_iter()
                .filter(|(name, _)| !o.configured.contains(name))
                .map(|(name, pending)| {
                    tracing::warn!(
                        source = %name,
                        pending,
                        "source removed from the configuration still has events: they are \
                         not delivered, stay listable under /v1/sources/{name}/events, and \
                         are reaped after gateway.dead_retention"
                    );
                    name
                })
                .collect(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the inbox's sources");
                Vec::new()
            }
        }
    }

    /// Deletes the pending events of `removed` sources past retention.
    async fn purge_orphans(&self, removed: &[String], now: Millis) -> Result<u64, StoreError> {
        let Some(o) = self.orphans.as_ref().filter(|_| !removed.is_empty()) else {
            return Ok(0);
        };
        let before = now.saturating_sub(o.retention_ms);
        let mut total = 0;
        loop {
            let n = o
                .inbox
                .purge_pending(removed.to_vec(), before, self.batch_size, now)
                .await?;
            total += n;
            self.count("inbox", n);
            if n < self.batch_size {
                return Ok(total);
            }
            tokio::task::yield_now().await;
        }
    }

    /// Deletes everything expired at `now`, batch by batch. Returns what was
    /// removed in all.
    pub async fn purge_once(&self, now: Millis) -> Result<PurgeReport, StoreError> {
        let mut total = PurgeReport::default();
        loop {
            let started = std::time::Instant::now();
            let r = self.store.purge_expired(now, self.batch_size).await?;
            total.claims += r.claims;
            total.events += r.events;
            total.heads += r.heads;
            total.inbox += r.inbox;
            total.kv += r.kv;
            self.count("claims", r.claims);
            self.count("applied_events", r.events);
            self.count("stream_heads", r.heads);
            self.count("inbox", r.inbox);
            self.count("kv", r.kv);
            if !r.more {
                return Ok(total);
            }
            // Yield the writer: rest twice as long as the batch took, so a
            // mass expiry (a million keys at once) takes at most a third of
            // the writer's time and requests keep their latency.
            tokio::time::sleep(started.elapsed().saturating_mul(2)).await;
        }
    }

    /// Runs until `stop` turns true.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let removed = self.removed_sources().await;
        let mut was_failing = false;
        loop {
            let now = self.clock.now_ms();
            let mut error = None;
            match self.purge_orphans(&removed, now).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(
                    events = n,
                    "reaped pending events of removed sources past their retention"
                ),
                Err(e) => error = Some(e),
            }
            match self.purge_once(now).await {
                Ok(r) if r.total() > 0 => tracing::debug!(
                    claims = r.claims,
                    events = r.events,
                    heads = r.heads,
                    inbox = r.inbox,
                    kv = r.kv,
                    "reaped expired records"
                ),
                Ok(_) => {}
                Err(e) => error = Some(e),
            }
            // Logged once per transition, not once per pass.
            match (&error, was_failing) {
                (Some(e), false) => {
                    tracing::warn!(error = %e, "reaper cannot write: it retries every interval until the store recovers")
                }
                (None, true) => tracing::info!("reaper writes again"),
                _ => {}
            }
            was_failing = error.is_some();
            let sleep = match self.store.next_expiry().await {
                // A failing store must not turn the reaper into a busy loop.
                _ if was_failing => self.interval,
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
