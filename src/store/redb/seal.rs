//! Sealed events: what makes an erasure erase from the files.
//!
//! redb never overwrites a page in place: each write puts the changed pages
//! somewhere else and frees the old ones, whose bytes stay in the file until
//! a later write happens to reuse them. The write-ahead log keeps its old
//! records past its end the same way. So deleting a body from the tables
//! leaves it readable on disk for as long as nothing else lands there, in
//! every backup and disk image taken meanwhile.
//!
//! So the inbox never stores an event's headers and body as they came: it
//! stores them **sealed** (AES-256-GCM) under a key of their own, drawn at
//! random for that one row, and keeps the keys in one small file of fixed
//! slots, `dedupd.redb.keys`, which dedupd overwrites in place. Erasing an
//! event overwrites its slot with a fresh random key and syncs the file
//! before the erasure is answered: every sealed copy left anywhere (freed
//! pages, old log records, the page cache of a process that read it) no
//! longer opens. The same happens to each row the reaper deletes, and to
//! each seal a write drew but never stored (a duplicate, a failed batch).
//!
//! The rule the slots keep: **a slot's key seals one row, once.** A slot is
//! *clean* (a fresh key, synced, never used), *lent* (drawn by a caller for
//! a seal that may become a row), *in use* (its row's entry in the
//! `inbox_seals` table), or *dirty* (its row is gone, or its seal was never
//! stored: the old key is still there). A dirty slot becomes clean only by
//! [`Seals::shred`], which writes a fresh key over it and syncs. So once an
//! erasure is answered, every key in the file is the key of a live row or
//! one that never sealed anything.
//!
//! At open, every slot no row uses is shredded (what was lent or dirty
//! when the process stopped is unknown), and free slots past the last one
//! in use are cut off the file.
//!
//! The file: a 32-byte header (`DDKEYS1\n`, the data file's id as a u128
//! LE, a crc32 of the 24 bytes before, 4 zero bytes), then slots of 32
//! bytes, slot `n` at byte `32 + 32 n`. A slot never straddles a 512-byte
//! sector, so a torn write of one slot leaves its neighbours as they were.
//!
//! A seal: `DDSEAL1\0 | slot: u64 LE | len: u32 LE | nonce: 12 bytes |
//! ciphertext and tag (len bytes)`, the first 20 bytes authenticated as
//! associated data. The plaintext is `headers' length: u32 LE | headers as
//! JSON | body`.
//!
//! What it does not cover, and the docs say so: a copy-on-write filesystem
//! (btrfs, ZFS) or an SSD's flash translation may keep an overwritten key's
//! old block on the device, below the file; a backup of the key file taken
//! before an erasure still opens that event's seals.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};

use super::OWNER_ONLY;
use super::faults::FaultPlan;

/// Bytes of a key.
pub const KEY_LEN: usize = 32;
/// The key file's first bytes.
const FILE_MAGIC: &[u8; 8] = b"DDKEYS1\n";
/// Bytes of the key file's header.
pub const HEADER: u64 = 32;
/// Slots a growing key file gains at a time (32 KiB of keys, one sync).
const GROW_SLOTS: u64 = 1024;
/// A seal's first bytes.
pub const SEAL_MAGIC: &[u8; 8] = b"DDSEAL1\0";
/// Bytes before a seal's ciphertext: magic, slot, length, nonce.
const SEAL_HEADER: usize = 8 + 8 + 4 + 12;
/// Bytes of the authenticated part of that header: magic, slot, length.
const SEAL_AAD: usize = 8 + 8 + 4;

/// The key file's path for a data file: `dedupd.redb` → `dedupd.redb.keys`.
pub fn path_for(data: &Path) -> PathBuf {
    let mut p = data.as_os_str().to_owned();
    p.push(".keys");
    PathBuf::from(p)
}

/// Why the key file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The data file holds sealed events and there is no key file.
    #[error("missing")]
    Missing,
    /// The file does not start with a key file's header.
    #[error("not a dedupd key file")]
    NotKeys,
    /// The key file belongs to another data file.
    #[error("it belongs to data file {0:032x}")]
    Foreign(u128),
    /// A row's slot is past the end of the file.
    #[error("the data file uses key slot {slot}, but the key file holds {slots} slots")]
    Short {
        /// The slot a row uses.
        slot: u64,
        /// Slots in the file.
        slots: u64,
    },
}

/// Why a seal does not open.
#[derive(Debug, thiserror::Error)]
pub enum OpenSealError {
    #[error("it is not a seal")]
    Malformed,
    #[error("its key slot {0} is past the end of the key file")]
    NoSlot(u64),
    #[error(
        "its key does not open it (the key file is not the one it was sealed with, or the key was shredded)"
    )]
    WrongKey,
    #[error("reading its key: {0}")]
    Io(#[from] std::io::Error),
}

/// What an event's seal holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    /// Its headers.
    pub headers: Vec<(String, String)>,
    /// Its body.
    pub body: Vec<u8>,
}

/// The slots' states that live in memory (those in use are the
/// `inbox_seals` table's).
#[derive(Debug, Default)]
struct Slots {
    /// Slots in the file.
    len: u64,
    /// Free, with a fresh synced key: may be lent.
    clean: Vec<u64>,
    /// Free, with the key of a seal still in them: shred before reuse.
    dirty: Vec<u64>,
    /// Lent to seals whose batch was logged, then refused: not stored,
    /// but a crash before the log is started over could replay them, so
    /// neither shredded nor lent again until then.
    held: Vec<u64>,
}

/// The key file and its slots.
#[derive(Debug)]
pub struct Seals {
    file: File,
    faults: Option<Arc<FaultPlan>>,
    slots: Mutex<Slots>,
    /// Held while the file grows, so callers that find no clean slot grow
    /// it once between them.
    growing: Mutex<()>,
    /// Held for a whole shred, writes and sync: a shred that finds nothing
    /// retired returns only once the one before it (which may have taken
    /// its slots) is synced.
    shredding: Mutex<()>,
    /// Slots in use whose seal did not open, reported once
    /// ([`Seals::damaged`]).
    reported: Mutex<HashSet<u64>>,
}

/// The most slots [`Seals::damaged`] reports in a process: a key file
/// wrong for every pending event is said by the first lines.
const MAX_REPORTED: usize = 1024;

impl Seals {
    /// Opens (or creates) the key file of the data file at `data`, whose
    /// id is `id`, and shreds every slot not in `used` (the slots of the
    /// file's rows). With rows in `used`, a missing key file is refused
    /// rather than created.
    pub fn open(
        data: &Path,
        id: u128,
        used: &HashSet<u64>,
        faults: Option<Arc<FaultPlan>>,
    ) -> Result<Self, KeysError> {
        let path = path_for(data);
        let exists = std::fs::metadata(&path).is_ok_and(|m| m.len() > 0);
        if !exists && !used.is_empty() {
            return Err(KeysError::Missing);
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(OWNER_ONLY)
            .open(&path)?;
        if exists {
            let mut header = [0u8; HEADER as usize];
            file.read_exact_at(&mut header, 0)
                .map_err(|_| KeysError::NotKeys)?;
            match read_header(&header) {
                Some(found) if found == id => {}
                Some(found) => return Err(KeysError::Foreign(found)),
                None => return Err(KeysError::NotKeys),
            }
        } else {
            file.set_len(0)?;
            file.write_all_at(&header(id), 0)?;
            file.sync_all()?;
            if let Some(dir) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                File::open(dir)?.sync_all()?;
            }
        }
        let len = (file.metadata()?.len().saturating_sub(HEADER)) / KEY_LEN as u64;
        if let Some(&slot) = used.iter().find(|&&s| s >= len) {
            return Err(KeysError::Short { slot, slots: len });
        }
        let seals = Self {
            file,
            faults,
            slots: Mutex::new(Slots {
                len,
                ..Slots::default()
            }),
            growing: Mutex::new(()),
            shredding: Mutex::new(()),
            reported: Mutex::new(HashSet::new()),
        };
        seals.start_over(used)?;
        Ok(seals)
    }

    /// Checks, without writing anything, that the key file beside `data`
    /// is there and belongs to data file `id` (for a data file that holds
    /// sealed rows, before anything is written to it).
    pub fn check(data: &Path, id: u128) -> Result<(), KeysError> {
        let path = path_for(data);
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(KeysError::Missing),
            Err(e) => return Err(KeysError::Io(e)),
        };
        let mut header = [0u8; HEADER as usize];
        file.read_exact_at(&mut header, 0)
            .map_err(|_| KeysError::NotKeys)?;
        match read_header(&header) {
            Some(found) if found == id => Ok(()),
            Some(found) => Err(KeysError::Foreign(found)),
            None => Err(KeysError::NotKeys),
        }
    }

    /// Shreds every slot not in `used`, cuts those past the last one in
    /// `used` off the file, and makes the others the clean ones.
    fn start_over(&self, used: &HashSet<u64>) -> std::io::Result<()> {
        let keep = used.iter().max().map_or(0, |m| m + 1);
        let mut slots = self.lock();
        // Every slot no row uses gets a fresh key, those cut off too: a cut
        // leaves the old bytes in the filesystem's free blocks.
        let free: Vec<u64> = (0..slots.len).filter(|s| !used.contains(s)).collect();
        self.write_fresh(&free)?;
        fault(self.faults.as_ref(), true)?;
        self.file.sync_data()?;
        if keep < slots.len {
            fault(self.faults.as_ref(), false)?;
            self.file.set_len(HEADER + keep * KEY_LEN as u64)?;
            slots.len = keep;
        }
        self.file.sync_all()?;
        slots.clean = free.into_iter().filter(|s| *s < keep).collect();
        slots.dirty.clear();
        slots.held.clear();
        Ok(())
    }

    /// Seals `headers` and `body` under the key of a slot lent for it:
    /// `(slot, seal)`. The slot must be given back ([`Seals::retire`]) if
    /// the seal is not stored.
    pub fn seal(
        &self,
        headers: &[(String, String)],
        body: &[u8],
    ) -> std::io::Result<(u64, Vec<u8>)> {
        let slot = self.lend()?;
        match self.seal_in(slot, headers, body) {
            Ok(seal) => Ok((slot, seal)),
            Err(e) => {
                self.retire([slot]);
                Err(e)
            }
        }
    }

    /// [`Seals::seal`] with a clean slot there now; `None` when there is
    /// none (the caller then seals off the async threads, where a lend may
    /// shred or grow the file).
    pub fn seal_now(
        &self,
        headers: &[(String, String)],
        body: &[u8],
    ) -> Option<std::io::Result<(u64, Vec<u8>)>> {
        let slot = self.lend_now()?;
        Some(match self.seal_in(slot, headers, body) {
            Ok(seal) => Ok((slot, seal)),
            Err(e) => {
                self.retire([slot]);
                Err(e)
            }
        })
    }

    fn seal_in(
        &self,
        slot: u64,
        headers: &[(String, String)],
        body: &[u8],
    ) -> std::io::Result<Vec<u8>> {
        seal_with(slot, &self.key(slot)?, headers, body)
    }

    /// Opens a seal with its slot's key.
    pub fn open_seal(&self, seal: &[u8]) -> Result<Opened, OpenSealError> {
        let (slot, _) = seal_header(seal).ok_or(OpenSealError::Malformed)?;
        if slot >= self.lock().len {
            return Err(OpenSealError::NoSlot(slot));
        }
        open_with(seal, &self.key(slot)?)
    }

    /// Whether a seal of `slot` that did not open is to be reported as
    /// damage, not a race: the slot is in use (not retired, shredded,
    /// free or held: an erasure or the reaper after the read began
    /// retires its row's slot before shredding it) and no shred is under
    /// way (one holds the slots it writes in neither list). True once per
    /// slot and process; false while a shred runs (the next read asks
    /// again).
    pub fn damaged(&self, slot: u64) -> bool {
        let mut reported = self.reported.lock().unwrap_or_else(|p| p.into_inner());
        if reported.contains(&slot) || reported.len() >= MAX_REPORTED {
            return false;
        }
        let Ok(_no_shred) = self.shredding.try_lock() else {
            return false;
        };
        let slots = self.lock();
        let in_use = slot < slots.len
            && ![&slots.clean, &slots.dirty, &slots.held]
                .iter()
                .any(|list| list.contains(&slot));
        in_use && reported.insert(slot)
    }

    /// Runs `take` (which begins a snapshot of the data file) with no
    /// shred under way, and returns what it returns with every key of
    /// the file as they are then (slot `n` at `32 n`). A slot in use by a
    /// row the snapshot sees holds that row's key: it is shredded only
    /// after the batch that deleted its row was synced, and `take` must
    /// first make every batch synced so far visible (see
    /// `backup::snapshot`). Shreds (an erasure's answer, a lend that
    /// found no clean slot) wait meanwhile: `take` is one commit of the
    /// writer at most, and the read is of 32 bytes a slot.
    pub fn keys_for<T>(&self, take: impl FnOnce() -> T) -> (T, std::io::Result<Vec<u8>>) {
        let _no_shred = self.shredding.lock().unwrap_or_else(|p| p.into_inner());
        let taken = take();
        let len = self.lock().len;
        let keys = usize::try_from(len * KEY_LEN as u64)
            .map_err(std::io::Error::other)
            .and_then(|n| {
                let mut keys = vec![0u8; n];
                self.file.read_exact_at(&mut keys, HEADER)?;
                Ok(keys)
            });
        (taken, keys)
    }

    /// Runs `read` (which begins a read transaction and opens seals it
    /// finds) with no shred under way: a seal of a row the transaction
    /// sees opens, though a batch that replaced the row was synced
    /// meanwhile (its shred waits). For reads of rows whose every new
    /// version retires the one before (a bulk job's record), not of
    /// events: a read is microseconds, a shred waits for it.
    pub fn unshredded<T>(&self, read: impl FnOnce() -> T) -> T {
        let _no_shred = self.shredding.lock().unwrap_or_else(|p| p.into_inner());
        read()
    }

    /// Gives slots back whose seals are gone or were never stored: they
    /// are shredded before they are lent again.
    pub fn retire(&self, slots: impl IntoIterator<Item = u64>) {
        self.lock().dirty.extend(slots);
    }

    /// Holds slots lent to seals that were logged and then refused (see
    /// [`Slots::held`]) until [`Seals::release_held`].
    pub fn hold(&self, slots: impl IntoIterator<Item = u64>) {
        self.lock().held.extend(slots);
    }

    /// The log was started over: what was held is retired.
    pub fn release_held(&self) {
        let mut slots = self.lock();
        let held = std::mem::take(&mut slots.held);
        slots.dirty.extend(held);
    }

    /// Writes a fresh key over every retired slot and syncs the file:
    /// the seals they made no longer open. Returns how many were shredded.
    /// On an error they stay retired (a later shred writes them again).
    pub fn shred(&self) -> std::io::Result<usize> {
        let _one = self.shredding.lock().unwrap_or_else(|p| p.into_inner());
        let dirty = std::mem::take(&mut self.lock().dirty);
        if dirty.is_empty() {
            return Ok(0);
        }
        let done = self.write_fresh(&dirty).and_then(|()| {
            fault(self.faults.as_ref(), true)?;
            self.file.sync_data()
        });
        let mut slots = self.lock();
        match done {
            Ok(()) => {
                let n = dirty.len();
                slots.clean.extend(dirty);
                Ok(n)
            }
            Err(e) => {
                slots.dirty.extend(dirty);
                Err(e)
            }
        }
    }

    /// Whether every slot retired so far is shredded and synced: none is
    /// waiting, and no shred (which may hold some) is under way.
    pub fn shredded(&self) -> bool {
        // The shred's lock first: one that failed puts its slots back
        // before it lets go.
        match self.shredding.try_lock() {
            Ok(_none_under_way) => self.lock().dirty.is_empty(),
            Err(_) => false,
        }
    }

    /// A clean slot, growing the file when there is none (shredding the
    /// retired ones first, if any).
    fn lend(&self) -> std::io::Result<u64> {
        loop {
            if let Some(slot) = self.lock().clean.pop() {
                return Ok(slot);
            }
            let _one = self.growing.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(slot) = self.lock().clean.pop() {
                return Ok(slot);
            }
            if self.shred()? == 0 {
                self.grow()?;
            }
            // Other callers may take what was made before this one looks:
            // it makes more.
        }
    }

    /// A clean slot if one is there now (no shred, no growth: nothing
    /// that writes or waits for the disk).
    fn lend_now(&self) -> Option<u64> {
        self.lock().clean.pop()
    }

    /// Adds [`GROW_SLOTS`] slots of fresh keys, synced.
    fn grow(&self) -> std::io::Result<()> {
        let from = self.lock().len;
        let new: Vec<u64> = (from..from + GROW_SLOTS).collect();
        self.write_fresh(&new)?;
        fault(self.faults.as_ref(), true)?;
        // The file's size changed: its metadata too.
        self.file.sync_all()?;
        let mut slots = self.lock();
        slots.len = from + GROW_SLOTS;
        slots.clean.extend(new.into_iter().rev());
        Ok(())
    }

    /// Writes fresh random keys into `slots` (not synced), a run of
    /// consecutive slots at a time.
    fn write_fresh(&self, slots: &[u64]) -> std::io::Result<()> {
        let mut sorted = slots.to_vec();
        sorted.sort_unstable();
        let mut i = 0;
        while i < sorted.len() {
            let mut end = i + 1;
            while end < sorted.len() && sorted[end] == sorted[end - 1] + 1 && end - i < 4096 {
                end += 1;
            }
            let mut keys = vec![0u8; (end - i) * KEY_LEN];
            rand::fill(&mut keys[..]);
            fault(self.faults.as_ref(), false)?;
            self.file.write_all_at(&keys, offset(sorted[i]))?;
            i = end;
        }
        Ok(())
    }

    /// A slot's key, read from the file.
    fn key(&self, slot: u64) -> std::io::Result<[u8; KEY_LEN]> {
        let mut key = [0u8; KEY_LEN];
        self.file.read_exact_at(&mut key, offset(slot))?;
        Ok(key)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Where slot `n` starts.
fn offset(slot: u64) -> u64 {
    HEADER + slot * KEY_LEN as u64
}

/// The key file's header for data file `id`.
pub fn header(id: u128) -> [u8; HEADER as usize] {
    let mut h = [0u8; HEADER as usize];
    h[..8].copy_from_slice(FILE_MAGIC);
    h[8..24].copy_from_slice(&id.to_le_bytes());
    let crc = crc32fast::hash(&h[..24]);
    h[24..28].copy_from_slice(&crc.to_le_bytes());
    h
}

/// The data file id a key file's header names; `None` when it is not one.
fn read_header(h: &[u8; HEADER as usize]) -> Option<u128> {
    if &h[..8] != FILE_MAGIC || crc32fast::hash(&h[..24]).to_le_bytes() != h[24..28] {
        return None;
    }
    Some(u128::from_le_bytes(h[8..24].try_into().ok()?))
}

/// Seals `headers` and `body` under `key`, the key of `slot` (see the
/// module doc for the format).
pub fn seal_with(
    slot: u64,
    key: &[u8; KEY_LEN],
    headers: &[(String, String)],
    body: &[u8],
) -> std::io::Result<Vec<u8>> {
    let headers = serde_json::to_vec(headers).map_err(std::io::Error::other)?;
    let headers_len = u32::try_from(headers.len())
        .map_err(|_| std::io::Error::other("headers of 4 GiB or more"))?;
    let mut plain = Vec::with_capacity(4 + headers.len() + body.len());
    plain.extend_from_slice(&headers_len.to_le_bytes());
    plain.extend_from_slice(&headers);
    plain.extend_from_slice(body);
    // 16 bytes of tag follow the ciphertext.
    let len = u32::try_from(plain.len() + 16)
        .map_err(|_| std::io::Error::other("a body of 4 GiB or more"))?;
    let nonce: [u8; 12] = rand::random();
    let mut seal = Vec::with_capacity(SEAL_HEADER + plain.len() + 16);
    seal.extend_from_slice(SEAL_MAGIC);
    seal.extend_from_slice(&slot.to_le_bytes());
    seal.extend_from_slice(&len.to_le_bytes());
    seal.extend_from_slice(&nonce);
    let cipher = Aes256Gcm::new(key.into());
    let sealed = cipher
        .encrypt(
            Nonce::from_slice(&nonce),
            Payload {
                msg: &plain,
                aad: &seal[..SEAL_AAD],
            },
        )
        .map_err(|_| std::io::Error::other("the body could not be sealed"))?;
    seal.extend_from_slice(&sealed);
    Ok(seal)
}

/// A seal's slot and the length of its ciphertext and tag.
pub fn seal_header(seal: &[u8]) -> Option<(u64, usize)> {
    if seal.len() < SEAL_HEADER || &seal[..8] != SEAL_MAGIC {
        return None;
    }
    let slot = u64::from_le_bytes(seal[8..16].try_into().ok()?);
    let len = u32::from_le_bytes(seal[16..20].try_into().ok()?) as usize;
    Some((slot, len))
}

/// Opens `seal` with `key` (the key of the slot its header names).
pub fn open_with(seal: &[u8], key: &[u8]) -> Result<Opened, OpenSealError> {
    let (_, len) = seal_header(seal).ok_or(OpenSealError::Malformed)?;
    if seal.len() != SEAL_HEADER + len || key.len() != KEY_LEN {
        return Err(OpenSealError::Malformed);
    }
    let cipher = Aes256Gcm::new(key.into());
    let plain = cipher
        .decrypt(
            Nonce::from_slice(&seal[SEAL_AAD..SEAL_HEADER]),
            Payload {
                msg: &seal[SEAL_HEADER..],
                aad: &seal[..SEAL_AAD],
            },
        )
        .map_err(|_| OpenSealError::WrongKey)?;
    let (headers_len, rest) = plain
        .split_first_chunk::<4>()
        .ok_or(OpenSealError::Malformed)?;
    let headers_len = u32::from_le_bytes(*headers_len) as usize;
    if rest.len() < headers_len {
        return Err(OpenSealError::Malformed);
    }
    let (headers, body) = rest.split_at(headers_len);
    Ok(Opened {
        headers: serde_json::from_slice(headers).map_err(|_| OpenSealError::Malformed)?,
        body: body.to_vec(),
    })
}

fn fault(faults: Option<&Arc<FaultPlan>>, sync: bool) -> std::io::Result<()> {
    match faults {
        Some(plan) if plan.trip(sync) => Err(FaultPlan::disk_full()),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: u128 = 0x0123_4567_89ab_cdef_0011_2233_4455_6677;

    fn headers() -> Vec<(String, String)> {
        vec![("x-marker".into(), "h-secret".into())]
    }

    fn scratch() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("dedupd.redb");
        (dir, data)
    }

    #[test]
    fn a_seal_opens_with_its_key_and_hides_what_it_holds() {
        let (_dir, data) = scratch();
        let seals = Seals::open(&data, ID, &HashSet::new(), None).expect("open");
        let (slot, seal) = seals.seal(&headers(), b"body-secret").expect("seal");
        assert!(!seal.windows(11).any(|w| w == b"body-secret"));
        assert!(!seal.windows(8).any(|w| w == b"h-secret"));
        assert_eq!(seal_header(&seal).map(|(s, _)| s), Some(slot));
        let opened = seals.open_seal(&seal).expect("opens");
        assert_eq!(opened.headers, headers());
        assert_eq!(opened.body, b"body-secret");
    }

    #[test]
    fn a_shredded_slot_no_longer_opens_its_seal_and_is_lent_again() {
        let (_dir, data) = scratch();
        let seals = Seals::open(&data, ID, &HashSet::new(), None).expect("open");
        let (slot, seal) = seals.seal(&headers(), b"body").expect("seal");
        seals.retire([slot]);
        // Retired but not shredded: not lent again, and still opens.
        let (other, _) = seals.seal(&[], b"x").expect("seal");
        assert_ne!(other, slot);
        assert!(seals.open_seal(&seal).is_ok());
        assert_eq!(seals.shred().expect("shred"), 1);
        assert!(matches!(
            seals.open_seal(&seal),
            Err(OpenSealError::WrongKey)
        ));
        // Each seal has its own slot.
        let mut lent = HashSet::new();
        for _ in 0..(GROW_SLOTS * 2) {
            assert!(lent.insert(seals.seal(&[], b"").expect("seal").0));
        }
        assert!(lent.contains(&slot), "a shredded slot is lent again");
    }

    /// A seal that does not open because its row was erased after the read
    /// began (its slot retired, then shredded) is a race, never reported;
    /// one whose slot is still in use is damage, reported once.
    #[test]
    fn only_a_slot_in_use_is_reported_damaged_and_once() {
        let (_dir, data) = scratch();
        let seals = Seals::open(&data, ID, &HashSet::new(), None).expect("open");
        let (erased, _) = seals.seal(&headers(), b"body").expect("seal");
        let (in_use, _) = seals.seal(&headers(), b"body").expect("seal");
        seals.retire([erased]);
        assert!(!seals.damaged(erased), "retired, not yet shredded");
        seals.shred().expect("shred");
        assert!(!seals.damaged(erased), "shredded");
        assert!(!seals.damaged(GROW_SLOTS * 4), "past the file's slots");
        assert!(seals.damaged(in_use));
        assert!(!seals.damaged(in_use), "reported once");
    }

    #[test]
    fn a_seal_changed_anywhere_does_not_open() {
        let (_dir, data) = scratch();
        let seals = Seals::open(&data, ID, &HashSet::new(), None).expect("open");
        let (_, seal) = seals.seal(&headers(), b"body").expect("seal");
        for i in 0..seal.len() {
            let mut bad = seal.clone();
            bad[i] ^= 1;
            assert!(seals.open_seal(&bad).is_err(), "byte {i} changed");
        }
        assert!(seals.open_seal(&seal[..seal.len() - 1]).is_err());
    }

    #[test]
    fn reopening_keeps_the_slots_in_use_and_shreds_the_others() {
        let (_dir, data) = scratch();
        let (kept, gone) = {
            let seals = Seals::open(&data, ID, &HashSet::new(), None).expect("open");
            let kept = seals.seal(&headers(), b"kept").expect("seal");
            let gone = seals.seal(&headers(), b"gone").expect("seal");
            // Lent, never retired: a process that stopped before storing it.
            (kept, gone)
        };
        let used = HashSet::from([kept.0]);
        let seals = Seals::open(&data, ID, &used, None).expect("reopen");
        assert_eq!(seals.open_seal(&kept.1).expect("opens").body, b"kept");
        assert!(seals.open_seal(&gone.1).is_err());
        // Slots past the last in use were cut off.
        let len = std::fs::metadata(path_for(&data)).expect("meta").len();
        assert_eq!(len, HEADER + (kept.0 + 1) * KEY_LEN as u64);
    }

    #[test]
    fn a_key_file_of_another_data_file_or_none_is_refused() {
        let (_dir, data) = scratch();
        let seals = Seals::open(&data, ID, &HashSet::new(), None).expect("open");
        let (slot, _) = seals.seal(&[], b"x").expect("seal");
        drop(seals);
        let used = HashSet::from([slot]);
        assert!(matches!(
            Seals::open(&data, ID + 1, &used, None),
            Err(KeysError::Foreign(id)) if id == ID
        ));
        assert!(matches!(
            Seals::open(&data, ID, &HashSet::from([slot + 10_000]), None),
            Err(KeysError::Short { .. })
        ));
        std::fs::remove_file(path_for(&data)).expect("rm");
        assert!(matches!(
            Seals::open(&data, ID, &used, None),
            Err(KeysError::Missing)
        ));
        std::fs::write(path_for(&data), b"not a key file at all, not at all!").expect("write");
        assert!(matches!(
            Seals::open(&data, ID, &HashSet::new(), None),
            Err(KeysError::NotKeys)
        ));
    }
}
