//! Restoring a backup: a data file and its key file built from it beside
//! the target, proven by opening them, then put in place.
//!
//! Nothing at the target is touched until the backup was read whole and
//! passed every check of [`super::verify`], and the files built from it
//! opened as `serve` opens a data file. Then the files already there (the
//! data file, its log's two segments, its key file) are renamed aside,
//! and the new ones renamed into place, the data file last.
//!
//! The restored data file is a new one:
//!
//! - **a new id**, so no log or key file left at the target (or of the
//!   instance the backup was taken from) is ever taken for its own; it
//!   comes with an empty log, and its key file holds the backup's keys and
//!   fresh ones in every other slot;
//! - **closed cleanly**: nothing to replay;
//! - **fences go on past any the old instance may have handed out** after
//!   the backup: the counter moves on by [`FENCE_FLOOR`] and
//!   [`FENCES_PER_MS`] for each millisecond since the backup was taken
//!   (far above what one instance hands out), so a fence handed out after
//!   the restore is above every fence handed out before it, by either.

use std::fs::{File, OpenOptions};
use std::io::{BufReader, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use redb::{Durability, ReadableDatabase, WriteTransaction};

use super::raw::TABLES;
use super::verify::{self, BackupReport, Load, VerifyError};
use crate::store::redb::seal::{self, KEY_LEN};
use crate::store::redb::tables::{
    META, META_FENCE, META_FILE_ID, META_LOG_OPEN, META_LOG_SEGMENTS,
};
use crate::store::redb::{OWNER_ONLY, OpenError, RedbOptions, RedbStore, wal, wal_segments};

/// Fences a restore moves the counter on by, at least.
pub const FENCE_FLOOR: u64 = 1_000_000;
/// ... and for each millisecond since the backup was taken (a million
/// claims a second, sustained; one instance hands out far fewer).
pub const FENCES_PER_MS: u64 = 1_000;
/// Rows' bytes written per transaction while building.
const TRANSACTION_BYTES: usize = 64 << 20;

/// What to restore, and where.
#[derive(Debug, Clone)]
pub struct RestoreOptions {
    /// The backup file.
    pub backup: PathBuf,
    /// The data file to restore to (its log and key file go beside it).
    pub data: PathBuf,
    /// Rename the files already there aside (else they are a refusal).
    pub replace: bool,
    /// Now, Unix ms: how far fences move on.
    pub now_ms: u64,
}

/// What a restore did.
#[derive(Debug, Clone)]
pub struct Restored {
    /// The backup, as checked.
    pub report: BackupReport,
    /// The restored data file's new id.
    pub id: u128,
    /// The last fence it records: the next one handed out is above.
    pub fence: u64,
    /// The files that were there, renamed aside.
    pub moved_aside: Vec<PathBuf>,
    /// Why the files could not be given the directory's owner, if so.
    pub owner_warning: Option<String>,
}

/// Why a backup was not restored. Nothing at the target changed unless
/// the error says so.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// The backup does not pass its checks.
    #[error("backup {path}: {source}; nothing was restored")]
    Backup { path: PathBuf, source: VerifyError },
    /// A server has the target open.
    #[error(
        "data file {0} is open in a running dedupd: stop it first (systemctl stop dedupd); \
         nothing was restored"
    )]
    InUse(PathBuf),
    /// Files are at the target and replacing them was not asked for.
    #[error(
        "{} already there: pass --replace to rename them aside (to NAME.before-restore-TIME) \
         and restore, or move them away; nothing was restored",
        .0.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
    )]
    Exists(Vec<PathBuf>),
    /// The files built from the backup do not open as a data file.
    #[error("the data file built from the backup does not open: {0}; nothing was restored")]
    Open(#[source] OpenError),
    /// Reading, writing or renaming a file failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, and whether anything changed.
        what: String,
        source: std::io::Error,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RestoreError {
    let what = what.into();
    move |source| RestoreError::Io { what, source }
}

/// The four files of a data file at `data`: itself, its log's segments,
/// its key file; the data file last (it goes into place last).
fn files_of(data: &Path) -> [PathBuf; 4] {
    let [wal, wal2] = wal_segments::paths_for(data);
    debug_assert_eq!(wal, wal::path_for(data));
    [seal::path_for(data), wal, wal2, data.to_owned()]
}

/// Restores the backup `opts.backup` to `opts.data` (see the module doc).
pub async fn restore(opts: RestoreOptions) -> Result<Restored, RestoreError> {
    let data = opts.data.clone();
    let there = || -> Vec<PathBuf> {
        files_of(&data)
            .into_iter()
            .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.len() > 0))
            .collect()
    };
    in_use(&data)?;
    if !opts.replace && !there().is_empty() {
        return Err(RestoreError::Exists(there()));
    }
    let dir = match data.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(d) => d.to_owned(),
        None => PathBuf::from("."),
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(io(format!("creating {}", dir.display())))?;
    let stage = Stage::new(&dir, &data)?;
    let staged = stage.data.clone();
    let backup = opts.backup.clone();
    let now = opts.now_ms;
    let (report, id, fence) = tokio::task::spawn_blocking(move || build(&backup, &staged, now))
        .await
        .map_err(|e| io("building the data file")(std::io::Error::other(e)))??;
    // Opened as serve opens it: schema, key file bound and long enough, an
    // empty log made for it; closed cleanly.
    let mut options = RedbOptions::new(&stage.data);
    options.cache_bytes = 16 << 20;
    let store = tokio::task::spawn_blocking(move || RedbStore::open(&options))
        .await
        .map_err(|e| io("opening the restored data file")(std::io::Error::other(e)))?
        .map_err(RestoreError::Open)?;
    store.close().await;
    // Into place. A server started meanwhile has the file now.
    in_use(&data)?;
    let stamp = stamp(opts.now_ms);
    let mut moved_aside = Vec::new();
    for old in there() {
        let mut aside = old.as_os_str().to_owned();
        aside.push(format!(".before-restore-{stamp}"));
        let aside = PathBuf::from(aside);
        std::fs::rename(&old, &aside).map_err(io(format!(
            "renaming {} aside (the files renamed before it: {:?})",
            old.display(),
            moved_aside
        )))?;
        moved_aside.push(aside);
    }
    for (from, to) in files_of(&stage.data).iter().zip(files_of(&data)) {
        if from.exists() {
            std::fs::rename(from, &to).map_err(io(format!(
                "moving {} into place (the files already there were renamed aside: {moved_aside:?})",
                to.display()
            )))?;
        }
    }
    File::open(&dir)
        .and_then(|d| d.sync_all())
        .map_err(io(format!("syncing {}", dir.display())))?;
    drop(stage);
    let owner_warning = give_to_owner_of(&dir, &files_of(&data));
    Ok(Restored {
        report,
        id,
        fence,
        moved_aside,
        owner_warning,
    })
}

/// Refuses when a server has `data` open.
fn in_use(data: &Path) -> Result<(), RestoreError> {
    if !data.exists() {
        return Ok(());
    }
    match redb::ReadOnlyDatabase::open(data) {
        Err(redb::DatabaseError::DatabaseAlreadyOpen) => Err(RestoreError::InUse(data.to_owned())),
        // Not in use: damaged or not a data file at all is no reason not
        // to restore over it.
        _ => Ok(()),
    }
}

/// A directory beside the target the files are built in; removed with
/// whatever is left in it when dropped.
struct Stage {
    dir: PathBuf,
    data: PathBuf,
}

impl Stage {
    fn new(dir: &Path, data: &Path) -> Result<Self, RestoreError> {
        let name = data.file_name().unwrap_or_else(|| "dedupd.redb".as_ref());
        let stage = dir.join(format!(".dedupd-restore-{:016x}", rand::random::<u64>()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&stage)
            .map_err(io(format!("creating {}", stage.display())))?;
        Ok(Self {
            data: stage.join(name),
            dir: stage,
        })
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Builds the data file `data` and its key file from the backup at
/// `backup`; returns the backup's report, the new file's id and its last
/// fence.
fn build(
    backup: &Path,
    data: &Path,
    now_ms: u64,
) -> Result<(BackupReport, u128, u64), RestoreError> {
    let refused = |source: VerifyError| RestoreError::Backup {
        path: backup.to_owned(),
        source,
    };
    let file = File::open(backup).map_err(io(format!("opening backup {}", backup.display())))?;
    // The owner's only, as every file dedupd makes to hold data.
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(OWNER_ONLY)
        .open(data)
        .map_err(io(format!("creating {}", data.display())))?;
    let db = redb::Builder::new()
        .set_cache_size(16 << 20)
        .create(data)
        .map_err(|e| io("creating the data file")(std::io::Error::other(e)))?;
    let mut load = Build {
        db,
        tx: None,
        pending: 0,
        keys: Vec::new(),
    };
    let report =
        verify::read(BufReader::with_capacity(1 << 20, file), &mut load).map_err(refused)?;
    let Build { db, tx, keys, .. } = load;
    let failed = |e: redb::Error| refused(VerifyError::Build(e));
    if let Some(tx) = tx {
        tx.commit().map_err(|e| failed(e.into()))?;
    }
    // A key the backup holds twice would leave a table short.
    let read = db.begin_read().map_err(|e| failed(e.into()))?;
    for (table, &said) in TABLES.iter().zip(&report.end.rows) {
        let found = table.len(&read).map_err(failed)?;
        if found != said {
            return Err(refused(VerifyError::Count {
                table: table.name(),
                said,
                found,
            }));
        }
    }
    drop(read);
    let id: u128 = rand::random();
    let elapsed = now_ms.saturating_sub(report.header.taken_at_ms);
    let fence = report
        .header
        .fence
        .saturating_add(FENCE_FLOOR)
        .saturating_add(elapsed.saturating_mul(FENCES_PER_MS));
    let mut tx = db.begin_write().map_err(|e| failed(e.into()))?;
    tx.set_durability(Durability::Immediate)
        .map_err(|e| failed(redb::Error::Corrupted(e.to_string())))?;
    {
        let mut meta = tx.open_table(META).map_err(|e| failed(e.into()))?;
        let mut set = |k: &str, v: u64| meta.insert(k, v).map(drop).map_err(|e| failed(e.into()));
        set(META_FILE_ID[0], (id >> 64) as u64)?;
        set(META_FILE_ID[1], id as u64)?;
        set(META_LOG_OPEN, 0)?;
        set(META_LOG_SEGMENTS, 2)?;
        set(META_FENCE, fence)?;
    }
    tx.commit().map_err(|e| failed(e.into()))?;
    drop(db);
    write_keys(&seal::path_for(data), id, &keys)?;
    Ok((report, id, fence))
}

/// Writes the key file of data file `id`: `keys` in their slots, fresh
/// random keys in the others (opening it shreds those again).
fn write_keys(path: &Path, id: u128, keys: &[(u64, [u8; KEY_LEN])]) -> Result<(), RestoreError> {
    let slots = keys.last().map_or(0, |(s, _)| s + 1);
    let len = usize::try_from(slots)
        .ok()
        .and_then(|s| s.checked_mul(KEY_LEN))
        .ok_or_else(|| io("writing the key file")(std::io::Error::other("too many key slots")))?;
    let mut bytes = vec![0u8; len];
    rand::fill(&mut bytes[..]);
    for (slot, key) in keys {
        let at = *slot as usize * KEY_LEN;
        bytes[at..at + KEY_LEN].copy_from_slice(key);
    }
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(OWNER_ONLY)
        .open(path)
        .map_err(io(format!("creating {}", path.display())))?;
    file.write_all(&seal::header(id))
        .and_then(|()| file.write_all(&bytes))
        .and_then(|()| file.sync_all())
        .map_err(io(format!("writing {}", path.display())))
}

/// Rows loaded into the data file being built, keys kept for its key file.
struct Build {
    db: redb::Database,
    tx: Option<WriteTransaction>,
    /// Bytes of rows in the open transaction.
    pending: usize,
    keys: Vec<(u64, [u8; KEY_LEN])>,
}

impl Load for Build {
    fn rows(&mut self, table: usize, rows: &[(&[u8], &[u8])]) -> Result<(), VerifyError> {
        let tx = match self.tx.take() {
            Some(tx) => tx,
            None => {
                let mut tx = self
                    .db
                    .begin_write()
                    .map_err(|e| VerifyError::Build(e.into()))?;
                tx.set_durability(Durability::None)
                    .map_err(|e| VerifyError::Build(redb::Error::Corrupted(e.to_string())))?;
                tx
            }
        };
        TABLES[table]
            .insert(&tx, rows)
            .map_err(VerifyError::Build)?;
        self.pending += rows.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
        if self.pending >= TRANSACTION_BYTES {
            tx.commit().map_err(|e| VerifyError::Build(e.into()))?;
            self.pending = 0;
        } else {
            self.tx = Some(tx);
        }
        Ok(())
    }

    fn keys(&mut self, keys: &[(u64, &[u8])]) -> Result<(), VerifyError> {
        for (slot, key) in keys {
            let mut k = [0u8; KEY_LEN];
            k.copy_from_slice(key);
            self.keys.push((*slot, k));
        }
        Ok(())
    }
}

/// `now_ms` as a file name's part: `20270115T081500Z`.
fn stamp(now_ms: u64) -> String {
    let at = time::OffsetDateTime::from_unix_timestamp(i64::try_from(now_ms / 1000).unwrap_or(0))
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    at.format(time::macros::format_description!(
        "[year][month][day]T[hour][minute][second]Z"
    ))
    .unwrap_or_else(|_| now_ms.to_string())
}

/// Gives `files` the owner and group of `dir` (a restore run as root into
/// a service's state directory leaves files the service could not open);
/// why not, if it could not.
fn give_to_owner_of(dir: &Path, files: &[PathBuf]) -> Option<String> {
    let owner = std::fs::metadata(dir).ok()?;
    for f in files {
        let Ok(m) = std::fs::metadata(f) else {
            continue;
        };
        if (m.uid(), m.gid()) != (owner.uid(), owner.gid())
            && let Err(e) = std::os::unix::fs::chown(f, Some(owner.uid()), Some(owner.gid()))
        {
            return Some(format!(
                "{} could not be given to the owner of {} (uid {}, gid {}): {e}; chown the \
                 restored files to the user dedupd runs as",
                f.display(),
                dir.display(),
                owner.uid(),
                owner.gid()
            ));
        }
    }
    None
}
