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

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};

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
    let (uid, gid) = (owner.uid(), owner.gid());
    match fs::symlink_metadata(to) {
        Ok(m) if m.is_dir() && !m.file_type().is_symlink() => {}
        Ok(_) => bail!("{} is there and is not a directory", to.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => fs::DirBuilder::new()
            .mode(0o700)
            .create(to)
            .with_context(|| format!("cannot create {}", to.display()))?,
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", to.display())),
    }
    std::os::unix::fs::chown(to, Some(uid), Some(gid))
        .with_context(|| format!("cannot give {} to uid {uid}", to.display()))?;
    fs::set_permissions(to, fs::Permissions::from_mode(0o700))
        .with_context(|| format!("cannot set the mode of {}", to.display()))?;
    for (name, bytes) in &sources {
        write_copy(to, name, bytes, uid, gid)?;
    }
    for entry in fs::read_dir(to).with_context(|| format!("cannot list {}", to.display()))? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !sources.contains_key(&name) {
            fs::remove_file(entry.path())
                .with_context(|| format!("cannot remove {}", entry.path().display()))?;
        }
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
        let path = entry.path();
        let meta = fs::symlink_metadata(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        if !meta.file_type().is_file() {
            bail!(
                "{} is not a plain file (a link, a directory or a device): nothing was staged",
                path.display()
            );
        }
        writable_by_others(&path, &meta)?;
        if meta.len() > MAX_BYTES {
            bail!(
                "{} is {} bytes, more than a credential's {MAX_BYTES}: nothing was staged",
                path.display(),
                meta.len()
            );
        }
        let bytes = fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
        sources.insert(name.to_owned(), bytes);
    }
    Ok(sources)
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

/// Writes `bytes` as `dir/name`, mode 0400, owned by `uid`:`gid`, by a
/// rename: a reader sees the old copy or the new one, never a part.
fn write_copy(dir: &Path, name: &str, bytes: &[u8], uid: u32, gid: u32) -> anyhow::Result<()> {
    let tmp = dir.join(format!(".{name}.staging"));
    let _ = fs::remove_file(&tmp);
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o400)
        .open(&tmp)
        .with_context(|| format!("cannot create {}", tmp.display()))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    std::os::unix::fs::chown(&tmp, Some(uid), Some(gid))
        .with_context(|| format!("cannot give {} to uid {uid}", tmp.display()))?;
    fs::rename(&tmp, dir.join(name))
        .with_context(|| format!("cannot put {name} in place in {}", dir.display()))
}
