//! Free disk space, and the watermark that keeps the store off a full disk.
//!
//! A full disk used to be a trap: the write-ahead log had taken the last
//! bytes, and a checkpoint, which writes what the log holds into the data
//! file, needs about as much room again. Nothing could be checkpointed, so
//! nothing could be written, and a restart could not even open the file.
//!
//! Elasticsearch's flood stage is the model. With `F` bytes free on the
//! data file's filesystem and `W` the watermark (`storage.min_free_bytes`):
//! - before a batch, if `F` minus what a checkpoint of the log would write
//!   ([`checkpoint_need`]) is below `W`, the writer checkpoints first, so
//!   the log's contents move into the data file while they still fit;
//! - a batch of requests is admitted only if, after it and a checkpoint of
//!   everything logged, `W` would still be free ([`admits`]); otherwise
//!   its writes are refused (HTTP 507 with `Retry-After`, a Redis-style
//!   error on the RESP port) and nothing changes;
//! - deliveries' own bookkeeping and the reaper go on down to half the
//!   watermark (the reaper frees room; a delivery records its outcome);
//! - reads never wait on any of this.
//!
//! So the disk never fills in normal operation, the last `W` bytes always
//! hold a checkpoint and a replay, and writes resume as soon as space
//! frees. A disk that fills faster than this sees (another program writing)
//! still ends in the disk-fault path: the file is reopened until it can
//! commit again.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::faults::FaultPlan;

/// The bytes a small write (a claim) is taken to need.
pub const SMALL_WRITE: u64 = 256;

/// What a checkpoint of `logged` bytes of log writes into the data file, at
/// most: each logged byte lands once in a page (a webhook body in overflow
/// pages, a claim in a leaf), and copy-on-write can need a second copy of
/// the pages it touches before the old ones are free. Plus a margin for
/// the commit's own pages (allocator state, the freed-page tree).
pub fn checkpoint_need(logged: u64) -> u64 {
    logged.saturating_mul(2).saturating_add(1024 * 1024)
}

/// Whether a batch of `incoming` bytes may run with `free` bytes free and
/// `logged` bytes in the log since the last checkpoint: after it, and after
/// a checkpoint of the log it then holds, `floor` bytes are still free.
pub fn admits(free: u64, floor: u64, logged: u64, incoming: u64) -> bool {
    let after = free.saturating_sub(incoming);
    after >= floor.saturating_add(checkpoint_need(logged.saturating_add(incoming)))
}

/// Whether to checkpoint before the next batch: what the log holds would
/// not leave `floor` free once written into the data file.
pub fn checkpoint_first(free: u64, floor: u64, logged: u64) -> bool {
    logged > 0 && free < floor.saturating_add(checkpoint_need(logged))
}

/// How much the log should grow at a time with `free` bytes free: its usual
/// step, but never more than an eighth of what is free above the watermark
/// (the zeros written ahead are real bytes on disk).
pub fn log_growth(usual: u64, free: u64, floor: u64) -> u64 {
    (free.saturating_sub(floor) / 8).clamp(64 * 1024, usual.max(64 * 1024))
}

/// The free space of the data file's filesystem, read at most every
/// [`Space::FRESH`] (and at every batch near the watermark).
#[derive(Debug)]
pub struct Space {
    /// A directory on that filesystem: the data file's.
    dir: PathBuf,
    /// The watermark, bytes.
    floor: u64,
    /// The last reading, bytes available to this process.
    free: AtomicU64,
    /// When it was taken.
    read_at: Mutex<Option<Instant>>,
    /// Writes are being refused (the last batch was below the watermark).
    low: AtomicBool,
    /// Bytes in the log since the last checkpoint, as the writer last saw.
    logged: AtomicU64,
    /// The largest write refused since writes were last all taken: ready
    /// again once one that size would be taken.
    refused: AtomicU64,
    /// Tests set the free space through this (see [`FaultPlan`]).
    faults: Option<Arc<FaultPlan>>,
}

impl Space {
    /// Readings older than this are taken again.
    pub const FRESH: Duration = Duration::from_millis(100);

    /// Watches the filesystem of the data file `path`, with `floor` bytes
    /// kept free. Reads it once now.
    pub fn new(path: &Path, floor: u64, faults: Option<Arc<FaultPlan>>) -> Self {
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
            _ => PathBuf::from("."),
        };
        let space = Self {
            dir,
            floor,
            free: AtomicU64::new(u64::MAX),
            read_at: Mutex::new(None),
            low: AtomicBool::new(false),
            logged: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            faults,
        };
        space.read();
        space
    }

    /// The watermark.
    pub fn floor(&self) -> u64 {
        self.floor
    }

    /// Reads the free space now (`u64::MAX` if the filesystem cannot say:
    /// then only the disk-fault path guards it).
    pub fn read(&self) -> u64 {
        let set = self.faults.as_ref().and_then(|f| f.free_bytes());
        let free = match set.map_or_else(
            || rustix::fs::statvfs(&self.dir).map(|s| s.f_bavail.saturating_mul(s.f_frsize)),
            Ok,
        ) {
            Ok(free) => free,
            Err(e) => {
                tracing::warn!(error = %e, dir = %self.dir.display(), "cannot read the free disk space");
                u64::MAX
            }
        };
        self.free.store(free, Ordering::Relaxed);
        if let Ok(mut at) = self.read_at.lock() {
            *at = Some(Instant::now());
        }
        free
    }

    /// The free space: the last reading if it is fresh and far from the
    /// watermark, a new one otherwise.
    pub fn free(&self) -> u64 {
        let last = self.free.load(Ordering::Relaxed);
        let fresh = self
            .read_at
            .lock()
            .ok()
            .and_then(|at| *at)
            .is_some_and(|at| at.elapsed() < Self::FRESH);
        // Near the watermark every batch counts: read each time.
        let near = last
            < self
                .floor
                .saturating_mul(2)
                .saturating_add(64 * 1024 * 1024);
        // A test's plan answers at once: no reading is kept.
        if fresh && !near && self.faults.is_none() {
            last
        } else {
            self.read()
        }
    }

    /// The last reading, without reading again.
    pub fn last(&self) -> u64 {
        self.free.load(Ordering::Relaxed)
    }

    /// Whether the writes refused lately (or, if none was, the smallest a
    /// client makes) would be taken now with `free` bytes free: the
    /// writer's rule, for readiness.
    pub fn takes_a_write(&self, free: u64) -> bool {
        let size = self.refused.load(Ordering::Relaxed).max(SMALL_WRITE);
        admits(free, self.floor, self.logged.load(Ordering::Relaxed), size)
    }

    /// Records the size of a client's write refused for want of room.
    pub fn refused(&self, bytes: u64) {
        self.refused.fetch_max(bytes, Ordering::Relaxed);
    }

    /// Records what the log holds since the last checkpoint.
    pub fn set_logged(&self, bytes: u64) {
        self.logged.store(bytes, Ordering::Relaxed);
    }

    /// Whether writes were refused at the last batch.
    pub fn is_low(&self) -> bool {
        self.low.load(Ordering::Relaxed)
    }

    /// Records whether writes are being refused, logging the changes.
    pub fn set_low(&self, low: bool) {
        if !low {
            self.refused.store(0, Ordering::Relaxed);
        }
        if self.low.swap(low, Ordering::Relaxed) != low {
            let free = self.last();
            if low {
                tracing::warn!(
                    free_bytes = free,
                    min_free_bytes = self.floor,
                    "free disk space is below the watermark: writes are refused until space frees"
                );
            } else {
                tracing::info!(
                    free_bytes = free,
                    "free disk space is back above the watermark: writes resume"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;

    #[test]
    fn a_batch_is_admitted_only_if_a_checkpoint_of_everything_still_leaves_the_watermark() {
        // 20 MiB free, 8 MiB watermark, nothing logged: room for a batch of
        // about (20 - 8 - 1) / 3 MiB.
        assert!(admits(20 * MIB, 8 * MIB, 0, 3 * MIB));
        assert!(!admits(20 * MIB, 8 * MIB, 0, 4 * MIB));
        // With 3 MiB logged already, the same batch no longer fits.
        assert!(!admits(20 * MIB, 8 * MIB, 3 * MIB, 3 * MIB));
        // Below the watermark nothing is admitted, not even an empty batch.
        assert!(!admits(7 * MIB, 8 * MIB, 0, 0));
        assert!(!admits(0, 8 * MIB, 0, 1));
    }

    #[test]
    fn the_log_is_checkpointed_before_its_contents_stop_fitting() {
        assert!(!checkpoint_first(20 * MIB, 8 * MIB, 0), "nothing to write");
        assert!(!checkpoint_first(20 * MIB, 8 * MIB, 5 * MIB));
        assert!(checkpoint_first(20 * MIB, 8 * MIB, 6 * MIB));
        assert!(checkpoint_first(MIB, 8 * MIB, 1));
    }

    #[test]
    fn the_log_grows_by_less_when_little_is_free() {
        let usual = 8 * MIB;
        assert_eq!(log_growth(usual, 10 * 1024 * MIB, 8 * MIB), usual);
        assert_eq!(log_growth(usual, 24 * MIB, 8 * MIB), 2 * MIB);
        assert_eq!(log_growth(usual, 8 * MIB, 8 * MIB), 64 * 1024);
        assert_eq!(log_growth(usual, 0, 8 * MIB), 64 * 1024);
    }

    #[test]
    fn a_reading_comes_from_the_filesystem_of_the_data_file() {
        let dir = tempfile::TempDir::new().unwrap();
        let space = Space::new(&dir.path().join("d.redb"), MIB, None);
        let free = space.free();
        assert!(free > 0 && free < u64::MAX, "{free}");
        assert!(!space.is_low());
    }
}
