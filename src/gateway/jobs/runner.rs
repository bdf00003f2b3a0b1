//! Runs bulk jobs. Each pass, for every running job this instance holds
//! the claim of:
//!
//! 1. **its window**: each event it queued is looked up; a settled one
//!    counts as delivered or failed and leaves the window (an erase job's
//!    window is written again, which changes nothing when it was);
//! 2. **its scan**: the listing is read on from the cursor until the
//!    window is full again — half the source's `max_in_flight` (at least
//!    one, shared by the source's redeliver jobs) for a redeliver job, so
//!    live events keep the other half of the source's slots;
//!    [`ERASE_BATCH`] for an erase job;
//! 3. **the record**: cursor, counters and window are written *before* the
//!    replays and erasures they name. A crash between the two leaves them
//!    in the window, and whoever runs the job next writes them again
//!    (a replay the job already made is refused, an erasure made twice
//!    changes nothing), so nothing is sent twice or skipped.
//!
//! A redeliver job queues nothing while its source's breaker is open. A
//! cancelled job queues nothing more; once its window settled it ends.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use tokio::sync::watch;

use super::{Job, JobKind, JobState};
use crate::clock::SharedClock;
use crate::domain::{Key, Namespace, ScopedKey, Token, Ttl};
use crate::gateway::delivery::Dispatcher;
use crate::gateway::delivery::circuit::State;
use crate::gateway::scan::{Budget, Dedupe, Position, ScanError, ScanRequest};
use crate::gateway::{Gateway, Source};
use crate::store::inbox::{EraseOutcome, EventStatus, RedeliverOutcome, Retention};
use crate::store::{ClaimOutcome, ExtendOutcome, Store, StoreError};

/// Events an erase job erases per pass.
pub const ERASE_BATCH: usize = 500;
/// Rows a pass reads at most per job (a filter that matches little must
/// not hold the runner on one job).
const SCAN_PER_PASS: u64 = 5_000;
/// How long a runner's claim on a job lasts without being extended.
const OWNERSHIP: Duration = Duration::from_secs(30);
/// How often it is extended.
const EXTEND_EVERY: Duration = Duration::from_secs(10);
/// Pause between passes while a job moves.
const BUSY: Duration = Duration::from_millis(5);
/// Longest pause while a job waits for what it queued (a settled replay
/// wakes the runner at once).
const WAITING: Duration = Duration::from_millis(100);
/// Pause between passes while no job runs here; also how often the job
/// list is read again when other instances share the inbox (a job started
/// or cancelled on this instance wakes the runner at once; on an inbox of
/// its own, that is the only way one starts, so it reads no more).
const IDLE: Duration = Duration::from_secs(1);

/// The job runner of one instance.
pub struct Runner {
    gateway: Arc<Gateway>,
    store: Arc<dyn Store>,
    dispatcher: Arc<Dispatcher>,
    clock: SharedClock,
}

impl std::fmt::Debug for Runner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner").finish_non_exhaustive()
    }
}

/// A job this instance runs: its claim, and whether its window's writes
/// must be made again (after taking the claim, or a failed step).
struct Held {
    key: ScopedKey,
    token: Token,
    extended: Instant,
    rewrite: bool,
}

impl Runner {
    pub fn new(
        gateway: Arc<Gateway>,
        store: Arc<dyn Store>,
        dispatcher: Arc<Dispatcher>,
        clock: SharedClock,
    ) -> Self {
        Self {
            gateway,
            store,
            dispatcher,
            clock,
        }
    }

    /// Runs jobs until `stop` turns true.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut held: HashMap<String, Held> = HashMap::new();
        // The running jobs as last read; between reads, the runner's own
        // copies of those it holds (it alone writes them).
        let mut running: Vec<Job> = Vec::new();
        let mut listed: Option<Instant> = None;
        let mut woken = true;
        loop {
            let elsewhere = self.gateway.inbox.written_elsewhere();
            if woken
                || listed.is_none()
                || (elsewhere && listed.is_some_and(|at| at.elapsed() >= IDLE))
            {
                match super::list(self.gateway.inbox.as_ref()).await {
                    Ok(jobs) => {
                        running = jobs
                            .into_iter()
                            .filter(|j| j.state == JobState::Running)
                            .collect();
                        listed = Some(Instant::now());
                    }
                    Err(e) => {
                        tracing::debug!(error = %e.chain(), "cannot read the jobs; trying again");
                    }
                }
            }
            let busy = self.pass(&mut running, &mut held).await;
            let waiting = running.iter().any(|j| !j.window.is_empty());
            let pause = if busy {
                BUSY
            } else if waiting {
                WAITING
            } else {
                IDLE
            };
            woken = false;
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = self.gateway.jobs_wake.notified() => woken = true,
                _ = stop.changed() => break,
            }
        }
        // Stopping: another instance (or this one, restarted) takes the
        // jobs over at once rather than after the claims expire.
        let now = self.clock.now_ms();
        for h in held.into_values() {
            let _ = self.store.release(&h.key, h.token, now).await;
        }
    }

    /// One step of each running job this instance holds; whether any
    /// moved. Finished jobs leave `running`.
    async fn pass(&self, running: &mut Vec<Job>, held: &mut HashMap<String, Held>) -> bool {
        held.retain(|id, _| running.iter().any(|j| j.id == *id));
        let mut busy = false;
        for i in 0..running.len() {
            // The source's replay window is shared by its redeliver jobs.
            let others: usize = running
                .iter()
                .enumerate()
                .filter(|(j, o)| {
                    *j != i
                        && o.kind == JobKind::Redeliver
                        && o.source == running[i].source
                        && o.state == JobState::Running
                })
                .map(|(_, o)| o.window.len())
                .sum();
            let job = &mut running[i];
            if !self.hold(job, held).await {
                continue;
            }
            let rewrite = held.get(&job.id).is_none_or(|h| h.rewrite);
            let stepped = self.step(job, rewrite, others).await;
            if let Some(h) = held.get_mut(&job.id) {
                h.rewrite = stepped.is_err();
            }
            match stepped {
                Ok(moved) => busy |= moved,
                Err(e) => {
                    tracing::debug!(job = %job.id, error = %e.chain(), "job step failed; trying again");
                    continue;
                }
            }
            if job.state != JobState::Running {
                let now = self.clock.now_ms();
                if let Some(h) = held.remove(&job.id) {
                    let _ = self.store.release(&h.key, h.token, now).await;
                }
                tracing::info!(job = %job.id, source = %job.source, state = ?job.state, matched = job.matched, delivered = job.delivered, failed = job.failed, erased = job.erased, skipped = job.skipped, "job finished");
            }
        }
        running.retain(|j| j.state == JobState::Running);
        busy
    }

    /// Whether this instance holds (or now takes) the job's claim.
    async fn hold(&self, job: &Job, held: &mut HashMap<String, Held>) -> bool {
        let now = self.clock.now_ms();
        let key = claim_key(job);
        let ttl = Ttl::from_ms_unchecked(OWNERSHIP.as_millis() as u64);
        if let Some(h) = held.get_mut(&job.id) {
            if h.extended.elapsed() < EXTEND_EVERY {
                return true;
            }
            match self.store.extend(&key, h.token, ttl, now).await {
                Ok(ExtendOutcome::Extended { .. }) => {
                    h.extended = Instant::now();
                    return true;
                }
                Ok(_) => {
                    held.remove(&job.id);
                }
                // The store is down: keep the job, try again next pass.
                Err(_) => return false,
            }
        }
        match self.store.claim(&key, ttl, None, now).await {
            Ok(ClaimOutcome::Claimed { token, .. }) => {
                held.insert(
                    job.id.clone(),
                    Held {
                        key,
                        token,
                        extended: Instant::now(),
                        rewrite: true,
                    },
                );
                true
            }
            _ => false,
        }
    }

    /// One step of `job` (`rewrite`: its window may hold events whose
    /// write a crash or a failure cut off; `others`: replays the source's
    /// other redeliver jobs have queued); whether it moved.
    async fn step(&self, job: &mut Job, rewrite: bool, others: usize) -> Result<bool, StoreError> {
        let inbox = self.gateway.inbox.clone();
        let now = self.clock.now_ms();
        // An erasure reaches a removed destination's copies too: its lane
        // is read under its source's settings.
        let configured = self.gateway.source(&job.source).or_else(|| {
            let parent = job.source.split_once('.').map(|(s, _)| s);
            parent
                .filter(|_| job.kind == JobKind::Erase)
                .and_then(|s| self.gateway.source(s))
        });
        // An erasure goes on when a reload removed its source (as erasing
        // one event of a removed source does): it reads none of the
        // source's settings but how long an erased record is kept, then
        // the gateway's. Cut short, it would leave the rest of what the
        // operator asked to erase readable, and deliverable once the
        // source is back. A redelivery needs the source's destination.
        let retention = configured.as_ref().map_or(self.gateway.retention, |s| {
            s.retention(self.gateway.retention)
        });
        let source = match configured {
            Some(source) => Some(source),
            None if job.kind == JobKind::Erase => None,
            None => {
                job.error = Some(format!(
                    "source {:?} is no longer configured: the redeliveries it had not queued \
                     were not made",
                    job.source
                ));
                let inbox = inbox.clone();
                super::end(job, JobState::Done, now, |id, record, held| async move {
                    if held {
                        inbox.end_job(&id, record, now).await
                    } else {
                        inbox.put_job(&id, record, now).await
                    }
                })
                .await?;
                return Ok(true);
            }
        };
        let before = (job.window.len(), job.scanned, job.matched);
        let settled = self.settle_window(job, retention, rewrite).await?;
        let room = match (&source, job.kind) {
            (Some(source), JobKind::Redeliver) => {
                window(source).saturating_sub(job.window.len() + others)
            }
            _ => ERASE_BATCH,
        };
        let paused = job.kind == JobKind::Redeliver
            && source.as_ref().is_some_and(|source| {
                self.dispatcher
                    .lane(&source.name)
                    .is_some_and(|l| matches!(l.state, State::Open { .. }))
            });
        let mut taken = Vec::new();
        if !job.cancelled && !job.scanned_all && room > 0 && !paused {
            taken = self.scan(job, room).await?;
        }
        job.window.extend(taken.iter().map(|e| e.event_id.clone()));
        let moved = settled || (job.window.len(), job.scanned, job.matched) != before;
        if job.window.is_empty() && (job.cancelled || job.scanned_all) {
            let state = if job.cancelled {
                JobState::Cancelled
            } else {
                JobState::Done
            };
            let (inbox, now) = (inbox.clone(), self.clock.now_ms());
            super::end(job, state, now, |id, record, held| async move {
                if held {
                    inbox.end_job(&id, record, now).await
                } else {
                    inbox.put_job(&id, record, now).await
                }
            })
            .await?;
        } else if moved {
            // The intent first: see the module's doc.
            inbox
                .put_job(&job.id, job.encode(), self.clock.now_ms())
                .await?;
        }
        if taken.is_empty() {
            return Ok(moved);
        }
        match job.kind {
            JobKind::Redeliver => {
                let id = job.id.clone();
                let now = self.clock.now_ms();
                let outcomes = join_all(
                    taken
                        .iter()
                        .map(|e| inbox.replay(&e.source, &e.event_id, &id, now)),
                )
                .await;
                let mut gone = Vec::new();
                for (e, outcome) in taken.iter().zip(outcomes) {
                    match outcome? {
                        RedeliverOutcome::Requeued => {
                            // It goes before the newer events of its stream.
                            self.gateway.arrivals.push(
                                &e.source,
                                e.stream.as_deref(),
                                e.created_at,
                            );
                        }
                        RedeliverOutcome::NotFound | RedeliverOutcome::NotRedeliverable(_) => {
                            gone.push(e.event_id.clone());
                        }
                    }
                }
                self.gateway.wake.notify_one();
                if !gone.is_empty() {
                    job.window.retain(|id| !gone.contains(id));
                    job.skipped += gone.len() as u64;
                    inbox
                        .put_job(&job.id, job.encode(), self.clock.now_ms())
                        .await?;
                }
            }
            JobKind::Erase => {
                // Confirmed (and counted) by the next pass's window check.
            }
        }
        Ok(true)
    }

    /// Looks up the job's window: settled events leave it and are counted.
    /// Whether any did.
    async fn settle_window(
        &self,
        job: &mut Job,
        retention: Retention,
        rewrite: bool,
    ) -> Result<bool, StoreError> {
        if job.window.is_empty() {
            return Ok(false);
        }
        let inbox = self.gateway.inbox.clone();
        let now = self.clock.now_ms();
        // A failed read leaves the window as it was.
        let ids = job.window.clone();
        let mut kept = Vec::with_capacity(ids.len());
        match job.kind {
            JobKind::Erase => {
                let retention = retention.dead_ms;
                // Every destination's copy of each.
                let gateway = &self.gateway;
                let lanes = gateway.lanes_to_erase(&job.source).await?;
                let outcomes = join_all(
                    ids.iter()
                        .map(|id| gateway.erase_everywhere(&lanes, id, retention, now)),
                )
                .await;
                let erased = job.erased;
                for (id, outcome) in ids.iter().zip(outcomes) {
                    match outcome {
                        Ok(EraseOutcome::Erased | EraseOutcome::AlreadyErased) => job.erased += 1,
                        Ok(EraseOutcome::NotFound) => job.skipped += 1,
                        Err(e) => {
                            kept.push(id.clone());
                            tracing::debug!(error = %e.chain(), "erase failed; trying again");
                        }
                    }
                }
                if job.erased > erased && job.filter.status == EventStatus::Pending {
                    // Pending events the dispatcher leased ahead (their
                    // bodies in memory) must not go out: what it holds
                    // ahead goes back; the streams' next events may run.
                    self.gateway.arrivals.push_unknown();
                    self.gateway.wake.notify_one();
                }
            }
            JobKind::Redeliver => {
                let states = inbox.replay_states(&job.source, ids.clone()).await?;
                for (id, state) in ids.iter().zip(states) {
                    let Some(state) = state else {
                        job.skipped += 1;
                        continue;
                    };
                    let mine = state.job.as_deref() == Some(job.id.as_str());
                    match (mine, state.status) {
                        (true, EventStatus::Pending) => kept.push(id.clone()),
                        (true, EventStatus::Delivered) => job.delivered += 1,
                        (true, _) => job.failed += 1,
                        // Taken on, but the replay was never written (a
                        // crash between the record and the replay).
                        (
                            false,
                            EventStatus::Delivered | EventStatus::Dead | EventStatus::Stale,
                        ) if rewrite => match inbox.replay(&job.source, id, &job.id, now).await {
                            Ok(RedeliverOutcome::Requeued) => {
                                self.gateway.wake.notify_one();
                                kept.push(id.clone());
                            }
                            Ok(_) => job.skipped += 1,
                            // Still to be written: the next pass tries again.
                            Err(_) => kept.push(id.clone()),
                        },
                        (false, _) => job.skipped += 1,
                    }
                }
            }
        }
        let changed = kept.len() != ids.len();
        job.window = kept;
        Ok(changed)
    }

    /// Reads the job's lanes on from where its scan stands, on the scan
    /// thread: the next matches, at most `room`, within a pass's budget
    /// (at most [`SCAN_PER_PASS`] rows, and the scans' bytes and time).
    async fn scan(
        &self,
        job: &mut Job,
        room: usize,
    ) -> Result<Vec<crate::store::inbox::InboxEvent>, StoreError> {
        let lanes = job.lanes();
        let lane = job
            .lane
            .as_ref()
            .and_then(|l| lanes.iter().position(|x| x == l))
            .unwrap_or(0);
        let scanner = &self.gateway.scanner;
        let request = ScanRequest {
            lanes: lanes.clone(),
            filter: job.filter.clone(),
            from: Position {
                lane,
                after: job.cursor.clone(),
            },
            budget: Budget {
                rows: SCAN_PER_PASS,
                ..scanner.budget
            },
            max_matches: room as u64,
            keep: room,
            // A job takes only what was there when it started (events
            // delivered after are not chased).
            until: Some(job.created_ms),
            skip: job.window.iter().cloned().collect(),
            skip_replayed_by: Some(job.id.clone()),
            dedupe: Dedupe::Taken,
        };
        let scanned = match scanner.job_pass(self.gateway.inbox.clone(), request).await {
            Ok(s) => s,
            Err(ScanError::Store(e)) => return Err(e),
            // Stopping: the next pass (if any) tries again.
            Err(ScanError::Busy | ScanError::Stopped) => return Ok(Vec::new()),
        };
        job.scanned += scanned.rows;
        job.matched += scanned.matched;
        match scanned.next {
            Some(next) => {
                job.lane = lanes.get(next.lane).cloned();
                job.cursor = next.after;
            }
            None => job.scanned_all = true,
        }
        Ok(scanned.matches)
    }
}

/// Replays a redeliver job keeps queued at once for `source`: half its
/// slots, at least one.
pub fn window(source: &Source) -> usize {
    (source.max_in_flight / 2).max(1)
}

/// The claim that says which instance runs `job`.
fn claim_key(job: &Job) -> ScopedKey {
    let key = Key::parse(&job.id, "job").unwrap_or_else(|_| {
        Key::parse("job", "job").expect("a valid key") // ids are `job_` + hex
    });
    ScopedKey::new(
        &Namespace::GatewayStream(format!("{}#jobs", job.source)),
        &key,
    )
}
