//! `dedupd stage-credentials --from DIR --to DIR`: what the unit runs, as
//! root, before every start and every reload. It copies the root-only
//! files of `/etc/dedupd/credentials` (the API tokens, sources' secrets)
//! into the service's runtime directory, readable by its dynamic user
//! alone.
//!
//! systemd's `LoadCredential=` does the same once, at the start: its
//! copies cannot change while the service runs (systemd 252), so a
//! `systemctl reload` would read the old secrets again. Staged here
//! before each reload, a rotated secret or token takes effect at the
//! reload. The runtime directory is removed when the service stops.
//!
//! All or nothing: every file is read and checked first (a directory or
//! file another user could write, a link, something not a plain file or a
//! file over [`MAX_BYTES`] refuses the stage), the copies are written into
//! a new directory, and that directory takes the old one's place in one
//! `renameat2(RENAME_EXCHANGE)`. A reader sees the old set or the new one.
//!
//! It runs as root beside files others may control, so it follows no
//! path twice: `--from` and `--to`'s parent are opened once, never
//! through a link, and every file is listed, opened, made, given away,
//! renamed and removed relative to an open directory (`openat` and
//! friends). The new directory stays root's until its files are written,
//! and only then is given to the service's user, who owns `--to`'s parent
//! and could otherwise have put something in it.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use rustix::fs::{AtFlags, Dir, FileType, Gid, Mode, OFlags, RenameFlags, Uid};
use rustix::io::Errno;

use super::out::outln;

/// The largest credential staged: a token list or a few secrets are far
/// smaller; anything larger is a mistake (a data file put there).
pub const MAX_BYTES: u64 = 1 << 20;

/// `dedupd stage-credentials`'s flags.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The root-only directory of credentials (one file each; names
    /// starting with a dot are left out).
    #[arg(long)]
    from: PathBuf,
    /// Where the copies go, made if missing: the service's runtime
    /// directory's `credentials` (its parent must exist; the copies take
    /// the parent's owner).
    #[arg(long)]
    to: PathBuf,
}

/// Stages the files; says how many.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let staged = stage(&args.from, &args.to)?;
    outln!(
        "staged {} credential(s) from {} to {}",
        staged.len(),
        args.from.display(),
        args.to.display()
    )?;
    Ok(ExitCode::SUCCESS)
}

/// Copies every credential in `from` to `to` (mode 0400, owned by the
/// owner of `to`'s parent), replacing the set staged before. Returns the
/// names staged.
pub fn stage(from: &Path, to: &Path) -> anyhow::Result<Vec<String>> {
    let sources = read_sources(from)?;
    let (parent, name) = match (to.parent(), to.file_name()) {
        (Some(p), Some(n)) if !p.as_os_str().is_empty() => (p, n),
        _ => bail!("--to {} has no parent directory", to.display()),
    };
    let parent_dir = open_dir(parent).with_context(|| {
        format!(
            "cannot open {} (the service's runtime directory: RuntimeDirectory= makes it)",
            parent.display()
        )
    })?;
    let owner = rustix::fs::fstat(&parent_dir)?;
    let owner = (
        Some(Uid::from_raw(owner.st_uid)),
        Some(Gid::from_raw(owner.st_gid)),
    );
    let name = name
        .to_str()
        .with_context(|| format!("--to {}: the name must be UTF-8", to.display()))?;
    let staging = format!(".{name}.staging");
    // What a stage that failed half-way left.
    remove_tree(&parent_dir, &staging)?;
    rustix::fs::mkdirat(&parent_dir, staging.as_str(), Mode::from_raw_mode(0o700))
        .with_context(|| format!("cannot create {staging} in {}", parent.display()))?;
    let written = (|| -> anyhow::Result<()> {
        let dir = rustix::fs::openat(
            &parent_dir,
            staging.as_str(),
            OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        for (file, bytes) in &sources {
            write_copy(&dir, file, bytes, owner).with_context(|| format!("cannot stage {file}"))?;
        }
        // Only now the service's user's: nothing of theirs got in.
        rustix::fs::fchown(&dir, owner.0, owner.1)?;
        Ok(())
    })();
    if let Err(e) = written {
        let _ = remove_tree(&parent_dir, &staging);
        return Err(e.context(format!("nothing was staged: {} is as it was", to.display())));
    }
    match rustix::fs::renameat_with(
        &parent_dir,
        staging.as_str(),
        &parent_dir,
        name,
        RenameFlags::EXCHANGE,
    ) {
        Ok(()) => {}
        Err(Errno::NOENT) => rustix::fs::renameat_with(
            &parent_dir,
            staging.as_str(),
            &parent_dir,
            name,
            RenameFlags::NOREPLACE,
        )
        .with_context(|| format!("cannot put {} in place", to.display()))?,
        Err(e) => {
            let _ = remove_tree(&parent_dir, &staging);
            return Err(e).with_context(|| format!("cannot put {} in place", to.display()));
        }
    }
    // The set staged before, under the staging name after the exchange.
    if let Err(e) = remove_tree(&parent_dir, &staging) {
        eprintln!(
            "warning: the credentials staged before are left in {}/{staging}: {e:#}",
            parent.display()
        );
    }
    Ok(sources.into_keys().collect())
}

/// Opens a directory, never through a link.
fn open_dir(path: &Path) -> rustix::io::Result<OwnedFd> {
    rustix::fs::open(
        path,
        OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// Every credential's name and contents, each checked.
fn read_sources(from: &Path) -> anyhow::Result<BTreeMap<String, Vec<u8>>> {
    let dir = match open_dir(from) {
        Ok(dir) => dir,
        Err(Errno::LOOP | Errno::NOTDIR) => bail!(
            "{} is a link or not a directory: it must be root's own directory (mkdir -m 0700 {0}); nothing was staged",
            from.display()
        ),
        Err(e) => {
            return Err(e).with_context(|| {
                format!(
                    "cannot read {} (the package makes it; mkdir -m 0700 {0} to make it again)",
                    from.display()
                )
            });
        }
    };
    trusted(from, &rustix::fs::fstat(&dir)?)?;
    let mut sources = BTreeMap::new();
    for entry in Dir::read_from(&dir).with_context(|| format!("cannot list {}", from.display()))? {
        let entry = entry?;
        let raw = entry.file_name();
        let Ok(name) = raw.to_str() else {
            bail!(
                "{}: a credential's name must be UTF-8 (nothing was staged)",
                from.join(std::ffi::OsStr::from_bytes(raw.to_bytes()))
                    .display()
            );
        };
        // `.`, `..`, and what an editor or dpkg leaves.
        if name.starts_with('.') {
            continue;
        }
        let path = from.join(name);
        let fd = match rustix::fs::openat(
            &dir,
            raw,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::LOOP) => bail!(
                "{} is a link: nothing was staged (copy the file itself there)",
                path.display()
            ),
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        sources.insert(name.to_owned(), read_source(&path, fd)?);
    }
    Ok(sources)
}

/// One credential's bytes, checked on the file opened: a plain file (not
/// a FIFO, which would never end, nor a device), root's, at most
/// [`MAX_BYTES`].
fn read_source(path: &Path, fd: OwnedFd) -> anyhow::Result<Vec<u8>> {
    let stat = rustix::fs::fstat(&fd)?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
        bail!(
            "{} is not a plain file (a directory, a FIFO or a device): nothing was staged",
            path.display()
        );
    }
    trusted(path, &stat)?;
    let len = u64::try_from(stat.st_size).unwrap_or(0);
    if len > MAX_BYTES {
        bail!(
            "{} is {len} bytes, more than a credential's {MAX_BYTES}: nothing was staged",
            path.display()
        );
    }
    let mut bytes = Vec::new();
    File::from(fd)
        .take(MAX_BYTES + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("cannot read {}", path.display()))?;
    if bytes.len() as u64 > MAX_BYTES {
        bail!(
            "{} grew past a credential's {MAX_BYTES} bytes while read: nothing was staged",
            path.display()
        );
    }
    Ok(bytes)
}

/// Refuses a file or directory that another user than root (or the one
/// running this) owns or could change: its contents decide who may call
/// the API.
fn trusted(path: &Path, stat: &rustix::fs::Stat) -> anyhow::Result<()> {
    let me = rustix::process::geteuid().as_raw();
    if stat.st_uid != 0 && stat.st_uid != me {
        bail!(
            "{} belongs to uid {}, not root: chown root {0} (nothing was staged)",
            path.display(),
            stat.st_uid
        );
    }
    if stat.st_mode & 0o022 != 0 {
        bail!(
            "{} can be written by other users (mode {:o}): chmod go-w {0} (nothing was staged)",
            path.display(),
            stat.st_mode & 0o7777
        );
    }
    Ok(())
}

/// Writes `bytes` as `name` in `dir` (a new, root-only directory), mode
/// 0400, given to `owner`.
fn write_copy(
    dir: &OwnedFd,
    name: &str,
    bytes: &[u8],
    (uid, gid): (Option<Uid>, Option<Gid>),
) -> anyhow::Result<()> {
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o400),
    )?;
    rustix::fs::fchown(&fd, uid, gid)?;
    let mut file = File::from(fd);
    file.write_all(bytes)?;
    file.sync_all()?;
    Ok(())
}

/// How deep [`remove_tree`] goes: what it stages is one level; deeper is
/// something the service's user made, left for the runtime directory's
/// removal at the stop.
const MAX_DEPTH: usize = 8;

/// Removes `name` in `parent` and all under it, relative to open
/// directories, never through a link; nothing there: fine.
fn remove_tree(parent: &OwnedFd, name: &str) -> anyhow::Result<()> {
    fn remove(parent: &OwnedFd, name: &CStr, depth: usize) -> rustix::io::Result<()> {
        match rustix::fs::unlinkat(parent, name, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => return Ok(()),
            Err(Errno::ISDIR | Errno::PERM) => {}
            Err(e) => return Err(e),
        }
        if depth >= MAX_DEPTH {
            return Err(Errno::TOOBIG);
        }
        let dir = rustix::fs::openat(
            parent,
            name,
            OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let mut names = Vec::new();
        for entry in Dir::read_from(&dir)? {
            let entry = entry?;
            let n = entry.file_name();
            if n.to_bytes() != b"." && n.to_bytes() != b".." {
                names.push(n.to_owned());
            }
        }
        for n in names {
            remove(&dir, &n, depth + 1)?;
        }
        rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR)
    }
    let name = CString::new(name)?;
    remove(parent, &name, 0).with_context(|| format!("cannot remove {}", name.to_string_lossy()))
}
