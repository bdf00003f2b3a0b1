//! Claims in redb: rows by row id, found through [`RowIndex`] (see there
//! for why), with their expiry index. Changed only by the writer, in the
//! same steps as the map.
//!
//! Invariants (kept by every write here):
//! - each key the map finds has exactly one row, holding that key; every
//!   row is in the map;
//! - each row has exactly one [`CLAIM_ROW_EXPIRY`] entry, at its expiry.

use std::time::{Duration, Instant};

use redb::{Database, ReadableDatabase, ReadableTable, WriteTransaction};

use super::row_index::{Found, RowIndex};
use super::tables::{
    CLAIM_ROW_EXPIRY, CLAIM_ROWS, ClaimIdRow, Lazy, META, META_CLAIM_NEXT_ID, claim_from_row,
    claim_to_row,
};
use crate::clock::Millis;
use crate::domain::ScopedKey;
use crate::store::claims::{Change, ClaimRecord};

/// A claim as stored, with its row id.
pub type Stored = (u64, ClaimRecord);

/// The claim tables of one write transaction, and the map.
pub struct ClaimTables<'txn> {
    rows: Lazy<'txn, u64, ClaimIdRow<'static>>,
    expiry: Lazy<'txn, (u64, u64), ()>,
    index: &'txn RowIndex,
}

impl<'txn> ClaimTables<'txn> {
    /// The claim tables of `tx` (each opened on first use), changed
    /// together with `index`.
    pub fn open(tx: &'txn WriteTransaction, index: &'txn RowIndex) -> Self {
        Self {
            rows: Lazy::new(tx, CLAIM_ROWS),
            expiry: Lazy::new(tx, CLAIM_ROW_EXPIRY),
            index,
        }
    }

    /// The claim of `key` as stored, expired or not.
    pub fn load(&mut self, key: &ScopedKey) -> Result<Option<Stored>, redb::Error> {
        let k = key.as_str();
        let found = self
            .index
            .read()
            .find(k.as_bytes(), self.index.hash(k.as_bytes()));
        let (id, sure) = match found {
            Found::Absent => return Ok(None),
            Found::Row(id) => (id, true),
            Found::Maybe(id) => (id, false),
        };
        let row = self.rows.open()?.get(id)?;
        match row {
            Some(g) if g.value().0 == k => Ok(Some((id, claim_from_row(g.value().1)))),
            _ if sure => Err(missing_row(id)),
            // Another key with the same hash holds that row.
            _ => Ok(None),
        }
    }

    /// Applies `change` to `key`; `stored` is its claim as [`Self::load`]
    /// found it. A new key gets the next row id: an append.
    pub fn change(
        &mut self,
        key: &ScopedKey,
        stored: Option<&Stored>,
        change: Change,
    ) -> Result<(), redb::Error> {
        let k = key.as_str();
        match change {
            Change::Keep => {}
            Change::Put(new) => {
                let id = match stored {
                    Some((id, old)) => {
                        self.expiry.open()?.remove((old.expires_at_ms, *id))?;
                        *id
                    }
                    None => {
                        let mut ix = self.index.write();
                        let id = ix.allocate();
                        ix.insert(k.as_bytes(), self.index.hash(k.as_bytes()), id);
                        id
                    }
                };
                self.rows.open()?.insert(id, (k, claim_to_row(&new)))?;
                self.expiry.open()?.insert((new.expires_at_ms, id), ())?;
            }
            Change::Delete => {
                if let Some((id, old)) = stored {
                    self.expiry.open()?.remove((old.expires_at_ms, *id))?;
                    self.rows.open()?.remove(*id)?;
                    self.index
                        .write()
                        .remove(k.as_bytes(), self.index.hash(k.as_bytes()), *id);
                }
            }
        }
        Ok(())
    }

    /// Deletes up to `limit` expired claims in expiry order, reading only
    /// due index entries. Returns how many went.
    pub fn purge(&mut self, now: Millis, limit: u64) -> Result<u64, redb::Error> {
        if limit == 0 {
            return Ok(0);
        }
        let due: Vec<(u64, u64)> = self
            .expiry
            .open()?
            .range(..(now.saturating_add(1), 0))?
            .take(usize::try_from(limit).unwrap_or(usize::MAX))
            .map(|e| e.map(|(k, _)| k.value()))
            .collect::<Result<_, _>>()?;
        for &(at, id) in &due {
            self.expiry.open()?.remove((at, id))?;
            // An index entry is never trusted over its row.
            let key = self
                .rows
                .open()?
                .get(id)?
                .filter(|g| g.value().1.3 == at)
                .map(|g| g.value().0.to_owned());
            if let Some(key) = key {
                self.rows.open()?.remove(id)?;
                let hash = self.index.hash(key.as_bytes());
                self.index.write().remove(key.as_bytes(), hash, id);
            }
        }
        Ok(due.len() as u64)
    }

    /// Whether an expired claim waits for the reaper.
    pub fn has_due(&mut self, now: Millis) -> Result<bool, redb::Error> {
        Ok(self
            .expiry
            .open()?
            .first()?
            .is_some_and(|(k, _)| k.value().0 <= now))
    }
}

fn missing_row(id: u64) -> redb::Error {
    redb::Error::Corrupted(format!(
        "claim row {id} is in the index but not in the table"
    ))
}

/// Rebuilds `index` from the claim rows of `db`, which holds batches up to
/// `seq`.
pub fn rebuild(index: &RowIndex, db: &Database, seq: u64) -> Result<(), redb::Error> {
    let tx = db.begin_read()?;
    let rows = tx.open_table(CLAIM_ROWS)?;
    let stored = tx
        .open_table(META)?
        .get(META_CLAIM_NEXT_ID)?
        .map_or(1, |g| g.value());
    index.rebuild(stored, seq, |add| {
        for entry in rows.iter()? {
            let (id, row) = entry?;
            add(id.value(), row.value().0.as_bytes());
        }
        Ok(())
    })
}

/// How long a read waits for the batch that wrote a claim to commit (it is
/// in the map from the moment the writer runs it).
const ROW_WAIT: Duration = Duration::from_secs(2);

/// The claim of `key` at `now` (expired ones are absent), and the last
/// batch the answer may come from (the read waits for it to be on disk).
/// `visible` gives the last batch a read transaction begun now may see.
pub fn get(
    db: &Database,
    index: &RowIndex,
    visible: impl Fn() -> u64,
    key: &ScopedKey,
    now: Millis,
) -> Result<(Option<ClaimRecord>, u64), redb::Error> {
    let k = key.as_str();
    let hash = index.hash(k.as_bytes());
    let deadline = Instant::now() + ROW_WAIT;
    loop {
        let (found, seq) = {
            let ix = index.read();
            (ix.find(k.as_bytes(), hash), ix.seq())
        };
        let id = match found {
            Found::Absent => return Ok((None, seq)),
            Found::Row(id) | Found::Maybe(id) => id,
        };
        // The row as a read transaction begun now sees it. It may be
        // missing there (the batch that wrote it has not committed yet, or
        // the map was read before a batch that removed it): then look again.
        // A row holding another key means another key with this hash.
        let tx = db.begin_read()?;
        let seen = visible().max(seq);
        let rows = tx.open_table(CLAIM_ROWS)?;
        if let Some(g) = rows.get(id)? {
            let (holder, row) = g.value();
            if holder == k {
                let rec = claim_from_row(row);
                return Ok((Some(rec).filter(|r| !r.is_expired(now)), seen));
            }
            if matches!(found, Found::Maybe(_)) {
                return Ok((None, seen));
            }
        }
        drop(rows);
        drop(tx);
        if Instant::now() >= deadline {
            return Err(missing_row(id));
        }
        std::thread::yield_now();
    }
}

/// The earliest claim expiry.
pub fn next_expiry(tx: &redb::ReadTransaction) -> Result<Option<Millis>, redb::Error> {
    Ok(tx
        .open_table(CLAIM_ROW_EXPIRY)?
        .first()?
        .map(|(k, _)| k.value().0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Key, Token};
    use crate::store::claims::ClaimState;

    fn key(s: &str) -> ScopedKey {
        ScopedKey::api(&Key::parse(s, "key").unwrap())
    }

    fn record(fence: u64, expires_at_ms: Millis) -> ClaimRecord {
        ClaimRecord {
            state: ClaimState::Processing,
            token: Token::from_bytes([fence as u8; 16]),
            fence,
            expires_at_ms,
            fingerprint: None,
        }
    }

    /// Every key gets the same hash, so all but the first are found by
    /// the whole key: loads, reads, deletes, the reaper and a rebuild from
    /// the file must still tell them apart.
    #[test]
    fn claims_whose_keys_share_a_hash_stay_apart() {
        let dir = tempfile::TempDir::new().unwrap();
        let db = Database::create(dir.path().join("c.redb")).unwrap();
        {
            let tx = db.begin_write().unwrap();
            tx.open_table(META).unwrap();
            tx.commit().unwrap();
        }
        let index = RowIndex::colliding();
        index.rebuild(1, 0, |_| Ok(())).unwrap();
        let names = ["a", "b", "c"];
        let write = |seq: u64, f: &dyn Fn(&mut ClaimTables<'_>)| {
            index.begin(seq);
            let tx = db.begin_write().unwrap();
            {
                let mut t = ClaimTables::open(&tx, &index);
                f(&mut t);
            }
            tx.commit().unwrap();
            index.keep();
        };
        write(1, &|t| {
            for (i, n) in names.iter().enumerate() {
                assert_eq!(t.load(&key(n)).unwrap(), None, "{n}");
                let fence = i as u64 + 1;
                t.change(&key(n), None, Change::Put(record(fence, 1_000 * fence)))
                    .unwrap();
            }
        });
        let fences = |index: &RowIndex| -> Vec<Option<u64>> {
            names
                .iter()
                .map(|n| {
                    get(&db, index, || 1, &key(n), 0)
                        .unwrap()
                        .0
                        .map(|r| r.fence)
                })
                .collect()
        };
        assert_eq!(fences(&index), [Some(1), Some(2), Some(3)]);
        // Delete the one the hash finds (a): b and c, found by key, stay.
        write(2, &|t| {
            let stored = t.load(&key("a")).unwrap().unwrap();
            assert_eq!(stored.1.fence, 1);
            t.change(&key("a"), Some(&stored), Change::Delete).unwrap();
            assert_eq!(t.load(&key("a")).unwrap(), None);
        });
        assert_eq!(fences(&index), [None, Some(2), Some(3)]);
        // The reaper removes b (expired at 2 000), by its row.
        write(3, &|t| assert_eq!(t.purge(2_000, 10).unwrap(), 1));
        assert_eq!(fences(&index), [None, None, Some(3)]);
        // a comes back, now found by the hash again; a rebuild from the
        // file finds the same.
        write(4, &|t| {
            t.change(&key("a"), None, Change::Put(record(4, 9_000)))
                .unwrap();
        });
        assert_eq!(fences(&index), [Some(4), None, Some(3)]);
        let rebuilt = RowIndex::colliding();
        rebuild(&rebuilt, &db, 4).unwrap();
        assert_eq!(fences(&rebuilt), [Some(4), None, Some(3)]);
    }
}
