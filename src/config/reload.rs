//! What a reload (`SIGHUP`, `systemctl reload`) may change, and the
//! settings it puts in force.
//!
//! A reload reads the configuration as `check-config` does: the file (or
//! none), then the `DEDUPD_*` variables, every check, and the secret and
//! token files read again. A configuration with errors changes nothing.
//! Otherwise the settings put in force are the file's [`RELOADABLE`] ones
//! over the running ones for everything else, validated again as a whole:
//! the file alone may pass with a restart-only setting that makes a
//! reloadable one unsafe at the value still running (the file moves
//! `listen` to loopback and removes every API token, while the process
//! still listens on every address), so the whole is what must pass.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::Value;

use super::{ConfigError, ConfigErrors, Loaded, Settings, secret};

/// The settings a reload takes from the file: each source (its secrets,
/// destinations, filters and limits), the API tokens, and the log level.
/// Every other setting keeps its running value until a restart.
pub const RELOADABLE: [&str; 3] = ["sources", "api", "log.level"];

/// The settings a reload puts in force.
#[derive(Debug)]
pub struct Reload {
    /// The settings to run with: the file's [`RELOADABLE`] ones over the
    /// running ones, validated as a whole.
    pub loaded: Loaded,
    /// Settings (dotted keys) the file changes that need a restart: not
    /// applied, named so the operator knows.
    pub restart_only: Vec<String>,
}

/// Whether `key` (dotted) is one a reload applies.
pub fn reloadable(key: &str) -> bool {
    RELOADABLE.iter().any(|r| {
        key == *r
            || key
                .strip_prefix(r)
                .is_some_and(|rest| rest.starts_with('.'))
    })
}

impl Loaded {
    /// The settings a reload from `file` (or `DEDUPD_CONFIG`, as at the
    /// start) puts in force over these running ones. The configuration is
    /// loaded and checked as `check-config` does (`check` builds what the
    /// settings describe, as [`Settings::load_checked`]); its errors
    /// refuse the reload. Then the file's [`RELOADABLE`] settings over
    /// these are checked as a whole: an error there names the running
    /// value it meets when its key needs a restart.
    pub fn reload(
        &self,
        file: Option<&Path>,
        check: impl Fn(&Loaded) -> Result<(), ConfigErrors>,
    ) -> Result<Reload, ConfigErrors> {
        // Read as the start reads it (a plain file, bounded): a FIFO put in
        // its place would hang the reload, and every one after it, and the
        // stop; a huge file would be read whole. Anything refused here is
        // refused again, with its reason, by the load below.
        if let Some(path) = file
            && super::bounded::read_text(path, super::bounded::MAX_SETTINGS_FILE).is_ok_and(
                |text| {
                    text.lines()
                        .map(str::trim)
                        .all(|l| l.is_empty() || l.starts_with('#'))
                },
            )
        {
            // The defaults at a start, but on a reload more likely a write
            // cut short (a tool writing in place, a `>` by mistake): every
            // source and token would go at once.
            return Err(ConfigErrors(vec![ConfigError {
                key: String::new(),
                origin: path.display().to_string(),
                message: "the file is empty: a reload would remove every source and API token \
                          at once. Restart to serve the defaults"
                    .into(),
            }]));
        }
        let from_file = Settings::load_checked(file, &check)?;
        let restart_only: Vec<String> = changed_keys(&self.settings, &from_file.settings)
            .into_iter()
            .filter(|k| !reloadable(k))
            .collect();
        let fig = from_file
            .figment
            .clone()
            .unwrap_or_else(Settings::defaults_figment);
        let mut settings = self.settings.clone();
        settings.sources = from_file.settings.sources;
        settings.api = from_file.settings.api;
        settings.log.level = from_file.settings.log.level;
        let loaded = settings.checked(&fig, &check).map_err(|errors| {
            ConfigErrors(
                errors
                    .0
                    .into_iter()
                    .map(|mut e| {
                        if !e.key.is_empty() && !reloadable(&e.key) {
                            e.origin =
                                "the running settings: it needs a restart to change".to_owned();
                        }
                        e
                    })
                    .collect(),
            )
        })?;
        if !self.settings.sources.is_empty() && loaded.settings.sources.is_empty() {
            // A file cut short before its sources reads as one without any.
            return Err(ConfigErrors(vec![ConfigError {
                key: "sources".into(),
                origin: file.map_or("the environment".into(), |p| p.display().to_string()),
                message: "a reload may not remove every source at once (a file cut short \
                          before its [sources] reads that way): their webhooks would be refused \
                          and their pending events held. Restart to serve without sources"
                    .into(),
            }]));
        }
        if !self.api_tokens.is_empty() && loaded.api_tokens.is_empty() {
            return Err(ConfigErrors(vec![ConfigError {
                key: "api.tokens".into(),
                origin: file.map_or("the environment".into(), |p| p.display().to_string()),
                message: "a reload may not remove every API token: the API would then answer \
                          without one. Restart to serve without tokens (on a loopback address \
                          only)"
                    .into(),
            }]));
        }
        Ok(Reload {
            loaded,
            restart_only,
        })
    }
}

impl Loaded {
    /// The settings a reload applies (dotted keys) whose values differ in
    /// `new`. The contents of secret and token files are not compared:
    /// a reload reads them again in any case.
    pub fn changed_reloadable(&self, new: &Loaded) -> Vec<String> {
        changed_keys(&self.settings, &new.settings)
            .into_iter()
            .filter(|k| reloadable(k))
            .collect()
    }
}

/// The dotted keys whose values differ between `old` and `new`, secrets
/// compared by value (never printed: only the keys leave here), in order.
fn changed_keys(old: &Settings, new: &Settings) -> Vec<String> {
    let values = |s: &Settings| secret::exposed(|| serde_json::to_value(s).unwrap_or(Value::Null));
    let mut out = Vec::new();
    diff("", &values(old), &values(new), &mut out);
    out
}

/// Pushes onto `out` each key under `prefix` where `a` and `b` differ: the
/// leaves of objects, a list or a value whole.
fn diff(prefix: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for k in keys {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                match (a.get(k), b.get(k)) {
                    (Some(x), Some(y)) => diff(&key, x, y, out),
                    (x, y) if x != y => out.push(key),
                    _ => {}
                }
            }
        }
        (a, b) if a != b => out.push(prefix.to_owned()),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reloadable_keys_are_the_sources_the_api_and_the_log_level() {
        for key in ["sources", "sources.a.secrets", "api.tokens", "log.level"] {
            assert!(reloadable(key), "{key}");
        }
        for key in ["listen", "log.format", "apis", "http.workers", "sourcesx"] {
            assert!(!reloadable(key), "{key}");
        }
    }

    #[test]
    fn changed_keys_name_each_leaf_that_differs() {
        let old = Settings::default();
        let mut new = old.clone();
        new.http.workers = 7;
        new.listen = "127.0.0.1:9999".parse().unwrap();
        new.storage.redis.url = super::super::Secret::new("redis://elsewhere:6379");
        new.alerts = Some(
            toml::from_str(
                "forward_to = \"http://127.0.0.1:9/a\"\n\
                 destination_secret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"",
            )
            .unwrap(),
        );
        assert_eq!(
            changed_keys(&old, &new),
            ["alerts", "http.workers", "listen", "storage.redis.url"]
        );
        assert!(changed_keys(&old, &old.clone()).is_empty());
    }

    /// The file alone is valid (it moves `listen` to loopback, where no
    /// token is needed), but `listen` keeps its running value until a
    /// restart: without tokens the API would be open on every address.
    #[test]
    fn a_file_removing_every_token_is_refused_while_the_running_listen_is_public() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("dedupd.toml");
        let mut settings = Settings {
            listen: "0.0.0.0:8080".parse().unwrap(),
            ..Settings::default()
        };
        settings.api.tokens = vec![super::super::Secret::new("full-token-0123456789")];
        let running = Loaded::new(settings);

        std::fs::write(&file, "listen = \"127.0.0.1:8080\"\n").unwrap();
        let errors = running.reload(Some(&file), |_| Ok(())).unwrap_err();
        let listen = errors.0.iter().find(|e| e.key == "listen").unwrap();
        assert_eq!(
            listen.origin,
            "the running settings: it needs a restart to change"
        );

        std::fs::write(
            &file,
            "listen = \"127.0.0.1:8080\"\n[api]\ntokens = [\"new-token-0123456789\"]\n",
        )
        .unwrap();
        let reload = running.reload(Some(&file), |_| Ok(())).unwrap();
        assert_eq!(reload.restart_only, ["listen"]);
        assert_eq!(reload.loaded.settings.listen, running.settings.listen);
        let tokens: Vec<&str> = reload
            .loaded
            .api_tokens
            .iter()
            .map(|t| t.expose())
            .collect();
        assert_eq!(tokens, ["new-token-0123456789"]);
    }

    /// A FIFO put where the settings file was (a reload by `kill -HUP`,
    /// which no CLI checked first) is refused at once, as at a start: read
    /// whole, it would hang this reload, every later one and the stop.
    #[test]
    fn a_reload_from_a_fifo_is_refused_without_waiting_for_a_writer() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("dedupd.toml");
        let made = std::process::Command::new("mkfifo")
            .arg(&file)
            .status()
            .unwrap();
        assert!(made.success());
        let running = Loaded::new(Settings::default());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(running.reload(Some(&file), |_| Ok(())).map(|_| ()));
        });
        // Without a writer the FIFO never ends: a read of it would never
        // answer (the deadline only turns that hang into a failure).
        let errors = rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("the reload waits on the FIFO")
            .unwrap_err();
        assert!(
            errors.0.iter().any(|e| e.message.contains("is not a file")),
            "{errors:?}"
        );
    }
}
