//! The embedded store: one redb file, one writer thread with group commit,
//! reads on read transactions that never wait for the writer.
//!
//! redb's API is blocking. Writes run on the writer thread; reads run on
//! tokio's blocking pool, and no read transaction is held across an `.await`
//! (a read transaction pins pages and would make the file grow).

mod counts;
pub mod faults;
mod flusher;
mod guard;
mod inbox;
mod kv;
mod kv_index;
mod migrate;
mod ops;
mod syncer;
mod tables;
mod wal;
#[cfg(test)]
mod wal_golden;
mod watermark;
mod writer;

use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use async_trait::async_trait;
use redb::{Database, ReadTransaction, ReadableDatabase, ReadableTable};
use tokio::sync::{mpsc, oneshot};

use self::inbox::{InboxRequest, InboxResponse};
use self::ops::{Request, Response};
use self::tables::{
    CLAIM_EXPIRY, CLAIMS, EVENT_EXPIRY, HEAD_EXPIRY, HEADS, META, SCHEMA_VERSION, claim_from_row,
    head_from_row,
};
use self::writer::{Counters, Envelope};
use super::{
    ApplyResult, ClaimOutcome, ClaimView, DoneOutcome, ExtendOutcome, Head, PurgeReport,
    ReleaseOutcome, Store, StoreError, WriteStats,
};
use crate::clock::Millis;
use crate::domain::{CreatedAt, Fingerprint, ScopedKey, Token, Ttl};
use crate::store::inbox::{
    Cursor, EventStatus, InboxEvent, IngestOutcome, Leased, ListOrder, NewEvent, RedeliverOutcome,
    Retention, Settle, SourceSummary,
};

pub use self::inbox::{InboxIndexes, SourceDue};
pub use self::kv::{ExpireCondition, KvEntry, KvRequest, KvResponse, SetCondition, SetExpiry};

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

/// Decodes a write-ahead log's bytes (`dedupd.redb.wal`) exactly as opening
/// the store does beside the data file the log names, returning the
/// batches numbered after `after`, without any file: the decoder under the
/// fuzz targets (`tests/fuzz/wal.rs`).
pub fn decode_wal(bytes: &[u8], after: u64) -> WalContents {
    let (id, bound) = match wal::named_id(bytes) {
        Some(id) => (id, true),
        None => (0, false),
    };
    match wal::read_log(bytes, after, id, bound) {
        Ok(wal::Decoded::Log { batches, end, .. }) => WalContents::Log {
            seqs: batches.iter().map(|b| b.seq).collect(),
            ops: batches.iter().map(|b| b.ops.len()).collect(),
            end,
        },
        Ok(wal::Decoded::New) => WalContents::New,
        Err(e) => WalContents::Refused(e.to_string()),
    }
}

/// How the redb store is opened.
#[derive(Debug, Clone)]
pub struct RedbOptions {
    /// The data file; created when absent.
    pub path: PathBuf,
    /// redb's page cache, in bytes (its own default is far larger than a
    /// small VM should give it).
    pub cache_bytes: usize,
    /// Writes that may wait for the writer before callers are held back.
    pub queue_capacity: usize,
    /// Most writes in one transaction.
    pub max_batch: usize,
    /// Storage faults to inject (tests only): the file is then opened
    /// through a backend that fails writes and syncs as the plan says.
    pub faults: Option<Arc<faults::FaultPlan>>,
    /// A checkpoint is made once the write-ahead log holds this many bytes.
    pub checkpoint_bytes: u64,
    /// ... or once this long passed since the last one (with anything logged).
    pub checkpoint_interval: std::time::Duration,
    /// ... or once no write came for this long (with anything logged): the
    /// checkpoint's stall then falls in a quiet moment, not on the first
    /// writes after it.
    pub checkpoint_idle: std::time::Duration,
    /// How long the writer may keep its transaction open over several
    /// batches before it commits (each batch is durable in the log
    /// already); zero commits every batch. A read commits it at once.
    pub commit_hold: std::time::Duration,
    /// Where the writer records each group commit.
    pub commit_metrics: CommitMetrics,
    /// How long a read waits for the file to be reopened after a disk
    /// fault (or for the sync of a write it would show) before it answers
    /// `Unavailable`: [`READ_REOPEN_WAIT`] unless a test needs longer.
    pub read_reopen_wait: std::time::Duration,
    /// How long after its receipt a reaped inbox event's id stays a
    /// duplicate (`gateway.dedupe_window`): the reaper leaves a dedupe
    /// record that long.
    pub dedupe_window: std::time::Duration,
}

/// Histograms the writer records each successful group commit in; no-ops
/// unless the application hands in real ones.
#[derive(Debug, Clone)]
pub struct CommitMetrics {
    /// Seconds from the start of the transaction to the commit (the log's
    /// sync included), observed once per commit.
    pub seconds: metrics::Histogram,
    /// Writes in the commit.
    pub batch_size: metrics::Histogram,
    /// Seconds of each checkpoint (a durable redb commit; writes wait).
    pub checkpoint_seconds: metrics::Histogram,
}

impl Default for CommitMetrics {
    fn default() -> Self {
        Self {
            seconds: metrics::Histogram::noop(),
            batch_size: metrics::Histogram::noop(),
            checkpoint_seconds: metrics::Histogram::noop(),
        }
    }
}

impl RedbOptions {
    /// Defaults that fit a 1 GB machine, for the file at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            cache_bytes: 64 * 1024 * 1024,
            queue_capacity: 4096,
            max_batch: 512,
            faults: None,
            checkpoint_bytes: 64 * 1024 * 1024,
            checkpoint_interval: std::time::Duration::from_secs(30),
            checkpoint_idle: std::time::Duration::from_secs(1),
            commit_hold: std::time::Duration::from_millis(20),
            commit_metrics: CommitMetrics::default(),
            read_reopen_wait: READ_REOPEN_WAIT,
            dedupe_window: DEDUPE_WINDOW,
        }
    }
}

/// The default of [`RedbOptions::dedupe_window`], as of
/// `gateway.dedupe_window`: 30 days.
pub const DEDUPE_WINDOW: std::time::Duration = std::time::Duration::from_secs(30 * 86_400);

/// Why the data file could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Another process (or this one) has the file open.
    #[error(
        "data file {0} is already open in another dedupd process (redb holds an exclusive lock)"
    )]
    InUse(PathBuf),
    /// The file was written by a build with another schema.
    #[error(
        "data file {path} has schema version {found}, but this dedupd reads version {SCHEMA_VERSION}; \
         use the dedupd release that wrote it, or move the file away to start empty"
    )]
    UnknownSchema {
        /// The file.
        path: PathBuf,
        /// The version it records.
        found: u64,
    },
    /// The file holds redb tables but not dedupd's metadata.
    #[error("{0} is a redb file, but not a dedupd data file (it has no dedupd metadata)")]
    Foreign(PathBuf),
    /// The write-ahead log exists but its data file does not.
    #[error(
        "write-ahead log {log} exists but its data file {data} does not: the log holds \
         acknowledged writes of a data file that was moved or deleted. It was not replayed and \
         is left as it is. Restore {data} (from where it was moved, or from a backup), or move \
         {log} away to start with an empty store"
    )]
    OrphanLog {
        /// The log.
        log: PathBuf,
        /// Its missing data file.
        data: PathBuf,
    },
    /// The write-ahead log belongs to another data file.
    #[error(
        "write-ahead log {log} belongs to another data file than {data} ({}; {data} is \
         {data_id:032x}): it was not replayed and is left as it is. This happens when {data} was \
         restored from a backup, replaced or created anew while the log stayed. If {data} is the \
         file to serve, move {log} away (it may hold writes that never reached {data}: keep it) \
         and start again; otherwise put back the data file the log belongs to",
        match log_id {
            Some(id) => format!("the log names data file {id:032x}"),
            None => "the log is of format 1, from before logs named their data file".into(),
        }
    )]
    ForeignLog {
        /// The log.
        log: PathBuf,
        /// The data file.
        data: PathBuf,
        /// The data file the log names, if it names one.
        log_id: Option<u128>,
        /// The data file's own id.
        data_id: u128,
    },
    /// The log holds batches in a format this build cannot replay.
    #[error(
        "write-ahead log {log} is of format {found}, but this dedupd replays formats {:?} (and \
         writes {}); it holds writes that were not checkpointed yet (the process that wrote it \
         did not stop cleanly). It was not replayed and is left as it is. Start the dedupd \
         release that wrote it once and stop it with SIGTERM, which checkpoints and empties the \
         log, then start this one",
        wal::DECODES,
        wal::FORMAT
    )]
    LogVersion {
        /// The log.
        log: PathBuf,
        /// Its format.
        found: u32,
    },
    /// A logged record passes its checksum but does not decode.
    #[error(
        "write-ahead log {log}: {detail} (log format {version}, this build writes {}). That is \
         corruption or a log of another build, not a torn tail, so dedupd does not drop it: \
         the log is left as it is and nothing was replayed. Keep copies of {log} and its data \
         file; start the dedupd release that wrote the log, or restore both from a backup",
        wal::FORMAT
    )]
    CorruptLog {
        /// The log.
        log: PathBuf,
        /// Its format.
        version: u32,
        /// What does not decode, and where.
        detail: String,
    },
    /// The file beside the data file is not a write-ahead log.
    #[error("{0} is not a dedupd write-ahead log; move it away")]
    NotALog(PathBuf),
    /// Anything else redb or the OS reported.
    #[error("cannot open data file {path}: {source}")]
    Other {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: redb::Error,
    },
}

/// What the store, its readers and its writer share.
#[derive(Debug)]
pub struct Shared {
    /// The database. `None` once closed, and while the writer reopens it
    /// after a disk fault; readers clone the `Arc` for the length of one
    /// read.
    db: Mutex<Option<Arc<Database>>>,
    /// False while the data file cannot commit (disk full or failing):
    /// writes answer `Unavailable`, `/readyz` fails, and the writer reopens
    /// the file until a commit succeeds again.
    healthy: AtomicBool,
    /// Inbox events by source and status, as committed.
    counts: counts::StatusCounts,
    /// The keyspace's keys (the writer changes it with the rows).
    kv: kv_index::KvIndex,
    /// Which batches readers may see, and which are on disk.
    watermark: watermark::Watermark,
    /// The open file's switch that refuses its writes (see [`guard`]).
    refuse: Mutex<Arc<AtomicBool>>,
    /// Set by a read waiting for the file to be reopened: the writer tries
    /// again soon instead of after its backoff.
    reopen_wanted: AtomicBool,
    /// Set once `close` began: reads answer at once, nothing will reopen.
    closing: AtomicBool,
}

impl Shared {
    /// Marks the file as not writable: writes answer `Unavailable` and the
    /// writer reopens it.
    fn set_unhealthy(&self) {
        self.healthy.store(false, Ordering::SeqCst);
    }

    fn db(&self) -> Option<Arc<Database>> {
        self.db.lock().ok().and_then(|d| d.clone())
    }

    fn set_db(&self, db: Option<Arc<Database>>) -> Option<Arc<Database>> {
        match self.db.lock() {
            Ok(mut d) => std::mem::replace(&mut *d, db),
            Err(_) => None,
        }
    }

    fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::SeqCst)
    }
}

/// The redb-backed [`Store`].
#[derive(Debug)]
pub struct RedbStore {
    /// The database and its health, shared with the writer.
    shared: Arc<Shared>,
    /// The writer's queue.
    writes: mpsc::Sender<Envelope>,
    /// The writer thread, joined on close.
    writer: Mutex<Option<JoinHandle<()>>>,
    /// Syncs the data file in the background between checkpoints.
    flusher: Mutex<Option<flusher::Flusher>>,
    /// Group-commit counters.
    counters: Arc<Counters>,
    /// How long a read waits out a reopen ([`RedbOptions::read_reopen_wait`]).
    read_reopen_wait: std::time::Duration,
    /// [`RedbOptions::dedupe_window`], ms.
    dedupe_window_ms: u64,
}

/// The mode of every file dedupd creates to hold data (the data file and
/// its write-ahead log): read and write for the owner, nothing for others.
pub(crate) const OWNER_ONLY: u32 = 0o600;

/// Whether a file of `mode` may be read or written by its group or others.
fn others_can_read(mode: u32) -> bool {
    mode & 0o077 != 0
}

/// Warns (once, at open) when a data file that was already there is open
/// to its group or others, as files made before dedupd created them 0600
/// are: dedupd does not change a mode it did not choose.
fn warn_if_others_can_read(path: &Path) {
    if let Ok(meta) = std::fs::metadata(path)
        && others_can_read(meta.permissions().mode())
    {
        tracing::warn!(
            path = %path.display(),
            mode = format!("{:o}", meta.permissions().mode() & 0o777),
            "the file holds webhook bodies and claim tokens but its group or others may \
             read it: chmod 600 it"
        );
    }
}

/// Opens the data file as the options say (through the fault-injecting
/// backend when they carry a plan).
/// `refuse` is the switch the writer throws before giving the file up (see
/// [`guard`]).
fn open_db(opts: &RedbOptions, refuse: Arc<AtomicBool>) -> Result<Database, redb::DatabaseError> {
    let mut builder = redb::Builder::new();
    builder.set_cache_size(opts.cache_bytes);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        // It holds webhook bodies and claim tokens: the owner's only, under
        // any umask (a file that exists keeps its mode; see
        // `warn_if_others_can_read`).
        .mode(OWNER_ONLY)
        .open(&opts.path)?;
    builder.create_with_backend(guard::GuardedBackend::new(
        file,
        opts.faults.clone(),
        refuse,
    )?)
}

/// The open error for a log that cannot be opened.
fn log_error(e: wal::LogError, log: &Path, data: &Path, data_id: u128) -> OpenError {
    let (log, data) = (log.to_owned(), data.to_owned());
    match e {
        wal::LogError::Io(e) => OpenError::Other {
            path: log,
            source: redb::Error::Io(e),
        },
        wal::LogError::NotALog => OpenError::NotALog(log),
        wal::LogError::Foreign { log_id } => OpenError::ForeignLog {
            log,
            data,
            log_id,
            data_id,
        },
        wal::LogError::Version { found } => OpenError::LogVersion { log, found },
        wal::LogError::Undecodable {
            version,
            ref seq,
            ref offset,
            ref detail,
        } => OpenError::CorruptLog {
            log,
            version,
            detail: format!(
                "record {seq} at byte {offset} passes its checksum but does not decode ({detail})"
            ),
        },
    }
}

/// Whether a redb error means the disk refused (full, failing), so the
/// operation may work later: answered as `Unavailable`, and the file is
/// reopened.
pub(crate) fn is_disk_fault(e: &redb::Error) -> bool {
    matches!(e, redb::Error::Io(_) | redb::Error::PreviousIo)
}

/// The error of a write refused while the data file cannot commit.
pub(crate) fn disk_unavailable() -> StoreError {
    StoreError::Unavailable(
        "the data file cannot be written now (disk full or failing); nothing was changed".into(),
    )
}

impl RedbStore {
    /// Opens (or creates) the data file and starts the writer.
    pub fn open(opts: &RedbOptions) -> Result<Self, OpenError> {
        let other = |e: redb::Error| OpenError::Other {
            path: opts.path.clone(),
            source: e,
        };
        if let Some(parent) = opts.path.parent().filter(|p| !p.as_os_str().is_empty()) {
            // Directories dedupd makes for its files are its own too.
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)
                .map_err(|e| other(redb::Error::Io(e)))?;
        }
        // A log without its data file is never replayed into a new one.
        let wal_path = wal::path_for(&opts.path);
        let has_data = std::fs::metadata(&opts.path).is_ok_and(|m| m.len() > 0);
        let has_log = std::fs::metadata(&wal_path).is_ok_and(|m| m.len() > 0);
        if has_log && !has_data {
            return Err(OpenError::OrphanLog {
                log: wal_path,
                data: opts.path.clone(),
            });
        }
        let refuse = Arc::new(AtomicBool::new(false));
        let db = open_db(opts, refuse.clone()).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => OpenError::InUse(opts.path.clone()),
            e => other(e.into()),
        })?;
        let id = migrate::init_schema(&db, &opts.path)?;
        // Batches acknowledged after the last checkpoint are in the log.
        warn_if_others_can_read(&opts.path);
        warn_if_others_can_read(&wal_path);
        let stored = writer::stored_seq(&db).map_err(other)?;
        let (mut log, batches) = wal::Wal::open(
            wal_path.clone(),
            opts.faults.clone(),
            stored,
            id.id,
            id.bound,
        )
        .map_err(|e| log_error(e, &wal_path, &opts.path, id.id))?;
        let kv = kv_index::KvIndex::default();
        let seq = writer::replay(&db, &kv, batches).map_err(other)?;
        log.reset().map_err(|e| other(redb::Error::Io(e)))?;
        let logged = writer::Logged {
            wal: log,
            seq,
            checkpointed: std::time::Instant::now(),
        };
        let counts = counts::StatusCounts::default();
        counts.recount(&db).map_err(other)?;
        let shared = Arc::new(Shared {
            db: Mutex::new(Some(Arc::new(db))),
            healthy: AtomicBool::new(true),
            counts,
            kv,
            watermark: watermark::Watermark::new(seq),
            refuse: Mutex::new(refuse),
            reopen_wanted: AtomicBool::new(false),
            closing: AtomicBool::new(false),
        });
        let counters = Arc::new(Counters::default());
        let (writes, handle) =
            writer::spawn(shared.clone(), opts.clone(), counters.clone(), logged)
                .map_err(|e| other(redb::Error::Io(e)))?;
        Ok(Self {
            shared,
            writes,
            writer: Mutex::new(Some(handle)),
            flusher: Mutex::new(
                flusher::Flusher::start(&opts.path)
                    .map_err(|e| other(redb::Error::Io(e)))
                    .map(Some)?,
            ),
            counters,
            read_reopen_wait: opts.read_reopen_wait,
            dedupe_window_ms: u64::try_from(opts.dedupe_window.as_millis()).unwrap_or(u64::MAX),
        })
    }

    /// Finishes queued writes, stops the writer and releases the file, so the
    /// same path can be opened again. Later calls answer `Unavailable`.
    pub async fn close(&self) {
        self.shared.closing.store(true, Ordering::SeqCst);
        let flusher = self.flusher.lock().ok().and_then(|mut f| f.take());
        // Joining it waits out one sync: off the async threads.
        let _ = tokio::task::spawn_blocking(move || drop(flusher)).await;
        let _ = self.writes.send(Envelope::Shutdown).await;
        let handle = self.writer.lock().ok().and_then(|mut h| h.take());
        if let Some(handle) = handle {
            let _ = tokio::task::spawn_blocking(move || handle.join()).await;
        }
        let db = self.shared.set_db(None);
        if let Some(mut db) = db {
            // Wait out reads that still hold a clone; each is one short read.
            loop {
                match Arc::try_unwrap(db) {
                    Ok(db) => {
                        drop(db);
                        break;
                    }
                    Err(still_shared) => {
                        db = still_shared;
                        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                    }
                }
            }
        }
    }

    async fn write(&self, request: Request, now: Millis) -> Result<Response, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.writes
            .send(Envelope::Write {
                request,
                now,
                reply,
            })
            .await
            .map_err(|_| closed())?;
        answer.await.map_err(|_| closed())?
    }

    /// Runs `f` on a read transaction on the blocking pool. A read that
    /// meets the file being reopened after a disk fault (the writer drops
    /// the handle redb poisoned and opens the file again, usually within
    /// milliseconds) asks the writer to try now, waits for the reopen, up
    /// to [`RedbOptions::read_reopen_wait`], and runs again: reads keep answering while
    /// writes are refused, as long as the file can be opened. While it
    /// cannot (every write failing), they answer `Unavailable` after that
    /// wait.
    async fn read<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: Fn(&ReadTransaction) -> Result<T, redb::Error> + Send + Sync + 'static,
    {
        self.read_seen(Fresh::Acknowledged, move |db, shared| {
            let tx = db.begin_read()?;
            // Any batch the transaction sees is at or below this.
            let seen = shared.watermark.visible();
            f(&tx).map(|v| (v, seen))
        })
        .await
    }

    /// [`RedbStore::read`] for a read that says itself which batch it may
    /// have seen (the keyspace's, which also reads the index in memory).
    async fn read_seen<T, F>(&self, fresh: Fresh, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: Fn(&Database, &Shared) -> Result<(T, u64), redb::Error> + Send + Sync + 'static,
    {
        let f = Arc::new(f);
        let deadline = tokio::time::Instant::now() + self.read_reopen_wait;
        loop {
            let epoch = self.shared.watermark.epoch();
            match self.read_once(epoch, fresh, f.clone(), deadline).await {
                Ok(value) => return Ok(value),
                Err(ReadFailure::Final(e)) => return Err(e),
                Err(ReadFailure::Reopening(e)) => {
                    self.want_reopen();
                    if !self.shared.watermark.reopened_since(epoch, deadline).await {
                        return Err(e);
                    }
                }
            }
        }
    }

    /// Asks the writer to reopen the file now: past its backoff, and
    /// woken if it sits idle since a failed sync (it starts a reopen on its
    /// next message).
    fn want_reopen(&self) {
        self.shared.reopen_wanted.store(true, Ordering::SeqCst);
        let (ping, _) = oneshot::channel();
        let _ = self.writes.try_send(Envelope::Ping(ping));
    }

    async fn read_once<T, F>(
        &self,
        epoch: u64,
        fresh: Fresh,
        f: Arc<F>,
        deadline: tokio::time::Instant,
    ) -> Result<T, ReadFailure>
    where
        T: Send + 'static,
        F: Fn(&Database, &Shared) -> Result<(T, u64), redb::Error> + Send + Sync + 'static,
    {
        // Before the file is taken: a reopen waits for every read holding it.
        if fresh == Fresh::Acknowledged {
            self.shared
                .watermark
                .committed_through(epoch, deadline)
                .await
                .map_err(ReadFailure::Reopening)?;
        }
        let Some(db) = self.shared.db() else {
            let closed_for_good =
                self.shared.closing.load(Ordering::SeqCst) || self.shared.is_healthy();
            return Err(if closed_for_good {
                ReadFailure::Final(closed())
            } else {
                ReadFailure::Reopening(disk_unavailable())
            });
        };
        let shared = self.shared.clone();
        let (value, seen) = tokio::task::spawn_blocking(move || f(&db, &shared))
            .await
            .map_err(|e| ReadFailure::Final(StoreError::Failed(format!("read task failed: {e}"))))?
            .map_err(|e| {
                if is_disk_fault(&e) {
                    ReadFailure::Reopening(StoreError::Unavailable(format!(
                        "the data file cannot be read now: {e}"
                    )))
                } else {
                    ReadFailure::Final(StoreError::Failed(e.to_string()))
                }
            })?;
        // Nothing that is not on disk is shown: a batch still syncing is
        // waited for (one sync at most); if the file was reopened meanwhile,
        // what was seen may be gone, so the read runs again. A sync that
        // failed leaves the batch unsynced until the reopen: waited for up
        // to the same deadline.
        if !self.shared.is_healthy() {
            self.want_reopen();
        }
        self.shared
            .watermark
            .wait(epoch, seen, deadline)
            .await
            .map_err(ReadFailure::Reopening)?;
        Ok(value)
    }
}

/// How many times a keyspace read waits for the batch writing the row it
/// looks for (each wait is one batch's sync, or up to
/// [`RedbOptions::read_reopen_wait`]).
const KV_PENDING_TRIES: usize = 16;

/// How long a read waits for the file to be reopened after a disk fault
/// before it answers `Unavailable`, by default.
pub const READ_REOPEN_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// What a read must see from its first look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fresh {
    /// Every batch on disk when it begins (every write answered `Ok`): the
    /// writer's open transaction is committed first if it holds one.
    Acknowledged,
    /// What the file and the keyspace index show; the read itself finds out
    /// when it needs more (a keyspace row not yet committed).
    Shown,
}

/// Why one read attempt failed.
enum ReadFailure {
    /// The file is being reopened: worth running again once it is.
    Reopening(StoreError),
    /// Anything else: the answer.
    Final(StoreError),
}

/// The gateway inbox. It lives in the redb file whatever backend holds
/// claims and streams.
impl RedbStore {
    async fn inbox_write(
        &self,
        request: InboxRequest,
        now: Millis,
    ) -> Result<InboxResponse, StoreError> {
        match self.write(Request::Inbox(request), now).await? {
            Response::Inbox(r) => Ok(r),
            _ => Err(unexpected("an inbox write")),
        }
    }

    /// Stores a new event durably, unless the source already has its id.
    pub async fn ingest(&self, event: NewEvent, now: Millis) -> Result<IngestOutcome, StoreError> {
        match self.inbox_write(InboxRequest::Insert(event), now).await? {
            InboxResponse::Inserted(o) => Ok(o),
            _ => Err(unexpected("insert")),
        }
    }

    /// Leases runnable events, each until its own time, while they are
    /// being delivered: `(source, event id, until)`. With `stale_check`, an
    /// event older than its stream's head (in this file) is settled as
    /// stale instead, in the same transaction.
    pub async fn lease(
        &self,
        events: Vec<(String, String, Millis)>,
        stale_check: Option<Retention>,
        now: Millis,
    ) -> Result<Leased, StoreError> {
        let request = InboxRequest::Lease {
            events,
            stale_check,
        };
        match self.inbox_write(request, now).await? {
            InboxResponse::Leased(l) => Ok(l),
            _ => Err(unexpected("lease")),
        }
    }

    /// Settles a delivered event and moves its stream head in this file in
    /// one transaction: `apply` is (stream, event id, created_at,
    /// retention ms) when the event has a stream.
    pub async fn settle_delivered(
        &self,
        source: &str,
        event_id: &str,
        lease: u64,
        apply: Option<(ScopedKey, ScopedKey, CreatedAt, u64)>,
        retention: Retention,
        now: Millis,
    ) -> Result<(), StoreError> {
        let settle = InboxRequest::Settle {
            source: source.to_owned(),
            event_id: event_id.to_owned(),
            lease,
            settle: Settle::Delivered { attempted: true },
            retention,
        };
        match self
            .write(
                Request::Delivered {
                    apply,
                    settle: Box::new(settle),
                },
                now,
            )
            .await?
        {
            Response::Inbox(_) => Ok(()),
            _ => Err(unexpected("a delivered settle")),
        }
    }

    /// Deletes at most `limit` pending events of `sources` (removed from
    /// the configuration) received before `before`; how many went.
    pub async fn purge_pending(
        &self,
        sources: Vec<String>,
        before: Millis,
        limit: u64,
        now: Millis,
    ) -> Result<u64, StoreError> {
        let request = Request::PurgePending {
            sources,
            before,
            limit,
        };
        match self.write(request, now).await? {
            Response::Purged(n) => Ok(n),
            _ => Err(unexpected("purge of pending events")),
        }
    }

    /// Records how a delivery turn under lease generation `lease` ended;
    /// ignored when another turn or a redeliver has taken the event since.
    pub async fn settle(
        &self,
        source: &str,
        event_id: &str,
        lease: u64,
        settle: Settle,
        retention: Retention,
        now: Millis,
    ) -> Result<(), StoreError> {
        let request = InboxRequest::Settle {
            source: source.to_owned(),
            event_id: event_id.to_owned(),
            lease,
            settle,
            retention,
        };
        self.inbox_write(request, now).await.map(|_| ())
    }

    /// Puts a dead or stale event back to pending.
    pub async fn redeliver(
        &self,
        source: &str,
        event_id: &str,
        now: Millis,
    ) -> Result<RedeliverOutcome, StoreError> {
        let request = InboxRequest::Redeliver {
            source: source.to_owned(),
            event_id: event_id.to_owned(),
        };
        match self.inbox_write(request, now).await? {
            InboxResponse::Redelivered(o) => Ok(o),
            _ => Err(unexpected("redeliver")),
        }
    }

    /// For each `(source, limit)`: its runnable events due at `now` (at
    /// most `limit`) and its next due time after them.
    pub async fn due_events(
        &self,
        now: Millis,
        wants: Vec<(String, usize)>,
    ) -> Result<Vec<SourceDue>, StoreError> {
        self.read(move |tx| inbox::due(tx, now, &wants)).await
    }

    /// Whether a post of this event id is a duplicate at `now`: the inbox
    /// holds the event, or reaped it less than the dedupe window after it
    /// was received. Reads only; [`RedbStore::ingest`] checks again.
    pub async fn knows_event(
        &self,
        source: &str,
        event_id: &str,
        now: Millis,
    ) -> Result<bool, StoreError> {
        let (source, id) = (source.to_owned(), event_id.to_owned());
        self.read(move |tx| inbox::known(tx, &source, &id, now))
            .await
    }

    /// How long after its receipt a reaped event's id stays a duplicate
    /// ([`RedbOptions::dedupe_window`]).
    pub fn dedupe_window(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.dedupe_window_ms)
    }

    /// Every source with events in the inbox, with its pending count.
    pub async fn inbox_sources(&self) -> Result<Vec<(String, u64)>, StoreError> {
        self.read(inbox::sources).await
    }

    /// Whether the writer takes a request from its queue within `within`:
    /// false while it is stuck in a commit or a sync (or has stopped).
    pub async fn writer_responds(&self, within: std::time::Duration) -> bool {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let asked = async {
            self.writes.send(Envelope::Ping(tx)).await.ok()?;
            rx.await.ok()
        };
        matches!(tokio::time::timeout(within, asked).await, Ok(Some(())))
    }

    /// Each source with events in the inbox: its counts by status (kept in
    /// memory) and when its oldest pending event was received (one index
    /// read per source). Nothing here scans the inbox.
    pub async fn inbox_summary(&self) -> Result<Vec<SourceSummary>, StoreError> {
        let counts = self.shared.counts.snapshot();
        self.read(move |tx| {
            let mut out = Vec::with_capacity(counts.len());
            for (source, c) in &counts {
                let oldest_pending_ms = if c[0] > 0 {
                    inbox::oldest_pending(tx, source)?
                } else {
                    None
                };
                out.push(SourceSummary {
                    pending: c[0],
                    delivered: c[1],
                    stale: c[2],
                    dead: c[3],
                    oldest_pending_ms,
                    source: source.clone(),
                });
            }
            Ok(out)
        })
        .await
    }

    /// Every inbox table as stored, for consistency checks in tests (it
    /// reads the whole inbox).
    #[doc(hidden)]
    pub async fn inbox_indexes(&self) -> Result<InboxIndexes, StoreError> {
        self.read(inbox::indexes).await
    }

    /// Whether the inbox holds any event of `source`.
    pub async fn has_source(&self, source: &str) -> Result<bool, StoreError> {
        let source = source.to_owned();
        self.read(move |tx| inbox::has_source(tx, &source)).await
    }

    /// One inbox event.
    pub async fn inbox_event(
        &self,
        source: &str,
        event_id: &str,
    ) -> Result<Option<InboxEvent>, StoreError> {
        let (source, id) = (source.to_owned(), event_id.to_owned());
        self.read(move |tx| inbox::get(tx, &source, &id)).await
    }

    /// A page of a source's events with `status`, in `order`, after the
    /// cursor of the previous page (bodies left out: see `body_bytes`).
    pub async fn list_events(
        &self,
        source: &str,
        status: EventStatus,
        order: ListOrder,
        after: Option<Cursor>,
        limit: usize,
    ) -> Result<(Vec<InboxEvent>, Option<Cursor>), StoreError> {
        let source = source.to_owned();
        self.read(move |tx| inbox::list(tx, &source, status, order, after.clone(), limit))
            .await
    }
}

/// The Redis-protocol keyspace. It lives in the redb file (with the Redis
/// backend, Redis clients should use that Redis directly).
impl RedbStore {
    /// Hands a keyspace write to the writer without waiting for it, so a
    /// connection can queue a pipeline's writes into one commit; the
    /// returned future answers after the commit (in queue order).
    pub async fn kv_submit(
        &self,
        request: KvRequest,
        now: Millis,
    ) -> Result<impl Future<Output = Result<KvResponse, StoreError>> + Send + 'static, StoreError>
    {
        let (reply, answer) = oneshot::channel();
        self.writes
            .send(Envelope::Write {
                request: Request::Kv(request),
                now,
                reply,
            })
            .await
            .map_err(|_| closed())?;
        Ok(async move {
            match answer.await.map_err(|_| closed())?? {
                Response::Kv(r) => Ok(r),
                _ => Err(unexpected("a keyspace write")),
            }
        })
    }

    /// The live entry of `key` at `now`.
    pub async fn kv_get(&self, key: Vec<u8>, now: Millis) -> Result<Option<KvEntry>, StoreError> {
        let key = Arc::new(key);
        // A pending row's batch is on disk (so committed) by the time
        // `read_seen` returns: the next look finds the row, or a newer state.
        for attempt in 0..KV_PENDING_TRIES {
            let key = key.clone();
            // A small value is in the index; a row not committed yet is
            // waited for on the next attempt.
            let fresh = if attempt == 0 {
                Fresh::Shown
            } else {
                Fresh::Acknowledged
            };
            let found = self
                .read_seen(fresh, move |db, shared| {
                    kv::get(
                        db,
                        &shared.kv,
                        || shared.watermark.visible(),
                        || shared.watermark.last_committed(),
                        &key,
                        now,
                    )
                })
                .await?;
            if let kv::Lookup::Found(entry) = found {
                return Ok(entry);
            }
        }
        Err(StoreError::Unavailable(
            "a value being written was not committed in time; retry".into(),
        ))
    }

    /// How many of `keys` exist at `now`, a repeated key each time.
    pub async fn kv_count(&self, keys: Vec<Vec<u8>>, now: Millis) -> Result<u64, StoreError> {
        self.read_seen(Fresh::Shown, move |_, shared| {
            kv::count_live(&shared.kv, &keys, now)
        })
        .await
    }
}

/// The sources with events in the data file at `path`, with their pending
/// counts, read without writing (for `check-config`). `Ok(None)` when there
/// is no file yet; an error (such as the file being in use by a running
/// dedupd) says why it could not be read.
pub fn inbox_sources_in_file(path: &Path) -> Result<Option<Vec<(String, u64)>>, String> {
    if !path.exists() {
        return Ok(None);
    }
    let db = redb::ReadOnlyDatabase::open(path).map_err(|e| match e {
        redb::DatabaseError::DatabaseAlreadyOpen => {
            "it is open in a running dedupd (redb holds an exclusive lock)".to_owned()
        }
        e => e.to_string(),
    })?;
    let tx = db.begin_read().map_err(|e| e.to_string())?;
    inbox::sources(&tx).map(Some).map_err(|e| e.to_string())
}

fn closed() -> StoreError {
    StoreError::Unavailable("the store is shut down".into())
}

fn unexpected(what: &str) -> StoreError {
    StoreError::Failed(format!(
        "writer answered {what} with another kind of response"
    ))
}

#[async_trait]
impl Store for RedbStore {
    async fn claim(
        &self,
        key: &ScopedKey,
        ttl: Ttl,
        fingerprint: Option<Fingerprint>,
        now: Millis,
    ) -> Result<ClaimOutcome, StoreError> {
        let request = Request::Claim {
            key: key.clone(),
            ttl,
            fingerprint,
            token: Token::random(),
        };
        match self.write(request, now).await? {
            Response::Claim(o) => Ok(o),
            _ => Err(unexpected("claim")),
        }
    }

    async fn done(
        &self,
        key: &ScopedKey,
        token: Token,
        ttl: Ttl,
        now: Millis,
    ) -> Result<DoneOutcome, StoreError> {
        let request = Request::Done {
            key: key.clone(),
            token,
            ttl,
        };
        match self.write(request, now).await? {
            Response::Done(o) => Ok(o),
            _ => Err(unexpected("done")),
        }
    }

    async fn release(
        &self,
        key: &ScopedKey,
        token: Token,
        now: Millis,
    ) -> Result<ReleaseOutcome, StoreError> {
        let request = Request::Release {
            key: key.clone(),
            token,
        };
        match self.write(request, now).await? {
            Response::Release(o) => Ok(o),
            _ => Err(unexpected("release")),
        }
    }

    async fn extend(
        &self,
        key: &ScopedKey,
        token: Token,
        ttl: Ttl,
        now: Millis,
    ) -> Result<ExtendOutcome, StoreError> {
        let request = Request::Extend {
            key: key.clone(),
            token,
            ttl,
        };
        match self.write(request, now).await? {
            Response::Extend(o) => Ok(o),
            _ => Err(unexpected("extend")),
        }
    }

    async fn get(&self, key: &ScopedKey, now: Millis) -> Result<Option<ClaimView>, StoreError> {
        let key = key.clone();
        self.read(move |tx| {
            let table = tx.open_table(CLAIMS)?;
            let record = table.get(key.as_str())?.map(|g| claim_from_row(g.value()));
            Ok(record.filter(|r| !r.is_expired(now)).map(|r| r.view()))
        })
        .await
    }

    async fn apply(
        &self,
        stream: &ScopedKey,
        event_id: &ScopedKey,
        created_at: CreatedAt,
        retention_ms: u64,
        now: Millis,
    ) -> Result<ApplyResult, StoreError> {
        let request = Request::Apply {
            stream: stream.clone(),
            event_id: event_id.clone(),
            created_at,
            retention_ms,
        };
        match self.write(request, now).await? {
            Response::Apply(r) => Ok(r),
            _ => Err(unexpected("apply")),
        }
    }

    async fn head(&self, stream: &ScopedKey, now: Millis) -> Result<Option<Head>, StoreError> {
        let stream = stream.clone();
        self.read(move |tx| {
            let table = tx.open_table(HEADS)?;
            let head = table
                .get(stream.as_str())?
                .map(|g| head_from_row(g.value()));
            Ok(head.filter(|(_, exp)| *exp > now).map(|(h, _)| h))
        })
        .await
    }

    async fn purge_expired(&self, now: Millis, limit: u64) -> Result<PurgeReport, StoreError> {
        let request = Request::PurgeExpired {
            limit,
            dedupe_window_ms: self.dedupe_window_ms,
        };
        match self.write(request, now).await? {
            Response::Purge(r) => Ok(r),
            _ => Err(unexpected("purge")),
        }
    }

    async fn next_expiry(&self) -> Result<Option<Millis>, StoreError> {
        self.read(|tx| {
            let mut next: Option<Millis> = None;
            for def in [CLAIM_EXPIRY, EVENT_EXPIRY, HEAD_EXPIRY] {
                let table = tx.open_table(def)?;
                if let Some((k, _)) = table.first()? {
                    let at = k.value().0;
                    next = Some(next.map_or(at, |n| n.min(at)));
                }
            }
            if let Some((k, _)) = tx.open_table(tables::INBOX_EXPIRY)?.first()? {
                let at = k.value().0;
                next = Some(next.map_or(at, |n| n.min(at)));
            }
            for at in [kv::next_expiry(tx)?, inbox::next_dedupe_expiry(tx)?]
                .into_iter()
                .flatten()
            {
                next = Some(next.map_or(at, |n| n.min(at)));
            }
            Ok(next)
        })
        .await
    }

    async fn ready(&self) -> Result<(), StoreError> {
        if self.writes.is_closed() {
            return Err(closed());
        }
        if !self.shared.is_healthy() {
            return Err(disk_unavailable());
        }
        // The file answers a read. Not a read of what was acknowledged:
        // that would ask the writer to commit its open transaction at once,
        // and `/readyz` needs no token, so a flood of probes would take
        // group commit (`storage.commit_hold`) away from every write.
        self.read_seen(Fresh::Shown, |db, shared| {
            let tx = db.begin_read()?;
            let seen = shared.watermark.visible();
            tx.open_table(META)?;
            Ok(((), seen))
        })
        .await
    }

    fn write_stats(&self) -> WriteStats {
        self.counters.snapshot()
    }

    async fn close(&self) {
        RedbStore::close(self).await;
    }
}
