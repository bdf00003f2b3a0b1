//! The embedded store: the data file (redb) behind a write-ahead log, one
//! engine with three handles over it.
//!
//! - [`engine`]: the engine. One writer thread with group commit
//!   ([`writer`], which syncs its log with [`syncer`]), reads that never wait
//!   for it and show only what is on disk ([`watermark`]), a reopen after a
//!   disk fault; [`open`] opens it (and says why it cannot: [`OpenError`]),
//!   [`error`] says why a read or write failed.
//! - The handles: [`RedbStore`] (claims and ordering, the
//!   [`Store`](crate::store::Store)), [`RedbInbox`] (the gateway
//!   [`Inbox`](crate::store::inbox::Inbox)), [`Keyspace`] (the
//!   Redis-protocol keyspace).
//! - The log: [`record`] (what a record holds: the write requests), [`wal`]
//!   (the file, and [`decode_wal`], its decoder without a file, for the
//!   fuzz targets), `wal_golden` (their encoding, pinned).
//! - The inbox's keys: [`seal`] (each event's headers and body sealed
//!   under a key of its own, in `dedupd.redb.keys`, shredded when the
//!   event is erased or reaped).
//! - The file: [`tables`] (tables and row encodings), [`migrate`] (schema
//!   versions), [`guard`] (the storage backend and its switch), [`flusher`]
//!   (background write-back), [`faults`] (fault injection for tests),
//!   [`space`] (free disk space and the watermark that keeps the file off
//!   a full disk).
//! - Backups: [`backup`] (a snapshot copied while the writer goes on,
//!   one self-checking file; verified; restored as a new data file).
//! - Executing writes: [`ops`] (claims, stream heads, purges, and the
//!   dispatch of every request), [`inbox`], [`kv`] with the keyspace's
//!   in-memory index [`kv_index`]; [`counts`] (inbox counts in memory).

pub(super) mod answers;
pub mod backup;
mod claims;
mod counts;
mod engine;
mod error;
pub mod faults;
mod flusher;
mod guard;
mod inbox;
mod key_memory;
mod keyspace;
mod kv;
mod kv_index;
mod migrate;
mod open;
mod ops;
mod overlay;
mod pending_pages;
mod record;
mod seal;
mod space;
mod sync_gate;
mod syncer;
mod tables;
/// The schema version this build writes (older files are migrated to it
/// as they are opened).
pub use tables::SCHEMA_VERSION;
mod wal;
#[cfg(test)]
mod wal_golden;
mod wal_segments;
mod watermark;
mod writer;

use std::path::PathBuf;
use std::sync::Arc;

use crate::config::Settings;

pub use self::backup::Backups;
pub use self::claims::RedbStore;
pub use self::engine::READ_REOPEN_WAIT;
pub use self::inbox::{InboxIndexes, RedbInbox};
pub use self::keyspace::Keyspace;
pub use self::open::{OpenError, inbox_sources_in_file};
pub use self::wal::{WalContents, decode_wal};

/// The mode of every file dedupd creates to hold data (the data file and
/// its write-ahead log): read and write for the owner, nothing for others.
pub(crate) const OWNER_ONLY: u32 = 0o600;

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
    /// Open a file that was not closed cleanly although its write-ahead
    /// log is missing, losing what the log held (`serve
    /// --accept-missing-log`); refused otherwise.
    pub accept_missing_log: bool,
    /// Writes are refused while less than this is free on the data file's
    /// filesystem (`storage.min_free_bytes`; see `space`).
    pub min_free_bytes: u64,
    /// Most memory the in-memory index's keys (claims and Redis-protocol
    /// keys) may take, estimated, before clients' writes that add one are
    /// refused (`storage.max_key_memory_bytes`, resolved: 0 here refuses
    /// every new key; see `key_memory`).
    pub max_key_memory_bytes: u64,
    /// The log is synced on a thread of its own, not on the writer's (see
    /// `syncer`): by default when the process may use one CPU only.
    pub sync_thread: bool,
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
    /// What `settings` ask for: the file at `data_path`, the `storage`
    /// section, `gateway.dedupe_window`; each group commit recorded in
    /// `commit_metrics`.
    pub fn from_settings(settings: &Settings, commit_metrics: CommitMetrics) -> Self {
        let s = &settings.storage;
        Self {
            path: settings.data_path.clone(),
            cache_bytes: s.cache_bytes,
            queue_capacity: s.queue_capacity,
            max_batch: s.max_batch,
            faults: None,
            checkpoint_bytes: s.checkpoint_bytes,
            checkpoint_interval: s.checkpoint_interval,
            checkpoint_idle: s.checkpoint_idle,
            commit_hold: s.commit_hold,
            commit_metrics,
            read_reopen_wait: READ_REOPEN_WAIT,
            dedupe_window: settings.gateway.dedupe_window,
            accept_missing_log: s.accept_missing_log,
            min_free_bytes: s.min_free_bytes,
            max_key_memory_bytes: key_memory::resolve(
                s.max_key_memory_bytes,
                u64::try_from(s.cache_bytes).unwrap_or(u64::MAX),
            ),
            sync_thread: crate::scheduling::one_cpu(),
        }
    }

    /// The settings' defaults (they fit a 1 GB machine), for the file at
    /// `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            ..Self::from_settings(&Settings::default(), CommitMetrics::default())
        }
    }
}
