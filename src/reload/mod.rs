//! `systemctl reload`: on SIGHUP (`dedupd reload --pid PID` sends it) the
//! configuration is read again, and what may change while serving is put
//! in force without dropping a connection or a delivery.
//!
//! What changes ([`RELOADABLE`]): the sources (their secrets, destinations,
//! filters and limits; sources added and removed), the API tokens (HTTP
//! and the Redis protocol) and the log level. Each is read per request or
//! per turn from a snapshot a reload replaces whole
//! ([`crate::gateway::Gateway::replace_sources`],
//! [`crate::auth::ApiTokens::replace`]): a request or a delivery in flight
//! finishes with the settings it started with, the next one takes the new
//! ones. The dispatcher keeps each remaining lane's breaker, rate bucket
//! and deliveries in flight ([`Dispatcher::reconfigure`]).
//!
//! Every other setting needs a restart: a changed one is named in the log
//! and keeps its running value. A configuration with errors changes
//! nothing; its errors are logged as `check-config` prints them (the same
//! loading and checks, [`Loaded::reload`]).
//!
//! [`RELOADABLE`]: crate::config::reload::RELOADABLE

pub mod status;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::watch;

use crate::auth::ApiTokens;
use crate::config::reload::Reload;
use crate::config::{ConfigErrors, Loaded};
use crate::gateway::delivery::Dispatcher;
use crate::gateway::sources::{build_sources, source_names};
use crate::gateway::{Gateway, Source, Sources};
use crate::reaper::Configured;
use crate::telemetry::metrics::Metrics;

/// What a reload swaps, and the settings in force. Clones reload the same
/// application.
#[derive(Debug, Clone)]
pub struct Reloader {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The settings in force. Held for a whole reload: two at once would
    /// each compare against the same old settings.
    running: Mutex<Loaded>,
    gateway: Arc<Gateway>,
    dispatcher: Arc<Dispatcher>,
    /// Shared with the HTTP and Redis-protocol ports.
    tokens: ApiTokens,
    metrics: Arc<Metrics>,
    /// The reaper's view of which sources are configured.
    orphans: watch::Sender<Configured>,
}

/// What a reload changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reloaded {
    /// Sources (and destinations' lanes) now configured that were not.
    pub added: Vec<String>,
    /// Sources (and lanes) no longer configured: their events stay listed,
    /// pending ones are not delivered (as after a restart without them).
    pub removed: Vec<String>,
    /// Settings a reload applies whose values changed (dotted keys; the
    /// contents of secret and token files are read again whether or not).
    pub changed: Vec<String>,
    /// Settings the file changes that need a restart: not applied.
    pub restart_only: Vec<String>,
}

impl Reloader {
    /// A reloader of the application built from `running`.
    pub(crate) fn new(
        running: Loaded,
        gateway: Arc<Gateway>,
        dispatcher: Arc<Dispatcher>,
        tokens: ApiTokens,
        metrics: Arc<Metrics>,
        orphans: watch::Sender<Configured>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                running: Mutex::new(running),
                gateway,
                dispatcher,
                tokens,
                metrics,
                orphans,
            }),
        }
    }

    /// Reads the configuration from `file` (or `DEDUPD_CONFIG`, as at the
    /// start; none: the defaults and `DEDUPD_*`) and puts what a reload
    /// may change in force; refused, with every error logged, if anything
    /// is wrong. What SIGHUP runs; it reads files, so call it off the
    /// async threads.
    pub fn reload(&self, file: Option<&Path>) -> Result<Reloaded, ConfigErrors> {
        let inner = &self.inner;
        let mut running = inner.running.lock().unwrap_or_else(PoisonError::into_inner);
        let checked = running.reload(file, |l| build_sources(l).map(|_| ()));
        let built = checked.and_then(|r| build_sources(&r.loaded).map(|s| (r, s)));
        let (
            Reload {
                loaded,
                restart_only,
            },
            sources,
        ) = match built {
            Ok(built) => built,
            Err(errors) => {
                tracing::error!(
                    errors = %errors,
                    "reload refused: the configuration has errors; the running settings stay in force"
                );
                return Err(errors);
            }
        };
        let changed = running.changed_reloadable(&loaded);
        // The level first: the reload's own lines are logged at the new one.
        match crate::telemetry::set_level(&loaded.settings.log.level) {
            Ok(crate::telemetry::Level::Set) => {}
            Ok(crate::telemetry::Level::Kept) => {
                if changed.iter().any(|k| k == "log.level") {
                    tracing::warn!(
                        "log.level changed, but RUST_LOG chose the filter at the start and overrides it"
                    );
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot change the log level"),
        }
        // Series first, so a new source's first webhook is counted.
        inner.metrics.add_sources(&source_names(&loaded.settings));
        inner
            .tokens
            .replace(&loaded.api_tokens, &loaded.api_read_tokens);
        let old = inner.gateway.sources();
        let new = Sources::new(sources.iter().cloned());
        let (added, removed) = difference(&old, &new);
        inner.gateway.replace_sources(new);
        inner.dispatcher.reconfigure(&old, &inner.gateway.sources());
        inner.orphans.send_replace(configured(&sources));
        crate::limits::ensure_open_files(&loaded.settings);
        loaded.warn_about_open_secret_files();
        loaded.warn_about_settings_without_effect();
        tracing::info!(
            sources = sources.len(),
            added = added.join(", "),
            removed = removed.join(", "),
            changed = changed.join(", "),
            api_tokens = loaded.api_tokens.len(),
            api_read_tokens = loaded.api_read_tokens.len(),
            log_level = %loaded.settings.log.level,
            "configuration reloaded"
        );
        for file in credential_copies(&loaded.settings.api) {
            tracing::info!(
                file = %file.display(),
                "this token file is a systemd credential, copied when the service started: \
                 an edit of the file LoadCredential= names takes effect at a restart"
            );
        }
        if !restart_only.is_empty() {
            tracing::warn!(
                settings = restart_only.join(", "),
                "these settings changed in the configuration but need a restart: \
                 they keep their running values until dedupd restarts"
            );
        }
        *running = loaded;
        Ok(Reloaded {
            added,
            removed,
            changed,
            restart_only,
        })
    }
}

/// The token files read from systemd's credentials directory
/// (`LoadCredential=`): copies made at the start, which a reload reads
/// again unchanged.
fn credential_copies(api: &crate::config::ApiSettings) -> Vec<&Path> {
    let Some(dir) = std::env::var_os("CREDENTIALS_DIRECTORY") else {
        return Vec::new();
    };
    [&api.tokens_file, &api.read_tokens_file]
        .into_iter()
        .flatten()
        .map(PathBuf::as_path)
        .filter(|f| f.starts_with(&dir))
        .collect()
}

/// The names in `new` and not in `old`, and those in `old` and not in
/// `new`, each sorted.
fn difference(old: &Sources, new: &Sources) -> (Vec<String>, Vec<String>) {
    let mut added: Vec<String> = new
        .names()
        .filter(|n| old.get(n).is_none())
        .cloned()
        .collect();
    let mut removed: Vec<String> = old
        .names()
        .filter(|n| new.get(n).is_none())
        .cloned()
        .collect();
    added.sort();
    removed.sort();
    (added, removed)
}

/// Which of `sources` are configured, and which of them deliver nothing
/// themselves, for the reaper.
pub(crate) fn configured(sources: &[Arc<Source>]) -> Configured {
    Configured {
        names: sources.iter().map(|s| s.name.clone()).collect(),
        idle: sources
            .iter()
            .filter(|s| !s.delivers)
            .map(|s| s.name.clone())
            .collect(),
    }
}
