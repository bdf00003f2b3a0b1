//! The Redis-protocol listener: RESP2 and RESP3 on a second port, so code
//! written for Redis's `SET key value NX EX` recipe runs unchanged against
//! dedupd, with every write synced to disk before its reply.
//!
//! - [`connection`]: the listener, its limits (connections, unauthenticated
//!   connections, deadlines for authentication, progress and writes), and
//!   one task per connection that answers pipelined commands in order.
//! - [`frame`]: requests off the wire, parsed without recursion within
//!   size limits checked before anything is allocated.
//! - [`command`]: the command table, the checks before a command runs, and
//!   dispatch.
//! - [`keys`] (SET, GET, DEL, EXISTS), [`expiry`] (EXPIRE, PERSIST, TTL),
//!   [`session`] (PING, HELLO, AUTH, SELECT, CLIENT, RESET),
//!   [`introspection`] (COMMAND, INFO): Redis's semantics, error texts
//!   included.
//! - [`reply`]: replies encoded as RESP2 or RESP3.
//!
//! Keys live in the data file ([`Keyspace`]), written through the
//! group-commit writer; time comes from the [`Clock`](crate::clock::Clock).

pub mod admission;
pub mod command;
pub mod connection;
pub mod expiry;
pub mod frame;
pub mod introspection;
pub mod keys;
pub mod reply;
pub mod session;

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::auth::ApiTokens;
use crate::clock::SharedClock;
use crate::store::keyspace::Keyspace;

pub use connection::RespServer;

/// What every connection's commands share.
#[derive(Debug)]
pub struct Context {
    pub keyspace: Keyspace,
    /// Decides expiry.
    pub clock: SharedClock,
    /// Passwords `AUTH` accepts; empty: no authentication.
    pub tokens: ApiTokens,
    /// The port listened on, for `INFO`.
    pub port: u16,
    pub max_connections: usize,
    /// One permit per open connection.
    slots: Arc<Semaphore>,
    /// The connections waiting to authenticate (with tokens set).
    waiting: Arc<admission::Waiting>,
    /// The last connection id handed out.
    last_id: AtomicI64,
}

/// Redis's answer to a connection over `maxclients`.
pub const TOO_MANY: &str = "-ERR max number of clients reached\r\n";

impl Context {
    /// The shared state of a listener on `port`.
    pub fn new(
        keyspace: Keyspace,
        clock: SharedClock,
        tokens: ApiTokens,
        port: u16,
        options: &connection::RespOptions,
    ) -> Self {
        let max = options.max_connections.max(1);
        Self {
            keyspace,
            clock,
            tokens,
            port,
            max_connections: max,
            slots: Arc::new(Semaphore::new(max)),
            waiting: Arc::new(admission::Waiting::new(
                options.max_unauthenticated.clamp(1, max),
            )),
            last_id: AtomicI64::new(0),
        }
    }

    pub fn connections(&self) -> usize {
        self.max_connections
            .saturating_sub(self.slots.available_permits())
    }

    /// A new connection's slot, or the error to refuse it with.
    pub fn admit(&self) -> Result<OwnedSemaphorePermit, &'static str> {
        self.slots.clone().try_acquire_owned().map_err(|_| TOO_MANY)
    }

    /// Connections waiting to authenticate now.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }
}

/// One connection's state.
#[derive(Debug)]
pub struct Session {
    /// Its id (`CLIENT ID`), unique in this process.
    pub id: i64,
    /// RESP2 until `HELLO 3`.
    pub protocol: reply::Protocol,
    /// Whether commands other than AUTH, HELLO, QUIT and RESET may run.
    pub authenticated: bool,
    /// `CLIENT SETNAME`.
    pub name: Option<Bytes>,
    /// Set by QUIT: the connection closes once its reply is written.
    pub closing: bool,
    /// The client's address, for the limit on failed authentications
    /// (`None` off a socket, in tests).
    pub peer: Option<std::net::IpAddr>,
}

impl Session {
    /// A new connection's state.
    fn new(ctx: &Context) -> Self {
        Self {
            id: ctx.last_id.fetch_add(1, Ordering::Relaxed) + 1,
            protocol: reply::Protocol::Resp2,
            authenticated: ctx.tokens.is_empty(),
            name: None,
            closing: false,
            peer: None,
        }
    }
}
