//! Loopback ports.

use std::net::TcpListener;

/// A loopback port nothing listens on (for a receiver that is down).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
