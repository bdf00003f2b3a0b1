//! Checking a backup, or a stopped data file, without changing anything.
//!
//! A backup ([`verify_backup`], and [`read`] under a restore): every
//! frame's crc32 and the SHA-256 of the whole; the format and schema this
//! build reads; its tables, exactly this build's (names and types); the
//! data file's metadata against the header; every table's rows against
//! the count its end gives; a key for every sealed event and only those,
//! each in a slot a key file holds ([`MAX_KEY_SLOTS`]), and every sealed event opened with its key (AES-GCM's tag is a
//! checksum of each body and its headers, and proves the key is its own).
//!
//! A stopped data file ([`verify_data_file`]): every page's checksum
//! checked by redb (through [`super::overlay`]: nothing is written to it;
//! refused while a server has it); its schema version and id; whether it was
//! closed cleanly; its log's two segments bound to it, their records'
//! checksums, and the batches a start would replay; its key file bound to
//! it and long enough; every row of every table read (every page of every
//! table reached); every sealed event opened with its key.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::io::{BufReader, Read};
use std::path::Path;

use redb::{ReadableDatabase, ReadableTable, ReadableTableMetadata, Value};

use super::format::{self, End, FormatError, FrameReader, Header, Kind};
use super::raw::{SEALS, TABLES, index_of};
use crate::store::redb::overlay::Overlay;
use crate::store::redb::seal::{self, KEY_LEN};
use crate::store::redb::tables::{
    self as t, CLAIM_STATE_WITH_RESULT, KvRow, META_FENCE, META_FILE_ID, META_LOG_OPEN,
    META_LOG_SEGMENTS, META_SCHEMA_VERSION, META_WAL_SEQ, SCHEMA_VERSION, claim_from_value,
};
use crate::store::redb::wal_segments;

/// Why a backup or a data file does not pass.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// The container is damaged, cut short or not a backup.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// Reading failed.
    #[error("reading it failed: {0}")]
    Io(#[from] std::io::Error),
    /// A schema this build does not read.
    #[error(
        "it holds a data file of schema {found}, and this build reads schema {SCHEMA_VERSION}: \
         use the dedupd release that wrote it"
    )]
    Schema {
        /// Its schema.
        found: u64,
    },
    /// Its tables are not this build's.
    #[error("its tables are not this build's: {0}")]
    Tables(String),
    /// Frames in the wrong order, or contents that contradict each other.
    #[error("malformed: {0}")]
    Malformed(String),
    /// A sealed event does not open with its key.
    #[error("the sealed event {event} does not open with its key (slot {slot}): {why}")]
    Seal {
        /// Source and event id.
        event: String,
        slot: u64,
        why: String,
    },
    /// A bulk job's sealed record does not open with its key.
    #[error("the sealed record of bulk job {job} does not open with its key (slot {slot}): {why}")]
    JobSeal { job: String, slot: u64, why: String },
    /// The end's count of a table's rows is not what was read.
    #[error("its end says {said} rows of table {table}, and {found} were read")]
    Count {
        table: &'static str,
        said: u64,
        found: u64,
    },
    /// A data file in use by a running server.
    #[error(
        "it is open in a running dedupd (redb holds an exclusive lock): stop the server to \
         verify its data file, or take a backup and verify that"
    )]
    InUse,
    /// A data file that does not pass.
    #[error("{0}")]
    DataFile(String),
    /// Building a restored file from it failed (see `restore`).
    #[error("writing the restored data file failed: {0}")]
    Build(#[source] redb::Error),
}

/// What a backup holds, read whole and checked.
#[derive(Debug, Clone)]
pub struct BackupReport {
    /// What it says first.
    pub header: Header,
    /// What it says last.
    pub end: End,
    /// Its length.
    pub bytes: u64,
    /// Sealed events opened with their keys.
    pub sealed: u64,
}

impl BackupReport {
    /// Rows of the table named `name`.
    pub fn rows(&self, name: &str) -> u64 {
        index_of(name)
            .and_then(|i| self.end.rows.get(i))
            .copied()
            .unwrap_or(0)
    }
}

/// Where a backup's rows and keys go as they are read (a restore builds a
/// data file with them). Nothing handed over is trusted until [`read`]
/// returns `Ok`: the whole's checksum is checked last.
pub(super) trait Load {
    /// Rows of the table `table` (an index into the header's tables).
    fn rows(&mut self, table: usize, rows: &[(&[u8], &[u8])]) -> Result<(), VerifyError>;
    /// Key slots and their keys.
    fn keys(&mut self, keys: &[(u64, &[u8])]) -> Result<(), VerifyError>;
}

/// Loads nothing: a check only.
struct Nothing;

impl Load for Nothing {
    fn rows(&mut self, _: usize, _: &[(&[u8], &[u8])]) -> Result<(), VerifyError> {
        Ok(())
    }
    fn keys(&mut self, _: &[(u64, &[u8])]) -> Result<(), VerifyError> {
        Ok(())
    }
}

/// Rows of a frame checked and loaded at a time.
const ROWS_AT_ONCE: usize = 4096;

/// The highest fence counter a backup may hold: a counter dedupd wrote is
/// far below (a million fences a second for a hundred thousand years), and
/// a restore moves it on without coming near `u64::MAX`.
pub const MAX_FENCE: u64 = 1 << 62;

/// Key slots a backup may name: `0..MAX_KEY_SLOTS`. A restore writes the
/// key file whole, 32 bytes a slot up to the highest a backup names (a
/// seal is bound to its slot), and its bulk jobs' records sealed anew in
/// the slots after it. A running instance hands slots out from 0 up,
/// reusing freed ones before it grows its key file (1,024 at a time), so
/// its highest slot is below the most sealed rows it ever held at once.
/// 2^40 slots is a key file of 32 TiB (twice ext4's largest file) for a
/// trillion sealed events at once: above any key file dedupd writes, and
/// far below where a slot's offset in the file, or the count of slots,
/// overflows.
pub const MAX_KEY_SLOTS: u64 = 1 << 40;

/// Says nothing of the panics a hostile backup's rows cause as they are
/// read (each is caught, and the backup refused); see [`super::raw::quiet_panics`].
pub fn quiet_panics() {
    super::raw::quiet_panics();
}

/// Checks the backup at `path` (see the module doc).
pub fn verify_backup(path: &Path) -> Result<BackupReport, VerifyError> {
    let file = std::fs::File::open(path)?;
    read(BufReader::with_capacity(1 << 20, file), &mut Nothing)
}

/// Reads a backup whole from `input`, checking it (see the module doc),
/// and hands its rows and keys to `load`.
pub(super) fn read(input: impl Read, load: &mut dyn Load) -> Result<BackupReport, VerifyError> {
    let mut frames = FrameReader::new(input)?;
    let header = match frames.next_frame()? {
        Some(f) if f.kind == Kind::Header => header_of(&f.payload)?,
        _ => {
            return Err(VerifyError::Malformed(
                "it does not begin with its header".into(),
            ));
        }
    };
    let mut check = Check::new(&header);
    let end = loop {
        let Some(frame) = frames.next_frame()? else {
            return Err(FormatError::Truncated {
                at: frames.position(),
            }
            .into());
        };
        match frame.kind {
            Kind::Header => return Err(VerifyError::Malformed("a second header".into())),
            Kind::Rows => {
                let (table, mut rows) = format::rows_of(&frame.payload)?;
                let table = usize::from(table);
                let mut chunk = Vec::with_capacity(ROWS_AT_ONCE);
                loop {
                    chunk.clear();
                    for row in rows.by_ref().take(ROWS_AT_ONCE) {
                        chunk.push(row?);
                    }
                    if chunk.is_empty() {
                        break;
                    }
                    check.rows(table, &chunk)?;
                    load.rows(table, &chunk)?;
                }
            }
            Kind::Keys => {
                let keys = format::keys(&frame.payload)?;
                check.keys(&keys)?;
                load.keys(&keys)?;
            }
            Kind::End => {
                let end: End = serde_json::from_slice(&frame.payload)
                    .map_err(|e| VerifyError::Malformed(format!("its end: {e}")))?;
                break end;
            }
        }
    };
    let sealed = check.end(&end)?;
    Ok(BackupReport {
        // The whole file, its end frame included (the end says the bytes
        // before it).
        bytes: frames.position(),
        header,
        end,
        sealed,
    })
}

/// The header, checked against this build.
fn header_of(payload: &[u8]) -> Result<Header, VerifyError> {
    let header: Header = serde_json::from_slice(payload)
        .map_err(|e| VerifyError::Malformed(format!("its header: {e}")))?;
    if header.format != format::FORMAT {
        return Err(FormatError::Format(header.format).into());
    }
    if header.schema != SCHEMA_VERSION {
        return Err(VerifyError::Schema {
            found: header.schema,
        });
    }
    if header.fence > MAX_FENCE {
        return Err(VerifyError::Malformed(format!(
            "its fence counter is {}, above any dedupd hands out ({MAX_FENCE})",
            header.fence
        )));
    }
    let ours: Vec<format::TableInfo> = TABLES.iter().map(|table| table.info()).collect();
    if header.tables != ours {
        let names: Vec<&str> = header
            .tables
            .iter()
            .map(|table| table.name.as_str())
            .collect();
        return Err(VerifyError::Tables(names.join(", ")));
    }
    Ok(header)
}

/// The checks made as a backup's frames are read.
struct Check<'h> {
    header: &'h Header,
    /// The table of the last rows frame.
    table: Option<usize>,
    /// The key of the last row of that table.
    last_key: Option<Vec<u8>>,
    /// Rows read, per table.
    rows: Vec<u64>,
    /// Sealed rows: a hash of their key → their slot.
    sealed: HashMap<u64, u64>,
    hasher: RandomState,
    /// The keys read, by slot, in increasing order.
    keys: Vec<(u64, [u8; KEY_LEN])>,
    /// Sealed events opened.
    opened: u64,
}

impl<'h> Check<'h> {
    fn new(header: &'h Header) -> Self {
        Self {
            header,
            table: None,
            last_key: None,
            rows: vec![0; TABLES.len()],
            sealed: HashMap::new(),
            hasher: RandomState::new(),
            keys: Vec::new(),
            opened: 0,
        }
    }

    fn rows(&mut self, table: usize, rows: &[(&[u8], &[u8])]) -> Result<(), VerifyError> {
        if table >= TABLES.len() || self.table.is_some_and(|last| table < last) {
            return Err(VerifyError::Malformed(format!(
                "rows of table {table} out of order"
            )));
        }
        if self.table != Some(table) {
            self.last_key = None;
        }
        self.table = Some(table);
        self.rows[table] += rows.len() as u64;
        let copied = TABLES[table];
        for (k, v) in rows {
            // Each row as its table's type reads it, without a panic of
            // the reader (a server's writer, the reaper) later; in the
            // table's own order, once each: a row twice would leave the
            // restored table short.
            if !copied.decodes(k, v) {
                return Err(VerifyError::Malformed(format!(
                    "a row of table {} does not read as its type",
                    copied.name()
                )));
            }
            if let Some(last) = &self.last_key
                && copied.compare(last, k) != std::cmp::Ordering::Less
            {
                return Err(VerifyError::Malformed(format!(
                    "the rows of table {} are out of order, or one is there twice",
                    copied.name()
                )));
            }
            self.last_key = Some(k.to_vec());
        }
        match copied.name() {
            "claim_rows" => self.claims(rows)?,
            "inbox_seals" => {
                for (k, v) in rows {
                    let slot = u64::from_le_bytes(
                        <[u8; 8]>::try_from(*v)
                            .map_err(|_| VerifyError::Malformed("a key slot of 8 bytes".into()))?,
                    );
                    self.sealed.insert(self.hasher.hash_one(k), slot);
                }
            }
            "meta" => self.meta(rows)?,
            "inbox_bodies" => {
                for (k, v) in rows {
                    if let Some(&slot) = self.sealed.get(&self.hasher.hash_one(k)) {
                        self.open(k, v, slot)?;
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Every claim's fence is at most the counter's: the next fence handed
    /// out after a restore must be above each.
    fn claims(&self, rows: &[(&[u8], &[u8])]) -> Result<(), VerifyError> {
        for (_, v) in rows {
            let (_, value, expiry) = <KvRow<'static> as Value>::from_bytes(v);
            let Some(claim) = claim_from_value(value, expiry.unwrap_or(0)) else {
                return Err(VerifyError::Malformed("a claim's row is too short".into()));
            };
            // A result that no longer parses is dropped when read (the
            // record stays done); a backup that holds one is damaged.
            if value.first() == Some(&CLAIM_STATE_WITH_RESULT) && claim.result.is_none() {
                return Err(VerifyError::Malformed(
                    "a done record's result is not JSON".into(),
                ));
            }
            if claim.fence > self.header.fence {
                return Err(VerifyError::Malformed(format!(
                    "a claim holds fence {}, above the backup's fence counter {}",
                    claim.fence, self.header.fence
                )));
            }
        }
        Ok(())
    }

    /// The file's metadata says what the header says.
    fn meta(&self, rows: &[(&[u8], &[u8])]) -> Result<(), VerifyError> {
        let mut id = [None, None];
        for (k, v) in rows {
            let (Ok(name), Ok(value)) = (std::str::from_utf8(k), <[u8; 8]>::try_from(*v)) else {
                return Err(VerifyError::Malformed("a metadata row".into()));
            };
            let value = u64::from_le_bytes(value);
            let expect = match name {
                n if n == META_SCHEMA_VERSION => Some(self.header.schema),
                n if n == META_FENCE => Some(self.header.fence),
                n if n == META_WAL_SEQ => Some(self.header.batch),
                n if n == META_FILE_ID[0] => {
                    id[0] = Some(value);
                    None
                }
                n if n == META_FILE_ID[1] => {
                    id[1] = Some(value);
                    None
                }
                _ => None,
            };
            if expect.is_some_and(|e| e != value) {
                return Err(VerifyError::Malformed(format!(
                    "its metadata has {name} = {value}, and its header says otherwise"
                )));
            }
        }
        if let [Some(hi), Some(lo)] = id {
            let named = format!("{:032x}", u128::from(hi) << 64 | u128::from(lo));
            if named != self.header.data_file {
                return Err(VerifyError::Malformed(format!(
                    "its metadata names data file {named}, and its header {}",
                    self.header.data_file
                )));
            }
        }
        Ok(())
    }

    fn keys(&mut self, keys: &[(u64, &[u8])]) -> Result<(), VerifyError> {
        if self.table.is_some_and(|last| last > SEALS) {
            return Err(VerifyError::Malformed(
                "keys after the tables that follow them".into(),
            ));
        }
        for (slot, key) in keys {
            if self.keys.last().is_some_and(|(last, _)| slot <= last) {
                return Err(VerifyError::Malformed("key slots out of order".into()));
            }
            if *slot >= MAX_KEY_SLOTS {
                return Err(VerifyError::Malformed(format!(
                    "it holds a key in slot {slot}, past the last a key file holds ({}): no \
                     dedupd wrote it",
                    MAX_KEY_SLOTS - 1
                )));
            }
            let mut k = [0u8; KEY_LEN];
            k.copy_from_slice(key);
            self.keys.push((*slot, k));
        }
        Ok(())
    }

    /// Opens the seal `body` of the row `key` with the key of `slot`.
    fn open(&mut self, key: &[u8], body: &[u8], slot: u64) -> Result<(), VerifyError> {
        let fail = |why: String| VerifyError::Seal {
            event: event_name(key),
            slot,
            why,
        };
        match seal::seal_header(body) {
            Some((named, _)) if named == slot => {}
            _ => return Err(fail("its body is not a seal of that slot".into())),
        }
        let key = self
            .keys
            .binary_search_by_key(&slot, |(s, _)| *s)
            .map(|i| self.keys[i].1)
            .map_err(|_| fail("the backup holds no key for it".into()))?;
        seal::open_with(body, &key).map_err(|e| fail(e.to_string()))?;
        self.opened += 1;
        Ok(())
    }

    /// The end agrees with what was read; returns the events opened.
    fn end(self, end: &End) -> Result<u64, VerifyError> {
        if end.rows.len() != TABLES.len() {
            return Err(VerifyError::Malformed("its end counts other tables".into()));
        }
        for (i, (&said, &found)) in end.rows.iter().zip(&self.rows).enumerate() {
            if said != found {
                return Err(VerifyError::Count {
                    table: TABLES[i].name(),
                    said,
                    found,
                });
            }
        }
        let slots: std::collections::HashSet<u64> = self.sealed.values().copied().collect();
        if end.keys != self.keys.len() as u64 || slots.len() != self.keys.len() {
            return Err(VerifyError::Malformed(format!(
                "it holds {} keys for {} sealed events (its end says {})",
                self.keys.len(),
                slots.len(),
                end.keys
            )));
        }
        if self.keys.iter().any(|(s, _)| !slots.contains(s)) {
            return Err(VerifyError::Malformed(
                "it holds a key no event of it uses".into(),
            ));
        }
        if self.opened != self.rows[SEALS] {
            return Err(VerifyError::Malformed(format!(
                "{} sealed events, and {} of them have a body",
                self.rows[SEALS], self.opened
            )));
        }
        Ok(self.opened)
    }
}

/// `source/event id` of an inbox key as stored, for a message.
fn event_name(key: &[u8]) -> String {
    let owned = key.to_vec();
    super::raw::quietly(move || {
        let (source, id) = <(&str, &str) as Value>::from_bytes(&owned);
        format!("{source}/{id}")
    })
    .unwrap_or_else(|| "(a key that does not decode)".into())
}

/// What a stopped data file holds, checked.
#[derive(Debug, Clone)]
pub struct DataFileReport {
    /// Its schema version.
    pub schema: u64,
    /// Its id.
    pub id: u128,
    /// It was closed cleanly (its log holds nothing to replay).
    pub closed_cleanly: bool,
    /// Batches a start would replay from its log.
    pub to_replay: usize,
    /// Rows per table.
    pub tables: Vec<(&'static str, u64)>,
    /// Sealed events opened with their keys.
    pub sealed: u64,
    /// Bulk jobs' sealed records opened with their keys.
    pub sealed_jobs: u64,
    /// Things worth knowing that do not fail it.
    pub notes: Vec<String>,
}

/// The schema version of the stopped data file at `path`, read without
/// changing anything (a crash's repair done in memory only, as
/// [`verify_data_file`] does, without its checks of every page and row).
pub fn data_file_schema(path: &Path) -> Result<u64, VerifyError> {
    let db = open_overlay(
        redb::Builder::new().set_cache_size(1 << 20),
        std::fs::File::open(path)?,
        "redb cannot open it",
    )?;
    let tx = db.begin_read().map_err(|e| read_failed(e.into()))?;
    let meta = meta_table(&tx)?;
    meta.get(META_SCHEMA_VERSION)
        .map_err(|e| read_failed(e.into()))?
        .map(|g| g.value())
        .ok_or_else(|| {
            VerifyError::DataFile("it is not a dedupd data file (no schema version)".into())
        })
}

/// `file` opened by redb with `builder`'s options over an overlay that
/// keeps every write in memory: the file is never changed. `failed` says
/// what a refusal other than another process's lock means.
fn open_overlay(
    builder: &mut redb::Builder,
    file: std::fs::File,
    failed: &str,
) -> Result<redb::Database, VerifyError> {
    builder
        .create_with_backend(Overlay::new(file)?)
        .map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => VerifyError::InUse,
            e => VerifyError::DataFile(format!("{failed}: {e}")),
        })
}

fn read_failed(e: redb::Error) -> VerifyError {
    VerifyError::DataFile(format!("reading it failed: {e}"))
}

/// The metadata table of a dedupd data file.
fn meta_table(
    tx: &redb::ReadTransaction,
) -> Result<redb::ReadOnlyTable<&'static str, u64>, VerifyError> {
    tx.open_table(t::META).map_err(|_| {
        VerifyError::DataFile("it is not a dedupd data file (it has no metadata)".into())
    })
}

/// Checks the stopped data file at `path` and the files beside it (see
/// the module doc), writing nothing.
pub fn verify_data_file(path: &Path) -> Result<DataFileReport, VerifyError> {
    let bad = |what: String| VerifyError::DataFile(what);
    let file = std::fs::File::open(path)?;
    let rolled_back = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = rolled_back.clone();
    // Every page's checksum checked by redb, and a file a crash left
    // repaired as the next open would: both in memory only. A last commit
    // that fails its checksums is rolled back to the one before (as after
    // a crash in the middle of a commit); redb's repair says so by its
    // progress, a third of the way.
    let db = open_overlay(
        redb::Builder::new()
            .set_cache_size(16 << 20)
            .set_check_integrity_on_open(true)
            .set_repair_callback(move |session| {
                if (session.progress() - 0.3).abs() < 1e-9 {
                    seen.store(true, std::sync::atomic::Ordering::SeqCst);
                }
            }),
        file,
        "its pages fail redb's checksums",
    )?;
    let redb = read_failed;
    let tx = db.begin_read().map_err(|e| redb(e.into()))?;
    let meta = meta_table(&tx)?;
    let get = |k: &str| -> Result<Option<u64>, VerifyError> {
        Ok(meta.get(k).map_err(|e| redb(e.into()))?.map(|g| g.value()))
    };
    let mut notes = Vec::new();
    let schema = get(META_SCHEMA_VERSION)?
        .ok_or_else(|| bad("it is not a dedupd data file (no schema version)".into()))?;
    if schema > SCHEMA_VERSION {
        return Err(bad(format!(
            "it has schema version {schema}, and this build reads up to {SCHEMA_VERSION}: use \
             the dedupd release that wrote it"
        )));
    }
    if schema < SCHEMA_VERSION {
        notes.push(format!(
            "schema {schema}: `dedupd serve` migrates it to {SCHEMA_VERSION} when it opens it \
             (the checks of its tables below are this build's)"
        ));
    }
    let (hi, lo) = (get(META_FILE_ID[0])?, get(META_FILE_ID[1])?);
    let (id, bound) = match (hi, lo) {
        (Some(hi), Some(lo)) => (u128::from(hi) << 64 | u128::from(lo), true),
        _ => (0, false),
    };
    let log_open = get(META_LOG_OPEN)?.is_some_and(|v| v != 0);
    let segments = get(META_LOG_SEGMENTS)?.unwrap_or(1);
    if rolled_back.load(std::sync::atomic::Ordering::SeqCst) {
        if !log_open {
            return Err(bad(
                "its last commit fails redb's checksums: redb would roll it back to the commit \
                 before, losing what the last one holds"
                    .into(),
            ));
        }
        notes.push(
            "its last commit fails redb's checksums (a crash in the middle of a commit): redb \
             rolls it back to the one before when it opens it, and the log replays from there"
                .into(),
        );
    }
    let stored = get(META_WAL_SEQ)?.unwrap_or(0);
    drop(meta);
    // The log: bound to this file, its records intact, its segments joined.
    let batches = wal_segments::read(path, stored, id, bound).map_err(|e| {
        bad(format!(
            "its write-ahead log {}: {}",
            e.path.display(),
            e.error
        ))
    })?;
    // As opening decides it: the first segment, and the second once the
    // file records two.
    let exists = |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.len() > 0);
    let [first, second] = wal_segments::paths_for(path);
    let missing = !exists(&first) || (segments >= 2 && !exists(&second));
    if log_open && missing {
        return Err(bad(
            "it was not closed cleanly, and its write-ahead log (.wal, .wal2) is missing: the \
             writes acknowledged since its last checkpoint are not here"
                .into(),
        ));
    }
    if !batches.is_empty() {
        notes.push(format!(
            "its log holds {} batches that `dedupd serve` replays when it opens the file",
            batches.len()
        ));
    }
    // Every row of every table (every page reached).
    let mut tables = Vec::new();
    for table in &TABLES {
        let n = table
            .each_row(&tx, &mut |_, _| Ok(()))
            .map_err(|e| bad(format!("reading table {} failed: {e}", table.name())))?;
        tables.push((table.name(), n));
    }
    let (sealed, sealed_jobs) = open_seals(path, &tx, id, !batches.is_empty(), &mut notes)?;
    Ok(DataFileReport {
        schema,
        id,
        closed_cleanly: !log_open,
        to_replay: batches.len(),
        tables,
        sealed,
        sealed_jobs,
        notes,
    })
}

/// Opens every sealed event of the snapshot `tx`, and every bulk job's
/// sealed record, with its key from the key file beside `data` (whose id
/// is `id`); how many of each opened. With batches to replay, a seal
/// whose key is gone is noted, not failed: a logged erasure or reaping of
/// its event (a later version of a job's record) shredded its key before
/// the crash.
fn open_seals(
    data: &Path,
    tx: &redb::ReadTransaction,
    id: u128,
    replay: bool,
    notes: &mut Vec<String>,
) -> Result<(u64, u64), VerifyError> {
    let bad = |what: String| VerifyError::DataFile(what);
    let redb = |e: redb::Error| bad(format!("reading it failed: {e}"));
    let seals = match tx.open_table(t::INBOX_SEALS) {
        Ok(s) => Some(s),
        Err(redb::TableError::TableDoesNotExist(_)) => None,
        Err(e) => return Err(redb(e.into())),
    };
    let mut jobs = Vec::new();
    match tx.open_table(t::INBOX_JOBS) {
        Ok(table) => {
            for row in table.iter().map_err(|e| redb(e.into()))? {
                let (k, v) = row.map_err(|e| redb(e.into()))?;
                let record = v.value().0;
                if let Some((slot, _)) = seal::seal_header(record) {
                    jobs.push((k.value().to_owned(), slot, record.to_vec()));
                }
            }
        }
        Err(redb::TableError::TableDoesNotExist(_)) => {}
        Err(e) => return Err(redb(e.into())),
    }
    let no_events = match &seals {
        Some(s) => s.is_empty().map_err(|e| redb(e.into()))?,
        None => true,
    };
    if no_events && jobs.is_empty() {
        return Ok((0, 0));
    }
    let keys_path = seal::path_for(data);
    let keys = std::fs::read(&keys_path).map_err(|e| {
        bad(format!(
            "it holds sealed events or bulk jobs' records, and their key file {} cannot be \
             read: {e}{}",
            keys_path.display(),
            crate::store::redb::open::set_aside(&keys_path)
        ))
    })?;
    let header: [u8; seal::HEADER as usize] = keys
        .get(..seal::HEADER as usize)
        .and_then(|h| h.try_into().ok())
        .ok_or_else(|| bad(format!("{} is not a dedupd key file", keys_path.display())))?;
    if header != seal::header(id) {
        return Err(bad(format!(
            "key file {} is not this data file's ({id:032x})",
            keys_path.display()
        )));
    }
    // A slot a row names may be anything: past the file's end, as far as
    // `u64::MAX`.
    let key_of = |slot: u64| {
        usize::try_from(slot)
            .ok()
            .and_then(|s| s.checked_mul(KEY_LEN))
            .and_then(|at| at.checked_add(seal::HEADER as usize))
            .and_then(|at| keys.get(at..at.checked_add(KEY_LEN)?))
    };
    let (mut opened_jobs, mut failed_jobs) = (0u64, 0u64);
    for (job, slot, record) in jobs {
        let key = key_of(slot).ok_or_else(|| {
            bad(format!(
                "the sealed record of bulk job {job} uses key slot {slot}, past the end of key \
                 file {}",
                keys_path.display()
            ))
        })?;
        match seal::open_with(&record, key) {
            Ok(_) => opened_jobs += 1,
            Err(_) if replay => failed_jobs += 1,
            Err(e) => {
                return Err(VerifyError::JobSeal {
                    job,
                    slot,
                    why: e.to_string(),
                });
            }
        }
    }
    if failed_jobs > 0 {
        notes.push(format!(
            "{failed_jobs} bulk jobs' sealed records do not open with their keys: the log's \
             batches, replayed at the next start, write them again"
        ));
    }
    let Some(seals) = seals.filter(|_| !no_events) else {
        return Ok((0, opened_jobs));
    };
    let bodies = tx.open_table(t::INBOX_BODIES).map_err(|e| redb(e.into()))?;
    let (mut opened, mut failed) = (0u64, 0u64);
    for row in seals.iter().map_err(|e| redb(e.into()))? {
        let (k, slot) = row.map_err(|e| redb(e.into()))?;
        let (source, event) = k.value();
        let slot = slot.value();
        let name = format!("{source}/{event}");
        let key = key_of(slot).ok_or_else(|| {
            bad(format!(
                "the sealed event {name} uses key slot {slot}, past the end of key file {}",
                keys_path.display()
            ))
        })?;
        let body = bodies
            .get((source, event))
            .map_err(|e| redb(e.into()))?
            .ok_or_else(|| bad(format!("the sealed event {name} has no body")))?;
        match seal::open_with(body.value(), key) {
            Ok(_) => opened += 1,
            Err(_) if replay => failed += 1,
            Err(e) => {
                return Err(VerifyError::Seal {
                    event: name,
                    slot,
                    why: e.to_string(),
                });
            }
        }
    }
    if failed > 0 {
        notes.push(format!(
            "{failed} sealed events do not open with their keys: the log's batches, replayed at \
             the next start, erase or reap them"
        ));
    }
    Ok((opened, opened_jobs))
}
