//! The Redis backend (cargo feature `redis`): claims, fences, applied events
//! and stream heads shared by several dedupd instances.
//!
//! Every check-and-set is one Lua script, run with EVALSHA (reloaded on
//! NOSCRIPT by [`redis::Script`]). Scripts take the caller's clock as an
//! argument and store each record's expiry, so behaviour matches the redb
//! store exactly; each key also gets a Redis expiry (`PEXPIRE`, the record's
//! TTL plus a small slack) so Redis reclaims memory by itself and the reaper
//! has nothing to do here.
//!
//! Key layout (`P` is the configured prefix; `hex(…)` keeps user text out
//! of hash tags, so no name can end a tag early or collide with another key):
//! - Claims, and the counters their fences come from: a claim takes its
//!   fence in the script that writes it, so the two share a slot.
//!   - One node or Sentinel: `{P}:c:{key}` and the one counter `{P}:fence`
//!     (one hash tag; they have one slot anyway). Fences grow over the
//!     whole store.
//!   - A Redis Cluster: `P:{c:hex(key)}`, and the counter of its slot
//!     `P:{fN}:fence` (`fN` a precomputed tag that lands in that slot), so
//!     claims spread over every master. Fences grow per slot, so per key.
//!     Earlier versions used the one-slot layout in a cluster too: its
//!     records are moved once, and its counter `{P}:fence` stays as the
//!     floor of every slot's counter (`upgrade`).
//! - `P:{s:hex(stream)}:head` and `P:{s:hex(stream)}:e:{event}`: a stream's
//!   head and its applied events share a hash tag, so one slot holds a stream.
//! - `P:{e:hex(event)}:seen`: which stream an event id was first applied to,
//!   so an id is a duplicate on every stream, as in the redb store. It is
//!   another slot, so it is set (briefly) before the stream's script runs and
//!   confirmed for the retention after it.
//!
//! - `client`: the one connection (node, Sentinel or cluster) and the
//!   durability every write keeps;
//! - `claims`: the [`Store`](crate::store::Store) over it;
//! - `inbox`: the shared gateway inbox (`gateway.inbox = "shared"`);
//! - `lanes`: the fleet's shared delivery lanes, `P:{d:LANE}` (one slot
//!   each): `Retry-After` holds, rate limits and breakers;
//! - `fleet`: what the instances on the shared inbox agree on besides its
//!   events (an alert's interval), each under a hash tag of its own;
//! - `layout`: claim keys and fence counters, per slot in a cluster;
//! - `upgrade`: moving a cluster's claims from the one-slot layout;
//! - `sentinel`: following the master Sentinel names;
//! - `rewrite`: Redis's own files (AOF, snapshot) rewritten after an
//!   erasure from the shared inbox.

mod claims;
mod client;
mod fleet;
mod inbox;
mod lanes;
mod layout;
mod rewrite;
mod sentinel;
mod upgrade;

use std::time::Duration;

pub use self::claims::RedisStore;
pub use self::client::Client;
pub use self::fleet::RedisFleet;
pub use self::inbox::{RedisInbox, SharedInboxOptions};
pub use self::lanes::RedisLanes;
use crate::domain::Durability;

/// How to reach Redis.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// `redis://host:port/db`, `rediss://…` or `redis+unix:///path/redis.sock`.
    pub url: String,
    /// Cluster nodes (`redis://host:port`); when set, the cluster client is
    /// used and `url` is ignored.
    pub cluster_nodes: Vec<String>,
    /// Prefix of every key; no `{` or `}`.
    pub prefix: String,
    /// Redis keeps a key this long past its record's expiry.
    pub expiry_slack: Duration,
    /// Time allowed to connect.
    pub connect_timeout: Duration,
    /// Time allowed for an answer.
    pub response_timeout: Duration,
    /// What an acknowledged write survives (see [`Durability`]).
    pub durability: Durability,
    /// How long a write waits for its replicas (`Durability::Replicas`).
    pub replicas_timeout: Duration,
    /// Sentinels (`redis://host:port`); when set, dedupd connects to the
    /// master they name [`RedisOptions::sentinel_master`], with `url`'s
    /// credentials and database.
    pub sentinels: Vec<String>,
    /// The master's name among the sentinels.
    pub sentinel_master: String,
}
