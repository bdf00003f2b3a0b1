//! The in-memory indexes of the tables keyed by row id: the Redis-protocol
//! keyspace's and the claims' ([`Space`]). For each key: its row id, its
//! expiry and, when small, its value.
//!
//! Why: keyed by the key itself, every new key was an insert at a random
//! place in a large B-tree (a leaf copied and rewritten per key, 10-15 µs
//! of the writer's time on a table of a million keys, and, sustained, the
//! whole table rewritten to disk every few seconds: 130 MB/s of writes at
//! 40 000 claims/s). Rows are now keyed by a row id handed out in
//! increasing order, so a new key is an append at the table's end (about
//! 1.5 µs), and this map finds a key's row. The tables stay the store of
//! record: the maps are rebuilt from them on open (and after a disk
//! fault), before the write-ahead log is replayed. Both spaces draw their
//! ids from one counter.
//!
//! Who changes it: only the writer thread, inside a batch, in the same
//! steps as the rows ([`super::kv::KvTables`]). A transaction that is
//! dropped is undone here too ([`KvIndex::rollback`]), back to the last
//! commit.
//!
//! Who reads it: reads of the keyspace and of claims. What they see may be
//! a batch that is not committed or not on disk yet, so each read also
//! takes [`Inner::seq`] — the last batch that changed a map — and waits for
//! it to be on disk, as every read waits for the batch it saw (see
//! `watermark::Watermark`). If that batch is undone instead, the writer
//! moves the watermark's epoch, and the read runs again.
//!
//! Memory, measured with 26-byte keys: about 275 bytes per live claim
//! (the maps' spare room included; a claim's value is its state, token,
//! fence and fingerprint, 25 bytes without one). A value over
//! [`INLINE_MAX`] is read from its row. For `storage.max_key_memory_bytes`
//! each key is estimated at [`KEY_OVERHEAD`] plus its bytes and its
//! inline value's ([`Slot::cost`]); the gauges are
//! `dedupd_store_keys_in_memory` and `dedupd_store_key_memory_bytes`.

use std::hash::{BuildHasher, RandomState};
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use hashbrown::HashTable;
use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata};

use super::tables::{
    CLAIM_ROW_EXPIRY, CLAIM_ROWS, CLAIM_STATE_WITH_RESULT, KV_ROW_EXPIRY, KV_ROWS, KvRow, META,
    META_KV_NEXT_ID,
};
use crate::clock::Millis;

/// Values up to this many bytes are kept in the index as well, so reading
/// them needs no read transaction.
pub const INLINE_MAX: usize = 256;

/// Memory per key besides its bytes and its inline value's, as estimated
/// for `storage.max_key_memory_bytes`: the entry in its map with the map's
/// spare room, and the heap's rounding and headers of the two allocations.
/// Measured: about 275 bytes of resident memory per claim with a 26-byte
/// key and a 25-byte value.
pub const KEY_OVERHEAD: usize = 224;

/// Longest a read waits for the writer to run answered batches again.
const SETTLE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// How many maps a space's keys are spread over (by a keyed hash): a map
/// grows by moving every entry it holds at once, while the writer waits
/// and every write behind it. One map of 2 million keys took a second
/// there (measured: p99 of 1 s at 60 000 claims/s). With 256 maps, each
/// growth still held writes for a millisecond or two at 3 million claims
/// (p99 of 7-10 ms while they ran, 4-6 without, in 2 s slices); each of
/// 4096 holds a 4096th of the keys, so a growth moves a few hundred
/// entries. Empty maps cost 32 bytes each.
const SHARDS: usize = 4096;

/// A map below this share of its room gives half of it back (it is then
/// about half full, below every map's [`Shards::grows_at`]).
const SHRINK_BELOW: usize = 5;

/// A key in a map, with its hash (a growth moves entries without hashing
/// their keys again, and without reading them: the keys live elsewhere on
/// the heap).
#[derive(Debug)]
struct Entry {
    hash: u64,
    key: Box<[u8]>,
    slot: Slot,
}

/// A space's keys, spread over [`SHARDS`] maps.
///
/// Filled evenly by a random hash, maps that all grew at their full room
/// would all grow within a few thousand keys of each other: with 256
/// maps, at 3.6 million claims, the growths moved 3.6 million entries and
/// page faulted half a gigabyte within about a second, and claims ran at
/// half speed for four (measured in 2 s slices). So each map grows at its own
/// share of its room, from 55 % to 100 % ([`Shards::grows_at`]): the
/// growths spread over the whole doubling.
#[derive(Debug)]
struct Shards {
    /// Hashes keys, keyed per process, so nobody can aim keys at one map
    /// or one place in it. The hash picks the map from its middle bits
    /// and the place in the map from its low and high ones.
    hasher: RandomState,
    maps: Vec<HashTable<Entry>>,
    /// Keys in all maps.
    len: usize,
    /// The memory they take, estimated ([`Slot::cost`]).
    bytes: usize,
}

impl Default for Shards {
    fn default() -> Self {
        Self::new(SHARDS)
    }
}

fn rehash(entry: &Entry) -> u64 {
    entry.hash
}

impl Shards {
    /// `n` maps (the store uses [`SHARDS`]).
    fn new(n: usize) -> Self {
        Self {
            hasher: RandomState::new(),
            maps: (0..n).map(|_| HashTable::new()).collect(),
            len: 0,
            bytes: 0,
        }
    }

    fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The map of a key's hash, from bits 32-55: a map places keys by
    /// the low bits (it uses bits past 32 only past 2^32 places) and tags
    /// them with the top 7.
    fn shard(&self, hash: u64) -> usize {
        ((hash >> 32) as usize & 0xff_ffff) % self.maps.len()
    }

    /// How many keys map `at` holds when it grows, given its room: from
    /// 55 % (the first map) to 100 % (the last), evenly.
    fn grows_at(&self, at: usize, capacity: usize) -> usize {
        let n = self.maps.len();
        capacity - capacity * 45 * (n - 1 - at) / (100 * n)
    }

    fn get(&self, key: &[u8]) -> Option<&Slot> {
        let hash = self.hash(key);
        self.maps[self.shard(hash)]
            .find(hash, |e| *e.key == *key)
            .map(|e| &e.slot)
    }

    /// Sets the slot of `key`, returning the one it replaces.
    fn insert(&mut self, key: &[u8], slot: Slot) -> Option<Slot> {
        let hash = self.hash(key);
        let at = self.shard(hash);
        let grows_at = self.grows_at(at, self.maps[at].capacity());
        let map = &mut self.maps[at];
        if let Some(entry) = map.find_mut(hash, |e| *e.key == *key) {
            self.bytes = self.bytes + slot.cost(key.len()) - entry.slot.cost(key.len());
            return Some(std::mem::replace(&mut entry.slot, slot));
        }
        self.bytes += slot.cost(key.len());
        let capacity = map.capacity();
        if capacity > 0 && map.len() >= grows_at {
            // Doubles now rather than at 100 %.
            map.reserve(capacity + 1 - map.len(), rehash);
        }
        map.insert_unique(
            hash,
            Entry {
                hash,
                key: key.into(),
                slot,
            },
            rehash,
        );
        self.len += 1;
        None
    }

    /// Removes `key`; a map left at under a fifth of its room gives half
    /// of it back (a burst of short-lived claims, once reaped, does not
    /// keep its memory; one map is a 4096th of the keys, so the move is
    /// short).
    fn remove(&mut self, key: &[u8]) -> Option<Slot> {
        let hash = self.hash(key);
        let at = self.shard(hash);
        let map = &mut self.maps[at];
        let (entry, _) = map.find_entry(hash, |e| *e.key == *key).ok()?.remove();
        self.len -= 1;
        self.bytes -= entry.slot.cost(entry.key.len());
        if map.capacity() > 16 && map.len() < map.capacity() / SHRINK_BELOW {
            map.shrink_to(map.len() * 2, rehash);
        }
        Some(entry.slot)
    }

    /// Room for `n` keys in all, spread evenly (nothing for none: an
    /// empty file allocates no map).
    fn reserve(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        let each = n / self.maps.len() + 1;
        for map in &mut self.maps {
            map.reserve(each, rehash);
        }
    }
}

/// Which table a map indexes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Space {
    /// The Redis-protocol keyspace ([`KV_ROWS`]).
    Kv,
    /// Claims ([`CLAIM_ROWS`]): the key is the scoped key, the value the
    /// encoded record (`super::tables::claim_value`).
    Claims,
}

impl Space {
    /// Both, in a fixed order.
    pub const ALL: [Space; 2] = [Space::Kv, Space::Claims];

    /// Its rows, by row id.
    pub fn rows(self) -> redb::TableDefinition<'static, u64, KvRow<'static>> {
        match self {
            Space::Kv => KV_ROWS,
            Space::Claims => CLAIM_ROWS,
        }
    }

    /// Its expiry index, by (expires_at_ms, row id).
    pub fn expiry(self) -> redb::TableDefinition<'static, (u64, u64), ()> {
        match self {
            Space::Kv => KV_ROW_EXPIRY,
            Space::Claims => CLAIM_ROW_EXPIRY,
        }
    }

    fn at(self) -> usize {
        match self {
            Space::Kv => 0,
            Space::Claims => 1,
        }
    }
}

/// Where a key is, and what the index knows of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    /// Its row in [`KV_ROWS`].
    pub id: u64,
    /// When it stops existing, Unix ms (exclusive); `None`: never.
    pub expires_at_ms: Option<Millis>,
    /// The value, when at most [`INLINE_MAX`] bytes.
    pub inline: Option<Box<[u8]>>,
    /// The batch that wrote it (0: committed before the map was built). Its
    /// row is readable once that batch is committed.
    pub seq: u64,
}

impl Slot {
    /// A slot for row `id` of `space` holding `value`: as [`Slot::new`],
    /// but a claim that keeps a result is never held inline (a done's
    /// result would otherwise grow a key that is there already, past
    /// `storage.max_key_memory_bytes`, and a done is never refused for
    /// room: see `record::Request::key_growth`). It is read from its row.
    pub fn in_space(space: Space, id: u64, value: &[u8], expires_at_ms: Option<Millis>) -> Self {
        let mut slot = Self::new(id, value, expires_at_ms);
        if space == Space::Claims && value.first() == Some(&CLAIM_STATE_WITH_RESULT) {
            slot.inline = None;
        }
        slot
    }

    /// A slot for row `id` holding `value`.
    pub fn new(id: u64, value: &[u8], expires_at_ms: Option<Millis>) -> Self {
        Self {
            id,
            expires_at_ms,
            inline: (value.len() <= INLINE_MAX).then(|| value.into()),
            seq: 0,
        }
    }

    /// The memory a key of `key_len` bytes with this slot takes, estimated:
    /// [`KEY_OVERHEAD`] plus the key and the inline value.
    pub fn cost(&self, key_len: usize) -> usize {
        KEY_OVERHEAD + key_len + self.inline.as_ref().map_or(0, |v| v.len())
    }

    /// True while the key exists at `now`.
    pub fn is_live(&self, now: Millis) -> bool {
        self.expires_at_ms.is_none_or(|at| at > now)
    }
}

/// The index, shared by the writer (which changes it) and readers.
#[derive(Debug, Default)]
pub struct KvIndex {
    inner: RwLock<Inner>,
}

/// The map and what the writer keeps beside it.
#[derive(Debug, Default)]
pub struct Inner {
    /// One map per [`Space`], at [`Space::at`].
    maps: [Shards; 2],
    /// The next row id to hand out.
    next_id: u64,
    /// The last batch that changed each space's map, at [`Space::at`]
    /// (readers wait for it: a read of a key waits for no batch of the
    /// other space).
    seq: [u64; 2],
    /// How to undo the batches since the last commit (`None` right after
    /// one).
    batch: Option<Undo>,
    /// Set while the writer runs answered batches again after a later one
    /// failed: the map is behind what was answered until it is done, so
    /// readers wait ([`KvIndex::settled`]).
    redoing: bool,
}

/// How to put the map back as it was at the last commit.
#[derive(Debug)]
struct Undo {
    /// The running batch's sequence number.
    seq: u64,
    /// `next_id` and `seq` at the last commit.
    next_id: u64,
    prev_seq: [u64; 2],
    /// Each key it changed, with its space and its slot before, oldest
    /// first.
    slots: Vec<(Space, Box<[u8]>, Option<Slot>)>,
}

impl Inner {
    /// The slot of `key` in `space`, expired or not.
    pub fn get(&self, space: Space, key: &[u8]) -> Option<&Slot> {
        self.maps[space.at()].get(key)
    }

    /// How many keys `space` holds (expired ones not yet reaped included).
    pub fn len(&self, space: Space) -> usize {
        self.maps[space.at()].len
    }

    /// The memory the keys of `space` take, estimated ([`Slot::cost`]).
    pub fn bytes(&self, space: Space) -> usize {
        self.maps[space.at()].bytes
    }

    /// The last batch that changed the map of `space`.
    pub fn seq(&self, space: Space) -> u64 {
        self.seq[space.at()]
    }

    /// A new row id.
    pub fn allocate(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Sets the slot of `key` in `space` (as written by the running batch).
    pub fn put(&mut self, space: Space, key: &[u8], mut slot: Slot) {
        slot.seq = self.batch.as_ref().map_or(self.seq[space.at()], |u| u.seq);
        let before = self.maps[space.at()].insert(key, slot);
        self.record(space, key, before);
    }

    pub fn remove(&mut self, space: Space, key: &[u8]) {
        let before = self.maps[space.at()].remove(key);
        self.record(space, key, before);
    }

    fn record(&mut self, space: Space, key: &[u8], before: Option<Slot>) {
        if let Some(undo) = self.batch.as_mut() {
            self.seq[space.at()] = undo.seq;
            undo.slots.push((space, key.into(), before));
        }
    }
}

impl KvIndex {
    /// The map, for reading.
    pub fn read(&self) -> RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The map for reading once it shows every answered batch: after a
    /// failed batch, the writer runs the ones before it again (a few
    /// milliseconds). Blocking; `None` if that takes longer than
    /// [`SETTLE_WAIT`].
    pub fn settled(&self) -> Option<RwLockReadGuard<'_, Inner>> {
        let deadline = std::time::Instant::now() + SETTLE_WAIT;
        loop {
            let inner = self.read();
            if !inner.redoing {
                return Some(inner);
            }
            drop(inner);
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }

    /// The answered batches were run again: readers may look.
    pub fn redone(&self) {
        self.write().redoing = false;
    }

    /// The map, for the writer.
    pub fn write(&self) -> RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Replaces the maps with the keyspace and the claims as `db` holds
    /// them; `seq` is the last batch the file holds.
    pub fn rebuild(&self, db: &Database, seq: u64) -> Result<(), redb::Error> {
        let tx = db.begin_read()?;
        let mut maps: [Shards; 2] = Default::default();
        let mut next_id = 1;
        for space in Space::ALL {
            let rows = tx.open_table(space.rows())?;
            let map = &mut maps[space.at()];
            map.reserve(usize::try_from(rows.len()?).unwrap_or(0));
            for entry in rows.iter()? {
                let (id, row) = entry?;
                let (key, value, expires) = row.value();
                map.insert(key, Slot::in_space(space, id.value(), value, expires));
                next_id = next_id.max(id.value() + 1);
            }
        }
        // The stored counter is never behind the rows; it is ahead when the
        // last rows handed out were deleted since.
        let stored = tx
            .open_table(META)?
            .get(META_KV_NEXT_ID)?
            .map_or(1, |g| g.value());
        *self.write() = Inner {
            maps,
            next_id: next_id.max(stored),
            seq: [seq; 2],
            batch: None,
            redoing: false,
        };
        Ok(())
    }

    /// A batch with sequence number `seq` begins: what it changes can be
    /// undone until [`KvIndex::keep`]. In a transaction that holds several
    /// batches, the undo covers them all (back to the last commit).
    pub fn begin(&self, seq: u64) {
        let mut inner = self.write();
        let (next_id, prev_seq) = (inner.next_id, inner.seq);
        inner
            .batch
            .get_or_insert_with(|| Undo {
                seq,
                next_id,
                prev_seq,
                slots: Vec::new(),
            })
            .seq = seq;
    }

    /// The next row id to store, if the batches since the last commit
    /// handed out any.
    pub fn next_id_moved(&self) -> Option<u64> {
        let inner = self.read();
        inner
            .batch
            .as_ref()
            .filter(|u| u.next_id != inner.next_id)
            .map(|_| inner.next_id)
    }

    /// The batches since the last commit were committed.
    pub fn keep(&self) {
        self.write().batch = None;
    }

    /// The transaction was dropped: puts back what every batch since the
    /// last commit changed. True if they had changed anything (a read may
    /// have seen it). With `redo`, readers wait until [`KvIndex::redone`]:
    /// the writer runs the answered batches among them again.
    pub fn rollback(&self, redo: bool) -> bool {
        let mut inner = self.write();
        inner.redoing = redo;
        let Some(undo) = inner.batch.take() else {
            return false;
        };
        let changed = !undo.slots.is_empty();
        for (space, key, before) in undo.slots.into_iter().rev() {
            let map = &mut inner.maps[space.at()];
            match before {
                Some(slot) => map.insert(&key, slot),
                None => map.remove(&key),
            };
        }
        inner.next_id = undo.next_id;
        inner.seq = undo.prev_seq;
        changed
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::mpsc;
    use std::time::Duration;

    use super::{KvIndex, Slot, Space};

    #[test]
    fn readers_wait_while_answered_batches_run_again() {
        let index = Arc::new(KvIndex::default());
        index.begin(1);
        index
            .write()
            .put(Space::Kv, b"k", Slot::new(1, b"answered", None));
        // A later batch failed: the map goes back to the last commit, and
        // the answered batch is run again.
        assert!(index.rollback(true));
        let (tx, rx) = mpsc::channel();
        let reader = {
            let index = index.clone();
            std::thread::spawn(move || {
                let seen = index.settled().map(|ix| ix.get(Space::Kv, b"k").is_some());
                tx.send(seen).unwrap();
            })
        };
        // Until the writer says it is done, no reader sees the older map
        // (a correct index never answers here, however long this waits).
        assert!(
            rx.recv_timeout(Duration::from_millis(100)).is_err(),
            "a reader saw the map while answered batches were missing from it"
        );
        index.begin(1);
        index
            .write()
            .put(Space::Kv, b"k", Slot::new(1, b"answered", None));
        index.redone();
        assert_eq!(
            rx.recv().unwrap(),
            Some(true),
            "the reader sees the redone batch"
        );
        reader.join().unwrap();
    }

    /// The keyspace and the claims are separate maps (the same key in both
    /// is two keys), and a dropped transaction puts both back.
    #[test]
    fn a_rollback_puts_back_both_spaces_and_they_never_mix() {
        let index = KvIndex::default();
        index.begin(1);
        index
            .write()
            .put(Space::Kv, b"k", Slot::new(1, b"kept", None));
        index
            .write()
            .put(Space::Claims, b"k", Slot::new(2, b"claim", Some(10)));
        index.keep();
        index.begin(2);
        {
            let mut ix = index.write();
            ix.remove(Space::Kv, b"k");
            ix.put(Space::Claims, b"k", Slot::new(2, b"changed", Some(20)));
            // Enough keys that several of the maps they are spread over
            // grow inside the batch.
            for i in 0..10_000u32 {
                ix.put(Space::Claims, &i.to_be_bytes(), Slot::new(3, b"x", None));
            }
        }
        let ix = index.read();
        assert_eq!(ix.get(Space::Kv, b"k"), None);
        assert_eq!(
            ix.get(Space::Claims, b"k")
                .and_then(|s| s.inline.as_deref()),
            Some(&b"changed"[..])
        );
        drop(ix);
        assert!(index.rollback(false));
        let ix = index.read();
        assert_eq!(
            ix.get(Space::Kv, b"k").and_then(|s| s.inline.as_deref()),
            Some(&b"kept"[..])
        );
        let claim = ix.get(Space::Claims, b"k").unwrap();
        assert_eq!(
            (claim.inline.as_deref(), claim.expires_at_ms),
            (Some(&b"claim"[..]), Some(10))
        );
        assert!((0..10_000u32).all(|i| ix.get(Space::Claims, &i.to_be_bytes()).is_none()));
        assert_eq!(
            (ix.len(Space::Kv), ix.len(Space::Claims)),
            (1, 1),
            "the counts go back too"
        );
        assert_eq!(
            (ix.bytes(Space::Kv), ix.bytes(Space::Claims)),
            (super::KEY_OVERHEAD + 1 + 4, super::KEY_OVERHEAD + 1 + 5),
            "and the memory: each key and its inline value"
        );
        assert_eq!(ix.seq(Space::Kv), 1, "back to the last kept batch");
        assert_eq!(ix.seq(Space::Claims), 1);
    }

    /// Maps filled evenly do not all grow at once: each grows at its own
    /// share of its room, so one doubling's growths spread over many keys
    /// (when they all grew at 100 %, the 256 growths fell within a few
    /// thousand keys, and claims ran at half speed for seconds).
    #[test]
    fn the_maps_growths_spread_over_a_doubling() {
        // 256 maps, so that each holds enough keys for the growths of maps
        // that all grew at 100 % to fall close together.
        let mut shards = super::Shards::new(256);
        let mut rooms: Vec<usize> = shards.maps.iter().map(|m| m.capacity()).collect();
        // Where (in keys inserted) maps of at least 1 000 keys' room grew.
        let mut growths = Vec::new();
        for i in 0..700_000u32 {
            shards.insert(&i.to_le_bytes(), Slot::new(u64::from(i), b"", None));
            let at = shards.shard(shards.hash(&i.to_le_bytes()));
            let room = shards.maps[at].capacity();
            if room != rooms[at] {
                if rooms[at] >= 1_000 {
                    growths.push(i);
                }
                rooms[at] = room;
            }
        }
        assert!(growths.len() >= 256, "{} growths", growths.len());
        // A window of 20 000 keys holds at most a quarter of one doubling's
        // 256 growths (about 25 when spread evenly).
        let busiest = growths
            .iter()
            .map(|&from| {
                growths
                    .iter()
                    .filter(|&&g| g >= from && g < from + 20_000)
                    .count()
            })
            .max()
            .unwrap();
        assert!(busiest <= 64, "{busiest} maps grew within 20 000 keys");
        for i in (0..700_000u32).step_by(997) {
            assert_eq!(
                shards.get(&i.to_le_bytes()).map(|s| s.id),
                Some(u64::from(i))
            );
        }
    }

    /// A burst of keys, once removed, gives its memory back.
    #[test]
    fn maps_emptied_by_removals_give_their_room_back() {
        let index = KvIndex::default();
        let room = |index: &KvIndex| -> usize {
            let ix = index.read();
            ix.maps[Space::Claims.at()]
                .maps
                .iter()
                .map(hashbrown::HashTable::capacity)
                .sum()
        };
        let keys: Vec<[u8; 4]> = (0..400_000u32).map(u32::to_be_bytes).collect();
        {
            let mut ix = index.write();
            for k in &keys {
                ix.put(Space::Claims, k, Slot::new(1, b"x", None));
            }
        }
        let full = room(&index);
        assert!(full >= 400_000, "{full}");
        {
            let mut ix = index.write();
            for k in &keys {
                ix.remove(Space::Claims, k);
            }
        }
        let after = room(&index);
        assert!(
            after < full / 8,
            "room for {full} keys before, {after} after every key went"
        );
    }
}
