//! The Redis-protocol listener: RESP2 and RESP3 on a second port, so code
//! written for Redis's `SET key value NX EX` recipe runs unchanged against
//! dedupd, with every write synced to disk before its reply.
//!
//! - [`connection`]: the listener, connection limit, idle timeout, and one
//!   task per connection that decodes requests (by `redis-protocol`) and
//!   answers pipelined commands in order.
//! - [`command`]: the command table, the checks before a command runs, and
//!   dispatch.
//! - [`keys`] (SET, GET, DEL, EXISTS), [`expiry`] (EXPIRE, PERSIST, TTL),
//!   [`session`] (PING, HELLO, AUTH, SELECT, CLIENT, RESET),
//!   [`introspection`] (COMMAND, INFO): Redis's semantics, error texts
//!   included.
//! - [`reply`]: replies encoded as RESP2 or RESP3.
//!
//! Keys live in the redb file (`store::redb::kv`), written through the
//! group-commit writer; time comes from the [`Clock`](crate::clock::Clock).

pub mod command;
pub mod connection;
pub mod expiry;
pub mod introspection;
pub mod keys;
pub mod reply;
pub mod session;

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use bytes::Bytes;
use tokio::sync::Semaphore;

use crate::auth::ApiTokens;
use crate::clock::SharedClock;
use crate::store::redb::RedbStore;

pub use connection::RespServer;

/// What every connection's commands share.
#[derive(Debug)]
pub struct Context {
    /// The redb file that holds the keyspace.
    pub store: Arc<RedbStore>,
    /// Decides expiry.
    pub clock: SharedClock,
    /// Passwords `AUTH` accepts; empty: no authentication.
    pub tokens: ApiTokens,
    /// The port listened on, for `INFO`.
    pub port: u16,
    /// Most open connections.
    pub max_connections: usize,
    /// One permit per open connection.
    slots: Arc<Semaphore>,
    /// The last connection id handed out.
    last_id: AtomicI64,
}

impl Context {
    /// Open connections now.
    pub fn connections(&self) -> usize {
        self.max_connections
            .saturating_sub(self.slots.available_permits())
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
        }
    }
}
