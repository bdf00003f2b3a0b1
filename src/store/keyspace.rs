//! The Redis-protocol keyspace: binary keys to values with an optional
//! expiry, what the RESP listener (the `resp` module) reads and writes.
//!
//! It lives in the data file only, whatever backend holds claims (with the
//! Redis backend, Redis clients use that Redis directly), written through
//! the same group-commit writer and write-ahead log as claims. Its writes
//! carry absolute times only, so a replay of the log gives the same result.
//!
//! The write requests here are logged: their encoding is pinned by the
//! write-ahead log's golden test (see `store::redb::record`). Add variants
//! last, never reorder fields or variants.

use serde::{Deserialize, Serialize};

use crate::clock::Millis;

/// A stored value and its expiry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvEntry {
    /// The value, as the client sent it.
    pub value: Vec<u8>,
    /// When the key stops existing, Unix ms (exclusive); `None`: never.
    pub expires_at_ms: Option<Millis>,
}

impl KvEntry {
    /// True while the key exists at `now`.
    pub fn is_live(&self, now: Millis) -> bool {
        self.expires_at_ms.is_none_or(|at| at > now)
    }
}

/// When a SET writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SetCondition {
    /// Always (no NX or XX).
    Always,
    /// Only if the key does not exist (NX).
    IfAbsent,
    /// Only if the key exists (XX).
    IfPresent,
}

/// The expiry a SET leaves on the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SetExpiry {
    /// No expiry (a plain SET discards the old one).
    Clear,
    /// The key's current expiry (KEEPTTL).
    Keep,
    /// This Unix ms; at or before the write's clock reading the key is
    /// deleted at once (EX/PX/EXAT/PXAT).
    At(i64),
}

/// When an EXPIRE applies (its NX/XX/GT/LT option).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExpireCondition {
    Always,
    /// Only if the key has no expiry (NX).
    IfNone,
    /// Only if the key has an expiry (XX).
    IfSome,
    /// Only if the new expiry is later than the current one; no expiry
    /// counts as infinite (GT).
    Later,
    /// Only if the new expiry is earlier than the current one; no expiry
    /// counts as infinite (LT).
    Earlier,
    /// Only if the key has an expiry and the new one is earlier (XX LT).
    /// (XX GT is [`ExpireCondition::Later`]: GT already needs an expiry.)
    SomeAndEarlier,
}

/// A keyspace write. Absolute times only, so a replay of the write-ahead
/// log gives the same result.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum KvRequest {
    Set {
        key: Vec<u8>,
        /// The new value.
        value: Vec<u8>,
        /// NX / XX.
        condition: SetCondition,
        /// The expiry to leave.
        expiry: SetExpiry,
        /// Whether to answer with the old value (GET).
        get: bool,
    },
    /// DEL / UNLINK.
    Delete {
        /// The keys; a repeated key counts once.
        keys: Vec<Vec<u8>>,
    },
    /// EXPIRE / PEXPIRE (relative times already made absolute).
    Expire {
        key: Vec<u8>,
        /// The new expiry, Unix ms; may be in the past (the key goes).
        at: i64,
        /// NX / XX / GT / LT.
        condition: ExpireCondition,
    },
    Persist {
        key: Vec<u8>,
    },
}

/// Answer to a [`KvRequest`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvResponse {
    /// Answer to SET.
    Set {
        /// Whether the value was written (false: NX or XX refused it).
        written: bool,
        /// The value before, when GET was asked (`None`: absent).
        old: Option<Vec<u8>>,
    },
    /// DEL: keys removed; EXPIRE / PERSIST: 1 when the key changed, else 0.
    Count(u64),
}

/// The keyspace's handle (see [`crate::store::redb::Keyspace`]). One
/// implementation, so a type and not a trait: a pipelined write costs no
/// boxed future.
pub use super::redb::Keyspace;
