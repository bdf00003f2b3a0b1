//! HTTP connections per client address (`http.max_connections_per_address`).
//!
//! `http.max_connections` bounds the listener's connections over all
//! clients, so one address that opens that many (and sends nothing until
//! `http.header_timeout` closes them, then opens them again) had every other
//! client's requests wait or fail. Here each accepted connection is counted
//! against its address (IPv6 by /64, as the failed-token limiter counts),
//! in actix-web's `on_connect` hook; a connection beyond the cap is shut
//! down at once, before a byte of it is read, so it frees its place in
//! `max_connections` as soon as the server sees the end of it. The count
//! drops when the connection ends: the slot lives in the connection's
//! data, which actix drops with it.
//!
//! Behind a reverse proxy every connection comes from the proxy's address:
//! the cap must then be above the proxy's connections to dedupd (or 0, no
//! cap), and the proxy limits its own clients.

use std::any::Any;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use actix_web::dev::Extensions;
use actix_web::rt::net::TcpStream;

use crate::auth::limiter::Peer;
use crate::telemetry::metrics::Metrics;

/// How often a refusal is logged at most (each is counted).
const WARN_EVERY: Duration = Duration::from_secs(60);

/// Open connections by address, and the cap.
#[derive(Debug)]
pub struct PeerConnections {
    cap: usize,
    open: Mutex<HashMap<Peer, usize>>,
    metrics: Option<Arc<Metrics>>,
    /// When a refusal was last logged, and how many came since.
    warned: Mutex<(Option<Instant>, u64)>,
}

/// One connection's place in its address's count, given back on drop.
#[derive(Debug)]
pub struct PeerSlot {
    peers: Arc<PeerConnections>,
    peer: Peer,
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut open = self.peers.lock();
        if let Some(n) = open.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.peer);
            }
        }
    }
}

impl PeerConnections {
    /// At most `cap` connections per address (0: no cap), counting
    /// refusals in `metrics`.
    pub fn new(cap: usize, metrics: Option<Arc<Metrics>>) -> Arc<Self> {
        Arc::new(Self {
            cap,
            open: Mutex::new(HashMap::new()),
            metrics,
            warned: Mutex::new((None, 0)),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Peer, usize>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place for a new connection from `ip`, or `None` when its address
    /// holds `cap` connections already. The table holds one entry per
    /// address with a connection open, so it is bounded by the listener's
    /// `max_connections`.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<PeerSlot> {
        let peer = Peer::from(ip);
        let mut open = self.lock();
        let n = open.entry(peer).or_insert(0);
        if self.cap != 0 && *n >= self.cap {
            return None;
        }
        *n += 1;
        Some(PeerSlot {
            peers: Arc::clone(self),
            peer,
        })
    }

    /// Addresses with a connection open.
    pub fn addresses(&self) -> usize {
        self.lock().len()
    }

    /// For `HttpServer::on_connect`: counts the connection against its
    /// address and keeps its slot in the connection's data, or shuts the
    /// connection down when its address is at the cap.
    pub fn on_connect(self: &Arc<Self>, io: &dyn Any, data: &mut Extensions) {
        if self.cap == 0 {
            return;
        }
        let Some(stream) = io.downcast_ref::<TcpStream>() else {
            return;
        };
        let Ok(addr) = stream.peer_addr() else {
            return;
        };
        match self.admit(addr.ip()) {
            Some(slot) => {
                data.insert(slot);
            }
            None => {
                // The dispatcher then reads the end of the stream at once and
                // drops the connection, freeing its place.
                let _ = socket2::SockRef::from(stream).shutdown(std::net::Shutdown::Both);
                self.refused(addr.ip());
            }
        }
    }

    fn refused(&self, ip: IpAddr) {
        if let Some(m) = &self.metrics {
            m.http_peer_refused();
        }
        let mut warned = self.warned.lock().unwrap_or_else(PoisonError::into_inner);
        warned.1 += 1;
        if warned.0.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
            tracing::warn!(
                peer = %ip,
                refused = warned.1,
                cap = self.cap,
                "closed connections from an address that holds http.max_connections_per_address \
                 already (behind a reverse proxy, raise it above the proxy's connections)"
            );
            *warned = (Some(Instant::now()), 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn an_address_holds_at_most_the_cap_and_a_closed_connection_frees_its_place() {
        let peers = PeerConnections::new(2, None);
        let a = peers.admit(ip("192.0.2.1")).unwrap();
        let b = peers.admit(ip("192.0.2.1")).unwrap();
        assert!(peers.admit(ip("192.0.2.1")).is_none());
        // Another address, and another /64, are counted apart.
        let _c = peers.admit(ip("192.0.2.2")).unwrap();
        let _d = peers.admit(ip("2001:db8:0:1::1")).unwrap();
        let _e = peers.admit(ip("2001:db8:0:1::2")).unwrap();
        assert!(peers.admit(ip("2001:db8:0:1::3")).is_none(), "one /64");
        assert!(peers.admit(ip("2001:db8:0:2::1")).is_some());
        // A mapped IPv4 address is its IPv4 address.
        assert!(peers.admit(ip("::ffff:192.0.2.1")).is_none());
        drop(a);
        let _f = peers.admit(ip("192.0.2.1")).unwrap();
        drop(b);
        drop(_f);
        // 192.0.2.1 and 2001:db8:0:2::/64 (its slot dropped at once) left
        // the table; 192.0.2.2 and 2001:db8:0:1::/64 hold theirs.
        assert_eq!(peers.addresses(), 2);
    }

    #[test]
    fn zero_is_no_cap() {
        let peers = PeerConnections::new(0, None);
        let slots: Vec<_> = (0..1000).map(|_| peers.admit(ip("192.0.2.1"))).collect();
        assert!(slots.iter().all(Option::is_some));
    }
}
