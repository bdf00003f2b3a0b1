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
//! Every file is checked before anything is written: a directory or file
//! another user could write, a link, something not a file or a file over
//! [`MAX_BYTES`] refuses the whole stage, and the staged copies stay as
//! they were.
//!
//! It runs as root in a directory the service's user owns, so it trusts
//! nothing there: the target is opened once, never through a link, and
//! every file is made, given away, renamed and removed relative to that
//! open directory (`openat` and friends), never by a path the service
//! could have pointed elsewhere in the meantime.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use rustix::fs::{AtFlags, Dir, Gid, Mode, OFlags, Uid};
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
/// owner of `to`'s parent), then removes the copies whose original is
/// gone. Returns the names staged.
pub fn stage(from: &Path, to: &Path) -> anyhow::Result<Vec<String>> {
    let sources = read_sources(from)?;
    let parent = to
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .with_context(|| format!("--to {} has no parent directory", to.display()))?;
    let owner = fs::metadata(parent).with_context(|| {
        format!(
            "cannot read {} (the service's runtime directory: RuntimeDirectory= makes it)",
            parent.display()
        )
    })?;
    let (uid, gid) = (
        Some(Uid::from_raw(owner.uid())),
        Some(Gid::from_raw(owner.gid())),
    );
    match rustix::fs::mkdir(to, Mode::from_raw_mode(0o700)) {
        Ok(()) | Err(Errno::EXIST) => {}
        Err(e) => return Err(e).with_context(|| format!("cannot create {}", to.display())),
    }
    // Never through a link: the service's user could have put one there.
    let dir = rustix::fs::open(
        to,
        OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .with_context(|| format!("{} is not a directory (or cannot be opened)", to.display()))?;
    rustix::fs::fchown(&dir, uid, gid)
        .with_context(|| format!("cannot give {} to uid {}", to.display(), owner.uid()))?;
    rustix::fs::fchmod(&dir, Mode::from_raw_mode(0o700))
        .with_context(|| format!("cannot set the mode of {}", to.display()))?;
    for (name, bytes) in &sources {
        write_copy(&dir, name, bytes, (uid, gid))
            .with_context(|| format!("cannot stage {name} in {}", to.display()))?;
    }
    let mut stale = Vec::new();
    for entry in Dir::read_from(&dir).with_context(|| format!("cannot list {}", to.display()))? {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        if !std::str::from_utf8(name).is_ok_and(|n| sources.contains_key(n)) {
            stale.push(entry.file_name().to_owned());
        }
    }
    for name in stale {
        rustix::fs::unlinkat(&dir, name.as_c_str(), AtFlags::empty()).with_context(|| {
            format!(
                "cannot remove {} from {}",
                name.to_string_lossy(),
                to.display()
            )
        })?;
    }
    Ok(sources.into_keys().collect())
}

/// Every credential's name and contents, each checked.
fn read_sources(from: &Path) -> anyhow::Result<BTreeMap<String, Vec<u8>>> {
    let dir = fs::symlink_metadata(from).with_context(|| {
        format!(
            "cannot read {} (the package makes it; mkdir -m 0700 {0} to make it again)",
            from.display()
        )
    })?;
    if !dir.is_dir() {
        bail!("{} is not a directory", from.display());
    }
    writable_by_others(from, &dir)?;
    let mut sources = BTreeMap::new();
    for entry in fs::read_dir(from).with_context(|| format!("cannot list {}", from.display()))? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            bail!(
                "{}: a credential's name must be UTF-8",
                entry.path().display()
            );
        };
        if name.starts_with('.') {
            continue;
        }
        let bytes = read_source(&entry.path())?;
        sources.insert(name.to_owned(), bytes);
    }
    Ok(sources)
}

/// One credential's bytes: a plain file, not a link (opened without
/// following one, and without waiting on a FIFO), checked on the file
/// opened.
fn read_source(path: &Path) -> anyhow::Result<Vec<u8>> {
    let not_plain = || {
        anyhow::anyhow!(
            "{} is not a plain file (a link, a directory or a device): nothing was staged",
            path.display()
        )
    };
    let fd = match rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::LOOP) => return Err(not_plain()),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let file = File::from(fd);
    let meta = file
        .metadata()
        .with_context(|| format!("cannot read {}", path.display()))?;
    if !meta.file_type().is_file() {
        return Err(not_plain());
    }
    writable_by_others(path, &meta)?;
    if meta.len() > MAX_BYTES {
        bail!(
            "{} is {} bytes, more than a credential's {MAX_BYTES}: nothing was staged",
            path.display(),
            meta.len()
        );
    }
    let mut bytes = Vec::new();
    file.take(MAX_BYTES + 1)
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

/// Refuses a file or directory that another user than its owner, root or
/// the one running this, could change: its contents would decide who may
/// call the API.
fn writable_by_others(path: &Path, meta: &fs::Metadata) -> anyhow::Result<()> {
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != 0 && meta.uid() != me {
        bail!(
            "{} belongs to uid {}, not root: chown root {0} (nothing was staged)",
            path.display(),
            meta.uid()
        );
    }
    if meta.mode() & 0o022 != 0 {
        bail!(
            "{} can be written by other users (mode {:o}): chmod go-w {0} (nothing was staged)",
            path.display(),
            meta.mode() & 0o7777
        );
    }
    Ok(())
}

/// Writes `bytes` as `name` in `dir`, mode 0400, given to `owner`, by a
/// rename: a reader sees the old copy or the new one, never a part.
fn write_copy(
    dir: &OwnedFd,
    name: &str,
    bytes: &[u8],
    (uid, gid): (Option<Uid>, Option<Gid>),
) -> anyhow::Result<()> {
    let tmp = format!(".{name}.staging");
    match rustix::fs::unlinkat(dir, tmp.as_str(), AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => {}
        Err(e) => return Err(e.into()),
    }
    // EXCL: never through a link or onto a file someone else made.
    let fd = rustix::fs::openat(
        dir,
        tmp.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o400),
    )?;
    rustix::fs::fchown(&fd, uid, gid)?;
    let mut file = File::from(fd);
    file.write_all(bytes)?;
    file.sync_all()?;
    rustix::fs::renameat(dir, tmp.as_str(), dir, name)?;
    Ok(())
}
