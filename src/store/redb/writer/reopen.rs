//! Recovery after a disk fault: the writer gives the file up, opens it
//! again and replays the log onto it, up to the last batch answered `Ok`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::replay::{replay_up_to, stored_seq};
use super::{Logged, Writer};
use crate::store::redb::migrate::stored_file_id;
use crate::store::redb::open::open_db;
use crate::store::redb::wal;
use crate::store::redb::wal_segments::Segments;

impl Writer<'_> {
    /// Reopens the file after a fault ([`Writer::reopen`]) and marks it
    /// writable; `Err` while it still cannot be written.
    pub(super) fn recover(&mut self) -> Result<(), ()> {
        match self.reopen() {
            Ok(()) => {
                self.shared.healthy.store(true, Ordering::SeqCst);
                tracing::info!("data file writable again: writes resume");
                Ok(())
            }
            Err(e) => {
                tracing::debug!(error = %e, "data file still cannot be written");
                Err(())
            }
        }
    }

    /// Closes the faulty database (once readers let go of it), opens the
    /// file again, replays the log onto it and proves it with a durable
    /// commit.
    fn reopen(&mut self) -> Result<(), redb::Error> {
        let shared = self.shared;
        // Once every batch logged is answered, those answered `Ok` are
        // exactly those up to the watermark's durable one.
        self.syncer.barrier();
        let acknowledged = shared.watermark.durable();
        // Commits after the last answered batch must not survive the close.
        if let Ok(refuse) = shared.refuse.lock() {
            refuse.store(true, Ordering::SeqCst);
        }
        // Readers wait (up to their deadline) from here until the file is
        // back.
        let old = shared.set_db(None).or_else(|| self.db.take());
        self.db = None;
        if let Some(mut old) = old {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match Arc::try_unwrap(old) {
                    Ok(d) => {
                        drop(d);
                        break;
                    }
                    Err(still) if Instant::now() < deadline => {
                        old = still;
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err(still) => {
                        // A reader holds on: try again on the next attempt.
                        shared.set_db(Some(still));
                        return Err(redb::Error::PreviousIo);
                    }
                }
            }
        }
        // Non-durable commits went with the old handle; the log has them
        // all.
        self.log = None;
        // The failed file is closed: a checkpoint's sync that failed with
        // it is the old file's, not the fresh one's.
        shared.gate.clear();
        let refuse = Arc::new(AtomicBool::new(false));
        let fresh = open_db(self.opts, refuse.clone(), shared.gate.clone())?;
        if let Ok(mut current) = shared.refuse.lock() {
            *current = refuse;
        }
        // The same file, so the same id: a log refused now was replaced
        // under the running process, and the file stays closed until it is
        // fixed.
        let (mut segments, batches) = Segments::open(
            &self.opts.path,
            self.opts.faults.as_ref(),
            stored_seq(&fresh)?,
            stored_file_id(&fresh)?,
            true,
        )
        .map_err(|e| match e.error {
            wal::LogError::Io(e) => redb::Error::Io(e),
            other => {
                redb::Error::Corrupted(format!("write-ahead log {}: {other}", e.path.display()))
            }
        })?;
        let seq = replay_up_to(&fresh, &shared.kv, batches, acknowledged)?;
        segments.start_over()?;
        // The refused batches' records can no longer be replayed: the
        // slots lent to their seals may be shredded and lent again.
        shared.seals.release_held();
        shared.counts.recount(&fresh)?;
        self.syncer.resume(segments.active.syncer()?);
        // The file first, then the epoch: a read that sees the new epoch
        // finds the file open (one that took the file with the old epoch
        // runs again).
        let fresh = Arc::new(fresh);
        shared.set_db(Some(fresh.clone()));
        shared.watermark.reopened(seq);
        self.db = Some(fresh);
        self.log = Some(Logged {
            segments,
            seq,
            checkpointed: Instant::now(),
        });
        Ok(())
    }
}
