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
//! of the last batch it holds (`meta.wal_seq`); the log is then emptied
//! (the log is two files of this format, and a checkpoint whose sync is
//! made beside new writes empties the one it covers later: see
//! [`super::wal_segments`]). On
//! open, the batches after the checkpoint are replayed in order through the
//! same operations: a batch holds each request with its clock reading (and a
//! claim's token), so replay reproduces exactly what was answered.
//!
//! Header (format 2 on; format 6 shown): `DDWAL06\n | data file id: u128 LE | crc32 of the
//! 24 bytes before: u32 LE`. The id is the one the data file records when
//! it is created (`meta`): a log is replayed only into the file it belongs
//! to, never into a new or restored one. Format 1 (`DDWAL01\n`, the whole
//! header) had no id; such a log is read only beside a data file that has
//! no id either (both written before logs were bound), and its header is
//! rewritten once its batches are checkpointed.
//!
//! Record layout: `len: u32 LE | crc32(payload): u32 LE | payload`, payload
//! = postcard of [`Batch`]. A torn tail (a crash mid-append: a record whose
//! checksum fails, or cut short) ends the replay and is cut off; it was
//! never acknowledged. A record whose checksum holds but which does not
//! decode is not a torn tail: it is corruption, or a log of another
//! encoding, and opening refuses it ([`LogError::Undecodable`]) instead of
//! dropping acknowledged writes. The encoding of every logged request is
//! pinned by a golden test (`wal_golden`): a change to it must bump
//! [`FORMAT`]. A log of every format is replayed by `tests/store/golden.rs`.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::faults::FaultPlan;
use super::record::{Batch, BatchRef, Request};
use crate::clock::Millis;

/// The log format this build writes.
pub const FORMAT: u32 = 7;
/// Formats whose records this build decodes: format 1 and 2 records are
/// encoded alike (only the header differs); format 3 adds a request (a
/// settle with its attempt, for the event's timeline) and changes none;
/// format 4 adds the replay, erase and bulk job requests and changes none;
/// format 5 adds the insert of an event routed to several destinations;
/// format 6 adds the insert of a sealed event (and no longer writes the
/// two inserts before it); format 7 adds the done that keeps a result.
pub const DECODES: &[u32] = &[1, 2, 3, 4, 5, 6, 7];
/// Every header starts `DDWAL`, two digits of format, and a newline.
const MAGIC_PREFIX: &[u8; 5] = b"DDWAL";
/// Bytes of a format 1 header.
const V1_HEADER: usize = 8;
/// Bytes of a header from format 2 on: magic, data file id, checksum.
const HEADER: usize = 8 + 16 + 4;

/// Why a log cannot be opened. None of these changes the file.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// Reading or writing failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The file does not start with a log header.
    #[error("not a dedupd write-ahead log")]
    NotALog,
    /// The log belongs to another data file (`None`: it is a format 1 log,
    /// bound to no file, beside a data file that has an id).
    #[error("the log belongs to another data file")]
    Foreign {
        /// The id the log names.
        log_id: Option<u128>,
    },
    /// The log holds batches to replay in a format this build cannot decode.
    #[error("log format {found}, this build reads {DECODES:?}")]
    Version { found: u32 },
    /// A record passes its checksum but does not decode.
    #[error("record {seq} at byte {offset} passes its checksum but does not decode: {detail}")]
    Undecodable {
        /// Its batch number.
        seq: u64,
        /// Where it starts in the file.
        offset: usize,
        version: u32,
        /// The decoder's complaint.
        detail: String,
    },
    /// The log's records stop at a damaged one, and intact records of later
    /// batches follow it: corruption, not a torn tail (which is always the
    /// last record written).
    #[error(
        "the record at byte {offset} is damaged, but batch {later_seq} follows intact at byte \
         {later_offset}"
    )]
    Damaged {
        /// Where the damaged record starts.
        offset: usize,
        /// A later batch found intact after it.
        later_seq: u64,
        /// Where that one starts.
        later_offset: usize,
    },
    /// The first batch to replay is not the one after the last the data
    /// file holds: the data file is older than its log (a backup restored
    /// while the log stayed), and the batches between are in neither.
    #[error("the data file holds batches up to {holds}, but the log continues from batch {first}")]
    Gap {
        /// The last batch the data file holds.
        holds: u64,
        /// The first batch the log has after it.
        first: u64,
    },
    /// The log's two segments do not join: one ends at a batch and the
    /// other does not continue from the next one (a segment lost, or
    /// damaged at its start).
    #[error(
        "one log segment ends at batch {ends} and the other continues from batch {next}: the \
         batches between are in neither"
    )]
    Segments {
        /// The last batch of the segment that comes first.
        ends: u64,
        /// The first batch of the other.
        next: u64,
    },
}

/// A header for the data file `id`.
fn header(id: u128) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..5].copy_from_slice(MAGIC_PREFIX);
    h[5..8].copy_from_slice(format!("{FORMAT:02}\n").as_bytes());
    h[8..24].copy_from_slice(&id.to_le_bytes());
    let crc = crc32fast::hash(&h[..24]);
    h[24..].copy_from_slice(&crc.to_le_bytes());
    h
}

/// What a log's header says: its format, its data file's id (none for
/// format 1), and where its records start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    format: u32,
    id: Option<u128>,
    len: usize,
}

/// Reads a header; `Ok(None)` if `bytes` is empty or a torn start of one
/// (the log was being created).
fn read_header(bytes: &[u8]) -> Result<Option<Header>, LogError> {
    let magic_len = MAGIC_PREFIX.len();
    if bytes.len() < 8 {
        let torn = bytes.len() <= magic_len && MAGIC_PREFIX.starts_with(bytes)
            || bytes.len() > magic_len && bytes.starts_with(MAGIC_PREFIX);
        return if torn {
            Ok(None)
        } else {
            Err(LogError::NotALog)
        };
    }
    if !bytes.starts_with(MAGIC_PREFIX) || bytes[7] != b'\n' {
        return Err(LogError::NotALog);
    }
    let format = std::str::from_utf8(&bytes[5..7])
        .ok()
        .filter(|d| d.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|d| d.parse::<u32>().ok())
        .ok_or(LogError::NotALog)?;
    match format {
        0 => Err(LogError::NotALog),
        1 => Ok(Some(Header {
            format,
            id: None,
            len: V1_HEADER,
        })),
        _ if bytes.len() < HEADER => Ok(None),
        _ => {
            let crc = u32::from_le_bytes([bytes[24], bytes[25], bytes[26], bytes[27]]);
            if crc32fast::hash(&bytes[..24]) != crc {
                return Err(LogError::NotALog);
            }
            let mut id = [0u8; 16];
            id.copy_from_slice(&bytes[8..24]);
            Ok(Some(Header {
                format,
                id: Some(u128::from_le_bytes(id)),
                len: HEADER,
            }))
        }
    }
}

/// The payload of a record: the postcard encoding of a batch. The
/// encoding of every request is pinned by `wal_golden` (a change to it
/// must bump [`FORMAT`]).
pub(super) fn encode(seq: u64, ops: &[(Millis, &Request)]) -> Result<Vec<u8>, postcard::Error> {
    postcard::to_stdvec(&BatchRef { seq, ops })
}

/// Decodes a record's payload of a format in [`DECODES`].
pub(super) fn decode(payload: &[u8]) -> Result<Batch, postcard::Error> {
    postcard::from_bytes::<Batch>(payload)
}

/// The log file, opened for appending.
#[derive(Debug)]
pub struct Wal {
    file: File,
    /// Bytes of its header: records start there.
    header: u64,
    /// The data file it belongs to.
    id: u128,
    /// The header is of an older format: [`Wal::reset`] writes the current
    /// one (the batches of the old format are checkpointed by then).
    stale_header: bool,
    /// Where the next record goes: the end of the valid records.
    len: u64,
    /// Bytes allocated on disk. Records are written into space already
    /// allocated (zeros written ahead), so syncing a record never has to
    /// sync a change of the file's size or extents as well.
    capacity: u64,
    /// How much it grows by when a record does not fit: [`GROW`], or less
    /// while the disk is low on space (the zeros written ahead are real
    /// bytes on disk).
    growth: u64,
    /// Faults to inject (tests only).
    faults: Option<Arc<FaultPlan>>,
}

/// Syncs a log's records to disk (another handle on its file: see
/// [`super::syncer`]).
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
        sync_file(&self.file, self.faults.as_ref())
    }
}

/// Syncs a log file's records (after the test's faults, if any).
fn sync_file(file: &File, faults: Option<&Arc<FaultPlan>>) -> std::io::Result<()> {
    fault(faults, true)?;
    file.sync_data()
}

/// Space the log grows by at a time, with room to spare on the disk.
pub const GROW: u64 = 8 * 1024 * 1024;

/// The log's path for a data file: `dedupd.redb` → `dedupd.redb.wal`.
pub fn path_for(data: &Path) -> PathBuf {
    let mut p = data.as_os_str().to_owned();
    p.push(".wal");
    PathBuf::from(p)
}

fn fault(faults: Option<&Arc<FaultPlan>>, sync: bool) -> std::io::Result<()> {
    match faults {
        Some(plan) if plan.trip(sync) => Err(FaultPlan::disk_full()),
        _ => Ok(()),
    }
}

/// The valid records of `bytes` from `at` (past the header): each intact,
/// and each numbered one more than the one before. Whatever follows — a
/// torn record of a crash mid-append, zeros written ahead, records left
/// from before the last checkpoint — ends the log. Returns the batches
/// numbered after `after` (those before are only checked, not decoded: a
/// log that a clean shutdown emptied still holds its old records, up to 64
/// MiB of them) and where the valid records end.
///
/// A record to replay whose checksum holds but which does not decode, or
/// any record to replay in a format this build does not decode, is an
/// error: acknowledged writes are never dropped as if they were torn.
///
/// The first batch returned must be the one after `after`, unless
/// `gap_ok` (a segment of a log in two, see [`super::wal_segments`]:
/// the other segment holds those between, and the two are joined there).
pub fn parse(
    bytes: &[u8],
    mut at: usize,
    format: u32,
    after: u64,
    gap_ok: bool,
) -> Result<(Vec<Batch>, usize), LogError> {
    let mut batches: Vec<Batch> = Vec::new();
    let mut last: Option<u64> = None;
    while let Some(head) = bytes.get(at..at.saturating_add(8)) {
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
        if len == 0 {
            break;
        }
        let Some(payload) = bytes.get(at + 8..(at + 8).saturating_add(len)) else {
            break;
        };
        if crc32fast::hash(payload) != crc {
            break;
        }
        // A batch's sequence number is its first field, in every format.
        let seq = match postcard::take_from_bytes::<u64>(payload) {
            Ok((seq, _)) => seq,
            Err(e) => {
                return Err(LogError::Undecodable {
                    seq: last.map_or(0, |l| l + 1),
                    offset: at,
                    version: format,
                    detail: e.to_string(),
                });
            }
        };
        if last.is_some_and(|l| seq != l + 1) {
            break;
        }
        if seq > after {
            if !DECODES.contains(&format) {
                return Err(LogError::Version { found: format });
            }
            if batches.is_empty() && seq != after + 1 && !gap_ok {
                return Err(LogError::Gap {
                    holds: after,
                    first: seq,
                });
            }
            match decode(payload) {
                Ok(batch) => batches.push(batch),
                Err(e) => {
                    return Err(LogError::Undecodable {
                        seq,
                        offset: at,
                        version: format,
                        detail: e.to_string(),
                    });
                }
            }
        }
        last = Some(seq);
        at += 8 + len;
    }
    // Where the records stop, a crash mid-append tore the last one, or the
    // log ends (zeros written ahead, records of earlier generations, all
    // numbered at most what the data file holds). Intact records of later
    // batches past this point mean a record in the middle was damaged:
    // stopping here would drop them, acknowledged as they were.
    if DECODES.contains(&format)
        && let Some((later_offset, later_seq)) =
            later_record(bytes, at, last.unwrap_or(0).max(after))
    {
        return Err(LogError::Damaged {
            offset: at,
            later_seq,
            later_offset,
        });
    }
    Ok((batches, at))
}

/// An intact record at or after `from` of a batch numbered above `above`,
/// if there is one: its offset and number. Every offset is tried, since a
/// damaged length hides where the next record starts; the checks go from
/// cheap to dear (a length that fits, a number in range, a batch that
/// decodes, then its checksum), so random bytes cost a few comparisons
/// each and nothing is allocated by a length the bytes declare.
fn later_record(bytes: &[u8], from: usize, above: u64) -> Option<(usize, u64)> {
    // Each record takes at least 10 bytes: no batch is numbered further
    // above `above` than that many records could reach.
    let most = above.saturating_add((bytes.len() / 10) as u64 + 1);
    let mut at = from;
    while let Some(head) = bytes.get(at..at.saturating_add(8)) {
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let candidate = (len > 0)
            .then(|| bytes.get(at + 8..(at + 8).saturating_add(len)))
            .flatten()
            .filter(|payload| {
                postcard::take_from_bytes::<u64>(payload)
                    .is_ok_and(|(seq, _)| seq > above && seq <= most)
            })
            .filter(|payload| decode(payload).is_ok())
            .filter(|payload| {
                crc32fast::hash(payload) == u32::from_le_bytes([head[4], head[5], head[6], head[7]])
            });
        if let Some(payload) = candidate
            && let Ok((seq, _)) = postcard::take_from_bytes::<u64>(payload)
        {
            return Some((at, seq));
        }
        at += if len == 0 {
            // Zeros written ahead are most of a log: a length needs a
            // byte that is not zero among its four.
            match bytes[at..].iter().position(|&b| b != 0) {
                Some(nonzero) => nonzero.saturating_sub(3).max(1),
                None => return None,
            }
        } else {
            1
        };
    }
    None
}

/// What a log file's bytes are.
#[derive(Debug)]
pub enum Decoded {
    /// A log: its batches numbered after the `after` given, where its
    /// valid records end, and whether its header is of an older format.
    Log {
        /// The batches to replay.
        batches: Vec<Batch>,
        /// Bytes of header and valid records; what follows is ignored.
        end: usize,
        /// The header is of an older format (rewritten once checkpointed).
        stale_header: bool,
        /// Bytes of its header (8 for format 1, 28 from format 2 on).
        header_len: usize,
    },
    /// Empty, or a header cut short (torn while being created): a log to
    /// start afresh.
    New,
}

/// Reads a log file's `bytes` as [`Wal::open_segment`] does (without a
/// gap), for the data file `id` (`bound`: see [`Wal::open_segment`]), without touching the file. Never
/// allocates by a length the bytes declare: a record's length is checked
/// against the bytes there before its payload is looked at.
pub fn read_log(bytes: &[u8], after: u64, id: u128, bound: bool) -> Result<Decoded, LogError> {
    read_segment(bytes, after, id, bound, false)
}

/// [`read_log`], with `gap_ok` as [`parse`] takes it.
pub(super) fn read_segment(
    bytes: &[u8],
    after: u64,
    id: u128,
    bound: bool,
    gap_ok: bool,
) -> Result<Decoded, LogError> {
    let Some(h) = read_header(bytes)? else {
        return Ok(Decoded::New);
    };
    match h.id {
        Some(log_id) if log_id != id => {
            return Err(LogError::Foreign {
                log_id: Some(log_id),
            });
        }
        None if bound => return Err(LogError::Foreign { log_id: None }),
        _ => {}
    }
    if h.format > FORMAT {
        return Err(LogError::Version { found: h.format });
    }
    let (batches, end) = parse(bytes, h.len, h.format, after, gap_ok)?;
    Ok(Decoded::Log {
        batches,
        end,
        stale_header: h.format != FORMAT,
        header_len: h.len,
    })
}

/// The data file id a log's header names, if it has a header that names
/// one (for reading a log without its data file: the fuzz targets).
pub fn named_id(bytes: &[u8]) -> Option<u128> {
    read_header(bytes).ok().flatten().and_then(|h| h.id)
}

/// What a write-ahead log holds, as [`decode_wal`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WalContents {
    /// A log: the sequence numbers of its batches after the one asked
    /// for, each batch's count of requests, and where its valid records end.
    Log {
        /// Sequence numbers, in order.
        seqs: Vec<u64>,
        /// Requests per batch, in the same order.
        ops: Vec<usize>,
        /// Bytes of header and valid records; what follows is ignored.
        end: usize,
    },
    /// Empty or a cut header: opening starts a new log.
    New,
    /// Opening refuses it, and leaves it as it is: not a log, a log of a
    /// format this build cannot replay, or a record whose checksum holds
    /// but which does not decode.
    Refused(String),
}

/// Decodes a write-ahead log segment's bytes (`dedupd.redb.wal`, or
/// `.wal2` given the batch before its first as `after`) exactly as opening
/// the store does beside the data file the log names, returning the
/// batches numbered after `after`, without any file: the decoder under the
/// fuzz targets (`tests/fuzz/wal.rs`).
pub fn decode_wal(bytes: &[u8], after: u64) -> WalContents {
    let (id, bound) = match named_id(bytes) {
        Some(id) => (id, true),
        None => (0, false),
    };
    match read_log(bytes, after, id, bound) {
        Ok(Decoded::Log { batches, end, .. }) => WalContents::Log {
            seqs: batches.iter().map(|b| b.seq).collect(),
            ops: batches.iter().map(|b| b.ops.len()).collect(),
            end,
        },
        Ok(Decoded::New) => WalContents::New,
        Err(e) => WalContents::Refused(e.to_string()),
    }
}

impl Wal {
    /// [`Wal::open_segment`] of a log in one file (the unit tests').
    #[cfg(test)]
    pub fn open(
        path: PathBuf,
        faults: Option<Arc<FaultPlan>>,
        after: u64,
        id: u128,
        bound: bool,
    ) -> Result<(Self, Vec<Batch>), LogError> {
        Self::open_segment(path, faults, after, id, bound, false)
    }

    /// Opens (or creates) a log segment of the data file `id` and reads the
    /// valid batches in it numbered after `after` (the last batch the data
    /// file holds). `bound`: the data file had its id before this open
    /// (false only for a file written before logs were bound, which may
    /// have a format 1 log). A log of another file, of a format this build
    /// cannot replay, or with a record that does not decode, is refused and
    /// left as it is. With `gap_ok`, its batches may start later than the
    /// one after `after` (see [`super::wal_segments`], which checks the two
    /// segments join).
    pub fn open_segment(
        path: PathBuf,
        faults: Option<Arc<FaultPlan>>,
        after: u64,
        id: u128,
        bound: bool,
        gap_ok: bool,
    ) -> Result<(Self, Vec<Batch>), LogError> {
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
        let (batches, end, stale_header, header_len) =
            match read_segment(&bytes, after, id, bound, gap_ok)? {
                Decoded::New => {
                    // New (or torn while being created): start it.
                    let h = header(id);
                    file.set_len(0)?;
                    file.write_all_at(&h, 0)?;
                    file.sync_all()?;
                    // The file's name too: records synced into a file
                    // whose entry a power cut takes back would be lost.
                    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                        File::open(dir)?.sync_all()?;
                    }
                    (Vec::new(), h.len(), false, h.len())
                }
                Decoded::Log {
                    batches,
                    end,
                    stale_header,
                    header_len,
                } => (batches, end, stale_header, header_len),
            };
        let capacity = file.metadata()?.len();
        let wal = Self {
            file,
            header: header_len as u64,
            id,
            stale_header,
            len: end as u64,
            capacity,
            growth: GROW,
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
        self.len <= self.header
    }

    /// Allocates at least `need` more bytes after the records by writing
    /// zeros, and syncs that (size and all) once, ahead of the records.
    fn grow(&mut self, need: u64) -> std::io::Result<()> {
        let step = self.growth.max(1);
        let target = (self.len + need).max(self.capacity).div_ceil(step) * step;
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

    /// Sets how much the log grows by when it must (see `space`).
    pub fn set_growth(&mut self, step: u64) {
        self.growth = step;
    }

    /// Bytes the file takes on disk beyond its header: what emptying it
    /// for good ([`Wal::start_over`]) gives back.
    pub fn capacity(&self) -> u64 {
        self.capacity.saturating_sub(self.header)
    }

    /// Makes every record appended so far durable, from the writer.
    pub fn sync(&self) -> std::io::Result<()> {
        sync_file(&self.file, self.faults.as_ref())
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
        let payload = encode(seq, ops)
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
        self.len = len.max(self.header);
        self.invalidate(self.len)
    }

    /// Empties the log after a checkpoint made its batches durable in redb.
    /// The old records stay on disk but end the log: the next record is
    /// numbered after them, and the ones that follow it are not.
    pub fn reset(&mut self) -> std::io::Result<()> {
        fault(self.faults.as_ref(), false)?;
        if self.stale_header {
            // An older format's log, all checkpointed: start it over in
            // this build's format, bound to its data file.
            return self.start_over();
        }
        self.len = self.header;
        Ok(())
    }

    /// Empties the log for good: only its header is left. After a reopen
    /// that left refused batches out (their records stay valid on disk,
    /// numbered after the last acknowledged one), a later open would take
    /// them for acknowledged batches cut off by damage; none is kept.
    pub fn start_over(&mut self) -> std::io::Result<()> {
        fault(self.faults.as_ref(), false)?;
        // The header first, then the cut: a crash between leaves the
        // header and old records (numbered at most what the data file
        // holds), never an empty file, which would read as a lost log.
        self.file.write_all_at(&header(self.id), 0)?;
        self.file.set_len(HEADER as u64)?;
        self.file.sync_all()?;
        self.capacity = HEADER as u64;
        self.header = HEADER as u64;
        self.stale_header = false;
        self.len = self.header;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: u128 = 0x0123_4567_89ab_cdef_0011_2233_4455_6677;

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
        let (mut wal, _) = Wal::open(path.clone(), None, 0, ID, true).unwrap();
        for seq in 1..=5 {
            wal.append(seq, &[(seq, &purge(seq))]).unwrap();
        }
        drop(wal);
        let (_, found) = Wal::open(path.clone(), None, 3, ID, true).unwrap();
        assert_eq!(seqs(&found), [4, 5]);
        assert_eq!(limits(&found[0]), [(4, 4)]);
        let (wal, found) = Wal::open(path, None, 5, ID, true).unwrap();
        assert!(found.is_empty());
        // The log still ends after the fifth: the next record goes there.
        assert!(!wal.is_empty());
    }

    #[test]
    fn batches_come_back_in_order_with_their_clock_readings() {
        let dir = tempfile::TempDir::new().unwrap();
        let path = dir.path().join("x.wal");
        let (mut wal, found) = Wal::open(path.clone(), None, 0, ID, true).unwrap();
        assert!(found.is_empty() && wal.is_empty());
        for seq in 1..=3 {
            let (a, b) = (purge(seq * 10), purge(seq * 10 + 1));
            wal.append(seq, &[(100 + seq, &a), (200 + seq, &b)])
                .unwrap();
        }
        drop(wal);
        let (_, found) = Wal::open(path, None, 0, ID, true).unwrap();
        assert_eq!(seqs(&found), [1, 2, 3]);
        assert_eq!(limits(&found[1]), [(102, 20), (202, 21)]);
    }

    #[test]
    fn a_torn_tail_ends_the_log_and_the_next_append_replaces_it() {
        let dir = tempfile::TempDir::new().unwrap();
        let path = dir.path().join("x.wal");
        let (mut wal, _) = Wal::open(path.clone(), None, 0, ID, true).unwrap();
        wal.append(1, &[(1, &purge(1))]).unwrap();
        let end = wal.len();
        wal.append(2, &[(2, &purge(2))]).unwrap();
        drop(wal);
        // A crash mid-append: the second record is half there.
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        file.write_all_at(&[0xFF; 5], end + 9).unwrap();
        let (mut wal, found) = Wal::open(path.clone(), None, 0, ID, true).unwrap();
        assert_eq!(seqs(&found), [1]);
        wal.append(2, &[(3, &purge(3))]).unwrap();
        drop(wal);
        let (_, found) = Wal::open(path, None, 0, ID, true).unwrap();
        assert_eq!(seqs(&found), [1, 2]);
        assert_eq!(limits(&found[1]), [(3, 3)]);
    }

    #[test]
    fn after_a_reset_records_left_from_before_are_not_read_again() {
        let dir = tempfile::TempDir::new().unwrap();
        let path = dir.path().join("x.wal");
        let (mut wal, _) = Wal::open(path.clone(), None, 0, ID, true).unwrap();
        for seq in 1..=5 {
            wal.append(seq, &[(seq, &purge(seq))]).unwrap();
        }
        wal.reset().unwrap();
        assert!(wal.is_empty());
        wal.append(6, &[(6, &purge(6))]).unwrap();
        drop(wal);
        // The reset came after a checkpoint of batch 5.
        let (_, found) = Wal::open(path, None, 5, ID, true).unwrap();
        assert_eq!(seqs(&found), [6], "the old records 2..5 after it are stale");
    }

    #[test]
    fn a_record_taken_back_is_not_replayed() {
        let dir = tempfile::TempDir::new().unwrap();
        let path = dir.path().join("x.wal");
        let (mut wal, _) = Wal::open(path.clone(), None, 0, ID, true).unwrap();
        wal.append(1, &[(1, &purge(1))]).unwrap();
        let before = wal.len();
        wal.append(2, &[(2, &purge(2))]).unwrap();
        wal.cut_to(before).unwrap();
        drop(wal);
        let (_, found) = Wal::open(path, None, 0, ID, true).unwrap();
        assert_eq!(seqs(&found), [1]);
    }

    #[test]
    fn a_failed_append_leaves_nothing_to_replay() {
        let dir = tempfile::TempDir::new().unwrap();
        let path = dir.path().join("x.wal");
        let plan = FaultPlan::new();
        let (mut wal, _) = Wal::open(path.clone(), Some(plan.clone()), 0, ID, true).unwrap();
        wal.append(1, &[(1, &purge(1))]).unwrap();
        plan.fail_next_writes(1);
        assert!(wal.append(2, &[(2, &purge(2))]).is_err());
        drop(wal);
        let (_, found) = Wal::open(path, None, 0, ID, true).unwrap();
        assert_eq!(seqs(&found), [1], "not written: never acknowledged");
    }

    #[test]
    fn a_failed_sync_is_reported_to_the_syncer() {
        let dir = tempfile::TempDir::new().unwrap();
        let plan = FaultPlan::new();
        let (mut wal, _) =
            Wal::open(dir.path().join("x.wal"), Some(plan.clone()), 0, ID, true).unwrap();
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
        assert!(Wal::open(path, None, 0, ID, true).is_err());
    }

    #[test]
    fn a_log_of_another_data_file_is_refused_and_left_as_it_is() {
        let dir = tempfile::TempDir::new().unwrap();
        let path = dir.path().join("x.wal");
        let (mut wal, _) = Wal::open(path.clone(), None, 0, ID, true).unwrap();
        wal.append(1, &[(1, &purge(1))]).unwrap();
        drop(wal);
        let before = std::fs::read(&path).unwrap();
        let err = Wal::open(path.clone(), None, 0, ID + 1, true).unwrap_err();
        assert!(
            matches!(err, LogError::Foreign { log_id: Some(id) } if id == ID),
            "{err:?}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), before, "untouched");
        let (_, found) = Wal::open(path, None, 0, ID, true).unwrap();
        assert_eq!(seqs(&found), [1]);
    }

    /// A format 1 log: its header, then records as this build writes them.
    fn v1_log(path: &Path, batches: u64) {
        let (mut wal, _) = Wal::open(path.to_owned(), None, 0, ID, true).unwrap();
        for seq in 1..=batches {
            wal.append(seq, &[(seq, &purge(seq))]).unwrap();
        }
        drop(wal);
        let mut bytes = std::fs::read(path).unwrap();
        bytes.splice(..HEADER, *b"DDWAL01\n");
        std::fs::write(path, bytes).unwrap();
    }

    #[test]
    fn a_format_1_log_replays_only_beside_an_unbound_file_and_is_then_rewritten() {
        let dir = tempfile::TempDir::new().unwrap();
        let path = dir.path().join("x.wal");
        v1_log(&path, 3);
        let err = Wal::open(path.clone(), None, 0, ID, true).unwrap_err();
        assert!(matches!(err, LogError::Foreign { log_id: None }), "{err:?}");
        let (mut wal, found) = Wal::open(path.clone(), None, 0, ID, false).unwrap();
        assert_eq!(seqs(&found), [1, 2, 3]);
        // Checkpointed: the log starts over, bound to its file.
        wal.reset().unwrap();
        wal.append(4, &[(4, &purge(4))]).unwrap();
        drop(wal);
        let header = format!("DDWAL{FORMAT:02}\n");
        assert!(std::fs::read(&path).unwrap().starts_with(header.as_bytes()));
        let (_, found) = Wal::open(path, None, 3, ID, true).unwrap();
        assert_eq!(seqs(&found), [4]);
    }

    #[test]
    fn a_record_that_passes_its_checksum_but_does_not_decode_is_refused_not_cut() {
        let dir = tempfile::TempDir::new().unwrap();
        let path = dir.path().join("x.wal");
        let (mut wal, _) = Wal::open(path.clone(), None, 0, ID, true).unwrap();
        wal.append(1, &[(1, &purge(1))]).unwrap();
        let second = wal.len() as usize;
        wal.append(2, &[(2, &purge(2))]).unwrap();
        drop(wal);
        // Batch 2's payload replaced by its number and a request tag no
        // build knows, with a checksum that holds: what a build with
        // another request encoding would have written.
        let mut bytes = std::fs::read(&path).unwrap();
        let mut payload = postcard::to_stdvec(&2u64).unwrap();
        payload.extend([1, 1, 0xEE, 0x7F]);
        let mut record = (payload.len() as u32).to_le_bytes().to_vec();
        record.extend(crc32fast::hash(&payload).to_le_bytes());
        record.extend(&payload);
        bytes.splice(second..second + record.len(), record);
        std::fs::write(&path, &bytes).unwrap();
        let err = Wal::open(path.clone(), None, 0, ID, true).unwrap_err();
        assert!(
            matches!(
                err,
                LogError::Undecodable {
                    seq: 2,
                    version: FORMAT,
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "not cut off");
        // Once the data file holds batch 2, the record is not replayed.
        let (_, found) = Wal::open(path, None, 2, ID, true).unwrap();
        assert!(found.is_empty());
    }

    #[test]
    fn a_log_of_a_newer_format_is_refused() {
        let dir = tempfile::TempDir::new().unwrap();
        let path = dir.path().join("x.wal");
        let mut h = header(ID);
        h[5..7].copy_from_slice(b"09");
        let crc = crc32fast::hash(&h[..24]);
        h[24..].copy_from_slice(&crc.to_le_bytes());
        std::fs::write(&path, h).unwrap();
        let err = Wal::open(path.clone(), None, 0, ID, true).unwrap_err();
        assert!(matches!(err, LogError::Version { found: 9 }), "{err:?}");
        assert_eq!(std::fs::read(&path).unwrap(), h);
    }
}
