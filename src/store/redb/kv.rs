//! The Redis-protocol keyspace in redb: binary keys to values with an
//! optional expiry, written through the same group-commit writer (and
//! write-ahead log) as claims.
//!
//! Invariants (kept by every write here):
//! - a key with an expiry has exactly one [`KV_EXPIRY`] entry, at that
//!   expiry; a key without one has none;
//! - a stored expiry is always later than the clock reading of the write
//!   that stored it (a write whose expiry has already passed deletes the
//!   key instead, as Redis does).
//!
//! A key whose expiry is `<= now` reads as absent everywhere, whether or
//! not the reaper has removed it yet.

use redb::{ReadTransaction, ReadableTable, WriteTransaction};
use serde::{Deserialize, Serialize};

use super::tables::{KV, KV_EXPIRY, KvRow, Lazy};
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

    fn from_row(row: KvRow<'_>) -> Self {
        Self {
            value: row.0.to_vec(),
            expires_at_ms: row.1,
        }
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
    /// Always.
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
    /// SET.
    Set {
        /// The key.
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
        /// The key.
        key: Vec<u8>,
        /// The new expiry, Unix ms; may be in the past (the key goes).
        at: i64,
        /// NX / XX / GT / LT.
        condition: ExpireCondition,
    },
    /// PERSIST.
    Persist {
        /// The key.
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

/// The keyspace tables of one write transaction.
pub struct KvTables<'txn> {
    rows: Lazy<'txn, &'static [u8], KvRow<'static>>,
    expiry: Lazy<'txn, (u64, &'static [u8]), ()>,
}

impl<'txn> KvTables<'txn> {
    /// The keyspace tables of `tx` (each opened on first use).
    pub fn open(tx: &'txn WriteTransaction) -> Self {
        Self {
            rows: Lazy::new(tx, KV),
            expiry: Lazy::new(tx, KV_EXPIRY),
        }
    }

    /// Performs one write at `now`.
    pub fn execute(&mut self, req: &KvRequest, now: Millis) -> Result<KvResponse, redb::Error> {
        Ok(match req {
            KvRequest::Set {
                key,
                value,
                condition,
                expiry,
                get,
            } => {
                // The usual write (NX or none, with a new expiry or none)
                // stores first and looks at what it replaced: one B-tree
                // descent instead of two.
                let fixed = match *expiry {
                    SetExpiry::Clear => Some(None),
                    SetExpiry::At(at) => future(at, now).map(Some),
                    SetExpiry::Keep => None,
                };
                if let Some(expires) = fixed
                    && *condition != SetCondition::IfPresent
                {
                    return self.set_blind(key, value, expires, *condition, *get, now);
                }
                let stored = self.load(key)?;
                let live = stored.as_ref().filter(|e| e.is_live(now));
                let old = if *get {
                    live.map(|e| e.value.clone())
                } else {
                    None
                };
                let proceed = match condition {
                    SetCondition::Always => true,
                    SetCondition::IfAbsent => live.is_none(),
                    SetCondition::IfPresent => live.is_some(),
                };
                if proceed {
                    match *expiry {
                        SetExpiry::Clear => self.put(key, stored.as_ref(), value, None)?,
                        SetExpiry::Keep => {
                            let keep = live.and_then(|e| e.expires_at_ms);
                            self.put(key, stored.as_ref(), value, keep)?;
                        }
                        SetExpiry::At(at) => match future(at, now) {
                            Some(at) => self.put(key, stored.as_ref(), value, Some(at))?,
                            None => self.remove(key, stored.as_ref())?,
                        },
                    }
                }
                KvResponse::Set {
                    written: proceed,
                    old,
                }
            }
            KvRequest::Delete { keys } => {
                let mut removed = 0;
                for key in keys {
                    let gone = self
                        .rows
                        .open()?
                        .remove(key.as_slice())?
                        .map(|g| KvEntry::from_row(g.value()));
                    if let Some(e) = gone {
                        removed += u64::from(e.is_live(now));
                        if let Some(at) = e.expires_at_ms {
                            self.expiry.open()?.remove((at, key.as_slice()))?;
                        }
                    }
                }
                KvResponse::Count(removed)
            }
            KvRequest::Expire { key, at, condition } => {
                let stored = self.load(key)?;
                let Some(live) = stored.as_ref().filter(|e| e.is_live(now)) else {
                    return Ok(KvResponse::Count(0));
                };
                let current = live.expires_at_ms.map(i128::from);
                let new = i128::from(*at);
                let applies = match condition {
                    ExpireCondition::Always => true,
                    ExpireCondition::IfNone => current.is_none(),
                    ExpireCondition::IfSome => current.is_some(),
                    ExpireCondition::Later => current.is_some_and(|c| new > c),
                    ExpireCondition::Earlier => current.is_none_or(|c| new < c),
                    ExpireCondition::SomeAndEarlier => current.is_some_and(|c| new < c),
                };
                if !applies {
                    return Ok(KvResponse::Count(0));
                }
                match future(*at, now) {
                    Some(at) => {
                        let value = live.value.clone();
                        self.put(key, stored.as_ref(), &value, Some(at))?;
                    }
                    None => self.remove(key, stored.as_ref())?,
                }
                KvResponse::Count(1)
            }
            KvRequest::Persist { key } => {
                let stored = self.load(key)?;
                match stored.as_ref().filter(|e| e.is_live(now)) {
                    Some(live) if live.expires_at_ms.is_some() => {
                        let value = live.value.clone();
                        self.put(key, stored.as_ref(), &value, None)?;
                        KvResponse::Count(1)
                    }
                    _ => KvResponse::Count(0),
                }
            }
        })
    }

    /// SET with a fixed expiry (`None`: none) and no XX: stores the row,
    /// then, if NX finds the replaced row live, puts that row back (inside
    /// the transaction, so nothing else ever sees the attempt).
    fn set_blind(
        &mut self,
        key: &[u8],
        value: &[u8],
        expires: Option<Millis>,
        condition: SetCondition,
        get: bool,
        now: Millis,
    ) -> Result<KvResponse, redb::Error> {
        let replaced = self
            .rows
            .open()?
            .insert(key, (value, expires))?
            .map(|g| KvEntry::from_row(g.value()));
        let live = replaced.as_ref().filter(|e| e.is_live(now));
        let old = if get {
            live.map(|e| e.value.clone())
        } else {
            None
        };
        if condition == SetCondition::IfAbsent
            && let Some(kept) = live
        {
            self.rows
                .open()?
                .insert(key, (kept.value.as_slice(), kept.expires_at_ms))?;
            return Ok(KvResponse::Set {
                written: false,
                old,
            });
        }
        if let Some(at) = replaced.as_ref().and_then(|e| e.expires_at_ms) {
            self.expiry.open()?.remove((at, key))?;
        }
        if let Some(at) = expires {
            self.expiry.open()?.insert((at, key), ())?;
        }
        Ok(KvResponse::Set { written: true, old })
    }

    /// The row as stored, expired or not.
    fn load(&mut self, key: &[u8]) -> Result<Option<KvEntry>, redb::Error> {
        Ok(self
            .rows
            .open()?
            .get(key)?
            .map(|g| KvEntry::from_row(g.value())))
    }

    /// Stores `value` with `expires`; `stored` is the row it replaces, whose
    /// index entry goes first.
    fn put(
        &mut self,
        key: &[u8],
        stored: Option<&KvEntry>,
        value: &[u8],
        expires: Option<Millis>,
    ) -> Result<(), redb::Error> {
        if let Some(at) = stored.and_then(|e| e.expires_at_ms) {
            self.expiry.open()?.remove((at, key))?;
        }
        self.rows.open()?.insert(key, (value, expires))?;
        if let Some(at) = expires {
            self.expiry.open()?.insert((at, key), ())?;
        }
        Ok(())
    }

    /// Removes the row `stored` and its index entry.
    fn remove(&mut self, key: &[u8], stored: Option<&KvEntry>) -> Result<(), redb::Error> {
        if let Some(e) = stored {
            if let Some(at) = e.expires_at_ms {
                self.expiry.open()?.remove((at, key))?;
            }
            self.rows.open()?.remove(key)?;
        }
        Ok(())
    }

    /// Deletes up to `limit` expired keys in expiry order, reading only due
    /// index entries. Returns how many went.
    pub fn purge(&mut self, now: Millis, limit: u64) -> Result<u64, redb::Error> {
        if limit == 0 {
            return Ok(0);
        }
        let empty: &[u8] = &[];
        let due: Vec<(u64, Vec<u8>)> = self
            .expiry
            .open()?
            .range(..(now.saturating_add(1), empty))?
            .take(usize::try_from(limit).unwrap_or(usize::MAX))
            .map(|e| e.map(|(k, _)| (k.value().0, k.value().1.to_vec())))
            .collect::<Result<_, _>>()?;
        for (at, key) in &due {
            self.expiry.open()?.remove((*at, key.as_slice()))?;
            // An index entry is never trusted over its row.
            let matches = self
                .rows
                .open()?
                .get(key.as_slice())?
                .is_some_and(|g| g.value().1 == Some(*at));
            if matches {
                self.rows.open()?.remove(key.as_slice())?;
            }
        }
        Ok(due.len() as u64)
    }

    /// Whether an expired key waits for the reaper.
    pub fn has_due(&mut self, now: Millis) -> Result<bool, redb::Error> {
        Ok(self
            .expiry
            .open()?
            .first()?
            .is_some_and(|(k, _)| k.value().0 <= now))
    }
}

/// `at` as a stored expiry, or `None` when it is not after `now` (the
/// key goes at once).
fn future(at: i64, now: Millis) -> Option<Millis> {
    u64::try_from(at).ok().filter(|&at| at > now)
}

/// The live entry of `key` at `now`.
pub fn get(tx: &ReadTransaction, key: &[u8], now: Millis) -> Result<Option<KvEntry>, redb::Error> {
    let rows = tx.open_table(KV)?;
    Ok(rows
        .get(key)?
        .map(|g| KvEntry::from_row(g.value()))
        .filter(|e| e.is_live(now)))
}

/// How many of `keys` exist at `now`; a repeated key counts each time.
pub fn count_live(tx: &ReadTransaction, keys: &[Vec<u8>], now: Millis) -> Result<u64, redb::Error> {
    let rows = tx.open_table(KV)?;
    let mut n = 0;
    for key in keys {
        if let Some(g) = rows.get(key.as_slice())? {
            n += u64::from(g.value().1.is_none_or(|at| at > now));
        }
    }
    Ok(n)
}

/// The earliest expiry in the keyspace.
pub fn next_expiry(tx: &ReadTransaction) -> Result<Option<Millis>, redb::Error> {
    Ok(tx.open_table(KV_EXPIRY)?.first()?.map(|(k, _)| k.value().0))
}
