//! Random gateway-inbox operations, clock moves and restarts against a plain
//! in-memory model of the inbox rules documented in `src/store/inbox.rs`,
//! `src/store/redb/inbox/` and (for the shared inbox in Redis, with the
//! `redis` feature) `src/store/redis/inbox/`. After every step the store
//! must hold exactly the model's events, its indexes must keep their
//! documented invariants, and its runnable events must be the model's.
//!
//! The two inboxes differ by design in a few rules ([`Rules`]); the model
//! follows the one under test.

#[cfg(feature = "redis")]
mod shared;

use std::collections::BTreeMap;

use async_trait::async_trait;
use dedupd::domain::{CreatedAt, Key, Namespace, ScopedKey};
use dedupd::store::Store;
use dedupd::store::inbox::{
    Attempt, EraseOutcome, EventKey, EventStatus, Inbox, InboxEvent, IngestOutcome, Leased,
    LeasedEvent, ListOrder, NewEvent, RedeliverOutcome, ReplayMark, Retention, Settle,
    SourceSummary, StoredJob, TIMELINE_ATTEMPTS,
};
use dedupd::store::redb::{InboxIndexes, RedbInbox, RedbOptions, RedbStore};
use proptest::prelude::*;
use tempfile::TempDir;

/// One source name is a prefix of the other, so range scans that stop at
/// the end of a source are tested.
const SOURCES: [&str; 2] = ["gh", "gh-x"];
/// The same for stream names.
const STREAMS: [&str; 3] = ["a", "ab", "b"];
/// Event ids per source: few, so duplicates happen.
const IDS: u8 = 6;
const T0: u64 = 1_800_000_000_000;
const RETENTION: Retention = Retention {
    delivered_ms: 1_500,
    dead_ms: 3_500,
};
/// Retention of applied events and stream heads (ordering state).
const ORDERING_MS: u64 = 6_000;
/// How long after its receipt a reaped event's id stays a duplicate: longer
/// than the delivered retention, shorter than the dead one, so some reaped
/// events leave a record and some do not.
const DEDUPE_MS: u64 = 4_000;

/// Where the inboxes differ by design: the model follows the rules of the
/// inbox under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rules {
    /// The data file's inbox (`RedbStore::inbox`): a stream's oldest pending
    /// event is runnable (its dispatcher keeps one event per stream in
    /// flight, in memory); the reaper (`Store::purge_expired`) deletes
    /// settled events, ordering records and dedupe records, and a reaped
    /// event leaves a dedupe record while its window lasts.
    DataFile,
    /// The shared inbox in Redis (`RedisInbox`), where instances lease from
    /// one inbox, so one event per stream in flight must be in the store:
    /// each stream has a turn holder, the one event of the stream that is
    /// runnable ([`Model::pass_turn`]). Its reaper (`purge_settled`) deletes
    /// settled events only, picking which ones when its limit cuts; the
    /// dedupe record is written at ingest (until received + the window),
    /// and Redis expires it and the ordering records by itself.
    Shared,
}

#[derive(Debug, Clone)]
enum How {
    Delivered { attempted: bool },
    Stale,
    Retry { after: u64, attempted: bool },
    Dead,
}

#[derive(Debug, Clone)]
enum Op {
    /// A new event; `created` in whole seconds around the epoch (some
    /// before 1970), independent of the clock, so older events arrive late.
    Ingest {
        source: u8,
        id: u8,
        stream: Option<u8>,
        created: u8,
    },
    /// Leases the due events picked by `mask` (bit i: the i-th due event),
    /// plus `extra` (any event, runnable or not), until now + `hold`.
    Lease {
        mask: u16,
        extra: Option<(u8, u8)>,
        hold: u64,
        stale_check: bool,
    },
    /// Settles one of the leases handed out so far under its generation
    /// shifted by `skew` (so sometimes a generation that must be ignored).
    /// With `sent` (a status, or none for no answer), the turn sent a
    /// request: `settle_attempt`, which adds it to the event's timeline.
    Settle {
        pick: Pick,
        skew: i8,
        how: How,
        sent: Option<Option<u16>>,
    },
    /// `settle_delivered`: moves the stream head, then settles; with
    /// `sent`, the attempt joins the timeline.
    Delivered {
        pick: Pick,
        skew: i8,
        sent: bool,
    },
    Redeliver {
        target: Target,
    },
    /// A bulk job's replay: job `job` of [`JOBS`].
    Replay {
        target: Target,
        job: u8,
    },
    /// An erasure, the row kept for `retention` ms.
    Erase {
        target: Target,
        retention: u64,
    },
    /// A write of bulk job `id`'s record (of [`JOBS`]).
    Job {
        id: u8,
        act: JobAct,
    },
    /// `due_events` with these limits and a byte budget (bodies here are
    /// 16 to 20 bytes: a small one stops the read early).
    Due {
        limits: [usize; 2],
        max_bytes: u64,
    },
    List {
        source: u8,
        status: u8,
        page: usize,
        newest: bool,
    },
    /// The reaper, with a limit small enough at times to stop it early.
    PurgeExpired {
        limit: u64,
    },
    PurgePending {
        both: bool,
        source: u8,
        back: u64,
        limit: u64,
    },
    Advance(u64),
    Restart,
}

/// The turn a settle ends (index modulo the number of candidates).
#[derive(Debug, Clone)]
enum Pick {
    /// A lease handed out that is still current (its event pending under
    /// that generation); else as `Pending`.
    Current(usize),
    /// A pending event under its current generation, leased or not (a turn
    /// whose lease ran out, or generation 0); else as `Any`.
    Pending(usize),
    /// Any lease handed out so far, however old.
    Any(usize),
}

/// An event to redeliver, replay or erase.
#[derive(Debug, Clone)]
enum Target {
    /// One of the settled (or erased) events (index modulo their number),
    /// if any.
    Settled(usize),
    /// One of the events, any status (index modulo their number), if any.
    Stored(usize),
    /// Any id, stored or not.
    Id(u8, u8),
}

/// What [`Op::Job`] does to a job's record.
#[derive(Debug, Clone, Copy)]
enum JobAct {
    Put,
    Cancel,
    Delete,
}

/// Bulk jobs' ids: two, so a job replays an event twice at times, and
/// another job replays it after.
const JOBS: [&str; 2] = ["job_a", "job_b"];

fn pick() -> impl Strategy<Value = Pick> {
    prop_oneof![
        3 => any::<usize>().prop_map(Pick::Current),
        1 => any::<usize>().prop_map(Pick::Pending),
        1 => any::<usize>().prop_map(Pick::Any),
    ]
}

fn how() -> impl Strategy<Value = How> {
    prop_oneof![
        3 => any::<bool>().prop_map(|attempted| How::Delivered { attempted }),
        1 => Just(How::Stale),
        3 => (0u64..3_000, any::<bool>())
            .prop_map(|(after, attempted)| How::Retry { after, attempted }),
        1 => Just(How::Dead),
    ]
}

fn skew() -> impl Strategy<Value = i8> {
    prop_oneof![6 => Just(0i8), 1 => Just(-1i8), 1 => Just(1i8)]
}

fn op() -> impl Strategy<Value = Op> {
    let source = 0u8..2;
    let id = 0u8..IDS;
    let stream = prop_oneof![1 => Just(None), 3 => (0u8..3).prop_map(Some)];
    prop_oneof![
        8 => (source.clone(), id.clone(), stream, 0u8..6)
            .prop_map(|(source, id, stream, created)| Op::Ingest { source, id, stream, created }),
        6 => (
            any::<u16>(),
            proptest::option::weighted(0.3, (source.clone(), id.clone())),
            0u64..3_000,
            proptest::bool::weighted(0.75),
        )
            .prop_map(|(mask, extra, hold, stale_check)| Op::Lease { mask, extra, hold, stale_check }),
        6 => (
            pick(),
            skew(),
            how(),
            proptest::option::weighted(0.6, proptest::option::of(200u16..600)),
        )
            .prop_map(|(pick, skew, how, sent)| Op::Settle { pick, skew, how, sent }),
        5 => (pick(), skew(), proptest::bool::weighted(0.8))
            .prop_map(|(pick, skew, sent)| Op::Delivered { pick, skew, sent }),
        3 => prop_oneof![
            3 => any::<usize>().prop_map(Target::Settled),
            1 => (source.clone(), id.clone()).prop_map(|(s, i)| Target::Id(s, i)),
        ]
        .prop_map(|target| Op::Redeliver { target }),
        3 => (
            prop_oneof![
                4 => any::<usize>().prop_map(Target::Settled),
                1 => any::<usize>().prop_map(Target::Stored),
                1 => (source.clone(), id.clone()).prop_map(|(s, i)| Target::Id(s, i)),
            ],
            0u8..2,
        )
            .prop_map(|(target, job)| Op::Replay { target, job }),
        2 => (
            prop_oneof![
                3 => any::<usize>().prop_map(Target::Stored),
                1 => any::<usize>().prop_map(Target::Settled),
                1 => (source.clone(), id.clone()).prop_map(|(s, i)| Target::Id(s, i)),
            ],
            prop_oneof![1 => Just(0u64), 4 => 1u64..4_000],
        )
            .prop_map(|(target, retention)| Op::Erase { target, retention }),
        1 => (
            0u8..2,
            prop_oneof![
                Just(JobAct::Put),
                Just(JobAct::Cancel),
                Just(JobAct::Delete)
            ],
        )
            .prop_map(|(id, act)| Op::Job { id, act }),
        1 => (0usize..4, 0usize..4, prop_oneof![Just(u64::MAX), 0u64..64])
            .prop_map(|(a, b, max_bytes)| Op::Due { limits: [a, b], max_bytes }),
        1 => (source.clone(), 0u8..5, 1usize..4, any::<bool>())
            .prop_map(|(source, status, page, newest)| Op::List { source, status, page, newest }),
        2 => prop_oneof![2 => Just(10_000u64), 1 => 1u64..4]
            .prop_map(|limit| Op::PurgeExpired { limit }),
        1 => (any::<bool>(), source, 0u64..4_000, 1u64..5)
            .prop_map(|(both, source, back, limit)| Op::PurgePending { both, source, back, limit }),
        5 => prop_oneof![1 => Just(0u64), 4 => 1u64..1_500].prop_map(Op::Advance),
        1 => Just(Op::Restart),
    ]
}

/// The attempt a turn at `step` sent (each step's is told apart by its
/// number and error).
fn attempt(step: usize, now: u64, status: Option<u16>) -> Attempt {
    let ok = status.is_some_and(|s| (200..300).contains(&s));
    Attempt {
        attempt: u32::try_from(step).unwrap_or(u32::MAX),
        at_ms: now,
        status,
        latency_us: 1_000 + step as u64,
        error: (!ok).then(|| format!("failed at step {step}")),
    }
}

/// A lease handed out: what the dispatcher keeps for its turn.
#[derive(Debug, Clone)]
struct LeaseRec {
    source: String,
    id: String,
    generation: u64,
    stream: Option<String>,
    created_at: CreatedAt,
}

impl LeaseRec {
    fn key(&self) -> EventKey {
        EventKey::new(&self.source, &self.id, self.stream.as_deref())
    }
}

type Id = (String, String);

#[derive(Debug)]
struct Model {
    rules: Rules,
    /// Each event id always comes with the same stream ([`fixed_stream`]):
    /// with several buckets the shared inbox places (and dedupes) an event
    /// by its stream, so an id posted again on another stream would be
    /// another event there.
    fixed_streams: bool,
    now: u64,
    events: BTreeMap<Id, InboxEvent>,
    /// Ordering state of `settle_delivered`: (source, stream) → (created_at, expiry).
    heads: BTreeMap<Id, (CreatedAt, u64)>,
    /// (source, event id) → expiry of its applied (or stale) record.
    applied: BTreeMap<Id, u64>,
    /// (source, event id) → until when its id is a duplicate once the
    /// event is gone: written when the event is reaped (data file) or
    /// ingested (shared inbox).
    dedupe: BTreeMap<Id, u64>,
    leases: Vec<LeaseRec>,
    /// Shared rules: (source, stream) → the event whose turn it is.
    turns: BTreeMap<Id, String>,
    /// (source, event id) of a pending event → the `until` of its last
    /// lease; a settle that is not ignored clears it.
    leased_until: BTreeMap<Id, u64>,
    /// Bulk jobs: id → (record, cancelled).
    jobs: BTreeMap<String, (Vec<u8>, bool)>,
}

fn queue_key(e: &InboxEvent) -> (i128, u64, &str) {
    (
        e.created_at.unix_nanos(),
        e.received_at_ms,
        e.event_id.as_str(),
    )
}

/// Whether a pending event is runnable in the data file: without a stream,
/// or first of its stream's pending events in (created_at, received_at, id)
/// order.
fn first_in_stream(events: &BTreeMap<Id, InboxEvent>, e: &InboxEvent) -> bool {
    if e.status != EventStatus::Pending {
        return false;
    }
    let Some(stream) = &e.stream else {
        return true;
    };
    !events.values().any(|o| {
        o.source == e.source
            && o.status == EventStatus::Pending
            && o.stream.as_ref() == Some(stream)
            && queue_key(o) < queue_key(e)
    })
}

/// The index entries `rows` must have, per the invariants of
/// `src/store/redb/inbox.rs`; each list sorted.
fn derived(rows: &[InboxEvent]) -> InboxIndexes {
    let map: BTreeMap<Id, InboxEvent> = rows
        .iter()
        .map(|e| ((e.source.clone(), e.event_id.clone()), e.clone()))
        .collect();
    let mut out = InboxIndexes {
        rows: map.values().cloned().collect(),
        ..InboxIndexes::default()
    };
    for e in map.values() {
        let (s, id) = (e.source.clone(), e.event_id.clone());
        out.status
            .push((s.clone(), e.status.to_byte(), e.received_at_ms, id.clone()));
        if e.status == EventStatus::Pending {
            if let Some(stream) = &e.stream {
                out.queue.push((
                    s.clone(),
                    stream.clone(),
                    e.created_at.unix_nanos(),
                    e.received_at_ms,
                    id.clone(),
                ));
            }
            if first_in_stream(&map, e) {
                out.runnable.push((s, e.due_at_ms, id));
            }
        } else {
            out.expiry.push((e.expires_at_ms, s, id));
        }
    }
    sort_indexes(&mut out);
    out
}

fn sort_indexes(i: &mut InboxIndexes) {
    i.rows
        .sort_by(|a, b| (&a.source, &a.event_id).cmp(&(&b.source, &b.event_id)));
    i.runnable.sort();
    i.queue.sort();
    i.status.sort();
    i.expiry.sort();
    i.dedupe.sort();
    i.dedupe_expiry.sort();
}

impl Model {
    fn new(rules: Rules, fixed_streams: bool) -> Self {
        Self {
            rules,
            fixed_streams,
            now: T0,
            events: BTreeMap::new(),
            heads: BTreeMap::new(),
            applied: BTreeMap::new(),
            dedupe: BTreeMap::new(),
            leases: Vec::new(),
            turns: BTreeMap::new(),
            leased_until: BTreeMap::new(),
            jobs: BTreeMap::new(),
        }
    }

    /// The key of an event: its stream as the model holds it (none for
    /// an event it does not hold, unless ids have fixed streams).
    fn key(&self, source: &str, id: &str) -> EventKey {
        let stream = match self.get(source, id) {
            Some(e) => e.stream.clone(),
            None if self.fixed_streams => id
                .strip_prefix('e')
                .and_then(|n| n.parse().ok())
                .and_then(fixed_stream)
                .map(|st| STREAMS[usize::from(st)].to_owned()),
            None => None,
        };
        EventKey::new(source, id, stream.as_deref())
    }

    fn get(&self, source: &str, id: &str) -> Option<&InboxEvent> {
        self.events.get(&(source.to_owned(), id.to_owned()))
    }

    fn get_mut(&mut self, source: &str, id: &str) -> Option<&mut InboxEvent> {
        self.events.get_mut(&(source.to_owned(), id.to_owned()))
    }

    /// Whether a pending event may be leased: one without a stream always;
    /// one with a stream when it is the first of its stream (data file) or
    /// holds its stream's turn (shared inbox).
    fn runnable(&self, e: &InboxEvent) -> bool {
        if e.status != EventStatus::Pending {
            return false;
        }
        let Some(stream) = &e.stream else {
            return true;
        };
        match self.rules {
            Rules::DataFile => first_in_stream(&self.events, e),
            Rules::Shared => {
                self.turns.get(&(e.source.clone(), stream.clone())) == Some(&e.event_id)
            }
        }
    }

    /// Shared rules: a write that touches `stream` decides whose turn it
    /// is. The holder keeps the turn while it is pending and its lease
    /// lives; otherwise the stream's oldest pending event in
    /// (created_at, received_at, id) order takes it, or nobody. Time
    /// passing alone moves no turn.
    fn pass_turn(&mut self, source: &str, stream: &str) {
        if self.rules != Rules::Shared {
            return;
        }
        let key = (source.to_owned(), stream.to_owned());
        if let Some(holder) = self.turns.get(&key) {
            let id = (source.to_owned(), holder.clone());
            let pending = self
                .events
                .get(&id)
                .is_some_and(|e| e.status == EventStatus::Pending);
            let leased = self
                .leased_until
                .get(&id)
                .is_some_and(|until| *until > self.now);
            if pending && leased {
                return;
            }
        }
        let first = self
            .events
            .values()
            .filter(|o| {
                o.source == source
                    && o.status == EventStatus::Pending
                    && o.stream.as_deref() == Some(stream)
            })
            .min_by(|a, b| queue_key(a).cmp(&queue_key(b)))
            .map(|e| e.event_id.clone());
        match first {
            Some(id) => self.turns.insert(key, id),
            None => self.turns.remove(&key),
        };
    }

    /// [`Model::pass_turn`] for an event's stream, if it has one.
    fn pass_turn_of(&mut self, source: &str, stream: Option<&str>) {
        if let Some(stream) = stream {
            self.pass_turn(source, stream);
        }
    }

    /// An insert: the answer, and the event stored when accepted.
    fn ingest(&mut self, new: &NewEvent) -> IngestOutcome {
        let now = self.now;
        let key = (new.source.clone(), new.event_id.clone());
        let remembered = self.dedupe.get(&key).is_some_and(|until| *until > now);
        if self.events.contains_key(&key) || remembered {
            return IngestOutcome::Duplicate;
        }
        match self.rules {
            // A record past its window goes with the insert.
            Rules::DataFile => self.dedupe.remove(&key),
            Rules::Shared => self.dedupe.insert(key.clone(), now + DEDUPE_MS),
        };
        self.leased_until.remove(&key);
        self.events.insert(
            key,
            InboxEvent {
                source: new.source.clone(),
                event_id: new.event_id.clone(),
                status: EventStatus::Pending,
                stream: new.stream.clone(),
                created_at: new.created_at,
                received_at_ms: new.received_at_ms,
                attempts: 0,
                due_at_ms: now,
                last_error: None,
                force: false,
                headers: new.headers.clone(),
                body: new.body.clone(),
                expires_at_ms: 0,
                lease: 0,
                body_bytes: new.body.len(),
                timeline: Vec::new(),
                replay: None,
            },
        );
        self.pass_turn_of(&new.source, new.stream.as_deref());
        IngestOutcome::Accepted
    }

    /// Deletes up to `limit` pending events of `sources` received before
    /// `before`, oldest first, source by source: how many went.
    fn purge_pending(&mut self, sources: &[String], before: u64, limit: u64) -> u64 {
        let mut left = limit;
        for source in sources {
            let mut gone: Vec<(u64, String)> = self
                .events
                .values()
                .filter(|e| {
                    &e.source == source
                        && e.status == EventStatus::Pending
                        && e.received_at_ms < before
                })
                .map(|e| (e.received_at_ms, e.event_id.clone()))
                .collect();
            gone.sort();
            gone.truncate(usize::try_from(left).unwrap());
            left -= gone.len() as u64;
            for (_, id) in gone {
                let key = (source.clone(), id);
                let e = self.events.remove(&key).expect("present");
                self.leased_until.remove(&key);
                self.pass_turn_of(source, e.stream.as_deref());
            }
        }
        limit - left
    }

    /// Settled events whose retention ended: what a reaper deletes.
    fn expired_settled(&self) -> Vec<Id> {
        self.events
            .iter()
            .filter(|(_, e)| e.status != EventStatus::Pending && e.expires_at_ms <= self.now)
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// A source's runnable events in due order.
    fn runnable_of(&self, source: &str) -> Vec<InboxEvent> {
        let mut out: Vec<InboxEvent> = self
            .events
            .values()
            .filter(|e| e.source == source && self.runnable(e))
            .cloned()
            .collect();
        out.sort_by(|a, b| (a.due_at_ms, &a.event_id).cmp(&(b.due_at_ms, &b.event_id)));
        out
    }

    /// What `due_events` must answer for one source: (events, next).
    fn due(&self, source: &str, limit: usize) -> (Vec<InboxEvent>, Option<u64>) {
        self.due_within(source, limit, u64::MAX)
    }

    /// As [`Model::due`], stopping before the event whose body would take
    /// the bodies past `max_bytes` (the first always comes).
    fn due_within(
        &self,
        source: &str,
        limit: usize,
        max_bytes: u64,
    ) -> (Vec<InboxEvent>, Option<u64>) {
        let all = self.runnable_of(source);
        let mut bytes = 0u64;
        let mut events = Vec::new();
        for e in all.iter().take_while(|e| e.due_at_ms <= self.now) {
            let body = e.body.len() as u64;
            if events.len() >= limit || (!events.is_empty() && bytes + body > max_bytes) {
                break;
            }
            bytes += body;
            events.push(InboxEvent {
                timeline: Vec::new(),
                ..e.clone()
            });
        }
        let next = all.get(events.len()).map(|e| e.due_at_ms);
        (events, next)
    }

    fn live_head(&self, source: &str, stream: &str) -> Option<CreatedAt> {
        self.heads
            .get(&(source.to_owned(), stream.to_owned()))
            .filter(|(_, exp)| *exp > self.now)
            .map(|(c, _)| *c)
    }

    /// A request was sent: it joins the event's timeline (whatever the
    /// settle then does), the oldest beyond the bound dropping off.
    fn record_attempt(&mut self, source: &str, id: &str, attempt: &Attempt) {
        if let Some(e) = self.get_mut(source, id) {
            e.timeline.push(attempt.clone());
            let drop = e.timeline.len().saturating_sub(TIMELINE_ATTEMPTS);
            e.timeline.drain(..drop);
        }
    }

    fn settle(&mut self, source: &str, id: &str, generation: u64, settle: &Settle) {
        let now = self.now;
        let Some(e) = self.get_mut(source, id) else {
            return;
        };
        if e.status != EventStatus::Pending || e.lease != generation {
            return;
        }
        let terminal = |e: &mut InboxEvent, status: EventStatus, keep_ms: u64| {
            e.status = status;
            e.due_at_ms = now;
            e.expires_at_ms = now + keep_ms;
        };
        match settle {
            Settle::Delivered { attempted } => {
                e.attempts += u32::from(*attempted);
                e.last_error = None;
                terminal(e, EventStatus::Delivered, RETENTION.delivered_ms);
            }
            Settle::Stale => terminal(e, EventStatus::Stale, RETENTION.delivered_ms),
            Settle::Retry {
                retry_at,
                error,
                attempted,
            } => {
                e.attempts += u32::from(*attempted);
                if !error.is_empty() {
                    e.last_error = Some(error.clone());
                }
                e.due_at_ms = *retry_at;
            }
            Settle::Dead { error } => {
                e.attempts += 1;
                e.last_error = Some(error.clone());
                terminal(e, EventStatus::Dead, RETENTION.dead_ms);
            }
        }
        let stream = e.stream.clone();
        self.leased_until
            .remove(&(source.to_owned(), id.to_owned()));
        self.pass_turn_of(source, stream.as_deref());
    }

    /// The ordering rule of `apply`, as `settle_delivered` runs it.
    fn apply(&mut self, source: &str, stream: &str, id: &str, created_at: CreatedAt) {
        let now = self.now;
        let key = (source.to_owned(), id.to_owned());
        if self.applied.get(&key).is_some_and(|exp| *exp > now) {
            return;
        }
        self.applied.insert(key, now + ORDERING_MS);
        if self
            .live_head(source, stream)
            .is_some_and(|h| created_at < h)
        {
            return;
        }
        self.heads.insert(
            (source.to_owned(), stream.to_owned()),
            (created_at, now + ORDERING_MS),
        );
    }

    fn lease(&mut self, events: &[(String, String, u64)], stale_check: bool) -> Leased {
        let mut out = Leased::default();
        for (source, id, until) in events {
            let Some(e) = self.get(source, id) else {
                continue;
            };
            // Only what is due: a dispatcher's read may predate a retry.
            if !self.runnable(e) || e.due_at_ms > self.now {
                continue;
            }
            if self.rules == Rules::Shared
                && let Some(stream) = e.stream.clone()
            {
                // A lease that ran out hands the turn on; this event is
                // leased only if the turn is (still) its own.
                self.pass_turn(source, &stream);
                if self.turns.get(&(source.clone(), stream)) != Some(id) {
                    continue;
                }
            }
            let e = self.get(source, id).expect("present");
            let behind = stale_check
                && !e.force
                && e.stream
                    .as_deref()
                    .and_then(|st| self.live_head(source, st))
                    .is_some_and(|h| e.created_at < h);
            self.leased_until
                .insert((source.clone(), id.clone()), *until);
            let e = self.get_mut(source, id).expect("present");
            e.due_at_ms = *until;
            e.lease += 1;
            let rec = LeaseRec {
                source: source.clone(),
                id: id.clone(),
                generation: e.lease,
                stream: e.stream.clone(),
                created_at: e.created_at,
            };
            if behind {
                self.settle(source, id, rec.generation, &Settle::Stale);
                out.stale.push((source.clone(), id.clone()));
            } else {
                out.leased.push(LeasedEvent {
                    source: source.clone(),
                    event_id: id.clone(),
                    lease: rec.generation,
                    attempts: e.attempts,
                    force: e.force,
                    replay: e.replay.clone(),
                });
                self.leases.push(rec);
            }
        }
        out
    }

    fn redeliver(&mut self, source: &str, id: &str) -> RedeliverOutcome {
        let now = self.now;
        let Some(e) = self.get_mut(source, id) else {
            return RedeliverOutcome::NotFound;
        };
        match e.status {
            EventStatus::Dead | EventStatus::Stale => {
                e.force = e.status == EventStatus::Stale;
                e.status = EventStatus::Pending;
                e.attempts = 0;
                e.replay = None;
                e.due_at_ms = now;
                e.lease += 1;
                e.expires_at_ms = 0;
                let stream = e.stream.clone();
                self.leased_until
                    .remove(&(source.to_owned(), id.to_owned()));
                self.pass_turn_of(source, stream.as_deref());
                RedeliverOutcome::Requeued
            }
            other => RedeliverOutcome::NotRedeliverable(other),
        }
    }

    /// A bulk job's replay: a delivered, stale or dead event back to
    /// pending, its attempts kept and marked with the job, unless the job
    /// replayed it already.
    fn replay(&mut self, source: &str, id: &str, job: &str) -> RedeliverOutcome {
        let now = self.now;
        let Some(e) = self.get_mut(source, id) else {
            return RedeliverOutcome::NotFound;
        };
        let replayed = e.replay.as_ref().is_some_and(|m| m.job == job);
        match e.status {
            EventStatus::Delivered | EventStatus::Stale | EventStatus::Dead if !replayed => {
                e.force = e.status != EventStatus::Dead;
                e.status = EventStatus::Pending;
                e.replay = Some(ReplayMark {
                    job: job.to_owned(),
                    base_attempts: e.attempts,
                });
                e.due_at_ms = now;
                e.lease += 1;
                e.expires_at_ms = 0;
                let stream = e.stream.clone();
                self.leased_until
                    .remove(&(source.to_owned(), id.to_owned()));
                self.pass_turn_of(source, stream.as_deref());
                RedeliverOutcome::Requeued
            }
            other => RedeliverOutcome::NotRedeliverable(other),
        }
    }

    /// An erasure: body and headers gone, status erased until `now +
    /// retention`; a pending event leaves its stream (whose turn passes
    /// on), its lease superseded.
    fn erase(&mut self, source: &str, id: &str, retention: u64) -> EraseOutcome {
        let now = self.now;
        let Some(e) = self.get_mut(source, id) else {
            return EraseOutcome::NotFound;
        };
        if e.status == EventStatus::Erased {
            return EraseOutcome::AlreadyErased;
        }
        let was_pending = e.status == EventStatus::Pending;
        e.status = EventStatus::Erased;
        e.headers = Vec::new();
        e.body = Vec::new();
        e.body_bytes = 0;
        e.force = false;
        e.replay = None;
        e.lease += 1;
        e.due_at_ms = now;
        e.expires_at_ms = now + retention;
        let stream = e.stream.clone();
        self.leased_until
            .remove(&(source.to_owned(), id.to_owned()));
        if was_pending {
            self.pass_turn_of(source, stream.as_deref());
        }
        EraseOutcome::Erased
    }

    /// A write of a bulk job's record; whether the job was there (what
    /// `cancel_job` answers).
    fn job(&mut self, id: &str, act: JobAct, record: Vec<u8>) -> bool {
        match act {
            JobAct::Put => {
                let cancelled = self.jobs.get(id).is_some_and(|(_, c)| *c);
                self.jobs.insert(id.to_owned(), (record, cancelled));
                true
            }
            JobAct::Cancel => match self.jobs.get_mut(id) {
                Some((_, c)) => {
                    *c = true;
                    true
                }
                None => false,
            },
            JobAct::Delete => self.jobs.remove(id).is_some(),
        }
    }

    /// The reaper: up to `limit` expired records, applied events first,
    /// then heads, then settled inbox events (each received less than
    /// `DEDUPE_MS` ago leaving a dedupe record), then dedupe records, each
    /// in (expiry, key) order; the report as (claims, events, heads, inbox,
    /// dedupe, more).
    fn purge_expired(&mut self, limit: u64) -> (u64, u64, u64, u64, u64, bool) {
        let now = self.now;
        let mut budget = usize::try_from(limit).unwrap();
        // The ordering tables' keys as stored.
        let mut applied: Vec<(u64, String, Id)> = self
            .applied
            .iter()
            .filter(|(_, exp)| **exp <= now)
            .map(|(k, exp)| {
                (
                    *exp,
                    gateway_key(&k.0, &k.1, "event_id").as_str().to_owned(),
                    k.clone(),
                )
            })
            .collect();
        applied.sort();
        applied.truncate(budget);
        budget -= applied.len();
        for (_, _, k) in &applied {
            self.applied.remove(k);
        }
        let mut heads: Vec<(u64, String, Id)> = self
            .heads
            .iter()
            .filter(|(_, (_, exp))| *exp <= now)
            .map(|(k, (_, exp))| {
                (
                    *exp,
                    gateway_key(&k.0, &k.1, "stream").as_str().to_owned(),
                    k.clone(),
                )
            })
            .collect();
        heads.sort();
        heads.truncate(budget);
        budget -= heads.len();
        for (_, _, k) in &heads {
            self.heads.remove(k);
        }
        let mut inbox: Vec<(u64, Id)> = self
            .expired_settled()
            .into_iter()
            .map(|k| (self.events[&k].expires_at_ms, k))
            .collect();
        inbox.sort();
        inbox.truncate(budget);
        budget -= inbox.len();
        for (_, k) in &inbox {
            let e = self.events.remove(k).expect("present");
            if e.received_at_ms + DEDUPE_MS > now {
                self.dedupe.insert(k.clone(), e.received_at_ms + DEDUPE_MS);
            }
        }
        let mut dedupe: Vec<(u64, Id)> = self
            .dedupe
            .iter()
            .filter(|(_, until)| **until <= now)
            .map(|(k, until)| (*until, k.clone()))
            .collect();
        dedupe.sort();
        dedupe.truncate(budget);
        for (_, k) in &dedupe {
            self.dedupe.remove(k);
        }
        let more = self.applied.values().any(|exp| *exp <= now)
            || self.heads.values().any(|(_, exp)| *exp <= now)
            || self.dedupe.values().any(|until| *until <= now)
            || self
                .events
                .values()
                .any(|e| e.status != EventStatus::Pending && e.expires_at_ms <= now);
        (
            0,
            applied.len() as u64,
            heads.len() as u64,
            inbox.len() as u64,
            dedupe.len() as u64,
            more,
        )
    }

    /// (source, pending count) of every source with events.
    fn sources(&self) -> Vec<(String, u64)> {
        let mut out: BTreeMap<String, u64> = BTreeMap::new();
        for e in self.events.values() {
            *out.entry(e.source.clone()).or_default() +=
                u64::from(e.status == EventStatus::Pending);
        }
        out.into_iter().collect()
    }
}

/// The stream of event id `id` when ids have fixed streams: two ids each
/// in streams a and ab, one in b, one without. For a source with four
/// buckets this puts events in all four (FNV-1a of "a", "b", "ab" and
/// "e5", the bucket basis, is 0, 1, 2 and 3 modulo 4).
fn fixed_stream(id: u8) -> Option<u8> {
    (id != 5).then_some(id % 3)
}

fn event_id(id: u8) -> String {
    format!("e{id}")
}

fn created(c: u8) -> CreatedAt {
    CreatedAt::from_unix_nanos((i128::from(c) - 2) * 1_000_000_000)
}

fn status_of(n: u8) -> EventStatus {
    match n {
        0 => EventStatus::Pending,
        1 => EventStatus::Delivered,
        2 => EventStatus::Stale,
        3 => EventStatus::Dead,
        _ => EventStatus::Erased,
    }
}

/// Due events as compared: `due_events` may leave the replay mark out (the
/// lease hands it to the turn), so neither side's is.
fn unmarked(events: Vec<InboxEvent>) -> Vec<InboxEvent> {
    events
        .into_iter()
        .map(|e| InboxEvent { replay: None, ..e })
        .collect()
}

fn gateway_key(source: &str, key: &str, field: &'static str) -> ScopedKey {
    ScopedKey::new(
        &Namespace::Gateway(source.to_owned()),
        &Key::parse(key, field).unwrap(),
    )
}

/// An inbox under test, with what differs between backends: how it
/// restarts, how its reaper is run and what it checks of its own state.
#[async_trait]
trait Subject: Send + Sync {
    fn inbox(&self) -> &dyn Inbox;
    /// Closes the inbox and opens it again on the same data.
    async fn restart(&mut self);
    /// Runs the reaper (at most `limit` deletions) and checks its report
    /// against the model, which it brings along.
    async fn reap(&mut self, m: &mut Model, limit: u64, ctx: &str);
    /// Checks what only this backend shows: its indexes against their
    /// documented invariants, and records the inbox API does not show
    /// against the model.
    async fn check_store(&self, m: &Model, ctx: &str);
    async fn close(self: Box<Self>);
}

/// The data file's inbox, in a temp dir.
struct DataFile {
    _dir: TempDir,
    opts: RedbOptions,
    store: RedbStore,
    inbox: RedbInbox,
}

impl DataFile {
    fn open() -> Self {
        let dir = TempDir::new().unwrap();
        let opts = RedbOptions {
            cache_bytes: 1024 * 1024,
            dedupe_window: std::time::Duration::from_millis(DEDUPE_MS),
            ..RedbOptions::new(dir.path().join("inbox.redb"))
        };
        let store = RedbStore::open(&opts).unwrap();
        Self {
            _dir: dir,
            opts,
            inbox: store.inbox(),
            store,
        }
    }
}

#[async_trait]
impl Subject for DataFile {
    fn inbox(&self) -> &dyn Inbox {
        &self.inbox
    }

    async fn restart(&mut self) {
        self.store.close().await;
        self.store = RedbStore::open(&self.opts).unwrap();
        self.inbox = self.store.inbox();
    }

    async fn reap(&mut self, m: &mut Model, limit: u64, ctx: &str) {
        let want = m.purge_expired(limit);
        let got = self.store.purge_expired(m.now, limit).await.unwrap();
        assert_eq!(
            (
                got.claims, got.events, got.heads, got.inbox, got.dedupe, got.more
            ),
            want,
            "{ctx}"
        );
    }

    async fn check_store(&self, m: &Model, ctx: &str) {
        let mut got = self.inbox.inbox_indexes().await.unwrap();
        sort_indexes(&mut got);
        // First the store against its own invariants, whatever the model says.
        let want = derived(&got.rows);
        assert_eq!(
            got.status, want.status,
            "{ctx}: status index != one entry per row"
        );
        assert_eq!(
            got.expiry, want.expiry,
            "{ctx}: expiry index != settled rows"
        );
        assert_eq!(
            got.queue, want.queue,
            "{ctx}: queue index != pending rows with a stream"
        );
        assert_eq!(
            got.runnable, want.runnable,
            "{ctx}: runnable index != runnable pending rows at their due time"
        );
        assert!(
            got.orphan_timelines.is_empty(),
            "{ctx}: timelines without an event: {:?}",
            got.orphan_timelines
        );
        assert!(
            got.orphan_bodies.is_empty(),
            "{ctx}: bodies without an event: {:?}",
            got.orphan_bodies
        );
        assert!(
            got.orphan_marks.is_empty(),
            "{ctx}: replay marks without an event: {:?}",
            got.orphan_marks
        );
        assert!(
            got.erased_bodies.is_empty(),
            "{ctx}: erased events with a body: {:?}",
            got.erased_bodies
        );
        let mut dedupe_index: Vec<(u64, String, String)> = got
            .dedupe
            .iter()
            .map(|(s, id, until)| (*until, s.clone(), id.clone()))
            .collect();
        dedupe_index.sort();
        assert_eq!(
            got.dedupe_expiry, dedupe_index,
            "{ctx}: dedupe expiry index != one entry per record"
        );
        assert!(
            !got.dedupe
                .iter()
                .any(|(s, id, _)| got.rows.iter().any(|e| (&e.source, &e.event_id) == (s, id))),
            "{ctx}: an id with both a row and a dedupe record"
        );
        let model_dedupe: Vec<(String, String, u64)> = m
            .dedupe
            .iter()
            .map(|((s, id), until)| (s.clone(), id.clone(), *until))
            .collect();
        assert_eq!(got.dedupe, model_dedupe, "{ctx}: dedupe records");
        // Then the rows against the model (bodies included).
        let model_rows: Vec<InboxEvent> = m.events.values().cloned().collect();
        assert_eq!(got.rows, model_rows, "{ctx}: rows differ from the model");
    }

    async fn close(self: Box<Self>) {
        self.store.close().await;
    }
}

/// Compares the store with the model: what the backend checks of its own
/// state, single reads, the runnable events and the source summary.
async fn check_state(s: &dyn Subject, m: &Model, ctx: &str) {
    s.check_store(m, ctx).await;
    let inbox = s.inbox();
    for source in SOURCES {
        for id in 0..IDS {
            let id = event_id(id);
            let e = inbox.inbox_event(source, &id).await.unwrap();
            assert_eq!(e.as_ref(), m.get(source, &id), "{ctx}: {source}/{id}");
            let known = m.get(source, &id).is_some()
                || m.dedupe
                    .get(&(source.to_owned(), id.clone()))
                    .is_some_and(|until| *until > m.now);
            assert_eq!(
                inbox.knows_event(&m.key(source, &id), m.now).await.unwrap(),
                known,
                "{ctx}: whether {source}/{id} is a duplicate"
            );
        }
    }
    let wants = vec![
        (SOURCES[0].to_owned(), 100),
        (SOURCES[1].to_owned(), 100),
        ("gh-".to_owned(), 100),
    ];
    let due = inbox
        .due_events(m.now, wants.clone(), u64::MAX)
        .await
        .unwrap();
    assert_eq!(due.len(), wants.len(), "{ctx}");
    for ((source, limit), got) in wants.iter().zip(due) {
        let (events, next) = m.due(source, *limit);
        assert_eq!(
            unmarked(got.events),
            unmarked(events),
            "{ctx}: due events of {source}"
        );
        assert_eq!(got.next, next, "{ctx}: next due time of {source}");
    }
    // The counts kept in memory (and taken again on restart) match the rows.
    let mut summary: BTreeMap<String, SourceSummary> = BTreeMap::new();
    for e in m.events.values() {
        let x = summary
            .entry(e.source.clone())
            .or_insert_with(|| SourceSummary {
                source: e.source.clone(),
                pending: 0,
                delivered: 0,
                stale: 0,
                dead: 0,
                erased: 0,
                filtered: 0,
                oldest_pending_ms: None,
            });
        match e.status {
            EventStatus::Pending => {
                x.pending += 1;
                x.oldest_pending_ms = Some(
                    x.oldest_pending_ms
                        .map_or(e.received_at_ms, |at| at.min(e.received_at_ms)),
                );
            }
            EventStatus::Delivered => x.delivered += 1,
            EventStatus::Stale => x.stale += 1,
            EventStatus::Dead => x.dead += 1,
            EventStatus::Erased => x.erased += 1,
            EventStatus::Filtered => x.filtered += 1,
        }
    }
    let summary: Vec<SourceSummary> = summary.into_values().collect();
    let jobs: Vec<StoredJob> = m
        .jobs
        .iter()
        .map(|(id, (record, cancelled))| StoredJob {
            id: id.clone(),
            record: record.clone(),
            cancelled: *cancelled,
        })
        .collect();
    assert_eq!(inbox.jobs().await.unwrap(), jobs, "{ctx}: jobs");
    assert_eq!(
        inbox.inbox_summary().await.unwrap(),
        summary,
        "{ctx}: summary"
    );
    let sources = m.sources();
    assert_eq!(
        inbox.inbox_sources().await.unwrap(),
        sources,
        "{ctx}: sources"
    );
    for source in SOURCES {
        let has = sources.iter().any(|(s, _)| s == source);
        assert_eq!(
            inbox.has_source(source).await.unwrap(),
            has,
            "{ctx}: {source}"
        );
    }
}

/// Runs `ops` against `s` and the model `m` (fresh, at [`T0`]), comparing
/// them after every step.
async fn run(mut s: Box<dyn Subject>, mut m: Model, ops: Vec<Op>) {
    for (step, op) in ops.into_iter().enumerate() {
        let now = m.now;
        let ctx = format!("step {step} (now {now}): {op:?}");
        match op {
            Op::Ingest {
                source,
                id,
                stream,
                created: c,
            } => {
                let stream = if m.fixed_streams {
                    fixed_stream(id)
                } else {
                    stream
                };
                let new = NewEvent {
                    source: SOURCES[usize::from(source)].to_owned(),
                    event_id: event_id(id),
                    stream: stream.map(|st| STREAMS[usize::from(st)].to_owned()),
                    created_at: created(c),
                    received_at_ms: now,
                    headers: vec![("x-step".to_owned(), step.to_string())],
                    body: format!("body of step {step}").into_bytes(),
                };
                let want = m.ingest(&new);
                assert_eq!(s.inbox().ingest(new, now).await.unwrap(), want, "{ctx}");
            }
            Op::Lease {
                mask,
                extra,
                hold,
                stale_check,
            } => {
                let due: Vec<InboxEvent> = SOURCES
                    .iter()
                    .flat_map(|s| m.due(s, usize::MAX).0)
                    .collect();
                let mut events: Vec<(String, String, u64)> = due
                    .into_iter()
                    .enumerate()
                    .filter(|(i, _)| mask & (1 << (i % 16)) != 0)
                    .map(|(_, e)| (e.source, e.event_id, now + hold))
                    .collect();
                if let Some((source, id)) = extra {
                    events.push((
                        SOURCES[usize::from(source)].to_owned(),
                        event_id(id),
                        now + hold,
                    ));
                }
                let want = m.lease(&events, stale_check);
                let events = events
                    .into_iter()
                    .map(|(source, id, until)| (m.key(&source, &id), until))
                    .collect();
                let got = s
                    .inbox()
                    .lease(events, stale_check.then_some(RETENTION), now)
                    .await
                    .unwrap();
                assert_eq!(got, want, "{ctx}");
            }
            Op::Settle {
                pick,
                skew,
                how,
                sent,
            } => {
                let rec = pick_lease(&m, pick);
                let generation = rec.generation.saturating_add_signed(i64::from(skew));
                let settle = match how {
                    How::Delivered { attempted } => Settle::Delivered { attempted },
                    How::Stale => Settle::Stale,
                    How::Retry { after, attempted } => Settle::Retry {
                        retry_at: now + after,
                        error: format!("retry at step {step}"),
                        attempted,
                    },
                    How::Dead => Settle::Dead {
                        error: format!("dead at step {step}"),
                    },
                };
                let inbox = s.inbox();
                match sent {
                    Some(status) => {
                        let sent = attempt(step, now, status);
                        m.record_attempt(&rec.source, &rec.id, &sent);
                        m.settle(&rec.source, &rec.id, generation, &settle);
                        inbox
                            .settle_attempt(&rec.key(), generation, settle, sent, RETENTION, now)
                            .await
                            .unwrap();
                    }
                    None => {
                        m.settle(&rec.source, &rec.id, generation, &settle);
                        inbox
                            .settle(&rec.key(), generation, settle, RETENTION, now)
                            .await
                            .unwrap();
                    }
                }
            }
            Op::Delivered { pick, skew, sent } => {
                let rec = pick_lease(&m, pick);
                let generation = rec.generation.saturating_add_signed(i64::from(skew));
                let apply = rec.stream.as_deref().map(|stream| {
                    (
                        gateway_key(&rec.source, stream, "stream"),
                        gateway_key(&rec.source, &rec.id, "event_id"),
                        rec.created_at,
                        ORDERING_MS,
                    )
                });
                if let Some(stream) = &rec.stream {
                    m.apply(&rec.source, stream, &rec.id, rec.created_at);
                }
                let sent = sent.then(|| attempt(step, now, Some(204)));
                if let Some(sent) = &sent {
                    m.record_attempt(&rec.source, &rec.id, sent);
                }
                m.settle(
                    &rec.source,
                    &rec.id,
                    generation,
                    &Settle::Delivered { attempted: true },
                );
                s.inbox()
                    .settle_delivered(&rec.key(), generation, apply, sent, RETENTION, now)
                    .await
                    .unwrap();
            }
            Op::Redeliver { target } => {
                let (source, id) = target_of(&m, target);
                let want = m.redeliver(&source, &id);
                let got = s.inbox().redeliver(&source, &id, now).await.unwrap();
                assert_eq!(got, want, "{ctx}");
            }
            Op::Replay { target, job } => {
                let (source, id) = target_of(&m, target);
                let job = JOBS[usize::from(job)];
                let want = m.replay(&source, &id, job);
                let got = s.inbox().replay(&source, &id, job, now).await.unwrap();
                assert_eq!(got, want, "{ctx}");
            }
            Op::Erase { target, retention } => {
                let (source, id) = target_of(&m, target);
                let want = m.erase(&source, &id, retention);
                let got = s.inbox().erase(&source, &id, retention, now).await.unwrap();
                assert_eq!(got, want, "{ctx}");
            }
            Op::Job { id, act } => {
                let id = JOBS[usize::from(id)];
                let record = format!("record of step {step}").into_bytes();
                let want = m.job(id, act, record.clone());
                let inbox = s.inbox();
                match act {
                    JobAct::Put => inbox.put_job(id, record, now).await.unwrap(),
                    JobAct::Cancel => {
                        let got = inbox.cancel_job(id, now).await.unwrap();
                        assert_eq!(got, want, "{ctx}");
                    }
                    JobAct::Delete => inbox.delete_job(id, now).await.unwrap(),
                }
            }
            Op::Due { limits, max_bytes } => {
                let wants: Vec<(String, usize)> = SOURCES
                    .iter()
                    .zip(limits)
                    .map(|(s, l)| ((*s).to_owned(), l))
                    .collect();
                let got = s
                    .inbox()
                    .due_events(now, wants.clone(), max_bytes)
                    .await
                    .unwrap();
                assert_eq!(got.len(), wants.len(), "{ctx}");
                for ((source, limit), got) in wants.iter().zip(got) {
                    let (events, next) = m.due_within(source, *limit, max_bytes);
                    assert_eq!(unmarked(got.events), unmarked(events), "{ctx}: {source}");
                    assert_eq!(got.next, next, "{ctx}: {source}");
                }
            }
            Op::List {
                source,
                status,
                page,
                newest,
            } => {
                let (source, status) = (SOURCES[usize::from(source)], status_of(status));
                let mut want: Vec<InboxEvent> = m
                    .events
                    .values()
                    .filter(|e| e.source == source && e.status == status)
                    .map(|e| InboxEvent {
                        headers: Vec::new(),
                        body: Vec::new(),
                        timeline: Vec::new(),
                        ..e.clone()
                    })
                    .collect();
                want.sort_by(|a, b| {
                    (a.received_at_ms, &a.event_id).cmp(&(b.received_at_ms, &b.event_id))
                });
                let order = if newest {
                    want.reverse();
                    ListOrder::NewestFirst
                } else {
                    ListOrder::OldestFirst
                };
                let mut got = Vec::new();
                let mut after = None;
                loop {
                    let (events, next) = s
                        .inbox()
                        .list_events(source, status, order, after, page)
                        .await
                        .unwrap();
                    assert!(events.len() <= page, "{ctx}: page too long");
                    got.extend(events);
                    assert!(got.len() <= want.len(), "{ctx}: listing runs on");
                    match next {
                        Some(cursor) => after = Some(cursor),
                        None => break,
                    }
                }
                assert_eq!(got, want, "{ctx}");
            }
            Op::PurgeExpired { limit } => s.reap(&mut m, limit, &ctx).await,
            Op::PurgePending {
                both,
                source,
                back,
                limit,
            } => {
                let sources: Vec<String> = if both {
                    SOURCES.iter().map(|s| (*s).to_owned()).collect()
                } else {
                    vec![SOURCES[usize::from(source)].to_owned()]
                };
                let before = now - back;
                let want = m.purge_pending(&sources, before, limit);
                let got = s
                    .inbox()
                    .purge_pending(sources, before, limit, now)
                    .await
                    .unwrap();
                assert_eq!(got, want, "{ctx}");
            }
            Op::Advance(ms) => m.now += ms,
            Op::Restart => s.restart().await,
        }
        check_state(s.as_ref(), &m, &ctx).await;
    }
    s.close().await;
}

/// The event `target` names: (source, event id).
fn target_of(m: &Model, target: Target) -> Id {
    let pick = |settled: bool, i: usize| {
        let ids: Vec<&Id> = m
            .events
            .iter()
            .filter(|(_, e)| !settled || e.status != EventStatus::Pending)
            .map(|(k, _)| k)
            .collect();
        match ids.len() {
            0 => (SOURCES[0].to_owned(), event_id(0)),
            n => ids[i % n].clone(),
        }
    };
    match target {
        Target::Settled(i) => pick(true, i),
        Target::Stored(i) => pick(false, i),
        Target::Id(s, i) => (SOURCES[usize::from(s)].to_owned(), event_id(i)),
    }
}

/// The turn `pick` names: (source, event id, generation, stream,
/// created_at) as the dispatcher would hold them.
fn pick_lease(m: &Model, pick: Pick) -> LeaseRec {
    let current: Vec<&LeaseRec> = m
        .leases
        .iter()
        .filter(|l| {
            m.get(&l.source, &l.id)
                .is_some_and(|e| e.status == EventStatus::Pending && e.lease == l.generation)
        })
        .collect();
    let pending: Vec<LeaseRec> = m
        .events
        .values()
        .filter(|e| e.status == EventStatus::Pending)
        .map(|e| LeaseRec {
            source: e.source.clone(),
            id: e.event_id.clone(),
            generation: e.lease,
            stream: e.stream.clone(),
            created_at: e.created_at,
        })
        .collect();
    match pick {
        Pick::Current(i) if !current.is_empty() => current[i % current.len()].clone(),
        Pick::Current(i) | Pick::Pending(i) if !pending.is_empty() => {
            pending[i % pending.len()].clone()
        }
        Pick::Current(i) | Pick::Pending(i) | Pick::Any(i) if !m.leases.is_empty() => {
            m.leases[i % m.leases.len()].clone()
        }
        _ => LeaseRec {
            source: SOURCES[0].to_owned(),
            id: event_id(0),
            generation: 0,
            stream: m.key(SOURCES[0], &event_id(0)).stream,
            created_at: created(0),
        },
    }
}

#[test]
fn random_inbox_operations_agree_with_the_model() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let config = ProptestConfig {
        cases: 96,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(ops in proptest::collection::vec(op(), 1..100))| {
        rt.block_on(run(Box::new(DataFile::open()), Model::new(Rules::DataFile, false), ops));
    });
}
