//! The reaper: deletes expired records in expiry order, in bounded batches.
//!
//! After a pass that deleted something it sleeps until the earliest stored
//! expiry; after one that found nothing due, a second ([`LOOK_AGAIN`]); never
//! longer than either nor the configured interval, so records written after
//! it fell asleep are not left for long. Then it deletes what is due. Each batch is one write
//! transaction of at most `batch_size` deletions, so the writer is never held
//! for long, and each batch reads only due index entries, so the cost follows
//! the number of expired records, not the number stored. Between batches
//! it gives way to requests ([`Reaper::purge_once`]).
//!
//! Reaping is housekeeping only: expired records already read as absent.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::clock::{Millis, SharedClock};
use crate::store::inbox::Inbox;
use crate::store::{PurgeReport, Store, StoreError};
use crate::telemetry::metrics::Metrics;

/// The longest the reaper sleeps before it looks again at the earliest
/// expiry: records written while it sleeps may expire sooner than what it
/// went to sleep for (into an empty store it slept the whole interval, and
/// claims with a TTL of a second at 2,100 a second piled up 110,000 expired
/// keys in memory before its first pass: `benches/expiry_soak.sh`).
pub const LOOK_AGAIN: Duration = Duration::from_secs(1);

/// Pending events of sources that left the configuration: never delivered,
/// so they never settle and never get an expiry. They go once they are
/// older than the dead-event retention.
#[derive(Debug, Clone)]
pub struct Orphans {
    pub inbox: Arc<dyn Inbox>,
    /// The sources the configuration in force names: a reload sends new
    /// ones, and the next pass looks again at which sources are removed.
    pub configured: watch::Receiver<Configured>,
    /// How long after receipt they are kept, ms (`gateway.dead_retention`).
    pub retention_ms: u64,
}

/// Which sources a configuration names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Configured {
    /// The configured source names.
    pub names: Vec<String>,
    /// Configured sources that deliver nothing themselves (posted to,
    /// none of their destinations named `default`): their pending events,
    /// from before their destinations, are as a removed source's.
    pub idle: Vec<String>,
}

/// The reaper's handle on the store and its limits.
#[derive(Debug, Clone)]
pub struct Reaper {
    store: Arc<dyn Store>,
    clock: SharedClock,
    /// Longest sleep between passes, and how long a pass yields most of
    /// the writer to requests.
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

    /// The removed sources that still have events, named in the log; none
    /// when the inbox cannot say now (the reaper asks again next pass).
    async fn removed_sources(&self) -> Option<Vec<String>> {
        let Some(o) = &self.orphans else {
            return Some(Vec::new());
        };
        let configured = o.configured.borrow().clone();
        match o.inbox.inbox_sources().await {
            Ok(found) => Some(
                found
                    .into_iter()
                    .filter(|(name, pending)| {
                        !configured.names.contains(name)
                            || (configured.idle.contains(name) && *pending > 0)
                    })
                    .map(|(name, pending)| {
                        if configured.names.contains(&name) {
                            tracing::warn!(
                                source = %name,
                                pending,
                                "source has pending events from before its destinations, none \
                                 of which is named default: they are not delivered, stay \
                                 listable under /v1/sources/{name}/events, and are reaped after \
                                 gateway.dead_retention"
                            );
                        } else {
                            tracing::warn!(
                                source = %name,
                                pending,
                                "source removed from the configuration still has events: they \
                                 are not delivered, stay listable under \
                                 /v1/sources/{name}/events, and are reaped after \
                                 gateway.dead_retention"
                            );
                        }
                        name
                    })
                    .collect(),
            ),
            Err(e) => {
                tracing::warn!(error = %e.chain(), "cannot list the inbox's sources; the reaper asks again next pass");
                None
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

    /// Deletes the settled events of an inbox that is not in the data file
    /// (the shared inbox; the file's own are reaped with the file) once
    /// their retention ended, batch by batch.
    async fn purge_settled(&self, now: Millis) -> Result<u64, StoreError> {
        let Some(o) = &self.orphans else {
            return Ok(0);
        };
        let mut total = 0;
        loop {
            let (n, more) = o.inbox.purge_settled(now, self.batch_size).await?;
            total += n;
            self.count("inbox", n);
            // A batch that deleted nothing ends the pass whatever it says
            // of more: the next pass looks again, and a reaper never spins.
            if !more || n == 0 {
                return Ok(total);
            }
            tokio::task::yield_now().await;
        }
    }

    /// Deletes everything expired at `now`, batch by batch. Returns what was
    /// removed in all.
    ///
    /// Between batches it gives way to requests: with nothing else written
    /// since the last batch it goes straight on; while requests are being
    /// written it rests nine times as long as the batch took, so it takes at
    /// most a tenth of the writer's time and the requests the rest; once the
    /// pass has run for `interval` (expired records have been waiting that
    /// long) it rests only twice as long, a third of the writer's time, so
    /// the backlog stays bounded under sustained load.
    pub async fn purge_once(&self, now: Millis) -> Result<PurgeReport, StoreError> {
        let mut total = PurgeReport::default();
        let pass = tokio::time::Instant::now();
        let mut written = self.store.write_stats().operations;
        loop {
            let started = tokio::time::Instant::now();
            let r = self.store.purge_expired(now, self.batch_size).await?;
            total.claims += r.claims;
            total.events += r.events;
            total.heads += r.heads;
            total.inbox += r.inbox;
            total.kv += r.kv;
            total.dedupe += r.dedupe;
            self.count("claims", r.claims);
            self.count("applied_events", r.events);
            self.count("stream_heads", r.heads);
            self.count("inbox", r.inbox);
            self.count("kv", r.kv);
            self.count("inbox_dedupe", r.dedupe);
            if !r.more {
                return Ok(total);
            }
            let took = started.elapsed();
            // Writes since the last look, less this batch's own.
            let seen = self.store.write_stats().operations;
            let others = seen.saturating_sub(written).saturating_sub(1);
            written = seen;
            let rest = if others == 0 {
                Duration::ZERO
            } else if pass.elapsed() < self.interval {
                took.saturating_mul(9)
            } else {
                took.saturating_mul(2)
            };
            if rest.is_zero() {
                tokio::task::yield_now().await;
            } else {
                tokio::time::sleep(rest).await;
            }
        }
    }

    /// Runs until `stop` turns true.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) {
        // Asked until the inbox answers (it may be in Redis, down at the
        // start), and again after a reload changed the sources.
        let mut removed = None;
        let mut was_failing = false;
        loop {
            let now = self.clock.now_ms();
            let mut error = None;
            if let Some(o) = &mut self.orphans
                && o.configured.has_changed().unwrap_or(false)
            {
                o.configured.mark_unchanged();
                removed = None;
            }
            if removed.is_none() {
                removed = self.removed_sources().await;
            }
            let orphans = removed.as_deref().unwrap_or_default();
            match self.purge_orphans(orphans, now).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(
                    events = n,
                    "reaped pending events of removed sources past their retention"
                ),
                Err(e) => error = Some(e),
            }
            match self.purge_settled(now).await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(inbox = n, "reaped settled events past their retention"),
                Err(e) => error = Some(e),
            }
            let mut deleted = false;
            match self.purge_once(now).await {
                Ok(r) if r.total() > 0 => {
                    deleted = true;
                    tracing::debug!(
                        claims = r.claims,
                        events = r.events,
                        heads = r.heads,
                        inbox = r.inbox,
                        kv = r.kv,
                        inbox_dedupe = r.dedupe,
                        "reaped expired records"
                    );
                }
                Ok(_) => {}
                Err(e) => error = Some(e),
            }
            // Logged once per transition, not once per pass.
            match (&error, was_failing) {
                (Some(e), false) => {
                    tracing::warn!(error = %e.chain(), "reaper cannot write: it retries every interval until the store recovers")
                }
                (None, true) => tracing::info!("reaper writes again"),
                _ => {}
            }
            was_failing = error.is_some();
            let sleep = if was_failing {
                // A failing store must not turn the reaper into a busy loop.
                self.interval
            } else if !deleted {
                // Nothing was due: the next pass, in a second, finds what
                // comes due meanwhile, written since too. Not a read of the
                // next expiry: a read makes the writer commit what it
                // holds (`storage.commit_hold`), and a pass that finds
                // nothing due does not.
                self.interval.min(LOOK_AGAIN)
            } else {
                match self.store.next_expiry().await {
                    Ok(Some(at)) => {
                        Duration::from_millis(at.saturating_sub(self.clock.now_ms()).max(1))
                            .min(self.interval)
                            .min(LOOK_AGAIN)
                    }
                    _ => self.interval.min(LOOK_AGAIN),
                }
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    use async_trait::async_trait;
    use tokio::time::Instant;

    use super::*;
    use crate::domain::{CreatedAt, Fingerprint, ScopedKey, Token, Ttl};
    use crate::store::{
        ApplyResult, ClaimOutcome, ClaimView, DoneOutcome, ExtendOutcome, Head, ReleaseOutcome,
        WriteStats,
    };

    /// A store whose purges take `batch` of (paused) time each, while
    /// `others` other writes are answered during each.
    #[derive(Debug)]
    struct Timed {
        due: AtomicU64,
        batch: Duration,
        others: u64,
        operations: AtomicU64,
    }

    #[async_trait]
    impl Store for Timed {
        async fn purge_expired(&self, _: Millis, limit: u64) -> Result<PurgeReport, StoreError> {
            tokio::time::sleep(self.batch).await;
            self.operations
                .fetch_add(1 + self.others, Ordering::Relaxed);
            let left = self.due.load(Ordering::Relaxed);
            let n = left.min(limit);
            self.due.store(left - n, Ordering::Relaxed);
            Ok(PurgeReport {
                claims: n,
                more: left > n,
                ..PurgeReport::default()
            })
        }
        fn write_stats(&self) -> WriteStats {
            WriteStats {
                operations: self.operations.load(Ordering::Relaxed),
                commits: 0,
            }
        }
        async fn next_expiry(&self) -> Result<Option<Millis>, StoreError> {
            Ok(None)
        }
        async fn claim(
            &self,
            _: &ScopedKey,
            _: Ttl,
            _: Option<Fingerprint>,
            _: Millis,
        ) -> Result<ClaimOutcome, StoreError> {
            unreachable!("the reaper only purges")
        }
        async fn done_with(
            &self,
            _: &ScopedKey,
            _: Token,
            _: Ttl,
            _: Option<crate::domain::ClaimResult>,
            _: Millis,
        ) -> Result<DoneOutcome, StoreError> {
            unreachable!("the reaper only purges")
        }
        async fn release(
            &self,
            _: &ScopedKey,
            _: Token,
            _: Millis,
        ) -> Result<ReleaseOutcome, StoreError> {
            unreachable!("the reaper only purges")
        }
        async fn extend(
            &self,
            _: &ScopedKey,
            _: Token,
            _: Ttl,
            _: Millis,
        ) -> Result<ExtendOutcome, StoreError> {
            unreachable!("the reaper only purges")
        }
        async fn get(&self, _: &ScopedKey, _: Millis) -> Result<Option<ClaimView>, StoreError> {
            unreachable!("the reaper only purges")
        }
        async fn apply(
            &self,
            _: &ScopedKey,
            _: &ScopedKey,
            _: CreatedAt,
            _: u64,
            _: Millis,
        ) -> Result<ApplyResult, StoreError> {
            unreachable!("the reaper only purges")
        }
        async fn head(&self, _: &ScopedKey, _: Millis) -> Result<Option<Head>, StoreError> {
            unreachable!("the reaper only purges")
        }
        async fn ready(&self) -> Result<(), StoreError> {
            Ok(())
        }
        async fn close(&self) {}
    }

    /// How long one pass over 50 batches of 10 ms takes, with `others`
    /// writes during each batch and the reaper's `interval`.
    async fn pass(others: u64, interval: Duration) -> Duration {
        let store = Arc::new(Timed {
            due: AtomicU64::new(500),
            batch: Duration::from_millis(10),
            others,
            operations: AtomicU64::new(0),
        });
        let clock = Arc::new(crate::clock::ManualClock::new(0));
        let reaper = Reaper::new(store.clone(), clock, interval, 10);
        let started = Instant::now();
        assert_eq!(reaper.purge_once(1).await.unwrap().claims, 500);
        assert_eq!(store.due.load(Ordering::Relaxed), 0);
        started.elapsed()
    }

    /// An empty store, then records with a short TTL: the reaper, asleep
    /// with nothing to wait for, looks again every second, not once an
    /// interval (an hour here).
    #[tokio::test(start_paused = true)]
    async fn a_reaper_with_nothing_due_looks_again_every_second() {
        let store = Arc::new(Timed {
            due: AtomicU64::new(0),
            batch: Duration::ZERO,
            others: 0,
            operations: AtomicU64::new(0),
        });
        let clock = Arc::new(crate::clock::ManualClock::new(0));
        let reaper = Reaper::new(store.clone(), clock, Duration::from_secs(3600), 10);
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(reaper.run(stop_rx));
        tokio::time::sleep(Duration::from_millis(3_500)).await;
        // Passes at 0, 1, 2 and 3 s.
        assert_eq!(store.operations.load(Ordering::Relaxed), 4);
        stop.send(true).unwrap();
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn with_nothing_else_written_the_reaper_does_not_rest() {
        assert_eq!(
            pass(0, Duration::from_secs(3600)).await,
            Duration::from_millis(500)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn while_requests_are_written_the_reaper_takes_a_tenth_of_the_writer() {
        // 50 batches of 10 ms, 49 rests of 90 ms.
        assert_eq!(
            pass(3, Duration::from_secs(3600)).await,
            Duration::from_millis(500 + 49 * 90)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_backlog_older_than_the_interval_gets_a_third_of_the_writer() {
        // A tenth for the first second (10 batches and their rests), then
        // batches of 10 ms with rests of 20 ms.
        let took = pass(3, Duration::from_secs(1)).await;
        assert_eq!(took, Duration::from_millis(1_000 + 40 * 10 + 39 * 20));
    }
}
