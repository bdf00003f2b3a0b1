//! Connections that have not authenticated yet (with API tokens set): how
//! many may wait, and who makes room when they are too many.
//!
//! A stranger cannot authenticate, so what it can hold must not depend on
//! how patient it is. At most `max` connections wait at once, and at most
//! an eighth of them from one address (an IPv6 /64 counts as one). When a
//! new connection would pass either bound, the **oldest** waiting
//! connection of that address (or, over the global bound, the oldest of
//! all) is evicted: a client that sends `AUTH` as soon as it connects, as
//! every Redis client does, is never the oldest for long, while a stranger
//! holding idle sockets loses them to every newcomer. Refusing newcomers
//! instead let 64 idle sockets lock every token holder out.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;

use crate::auth::Peer;

/// The connections waiting to authenticate.
#[derive(Debug)]
pub struct Waiting {
    /// Most waiting connections in all.
    max: usize,
    /// Most waiting connections from one address.
    per_peer: usize,
    /// Who waits, oldest first.
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Id of the next place handed out.
    next: u64,
    /// The waiting connections, oldest first.
    queue: VecDeque<Entry>,
    /// How many of them each address holds.
    by_peer: HashMap<Peer, usize>,
}

#[derive(Debug)]
struct Entry {
    id: u64,
    peer: Option<Peer>,
    evict: Arc<Notify>,
}

/// One connection's place among the waiting; dropping it (the connection
/// authenticated or closed) frees it.
#[derive(Debug)]
pub struct Place {
    id: u64,
    evict: Arc<Notify>,
    waiting: Arc<Waiting>,
}

impl Waiting {
    /// At most `max` waiting connections, `max / 8` (at least one) from one
    /// address.
    pub fn new(max: usize) -> Self {
        let max = max.max(1);
        Self {
            max,
            per_peer: (max / 8).max(1),
            state: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place for a new connection from `peer`, evicting the oldest
    /// waiting one of that address, or of all, to make room.
    pub fn enter(self: &Arc<Self>, peer: Option<IpAddr>) -> Place {
        let peer = peer.map(Peer::from);
        let mut s = self.lock();
        if let Some(p) = peer
            && s.by_peer.get(&p).copied().unwrap_or(0) >= self.per_peer
        {
            s.evict(|e| e.peer == Some(p));
        }
        if s.queue.len() >= self.max {
            s.evict(|_| true);
        }
        let id = s.next;
        s.next += 1;
        let evict = Arc::new(Notify::new());
        if let Some(p) = peer {
            *s.by_peer.entry(p).or_insert(0) += 1;
        }
        s.queue.push_back(Entry {
            id,
            peer,
            evict: evict.clone(),
        });
        Place {
            id,
            evict,
            waiting: self.clone(),
        }
    }

    pub fn len(&self) -> usize {
        self.lock().queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl State {
    /// Evicts the oldest waiting connection that `which` picks.
    fn evict(&mut self, which: impl Fn(&Entry) -> bool) {
        if let Some(at) = self.queue.iter().position(which) {
            let entry = self.queue.remove(at).expect("the position is in the queue");
            self.forget(entry.peer);
            // A stored permit: the connection sees it at its next wait.
            entry.evict.notify_one();
        }
    }

    fn forget(&mut self, peer: Option<Peer>) {
        if let Some(p) = peer
            && let Some(n) = self.by_peer.get_mut(&p)
        {
            *n -= 1;
            if *n == 0 {
                self.by_peer.remove(&p);
            }
        }
    }
}

impl Place {
    /// Completes once a newer connection evicted this one.
    pub async fn evicted(&self) {
        self.evict.notified().await;
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut s = self.waiting.lock();
        if let Some(at) = s.queue.iter().position(|e| e.id == self.id) {
            let entry = s.queue.remove(at).expect("the position is in the queue");
            s.forget(entry.peer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    /// Whether `place` was evicted (its permit is stored).
    fn is_evicted(place: &Place) -> bool {
        let fut = place.evicted();
        futures_util::FutureExt::now_or_never(fut).is_some()
    }

    #[test]
    fn one_address_holds_an_eighth_and_its_oldest_makes_room_for_its_newest() {
        let w = Arc::new(Waiting::new(16));
        let mine: Vec<Place> = (0..2).map(|_| w.enter(ip("10.0.0.1"))).collect();
        let other = w.enter(ip("10.0.0.2"));
        assert_eq!(w.len(), 3);
        let newest = w.enter(ip("10.0.0.1"));
        assert!(is_evicted(&mine[0]), "the address's oldest goes");
        assert!(!is_evicted(&mine[1]) && !is_evicted(&other) && !is_evicted(&newest));
        assert_eq!(w.len(), 3);
        // An IPv6 /64 is one address.
        let a = w.enter(ip("2001:db8::1"));
        let _b = w.enter(ip("2001:db8::2"));
        let _c = w.enter(ip("2001:db8::3"));
        assert!(is_evicted(&a));
    }

    #[test]
    fn over_the_global_bound_the_oldest_of_all_is_evicted_and_a_dropped_place_frees() {
        let w = Arc::new(Waiting::new(8));
        let places: Vec<Place> = (1..=8)
            .map(|i| w.enter(ip(&format!("10.0.0.{i}"))))
            .collect();
        let newest = w.enter(ip("10.0.0.9"));
        assert!(is_evicted(&places[0]));
        assert!(places[1..].iter().all(|p| !is_evicted(p)) && !is_evicted(&newest));
        drop(places);
        assert_eq!(w.len(), 1);
        drop(newest);
        assert!(w.is_empty());
    }
}
