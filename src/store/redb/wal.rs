//! The write-ahead log: what makes a write durable.
//!
//! Each batch the writer runs is appended here and synced (one `fdatasync`
//! of a few hundred bytes per batch) before anyone is answered; redb then
//! commits the batch without syncing (`Durability::None`). Writing a batch's
//! random B-tree pages to the file and syncing them at every commit was most
//! of the writer's time; here they reach the disk at checkpoints, where many
//! batches' changes to the same pages are written once.
//!
//! A checkpoint is a durable redb commit that records the sequence number
//! of the last batch it holds (`meta.wal_seq`); the log is then emptied. On
//! open, the batches after the checkpoint are replayed in order through the
//! same operations: a batch holds each request with its clock reading (and a
//! claim's token), so replay reproduces exactly what was answered.
//!
//! Record layout: `len: u32 LE | crc32(payload): u32 LE | payload`, payload
//! = postcard of [`Batch`]. A torn or corrupt tail (a crash mid-append) ends
//! the replay and is cut off; it was never acknowledged.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::faults::FaultPlan;
use super::ops::Request;
use crate::clock::Millis;

/// Bytes before the first record: a magic line naming the format.
const MAGIC: &[u8; 8] = b"DDWAL01\n";

/// One batch as logged.
#[derive(Debug, Serialize, Deserialize)]
pub struct Batch {
    /// Sequence number: one more than the batch before.
    pub seq: u64,
    /// The requests, in execution order, each with its clock reading.
    pub ops: Vec<(Millis, Request)>,
}

/// A logged batch as borrowed for encoding.
#[derive(Debug, Serialize)]
struct BatchRef<'a> {
    seq: u64,
    ops: &'a [(Millis, &'a Request)],
}

/// The log file, opened for appending.
#[derive(Debug)]
pub struct Wal {
    /// The file.
    file: File,
    /// Where the next record goes: the end of the valid records.
    len: u64,
    /// Bytes allocated on disk. Records are written into space already
    /// allocated (zeros written ahead), so syncing a record never has to
    /// sync a change of the file's size or extents as well.
    capacity: u64,
    /// Faults to inject (tests only).
    faults: Option<Arc<FaultPlan>>,
}

/// Syncs a log's records to disk; used by the syncer thread while the
/// writer appends.
#[derive(Debug)]
pub struct WalSync {
    /// The log file (another handle on it).
    file: File,
    /// Faults to inject (tests only).
    faults: Option<Arc<FaultPlan>>,
}

impl WalSync {
    /// Makes every record appended so far durable.
    pub fn sync(&self) -> std::io::Result<()> {
        fault(self.faults.as_ref(), true)?;
        self.file.sync_data()
    }
}

/// Space the log grows by at a time.
const GROW: u64 = 8 * 1024 * 1024;

/// The log's path for a data file: `dedupd.redb` → `dedupd.redb.wal`.
pub fn path_for(data: &Path) -> PathBuf {
    let mut p = data.as_os_str().to_owned();
    p.push(".wal");
    PathBuf::from(p)
}

fn fault(faults: Option<&Arc<FaultPlan>>, sync: bool) -> std::io::Result<()> {
    match faults {
        Some(plan) if plan.trip(sync) => Err(std::io::Error::new(
            std::io::ErrorKind::StorageFull,
            "injected fault: no space left on device",
        )),
        _ => Ok(()),
    }
}

/// The valid records of `bytes` (after the magic): each intact, and each
/// numbered one more than the one before. Whatever follows — a torn record
/// of a crash mid-append, zeros written ahead, records left from before the
/// last checkpoint — ends the log. Returns the batches numbered after
/// `after` (those before are only checked, not decoded: a log that a clean
/// shutdown emptied still holds its old records, up to 64 MiB of them) and
/// where the valid records end.
fn parse(bytes: &[u8], after: u64) -> (Vec<Batch>, usize) {
    let mut batches: Vec<Batch> = Vec::new();
    let mut last: Option<u64> = None;
    let mut at = MAGIC.len();
    while let Some(head) = bytes.get(at..at + 8) {
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
        if len == 0 {
            break;
        }
        let Some(payload) = bytes.get(at + 8..at + 8 + len) else {
            break;
        };
        if crc32fast::hash(payload) != crc {
            break;
        }
        // A batch's sequence number is its first field.
        let Ok((seq, _)) = postcard::take_from_bytes::<u64>(payload) else {
            break;
        };
        if last.is_some_and(|l| seq != l + 1) {
            break;
        }
        if seq > after {
            let Ok(batch) = postcard::from_bytes::<Batch>(payload) else {
                break;
            };
            batches.push(batch);
        }
        last = Some(seq);
        at += 8 + len;
    }
    (batches, at)
}

/// What a log file's bytes are.
#[derive(Debug)]
pub enum Decoded {
    /// A log: its batches numbered after the `after` given, and where its
    /// valid records end.
    Log(Vec<Batch>, usize),
    /// Empty, or a magic line cut short (torn while being created): a log
    /// to start afresh.
    New,
    /// Something else, which is never written over.
    NotALog,
}

/// Reads a log file's `bytes` as [`Wal::open`] does, without touching the
/// file. Never allocates by a length the bytes declare: a record's length
/// is checked against the bytes there before its payload is looked at.
pub fn decode(bytes: &[u8], after: u64) -> Decoded {
    if bytes.len() >= MAGIC.len() && &bytes[..MAGIC.len()] == MAGIC {
        let (batches, end) = parse(bytes, after);
        Decoded::Log(batches, end)
    } else if bytes.is_empty() || MAGIC.starts_with(bytes) {
        Decoded::New
    } else {
        Decoded::NotALog
    }
}

impl Wal {
    /// Opens (or creates) the log and reads the valid batches in it
    /// numbered after `after` (the last batch the data file holds).
    pub fn open(
        path: PathBuf,
        faults: Option<Arc<FaultPlan>>,
        after: u64,
    ) -> std::io::Result<(Self, Vec<Batch>)> {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            // Its records hold request bodies and claim tokens.
            .mode(super::OWNER_ONLY)
            .open(&path)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let (batches, end) = match decode(&bytes, after) {
            Decoded::Log(batches, end) => (batches, end),
            Decoded::New => {
                // New (or torn while being created): start it.
                file.set_len(0)?;
                file.write_all_at(MAGIC, 0)?;
                file.sync_data()?;
                (Vec::new(), MAGIC.len())
            }
            Decoded::NotALog => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{} is not a dedupd write-ahead log", path.display()),
                ));
            }
        };
        let capacity = file.metadata()?.len();
        let wal = Self {
            file,
            len: end as u64,
            capacity,
            faults,
        };
        Ok((wal, batches))
    }

    /// Bytes of records in the log.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the log holds no batch.
    pub fn is_empty(&self) -> bool {
        self.len <= MAGIC.len() as u64
    }

    /// Allocates at least `need` more bytes after the records by writing
    /// zeros, and syncs that (size and all) once, ahead of the records.
    fn grow(&mut self, need: u64) -> std::io::Result<()> {
        let target = (self.len + need).max(self.capacity).div_ceil(GROW) * GROW;
        let zeros = vec![0u8; 1024 * 1024];
        let mut at = self.capacity;
        while at < target {
            let n = (target - at).min(zeros.len() as u64) as usize;
            fault(self.faults.as_ref(), false)?;
            self.file.write_all_at(&zeros[..n], at)?;
            at += n as u64;
        }
        self.file.sync_all()?;
        self.capacity = target;
        Ok(())
    }

    /// A handle that syncs this log from another thread.
    pub fn syncer(&self) -> std::io::Result<WalSync> {
        Ok(WalSync {
            file: self.file.try_clone()?,
            faults: self.faults.clone(),
        })
    }

    /// Appends a batch, without a sync: [`WalSync::sync`] makes it
    /// durable. On an error the record is made invalid, so a batch that was
    /// not acknowledged is never replayed.
    pub fn append(&mut self, seq: u64, ops: &[(Millis, &Request)]) -> std::io::Result<()> {
        let payload = postcard::to_stdvec(&BatchRef { seq, ops })
            .map_err(|e| std::io::Error::other(format!("cannot encode a batch: {e}")))?;
        let len = u32::try_from(payload.len())
            .map_err(|_| std::io::Error::other("a batch of more than 4 GiB"))?;
        let mut record = Vec::with_capacity(payload.len() + 8);
        record.extend_from_slice(&len.to_le_bytes());
        record.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
        record.extend_from_slice(&payload);
        if self.len + record.len() as u64 > self.capacity {
            self.grow(record.len() as u64)?;
        }
        if let Some(plan) = &self.faults {
            plan.before_append();
        }
        let written = fault(self.faults.as_ref(), false)
            .and_then(|()| self.file.write_all_at(&record, self.len));
        match written {
            Ok(()) => {
                self.len += record.len() as u64;
                Ok(())
            }
            Err(e) => {
                let _ = self.invalidate(self.len);
                Err(e)
            }
        }
    }

    /// Zeros the header of a record at `at`, so it reads as the end.
    fn invalidate(&mut self, at: u64) -> std::io::Result<()> {
        self.file.write_all_at(&[0u8; 8], at)?;
        self.file.sync_data()
    }

    /// Takes back the last record, written at `len`: the record of a batch
    /// whose commit failed after it was logged.
    pub fn cut_to(&mut self, len: u64) -> std::io::Result<()> {
        self.len = len.max(MAGIC.len() as u64);
        self.invalidate(self.len)
    }

    /// Empties the log after a checkpoint made its batches durable in redb.
    /// The old records stay on disk but end the log: the next record is
    /// numbered after them, and the ones that follow it are not.
    pub fn reset(&mut self) -> std::io::Result<()> {
        fault(self.faults.as_ref(), false)?;
        self.len = MAGIC.len() as u64;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn purge(limit: u64) -> Request {
        Request::Purge { limit }
    }

    fn seqs(batches: &[Batch]) -> Vec<u64> {
        batches.iter().map(|b| b.seq).collect()
    }

    fn limits(batch: &Batch) -> Vec<(Millis, u64)> {
        batch
            .ops
            .iter()
            .map(|(now, r)| match r {
                Request::Purge { limit } => (*now, *limit),
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn batches_the_file_already_holds_are_checked_but_not_returned() {
        let dir = tempfile::TempDir::new().unwrap();
        let path = dir.path().join("x.wal");
        let (mut wal, _) = Wal::open(path.clone(), None, 0).unwrap();
        for seq in 1..=5 {
            wal.append(seq, &[(seq, &purge(seq))]).unwrap();
        }
        drop(wal);
        let (_, found) = Wal::open(path.clone(), None, 3).unwrap();
        assert_eq!(seqs(&found), [4, 5]);
        assert_eq!(limits(&found[0]), [(4, 4)]);
        let (wal, found) = Wal::open(path, None, 5).unwrap();
        assert!(found.is_empty());
        // The log still ends after the fifth: the next record goes there.
        assert!(!wal.is_empty());
    }

    #[test]
    fn batches_come_back_in_order_with_their_clock_readings() {
        let dir = tempfile::TempDir::new().unwrap();
        let path = dir.path().join("x.wal");
        let (mut wal, found) = Wal::open(path.clone(), None, 0).unwrap();
        assert!(found.is_empty() && wal.is_empty());
        for seq in 1..=3 {
            let (a, b) = (purge(seq * 10), purge(seq * 10 + 1));
            wal.append(seq, &[(100 + seq, &a), (200 + seq, &b)])
                .unwrap();
        }
        drop(wal);
        let (_, found) = Wal::open(path, None, 0).unwrap();
        assert_eq!(seqs(&found), [1, 2, 3]);
        assert_eq!(limits(&found[1]), [(102, 20), (202, 21)]);
    }

    #[test]
    fn a_torn_tail_ends_the_log_and_the_next_append_replaces_it() {
        let dir = tempfile::TempDir::new().unwrap();
        let path = dir.path().join("x.wal");
        let (mut wal, _) = Wal::open(path.clone(), None, 0).unwrap();
        wal.append(1, &[(1, &purge(1))]).unwrap();
        let end = wal.len();
        wal.append(2, &[(2, &purge(2))]).unwrap();
        drop(wal);
        // A crash mid-append: the second record is half there.
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        file.write_all_at(&[0xFF; 5], end + 9).unwrap();
        let (mut wal, found) = Wal::open(path.clone(), None, 0).unwrap();
        assert_eq!(seqs(&found), [1]);
        wal.append(2, &[(3, &purge(3))]).unwrap();
        drop(wal);
        let (_, found) = Wal::open(path, None, 0).unwrap();
        assert_eq!(seqs(&found), [1, 2]);
        assert_eq!(limits(&found[1]), [(3, 3)]);
    }

    #[test]
    fn after_a_reset_records_left_from_before_are_not_read_again() {
        let dir = tempfile::TempDir::new().unwrap();
        let path = dir.path().join("x.wal");
        let (mut wal, _) = Wal::open(path.clone(), None, 0).unwrap();
        for seq in 1..=5 {
            wal.append(seq, &[(seq, &purge(seq))]).unwrap();
        }
        wal.reset().unwrap();
        assert!(wal.is_empty());
        wal.append(6, &[(6, &purge(6))]).unwrap();
        drop(wal);
        let (_, found) = Wal::open(path, None, 0).unwrap();
        assert_eq!(seqs(&found), [6], "the old records 2..5 after it are stale");
    }

    #[test]
    fn a_record_taken_back_is_not_replayed() {
        let dir = tempfile::TempDir::new().unwrap();
        let path = dir.path().join("x.wal");
        let (mut wal, _) = Wal::open(path.clone(), None, 0).unwrap();
        wal.append(1, &[(1, &purge(1))]).unwrap();
        let before = wal.len();
        wal.append(2, &[(2, &purge(2))]).unwrap();
        wal.cut_to(before).unwrap();
        drop(wal);
        let (_, found) = Wal::open(path, None, 0).unwrap();
        assert_eq!(seqs(&found), [1]);
    }

    #[test]
    fn a_failed_append_leaves_nothing_to_replay() {
        let dir = tempfile::TempDir::new().unwrap();
        let path = dir.path().join("x.wal");
        let plan = FaultPlan::new();
        let (mut wal, _) = Wal::open(path.clone(), Some(plan.clone()), 0).unwrap();
        wal.append(1, &[(1, &purge(1))]).unwrap();
        plan.fail_next_writes(1);
        assert!(wal.append(2, &[(2, &purge(2))]).is_err());
        drop(wal);
        let (_, found) = Wal::open(path, None, 0).unwrap();
        assert_eq!(seqs(&found), [1], "not written: never acknowledged");
    }

    #[test]
    fn a_failed_sync_is_reported_to_the_syncer() {
        let dir = tempfile::TempDir::new().unwrap();
        let plan = FaultPlan::new();
        let (mut wal, _) = Wal::open(dir.path().join("x.wal"), Some(plan.clone()), 0).unwrap();
        let sync = wal.syncer().unwrap();
        wal.append(1, &[(1, &purge(1))]).unwrap();
        sync.sync().unwrap();
        plan.fail_next_syncs(1);
        wal.append(2, &[(2, &purge(2))]).unwrap();
        assert!(sync.sync().is_err());
        sync.sync().unwrap();
    }

    #[test]
    fn a_file_that_is_not_a_log_is_refused() {
        let dir = tempfile::TempDir::new().unwrap();
        let path = dir.path().join("x.wal");
        std::fs::write(&path, b"something else entirely").unwrap();
        assert!(Wal::open(path, None, 0).is_err());
    }
}
