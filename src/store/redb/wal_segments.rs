//! The write-ahead log in two segments, so a checkpoint's sync can be made
//! beside new writes (see [`super::sync_gate`]).
//!
//! A checkpoint records the last batch the data file holds; once it is on
//! disk, the log's records up to it are no longer needed. When the
//! checkpoint's sync is handed to another thread, the writer goes on
//! logging batches before it is made, and the records the checkpoint
//! covers must stay until then. So the log is two files, `dedupd.redb.wal`
//! and `dedupd.redb.wal2`, both bound to the data file: at such a
//! checkpoint the writer goes on in the other segment, and empties the one
//! it left only at the next checkpoint, once the sync before was made.
//! A checkpoint the writer makes itself (at a stop, when idle, for room on
//! the disk) empties both.
//!
//! At most one checkpoint's sync is outstanding, so after a crash the
//! batches the data file lacks are in one segment or in both: the first
//! segment's from the one after the file's last, the other's from the one
//! after the first segment's last. Opening reads both and joins them; a
//! segment that does not join is refused, as a gap in one log is.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::faults::FaultPlan;
use super::record::Batch;
use super::wal::{self, LogError, Wal, WalSync};

/// The second segment's path for a data file: `dedupd.redb` →
/// `dedupd.redb.wal2` (the first is [`wal::path_for`]'s).
pub fn spare_path_for(data: &Path) -> PathBuf {
    let mut p = data.as_os_str().to_owned();
    p.push(".wal2");
    PathBuf::from(p)
}

/// Both segments' paths for a data file, the first one first.
pub fn paths_for(data: &Path) -> [PathBuf; 2] {
    [wal::path_for(data), spare_path_for(data)]
}

/// The log: the segment appended to, and the other.
#[derive(Debug)]
pub struct Segments {
    /// Where batches are appended.
    pub active: Wal,
    /// The other one: empty, or holding the batches of a checkpoint whose
    /// sync may not be made yet.
    pub spare: Wal,
}

/// A segment that could not be opened: which, and why.
#[derive(Debug)]
pub struct SegmentError {
    /// The segment's file.
    pub path: PathBuf,
    pub error: LogError,
}

impl Segments {
    /// Opens (or creates) both segments of the data file at `data` (its id
    /// `id`; `bound` as [`Wal::open_segment`] takes it), and returns the batches
    /// numbered after `after` from both, in order. The first segment is
    /// the one appended to.
    pub fn open(
        data: &Path,
        faults: Option<&Arc<FaultPlan>>,
        after: u64,
        id: u128,
        bound: bool,
    ) -> Result<(Self, Vec<Batch>), SegmentError> {
        let [first, second] = paths_for(data);
        let open = |path: PathBuf| {
            Wal::open_segment(path.clone(), faults.cloned(), after, id, bound, true)
                .map_err(|error| SegmentError { path, error })
        };
        let (active, a) = open(first.clone())?;
        let (spare, b) = open(second.clone())?;
        let batches = join(after, a, b).map_err(|error| SegmentError { path: first, error })?;
        Ok((Self { active, spare }, batches))
    }

    /// Bytes of records in both segments, for the room a replay at open
    /// needs (either may hold batches to replay).
    pub fn len(&self) -> u64 {
        let spare = if self.spare.is_empty() {
            0
        } else {
            self.spare.len()
        };
        self.active.len().saturating_add(spare)
    }

    /// Empties both, after a checkpoint made every batch durable in the
    /// data file.
    pub fn reset(&mut self) -> std::io::Result<()> {
        self.active.reset()?;
        self.spare.reset()
    }

    /// Empties both for good (see [`Wal::start_over`]).
    pub fn start_over(&mut self) -> std::io::Result<()> {
        self.active.start_over()?;
        self.spare.start_over()
    }

    /// Goes on in the other segment, after a checkpoint of everything
    /// logged so far whose sync is handed over. The other segment's batches
    /// must be durable in the data file (the checkpoint before this one was
    /// synced): it is emptied. Returns a handle that syncs the segment now
    /// appended to, for the writer's syncs.
    ///
    /// The segment left is synced first. Its last records may not be yet
    /// (a batch logged but refused is not synced), and the disk may write the
    /// new segment's records before them: after a power cut the two would
    /// not join, and opening would refuse the log, though nothing after
    /// the missing records was acknowledged.
    pub fn swap(&mut self) -> std::io::Result<WalSync> {
        self.active.sync()?;
        let sync = self.spare.syncer()?;
        self.spare.reset()?;
        std::mem::swap(&mut self.active, &mut self.spare);
        Ok(sync)
    }
}

/// Reads both segments of the data file at `data` (its id `id`, `bound`
/// as [`Segments::open`] takes it) without changing either, and returns
/// the batches numbered after `after` that opening would replay: for
/// `verify`, which must not write. An absent segment holds none.
pub fn read(data: &Path, after: u64, id: u128, bound: bool) -> Result<Vec<Batch>, SegmentError> {
    let read = |path: PathBuf| -> Result<Vec<Batch>, SegmentError> {
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => {
                return Err(SegmentError {
                    path,
                    error: LogError::Io(e),
                });
            }
        };
        match wal::read_segment(&bytes, after, id, bound, true) {
            Ok(wal::Decoded::Log { batches, .. }) => Ok(batches),
            Ok(wal::Decoded::New) => Ok(Vec::new()),
            Err(error) => Err(SegmentError { path, error }),
        }
    };
    let [first, second] = paths_for(data);
    let a = read(first.clone())?;
    let b = read(second)?;
    join(after, a, b).map_err(|error| SegmentError { path: first, error })
}

/// The batches of both segments (each consecutive, after `after`) as one
/// run from the batch after `after`.
fn join(after: u64, a: Vec<Batch>, b: Vec<Batch>) -> Result<Vec<Batch>, LogError> {
    let (mut first, second) = match (a.first(), b.first()) {
        (Some(x), Some(y)) if y.seq < x.seq => (b, a),
        (None, _) => (b, a),
        _ => (a, b),
    };
    if let Some(start) = first.first().map(|b| b.seq)
        && start != after + 1
    {
        return Err(LogError::Gap {
            holds: after,
            first: start,
        });
    }
    if let (Some(ends), Some(next)) = (first.last().map(|b| b.seq), second.first().map(|b| b.seq))
        && next != ends + 1
    {
        return Err(LogError::Segments { ends, next });
    }
    first.extend(second);
    Ok(first)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::redb::record::Request;

    const ID: u128 = 0x0123_4567_89ab_cdef_0011_2233_4455_6677;

    fn append(wal: &mut Wal, seqs: std::ops::RangeInclusive<u64>) {
        for seq in seqs {
            wal.append(seq, &[(seq, &Request::Purge { limit: seq })])
                .unwrap();
        }
    }

    fn seqs(batches: &[Batch]) -> Vec<u64> {
        batches.iter().map(|b| b.seq).collect()
    }

    #[test]
    fn the_batches_of_both_segments_are_joined_in_order() {
        let dir = tempfile::TempDir::new().unwrap();
        let data = dir.path().join("d.redb");
        let (mut log, found) = Segments::open(&data, None, 0, ID, true).unwrap();
        assert!(found.is_empty());
        append(&mut log.active, 1..=3);
        // A checkpoint of 1..=3 whose sync is handed over: 4.. go to the
        // other segment.
        let _ = log.swap().unwrap();
        append(&mut log.active, 4..=5);
        drop(log);
        // The checkpoint's sync was not made: the file holds nothing.
        let (mut log, found) = Segments::open(&data, None, 0, ID, true).unwrap();
        assert_eq!(seqs(&found), [1, 2, 3, 4, 5]);
        // It was: only the later segment's batches are replayed.
        let (_, found) = Segments::open(&data, None, 3, ID, true).unwrap();
        assert_eq!(seqs(&found), [4, 5]);
        // The next swap empties the first segment (its batches are durable)
        // and appends there again, over its old records.
        log.active.reset().unwrap();
        log.spare.reset().unwrap();
        append(&mut log.active, 6..=6);
        let _ = log.swap().unwrap();
        append(&mut log.active, 7..=7);
        drop(log);
        let (_, found) = Segments::open(&data, None, 5, ID, true).unwrap();
        assert_eq!(seqs(&found), [6, 7]);
        let (_, found) = Segments::open(&data, None, 6, ID, true).unwrap();
        assert_eq!(seqs(&found), [7]);
    }

    #[test]
    fn segments_that_do_not_join_are_refused() {
        let dir = tempfile::TempDir::new().unwrap();
        let data = dir.path().join("d.redb");
        let (mut log, _) = Segments::open(&data, None, 0, ID, true).unwrap();
        append(&mut log.active, 1..=3);
        let _ = log.swap().unwrap();
        append(&mut log.active, 4..=5);
        drop(log);
        // The first segment lost: 1..=3 are in neither file.
        let [first, second] = paths_for(&data);
        std::fs::remove_file(&first).unwrap();
        let err = Segments::open(&data, None, 0, ID, true).unwrap_err();
        assert!(
            matches!(err.error, LogError::Gap { holds: 0, first: 4 }),
            "{err:?}"
        );
        // Both there, but the second starts two batches late.
        let (mut log, _) = Segments::open(&dir.path().join("e.redb"), None, 0, ID, true).unwrap();
        append(&mut log.active, 1..=3);
        log.spare.reset().unwrap();
        append(&mut log.spare, 6..=7);
        drop(log);
        let err = Segments::open(&dir.path().join("e.redb"), None, 0, ID, true).unwrap_err();
        assert!(
            matches!(err.error, LogError::Segments { ends: 3, next: 6 }),
            "{err:?}"
        );
        assert!(second.exists());
    }

    fn run(seqs: std::ops::RangeInclusive<u64>) -> Vec<Batch> {
        seqs.map(|seq| Batch { seq, ops: vec![] }).collect()
    }

    proptest::proptest! {
        /// However a run of batches is split between the segments (the
        /// earlier part in either file), and wherever the data file's
        /// checkpoint is, the join is exactly the batches after it.
        #[test]
        fn a_split_run_joins_whichever_segment_holds_its_start(
            n in 0u64..12, cut in 0u64..12, after in 0u64..12, flip: bool,
        ) {
            let (cut, after) = (cut.min(n), after.min(n));
            // Each segment's batches after the checkpoint, as parsing
            // gives them.
            let a = run(after + 1..=cut);
            let b = run(after.max(cut) + 1..=n);
            let (a, b) = if flip { (b, a) } else { (a, b) };
            let joined = join(after, a, b).unwrap();
            proptest::prop_assert_eq!(seqs(&joined), (after + 1..=n).collect::<Vec<_>>());
        }

        /// A batch missing anywhere (at the start or between the two) is
        /// refused, never replayed with a hole.
        #[test]
        fn a_run_with_a_batch_missing_is_refused(
            n in 1u64..12, cut in 0u64..12, missing in 0u64..12, flip: bool,
        ) {
            let cut = cut.min(n);
            let missing = missing.min(n - 1) + 1;
            let keep = |seqs: std::ops::RangeInclusive<u64>| -> Vec<Batch> {
                run(seqs).into_iter().filter(|b| b.seq != missing).collect()
            };
            let (a, b) = (keep(1..=cut), keep(cut + 1..=n));
            // A missing batch inside one segment is the parser's to
            // refuse (a segment's batches are consecutive); here it is
            // at a segment's start or end.
            let inside = |s: &[Batch]| s.windows(2).any(|w| w[1].seq != w[0].seq + 1);
            proptest::prop_assume!(!inside(&a) && !inside(&b));
            let (a, b) = if flip { (b, a) } else { (a, b) };
            let refused = join(0, a, b).is_err();
            proptest::prop_assert!(refused || missing == n, "a hole was joined");
        }
    }

    #[test]
    fn a_segment_of_another_data_file_is_refused_by_its_path() {
        let dir = tempfile::TempDir::new().unwrap();
        let data = dir.path().join("d.redb");
        drop(Segments::open(&data, None, 0, ID, true).unwrap());
        let other = dir.path().join("o.redb");
        drop(Segments::open(&other, None, 0, ID + 1, true).unwrap());
        std::fs::copy(spare_path_for(&other), spare_path_for(&data)).unwrap();
        let err = Segments::open(&data, None, 0, ID, true).unwrap_err();
        assert!(matches!(err.error, LogError::Foreign { .. }), "{err:?}");
        assert_eq!(err.path, spare_path_for(&data));
    }
}
