//! `dedupd backup`, `dedupd verify` and `dedupd restore` (see
//! `dedupd::store::redb::backup` for what a backup is).
//!
//! - `backup --to FILE`: through the running server (`POST /v1/backup`,
//!   a full API token), or with `--offline` from the data file of a
//!   stopped instance. The bytes go to `FILE.partial`, which is checked
//!   whole (as `verify` does), synced, and only then renamed to `FILE`: a
//!   file at `FILE` is always a whole backup. The run holds `FILE.partial`
//!   locked from its making to its end: a second run to the same `FILE`
//!   meanwhile is refused before it asks for anything, and never removes
//!   the first's.
//! - `verify FILE`: a backup, or a stopped data file, checked without
//!   changing anything.
//! - `restore FILE`: the backup put in place of the configured data file,
//!   with the instance stopped.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use dedupd::config::CONFIG_ENV;
use dedupd::store::redb::backup::format::MAGIC;
use dedupd::store::redb::backup::restore::{self, RestoreOptions};
use dedupd::store::redb::backup::verify::{self, BackupReport, DataFileReport};
use dedupd::store::redb::{CommitMetrics, RedbOptions, RedbStore, SCHEMA_VERSION};

use super::client::{Client, ServerArgs};
use super::out::outln;
use super::table::{now_ms, rfc3339_ms};

/// `dedupd backup`.
#[derive(Debug, clap::Args)]
pub struct BackupArgs {
    /// Where the backup goes: written to FILE.partial beside it, checked,
    /// synced, then renamed to FILE (replacing one there).
    #[arg(long, value_name = "FILE")]
    to: PathBuf,
    /// Back up the data file (the config's data_path) directly, with the
    /// instance stopped, instead of through the running server.
    #[arg(long)]
    offline: bool,
    #[command(flatten)]
    server: ServerArgs,
}

/// `dedupd verify`.
#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    /// A backup, or a stopped instance's data file (dedupd.redb; its log
    /// and key file are read beside it).
    file: PathBuf,
}

/// `dedupd restore`.
#[derive(Debug, clap::Args)]
pub struct RestoreArgs {
    /// The backup to restore.
    file: PathBuf,
    /// TOML settings file: the backup goes to its data_path (default:
    /// none, or $DEDUPD_CONFIG).
    #[arg(long, env = CONFIG_ENV)]
    config: Option<PathBuf>,
    /// Rename the files already there (the data file, its log and key
    /// file) aside to NAME.before-restore-TIME instead of refusing.
    #[arg(long)]
    replace: bool,
}

/// How long a backup through the server may take, whole. Each chunk of it
/// must come within [`dedupd::store::redb::backup::STALL`].
const WHOLE: Duration = Duration::from_secs(24 * 3600);

/// Runs `dedupd backup`.
pub fn backup(args: &BackupArgs) -> anyhow::Result<ExitCode> {
    verify::quiet_panics();
    check_target(&args.to)?;
    // Refused here, nothing is removed: the file there may be another
    // run's, which goes on.
    let partial = Partial::take(&partial_of(&args.to), &args.to)?;
    let started = Instant::now();
    let taken = super::runtime()?.block_on(async {
        if args.offline {
            offline(args, &partial).await
        } else {
            through_server(args, &partial).await
        }
    });
    let report = taken.and_then(|()| {
        let report = verify::verify_backup(&partial.path).with_context(|| {
            format!(
                "the backup written to {} does not verify",
                partial.path.display()
            )
        })?;
        keep(&partial.path, &args.to)?;
        Ok(report)
    });
    let report = match report {
        Ok(r) => r,
        Err(e) => {
            partial.remove();
            return Err(e.context(format!("no backup was written to {}", args.to.display())));
        }
    };
    outln!(
        "wrote {}: {} bytes in {:.1}s",
        args.to.display(),
        report.bytes,
        started.elapsed().as_secs_f64()
    )?;
    print_backup(&report)?;
    Ok(ExitCode::SUCCESS)
}

/// Refuses, before anything is taken, a target the backup's rename would
/// lose something to (see [`replaceable`]), a directory, or one that does
/// not exist, rather than after the whole backup was taken. (`FILE.partial`
/// is [`Partial::take`]'s.)
fn check_target(to: &Path) -> anyhow::Result<()> {
    let dir = to
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !dir.is_dir() {
        bail!(
            "{} is not a directory: nothing was backed up to {}",
            dir.display(),
            to.display()
        );
    }
    replaceable(to, "a backup")
}

/// Refuses a `path` that is not `what` the backup may replace: a file
/// that is not a backup. The serving instance's data file, log or key
/// file (its inode kept open by the server, which would go on
/// acknowledging writes into a file no longer there), another instance's,
/// a device, a socket, a pipe, a directory, or anything else. An empty
/// file (`mktemp`'s) may be replaced; a link is replaced, never followed.
fn replaceable(path: &Path, what: &str) -> anyhow::Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("cannot look at {}", path.display())),
        Ok(meta) => meta,
    };
    if meta.is_dir() {
        bail!(
            "{} is a directory: name the backup's file (such as {})",
            path.display(),
            path.join("dedupd.backup").display()
        );
    }
    // A link is replaced, never followed.
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    if !meta.is_file() {
        bail!(
            "{} is there and is not a regular file (a device, a socket or a pipe): a backup \
             replaces only {what}. Name another file",
            path.display()
        );
    }
    if meta.len() == 0 {
        return Ok(());
    }
    let mut start = [0u8; MAGIC.len()];
    let read = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut start));
    if read.is_err() || start != *MAGIC {
        bail!(
            "{} is there and is not a dedupd backup (a data file, its log or key file, or \
             another file): a backup replaces only {what}. Name another file, or move that one \
             away first",
            path.display()
        );
    }
    Ok(())
}

/// `FILE.partial`.
fn partial_of(to: &Path) -> PathBuf {
    let mut p = to.as_os_str().to_owned();
    p.push(".partial");
    PathBuf::from(p)
}

/// The `FILE.partial` this run made for the backup's bytes: the owner's
/// only (it holds every event and the keys that open them), and held
/// under an exclusive lock (`flock`) until the run ends, which other runs
/// look for before they replace one. Removed on failure only while the
/// path still names it.
struct Partial {
    path: PathBuf,
    /// The file made, locked (the lock lasts while a descriptor of it is
    /// open: this one outlives the writer's).
    file: std::fs::File,
}

impl Partial {
    /// Makes `path` (the partial copy of a backup to `to`) anew. One a
    /// running backup holds is refused, and left as it is; one left by a
    /// backup that died (a backup's unfinished copy, or empty) is replaced,
    /// as is a link there (another user's, in a shared directory), never
    /// followed: the file is made new (`O_EXCL`), so root's backup never
    /// truncates the file a link points to.
    fn take(path: &Path, to: &Path) -> anyhow::Result<Self> {
        let busy = || {
            anyhow!(
                "{} is being written by another `dedupd backup --to {}`, running now: wait for \
                 it to finish, or back up to another file; this one took nothing and changed \
                 nothing",
                path.display(),
                to.display()
            )
        };
        // Held, if there, while it is looked at and removed: no other run
        // takes it meanwhile.
        let _old = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(
                (rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK).bits() as i32,
            )
            .open(path)
        {
            Ok(old) => {
                if held_elsewhere(&old) {
                    return Err(busy());
                }
                Some(old)
            }
            // Nothing there, a link, or something that does not open (a
            // socket): `replaceable` says which.
            Err(_) => None,
        };
        replaceable(path, "a backup's unfinished copy")?;
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("cannot replace {}", path.display()));
            }
            _ => {}
        }
        let file = match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
        {
            Ok(file) => file,
            // Another run made it since it was removed.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Err(busy()),
            Err(e) => {
                return Err(e).with_context(|| format!("cannot create {}", path.display()));
            }
        };
        let partial = Self {
            path: path.to_owned(),
            file,
        };
        // Another run may have taken it before it was locked: then it
        // has removed it, or holds it.
        if held_elsewhere(&partial.file) || !partial.is_there() {
            return Err(busy());
        }
        Ok(partial)
    }

    /// Whether its path still names the file made.
    fn is_there(&self) -> bool {
        use std::os::unix::fs::MetadataExt as _;
        match (self.file.metadata(), std::fs::symlink_metadata(&self.path)) {
            (Ok(made), Ok(there)) => (made.dev(), made.ino()) == (there.dev(), there.ino()),
            _ => false,
        }
    }

    /// A writer of the file, through [`Paced`] and a buffer of 1 MiB.
    fn writer(&self) -> anyhow::Result<std::io::BufWriter<Paced>> {
        let file = self
            .file
            .try_clone()
            .with_context(|| format!("cannot write {}", self.path.display()))?;
        Ok(std::io::BufWriter::with_capacity(
            1 << 20,
            Paced { file, unsynced: 0 },
        ))
    }

    /// Removes it, if its path still names it.
    fn remove(self) {
        if self.is_there() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Takes the exclusive lock of `file` without waiting; whether another
/// run holds it. (A filesystem that cannot lock leaves it unlocked: the
/// backup goes on as it did before runs looked for one another.)
fn held_elsewhere(file: &std::fs::File) -> bool {
    rustix::fs::flock(file, rustix::fs::FlockOperation::NonBlockingLockExclusive)
        == Err(rustix::io::Errno::WOULDBLOCK)
}

/// Bytes of a backup written before they are synced, and more written.
const PACE: usize = 4 << 20;

/// The backup's bytes sent to the disk [`PACE`] at a time: the page cache
/// never holds more than that of them. A backup of a gigabyte synced once
/// at its end filled the disk's queue for half a second, and every write
/// the server acknowledges (its log's sync) waited behind it: 263 ms, and
/// 28 ms at most with this (`cargo bench --bench backup`).
struct Paced {
    file: std::fs::File,
    unsynced: usize,
}

impl Write for Paced {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.file.write(buf)?;
        self.unsynced += n;
        if self.unsynced >= PACE {
            self.file.sync_data()?;
            self.unsynced = 0;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

/// Flushes and syncs what [`Partial::writer`] wrote.
fn finish(file: std::io::BufWriter<Paced>, partial: &Path) -> anyhow::Result<()> {
    file.into_inner()
        .map_err(|e| e.into_error())
        .and_then(|p| p.file.sync_all())
        .with_context(|| format!("writing {}", partial.display()))
}

/// Takes the backup through the running server into `partial`.
async fn through_server(args: &BackupArgs, partial: &Partial) -> anyhow::Result<()> {
    let loaded = if args.server.needs_config() {
        Some(args.server.load()?)
    } else {
        None
    };
    let client = args.server.client(loaded.as_ref())?;
    fetch(&client, dedupd::store::redb::backup::STALL, partial).await
}

/// Takes the backup from `client`'s server into `partial`; the server
/// must answer, and then send each chunk, within `stall`. A server that
/// takes the request and never answers (stopped, wedged) fails the
/// backup then, not after [`WHOLE`].
async fn fetch(client: &Client, stall: Duration, partial: &Partial) -> anyhow::Result<()> {
    let req = client.request(reqwest::Method::POST, client.url(&["v1", "backup"]));
    let mut res = tokio::time::timeout(stall, client.stream(req, WHOLE))
        .await
        .map_err(|_| anyhow!("the server did not answer for {}s", stall.as_secs_f32()))
        .and_then(|answer| answer)
        .context("the backup")?;
    let mut file = partial.writer()?;
    loop {
        let chunk = tokio::time::timeout(stall, res.chunk())
            .await
            .map_err(|_| anyhow!("the server sent nothing for {}s", stall.as_secs_f32()))?
            .map_err(|e| {
                anyhow!(
                    "the backup stopped midway ({}): the server's log says why",
                    e.without_url()
                )
            })?;
        let Some(chunk) = chunk else { break };
        file.write_all(&chunk)
            .with_context(|| format!("writing {}", partial.path.display()))?;
    }
    finish(file, &partial.path)
}

/// Takes the backup from the data file itself, the instance stopped.
async fn offline(args: &BackupArgs, partial: &Partial) -> anyhow::Result<()> {
    let loaded = args.server.load()?;
    let opts = RedbOptions::from_settings(&loaded.settings, CommitMetrics::default());
    let path = opts.path.clone();
    // Opening a path with nothing there would make a new, empty instance
    // and back that up.
    if !path.is_file() {
        bail!(
            "there is no data file at {} (the config's data_path): --offline backs up the data \
             file of a stopped instance",
            path.display()
        );
    }
    // Opening a file of an older schema would migrate it in place: the
    // backup taken before an upgrade would be of the new schema, and the
    // old release could read neither it nor the file.
    let schema = match verify::data_file_schema(&path) {
        Ok(schema) => schema,
        Err(verify::VerifyError::InUse) => bail!(
            "{} is open in a running dedupd: leave out --offline to back up a running instance \
             through its server",
            path.display()
        ),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    if schema < SCHEMA_VERSION {
        bail!(
            "{} is of schema {schema}, written by an older release, and this build would migrate \
             it to {SCHEMA_VERSION} as it opened it (the old release could then read neither it \
             nor its backup): back it up with the release that wrote it (its `dedupd backup \
             --offline`, or a copy of the stopped instance's files), then upgrade",
            path.display()
        );
    }
    let store = tokio::task::spawn_blocking(move || RedbStore::open(&opts))
        .await?
        .with_context(|| {
            format!(
                "cannot open {} (leave out --offline to back up a running instance through its \
                 server)",
                path.display()
            )
        })?;
    let file = partial.writer()?;
    let written = store.backups().write_to(now_ms(), file).await;
    store.close().await;
    let (file, _) = written?;
    finish(file, &partial.path)
}

/// Renames the checked `partial` to `to`, durably.
fn keep(partial: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::rename(partial, to)
        .with_context(|| format!("renaming {} to {}", partial.display(), to.display()))?;
    let dir = to
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("syncing {}", dir.display()))
}

/// What a backup holds, for people.
fn print_backup(r: &BackupReport) -> anyhow::Result<()> {
    let h = &r.header;
    outln!(
        "  taken at {} from data file {} (schema {}, write-ahead-log batch {}, last fence {}), by {}",
        rfc3339_ms(h.taken_at_ms),
        h.data_file,
        h.schema,
        h.batch,
        h.fence,
        h.written_by
    )?;
    outln!(
        "  {} claims, {} applied events, {} stream heads, {} gateway events ({} sealed, each \
         opened with its key), {} dedupe records, {} bulk jobs, {} keyspace keys",
        r.rows("claim_rows"),
        r.rows("applied_events"),
        r.rows("stream_heads"),
        r.rows("inbox_events"),
        r.sealed,
        r.rows("inbox_dedupe"),
        r.rows("inbox_jobs"),
        r.rows("kv_rows"),
    )?;
    outln!("  SHA-256 {}", r.end.sha256)?;
    Ok(())
}

/// Runs `dedupd verify`.
pub fn verify(args: &VerifyArgs) -> anyhow::Result<ExitCode> {
    verify::quiet_panics();
    let mut magic = [0u8; 8];
    let n = std::fs::File::open(&args.file)
        .and_then(|mut f| std::io::Read::read(&mut f, &mut magic))
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    if n == 8 && &magic == MAGIC {
        let report = verify::verify_backup(&args.file)
            .with_context(|| format!("backup {} does not verify", args.file.display()))?;
        outln!(
            "{}: a whole dedupd backup, {} bytes, every checksum intact",
            args.file.display(),
            report.bytes
        )?;
        print_backup(&report)?;
    } else if magic.starts_with(b"redb") {
        let report = verify::verify_data_file(&args.file)
            .with_context(|| format!("data file {} does not verify", args.file.display()))?;
        print_data_file(&args.file, &report)?;
    } else {
        bail!(
            "{} is neither a dedupd backup nor a data file",
            args.file.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// What a data file holds, for people.
fn print_data_file(path: &Path, r: &DataFileReport) -> anyhow::Result<()> {
    outln!(
        "{}: a dedupd data file of schema {} (id {:032x}), {}",
        path.display(),
        r.schema,
        r.id,
        if r.closed_cleanly {
            "closed cleanly".to_owned()
        } else {
            format!(
                "not closed cleanly: its log is bound to it, intact, and holds {} batches to replay",
                r.to_replay
            )
        }
    )?;
    let tables: Vec<String> = r.tables.iter().map(|(t, n)| format!("{t} {n}")).collect();
    outln!("  rows: {}", tables.join(", "))?;
    outln!(
        "  {} sealed events and {} bulk jobs' sealed records opened with their keys",
        r.sealed,
        r.sealed_jobs
    )?;
    for note in &r.notes {
        outln!("  note: {note}")?;
    }
    Ok(())
}

/// Runs `dedupd restore`.
pub fn restore(args: &RestoreArgs) -> anyhow::Result<ExitCode> {
    verify::quiet_panics();
    let loaded = dedupd::config::Settings::load_for_operator(args.config.as_deref())
        .map_err(|e| anyhow!("{e}\n(the data file to restore to is the config's data_path)"))?;
    let data = loaded.settings.data_path.clone();
    let restored = super::runtime()?.block_on(restore::restore(RestoreOptions {
        backup: args.file.clone(),
        data: data.clone(),
        replace: args.replace,
        now_ms: now_ms(),
        keep_free: loaded.settings.storage.min_free_bytes,
    }))?;
    outln!("restored {} to {}", args.file.display(), data.display())?;
    print_backup(&restored.report)?;
    outln!(
        "  a new data file: id {:032x}, closed cleanly, an empty log; fences go on after {}",
        restored.id,
        restored.fence
    )?;
    for old in &restored.moved_aside {
        outln!("  the file that was there is now {}", old.display())?;
    }
    if let Some(w) = &restored.owner_warning {
        eprintln!("dedupd: warning: {w}");
    }
    for dir in &restored.left_behind {
        eprintln!(
            "dedupd: note: {} was left by a restore that did not finish (killed): it holds a \
             partly built copy of a backup; remove it (rm -r) unless another restore is running",
            dir.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that takes the backup's request and never answers (a
    /// stopped or wedged one) fails the backup once the stall passes; the
    /// 24 h bound of the whole exchange kept `dedupd backup` (and the
    /// nightly unit) waiting a day.
    #[tokio::test(start_paused = true)]
    async fn a_server_that_never_answers_fails_the_backup_after_the_stall() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        // Accepted and held: the request is read by no one.
        let _held = std::thread::spawn(move || listener.accept().map(|(conn, _)| conn));
        let dir = tempfile::TempDir::new().expect("dir");
        let to = dir.path().join("b.backup");
        let partial = Partial::take(&dir.path().join("b.backup.partial"), &to).expect("partial");
        let client = ServerArgs {
            config: None,
            url: Some(format!("http://127.0.0.1:{port}")),
            token: Some("t".into()),
        }
        .client(None)
        .expect("client");
        // The clock is tokio's, moved on whenever the test only waits.
        let within = Duration::from_secs(3600);
        let err = tokio::time::timeout(within, fetch(&client, Duration::from_secs(60), &partial))
            .await
            .expect("the backup still waited an hour on")
            .expect_err("a server that never answers");
        assert!(
            format!("{err:#}").contains("the server did not answer for 60s"),
            "{err:#}"
        );
    }
}
