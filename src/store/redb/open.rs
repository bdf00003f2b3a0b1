//! Opening the data file: the schema checked (or migrated), the log bound
//! to its file checked and replayed, the writer started; and why that can
//! fail ([`OpenError`]). Also the read-only look `check-config` takes.

use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use redb::{Database, ReadableDatabase, ReadableTable};

use super::counts::StatusCounts;
use super::engine::{Engine, Shared};
use super::flusher::Flusher;
use super::kv_index::KvIndex;
use super::seal::{self, KeysError, Seals};
use super::space::{self, Space};
use super::sync_gate::SyncGate;
use super::tables::SCHEMA_VERSION;
use super::wal_segments::{self, Segments};
use super::watermark::Watermark;
use super::writer::{self, Counters};
use super::{OWNER_ONLY, RedbOptions, guard, inbox, migrate, wal};

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
        "data file {path} has schema version {found}, but this dedupd ({}) reads schema version \
         {SCHEMA_VERSION} and the ones before it: a newer dedupd wrote it. Nothing was changed. \
         Install that newer release again (a downgrade of the package cannot read the file), or \
         restore a backup made by this release; moving the file away starts empty",
        env!("CARGO_PKG_VERSION")
    )]
    UnknownSchema {
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
         {log} away to start with an empty store (and {data}.wal2, the log's other segment, if \
         it is there)"
    )]
    OrphanLog {
        log: PathBuf,
        /// Its missing data file.
        data: PathBuf,
    },
    /// The write-ahead log belongs to another data file.
    #[error(
        "write-ahead log {log} belongs to another data file than {data} ({}; {data} is \
         {data_id:032x}): it was not replayed and is left as it is. This happens when {data} was \
         replaced, created anew or copied from another installation while the log stayed. If {data} is the \
         file to serve, move {log} away (it may hold writes that never reached {data}: keep it) \
         and start again; otherwise put back the data file the log belongs to",
        match log_id {
            Some(id) => format!("the log names data file {id:032x}"),
            None => "the log is of format 1, from before logs named their data file".into(),
        }
    )]
    ForeignLog {
        log: PathBuf,
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
    LogVersion { log: PathBuf, found: u32 },
    /// A logged record passes its checksum but does not decode.
    #[error(
        "write-ahead log {log}: {detail} (log format {version}, this build writes {}). That is \
         corruption or a log of another build, not a torn tail, so dedupd does not drop it: \
         the log is left as it is and nothing was replayed. Keep copies of {log} and its data \
         file; start the dedupd release that wrote the log, or restore the data file and \
         its log (.wal and .wal2) from a backup",
        wal::FORMAT
    )]
    CorruptLog {
        log: PathBuf,
        version: u32,
        /// What does not decode, and where.
        detail: String,
    },
    /// A record in the middle of the log is damaged: later batches follow
    /// it intact.
    #[error(
        "write-ahead log {log}: {detail}. A damaged record followed by later ones is \
         corruption, not a torn tail, so dedupd does not drop what follows it: nothing was \
         replayed and the log is left as it is. Keep copies of {log} and its data file, and \
         restore the data file and its log (.wal and .wal2) from a backup"
    )]
    DamagedLog {
        log: PathBuf,
        /// Where, and what follows.
        detail: String,
    },
    /// The log's two segments do not join: batches between are in neither.
    #[error(
        "write-ahead log {log}: {detail}. dedupd does not replay a log with batches missing: \
         nothing was replayed and both segments are left as they are. Put back the segment \
         that was moved away ({log} and the file beside it ending in .wal2 go together), or \
         restore the data file and both segments from a backup"
    )]
    LogSegments {
        log: PathBuf,
        /// Where the segments part.
        detail: String,
    },
    /// The data file is older than its log: batches between are in neither.
    #[error(
        "data file {data} holds the write-ahead log's batches up to {holds}, but the log {log} \
         continues from batch {first}: the batches between are in neither file. The data file \
         is older than its log (restored from a backup while the log stayed?). Nothing was \
         replayed; both are left as they are. Put back the data file that goes with this log; \
         or, to serve {data} as it is (losing every write after it was copied), move {log} \
         and {data}.wal2 away and start with --accept-missing-log"
    )]
    LogAhead {
        log: PathBuf,
        data: PathBuf,
        /// The last batch the data file holds.
        holds: u64,
        /// The first batch the log has after it.
        first: u64,
    },
    /// The data file was not closed cleanly, and its log is gone.
    #[error(
        "data file {data} was not closed cleanly, and its write-ahead log {log} is missing or \
         empty: the log holds the writes acknowledged since the last checkpoint. Put the log back \
         beside the data file (the data file and its log's two segments, .wal and .wal2, are \
         moved and backed up together). To serve {data} \
         without them, losing those writes, start once with --accept-missing-log"
    )]
    MissingLog { log: PathBuf, data: PathBuf },
    /// The disk has no room to replay the log into the data file.
    #[error(
        "write-ahead log {log} holds writes to replay into the data file, which needs about \
         {need} bytes free on its disk, and {free} are: free some space (nothing was replayed \
         or written) and start again"
    )]
    NoRoomToReplay {
        log: PathBuf,
        /// Bytes the replay needs free.
        need: u64,
        /// Bytes free.
        free: u64,
    },
    /// The file beside the data file is not a write-ahead log.
    #[error("{0} is not a dedupd write-ahead log; move it away")]
    NotALog(PathBuf),
    /// The data file holds sealed events and their key file is missing.
    #[error(
        "data file {data} holds sealed webhook events or bulk jobs' records, but their key file \
         {keys} is missing: without it they cannot be read. Put it back beside the data file \
         (the data file, its log's two segments .wal and .wal2 and its key file .keys are \
         moved and backed up together); nothing was changed{aside}"
    )]
    MissingKeys {
        keys: PathBuf,
        data: PathBuf,
        /// The key files a restore renamed aside, if any, named.
        aside: String,
    },
    /// The key file belongs to another data file, or is not a key file.
    #[error(
        "key file {keys} {detail}, not to data file {data}: it was left as it is and nothing \
         was changed. This happens when {data} was replaced, created anew or copied from \
         another installation while the key file stayed. Put back the key file that goes \
         with {data}; if {data} holds no events yet, move {keys} away and start again"
    )]
    ForeignKeys {
        keys: PathBuf,
        data: PathBuf,
        /// Whose it is.
        detail: String,
    },
    /// The key file lacks slots the data file's events use.
    #[error(
        "key file {keys} is damaged or from an older copy: {detail}. Nothing was changed; \
         restore the data file and its key file from the same backup"
    )]
    DamagedKeys {
        keys: PathBuf,
        /// What is missing.
        detail: String,
    },
    /// Anything else redb or the OS reported.
    #[error("cannot open data file {path}: {source}")]
    Other { path: PathBuf, source: redb::Error },
}

impl Engine {
    /// Opens (or creates) the data file and starts the writer.
    pub(super) fn open(opts: &RedbOptions) -> Result<Self, OpenError> {
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
        let exists = |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.len() > 0);
        let has_log = exists(&wal_path);
        if !has_data
            && let Some(log) = wal_segments::paths_for(&opts.path)
                .into_iter()
                .find(|p| exists(p))
        {
            return Err(OpenError::OrphanLog {
                log,
                data: opts.path.clone(),
            });
        }
        // Nor is a key file left from another data file taken for a new
        // one's (its keys open that one's events).
        let keys = seal::path_for(&opts.path);
        if !has_data && exists(&keys) {
            return Err(OpenError::ForeignKeys {
                keys,
                data: opts.path.clone(),
                detail: "is left from a data file that is not there".into(),
            });
        }
        if has_data {
            migrate::refuse_newer(&opts.path)?;
        }
        let refuse = Arc::new(AtomicBool::new(false));
        let gate = Arc::new(SyncGate::default());
        let db = open_db(opts, refuse.clone(), gate.clone()).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => OpenError::InUse(opts.path.clone()),
            e => other(e.into()),
        })?;
        // Before anything is written: a file with sealed events opens only
        // beside its own key file.
        check_keys(&db, opts)?;
        let id = migrate::init_schema(&db, &opts.path)?;
        warn_if_others_can_read(&opts.path);
        for log in wal_segments::paths_for(&opts.path) {
            warn_if_others_can_read(&log);
        }
        warn_if_others_can_read(&seal::path_for(&opts.path));
        // A file left open (not closed cleanly) has acknowledged writes in
        // its log: without the log (either segment, once it has two) they
        // would be lost without a word.
        let missing = if has_log {
            let spare = wal_segments::spare_path_for(&opts.path);
            (writer::log_segments(&db).map_err(other)? >= 2 && !exists(&spare)).then_some(spare)
        } else {
            Some(wal_path.clone())
        };
        if let Some(missing) = missing
            && writer::log_open(&db).map_err(other)?
        {
            if !opts.accept_missing_log {
                return Err(OpenError::MissingLog {
                    log: missing,
                    data: opts.path.clone(),
                });
            }
            tracing::warn!(
                log = %missing.display(),
                data = %opts.path.display(),
                "the data file was not closed cleanly and its write-ahead log is missing: serving \
                 it without the writes acknowledged since its last checkpoint, as asked"
            );
        }
        // Batches acknowledged after the last checkpoint are in the log.
        let stored = writer::stored_seq(&db).map_err(other)?;
        let (mut log, batches) =
            Segments::open(&opts.path, opts.faults.as_ref(), stored, id.id, id.bound)
                .map_err(|e| log_error(e.error, &e.path, &opts.path, id.id))?;
        // Replaying writes what the log holds into the file: refused up
        // front, before a byte is written, when it cannot fit (a failed
        // replay would take the room and leave nothing to show for it).
        let space = Space::new(&opts.path, opts.min_free_bytes, opts.faults.clone());
        let need = space::checkpoint_need(log.len());
        let free = space.read();
        if !batches.is_empty() && free < need {
            return Err(OpenError::NoRoomToReplay {
                log: wal_path,
                need,
                free,
            });
        }
        let kv = KvIndex::default();
        let seq = writer::replay(&db, &kv, batches).map_err(other)?;
        log.reset().map_err(|e| other(redb::Error::Io(e)))?;
        let logged = writer::Logged {
            segments: log,
            seq,
            checkpointed: std::time::Instant::now(),
        };
        let counts = StatusCounts::default();
        counts.recount(&db).map_err(other)?;
        let seals = open_seals(&db, opts, id.id)?;
        let shared = Arc::new(Shared {
            db: Mutex::new(Some(Arc::new(db))),
            healthy: AtomicBool::new(true),
            counts,
            kv,
            watermark: Watermark::new(seq),
            refuse: Mutex::new(refuse),
            gate: gate.clone(),
            reopen_wanted: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            space,
            seals: Arc::new(seals),
        });
        // Before the writer: it makes the syncs the writer hands over.
        let flusher = Flusher::start(&opts.path, gate, opts.faults.clone())
            .map_err(|e| other(redb::Error::Io(e)))?;
        let counters = Arc::new(Counters::default());
        let (writes, handle) =
            writer::spawn(shared.clone(), opts.clone(), counters.clone(), logged)
                .map_err(|e| other(redb::Error::Io(e)))?;
        Ok(Self {
            shared,
            writes,
            writer: Mutex::new(Some(handle)),
            flusher: Mutex::new(Some(flusher)),
            counters,
            read_reopen_wait: opts.read_reopen_wait,
            dedupe_window_ms: u64::try_from(opts.dedupe_window.as_millis()).unwrap_or(u64::MAX),
            max_key_memory_bytes: opts.max_key_memory_bytes,
            backups: Arc::new(super::backup::Turns::new()),
        })
    }
}

/// Refuses a data file that holds sealed events (or bulk jobs' sealed
/// records) unless its own key file is beside it, reading only (a file
/// of an older schema has none).
fn check_keys(db: &Database, opts: &RedbOptions) -> Result<(), OpenError> {
    let sealed = || -> Result<Option<u128>, redb::Error> {
        let tx = db.begin_read()?;
        let events = match tx.open_table(super::tables::INBOX_SEALS) {
            Ok(t) => t.first()?.is_some(),
            Err(redb::TableError::TableDoesNotExist(_)) => false,
            Err(e) => return Err(e.into()),
        };
        if !events && !inbox::any_sealed_job(&tx)? {
            return Ok(None);
        }
        Ok(Some(migrate::stored_file_id(db)?))
    };
    let Some(id) = sealed().map_err(|e| OpenError::Other {
        path: opts.path.clone(),
        source: e,
    })?
    else {
        return Ok(());
    };
    Seals::check(&opts.path, id).map_err(|e| keys_error(e, opts))
}

/// The files `dedupd restore --replace` renamed `path` aside to
/// (`NAME.before-restore-TIME`), named for an error: a restore stopped
/// between its renames (killed, the power gone) leaves the data file with
/// its key file renamed away, and the operator needs its name.
pub(crate) fn set_aside(path: &Path) -> String {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return String::new();
    };
    let prefix = format!("{}.before-restore-", name.to_string_lossy());
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let mut found: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&prefix))
        .collect();
    if found.is_empty() {
        return String::new();
    }
    found.sort();
    let shown: Vec<String> = found
        .iter()
        .rev()
        .take(3)
        .map(|n| crate::redact::escape_control(n).into_owned())
        .collect();
    format!(
        ". A restore renamed key files aside here ({}): if one was stopped midway, the newest \
         of them may be this data file's",
        shown.join(", ")
    )
}

/// The open error for a key file that cannot be used.
fn keys_error(e: KeysError, opts: &RedbOptions) -> OpenError {
    let keys = seal::path_for(&opts.path);
    match e {
        KeysError::Io(e) => OpenError::Other {
            path: keys,
            source: redb::Error::Io(e),
        },
        KeysError::Missing => OpenError::MissingKeys {
            aside: set_aside(&keys),
            keys,
            data: opts.path.clone(),
        },
        KeysError::NotKeys => OpenError::ForeignKeys {
            keys,
            data: opts.path.clone(),
            detail: "is not a dedupd key file".into(),
        },
        KeysError::Foreign(of) => OpenError::ForeignKeys {
            keys,
            data: opts.path.clone(),
            detail: format!("belongs to data file {of:032x}"),
        },
        e @ KeysError::Short { .. } => OpenError::DamagedKeys {
            keys,
            detail: e.to_string(),
        },
    }
}

/// Opens the key file of the data file `db` (its id `id`), once the log is
/// replayed: every slot no row uses is shredded (see [`seal`]).
fn open_seals(db: &Database, opts: &RedbOptions, id: u128) -> Result<Seals, OpenError> {
    let other = |e: redb::Error| OpenError::Other {
        path: opts.path.clone(),
        source: e,
    };
    let used =
        inbox::sealed_slots(&db.begin_read().map_err(|e| other(e.into()))?).map_err(other)?;
    Seals::open(&opts.path, id, &used, opts.faults.clone()).map_err(|e| keys_error(e, opts))
}

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
/// `gate` is where checkpoints' syncs are handed over (see
/// [`super::sync_gate`]).
pub(super) fn open_db(
    opts: &RedbOptions,
    refuse: Arc<AtomicBool>,
    gate: Arc<SyncGate>,
) -> Result<Database, redb::DatabaseError> {
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
        gate,
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
        wal::LogError::Damaged { .. } => OpenError::DamagedLog {
            log,
            detail: e.to_string(),
        },
        wal::LogError::Segments { .. } => OpenError::LogSegments {
            log,
            detail: e.to_string(),
        },
        wal::LogError::Gap { holds, first } => OpenError::LogAhead {
            log,
            data,
            holds,
            first,
        },
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

/// The sources with events in the data file at `path`, with their pending
/// counts, read without writing (for `check-config`). `Ok(None)` when there
/// is no file yet; an error (such as the file being in use by a running
/// dedupd) says why it could not be read.
pub fn inbox_sources_in_file(path: &Path) -> Result<Option<Vec<(String, u64)>>, String> {
    match std::fs::metadata(path) {
        Err(_) => return Ok(None),
        // A FIFO would hang the open below until something wrote to it.
        Ok(meta) if !meta.is_file() => {
            return Err("it is not a plain file (a directory, a FIFO or a device)".to_owned());
        }
        Ok(_) => {}
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
