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
use std::io::{Read, Seek, SeekFrom, Write};
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
    /// Bytes of valid records (and the magic) from the start.
    len: u64,
    /// Faults to inject (tests only).
    faults: Option<Arc<FaultPlan>>,
}

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

impl Wal {
    /// Opens (or creates) the log and reads the valid batches in it; a torn
    /// or corrupt tail is cut off.
    pub fn open(
        path: PathBuf,
        faults: Option<Arc<FaultPlan>>,
    ) -> std::io::Result<(Self, Vec<Batch>)> {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let mut batches = Vec::new();
        let mut valid = MAGIC.len();
        if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
            if !bytes.is_empty() && !MAGIC.starts_with(&bytes) {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{} is not a dedupd write-ahead log", path.display()),
                ));
            }
            // New (or torn while being created): start it.
            file.set_len(0)?;
            file.seek(SeekFrom::Start(0))?;
            file.write_all(MAGIC)?;
        } else {
            let mut at = MAGIC.len();
            while let Some(head) = bytes.get(at..at + 8) {
                let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
                let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
                let Some(payload) = bytes.get(at + 8..at + 8 + len) else {
                    break;
                };
                if crc32fast::hash(payload) != crc {
                    break;
                }
                let Ok(batch) = postcard::from_bytes::<Batch>(payload) else {
                    break;
                };
                batches.push(batch);
                at += 8 + len;
                valid = at;
            }
            if valid < bytes.len() {
                tracing::warn!(
                    path = %path.display(),
                    cut = bytes.len() - valid,
                    "write-ahead log ends in a torn record (a crash while appending); it was never acknowledged and is cut off"
                );
                file.set_len(valid as u64)?;
            }
        }
        file.sync_data()?;
        file.seek(SeekFrom::Start(valid as u64))?;
        let wal = Self {
            file,
            len: valid as u64,
            faults,
        };
        Ok((wal, batches))
    }

    /// Bytes in the log.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the log holds no batch.
    pub fn is_empty(&self) -> bool {
        self.len <= MAGIC.len() as u64
    }

    /// Appends a batch and syncs it. On an error the log is cut back to
    /// where it was, so a batch that was not acknowledged is never replayed.
    pub fn append(&mut self, seq: u64, ops: &[(Millis, &Request)]) -> std::io::Result<()> {
        let payload = postcard::to_stdvec(&BatchRef { seq, ops })
            .map_err(|e| std::io::Error::other(format!("cannot encode a batch: {e}")))?;
        let len = u32::try_from(payload.len())
            .map_err(|_| std::io::Error::other("a batch of more than 4 GiB"))?;
        let mut record = Vec::with_capacity(payload.len() + 8);
        record.extend_from_slice(&len.to_le_bytes());
        record.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
        record.extend_from_slice(&payload);
        let written = fault(self.faults.as_ref(), false)
            .and_then(|()| self.file.write_all(&record))
            .and_then(|()| fault(self.faults.as_ref(), true))
            .and_then(|()| self.file.sync_data());
        match written {
            Ok(()) => {
                self.len += record.len() as u64;
                Ok(())
            }
            Err(e) => {
                let _ = self.cut_back();
                Err(e)
            }
        }
    }

    /// Cuts the log back to `len` bytes: the record of a batch whose
    /// commit failed after it was logged.
    pub fn cut_to(&mut self, len: u64) -> std::io::Result<()> {
        self.len = len.max(MAGIC.len() as u64);
        self.cut_back()
    }

    /// Cuts the file back to its valid records (after a failed append).
    fn cut_back(&mut self) -> std::io::Result<()> {
        self.file.set_len(self.len)?;
        self.file.seek(SeekFrom::Start(self.len))?;
        self.file.sync_data()
    }

    /// Empties the log after a checkpoint made its batches durable in redb.
    pub fn reset(&mut self) -> std::io::Result<()> {
        fault(self.faults.as_ref(), false)?;
        self.file.set_len(MAGIC.len() as u64)?;
        self.file.seek(SeekFrom::Start(MAGIC.len() as u64))?;
        self.file.sync_data()?;
        self.len = MAGIC.len() as u64;
        Ok(())
    }
}
