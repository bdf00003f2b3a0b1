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
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use redb::{Durability, ReadableDatabase, TableHandle, WriteTransaction};
use rustix::fs::{AtFlags, FileType, Gid, Mode, OFlags, RenameFlags, Uid};

use super::raw::{TABLES, index_of};
use super::verify::{self, BackupReport, Load, MAX_KEY_SLOTS, VerifyError};
use crate::store::redb::seal::{self, KEY_LEN};
use crate::store::redb::tables::{
    INBOX_JOBS, JobValue, META, META_FENCE, META_FILE_ID, META_LOG_OPEN, META_LOG_SEGMENTS,
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
    /// Bytes that must stay free on the target's disk once the files are
    /// written: the server's watermark (`storage.min_free_bytes`), below
    /// which the restored instance would refuse every write.
    pub keep_free: u64,
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
    /// Build directories restores that did not finish (killed) left in
    /// the target's directory: not removed (one may be another restore's,
    /// running), named so they can be.
    pub left_behind: Vec<PathBuf>,
}

/// Why a backup was not restored. Nothing at the target changed unless
/// the error says so.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// The backup does not pass its checks. (The causes here are in the
    /// messages, not error sources: a chain printed whole would say each
    /// twice.)
    #[error("backup {path}: {cause}; nothing was restored")]
    Backup { path: PathBuf, cause: VerifyError },
    /// A server has the target open.
    #[error(
        "data file {0} is open in a running dedupd: stop it first (systemctl stop dedupd); \
         nothing was restored"
    )]
    InUse(PathBuf),
    /// The target is there and is not a file.
    #[error(
        "data file {0} is there and is not a plain file (a directory, a FIFO or a device): \
         data_path must name a file; nothing was restored"
    )]
    NotAFile(PathBuf),
    /// The data file, its key file or a log segment is a symbolic link.
    #[error(
        "{0} is a symbolic link: a restore puts the data file, its log and its key file in \
         place by renaming, which would replace the link, not the file it points to (the \
         restored file would be on the link's disk); set data_path to the file itself, with \
         its .wal, .wal2 and .keys beside it, and restore again; nothing was restored"
    )]
    Link(PathBuf),
    /// Files are at the target and replacing them was not asked for.
    #[error(
        "{} already there: pass --replace to rename them aside (to NAME.before-restore-TIME) \
         and restore, or move them away; nothing was restored",
        .0.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
    )]
    Exists(Vec<PathBuf>),
    /// The key file would not fit on the target's disk with the server's
    /// watermark left free.
    #[error(
        "{} has {free} bytes free once the restored data file is built, and {} are needed: \
         {key_file} for its key file{} and storage.min_free_bytes ({keep_free}), which the \
         server keeps free or refuses every write; free space there, or lower \
         storage.min_free_bytes in the config; nothing was restored",
        .dir.display(),
        .key_file.saturating_add(*.keep_free),
        .highest_slot.map(|s| format!(" (its highest key slot is {s})")).unwrap_or_default()
    )]
    NoRoom {
        /// The target's directory.
        dir: PathBuf,
        /// Bytes free there.
        free: u64,
        /// Bytes of the key file.
        key_file: u64,
        /// The highest key slot it holds, if any.
        highest_slot: Option<u64>,
        /// Bytes to leave free ([`RestoreOptions::keep_free`]).
        keep_free: u64,
    },
    /// The files built from the backup do not open as a data file.
    #[error("the data file built from the backup does not open: {0}; nothing was restored")]
    Open(OpenError),
    /// Reading, writing or renaming a file failed.
    #[error("{what}: {cause}")]
    Io {
        /// What was being done, and whether anything changed.
        what: String,
        cause: std::io::Error,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RestoreError {
    let what = what.into();
    move |cause| RestoreError::Io { what, cause }
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
    let left_behind = stages_in(&dir);
    let stage = Stage::new(&dir, &data)?;
    let staged = stage.data.clone();
    let backup = opts.backup.clone();
    let now = opts.now_ms;
    let room = Room {
        dir: dir.clone(),
        stage: stage.dir.clone(),
        keep_free: opts.keep_free,
    };
    let (report, id, fence) =
        tokio::task::spawn_blocking(move || build(&backup, &staged, now, &room))
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
    let target = rustix::fs::open(
        &dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io(format!("opening {}", dir.display()))(e.into()))?;
    let owner_warning = stage.give_to(&target);
    let moved_aside = place(&stage, &target, &data, opts.now_ms)?;
    rustix::fs::fsync(&target).map_err(|e| io(format!("syncing {}", dir.display()))(e.into()))?;
    drop(stage);
    Ok(Restored {
        report,
        id,
        fence,
        moved_aside,
        owner_warning,
        left_behind,
    })
}

/// The build directories ([`Stage`]) in `dir`.
fn stages_in(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(".dedupd-restore-")
        })
        .map(|e| e.path())
        .collect();
    found.sort();
    found
}

/// The name of `path` in its directory.
fn name_of(path: &Path) -> std::ffi::OsString {
    path.file_name().unwrap_or_default().to_owned()
}

/// Renames the files at the target (`data`, in the directory `target`)
/// aside, each to a name no file has (`NAME.before-restore-TIME`, then
/// `-2`, `-3` …), and the staged ones into place, the data file last; the
/// names the old files went to. A rename that fails undoes those before
/// it, so the target is as it was.
fn place(
    stage: &Stage,
    target: &OwnedFd,
    data: &Path,
    now_ms: u64,
) -> Result<Vec<PathBuf>, RestoreError> {
    let dir = data.parent().unwrap_or(Path::new("."));
    let stamp = stamp(now_ms);
    // (from, from's name, to, to's name), to undo in reverse.
    let mut done: Vec<(&OwnedFd, std::ffi::OsString, &OwnedFd, std::ffi::OsString)> = Vec::new();
    let undo = |done: &mut Vec<(&OwnedFd, std::ffi::OsString, &OwnedFd, std::ffi::OsString)>| {
        let mut failed = Vec::new();
        while let Some((from, from_name, to, to_name)) = done.pop() {
            if rustix::fs::renameat_with(to, &to_name, from, &from_name, RenameFlags::NOREPLACE)
                .is_err()
            {
                failed.push(dir.join(&to_name).display().to_string());
            }
        }
        failed
    };
    let failure = |what: String, e: rustix::io::Errno, failed: Vec<String>| {
        let left = if failed.is_empty() {
            "; the files there were left as they were".to_owned()
        } else {
            format!(
                "; these could not be put back and are where they were renamed to: {}",
                failed.join(", ")
            )
        };
        RestoreError::Io {
            what: format!("{what}{left}"),
            cause: e.into(),
        }
    };
    let mut moved_aside = Vec::new();
    for old in files_of(data) {
        let name = name_of(&old);
        match rustix::fs::statat(target, &name, AtFlags::SYMLINK_NOFOLLOW) {
            // Empty files are left to be replaced, as when nothing is there.
            Ok(st)
                if st.st_size > 0
                    || FileType::from_raw_mode(st.st_mode) != FileType::RegularFile => {}
            Ok(_) => continue,
            Err(rustix::io::Errno::NOENT) => continue,
            Err(e) => {
                let failed = undo(&mut done);
                return Err(failure(format!("looking at {}", old.display()), e, failed));
            }
        }
        let mut n = 1;
        loop {
            let mut aside = name.clone();
            aside.push(format!(".before-restore-{stamp}"));
            if n > 1 {
                aside.push(format!("-{n}"));
            }
            match rustix::fs::renameat_with(target, &name, target, &aside, RenameFlags::NOREPLACE) {
                Ok(()) => {
                    moved_aside.push(dir.join(&aside));
                    done.push((target, name.clone(), target, aside));
                    break;
                }
                Err(rustix::io::Errno::EXIST) if n < 1000 => n += 1,
                Err(e) => {
                    let failed = undo(&mut done);
                    return Err(failure(
                        format!("renaming {} aside", old.display()),
                        e,
                        failed,
                    ));
                }
            }
        }
    }
    for old in files_of(data) {
        let name = name_of(&old);
        match rustix::fs::statat(&stage.fd, &name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(_) => {}
            Err(rustix::io::Errno::NOENT) => continue,
            Err(e) => {
                let failed = undo(&mut done);
                return Err(failure(
                    format!("looking at the staged {}", old.display()),
                    e,
                    failed,
                ));
            }
        }
        if let Err(e) = rustix::fs::renameat(&stage.fd, &name, target, &name) {
            let failed = undo(&mut done);
            return Err(failure(
                format!("moving {} into place", old.display()),
                e,
                failed,
            ));
        }
        done.push((&stage.fd, name.clone(), target, name));
    }
    Ok(moved_aside)
}

/// Refuses when a server has `data` open, or when it is not a file (a
/// FIFO would hang the open below until something wrote to it), or when
/// it or one of its files is a link.
fn in_use(data: &Path) -> Result<(), RestoreError> {
    // The key file and the log's segments are renamed aside as the data
    // file is: a key file linked to a volume of secrets would be replaced
    // by one on the data's disk.
    if let Some(link) = files_of(data)
        .into_iter()
        .find(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink()))
    {
        return Err(RestoreError::Link(link));
    }
    match std::fs::metadata(data) {
        Err(_) => return Ok(()),
        Ok(meta) if !meta.is_file() => return Err(RestoreError::NotAFile(data.to_owned())),
        Ok(_) => {}
    }
    match redb::ReadOnlyDatabase::open(data) {
        Err(redb::DatabaseError::DatabaseAlreadyOpen) => Err(RestoreError::InUse(data.to_owned())),
        // Not in use: damaged or not a data file at all is no reason not
        // to restore over it.
        _ => Ok(()),
    }
}

/// A directory beside the target the files are built in, the owner's
/// alone, reached through the descriptor it was opened as (its path in the
/// target's directory, whose owner may rename it, is never followed
/// again); removed with whatever is left in it when dropped.
struct Stage {
    dir: PathBuf,
    fd: OwnedFd,
    /// The data file in it, as a path through `fd`.
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
        let opened = rustix::fs::open(
            &stage,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io(format!("opening {}", stage.display()))(e.into()));
        let fd = match opened.and_then(|fd| {
            let st = rustix::fs::fstat(&fd).map_err(|e| io("looking at it")(e.into()))?;
            if st.st_uid != rustix::process::geteuid().as_raw() || st.st_mode & 0o077 != 0 {
                return Err(io(format!(
                    "{} was replaced while it was made",
                    stage.display()
                ))(std::io::Error::other(
                    "not this user's own directory",
                )));
            }
            Ok(fd)
        }) {
            Ok(fd) => fd,
            Err(e) => {
                let _ = std::fs::remove_dir(&stage);
                return Err(e);
            }
        };
        let through = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        if !through.is_dir() {
            return Err(io("restoring")(std::io::Error::other(
                "/proc is not mounted: restore needs /proc/self/fd",
            )));
        }
        Ok(Self {
            data: through.join(name),
            fd,
            dir: stage,
        })
    }

    /// Gives every file in it the owner and group of the directory
    /// `target` (a restore run as root into a service's state directory
    /// leaves files the service could not open), each through a
    /// descriptor opened without following a link; why not, if it could
    /// not.
    fn give_to(&self, target: &OwnedFd) -> Option<String> {
        let owner = match rustix::fs::fstat(target) {
            Ok(st) => st,
            Err(e) => return Some(format!("the target's owner is unknown: {e}")),
        };
        let names = files_of(Path::new(&self.data));
        for path in names {
            let name = name_of(&path);
            let fd = match rustix::fs::openat(
                &self.fd,
                &name,
                OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
                Mode::empty(),
            ) {
                Ok(fd) => fd,
                Err(rustix::io::Errno::NOENT) => continue,
                Err(e) => return Some(format!("{}: {e}", name.to_string_lossy())),
            };
            let Ok(st) = rustix::fs::fstat(&fd) else {
                continue;
            };
            if (st.st_uid, st.st_gid) == (owner.st_uid, owner.st_gid) {
                continue;
            }
            if let Err(e) = rustix::fs::fchown(
                &fd,
                Some(Uid::from_raw(owner.st_uid)),
                Some(Gid::from_raw(owner.st_gid)),
            ) {
                return Some(format!(
                    "{} could not be given to the owner of its directory (uid {}, gid {}): {e}; \
                     chown the restored files to the user dedupd runs as",
                    name.to_string_lossy(),
                    owner.st_uid,
                    owner.st_gid
                ));
            }
        }
        None
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        // Its files through the descriptor, then the directory if it is
        // still the one made (empty, so a removal elsewhere fails).
        for path in files_of(Path::new(&self.data)) {
            let _ = rustix::fs::unlinkat(&self.fd, name_of(&path), AtFlags::empty());
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Where the files are built, as messages name it.
struct Room {
    /// The target's directory.
    dir: PathBuf,
    /// The build directory in it, by its path ([`Stage::dir`]): the files
    /// are built through `/proc/self/fd`, a path that says nothing to the
    /// reader of a message.
    stage: PathBuf,
    /// [`RestoreOptions::keep_free`].
    keep_free: u64,
}

impl Room {
    /// The file `built` (a path through `/proc/self/fd`) by its path.
    fn shown(&self, built: &Path) -> String {
        self.stage.join(name_of(built)).display().to_string()
    }
}

/// Builds the data file `data` and its key file from the backup at
/// `backup`; returns the backup's report, the new file's id and its last
/// fence.
fn build(
    backup: &Path,
    data: &Path,
    now_ms: u64,
    room: &Room,
) -> Result<(BackupReport, u128, u64), RestoreError> {
    let refused = |source: VerifyError| RestoreError::Backup {
        path: backup.to_owned(),
        cause: source,
    };
    let file = File::open(backup).map_err(io(format!("opening backup {}", backup.display())))?;
    // The owner's only, as every file dedupd makes to hold data.
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(OWNER_ONLY)
        .open(data)
        .map_err(io(format!(
            "creating {}; nothing was restored",
            room.shown(data)
        )))?;
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
    write_keys(&seal::path_for(data), id, &keys, room)?;
    Ok((report, id, fence))
}

/// Writes the key file of data file `id`: `keys` in their slots, fresh
/// random keys in the others (opening it shreds those again), a MiB at a
/// time. A backup names its slots (a seal is bound to its slot), so the
/// key file is as long as its highest slot: one that would not leave the
/// server's watermark free on the target's disk ([`Room`]) is refused
/// before a byte is written. (The server needs no more than that to
/// start: its log starts empty and grows by what is free above the
/// watermark.)
fn write_keys(
    path: &Path,
    id: u128,
    keys: &[(u64, [u8; KEY_LEN])],
    room: &Room,
) -> Result<(), RestoreError> {
    // Every slot below MAX_KEY_SLOTS (`verify` and `seal_jobs` see to
    // it): neither overflows.
    let too_many = || {
        io("writing the key file; nothing was restored")(std::io::Error::other(
            "too many key slots",
        ))
    };
    let slots = match keys.last() {
        None => 0,
        Some((s, _)) => s.checked_add(1).ok_or_else(too_many)?,
    };
    let len = slots
        .checked_mul(KEY_LEN as u64)
        .and_then(|l| l.checked_add(seal::HEADER))
        .ok_or_else(too_many)?;
    // On the target's filesystem (the build directory is in it).
    let stage = path.parent().unwrap_or(Path::new("."));
    let free = rustix::fs::statvfs(stage)
        .map(|st| st.f_bavail.saturating_mul(st.f_frsize))
        .map_err(|e| {
            io(format!(
                "looking at the space left in {}",
                room.dir.display()
            ))(e.into())
        })?;
    // The data file is built already.
    if len.saturating_add(room.keep_free) > free {
        return Err(RestoreError::NoRoom {
            dir: room.dir.clone(),
            free,
            key_file: len,
            highest_slot: keys.last().map(|(s, _)| *s),
            keep_free: room.keep_free,
        });
    }
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(OWNER_ONLY)
        .open(path)
        .map_err(io(format!(
            "creating {}; nothing was restored",
            room.shown(path)
        )))?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    let written = (|| -> std::io::Result<()> {
        out.write_all(&seal::header(id))?;
        let mut next = keys.iter().peekable();
        let mut fresh = [0u8; KEY_LEN];
        for slot in 0..slots {
            match next.peek() {
                Some((s, key)) if *s == slot => {
                    out.write_all(key)?;
                    next.next();
                }
                _ => {
                    rand::fill(&mut fresh[..]);
                    out.write_all(&fresh)?;
                }
            }
        }
        out.into_inner().map_err(|e| e.into_error())?.sync_all()
    })();
    written.map_err(io(format!(
        "writing {}; nothing was restored",
        room.shown(path)
    )))
}

/// Rows loaded into the data file being built, keys kept for its key file.
struct Build {
    db: redb::Database,
    tx: Option<WriteTransaction>,
    /// Bytes of rows in the open transaction.
    pending: usize,
    keys: Vec<(u64, [u8; KEY_LEN])>,
}

/// A row whose value was made anew: its key, and its value's bytes.
type OwnedRow<'a> = (&'a [u8], Vec<u8>);

impl Build {
    /// Bulk jobs' rows with each record sealed again, under a slot of its
    /// own past the backup's (a backup holds a job's record opened: see
    /// `snapshot`), its fresh key kept for the key file: the restored file
    /// never holds a running erase job's filter in plain. A backup holds
    /// no sealed record (it leaves out one that does not open): one that
    /// is refused, since no key of the backup opens it.
    fn seal_jobs<'a>(
        &mut self,
        rows: &[(&'a [u8], &[u8])],
    ) -> Result<Vec<OwnedRow<'a>>, VerifyError> {
        let mut out = Vec::with_capacity(rows.len());
        for (k, v) in rows {
            let (record, cancelled) = <JobValue<'_> as redb::Value>::from_bytes(v);
            if seal::seal_header(record).is_some() {
                return Err(VerifyError::Malformed(
                    "a bulk job's record is sealed, and a backup holds no key for one".into(),
                ));
            }
            // Past the backup's slots (each below MAX_KEY_SLOTS, as
            // `verify` checked) and the jobs' before: the key file holds
            // every slot up to the last.
            let slot = match self.keys.last() {
                None => Some(0),
                Some((s, _)) => s.checked_add(1),
            }
            .filter(|s| *s < MAX_KEY_SLOTS)
            .ok_or_else(|| {
                VerifyError::Malformed(format!(
                    "its bulk jobs' records need key slots past the last a key file holds ({})",
                    MAX_KEY_SLOTS - 1
                ))
            })?;
            let key: [u8; KEY_LEN] = rand::random();
            let sealed = seal::seal_with(slot, &key, &[], record)
                .map_err(|e| VerifyError::Build(redb::Error::Io(e)))?;
            self.keys.push((slot, key));
            out.push((
                *k,
                <JobValue<'_> as redb::Value>::as_bytes(&(sealed.as_slice(), cancelled)),
            ));
        }
        Ok(out)
    }
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
        if Some(table) == index_of(INBOX_JOBS.name()) {
            let sealed = self.seal_jobs(rows)?;
            let sealed: Vec<(&[u8], &[u8])> =
                sealed.iter().map(|(k, v)| (*k, v.as_slice())).collect();
            TABLES[table]
                .insert(&tx, &sealed)
                .map_err(VerifyError::Build)?;
        } else {
            TABLES[table]
                .insert(&tx, rows)
                .map_err(VerifyError::Build)?;
        }
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
