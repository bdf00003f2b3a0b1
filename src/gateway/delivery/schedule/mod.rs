//! Scheduling: which runnable events start now.
//!
//! Limits, all counted in deliveries in flight: each source has its own
//! (`sources.NAME.max_in_flight`) under a global one
//! (`gateway.max_in_flight`); a stream has at most one; a source whose
//! circuit is open has none. Free global slots are shared round-robin, one
//! event per source per round, starting at a source that rotates from pass
//! to pass, so a source with a deep backlog cannot crowd out the others.
//! A hanging receiver holds only its own source's slots.
//!
//! A slot is held while the request is out, not while its outcome is being
//! recorded: once the destination answered, [`Schedule::answered`] frees
//! the slot for the next event, and only the event and its stream stay held
//! until the outcome is durable ([`Schedule::finish`]). So a source with
//! `max_in_flight = 16` has 16 requests out at a time, not 16 requests and
//! group commits in series; an event's stream still never has two
//! deliveries at once, and its next event is not read before the head
//! moved. The outcomes waiting for their commit are bounded too: at most
//! [`SETTLING_PER_SLOT`] times a source's `max_in_flight`.
//!
//! A reload changes the lanes in place ([`Schedule::reconfigure`]): a lane
//! that stays keeps its counts, its breaker and its bucket (unless its
//! rate, or its destination, changed); a new one starts as at a start; a
//! removed one starts nothing more, and goes once its deliveries out have
//! finished, so the global count of what is in flight stays exact.

mod fleet;

use std::collections::HashSet;

pub use self::fleet::{FleetSeen, circuit_state};

use self::fleet::LaneFleet;
use super::circuit::{Circuit, State, Transition};
use crate::clock::Millis;
use crate::domain::Rate;
use crate::store::inbox::InboxEvent;

/// How many answered deliveries per slot of a source may wait for their
/// outcome to be recorded before the source starts no more.
pub const SETTLING_PER_SLOT: usize = 4;
/// Events a source may hold leased ahead per slot of its `max_in_flight`
/// (see `delivery::ahead`): enough that its slots keep starting events
/// while the next read and lease are out.
pub const AHEAD_PER_SLOT: usize = 8;

/// One configured source's share of the scheduler.
#[derive(Debug)]
struct Lane {
    /// Its `max_in_flight`.
    limit: usize,
    /// Its requests out (slots held).
    in_flight: usize,
    /// Its answered deliveries whose outcome is not yet recorded.
    settling: usize,
    /// Its destination's circuit breaker.
    circuit: Circuit,
    /// The event id of the probe in flight, while probing.
    probe: Option<String>,
    /// Its `rate_limit`, as a token bucket.
    bucket: Option<Bucket>,
    /// Until when its destination asked to be left alone (`Retry-After`).
    held_until: Option<Millis>,
    /// Removed by a reload while deliveries of it were out: it starts no
    /// more, and goes once they have finished.
    retired: bool,
    /// With a fleet (the shared inbox), what the fleet's lane state last
    /// said: its breaker, hold and bucket are the fleet's, not this one's.
    fleet: Option<LaneFleet>,
}

/// One lane's settings, as [`Schedule::reconfigure`] takes them.
#[derive(Debug, Clone)]
pub struct LaneConfig {
    /// The lane's (source's) name.
    pub name: String,
    /// Its `max_in_flight`.
    pub limit: usize,
    /// Its `pause_after`: consecutive failures that open its breaker.
    pub pause_after: u32,
    /// Its `rate_limit` and burst, if any.
    pub rate: Option<(Rate, u32)>,
    /// Its destination changed (another URL): the breaker and a
    /// `Retry-After` hold, which were about the old one, start over.
    pub new_destination: bool,
    /// Its breaker, hold and rate limit are the fleet's (the shared
    /// inbox): the lane keeps no bucket and its own breaker never opens;
    /// the fleet's gate decides (see [`Schedule::apply_gate`]).
    pub fleet: bool,
}

/// A token bucket: `burst` tokens at most, refilled at `per_ms`; a
/// delivery takes one to start. It starts empty, so a restart does not
/// burst: over any time `t` that spans a restart, at most `burst + rate ×
/// t` deliveries start, as without the restart.
#[derive(Debug)]
struct Bucket {
    per_ms: f64,
    burst: f64,
    tokens: f64,
    at: Millis,
}

impl Bucket {
    /// An empty bucket at `now`: a start or a new rate does not burst.
    fn empty(rate: Rate, burst: u32, now: Millis) -> Self {
        Self {
            per_ms: rate.per_ms(),
            burst: f64::from(burst.max(1)),
            tokens: 0.0,
            at: now,
        }
    }

    /// Whether it refills at `rate` up to `burst`.
    fn is(&self, rate: Rate, burst: u32) -> bool {
        self.per_ms == rate.per_ms() && self.burst == f64::from(burst.max(1))
    }

    fn refill(&mut self, now: Millis) {
        if now > self.at {
            let gained = (now - self.at) as f64 * self.per_ms;
            self.tokens = (self.tokens + gained).min(self.burst);
            self.at = now;
        }
    }

    fn available(&self) -> usize {
        // tokens <= burst <= 1_000_000: the cast cannot truncate.
        self.tokens.floor().max(0.0) as usize
    }

    /// When the next token is there at `now`, if none is; reads only.
    fn next_at_from(&self, now: Millis) -> Option<Millis> {
        let gained = now.saturating_sub(self.at) as f64 * self.per_ms;
        let tokens = (self.tokens + gained).min(self.burst);
        (tokens < 1.0).then(|| {
            // A period is at most an hour: the cast cannot truncate.
            now.max(self.at) + ((1.0 - tokens) / self.per_ms).ceil() as Millis
        })
    }

    /// When the next token is there, if none is now.
    fn next_at(&self) -> Option<Millis> {
        (self.tokens < 1.0).then(|| {
            let wait = ((1.0 - self.tokens) / self.per_ms).ceil();
            // A period is at most an hour: the cast cannot truncate.
            self.at.saturating_add(wait as Millis)
        })
    }
}

impl Lane {
    /// A lane with nothing in flight and its breaker closed.
    fn new(limit: usize, pause_after: u32) -> Self {
        Self {
            limit: limit.max(1),
            in_flight: 0,
            settling: 0,
            circuit: Circuit::new(pause_after),
            probe: None,
            bucket: None,
            held_until: None,
            retired: false,
            fleet: None,
        }
    }

    /// How many events it may hold leased ahead: [`AHEAD_PER_SLOT`] times
    /// its `max_in_flight`, but with a rate limit no more than ten seconds
    /// of tokens, and none unless its breaker is closed (a probe goes
    /// alone): held events that cannot start soon are handed back, and
    /// each hand-back is a write.
    fn ahead(&self) -> usize {
        if !matches!(self.circuit.state(), State::Closed)
            || self.fleet.as_ref().is_some_and(LaneFleet::holds_back)
        {
            return 0;
        }
        let by_slots = self.limit.saturating_mul(AHEAD_PER_SLOT);
        let per_ms = match &self.fleet {
            Some(f) => f.rate.map(|(rate, _)| rate.per_ms()),
            None => self.bucket.as_ref().map(|b| b.per_ms),
        };
        match per_ms {
            // At most 1,000,000 per second: the cast cannot truncate.
            Some(per_ms) => by_slots.min((per_ms * 10_000.0).floor() as usize),
            None => by_slots,
        }
    }

    /// Slots free for new requests: under `max_in_flight`, and with fewer
    /// than [`SETTLING_PER_SLOT`] outcomes per slot waiting to be recorded.
    fn free(&self) -> usize {
        let by_requests = self.limit.saturating_sub(self.in_flight);
        let by_settling =
            (self.limit * SETTLING_PER_SLOT).saturating_sub(self.in_flight + self.settling);
        by_requests.min(by_settling)
    }
}

/// What is in flight and what may start.
#[derive(Debug)]
pub struct Schedule {
    /// `gateway.max_in_flight`.
    limit: usize,
    /// Deliveries in flight over all sources.
    in_flight: usize,
    /// Per configured source, in name order.
    lanes: Vec<(String, Lane)>,
    /// Index of the lane that goes first in the next pass.
    turn: usize,
    /// `(source, event id)` in flight: request out, or outcome not yet
    /// recorded.
    events: HashSet<(String, String)>,
    /// `(source, event id)` whose request is out (holding a slot).
    requests: HashSet<(String, String)>,
    /// `(source, stream)` with a delivery in flight.
    streams: HashSet<(String, String)>,
}

/// How a delivery turn ended, as the circuit breaker sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reached {
    /// The destination answered 2xx.
    Success,
    /// The attempt failed (non-2xx, timeout, connection error).
    Failure,
    /// No request was sent (stale, claim busy, store unavailable).
    Nothing,
}

/// What a dispatch pass should read, and what changed.
#[derive(Debug, Default)]
pub struct Wants {
    /// Per source that may start deliveries: how many events to read.
    pub reads: Vec<(String, usize)>,
    /// Per source in `reads`, in the same order: how many may start now,
    /// and how many it may hold leased ahead (see [`Lane::ahead`]).
    pub starts: Vec<(usize, usize)>,
    /// Circuit transitions to log.
    pub transitions: Vec<(String, Transition)>,
    /// The earliest time a paused source lets a probe through.
    pub reopens_at: Option<Millis>,
}

/// A source's delivery state, for the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneView {
    /// Deliveries in flight.
    pub in_flight: usize,
    pub max_in_flight: usize,
    /// Consecutive failed attempts.
    pub consecutive_failures: u32,
    pub state: State,
    /// Until when the destination asked to be left alone (`Retry-After`).
    pub held_until: Option<Millis>,
    /// With a rate limit and no token left: when the next one comes.
    pub rate_limited_until: Option<Millis>,
    /// Whose breaker, hold and bucket these are: this instance's, or the
    /// fleet's (the shared inbox).
    pub scope: LaneScope,
    /// The fleet's state could not be read (the store is down): `state`,
    /// the hold and the bucket are as this instance last saw them.
    pub fleet_unread: bool,
}

/// Whose delivery state a [`LaneView`] shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaneScope {
    /// This instance's own (the local inbox).
    Instance,
    /// The fleet's, shared by every instance on the shared inbox.
    Fleet,
}

impl Schedule {
    /// A schedule for `sources` as `(name, max_in_flight, pause_after)`
    /// under a global limit.
    pub fn new(limit: usize, sources: impl IntoIterator<Item = (String, usize, u32)>) -> Self {
        let mut lanes: Vec<(String, Lane)> = sources
            .into_iter()
            .map(|(name, limit, pause_after)| (name, Lane::new(limit, pause_after)))
            .collect();
        lanes.sort_by(|a, b| a.0.cmp(&b.0));
        Self {
            limit: limit.max(1),
            in_flight: 0,
            lanes,
            turn: 0,
            events: HashSet::new(),
            requests: HashSet::new(),
            streams: HashSet::new(),
        }
    }

    /// Limits `source` to `rate`, with `burst`; its bucket starts empty at
    /// `now`.
    pub fn rate_limit(&mut self, source: &str, rate: Rate, burst: u32, now: Millis) {
        if let Some((_, lane)) = self.lanes.iter_mut().find(|(l, _)| l == source) {
            lane.bucket = Some(Bucket::empty(rate, burst, now));
        }
    }

    /// Makes `lanes` the configured lanes at `now` (a start, or a reload).
    /// A lane that stays keeps what is in flight, its breaker and its
    /// bucket, with its new limit and `pause_after`; a changed rate starts
    /// an empty bucket, a changed destination a closed breaker and no
    /// hold. A new lane starts as at a start. A removed lane starts
    /// nothing more and goes once what it has in flight has finished
    /// (until then [`Schedule::finish`] still counts it down).
    pub fn reconfigure(&mut self, lanes: Vec<LaneConfig>, now: Millis) {
        for (_, lane) in &mut self.lanes {
            lane.retired = true;
        }
        for cfg in lanes {
            let lane = match self.lanes.iter_mut().find(|(l, _)| *l == cfg.name) {
                Some((_, lane)) => {
                    lane.retired = false;
                    lane.limit = cfg.limit.max(1);
                    lane.circuit.set_threshold(cfg.pause_after);
                    if cfg.new_destination {
                        lane.circuit = Circuit::new(cfg.pause_after);
                        lane.probe = None;
                        lane.held_until = None;
                        lane.fleet = None;
                    }
                    lane
                }
                None => {
                    self.lanes
                        .push((cfg.name.clone(), Lane::new(cfg.limit, cfg.pause_after)));
                    &mut self.lanes.last_mut().expect("just pushed").1
                }
            };
            if cfg.fleet {
                // The fleet keeps the breaker and the bucket.
                lane.circuit.set_threshold(0);
                let rate = cfg.rate;
                lane.fleet.get_or_insert_with(LaneFleet::default).rate = rate;
                lane.bucket = None;
                continue;
            }
            lane.fleet = None;
            lane.bucket = match (cfg.rate, lane.bucket.take()) {
                (Some((rate, burst)), Some(b)) if b.is(rate, burst) => Some(b),
                (Some((rate, burst)), _) => Some(Bucket::empty(rate, burst, now)),
                (None, _) => None,
            };
        }
        self.drop_retired();
        self.lanes.sort_by(|a, b| a.0.cmp(&b.0));
    }

    /// Forgets the removed lanes with nothing left in flight.
    fn drop_retired(&mut self) {
        self.lanes
            .retain(|(_, l)| !l.retired || l.in_flight + l.settling > 0);
    }

    /// Starts no delivery of `source` before `until` (its destination
    /// answered 429 or 503 with `Retry-After`); a later hold wins.
    pub fn hold(&mut self, source: &str, until: Millis) {
        if let Some((_, lane)) = self.lanes.iter_mut().find(|(l, _)| l == source) {
            lane.held_until = Some(lane.held_until.map_or(until, |h| h.max(until)));
        }
    }

    /// `gateway.max_in_flight`.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Free global slots.
    pub fn free(&self) -> usize {
        self.limit.saturating_sub(self.in_flight)
    }

    /// Deliveries in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// For each source that may start deliveries at `now`: how many events
    /// to read (its free slots, or one probe). Also returns circuit
    /// transitions to log, and the earliest time a paused source reopens.
    pub fn wants(&mut self, now: Millis) -> Wants {
        let mut wants = Wants::default();
        self.drop_retired();
        if self.free() == 0 {
            return wants;
        }
        for (name, lane) in &mut self.lanes {
            if lane.retired {
                continue;
            }
            let free = lane.free();
            let (mut n, t) = lane.circuit.allowance(free, now);
            if let Some(t) = t {
                wants.transitions.push((name.clone(), t));
            }
            let mut wake = lane.circuit.reopens_at();
            if let Some(until) = lane.fleet.as_mut().and_then(|f| f.waits(now)) {
                n = 0;
                wake = Some(wake.map_or(until, |w| w.min(until)));
            }
            match lane.held_until {
                Some(until) if until > now => {
                    n = 0;
                    wake = Some(wake.map_or(until, |w| w.max(until)));
                }
                Some(_) => lane.held_until = None,
                None => {}
            }
            if let Some(bucket) = &mut lane.bucket {
                bucket.refill(now);
                if n > 0 && bucket.available() == 0 {
                    wake = bucket.next_at().or(wake);
                }
                n = n.min(bucket.available());
            }
            if let Some(at) = wake {
                wants.reopens_at = Some(wants.reopens_at.map_or(at, |r| r.min(at)));
            }
            if n > 0 {
                // Read as many more as the lane holds: its slots free up
                // while the read is out (a destination answers in well under
                // a read and a commit), and the pick fills them from what
                // was read. Counted in one bench run: about 15 picks per
                // pass against 1 to 2 free slots when the read began;
                // benches/delivery.rs (nginx, defaults) went from 2.4x to
                // 1.9x the posting time until nothing was pending.
                let held = lane.in_flight + lane.settling;
                wants.reads.push((name.clone(), n + held));
                wants.starts.push((n, lane.ahead()));
            }
        }
        wants
    }

    /// Picks from each source's runnable events (as read for
    /// [`Schedule::wants`]) round-robin until the global slots run out, and
    /// marks the picked ones in flight. Returns them, and whether runnable
    /// events were left for lack of slots.
    pub fn pick(&mut self, candidates: Vec<(String, Vec<InboxEvent>)>) -> (Vec<InboxEvent>, bool) {
        let (picked, rest) = self.pick_keep(candidates);
        (picked, !rest.is_empty())
    }

    /// As [`Schedule::pick`], returning the candidates not looked at (left
    /// for lack of slots) instead of whether there were any.
    pub fn pick_keep(
        &mut self,
        mut candidates: Vec<(String, Vec<InboxEvent>)>,
    ) -> (Vec<InboxEvent>, Vec<InboxEvent>) {
        let n = self.lanes.len().max(1);
        let start = self.turn % n;
        self.turn = self.turn.wrapping_add(1);
        // Order candidate lists by lane, starting at this pass's first lane.
        let pos = |name: &str| {
            self.lanes
                .iter()
                .position(|(l, _)| l == name)
                .map_or(usize::MAX, |i| (i + n - start) % n)
        };
        candidates.sort_by_key(|(name, _)| pos(name));
        let mut queues: Vec<(String, std::vec::IntoIter<InboxEvent>)> = candidates
            .into_iter()
            .map(|(name, events)| (name, events.into_iter()))
            .collect();
        let mut picked = Vec::new();
        let mut progress = true;
        while progress && self.free() > 0 {
            progress = false;
            for (name, queue) in &mut queues {
                if self.free() == 0 {
                    break;
                }
                let Some(lane) = self
                    .lanes
                    .iter_mut()
                    .find(|(l, _)| l == name)
                    .map(|(_, l)| l)
                else {
                    continue;
                };
                // Retired by a reload since the pass read its events.
                if lane.retired
                    || lane.free() == 0
                    || lane.bucket.as_ref().is_some_and(|b| b.tokens < 1.0)
                    || lane.fleet.as_ref().is_some_and(|f| f.granted == Some(0))
                {
                    continue;
                }
                if matches!(lane.circuit.state(), State::Probing { in_flight: true }) {
                    continue;
                }
                for ev in queue.by_ref() {
                    let key = (ev.source.clone(), ev.event_id.clone());
                    if self.events.contains(&key) {
                        continue;
                    }
                    if let Some(stream) = &ev.stream
                        && !self.streams.insert((ev.source.clone(), stream.clone()))
                    {
                        continue;
                    }
                    self.events.insert(key.clone());
                    self.requests.insert(key);
                    lane.in_flight += 1;
                    if matches!(lane.circuit.state(), State::Probing { .. }) {
                        lane.probe = Some(ev.event_id.clone());
                    }
                    lane.circuit.started();
                    if let Some(bucket) = &mut lane.bucket {
                        bucket.tokens -= 1.0;
                    }
                    if let Some(f) = &mut lane.fleet {
                        f.started(&ev.event_id);
                    }
                    self.in_flight += 1;
                    picked.push(ev);
                    progress = true;
                    break;
                }
            }
        }
        let rest = queues.into_iter().flat_map(|(_, q)| q).collect();
        (picked, rest)
    }

    /// Whether `source`'s event `id` or its stream is in flight (request
    /// out, or outcome not yet recorded).
    pub fn holds(&self, source: &str, id: &str, stream: Option<&str>) -> bool {
        self.events.contains(&(source.to_owned(), id.to_owned()))
            || stream.is_some_and(|s| self.streams.contains(&(source.to_owned(), s.to_owned())))
    }

    /// The destination answered (or the turn ended without a request): the
    /// event's slot is free for the next one, and the outcome feeds its
    /// source's circuit. The event and its stream stay held until
    /// [`Schedule::finish`]. `pause` gives the circuit's pause after its
    /// n-th opening in a row. Does nothing the second time.
    pub fn answered(
        &mut self,
        source: &str,
        event_id: &str,
        reached: Reached,
        now: Millis,
        pause: impl Fn(u32) -> Millis,
    ) -> Option<Transition> {
        if !self
            .requests
            .remove(&(source.to_owned(), event_id.to_owned()))
        {
            return None;
        }
        self.in_flight = self.in_flight.saturating_sub(1);
        let lane = self
            .lanes
            .iter_mut()
            .find(|(l, _)| l == source)
            .map(|(_, l)| l)?;
        lane.in_flight = lane.in_flight.saturating_sub(1);
        lane.settling += 1;
        let was_probe = lane.probe.as_deref() == Some(event_id);
        if was_probe {
            lane.probe = None;
        }
        match reached {
            Reached::Success => lane.circuit.succeeded(),
            Reached::Failure => lane.circuit.failed(now, pause),
            // Only the probe's slot is the circuit's business.
            Reached::Nothing if was_probe => {
                lane.circuit.neutral();
                None
            }
            Reached::Nothing => None,
        }
    }

    /// A picked event's turn ended, its outcome recorded (or the turn never
    /// started): its slot (if [`Schedule::answered`] did not free it yet),
    /// the event and its stream are free again.
    pub fn finish(
        &mut self,
        source: &str,
        event_id: &str,
        stream: Option<&str>,
        reached: Reached,
        now: Millis,
        pause: impl Fn(u32) -> Millis,
    ) -> Option<Transition> {
        let transition = self.answered(source, event_id, reached, now, pause);
        if !self
            .events
            .remove(&(source.to_owned(), event_id.to_owned()))
        {
            return transition;
        }
        if let Some(stream) = stream {
            self.streams.remove(&(source.to_owned(), stream.to_owned()));
        }
        if let Some(lane) = self.lanes.iter_mut().find(|(l, _)| l == source) {
            lane.1.settling = lane.1.settling.saturating_sub(1);
        }
        transition
    }

    /// When `source`'s own bucket has its next token at `now`, if it has
    /// none.
    pub fn rate_limited_until(&self, source: &str, now: Millis) -> Option<Millis> {
        self.lanes
            .iter()
            .find(|(l, _)| l == source)
            .and_then(|(_, l)| l.bucket.as_ref()?.next_at_from(now))
    }

    /// The delivery state of `source`, if it is configured.
    pub fn view(&self, source: &str) -> Option<LaneView> {
        self.lanes
            .iter()
            .find(|(l, lane)| l == source && !lane.retired)
            .map(|(_, l)| LaneView {
                in_flight: l.in_flight,
                max_in_flight: l.limit,
                consecutive_failures: l.circuit.failures(),
                state: l.circuit.state(),
                held_until: l.held_until,
                rate_limited_until: None,
                scope: if l.fleet.is_some() {
                    LaneScope::Fleet
                } else {
                    LaneScope::Instance
                },
                fleet_unread: false,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::CreatedAt;
    use crate::store::inbox::EventStatus;

    pub(super) fn ev(source: &str, id: &str, stream: Option<&str>) -> InboxEvent {
        InboxEvent {
            source: source.into(),
            event_id: id.into(),
            status: EventStatus::Pending,
            stream: stream.map(Into::into),
            created_at: CreatedAt::from_unix_nanos(0),
            received_at_ms: 0,
            attempts: 0,
            due_at_ms: 0,
            last_error: None,
            force: false,
            headers: Vec::new(),
            body: Vec::new(),
            expires_at_ms: 0,
            lease: 0,
            body_bytes: 0,
            timeline: Vec::new(),
            replay: None,
        }
    }

    fn events(source: &str, n: usize) -> Vec<InboxEvent> {
        (0..n)
            .map(|i| ev(source, &format!("{source}{i}"), None))
            .collect()
    }

    fn ids(v: &[InboxEvent]) -> Vec<&str> {
        v.iter().map(|e| e.event_id.as_str()).collect()
    }

    fn pause(_: u32) -> Millis {
        1_000
    }

    #[test]
    fn free_slots_are_shared_round_robin_so_a_backlog_cannot_crowd_out_a_source() {
        let mut s = Schedule::new(4, [("big".into(), 16, 5), ("small".into(), 16, 5)]);
        let (picked, left) = s.pick(vec![
            ("big".into(), events("big", 16)),
            ("small".into(), events("small", 2)),
        ]);
        assert_eq!(ids(&picked), ["big0", "small0", "big1", "small1"]);
        assert!(left);
        assert_eq!(s.free(), 0);
        assert!(
            s.wants(0).reads.is_empty(),
            "no global slot left: nothing is read"
        );
    }

    #[test]
    fn each_source_stops_at_its_own_limit_while_others_go_on() {
        let mut s = Schedule::new(256, [("hung".into(), 2, 5), ("ok".into(), 16, 5)]);
        let (picked, _) = s.pick(vec![
            ("hung".into(), events("hung", 10)),
            ("ok".into(), events("ok", 3)),
        ]);
        assert_eq!(picked.iter().filter(|e| e.source == "hung").count(), 2);
        assert_eq!(picked.iter().filter(|e| e.source == "ok").count(), 3);
        // 13 free slots, read past the 3 it holds.
        assert_eq!(
            s.wants(0).reads,
            [("ok".to_owned(), 16)],
            "a full source reads nothing"
        );
    }

    #[test]
    fn a_stream_in_flight_is_skipped_but_other_streams_of_its_source_start() {
        let mut s = Schedule::new(8, [("a".into(), 8, 5)]);
        let (first, _) = s.pick(vec![("a".into(), vec![ev("a", "1", Some("r1"))])]);
        assert_eq!(ids(&first), ["1"]);
        let (next, _) = s.pick(vec![(
            "a".into(),
            vec![ev("a", "2", Some("r1")), ev("a", "3", Some("r2"))],
        )]);
        assert_eq!(ids(&next), ["3"]);
        s.finish("a", "1", Some("r1"), Reached::Success, 0, pause);
        let (again, _) = s.pick(vec![("a".into(), vec![ev("a", "2", Some("r1"))])]);
        assert_eq!(ids(&again), ["2"]);
    }

    #[test]
    fn a_paused_source_reads_nothing_until_its_pause_ends_then_one_probe() {
        let mut s = Schedule::new(8, [("a".into(), 8, 2)]);
        let (p, _) = s.pick(vec![("a".into(), events("a", 2))]);
        assert_eq!(p.len(), 2);
        assert_eq!(
            s.finish("a", "a0", None, Reached::Failure, 100, pause),
            None
        );
        assert_eq!(
            s.finish("a", "a1", None, Reached::Failure, 100, pause),
            Some(Transition::Paused {
                failures: 2,
                until: 1_100
            })
        );
        let w = s.wants(500);
        assert!(w.reads.is_empty() && w.transitions.is_empty());
        assert_eq!(w.reopens_at, Some(1_100));
        let w = s.wants(1_100);
        assert_eq!(w.reads, [("a".to_owned(), 1)]);
        assert_eq!(w.transitions, [("a".to_owned(), Transition::Probing)]);
        let (p, _) = s.pick(vec![("a".into(), events("a", 5))]);
        assert_eq!(p.len(), 1, "one probe");
        assert!(
            s.wants(1_100).reads.is_empty(),
            "no second probe while one runs"
        );
        assert_eq!(
            s.finish("a", &p[0].event_id, None, Reached::Success, 1_200, pause),
            Some(Transition::Resumed)
        );
        assert_eq!(s.wants(1_200).reads, [("a".to_owned(), 8)]);
    }

    #[test]
    fn finishing_an_event_twice_frees_its_slot_once() {
        let mut s = Schedule::new(2, [("a".into(), 2, 5)]);
        s.pick(vec![("a".into(), events("a", 2))]);
        s.finish("a", "a0", None, Reached::Nothing, 0, pause);
        s.finish("a", "a0", None, Reached::Nothing, 0, pause);
        assert_eq!(s.in_flight(), 1);
        assert_eq!(s.free(), 1);
    }

    #[test]
    fn an_answered_delivery_frees_its_slot_and_holds_its_stream_until_recorded() {
        let mut s = Schedule::new(1, [("a".into(), 1, 5)]);
        let (first, _) = s.pick(vec![("a".into(), vec![ev("a", "1", Some("r1"))])]);
        assert_eq!(ids(&first), ["1"]);
        assert_eq!(s.free(), 0);
        s.answered("a", "1", Reached::Success, 0, pause);
        assert_eq!((s.in_flight(), s.free()), (0, 1));
        // The slot serves another stream at once; the same stream waits
        // until the outcome of "1" is recorded.
        let (next, _) = s.pick(vec![(
            "a".into(),
            vec![ev("a", "2", Some("r1")), ev("a", "3", Some("r2"))],
        )]);
        assert_eq!(ids(&next), ["3"]);
        s.answered("a", "3", Reached::Success, 0, pause);
        s.finish("a", "1", Some("r1"), Reached::Success, 0, pause);
        let (again, _) = s.pick(vec![("a".into(), vec![ev("a", "2", Some("r1"))])]);
        assert_eq!(ids(&again), ["2"]);
        // Finishing after answering counts the request once.
        s.finish("a", "3", Some("r2"), Reached::Success, 0, pause);
        assert_eq!(s.in_flight(), 1);
    }

    #[test]
    fn outcomes_waiting_to_be_recorded_are_bounded_per_slot() {
        let mut s = Schedule::new(64, [("a".into(), 2, 5)]);
        let mut n = 0;
        loop {
            let (picked, _) = s.pick(vec![(
                "a".into(),
                (n..n + 2)
                    .map(|i| ev("a", &format!("e{i}"), None))
                    .collect(),
            )]);
            if picked.is_empty() {
                break;
            }
            for e in &picked {
                s.answered("a", &e.event_id, Reached::Success, 0, pause);
            }
            n += 2;
            assert!(n <= 100, "no bound");
        }
        assert_eq!(n, 2 * SETTLING_PER_SLOT);
        assert!(s.wants(0).reads.is_empty());
        s.finish("a", "e0", None, Reached::Success, 0, pause);
        // One may start; the read goes past the 7 still held.
        assert_eq!(s.wants(0).reads, [("a".to_owned(), 8)]);
    }

    #[test]
    fn a_failure_answered_before_its_outcome_is_recorded_counts_once_for_the_circuit() {
        let mut s = Schedule::new(8, [("a".into(), 8, 1)]);
        s.pick(vec![("a".into(), events("a", 1))]);
        assert!(
            s.answered("a", "a0", Reached::Failure, 100, pause)
                .is_some()
        );
        assert!(
            s.finish("a", "a0", None, Reached::Failure, 100, pause)
                .is_none()
        );
        assert_eq!(s.view("a").unwrap().consecutive_failures, 1);
    }

    #[test]
    fn a_rate_limit_starts_empty_refills_up_to_its_burst_and_says_when_to_look_again() {
        let mut s = Schedule::new(8, [("a".into(), 8, 5)]);
        s.rate_limit("a", "2/s".parse().unwrap(), 3, 0);
        let w = s.wants(0);
        assert!(w.reads.is_empty());
        assert_eq!(w.reopens_at, Some(500));
        assert_eq!(s.wants(500).reads, [("a".to_owned(), 1)]);
        // Ten seconds later: the burst, not twenty.
        assert_eq!(s.wants(10_000).reads, [("a".to_owned(), 3)]);
        let (picked, left) = s.pick(vec![("a".into(), events("a", 5))]);
        assert_eq!((picked.len(), left), (3, true));
        let w = s.wants(10_000);
        assert!(w.reads.is_empty());
        assert_eq!(w.reopens_at, Some(10_500));
    }

    #[test]
    fn a_hold_stops_a_source_until_its_time_and_a_later_hold_wins() {
        let mut s = Schedule::new(8, [("a".into(), 8, 5), ("b".into(), 8, 5)]);
        s.hold("a", 5_000);
        s.hold("a", 3_000);
        let w = s.wants(1_000);
        assert_eq!(w.reads, [("b".to_owned(), 8)]);
        assert_eq!(w.reopens_at, Some(5_000));
        assert_eq!(s.view("a").unwrap().held_until, Some(5_000));
        assert_eq!(s.wants(5_000).reads.len(), 2);
        assert_eq!(s.view("a").unwrap().held_until, None);
    }

    fn lane(name: &str, limit: usize, pause_after: u32) -> LaneConfig {
        LaneConfig {
            name: name.into(),
            limit,
            pause_after,
            rate: None,
            new_destination: false,
            fleet: false,
        }
    }

    #[test]
    fn a_reload_keeps_a_remaining_lanes_breaker_and_deliveries_and_adds_new_lanes_fresh() {
        let mut s = Schedule::new(8, [("a".into(), 4, 1)]);
        s.pick(vec![("a".into(), events("a", 2))]);
        s.finish("a", "a0", None, Reached::Failure, 100, pause);
        assert!(matches!(s.view("a").unwrap().state, State::Open { .. }));
        s.reconfigure(vec![lane("a", 6, 3), lane("b", 2, 5)], 200);
        let a = s.view("a").unwrap();
        assert!(matches!(a.state, State::Open { .. }), "{a:?}");
        assert_eq!((a.in_flight, a.max_in_flight), (1, 6));
        let b = s.view("b").unwrap();
        assert_eq!((b.in_flight, b.state), (0, State::Closed));
        assert_eq!(s.wants(200).reads, [("b".to_owned(), 2)]);
        // A new destination: the old one's breaker is no news about it.
        s.reconfigure(
            vec![
                LaneConfig {
                    new_destination: true,
                    ..lane("a", 6, 3)
                },
                lane("b", 2, 5),
            ],
            300,
        );
        assert_eq!(s.view("a").unwrap().state, State::Closed);
        assert_eq!(s.view("a").unwrap().in_flight, 1);
    }

    #[test]
    fn a_lane_a_reload_removed_starts_nothing_and_goes_once_its_deliveries_finished() {
        let mut s = Schedule::new(2, [("a".into(), 2, 5), ("b".into(), 2, 5)]);
        let (picked, _) = s.pick(vec![("a".into(), events("a", 2))]);
        assert_eq!(picked.len(), 2);
        s.reconfigure(vec![lane("b", 2, 5)], 0);
        assert!(s.view("a").is_none(), "no longer configured");
        // Its deliveries still hold the global slots until they finish.
        assert_eq!(s.free(), 0);
        let (none, _) = s.pick(vec![("a".into(), events("a", 4))]);
        assert!(none.is_empty());
        s.finish("a", "a0", None, Reached::Success, 0, pause);
        s.finish("a", "a1", None, Reached::Success, 0, pause);
        assert_eq!((s.in_flight(), s.free()), (0, 2));
        assert_eq!(s.wants(0).reads, [("b".to_owned(), 2)]);
        assert_eq!(s.lanes.len(), 1, "the removed lane went");
        // Back by a later reload: a lane as new.
        s.reconfigure(vec![lane("a", 2, 5), lane("b", 2, 5)], 0);
        assert_eq!(s.view("a").unwrap().in_flight, 0);
    }

    #[test]
    fn a_reload_keeps_a_rate_limits_tokens_unless_the_rate_changed() {
        let rated = |rate: &str| LaneConfig {
            rate: Some((rate.parse().unwrap(), 3)),
            ..lane("a", 8, 5)
        };
        let mut s = Schedule::new(8, []);
        s.reconfigure(vec![rated("2/s")], 0);
        assert_eq!(s.wants(10_000).reads, [("a".to_owned(), 3)]);
        s.reconfigure(vec![rated("2/s")], 10_000);
        assert_eq!(s.wants(10_000).reads, [("a".to_owned(), 3)], "kept");
        s.reconfigure(vec![rated("1/s")], 10_000);
        let w = s.wants(10_000);
        assert!(w.reads.is_empty(), "a new rate starts empty");
        assert_eq!(w.reopens_at, Some(11_000));
        s.reconfigure(vec![lane("a", 8, 5)], 10_000);
        assert_eq!(s.wants(10_000).reads, [("a".to_owned(), 8)], "no limit");
    }
}
