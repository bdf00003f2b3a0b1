//! The tables keyed by row id — the Redis-protocol keyspace's and the
//! claims' ([`Space`]) — in the writer's transaction: the keyspace's writes
//! ([`crate::store::keyspace::KvRequest`]), the row writes claims are made
//! of (`ops::claims`), the reaper's deletions, and the reads of both.
//!
//! Rows are keyed by a row id, and the map from key to row id is in memory
//! ([`super::kv_index`]); this module changes both in the same steps.
//!
//! Invariants, in each space (kept by every write here):
//! - each key in the index has exactly one row, at its slot's id, holding
//!   the same key, value and expiry; every row is in the index;
//! - a row with an expiry has exactly one entry in its space's expiry
//!   index ([`Space::expiry`]), at that expiry; a row without one has none
//!   (every claim has one);
//! - a stored expiry is always later than the clock reading of the write
//!   that stored it (a write whose expiry has already passed deletes the
//!   key instead, as Redis does).
//!
//! A key whose expiry is `<= now` reads as absent everywhere, whether or
//! not the reaper has removed it yet.

use redb::{Database, ReadableDatabase, ReadableTable, WriteTransaction};

use super::engine::{Engine, Fresh};
use super::error::EngineError;
pub use super::kv_index::Space;
use super::kv_index::{Inner, KvIndex, Slot};
use super::tables::{KvRow, Lazy};
use crate::clock::Millis;
use crate::store::keyspace::{
    ExpireCondition, KvEntry, KvRequest, KvResponse, SetCondition, SetExpiry,
};

/// The tables of one space in one write transaction, and the index.
pub struct KvTables<'txn> {
    space: Space,
    rows: Lazy<'txn, u64, KvRow<'static>>,
    expiry: Lazy<'txn, (u64, u64), ()>,
    index: &'txn KvIndex,
}

impl<'txn> KvTables<'txn> {
    /// The tables of `space` in `tx` (each opened on first use), changed
    /// together with `index`.
    pub fn open(tx: &'txn WriteTransaction, index: &'txn KvIndex, space: Space) -> Self {
        Self {
            space,
            rows: Lazy::new(tx, space.rows()),
            expiry: Lazy::new(tx, space.expiry()),
            index,
        }
    }

    /// The slot of `key` (expired or not) and its value.
    pub fn load(&mut self, key: &[u8]) -> Result<Option<(Slot, Vec<u8>)>, redb::Error> {
        let slot = self.index.read().get(self.space, key).cloned();
        match slot {
            Some(slot) => {
                let value = self.value_of(&slot)?;
                Ok(Some((slot, value)))
            }
            None => Ok(None),
        }
    }

    /// Stores `value` with `expires` under `key`, replacing `stored` (the
    /// key's slot as [`KvTables::load`] found it).
    pub fn store(
        &mut self,
        key: &[u8],
        stored: Option<&Slot>,
        value: &[u8],
        expires: Option<Millis>,
    ) -> Result<(), redb::Error> {
        let index = self.index;
        self.put(&mut index.write(), key, stored, value, expires)
    }

    /// Deletes `key`, whose slot [`KvTables::load`] found as `stored`.
    pub fn delete(&mut self, key: &[u8], stored: Option<&Slot>) -> Result<(), redb::Error> {
        let index = self.index;
        self.remove(&mut index.write(), key, stored)
    }

    /// Performs one write at `now`.
    pub fn execute(&mut self, req: &KvRequest, now: Millis) -> Result<KvResponse, redb::Error> {
        let index = self.index;
        let mut ix = index.write();
        Ok(match req {
            KvRequest::Set {
                key,
                value,
                condition,
                expiry,
                get,
            } => {
                let stored = ix.get(self.space, key).cloned();
                let live = stored.as_ref().filter(|s| s.is_live(now));
                let old = match live {
                    Some(slot) if *get => Some(self.value_of(slot)?),
                    _ => None,
                };
                let proceed = match condition {
                    SetCondition::Always => true,
                    SetCondition::IfAbsent => live.is_none(),
                    SetCondition::IfPresent => live.is_some(),
                };
                if proceed {
                    let expires = match *expiry {
                        SetExpiry::Clear => Some(None),
                        SetExpiry::Keep => Some(live.and_then(|s| s.expires_at_ms)),
                        SetExpiry::At(at) => future(at, now).map(Some),
                    };
                    match expires {
                        Some(expires) => self.put(&mut ix, key, stored.as_ref(), value, expires)?,
                        None => self.remove(&mut ix, key, stored.as_ref())?,
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
                    if let Some(stored) = ix.get(self.space, key).cloned() {
                        removed += u64::from(stored.is_live(now));
                        self.remove(&mut ix, key, Some(&stored))?;
                    }
                }
                KvResponse::Count(removed)
            }
            KvRequest::Expire { key, at, condition } => {
                let stored = ix.get(self.space, key).cloned();
                let Some(live) = stored.as_ref().filter(|s| s.is_live(now)) else {
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
                        let value = self.value_of(live)?;
                        self.put(&mut ix, key, stored.as_ref(), &value, Some(at))?;
                    }
                    None => self.remove(&mut ix, key, stored.as_ref())?,
                }
                KvResponse::Count(1)
            }
            KvRequest::Persist { key } => {
                let stored = ix.get(self.space, key).cloned();
                match stored.as_ref().filter(|s| s.is_live(now)) {
                    Some(live) if live.expires_at_ms.is_some() => {
                        let value = self.value_of(live)?;
                        self.put(&mut ix, key, stored.as_ref(), &value, None)?;
                        KvResponse::Count(1)
                    }
                    _ => KvResponse::Count(0),
                }
            }
        })
    }

    /// The value of the key in `slot`: from the index when it is small,
    /// else from its row.
    fn value_of(&mut self, slot: &Slot) -> Result<Vec<u8>, redb::Error> {
        if let Some(v) = &slot.inline {
            return Ok(v.to_vec());
        }
        self.rows
            .open()?
            .get(slot.id)?
            .map(|g| g.value().1.to_vec())
            .ok_or_else(|| missing_row(slot.id))
    }

    /// Stores `value` with `expires` under `key`; `stored` is the slot it
    /// replaces (its row id is kept, its index entry goes first). A new
    /// key gets the next row id: an append at the table's end.
    fn put(
        &mut self,
        ix: &mut Inner,
        key: &[u8],
        stored: Option<&Slot>,
        value: &[u8],
        expires: Option<Millis>,
    ) -> Result<(), redb::Error> {
        let id = match stored {
            Some(slot) => {
                if let Some(at) = slot.expires_at_ms {
                    self.expiry.open()?.remove((at, slot.id))?;
                }
                slot.id
            }
            None => ix.allocate(),
        };
        self.rows.open()?.insert(id, (key, value, expires))?;
        if let Some(at) = expires {
            self.expiry.open()?.insert((at, id), ())?;
        }
        ix.put(
            self.space,
            key,
            Slot::in_space(self.space, id, value, expires),
        );
        Ok(())
    }

    /// Removes the key of `stored`: its row, its index entry, its slot.
    fn remove(
        &mut self,
        ix: &mut Inner,
        key: &[u8],
        stored: Option<&Slot>,
    ) -> Result<(), redb::Error> {
        if let Some(slot) = stored {
            if let Some(at) = slot.expires_at_ms {
                self.expiry.open()?.remove((at, slot.id))?;
            }
            self.rows.open()?.remove(slot.id)?;
            ix.remove(self.space, key);
        }
        Ok(())
    }

    /// Deletes up to `limit` expired keys in expiry order, reading only due
    /// index entries: they are taken off the index in one cursor pass, then
    /// each row is removed in row-id order (an index entry is never trusted
    /// over its row: a row rewritten with another expiry is put back).
    /// Returns how many index entries went.
    pub fn purge(&mut self, now: Millis, limit: u64) -> Result<u64, redb::Error> {
        if limit == 0 {
            return Ok(0);
        }
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        let mut due: Vec<(u64, u64)> = Vec::new();
        {
            let expiry = self.expiry.open()?;
            let mut taken = expiry.extract_from_if(..(now.saturating_add(1), 0), |_, _| true)?;
            for entry in taken.by_ref().take(limit) {
                let (at, id) = entry?.0.value();
                due.push((id, at));
            }
            taken.close()?;
        }
        due.sort_unstable();
        let index = self.index;
        let mut ix = index.write();
        let rows = self.rows.open()?;
        for &(id, at) in &due {
            let Some(old) = rows.remove(id)? else {
                continue;
            };
            let (key, value, expires) = old.value();
            if expires == Some(at) {
                if ix.get(self.space, key).is_some_and(|s| s.id == id) {
                    ix.remove(self.space, key);
                }
            } else {
                let (key, value) = (key.to_vec(), value.to_vec());
                drop(old);
                rows.insert(id, (key.as_slice(), value.as_slice(), expires))?;
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

fn missing_row(id: u64) -> redb::Error {
    redb::Error::Corrupted(format!(
        "keyspace row {id} is in the index but not in the table"
    ))
}

/// How many times a read waits for the batch writing the row it looks for
/// (each wait is one batch's sync, or up to the read's reopen wait).
pub const PENDING_TRIES: usize = 16;

/// How often a read of a large value looks again for its row before it
/// hands the wait to the caller (see [`Lookup::Pending`]).
const ROW_TRIES: usize = 64;

/// What a read of one key found.
#[derive(Debug)]
pub enum Lookup {
    /// The answer: the live entry, or `None`.
    Found(Option<KvEntry>),
    /// The map names a row that a read transaction does not see yet: the
    /// batch that wrote it has not committed. Once the batch the answer
    /// comes with is on disk (and so committed), read again.
    Pending,
}

/// What `key` holds at `now`, and the last batch the answer may come from
/// (the read waits for it to be on disk). `visible` gives the last batch a
/// read transaction begun now may see.
pub fn get(
    db: &Database,
    index: &KvIndex,
    space: Space,
    visible: impl Fn() -> u64,
    committed: impl Fn() -> u64,
    key: &[u8],
    now: Millis,
) -> Result<(Lookup, u64), redb::Error> {
    let mut seq = 0;
    for _ in 0..ROW_TRIES {
        let slot;
        (slot, seq) = {
            let Some(ix) = index.settled() else {
                break;
            };
            (
                ix.get(space, key).filter(|s| s.is_live(now)).cloned(),
                ix.seq(space),
            )
        };
        let Some(slot) = slot else {
            return Ok((Lookup::Found(None), seq));
        };
        if let Some(value) = slot.inline {
            let entry = KvEntry {
                value: value.into_vec(),
                expires_at_ms: slot.expires_at_ms,
            };
            return Ok((Lookup::Found(Some(entry)), seq));
        }
        // A large value: from its row, once the batch that last changed
        // the map is committed (the writer may hold it in an open
        // transaction; the row there may still be this key's old value).
        if committed() < slot.seq {
            break;
        }
        // The row as a read transaction begun now sees it. The row may belong to a newer state of the key than the map
        // showed (the map was read first): the row is the answer once it
        // holds this key, and the read waits for whichever batch is later.
        // It may be missing: the batch that wrote it has not committed, or
        // one that removed it committed after the map was read.
        let tx = db.begin_read()?;
        let seen = visible().max(seq);
        let rows = tx.open_table(space.rows())?;
        if let Some(g) = rows.get(slot.id)? {
            let (k, value, expires_at_ms) = g.value();
            if k == key {
                let entry = KvEntry {
                    value: value.to_vec(),
                    expires_at_ms,
                };
                return Ok((Lookup::Found(Some(entry).filter(|e| e.is_live(now))), seen));
            }
        }
        drop(rows);
        drop(tx);
        std::thread::yield_now();
    }
    // Still not committed (a slow log append or sync, or a transaction the
    // writer holds open): wait for that batch without holding a thread.
    Ok((Lookup::Pending, seq))
}

/// The live entry of `key` in `space` at `now`, from the index (and a
/// large value from its row), once the batch it comes from is on disk.
/// A pending row's batch is on disk (so committed) by the time
/// `read_seen` returns: the next look finds the row, or a newer state.
pub async fn read_key(
    engine: &Engine,
    space: Space,
    key: Vec<u8>,
    now: Millis,
) -> Result<Option<KvEntry>, EngineError> {
    let key = std::sync::Arc::new(key);
    for attempt in 0..PENDING_TRIES {
        let key = key.clone();
        // A small value is in the index; a row not committed yet is
        // waited for on the next attempt.
        let fresh = if attempt == 0 {
            Fresh::Shown
        } else {
            Fresh::Acknowledged
        };
        let found = engine
            .read_seen(fresh, move |db, shared| {
                get(
                    db,
                    &shared.kv,
                    space,
                    || shared.watermark.visible(),
                    || shared.watermark.last_committed(),
                    &key,
                    now,
                )
            })
            .await?;
        if let Lookup::Found(entry) = found {
            return Ok(entry);
        }
    }
    Err(EngineError::NotCommitted)
}

/// How many of `keys` exist at `now` (a repeated key counts each time),
/// and the last batch the answer may come from.
pub fn count_live(
    index: &KvIndex,
    keys: &[Vec<u8>],
    now: Millis,
) -> Result<(u64, u64), redb::Error> {
    let ix = index.settled().ok_or_else(|| {
        redb::Error::Io(std::io::Error::other(
            "the keyspace is being restored after a failed write",
        ))
    })?;
    let n = keys
        .iter()
        .filter(|k| ix.get(Space::Kv, k).is_some_and(|s| s.is_live(now)))
        .count();
    Ok((n as u64, ix.seq(Space::Kv)))
}

/// The earliest expiry in `space`.
pub fn next_expiry(
    tx: &redb::ReadTransaction,
    space: Space,
) -> Result<Option<Millis>, redb::Error> {
    Ok(tx
        .open_table(space.expiry())?
        .first()?
        .map(|(k, _)| k.value().0))
}
