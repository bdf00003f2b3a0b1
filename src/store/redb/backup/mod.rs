//! Backups of the data file: taken while it serves, checked, restored.
//!
//! A backup is **one file**: a logical copy of every table of a snapshot
//! of the data file (the rows as stored, not redb's pages: no free pages,
//! so nothing erased before the backup), the keys of the sealed events it
//! holds and only those, and checksums (a crc32 per frame, the SHA-256 of
//! the whole at the end). It holds no write-ahead log: every write
//! acknowledged before it began is in its rows.
//!
//! - [`snapshot`]: how the snapshot is taken while the writer goes on, and
//!   what writes wait for (one commit); the copy itself.
//! - [`format`]: the container (frames, header, end, checksums).
//! - [`raw`]: every table as bytes, in the order a backup holds them.
//! - [`restore`]: a data file and its key file built from a backup, proven
//!   by opening them, then put in place.
//! - [`verify`]: a backup or a stopped data file checked without changing
//!   anything (through [`super::overlay`]: redb's own checks of the file, its
//!   writes kept in memory).
//!
//! [`Backups`] is the handle the app and the CLI take backups through.

pub mod format;
mod raw;
pub mod restore;
mod snapshot;
pub mod verify;

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, watch};

use self::format::{End, Header};
pub use self::snapshot::Snapshot;
use super::engine::Engine;
use super::error::EngineError;
use crate::clock::Millis;
use crate::store::StoreError;

/// Why a backup could not be taken (or stopped midway).
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// The data file cannot be read now (closed, a disk fault, reopened).
    #[error("the data file cannot be backed up now: {0}")]
    Store(#[from] EngineError),
    /// Another backup is being taken.
    #[error("a backup is being taken already: one at a time")]
    Busy,
    /// The server began to stop (or the store to close) during the copy,
    /// or before it: see [`Backups::stop`].
    #[error("the server is stopping: the backup was not finished")]
    Closing,
    /// Where the backup goes failed (a full disk, a client gone away).
    #[error("writing the backup failed: {0}")]
    Write(#[source] std::io::Error),
    /// The output took nothing for [`STALL`].
    #[error("the backup's reader took nothing for {}s: given up", STALL.as_secs())]
    Stalled,
    /// Reading the data file failed.
    #[error("reading the data file failed: {0}")]
    Read(#[from] redb::Error),
    /// Reading the key file failed.
    #[error("reading the key file failed: {0}")]
    Keys(#[source] std::io::Error),
    /// A table this build does not know: it would be left out.
    #[error(
        "the data file has a table this build does not back up ({0}): refused rather than left out"
    )]
    UnknownTable(String),
    /// A row's key slot is past the key file's end.
    #[error("an event uses key slot {slot}, but the key file holds {slots} slots")]
    ShortKeys { slot: u64, slots: u64 },
}

impl BackupError {
    /// The store error to answer with before anything was sent.
    pub fn into_store_error(self) -> StoreError {
        match self {
            BackupError::Store(e) => e.into(),
            BackupError::Closing => EngineError::Closed.into(),
            e => StoreError::failed(e),
        }
    }
}

/// What a backup holds, once written.
#[derive(Debug, Clone)]
pub struct Written {
    /// What it says first.
    pub header: Header,
    /// What it says last: rows per table, keys, the SHA-256.
    pub end: End,
    /// Its length.
    pub bytes: u64,
    /// How long the copy took (after the snapshot).
    pub took: Duration,
}

/// How long a reader of a backup may take nothing before it is given up
/// (its read transaction keeps the file from reusing pages meanwhile).
pub const STALL: Duration = Duration::from_secs(60);

/// Bytes handed to a streaming reader at a time.
const CHUNK: usize = 256 * 1024;

/// Chunks a streaming reader may have waiting (beside the place kept for
/// the error that ends a failed stream).
const QUEUED: usize = 8;

/// The handle backups are taken through: one at a time per data file.
#[derive(Debug, Clone)]
pub struct Backups {
    engine: Arc<Engine>,
}

/// What the backups of one data file share: the turn (one at a time) and
/// the word to stop, under one lock so that no backup begins once a stop
/// has looked for a running one.
#[derive(Debug)]
pub(in crate::store::redb) struct Turns(watch::Sender<TurnState>);

#[derive(Debug, Default)]
struct TurnState {
    /// A backup holds the turn: until its copy has ended and let go of
    /// its snapshot.
    running: bool,
    /// The server is stopping, or the store closing: a running copy stops
    /// at once, even while it waits on its reader, and none begins.
    stopping: bool,
}

impl Turns {
    pub(in crate::store::redb) fn new() -> Self {
        Self(watch::Sender::new(TurnState::default()))
    }

    /// Stops the running backup (if any) and every later one; returns at
    /// once (see [`Backups::stop`]).
    pub(in crate::store::redb) fn stop(&self) {
        self.0.send_modify(|s| s.stopping = true);
    }

    /// Whether backups were told to stop.
    pub(in crate::store::redb) fn stopping(&self) -> bool {
        self.0.borrow().stopping
    }

    /// What a copy watches to stop while it waits.
    fn watch(&self) -> watch::Receiver<TurnState> {
        self.0.subscribe()
    }
}

/// Held while a backup is taken; lets the next one in when dropped.
#[derive(Debug)]
struct Turn(Arc<Turns>);

impl Drop for Turn {
    fn drop(&mut self) {
        self.0.0.send_modify(|s| s.running = false);
    }
}

impl Backups {
    /// Backups of the file `engine` has open.
    pub(super) fn new(engine: Arc<Engine>) -> Self {
        Self { engine }
    }

    fn turn(&self) -> Result<Turn, BackupError> {
        let turns = &self.engine.backups;
        let mut refused = None;
        turns.0.send_if_modified(|s| {
            if s.stopping {
                refused = Some(BackupError::Closing);
                false
            } else if s.running {
                refused = Some(BackupError::Busy);
                false
            } else {
                s.running = true;
                true
            }
        });
        match refused {
            Some(why) => Err(why),
            None => Ok(Turn(turns.clone())),
        }
    }

    /// Stops the backup being taken, at once, and refuses every later one
    /// ([`BackupError::Closing`]): the server is stopping. A copy stops
    /// between two frames or while it waits on its reader; a stream ends
    /// with the error (its reader's file is refused). Returns once the
    /// copy has ended and let go of its read transaction.
    pub async fn stop(&self) {
        self.engine.backups.stop();
        let mut state = self.engine.backups.watch();
        // Its sender lives as long as the engine: no error.
        let _ = state.wait_for(|s| !s.running).await;
    }

    /// Resolves once backups were told to stop ([`Backups::stop`], or the
    /// store closing).
    pub async fn stopping(&self) {
        let mut state = self.engine.backups.watch();
        let _ = state.wait_for(|s| s.stopping).await;
    }

    /// Takes a backup at `now` and writes it to `out`, on a blocking
    /// thread; returns `out` and what was written.
    pub async fn write_to<W: Write + Send + 'static>(
        &self,
        now: Millis,
        out: W,
    ) -> Result<(W, Written), BackupError> {
        let turn = self.turn()?;
        let snapshot = self.engine.snapshot(now).await?;
        tokio::task::spawn_blocking(move || {
            let _turn = turn;
            snapshot.write_to(out)
        })
        .await
        .map_err(|e| BackupError::from(EngineError::ReadTask(Arc::new(e))))?
    }

    /// Takes a backup at `now` and streams it: its header, and its bytes
    /// as a thread of its own (`dedupd-backup`) writes them. A reader that
    /// goes away stops the copy; an error midway ends the stream with it
    /// (the reader is left with a file cut short, which no reader of
    /// backups accepts), and so does [`Backups::stop`], also while the
    /// copy waits on a reader that takes nothing.
    pub async fn stream(
        &self,
        now: Millis,
    ) -> Result<(Header, mpsc::Receiver<std::io::Result<Bytes>>), BackupError> {
        let turn = self.turn()?;
        let snapshot = self.engine.snapshot(now).await?;
        let header = snapshot.header().clone();
        let (tx, rx) = mpsc::channel(QUEUED + 1);
        // The place of the error that may end the stream, kept from the
        // start: putting it there never waits for the reader.
        let last = tx.clone().reserve_owned().await.map_err(|_| {
            BackupError::Write(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "the backup's reader went away",
            ))
        })?;
        let stop = turn.0.watch();
        std::thread::Builder::new()
            .name("dedupd-backup".into())
            .spawn(move || {
                let _turn = turn;
                // A runtime of its own for the wait's timer: the caller's
                // (an HTTP worker's) shuts down when the server stops,
                // maybe while this thread waits on the reader, and a timer
                // polled then panics the thread (seen in CI). The channel
                // and the stop signal work across runtimes.
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        tracing::warn!(error = %e, "backup stopped");
                        last.send(Err(e));
                        return;
                    }
                };
                let out = Chunks {
                    tx,
                    runtime,
                    stop,
                    buf: Vec::with_capacity(CHUNK),
                };
                let failed = match snapshot.write_to(out) {
                    Ok((_, written)) => {
                        tracing::info!(
                            bytes = written.bytes,
                            ms = written.took.as_millis() as u64,
                            batch = written.header.batch,
                            "backup sent: the whole file streamed to the client, which checks and keeps it"
                        );
                        return;
                    }
                    Err(BackupError::Closing) => {
                        tracing::warn!(
                            "backup stopped: the server is stopping (the file being written \
                             is refused)"
                        );
                        BackupError::Closing
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "backup stopped");
                        e
                    }
                };
                // The reader sees the error after what it was sent.
                last.send(Err(std::io::Error::other(failed)));
            })
            .map_err(BackupError::Write)?;
        Ok((header, rx))
    }
}

/// A writer that hands its bytes to a channel, [`CHUNK`] at a time.
struct Chunks {
    tx: mpsc::Sender<std::io::Result<Bytes>>,
    runtime: tokio::runtime::Runtime,
    /// Stops a send that waits on the reader.
    stop: watch::Receiver<TurnState>,
    buf: Vec<u8>,
}

/// How a hand-over of a chunk ended.
enum Handed {
    Taken,
    Gone,
    Stalled,
    Stopped,
}

impl Chunks {
    fn send(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        let (tx, stop) = (&self.tx, &mut self.stop);
        let handed = self.runtime.block_on(async {
            tokio::select! {
                // The stop first: a server stopping says so, whatever else
                // is ready.
                biased;
                _ = stop.wait_for(|s| s.stopping) => Handed::Stopped,
                sent = tx.send(Ok(chunk)) => match sent {
                    Ok(()) => Handed::Taken,
                    Err(_) => Handed::Gone,
                },
                () = tokio::time::sleep(STALL) => Handed::Stalled,
            }
        });
        match handed {
            Handed::Taken => Ok(()),
            Handed::Gone => Err(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "the backup's reader went away",
            )),
            Handed::Stalled => Err(std::io::Error::other(BackupError::Stalled)),
            Handed::Stopped => Err(std::io::Error::other(BackupError::Closing)),
        }
    }
}

impl Write for Chunks {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.send()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
    }
}
