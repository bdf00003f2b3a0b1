//! Failed authentications per peer, on every port that takes a token.
//!
//! A peer that presents [`MAX_FAILURES`] credentials that fail within
//! [`WINDOW`] of its first failure has every further attempt refused,
//! without its token being looked at, until that window has passed: HTTP
//! answers 429 with `Retry-After`. A success does not clear the count (a
//! holder of a read-only token could otherwise go on guessing the full
//! ones between successes).
//!
//! Peers are counted by address, IPv6 by /64 (what one host or subscriber
//! is given: counting single addresses would give it 2^64 tries), an
//! IPv4-mapped IPv6 address as the IPv4 one. The table holds at most
//! [`MAX_PEERS`]; when it is full, expired windows go first, then the
//! oldest ones that are not throttled, then the oldest throttled ones.
//!
//! Time is the app's [`Clock`](crate::clock::Clock), so tests move it.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::clock::{Millis, SharedClock, SystemClock};
pub use crate::domain::{AuthPort, RetryAfter};
use crate::telemetry::metrics::Metrics;

/// Failures a peer may have within [`WINDOW`]; the next attempt is refused.
pub const MAX_FAILURES: u32 = 10;
/// How long failures count, from a peer's first one.
pub const WINDOW: Duration = Duration::from_secs(60);
/// Most peers remembered at once.
pub const MAX_PEERS: usize = 4096;

/// Who is counted: an IPv4 address (an IPv4-mapped IPv6 one too), or an
/// IPv6 /64, which one client is usually given whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Peer {
    /// An IPv4 address.
    V4(u32),
    /// An IPv6 address's first 64 bits.
    V6(u64),
}

impl From<IpAddr> for Peer {
    fn from(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(a) => Peer::V4(u32::from(a)),
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(v4) => Peer::V4(u32::from(v4)),
                None => Peer::V6((u128::from(a) >> 64) as u64),
            },
        }
    }
}

/// One peer's failures since `start_ms`.
#[derive(Debug, Clone, Copy)]
struct Failures {
    start_ms: Millis,
    count: u32,
}

impl Failures {
    /// Whether the window has passed at `now`. A clock set back before the
    /// window began ends it too, rather than throttling until it is reached
    /// again.
    fn expired(&self, now: Millis, window_ms: u64) -> bool {
        now < self.start_ms || now - self.start_ms >= window_ms
    }

    fn throttled(&self) -> bool {
        self.count >= MAX_FAILURES
    }
}

/// The table of peers with failures, and the counters it feeds.
pub struct AuthLimiter {
    clock: SharedClock,
    window_ms: u64,
    peers: Mutex<HashMap<Peer, Failures>>,
    metrics: Option<Arc<Metrics>>,
}

impl std::fmt::Debug for AuthLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthLimiter")
            .field("peers", &self.lock().len())
            .finish_non_exhaustive()
    }
}

impl Default for AuthLimiter {
    fn default() -> Self {
        Self::new(Arc::new(SystemClock))
    }
}

impl AuthLimiter {
    /// A limiter on `clock`, counting nothing in metrics.
    pub fn new(clock: SharedClock) -> Self {
        Self {
            clock,
            window_ms: u64::try_from(WINDOW.as_millis()).unwrap_or(u64::MAX),
            peers: Mutex::new(HashMap::new()),
            metrics: None,
        }
    }

    /// Counts failures and throttled attempts in `metrics`
    /// (`dedupd_auth_failures_total`, `dedupd_auth_throttled_total`).
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Peer, Failures>> {
        self.peers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `peer` may attempt to authenticate now. Call before looking
    /// at its credential; an `Err` is counted as a throttled attempt.
    pub fn allow(&self, port: AuthPort, peer: IpAddr) -> Result<(), RetryAfter> {
        let now = self.clock.now_ms();
        let mut peers = self.lock();
        let key = Peer::from(peer);
        let Some(f) = peers.get(&key).copied() else {
            return Ok(());
        };
        if f.expired(now, self.window_ms) {
            peers.remove(&key);
            return Ok(());
        }
        if !f.throttled() {
            return Ok(());
        }
        drop(peers);
        if let Some(m) = &self.metrics {
            m.auth_throttled(port);
        }
        let left_ms = (f.start_ms + self.window_ms).saturating_sub(now);
        Err(RetryAfter {
            secs: left_ms.div_ceil(1000).max(1),
        })
    }

    /// `peer` presented a credential that did not authenticate.
    pub fn failed(&self, port: AuthPort, peer: IpAddr) {
        if let Some(m) = &self.metrics {
            m.auth_failed(port);
        }
        let now = self.clock.now_ms();
        let mut peers = self.lock();
        let key = Peer::from(peer);
        if !peers.contains_key(&key) && peers.len() >= MAX_PEERS {
            make_room(&mut peers, now, self.window_ms);
        }
        let f = peers.entry(key).or_insert(Failures {
            start_ms: now,
            count: 0,
        });
        if f.expired(now, self.window_ms) {
            *f = Failures {
                start_ms: now,
                count: 0,
            };
        }
        f.count = f.count.saturating_add(1);
    }

    /// Peers remembered now (for tests and `Debug`).
    pub fn peers(&self) -> usize {
        self.lock().len()
    }
}

/// Frees at least an eighth of a full table: expired windows first, then
/// the oldest unthrottled, then the oldest throttled. An eighth at a time
/// keeps the cost per new peer constant on average while a flood of new
/// peers keeps the table full.
fn make_room(peers: &mut HashMap<Peer, Failures>, now: Millis, window_ms: u64) {
    peers.retain(|_, f| !f.expired(now, window_ms));
    let goal = MAX_PEERS - MAX_PEERS / 8;
    if peers.len() <= goal {
        return;
    }
    let mut order: Vec<((bool, Millis), Peer)> = peers
        .iter()
        .map(|(p, f)| ((f.throttled(), f.start_ms), *p))
        .collect();
    let evict = order.len() - goal;
    order.select_nth_unstable_by_key(evict - 1, |(age, _)| *age);
    for (_, p) in &order[..evict] {
        peers.remove(p);
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::*;
    use crate::clock::ManualClock;

    fn limiter() -> (ManualClock, AuthLimiter) {
        let clock = ManualClock::new(1_800_000_000_000);
        let limiter = AuthLimiter::new(Arc::new(clock.clone()));
        (clock, limiter)
    }

    fn v4(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(192, 0, 2, last))
    }

    #[test]
    fn the_attempt_after_the_last_allowed_failure_waits_for_the_window() {
        let (clock, l) = limiter();
        for _ in 0..MAX_FAILURES {
            assert_eq!(l.allow(AuthPort::Http, v4(1)), Ok(()));
            l.failed(AuthPort::Http, v4(1));
        }
        assert_eq!(l.allow(AuthPort::Http, v4(1)), Err(RetryAfter { secs: 60 }));
        assert_eq!(
            l.allow(AuthPort::Resp, v4(1)),
            Err(RetryAfter { secs: 60 }),
            "one table for every port"
        );
        assert_eq!(l.allow(AuthPort::Http, v4(2)), Ok(()), "others are not");
        clock.advance(Duration::from_millis(59_001));
        assert_eq!(l.allow(AuthPort::Http, v4(1)), Err(RetryAfter { secs: 1 }));
        clock.advance(Duration::from_millis(999));
        assert_eq!(l.allow(AuthPort::Http, v4(1)), Ok(()));
        assert_eq!(l.peers(), 0, "the passed window is forgotten");
    }

    #[test]
    fn failures_older_than_the_window_do_not_add_up() {
        let (clock, l) = limiter();
        for _ in 0..MAX_FAILURES - 1 {
            l.failed(AuthPort::Http, v4(1));
        }
        clock.advance(WINDOW);
        for _ in 0..MAX_FAILURES - 1 {
            l.failed(AuthPort::Http, v4(1));
        }
        assert_eq!(l.allow(AuthPort::Http, v4(1)), Ok(()));
    }

    #[test]
    fn a_clock_set_back_ends_the_window_instead_of_prolonging_it() {
        let (clock, l) = limiter();
        for _ in 0..MAX_FAILURES {
            l.failed(AuthPort::Http, v4(1));
        }
        clock.set(1_700_000_000_000);
        assert_eq!(l.allow(AuthPort::Http, v4(1)), Ok(()));
    }

    #[test]
    fn an_ipv6_64_counts_as_one_peer_and_a_mapped_ipv4_as_its_ipv4() {
        let (_clock, l) = limiter();
        for i in 0..MAX_FAILURES {
            let ip = Ipv6Addr::new(0x2001, 0xdb8, 1, 2, 0, 0, 0, u16::try_from(i).unwrap());
            l.failed(AuthPort::Http, IpAddr::V6(ip));
        }
        let same_64 = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 1, 2, 9, 9, 9, 9));
        let next_64 = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 1, 3, 0, 0, 0, 1));
        assert!(l.allow(AuthPort::Http, same_64).is_err());
        assert_eq!(l.allow(AuthPort::Http, next_64), Ok(()));

        for _ in 0..MAX_FAILURES {
            l.failed(AuthPort::Resp, v4(7));
        }
        let mapped = IpAddr::V6(Ipv4Addr::new(192, 0, 2, 7).to_ipv6_mapped());
        assert!(l.allow(AuthPort::Http, mapped).is_err());
    }

    #[test]
    fn a_flood_of_new_peers_keeps_the_table_bounded_and_the_throttled_peer_last_to_go() {
        let (clock, l) = limiter();
        for _ in 0..MAX_FAILURES {
            l.failed(AuthPort::Http, v4(1));
        }
        // Ten times the table's size in new peers, one failure each, all
        // within the throttled peer's window.
        for i in 0..u32::try_from(MAX_PEERS * 10).unwrap() {
            clock.advance(Duration::from_micros(1000));
            let ip = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i));
            l.failed(AuthPort::Http, ip);
            assert!(l.peers() <= MAX_PEERS);
        }
        assert!(
            l.allow(AuthPort::Http, v4(1)).is_err(),
            "the unthrottled newcomers were evicted before the throttled peer"
        );
    }
}
