//! Delivery: from the inbox to the application, once in effect, per stream
//! in `created_at` order.
//!
//! - [`schedule`]: which runnable events start now — per-source and global
//!   limits, one delivery per stream, fair shares, paused sources.
//! - [`circuit`]: a source's circuit breaker.
//! - [`turn`]: one delivery turn of one event, and how it settles.
//! - [`forward`]: the HTTP request to the application.
//! - [`backoff`]: the retry delay of one event.
//!
//! The dispatcher loop reads each source's runnable events (the inbox's
//! runnable index holds, per stream, only its oldest pending event), picks
//! what the limits allow, leases the picked events in one write (their due
//! time moves past the attempt's timeout, so after a crash they simply come
//! due again), and starts one task per turn. The same write leases more of
//! what it read, up to eight times a source's `max_in_flight` (and 16 MiB
//! of bodies): the next slots to free up start those at once, without a
//! read or a commit in between ([`ahead`]). A finishing turn frees its slot
//! as soon as the destination answered, and its event and stream once the
//! outcome is recorded (see [`schedule`]), and wakes the loop. Time comes
//! from the [`crate::clock::Clock`],
//! so tests move it by hand.

mod ahead;
pub mod backoff;
pub mod circuit;
mod fleet;
pub mod forward;
mod heartbeat;
pub mod schedule;
mod turn;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinSet;

use self::ahead::{Ahead, Ready};
use self::backoff::millis;
use self::circuit::Transition;
use self::forward::Forwarder;
use self::schedule::{AHEAD_PER_SLOT, LaneConfig, LaneScope, LaneView, Reached, Schedule, Wants};
use super::{Gateway, Source, Sources};
use crate::clock::{Millis, SharedClock};
use crate::domain::Ttl;
use crate::store::inbox::{EventKey, InboxEvent, Leased, LeasedEvent, Retention, Settle};
use crate::store::{Store, StoreError};
use crate::telemetry::metrics::Metrics;

pub use backoff::backoff;

/// Longest the dispatcher sleeps without being woken.
const POLL: Duration = Duration::from_millis(500);
/// First pause of the dispatcher while the store fails; doubles up to
/// [`STORE_BACKOFF_MAX`].
const STORE_BACKOFF_FIRST: Duration = Duration::from_millis(500);
/// Longest pause of the dispatcher while the store fails.
const STORE_BACKOFF_MAX: Duration = Duration::from_secs(5);
/// Longest the dispatcher goes without reading the inbox while nothing is
/// known to be due and nobody told it of a write (a safety net: every
/// write that makes an event runnable wakes it).
const IDLE_READ: Duration = Duration::from_secs(5);
/// Longest `forward_timeout` of a source that leases ahead: a crash leaves
/// its held events waiting `forward_timeout` + 30 s for their leases.
const AHEAD_MAX_TIMEOUT: Duration = Duration::from_secs(60);
/// Most bytes of bodies a source holds leased ahead (beyond one event).
const AHEAD_BYTES: u64 = 16 * 1024 * 1024;
/// Most bytes of bodies held leased ahead over all sources.
const AHEAD_BYTES_TOTAL: u64 = 64 * 1024 * 1024;
/// Most bytes of bodies one read loads per source (beyond one event):
/// with 16 MiB bodies allowed, a read by count alone could hold gigabytes.
const READ_BYTES: u64 = 16 * 1024 * 1024;
/// Most bytes of bodies one read loads over all its sources (each source
/// gets its share, at least 64 KiB, and always its first event).
const READ_BYTES_TOTAL: u64 = 64 * 1024 * 1024;
/// Extra claim and lease time beyond the attempt's timeout.
const GRACE_MS: u64 = 30_000;

/// Where the ordering and dedupe state of delivery lives.
#[derive(Debug, Clone)]
pub enum Coordination {
    /// In the inbox's own store (this process's data file, or the shared
    /// inbox in Redis): an event older than its stream's head is found
    /// stale when it is leased, and a delivered event moves its head and
    /// settles in one write.
    Inbox,
    /// In a store several instances share (Redis) while each keeps its own
    /// inbox: a turn holds a lease on its stream and a claim on its event
    /// id in that store, checks the head under the lease, and moves the
    /// head before it settles.
    Shared(Arc<dyn Store>),
}

/// Delivery settings shared by all sources.
#[derive(Debug, Clone)]
pub struct DeliverySettings {
    /// Deliveries in flight at once, over all sources.
    pub max_in_flight: usize,
    /// Retention of applied events and stream heads, ms.
    pub ordering_retention_ms: u64,
    /// Where delivery outcomes and durations are counted.
    pub metrics: Arc<Metrics>,
}

/// The dispatcher and what its turns need.
#[derive(Debug)]
pub struct Dispatcher {
    /// Sources, inbox, wake-ups.
    gateway: Arc<Gateway>,
    /// Where heads and claims live.
    coordination: Coordination,
    /// Decides due times, leases, backoff and pauses.
    clock: SharedClock,
    /// Sends the requests.
    forwarder: Forwarder,
    /// TTL of the done claim of a delivered event (shared coordination).
    done_ttl: Ttl,
    /// Retention of applied events and heads, ms.
    ordering_retention_ms: u64,
    /// What is in flight, limits and circuits.
    schedule: Mutex<Schedule>,
    /// Delivery outcomes and durations.
    metrics: Arc<Metrics>,
    /// When the dispatch loop last went round (it does at least every
    /// [`POLL`], or every [`STORE_BACKOFF_MAX`] while the store fails).
    last_pass: Mutex<Instant>,
    /// Set once the dispatcher is stopping: turns waiting to record an
    /// acknowledged delivery give up, so shutdown does not wait forever.
    stopping: AtomicBool,
    /// The leases this process holds, renewed by its heartbeat where the
    /// inbox has a lease grace (the shared inbox).
    leases: heartbeat::Leases,
}

/// A picked event's place in the schedule, given back when dropped — also
/// when a turn panics — and the dispatcher woken.
struct Slot {
    /// The dispatcher whose schedule holds the place.
    dispatcher: Arc<Dispatcher>,
    source: Arc<Source>,
    event_id: String,
    /// Its stream, if any.
    stream: Option<String>,
    /// How the turn went, for the circuit breaker.
    reached: Reached,
    /// The event's lease, once its turn runs: forgotten by the heartbeat
    /// when the slot goes, however the turn ended (a panic included).
    lease: Option<u64>,
}

impl Slot {
    /// The destination answered: the slot is free for the next event while
    /// this one's outcome is recorded (the event and its stream stay held
    /// until the slot drops). Wakes the dispatcher.
    fn answered(&self, reached: Reached) {
        let now = self.dispatcher.clock.now_ms();
        self.dispatcher
            .report_turn(&self.source.name, &self.event_id, reached);
        let transition = self.dispatcher.schedule().answered(
            &self.source.name,
            &self.event_id,
            reached,
            now,
            |trips| backoff::ceiling(&self.source, trips),
        );
        if let Some(t) = transition {
            log_transition(&self.dispatcher.gateway, &self.source.name, t, now);
        }
        self.dispatcher.gateway.wake.notify_one();
    }
}

impl Slot {
    /// The destination asked (`Retry-After`) to be left alone until
    /// `until`: no delivery of this source starts before.
    fn hold(&self, until: Millis) {
        let mut schedule = self.dispatcher.schedule();
        schedule.hold(&self.source.name, until);
        schedule.fleet_hold(&self.source.name, until);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let now = self.dispatcher.clock.now_ms();
        if let Some(lease) = self.lease {
            self.dispatcher
                .leases
                .forget(&self.source.name, &self.event_id, lease);
        }
        self.dispatcher
            .report_turn(&self.source.name, &self.event_id, self.reached);
        let transition = self.dispatcher.schedule().finish(
            &self.source.name,
            &self.event_id,
            self.stream.as_deref(),
            self.reached,
            now,
            |trips| backoff::ceiling(&self.source, trips),
        );
        if let Some(t) = transition {
            log_transition(&self.dispatcher.gateway, &self.source.name, t, now);
        }
        self.dispatcher.gateway.wake.notify_one();
    }
}

/// The lanes of `sources` the dispatcher delivers: a source posted to whose
/// destinations all have lanes of their own delivers none itself. With
/// `old` (a reload), a lane whose destination URL changed is marked so.
fn lane_configs(sources: &Sources, old: Option<&Sources>, fleet: bool) -> Vec<LaneConfig> {
    sources
        .iter()
        .filter(|s| s.delivers)
        .map(|s| LaneConfig {
            name: s.name.clone(),
            limit: s.max_in_flight,
            pause_after: s.pause_after,
            rate: s.rate,
            new_destination: old
                .and_then(|o| o.get(&s.name))
                .is_some_and(|o| o.forward_to != s.forward_to),
            fleet,
        })
        .collect()
}

/// The bodies one read may load per source when it reads `sources` of
/// them: an even share of [`READ_BYTES_TOTAL`], between 64 KiB and
/// [`READ_BYTES`].
fn read_budget(sources: usize) -> u64 {
    let share = READ_BYTES_TOTAL / u64::try_from(sources.max(1)).unwrap_or(u64::MAX);
    share.clamp(64 * 1024, READ_BYTES)
}

/// Logs a breaker's transition and raises its alert: `source.paused` when
/// it opens, `source.resumed` when it closes (a failed probe or the probe
/// itself is no news to an operator).
fn log_transition(gateway: &Gateway, source: &str, t: Transition, now: Millis) {
    match t {
        Transition::Paused { failures, until } => {
            tracing::warn!(
                source,
                failures,
                paused_ms = until.saturating_sub(now),
                "destination failing: deliveries of this source paused"
            );
            gateway.alert(
                "source.paused",
                Some(source),
                serde_json::json!({
                    "consecutive_failures": failures,
                    "paused_ms": until.saturating_sub(now),
                }),
            );
        }
        Transition::Probing => {
            tracing::info!(
                source,
                "pause over: probing the destination with one delivery"
            );
        }
        Transition::PausedAgain { until } => tracing::warn!(
            source,
            paused_ms = until.saturating_sub(now),
            "probe failed: deliveries of this source paused again"
        ),
        Transition::Resumed => {
            tracing::info!(source, "destination answers again: deliveries resumed");
            gateway.alert("source.resumed", Some(source), serde_json::json!({}));
        }
    }
}

impl Dispatcher {
    /// A dispatcher over the gateway's configured sources.
    pub fn new(
        gateway: Arc<Gateway>,
        coordination: Coordination,
        clock: SharedClock,
        settings: DeliverySettings,
    ) -> reqwest::Result<Self> {
        let lanes = lane_configs(&gateway.sources(), None, gateway.inbox.lanes().is_some());
        let idle = lanes
            .iter()
            .map(|l| l.limit)
            .max()
            .unwrap_or(1)
            .min(settings.max_in_flight);
        let done_ttl = Ttl::from_ms_unchecked(gateway.retention.delivered_ms);
        let mut schedule = Schedule::new(settings.max_in_flight, []);
        schedule.reconfigure(lanes, clock.now_ms());
        Ok(Self {
            gateway,
            coordination,
            clock,
            forwarder: Forwarder::new(idle)?,
            done_ttl,
            ordering_retention_ms: settings.ordering_retention_ms,
            schedule: Mutex::new(schedule),
            metrics: settings.metrics,
            last_pass: Mutex::new(Instant::now()),
            stopping: AtomicBool::new(false),
            leases: heartbeat::Leases::default(),
        })
    }

    /// Takes the sources a reload put in force (`new`, where `old` were)
    /// from the next pass on: see [`Schedule::reconfigure`] for what each
    /// lane keeps. Turns in flight finish with the source they started
    /// with. Events leased ahead go back to the inbox (they were leased
    /// for the old settings), to be read again under the new ones.
    pub fn reconfigure(&self, old: &Sources, new: &Sources) {
        let now = self.clock.now_ms();
        let fleet = self.gateway.inbox.lanes().is_some();
        let lanes = lane_configs(new, Some(old), fleet);
        let moved: Vec<String> = lanes
            .iter()
            .filter(|l| l.new_destination)
            .map(|l| l.name.clone())
            .collect();
        self.schedule().reconfigure(lanes, now);
        self.reset_lanes(moved);
        self.gateway.arrivals.push_unknown();
        self.gateway.wake.notify_one();
    }

    /// Gives back the place `pick` took for `ev`, whose source a reload
    /// removed before its turn could start: nothing was sent.
    fn unpick(&self, ev: &InboxEvent) {
        let now = self.clock.now_ms();
        self.schedule().finish(
            &ev.source,
            &ev.event_id,
            ev.stream.as_deref(),
            Reached::Nothing,
            now,
            |_| 0,
        );
    }

    /// The delivery state of a configured source.
    pub fn lane(&self, source: &str) -> Option<LaneView> {
        let now = self.clock.now_ms();
        let schedule = self.schedule();
        let mut view = schedule.view(source)?;
        view.rate_limited_until = schedule.rate_limited_until(source, now);
        if let Some(seen) = schedule.fleet_seen(source) {
            view.state = schedule::circuit_state(&seen, now);
            view.consecutive_failures = seen.failures;
            if seen.state == crate::store::lanes::LaneState::Held {
                view.held_until = view.held_until.max(Some(seen.until));
            }
        }
        view.held_until = view.held_until.filter(|until| *until > now);
        Some(view)
    }

    /// The delivery state of a configured source, as the operator reads it:
    /// with a fleet, its breaker, hold and rate limit read from the store
    /// (what every instance sees), with this instance's deliveries in
    /// flight; if the store cannot be read, as this instance last saw them
    /// (`fleet_unread`).
    pub async fn lane_now(&self, source: &str) -> Option<LaneView> {
        let mut view = self.lane(source)?;
        let Some(lanes) = self.gateway.inbox.lanes() else {
            return Some(view);
        };
        if view.scope != LaneScope::Fleet {
            return Some(view);
        }
        let now = self.clock.now_ms();
        match lanes.state(source, now).await {
            Ok(fleet) => {
                view.state = match (fleet.paused_until, fleet.probing) {
                    (Some(until), _) => circuit::State::Open { until },
                    (None, true) => circuit::State::Probing { in_flight: true },
                    (None, false) => circuit::State::Closed,
                };
                view.consecutive_failures = fleet.failures;
                // A hold this instance was given and could not report yet
                // counts too.
                view.held_until = view.held_until.max(fleet.held_until);
                view.rate_limited_until = fleet.rate_limited_until;
            }
            Err(e) => {
                tracing::debug!(source, error = %e.chain(), "cannot read the fleet's state of a lane");
                view.fleet_unread = true;
            }
        }
        Some(view)
    }

    /// Dispatches until `stop` turns true, then waits for deliveries in
    /// flight to finish.
    pub async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let mut tasks = JoinSet::new();
        let mut moves = self.clock.moves();
        // Renews this process's leases until its last turn has ended.
        let heartbeat = self
            .lease_grace()
            .map(|grace| tokio::spawn(self.clone().heartbeat(grace)));
        let mut failing: Option<Duration> = None;
        // Why the last wait ended: a timeout with nothing known due by now
        // needs no read (a read of what was acknowledged makes the writer
        // commit what it holds, taking group commit away from the claims).
        let mut timed_out = false;
        let mut known: Option<Millis> = None;
        let mut last_read = Instant::now();
        let mut ahead = Ahead::default();
        loop {
            if *stop.borrow() {
                break;
            }
            *self
                .last_pass
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Instant::now();
            while tasks.try_join_next().is_some() {}
            let now = self.clock.now_ms();
            let quiet =
                timed_out && known.is_none_or(|t| t > now) && last_read.elapsed() < IDLE_READ;
            let wake_at = if quiet {
                known
            } else {
                last_read = Instant::now();
                match self.dispatch(&mut tasks, &mut ahead).await {
                    Ok(w) => {
                        if failing.take().is_some() {
                            tracing::info!("inbox readable and writable again: deliveries resume");
                        }
                        w
                    }
                    Err(e) => {
                        // Back off while the store fails (disk full, file being
                        // reopened), logging the transition once, not each pass.
                        let wait = match failing {
                            None => {
                                tracing::warn!(error = %e.chain(), "cannot read or lease from the inbox: deliveries wait for the store");
                                STORE_BACKOFF_FIRST
                            }
                            Some(w) => (w * 2).min(STORE_BACKOFF_MAX),
                        };
                        failing = Some(wait);
                        tokio::select! {
                            () = tokio::time::sleep(wait) => {}
                            _ = stop.changed() => {}
                        }
                        timed_out = false;
                        continue;
                    }
                }
            };
            known = wake_at;
            let now = self.clock.now_ms();
            let sleep = wake_at.map_or(POLL, |t| {
                Duration::from_millis(t.saturating_sub(now)).min(POLL)
            });
            let moved = async {
                match &mut moves {
                    Some(m) => m.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            timed_out = false;
            tokio::select! {
                () = self.gateway.wake.notified() => {}
                () = tokio::time::sleep(sleep) => timed_out = true,
                _ = stop.changed() => {}
                ok = moved => if !ok { moves = None },
            }
        }
        self.stopping.store(true, Ordering::SeqCst);
        self.give_back(ahead.drain()).await;
        while tasks.join_next().await.is_some() {}
        if let Some(h) = heartbeat {
            h.abort();
        }
        tracing::debug!("dispatcher stopped");
    }

    /// Puts events leased ahead but never started back to runnable now, so
    /// that they do not wait for their leases to end (after a restart, or
    /// held so long a turn could outlive the lease). Nothing was sent: no
    /// attempt is counted and the last error stays. One that cannot be
    /// written waits for its lease to end instead.
    async fn give_back(&self, ready: Vec<Ready>) {
        let now = self.clock.now_ms();
        // All at once: they share commits.
        let mut writes = JoinSet::new();
        for r in ready {
            self.leases.forget(&r.ev.source, &r.ev.event_id, r.lease);
            let gateway = self.gateway.clone();
            writes.spawn(async move {
                // An empty error leaves the stored last error as it is.
                let settle = Settle::Retry {
                    retry_at: now,
                    error: String::new(),
                    attempted: false,
                };
                let retention = gateway
                    .source(&r.ev.source)
                    .map_or(gateway.retention, |s| s.retention(gateway.retention));
                let written = gateway
                    .inbox
                    .settle(&r.ev.key(), r.lease, settle, retention, now)
                    .await;
                if let Err(e) = written {
                    tracing::debug!(source = %r.ev.source, event_id = %r.ev.event_id, error = %e.chain(), "a leased-ahead event waits for its lease to end");
                }
            });
        }
        while writes.join_next().await.is_some() {}
    }

    /// Whether the dispatch loop went round within `within` (its longest
    /// wait is [`STORE_BACKOFF_MAX`]): false once it hangs or has ended.
    pub fn is_alive(&self, within: Duration) -> bool {
        let last = *self
            .last_pass
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        last.elapsed() <= within.max(STORE_BACKOFF_MAX + POLL)
    }

    /// Starts deliveries for what may start now; returns when to look
    /// again (`None`: when woken, or after the poll interval).
    async fn dispatch(
        self: &Arc<Self>,
        tasks: &mut JoinSet<()>,
        ahead: &mut Ahead,
    ) -> Result<Option<Millis>, StoreError> {
        let now = self.clock.now_ms();
        let mut back = ahead.take_expiring(now);
        // An event that goes before one held ahead in its stream: the held
        // one goes back, so the stream stays oldest first.
        match self.gateway.arrivals.take() {
            Some(arrivals) => {
                let mut held: HashMap<String, HashSet<String>> = HashMap::new();
                for a in arrivals {
                    let streams = held
                        .entry(a.source.clone())
                        .or_insert_with(|| ahead.streams(&a.source));
                    if streams.contains(&a.stream) {
                        back.extend(ahead.take_newer(&a.source, &a.stream, a.created_at));
                    }
                }
            }
            None => back.extend(ahead.drain()),
        }
        if !back.is_empty() {
            self.give_back(back).await;
        }
        let mut wanted = self.schedule().wants(now);
        for (source, t) in std::mem::take(&mut wanted.transitions) {
            log_transition(&self.gateway, &source, t, now);
        }
        if wanted.reads.is_empty() {
            return Ok(wanted.reopens_at);
        }
        // With a fleet: only what the fleet's lanes allow.
        self.gate_lanes(&mut wanted, now).await?;
        let Wants {
            reads: wants,
            starts,
            reopens_at: reopens,
            ..
        } = wanted;
        if wants.is_empty() {
            return Ok(reopens);
        }
        // Held ahead, an event waits out its lease after a crash: only
        // where that is as short as an interrupted turn's wait (renewed
        // leases last the grace, whatever the timeout).
        let renewed = self.lease_grace().is_some();
        let allowed: HashMap<&str, usize> = wants
            .iter()
            .zip(&starts)
            .map(|((source, _), (_, allowed))| {
                let short = renewed
                    || self
                        .gateway
                        .source(source)
                        .is_some_and(|s| s.forward_timeout <= AHEAD_MAX_TIMEOUT);
                (source.as_str(), if short { *allowed } else { 0 })
            })
            .collect();
        // A source whose events leased ahead cover its free slots needs no
        // read (a read of what was acknowledged makes the writer commit).
        // Those that read take enough to fill what they hold ahead too.
        let reads: Vec<(String, usize)> = wants
            .iter()
            .zip(&starts)
            .filter(|((source, _), (start, _))| ahead.len(source) < *start)
            .map(|((source, n), _)| {
                let room = allowed[source.as_str()].saturating_sub(ahead.len(source));
                (source.clone(), n + room)
            })
            .collect();
        let due = if reads.is_empty() {
            Vec::new()
        } else {
            self.gateway
                .inbox
                .due_events(now, reads.clone(), read_budget(reads.len()))
                .await?
        };
        // Only a time still ahead is worth waiting for: events due now but
        // held back by a limit start when a finishing turn wakes the loop.
        let mut next = reopens;
        let mut read: HashMap<String, Vec<InboxEvent>> = HashMap::new();
        for ((source, _), found) in reads.into_iter().zip(due) {
            if let Some(at) = found.next.filter(|at| *at > now) {
                next = Some(next.map_or(at, |n| n.min(at)));
            }
            // Read again, so due again: its lease ended, the copy held
            // ahead is stale.
            for ev in &found.events {
                if let Some(stale) = ahead.take(&source, &ev.event_id) {
                    self.leases
                        .forget(&stale.ev.source, &stale.ev.event_id, stale.lease);
                }
            }
            read.insert(source, found.events);
        }
        let mut candidates = Vec::with_capacity(wants.len());
        for (source, _) in &wants {
            let mut events = ahead.candidates(source);
            events.extend(read.remove(source).unwrap_or_default());
            candidates.push((source.clone(), events));
        }
        let (picked, rest) = self.schedule().pick_keep(candidates);
        self.return_unused();
        let mut to_lease = Vec::new();
        for ev in picked {
            match ahead.take(&ev.source, &ev.event_id) {
                Some(ready) => self.spawn_turn(ready.ev, ready.lease, tasks),
                None => to_lease.push(ev),
            }
        }
        let extra = self.lease_ahead_of(rest, &allowed, ahead);
        if !to_lease.is_empty() || !extra.is_empty() {
            self.start(to_lease, extra, now, tasks, ahead).await?;
        }
        Ok(next)
    }

    /// Of the events read but not started, those to lease ahead: per
    /// source, up to what it is `allowed` to hold (see `schedule`) and
    /// [`AHEAD_BYTES`] of bodies, none in flight, one per stream; over all
    /// sources, no more than [`AHEAD_PER_SLOT`] times the global
    /// `max_in_flight` and [`AHEAD_BYTES_TOTAL`] of bodies.
    fn lease_ahead_of(
        &self,
        rest: Vec<InboxEvent>,
        allowed: &HashMap<&str, usize>,
        ahead: &Ahead,
    ) -> Vec<InboxEvent> {
        let schedule = self.schedule();
        let mut total = ahead.total();
        let mut total_bytes = ahead.total_bytes();
        let total_allowed = schedule.limit().saturating_mul(AHEAD_PER_SLOT);
        let mut extra = Vec::new();
        let mut taken: HashMap<String, (usize, u64, HashSet<String>)> = HashMap::new();
        for ev in rest {
            let Some(limit) = allowed.get(ev.source.as_str()).copied() else {
                continue;
            };
            if total >= total_allowed {
                break;
            }
            if ahead.contains(&ev.source, &ev.event_id)
                || schedule.holds(&ev.source, &ev.event_id, ev.stream.as_deref())
            {
                continue;
            }
            let (count, bytes, streams) = taken.entry(ev.source.clone()).or_insert_with(|| {
                (
                    ahead.len(&ev.source),
                    ahead.bytes(&ev.source),
                    ahead.streams(&ev.source),
                )
            });
            let body = ev.body.len() as u64;
            if *count >= limit
                || (*count > 0 && *bytes + body > AHEAD_BYTES)
                || total_bytes + body > AHEAD_BYTES_TOTAL
            {
                continue;
            }
            if let Some(stream) = &ev.stream
                && !streams.insert(stream.clone())
            {
                continue;
            }
            *count += 1;
            *bytes += body;
            total += 1;
            total_bytes += body;
            extra.push(ev);
        }
        extra
    }

    /// Leases the picked events (and `extra`, to hold ahead) in one write,
    /// starts a turn for each picked one leased, and holds each extra one
    /// leased in `ahead`.
    async fn start(
        self: &Arc<Self>,
        picked: Vec<InboxEvent>,
        extra: Vec<InboxEvent>,
        now: Millis,
        tasks: &mut JoinSet<()>,
        ahead: &mut Ahead,
    ) -> Result<(), StoreError> {
        let mut slots = Vec::with_capacity(picked.len());
        for ev in picked {
            let Some(source) = self.gateway.source(&ev.source) else {
                self.unpick(&ev);
                continue;
            };
            let slot = Slot {
                dispatcher: self.clone(),
                source: source.clone(),
                event_id: ev.event_id.clone(),
                stream: ev.stream.clone(),
                reached: Reached::Nothing,
                lease: None,
            };
            slots.push((source, ev, slot));
        }
        // A renewed lease lasts the grace; one nobody renews outlives the
        // attempt's timeout by a margin.
        let grace = self.lease_grace();
        let lease_until = |ev: &InboxEvent| match grace {
            Some(grace) => now.saturating_add(millis(grace)),
            None => {
                let timeout = self
                    .gateway
                    .source(&ev.source)
                    .map_or(0, |s| millis(s.forward_timeout));
                now.saturating_add(timeout).saturating_add(GRACE_MS)
            }
        };
        // One lease write per retention an event found stale is kept for
        // (sources may override the gateway's): one, unless they differ
        // and the inbox checks heads. A write that fails does not throw
        // away what the others leased: the call fails only when all did.
        let stale_check = matches!(self.coordination, Coordination::Inbox);
        let mut by_retention: Vec<(Retention, Vec<(EventKey, Millis)>)> = Vec::new();
        for ev in slots.iter().map(|(_, ev, _)| ev).chain(&extra) {
            let retention = if stale_check {
                self.retention_of(&ev.source)
            } else {
                self.gateway.retention
            };
            let lease = (ev.key(), lease_until(ev));
            let same = |r: &Retention| {
                (r.delivered_ms, r.dead_ms) == (retention.delivered_ms, retention.dead_ms)
            };
            match by_retention.iter_mut().find(|(r, _)| same(r)) {
                Some((_, group)) => group.push(lease),
                None => by_retention.push((retention, vec![lease])),
            }
        }
        // On an error, dropping the slots frees them; the events stay
        // runnable.
        let mut leased = Leased::default();
        let mut failed = None;
        let groups = by_retention.len();
        for (retention, leases) in by_retention {
            match self
                .gateway
                .inbox
                .lease(leases, stale_check.then_some(retention), now)
                .await
            {
                Ok(part) => {
                    leased.leased.extend(part.leased);
                    leased.stale.extend(part.stale);
                }
                Err(e) => failed = Some(e),
            }
        }
        if let Some(e) = failed {
            if groups == 1 || (leased.leased.is_empty() && leased.stale.is_empty()) {
                return Err(e);
            }
            tracing::debug!(error = %e.chain(), "a lease write failed; its events come due again");
        }
        for (source, id) in &leased.stale {
            tracing::info!(source = %source, event_id = %id, "stale: older than its stream's head");
            self.metrics.delivery(source, "stale");
        }
        if grace.is_some() {
            for l in &leased.leased {
                let stream = slots
                    .iter()
                    .map(|(_, ev, _)| ev)
                    .chain(&extra)
                    .find(|ev| ev.source == l.source && ev.event_id == l.event_id)
                    .and_then(|ev| ev.stream.as_deref());
                let key = EventKey::new(&l.source, &l.event_id, stream);
                self.leases.hold(key, l.lease, now);
            }
        }
        let mut current: HashMap<(String, String), LeasedEvent> = leased
            .leased
            .into_iter()
            .map(|l| ((l.source.clone(), l.event_id.clone()), l))
            .collect();
        // Only events still pending and runnable were leased; the read that
        // found them may predate their last settle.
        let mut fresh = |mut ev: InboxEvent| {
            let l = current.remove(&(ev.source.clone(), ev.event_id.clone()))?;
            ev.attempts = l.attempts;
            ev.force = l.force;
            ev.replay = l.replay;
            Some((ev, l.lease))
        };
        for (source, ev, slot) in slots {
            if let Some((ev, lease)) = fresh(ev) {
                self.spawn(source, ev, lease, slot, tasks, false);
            }
        }
        for ev in extra {
            if let Some((ev, lease)) = fresh(ev) {
                let latest_start = now.saturating_add(GRACE_MS / 2);
                ahead.push(Ready {
                    ev,
                    lease,
                    latest_start,
                });
            }
        }
        Ok(())
    }

    /// Starts the turn of an event picked from those leased ahead.
    fn spawn_turn(self: &Arc<Self>, ev: InboxEvent, lease: u64, tasks: &mut JoinSet<()>) {
        let Some(source) = self.gateway.source(&ev.source) else {
            // Its lease ends (no longer renewed) and it comes due again, as
            // any pending event of a removed source: listed, not delivered.
            self.leases.forget(&ev.source, &ev.event_id, lease);
            self.unpick(&ev);
            return;
        };
        let slot = Slot {
            dispatcher: self.clone(),
            source: source.clone(),
            event_id: ev.event_id.clone(),
            stream: ev.stream.clone(),
            reached: Reached::Nothing,
            lease: None,
        };
        // Held ahead in a shared inbox: another instance's operator may
        // have erased or redelivered it since.
        let check = self.gateway.inbox.written_elsewhere();
        self.spawn(source, ev, lease, slot, tasks, check);
    }

    /// Runs one turn in its own task; the slot goes when it ends. With
    /// `check`, only if the event's lease still holds in the inbox;
    /// otherwise (or unreadable) it is left to its lease's end, when it
    /// comes due again if still pending.
    fn spawn(
        self: &Arc<Self>,
        source: Arc<Source>,
        ev: InboxEvent,
        lease: u64,
        mut slot: Slot,
        tasks: &mut JoinSet<()>,
        check: bool,
    ) {
        slot.lease = Some(lease);
        let this = self.clone();
        tasks.spawn(async move {
            let key = ev.key();
            if check && this.lease_grace().is_some() {
                // Renews it, or says it is gone.
                if !this.lease_live(&key, lease, true).await {
                    tracing::info!(source = %ev.source, event_id = %ev.event_id, "held ahead, but erased, taken elsewhere or run out since: not sent");
                    return;
                }
            } else if check {
                match this.gateway.inbox.lease_holds(&key, lease).await {
                    Ok(true) => {}
                    Ok(false) => {
                        tracing::info!(source = %ev.source, event_id = %ev.event_id, "held ahead, but erased or taken elsewhere since: not sent");
                        return;
                    }
                    Err(e) => {
                        tracing::debug!(source = %ev.source, event_id = %ev.event_id, error = %e.chain(), "held ahead, and its lease could not be checked: it comes due at its lease's end");
                        return;
                    }
                }
            }
            slot.reached = this.turn(&source, &ev, lease, &slot).await;
            drop(slot);
            if ev.replay.is_some() {
                // Its job has room again.
                this.gateway.jobs_wake.notify_one();
            }
        });
    }

    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    fn schedule(&self) -> MutexGuard<'_, Schedule> {
        // A panicking turn cannot leave the schedule locked for good.
        self.schedule.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_shares_its_byte_budget_among_its_sources() {
        assert_eq!(read_budget(0), READ_BYTES);
        assert_eq!(read_budget(1), READ_BYTES);
        assert_eq!(read_budget(4), READ_BYTES);
        assert_eq!(read_budget(8), READ_BYTES_TOTAL / 8);
        assert_eq!(read_budget(100_000), 64 * 1024);
    }
}
