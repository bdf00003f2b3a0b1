//! Files holding secrets that others may read: the settings file when it
//! holds a secret itself, and every `*_file` a secret is read from. `serve`
//! logs a warning for each at start, as it does for a data file open to
//! others; `check-config` prints the same. dedupd does not change a mode
//! it did not choose.

use std::fmt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use figment::value::Value;

use super::Loaded;

/// A file of secrets whose group or others may read or write it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenSecretFile {
    pub path: PathBuf,
    /// Its permission bits.
    pub mode: u32,
    /// The settings whose secrets it holds, such as `api.tokens_file`.
    pub holds: Vec<String>,
}

impl fmt::Display for OpenSecretFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (mode {:o}) holds secrets ({}) but its group or others may read it: chmod 600 it",
            self.path.display(),
            self.mode,
            self.holds.join(", ")
        )
    }
}

/// Whether a file of `mode` may be read or written by its group or others
/// (the data file's rule).
fn open_to_others(mode: u32) -> bool {
    mode & 0o077 != 0
}

/// Whether a setting's `value` holds a secret: a non-empty string or list
/// of them; for Redis URLs (`redis`), one with a user or a password.
fn holds_secret(value: &Value, redis: bool) -> bool {
    match value {
        Value::String(_, s) if redis => {
            reqwest::Url::parse(s).is_ok_and(|u| !u.username().is_empty() || u.password().is_some())
        }
        Value::String(_, s) => !s.is_empty(),
        Value::Array(_, items) => items.iter().any(|v| holds_secret(v, redis)),
        _ => false,
    }
}

impl Loaded {
    /// Every file holding a secret that its group or others may read or
    /// write, with the settings it holds. Files that cannot be read are
    /// left out (loading named them already).
    pub fn open_secret_files(&self) -> Vec<OpenSecretFile> {
        let s = &self.settings;
        let mut files: Vec<(PathBuf, String)> = Vec::new();
        let mut add = |path: &Path, key: String| files.push((path.to_path_buf(), key));
        if let Some(p) = &s.api.tokens_file {
            add(p, "api.tokens_file".into());
        }
        if let Some(p) = &s.api.read_tokens_file {
            add(p, "api.read_tokens_file".into());
        }
        for (name, src) in &s.sources {
            if let Some(p) = &src.secrets_file {
                add(p, format!("sources.{name}.secrets_file"));
            }
            if let Some(p) = &src.destination_secret_file {
                add(p, format!("sources.{name}.destination_secret_file"));
            }
        }
        // The settings file, for each secret written in it (a file without
        // any, as the systemd unit's, may well be readable by all). Asked
        // of the layers, not of the settings: they do not say which layer
        // a value came from.
        if let Some(fig) = &self.figment {
            let mut keys: Vec<String> = [
                "api.tokens",
                "api.read_tokens",
                "storage.redis.url",
                "storage.redis.cluster_nodes",
                "storage.redis.sentinels",
            ]
            .map(str::to_owned)
            .to_vec();
            for name in s.sources.keys() {
                keys.push(format!("sources.{name}.secrets"));
                keys.push(format!("sources.{name}.destination_secret"));
                keys.push(format!("sources.{name}.destination_secrets"));
            }
            for key in keys {
                let Ok(value) = fig.find_value(&key) else {
                    continue;
                };
                let redis = key.starts_with("storage.redis.");
                if !holds_secret(&value, redis) {
                    continue;
                }
                if let Some(figment::Source::File(path)) = fig
                    .get_metadata(value.tag())
                    .and_then(|m| m.source.as_ref())
                {
                    add(path, key);
                }
            }
        }
        let mut open: Vec<OpenSecretFile> = Vec::new();
        for (path, key) in files {
            if let Some(known) = open.iter_mut().find(|o| o.path == path) {
                known.holds.push(key);
                continue;
            }
            let Ok(meta) = std::fs::metadata(&path) else {
                continue;
            };
            let mode = meta.permissions().mode() & 0o777;
            if open_to_others(mode) {
                open.push(OpenSecretFile {
                    path,
                    mode,
                    holds: vec![key],
                });
            }
        }
        open
    }

    /// Logs a warning for each of [`Loaded::open_secret_files`].
    pub fn warn_about_open_secret_files(&self) {
        for f in self.open_secret_files() {
            tracing::warn!(
                path = %f.path.display(),
                mode = format!("{:o}", f.mode),
                holds = f.holds.join(", "),
                "the file holds secrets but its group or others may read it: chmod 600 it"
            );
        }
    }
}
