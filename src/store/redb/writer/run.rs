//! The writer's loop: take the writes waiting in the queue, run them as one
//! batch in the open transaction, sync the log and answer them, commit
//! and checkpoint when due; reopen the file after a disk fault.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::error::TryRecvError;

use super::batch::{self, run_batch};
use super::{Envelope, REOPEN_FIRST, REOPEN_MAX, Writer};
use crate::store::redb::error::{EngineError, is_disk_fault};
use crate::store::redb::syncer::Synced;

/// What the loop does after waiting for the queue.
enum Next {
    /// Collect a batch from here.
    Message(Envelope),
    /// The wait ended with a commit or a checkpoint: go round again.
    Again,
    /// The queue is closed: every sender is gone.
    Closed,
}

impl From<Option<Envelope>> for Next {
    fn from(env: Option<Envelope>) -> Self {
        env.map_or(Next::Closed, Next::Message)
    }
}

impl Writer<'_> {
    /// Runs until a shutdown is taken from the queue or the queue closes,
    /// then commits what it holds.
    pub(super) fn run(mut self) {
        while !self.stopping {
            if !self.shared.is_healthy() {
                self.open = None;
                if self.recover().is_ok() {
                    self.reopen_wait = REOPEN_FIRST;
                } else {
                    if !self.refuse_until_retry() {
                        return;
                    }
                    continue;
                }
            }
            if self.commit_due() {
                self.commit_open();
            }
            let first = match self.next() {
                Next::Message(env) => env,
                Next::Again => continue,
                Next::Closed => break,
            };
            self.collect(first);
            if !self.batch.is_empty() {
                self.write_batch();
            }
            self.checkpoint_if_due();
        }
        self.commit_open();
    }

    /// After a failed reopen: refuses what waits in the queue until the
    /// next attempt is due (the wait doubles each time), or sooner once a
    /// read waits for the file. False when a shutdown came or the queue
    /// closed: the writer stops.
    fn refuse_until_retry(&mut self) -> bool {
        let deadline = Instant::now() + self.reopen_wait;
        self.reopen_wait = (self.reopen_wait * 2).min(REOPEN_MAX);
        let tried = Instant::now();
        while Instant::now() < deadline {
            // A read waits for the file: try again soon.
            if tried.elapsed() >= REOPEN_FIRST
                && self.shared.reopen_wanted.swap(false, Ordering::SeqCst)
            {
                break;
            }
            loop {
                match self.rx.try_recv() {
                    Ok(Envelope::Write { reply, .. }) => {
                        let _ = reply.send(Err(EngineError::DiskRefused));
                    }
                    Ok(Envelope::Ping(reply)) => self.syncer.ping(reply),
                    Ok(Envelope::Shutdown) | Err(TryRecvError::Disconnected) => return false,
                    Err(TryRecvError::Empty) => break,
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }

    /// Waits for the next message. While a transaction is held, the wait
    /// ends with the hold (or when a read wants it committed), and the
    /// transaction is committed; while only the log holds something, it
    /// ends after `storage.checkpoint_idle`, with a checkpoint.
    fn next(&mut self) -> Next {
        let logged = self
            .log
            .as_ref()
            .is_some_and(|l| !l.segments.active.is_empty());
        let (timer, hold_until) = match (&self.timer, &self.open) {
            (Some(timer), Some(o)) => (timer, Some(o.since + self.hold)),
            (Some(timer), None) if logged => (timer, None),
            _ => return self.rx.blocking_recv().into(),
        };
        match self.rx.try_recv() {
            Ok(env) => return Next::Message(env),
            Err(TryRecvError::Disconnected) => return Next::Closed,
            Err(TryRecvError::Empty) => {}
        }
        let rx = &mut self.rx;
        match hold_until {
            Some(until) => {
                // Holding a transaction: the next write, a read that wants
                // it committed, or the end of the hold.
                let until = tokio::time::Instant::from_std(until);
                let watermark = &self.shared.watermark;
                let wait = async {
                    tokio::select! {
                        env = rx.recv() => Some(env),
                        () = watermark.commit_asked() => None,
                        () = tokio::time::sleep_until(until) => None,
                    }
                };
                match timer.block_on(wait) {
                    Some(env) => env.into(),
                    None => {
                        self.commit_open();
                        Next::Again
                    }
                }
            }
            None => {
                // The timer is made inside: it needs the runtime.
                let idle = self.opts.checkpoint_idle;
                let wait = async { tokio::time::timeout(idle, rx.recv()).await };
                match timer.block_on(wait) {
                    Ok(env) => env.into(),
                    Err(_) => {
                        let _ = self.checkpoint_now("idle");
                        Next::Again
                    }
                }
            }
        }
    }

    /// Takes `first` and whatever else waits in the queue into the batch,
    /// up to `max_batch` writes; pings are answered (every batch before
    /// them is), a shutdown ends
    /// the batch.
    fn collect(&mut self, first: Envelope) {
        let mut next = Some(first);
        while let Some(env) = next.take() {
            match env {
                Envelope::Write {
                    request,
                    now,
                    reply,
                } => self.batch.push((request, now, reply)),
                Envelope::Ping(reply) => self.syncer.ping(reply),
                Envelope::Shutdown => {
                    self.stopping = true;
                    break;
                }
            }
            if self.batch.len() >= self.max_batch {
                break;
            }
            next = self.rx.try_recv().ok();
        }
    }

    /// Runs the collected batch, logs it, syncs the log and answers its
    /// callers; commits now when a checkpoint or the stop needs it, when a
    /// read waits for it, or when the transaction is old enough (otherwise
    /// it stays open for the next batch). A failed batch answers every
    /// caller in it with the error, and nothing in it took effect.
    fn write_batch(&mut self) {
        let shared = self.shared;
        // A sync (or a commit, or a read) may have failed since the last
        // batch: what ran after the failure must be gone before this one
        // runs, so the file is reopened first.
        if !shared.is_healthy() {
            self.open = None;
            if self.recover().is_err() {
                for (_, _, reply) in self.batch.drain(..) {
                    let _ = reply.send(Err(EngineError::DiskRefused));
                }
                return;
            }
        }
        self.make_room();
        self.cap_keys();
        if self.batch.is_empty() {
            return;
        }
        self.run_collected();
    }

    /// Runs the batch as collected and sifted (see [`Writer::write_batch`]).
    pub(super) fn run_collected(&mut self) {
        let shared = self.shared;
        let started = Instant::now();
        let (ops, replies): (Vec<_>, Vec<_>) = self
            .batch
            .drain(..)
            .map(|(request, now, reply)| ((now, request), reply))
            .unzip();
        let result = match (&self.db, self.log.as_mut()) {
            (Some(db), Some(log)) => run_batch(
                db,
                log,
                ops,
                shared,
                &mut self.open,
                self.opts.faults.as_deref(),
            ),
            _ => Err(redb::Error::PreviousIo),
        };
        let result = result.and_then(|mut ran| {
            let due = self.stopping
                || self
                    .log
                    .as_ref()
                    .is_some_and(|l| l.checkpoint_due(self.opts))
                || self.commit_due();
            if due && let (Some(log), Some(o)) = (self.log.as_mut(), self.open.take()) {
                batch::commit(shared, self.counters, o).inspect_err(|_| {
                    // Logged but not applied: cut the record, or a replay
                    // would apply what was refused. The batches before it
                    // in the transaction were answered (or will be): the
                    // reopen replays them.
                    let _ = log.segments.active.cut_to(ran.logged_at);
                    // Should the cut not reach the disk, a crash could
                    // replay it: its seals' slots wait for the reopen.
                    drop(std::mem::take(&mut ran.lent));
                })?;
            }
            Ok(ran)
        });
        match result {
            Ok(ran) => {
                shared.counts.apply(ran.deltas);
                self.counters
                    .operations
                    .fetch_add(replies.len() as u64, Ordering::Relaxed);
                let batch = Synced {
                    seq: ran.seq,
                    started,
                    replies: replies.into_iter().zip(ran.responses).collect(),
                    freed: ran.freed,
                    lent: ran.lent,
                };
                self.syncer.answer(shared, batch);
            }
            Err(e) if is_disk_fault(&e) => {
                tracing::error!(error = %e, batch = replies.len(), "the data file cannot be written: writes answer 503 until it can again");
                shared.set_unhealthy();
                self.open = None;
                for reply in replies {
                    let _ = reply.send(Err(EngineError::DiskRefused));
                }
            }
            Err(e) => {
                tracing::error!(error = %e, batch = replies.len(), "write transaction failed");
                let err = EngineError::from(e);
                for reply in replies {
                    let _ = reply.send(Err(err.clone()));
                }
            }
        }
    }

    /// A checkpoint when due, and always before stopping, so a clean
    /// shutdown leaves an empty log. Not while the file cannot be written
    /// (after a disk fault the loop reopens it first).
    fn checkpoint_if_due(&mut self) {
        let due = self
            .log
            .as_ref()
            .is_some_and(|l| self.stopping || l.checkpoint_due(self.opts));
        if self.db.is_some() && due {
            self.commit_open();
            if !self.shared.is_healthy() {
                return;
            }
            if self.stopping {
                let _ = self.checkpoint_now("stop");
            } else {
                self.checkpoint_handed_over();
            }
        }
    }

    /// A checkpoint whose sync the flusher makes while the writer goes on
    /// (see [`super::Logged::checkpoint_handed_over`]); a failure marks the
    /// store unhealthy, as [`Writer::checkpoint_now`]'s does.
    fn checkpoint_handed_over(&mut self) {
        let (Some(db), Some(log)) = (&self.db, self.log.as_mut()) else {
            return;
        };
        let started = Instant::now();
        let made = log
            .checkpoint_handed_over(db, &self.shared.gate)
            .and_then(|(sync, waited)| {
                // The batches logged before are (or go on being) synced in
                // the old segment, in order; then the new one is.
                self.syncer.swap(sync).map(|()| waited)
            });
        match made {
            Ok(waited) => {
                // Batches are durable once their log records are synced,
                // as before: the watermark moves with their syncs. The other
                // segment's batches are in the file's pages already (what
                // a checkpoint would still write is the new segment's).
                let took = self.checkpoint_made(started);
                tracing::debug!(
                    ms = took.as_millis() as u64,
                    // Of which waiting for the sync of the one before.
                    waited_ms = waited.as_millis() as u64,
                    why = "due",
                    "checkpoint, its sync handed over"
                );
            }
            Err(e) => {
                tracing::error!(error = %e, "checkpoint failed: writes answer 503 until the data file can be written");
                self.shared.set_unhealthy();
            }
        }
    }

    /// Makes everything committed durable in the file and empties the log;
    /// a failure marks the store unhealthy (writes answer 503 until the file
    /// is reopened). `why` is for the log line. Whether it was made.
    pub(super) fn checkpoint_now(&mut self, why: &str) -> bool {
        let (Some(db), Some(log)) = (&self.db, self.log.as_mut()) else {
            return false;
        };
        let started = Instant::now();
        match log.checkpoint(db, self.stopping) {
            // Everything committed is durable in the file now.
            Ok(()) => {
                self.shared.watermark.synced(log.seq);
                let took = self.checkpoint_made(started);
                tracing::debug!(ms = took.as_millis() as u64, why, "checkpoint");
                true
            }
            Err(e) => {
                tracing::error!(error = %e, "checkpoint failed: writes answer 503 until the data file can be written");
                self.shared.set_unhealthy();
                false
            }
        }
    }

    /// After a checkpoint that began at `started`: what the log holds for
    /// the next one, and how long this one held the writer (recorded, and
    /// returned for the log line).
    fn checkpoint_made(&self, started: Instant) -> Duration {
        let logged = self.log.as_ref().map_or(0, |l| l.segments.active.len());
        self.shared.space.set_logged(logged);
        let took = started.elapsed();
        self.opts
            .commit_metrics
            .checkpoint_seconds
            .record(took.as_secs_f64());
        took
    }

    /// Whether the open transaction is due for its commit: it is `hold`
    /// old, or a read waits for it (that request is taken either way).
    fn commit_due(&self) -> bool {
        let wanted = self.shared.watermark.take_commit_wanted();
        self.open
            .as_ref()
            .is_some_and(|o| wanted || o.since.elapsed() >= self.hold)
    }

    /// Commits the open transaction, if any. A failure marks the store
    /// unhealthy: its batches are logged (and answered once synced), so the
    /// reopen replays them.
    pub(super) fn commit_open(&mut self) {
        if let Some(o) = self.open.take()
            && let Err(e) = batch::commit(self.shared, self.counters, o)
        {
            tracing::error!(error = %e, "the data file cannot be written: writes answer 503 until it can again");
            self.shared.set_unhealthy();
        }
    }
}
