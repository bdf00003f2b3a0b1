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
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;

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
    /// The store began to close during the copy.
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

/// The handle backups are taken through: one at a time per data file.
#[derive(Debug, Clone)]
pub struct Backups {
    engine: Arc<Engine>,
}

/// Held while a backup is taken; lets the next one in when dropped.
#[derive(Debug)]
struct Turn(Arc<AtomicBool>);

impl Drop for Turn {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

impl Backups {
    /// Backups of the file `engine` has open.
    pub(super) fn new(engine: Arc<Engine>) -> Self {
        Self { engine }
    }

    fn turn(&self) -> Result<Turn, BackupError> {
        let running = &self.engine.backing_up;
        if running.swap(true, Ordering::SeqCst) {
            return Err(BackupError::Busy);
        }
        Ok(Turn(running.clone()))
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
    /// backups accepts).
    pub async fn stream(
        &self,
        now: Millis,
    ) -> Result<(Header, mpsc::Receiver<std::io::Result<Bytes>>), BackupError> {
        let turn = self.turn()?;
        let snapshot = self.engine.snapshot(now).await?;
        let header = snapshot.header().clone();
        let (tx, rx) = mpsc::channel(8);
        let runtime = tokio::runtime::Handle::current();
        let errors = tx.clone();
        std::thread::Builder::new()
            .name("dedupd-backup".into())
            .spawn(move || {
                let _turn = turn;
                let out = Chunks {
                    tx,
                    runtime: runtime.clone(),
                    buf: Vec::with_capacity(CHUNK),
                };
                match snapshot.write_to(out) {
                    Ok((_, written)) => tracing::info!(
                        bytes = written.bytes,
                        ms = written.took.as_millis() as u64,
                        batch = written.header.batch,
                        "backup written"
                    ),
                    Err(e) => {
                        tracing::warn!(error = %e, "backup stopped");
                        let _ = runtime.block_on(errors.send(Err(std::io::Error::other(e))));
                    }
                }
            })
            .map_err(BackupError::Write)?;
        Ok((header, rx))
    }
}

/// A writer that hands its bytes to a channel, [`CHUNK`] at a time.
struct Chunks {
    tx: mpsc::Sender<std::io::Result<Bytes>>,
    runtime: tokio::runtime::Handle,
    buf: Vec<u8>,
}

impl Chunks {
    fn send(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        let tx = &self.tx;
        // The timer is made inside: it needs the runtime.
        let sent = self
            .runtime
            .block_on(async { tokio::time::timeout(STALL, tx.send(Ok(chunk))).await });
        match sent {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "the backup's reader went away",
            )),
            Err(_) => Err(std::io::Error::other(BackupError::Stalled)),
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
