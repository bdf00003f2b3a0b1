//! Events leased ahead: runnable events the dispatcher leased in the same
//! write as the ones it started, before a slot was free for them, so that
//! a slot that frees up takes the next event at once instead of waiting
//! for a read and a lease commit.
//!
//! A leased-ahead event is exactly as safe as one in flight: its lease
//! moved its due time past the attempt's timeout, so after a crash it comes
//! due again by itself (it was never sent, so it is sent once); its stream
//! has no other runnable event (the runnable index holds one per stream;
//! an older event arriving later goes first, and the dispatcher, told of
//! it by `gateway::arrivals`, hands the newer one back); and its stale
//! check ran in the lease, against a head that only an older event of its
//! stream can move meanwhile. It starts through the schedule like any read
//! event (limits, stream holds, the breaker, the rate limit). One kept so
//! long that its lease would end before a turn could finish (a paused or
//! rate-limited source), and every one left when the dispatcher stops, is
//! given back: runnable again at once, no attempt counted.

use std::collections::{HashMap, HashSet, VecDeque};

use crate::clock::Millis;
use crate::domain::CreatedAt;
use crate::store::inbox::InboxEvent;

/// An event leased ahead, under lease generation `lease`.
#[derive(Debug, Clone)]
pub(super) struct Ready {
    pub ev: InboxEvent,
    pub lease: u64,
    /// Starting later than this, its turn could outlive its lease.
    pub latest_start: Millis,
}

/// The events leased ahead, per source, oldest lease first.
#[derive(Debug, Default)]
pub(super) struct Ahead {
    by_source: HashMap<String, VecDeque<Ready>>,
}

impl Ahead {
    /// How many `source` has.
    pub fn len(&self, source: &str) -> usize {
        self.by_source.get(source).map_or(0, VecDeque::len)
    }

    /// Takes out the events past their latest start (a turn started now
    /// might outlive its lease), for the dispatcher to give back.
    pub fn take_expiring(&mut self, now: Millis) -> Vec<Ready> {
        let mut out = Vec::new();
        for queue in self.by_source.values_mut() {
            let (keep, expiring): (VecDeque<Ready>, VecDeque<Ready>) = std::mem::take(queue)
                .into_iter()
                .partition(|r| r.latest_start > now);
            *queue = keep;
            out.extend(expiring);
        }
        self.by_source.retain(|_, q| !q.is_empty());
        out
    }

    /// Bytes of `source`'s bodies held.
    pub fn bytes(&self, source: &str) -> u64 {
        self.by_source
            .get(source)
            .map_or(0, |q| q.iter().map(|r| r.ev.body.len() as u64).sum())
    }

    /// `source`'s events, as candidates for the schedule, oldest lease
    /// first; without their bodies (the schedule needs none, and the one
    /// picked is taken out whole).
    pub fn candidates(&self, source: &str) -> Vec<InboxEvent> {
        self.by_source
            .get(source)
            .map(|q| {
                // Not `..r.ev.clone()`: that copies the body and headers
                // before dropping them, at every schedule.
                q.iter().map(|r| r.ev.without_payload()).collect()
            })
            .unwrap_or_default()
    }

    /// Takes `source`'s event `id` out (it starts now).
    pub fn take(&mut self, source: &str, id: &str) -> Option<Ready> {
        let queue = self.by_source.get_mut(source)?;
        let at = queue.iter().position(|r| r.ev.event_id == id)?;
        let ready = queue.remove(at);
        if queue.is_empty() {
            self.by_source.remove(source);
        }
        ready
    }

    /// Takes out `source`'s events of `stream` created at or after
    /// `created_at`: an event that old goes before them now.
    pub fn take_newer(&mut self, source: &str, stream: &str, created_at: CreatedAt) -> Vec<Ready> {
        let Some(queue) = self.by_source.get_mut(source) else {
            return Vec::new();
        };
        let (newer, keep): (VecDeque<Ready>, VecDeque<Ready>) = std::mem::take(queue)
            .into_iter()
            .partition(|r| r.ev.stream.as_deref() == Some(stream) && r.ev.created_at >= created_at);
        *queue = keep;
        if queue.is_empty() {
            self.by_source.remove(source);
        }
        newer.into()
    }

    /// Bytes of every body held ahead.
    pub fn total_bytes(&self) -> u64 {
        self.by_source
            .values()
            .flat_map(|q| q.iter())
            .map(|r| r.ev.body.len() as u64)
            .sum()
    }

    /// Every event held ahead.
    pub fn total(&self) -> usize {
        self.by_source.values().map(VecDeque::len).sum()
    }

    /// Whether `source` has event `id`.
    pub fn contains(&self, source: &str, id: &str) -> bool {
        self.by_source
            .get(source)
            .is_some_and(|q| q.iter().any(|r| r.ev.event_id == id))
    }

    /// The streams of `source`'s events.
    pub fn streams(&self, source: &str) -> HashSet<String> {
        self.by_source
            .get(source)
            .map(|q| q.iter().filter_map(|r| r.ev.stream.clone()).collect())
            .unwrap_or_default()
    }

    /// Adds an event leased ahead.
    pub fn push(&mut self, ready: Ready) {
        self.by_source
            .entry(ready.ev.source.clone())
            .or_default()
            .push_back(ready);
    }

    /// Every event, taken out (the dispatcher stops).
    pub fn drain(&mut self) -> Vec<Ready> {
        self.by_source
            .drain()
            .flat_map(|(_, q)| q.into_iter())
            .collect()
    }
}
