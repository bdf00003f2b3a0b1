//! Which row holds each key of a table whose rows are keyed by row id.
//!
//! Why: a table keyed by the key itself puts every new random key at a
//! random place in its B-tree, and a transaction copies and rewrites a leaf
//! page for each (10-15 µs of the writer's time per key on a table of a
//! million). Keyed by a row id handed out in increasing order, a batch's
//! new rows fill the table's last leaf (about 1.5 µs each). This map finds
//! a key's row: it holds a 64-bit keyed hash of each key (SipHash with a
//! random key, so clients cannot choose collisions) and the row id, 16
//! bytes a key, and the row itself says which key it holds. A key whose
//! hash another key already has goes to a small map by the whole key.
//!
//! The table stays the store of record: the map is rebuilt from it when the
//! file is opened (and after a disk fault), before the log replays. Only
//! the writer changes it, in the same steps as the rows; a batch that fails
//! is undone here too. Readers take [`RowIndex::seq`] with what they found
//! and wait for that batch to be on disk, as for the keyspace's map (see
//! [`super::kv_index`]).

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher, RandomState};
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Hashes a `u64` that already is a hash: itself.
#[derive(Debug, Default)]
pub struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// Where a key's row may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// Not in the table.
    Absent,
    /// In this row, for sure (found by the whole key).
    Row(u64),
    /// In this row if the row holds the key; otherwise absent (another
    /// key with the same hash has it).
    Maybe(u64),
}

/// The map of one table.
#[derive(Debug, Default)]
pub struct RowIndex {
    hasher: RandomState,
    inner: RwLock<Inner>,
    /// Tests: every key gets this hash.
    #[cfg(test)]
    same_hash: Option<u64>,
}

/// The map and what the writer keeps beside it.
#[derive(Debug, Default)]
pub struct Inner {
    by_hash: HashMap<u64, u64, BuildHasherDefault<Prehashed>>,
    /// Keys whose hash another key had when they were stored.
    overflow: HashMap<Box<[u8]>, u64>,
    /// The next row id to hand out.
    next_id: u64,
    /// The last batch that changed the map.
    seq: u64,
    /// The batch running now, and how to undo it.
    batch: Option<Undo>,
}

#[derive(Debug)]
struct Undo {
    seq: u64,
    next_id: u64,
    prev_seq: u64,
    changes: Vec<Change>,
}

#[derive(Debug)]
enum Change {
    Hash(u64, Option<u64>),
    Overflow(Box<[u8]>, Option<u64>),
}

impl Inner {
    /// Where `key` (whose hash is `hash`) may be.
    pub fn find(&self, key: &[u8], hash: u64) -> Found {
        if !self.overflow.is_empty()
            && let Some(&id) = self.overflow.get(key)
        {
            return Found::Row(id);
        }
        self.by_hash
            .get(&hash)
            .map_or(Found::Absent, |&id| Found::Maybe(id))
    }

    /// The last batch that changed the map.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// A new row id.
    pub fn allocate(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Records that row `id` holds `key`, which is not in the map.
    pub fn insert(&mut self, key: &[u8], hash: u64, id: u64) {
        let vacant = match self.by_hash.entry(hash) {
            Entry::Vacant(slot) => {
                slot.insert(id);
                true
            }
            Entry::Occupied(_) => false,
        };
        if vacant {
            self.record(Change::Hash(hash, None));
        } else {
            let before = self.overflow.insert(key.into(), id);
            self.record(Change::Overflow(key.into(), before));
        }
    }

    /// Records that row `id`, which held `key`, is gone.
    pub fn remove(&mut self, key: &[u8], hash: u64, id: u64) {
        if self.overflow.get(key) == Some(&id) {
            let before = self.overflow.remove(key);
            self.record(Change::Overflow(key.into(), before));
        } else if self.by_hash.get(&hash) == Some(&id) {
            let before = self.by_hash.remove(&hash);
            self.record(Change::Hash(hash, before));
        }
    }

    fn record(&mut self, change: Change) {
        if let Some(undo) = self.batch.as_mut() {
            self.seq = undo.seq;
            undo.changes.push(change);
        }
    }

    /// Keys in the map.
    #[cfg(test)]
    fn keys(&self) -> usize {
        self.by_hash.len() + self.overflow.len()
    }
}

impl RowIndex {
    /// Tests: a map in which every key has the same hash.
    #[cfg(test)]
    pub fn colliding() -> Self {
        Self {
            same_hash: Some(42),
            ..Self::default()
        }
    }

    /// The hash `key` is found by.
    pub fn hash(&self, key: &[u8]) -> u64 {
        #[cfg(test)]
        if let Some(h) = self.same_hash {
            return h;
        }
        self.hasher.hash_one(key)
    }

    /// The map, for reading.
    pub fn read(&self) -> RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The map, for the writer.
    pub fn write(&self) -> RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Replaces the map with the rows `fill` hands to its argument (row id
    /// and key, in id order); `stored` is the next row id the file records,
    /// `seq` the last batch it holds.
    pub fn rebuild(
        &self,
        stored: u64,
        seq: u64,
        fill: impl FnOnce(&mut dyn FnMut(u64, &[u8])) -> Result<(), redb::Error>,
    ) -> Result<(), redb::Error> {
        let mut fresh = Inner {
            seq,
            ..Inner::default()
        };
        let mut next_id = 1;
        fill(&mut |id, key| {
            fresh.insert(key, self.hash(key), id);
            next_id = id + 1;
        })?;
        // The stored counter is never behind the rows; it is ahead when the
        // last rows handed out were deleted since.
        fresh.next_id = next_id.max(stored);
        *self.write() = fresh;
        Ok(())
    }

    /// A batch with sequence number `seq` begins: what it changes can be
    /// undone until [`RowIndex::keep`].
    pub fn begin(&self, seq: u64) {
        let mut inner = self.write();
        inner.batch = Some(Undo {
            seq,
            next_id: inner.next_id,
            prev_seq: inner.seq,
            changes: Vec::new(),
        });
    }

    /// The next row id to store, if the running batch handed out any.
    pub fn next_id_moved(&self) -> Option<u64> {
        let inner = self.read();
        inner
            .batch
            .as_ref()
            .filter(|u| u.next_id != inner.next_id)
            .map(|_| inner.next_id)
    }

    /// The running batch was committed.
    pub fn keep(&self) {
        self.write().batch = None;
    }

    /// The running batch failed: puts back what it changed. True if it had
    /// changed anything (a read may have seen it).
    pub fn rollback(&self) -> bool {
        let mut inner = self.write();
        let Some(undo) = inner.batch.take() else {
            return false;
        };
        let changed = !undo.changes.is_empty();
        for change in undo.changes.into_iter().rev() {
            match change {
                Change::Hash(h, Some(id)) => {
                    inner.by_hash.insert(h, id);
                }
                Change::Hash(h, None) => {
                    inner.by_hash.remove(&h);
                }
                Change::Overflow(k, Some(id)) => {
                    inner.overflow.insert(k, id);
                }
                Change::Overflow(k, None) => {
                    inner.overflow.remove(&k);
                }
            }
        }
        inner.next_id = undo.next_id;
        inner.seq = undo.prev_seq;
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two keys forced onto one hash: each is found, by its row or by
    /// the overflow map, and removing either leaves the other.
    #[test]
    fn keys_that_share_a_hash_are_both_found_and_removed_apart() {
        let index = RowIndex::default();
        index.begin(1);
        let mut m = index.write();
        m.insert(b"a", 7, 1);
        m.insert(b"b", 7, 2);
        assert_eq!(m.find(b"a", 7), Found::Maybe(1));
        assert_eq!(m.find(b"b", 7), Found::Row(2));
        assert_eq!(m.find(b"c", 8), Found::Absent);
        m.remove(b"a", 7, 1);
        assert_eq!(m.find(b"b", 7), Found::Row(2));
        assert_eq!(m.find(b"a", 7), Found::Absent);
        m.insert(b"a", 7, 3);
        assert_eq!(m.find(b"a", 7), Found::Maybe(3));
        m.remove(b"b", 7, 2);
        assert_eq!(
            m.find(b"b", 7),
            Found::Maybe(3),
            "b's row now is a's: absent"
        );
        assert_eq!(m.keys(), 1);
    }

    #[test]
    fn a_failed_batch_is_undone_and_a_kept_one_stays() {
        let index = RowIndex::default();
        index.begin(1);
        {
            let mut m = index.write();
            let id = m.allocate();
            m.insert(b"kept", index.hash(b"kept"), id);
        }
        index.keep();
        index.begin(2);
        {
            let mut m = index.write();
            let id = m.allocate();
            m.insert(b"undone", index.hash(b"undone"), id);
            m.remove(b"kept", index.hash(b"kept"), 0);
            assert_eq!(m.seq(), 2);
        }
        assert_eq!(index.next_id_moved(), Some(2));
        assert!(index.rollback());
        let m = index.read();
        assert_eq!(m.find(b"kept", index.hash(b"kept")), Found::Maybe(0));
        assert_eq!(m.find(b"undone", index.hash(b"undone")), Found::Absent);
        assert_eq!(m.seq(), 1);
        drop(m);
        index.begin(3);
        assert_eq!(
            index.write().allocate(),
            1,
            "the undone row id is handed out again"
        );
    }
}
