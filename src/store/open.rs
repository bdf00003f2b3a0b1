//! Opening the store the settings name: the data file always (it holds the
//! gateway inbox and the Redis-protocol keyspace), and claims and ordering
//! in the configured backend (`storage.backend`).

use std::sync::Arc;

use anyhow::Context;

use super::Store;
use super::inbox::Inbox;
use super::keyspace::Keyspace;
use super::redb::{Backups, CommitMetrics, RedbOptions, RedbStore};
use crate::config::{Backend, Settings};

/// The store, open: a handle for each concern.
#[derive(Debug, Clone)]
pub struct Opened {
    /// Claims, ordering and expiry, in the configured backend.
    pub claims: Arc<dyn Store>,
    /// The data file's own claims, ordering and expiry: `claims` itself
    /// with the embedded backend. The reaper purges it (Redis expires its
    /// own keys); closing it closes the data file under every handle.
    pub file: Arc<dyn Store>,
    /// The gateway inbox: in the data file, or shared in Redis
    /// (`gateway.inbox`).
    pub inbox: Arc<dyn Inbox>,
    /// The Redis-protocol keyspace, in the data file.
    pub keyspace: Keyspace,
    /// Backups of the data file (whatever the backend: Redis keeps its
    /// own).
    pub backups: Backups,
}

impl Opened {
    /// The handles of an open data file that holds claims as well (the
    /// embedded backend).
    pub fn embedded(file: RedbStore) -> Self {
        let inbox = Arc::new(file.inbox());
        let keyspace = file.keyspace();
        let backups = file.backups();
        let file: Arc<dyn Store> = Arc::new(file);
        Self {
            claims: file.clone(),
            file,
            inbox,
            keyspace,
            backups,
        }
    }
}

/// Opens the data file as `settings` say (each group commit recorded in
/// `commit_metrics`), and the Redis backend if they name it.
pub async fn open(settings: &Settings, commit_metrics: CommitMetrics) -> anyhow::Result<Opened> {
    let opts = RedbOptions::from_settings(settings, commit_metrics);
    let file = tokio::task::spawn_blocking(move || RedbStore::open(&opts))
        .await
        .context("opening the store panicked")??;
    let embedded = Opened::embedded(file);
    match settings.storage.backend {
        Backend::Redb => Ok(embedded),
        #[cfg(feature = "redis")]
        Backend::Redis => {
            let client = Arc::new(super::redis::Client::new(redis_options(settings))?);
            let claims = Arc::new(super::redis::RedisStore::new(client.clone()));
            if settings.gateway.inbox == crate::config::sources::InboxPlace::Shared {
                warn_of_local_events(&embedded, settings).await;
            }
            let inbox = match settings.gateway.inbox {
                crate::config::sources::InboxPlace::Local => embedded.inbox.clone(),
                crate::config::sources::InboxPlace::Shared => {
                    Arc::new(super::shared::SharedInbox {
                        shared: super::redis::RedisInbox::new(
                            client,
                            super::redis::SharedInboxOptions {
                                buckets: settings.gateway.inbox_buckets,
                                lease_grace: settings.gateway.lease_grace,
                                dedupe_window: settings.gateway.dedupe_window,
                            },
                        ),
                        file: embedded.inbox.clone(),
                    })
                }
            };
            Ok(Opened {
                claims,
                inbox,
                ..embedded
            })
        }
        #[cfg(not(feature = "redis"))]
        Backend::Redis => {
            anyhow::bail!("storage.backend = \"redis\" needs a build with `--features redis`")
        }
    }
}

/// How to reach Redis, as the settings say.
#[cfg(feature = "redis")]
pub(super) fn redis_options(settings: &Settings) -> super::redis::RedisOptions {
    let r = &settings.storage.redis;
    super::redis::RedisOptions {
        url: r.url.expose().to_owned(),
        cluster_nodes: r
            .cluster_nodes
            .iter()
            .map(|n| n.expose().to_owned())
            .collect(),
        prefix: r.prefix.clone(),
        expiry_slack: r.expiry_slack,
        connect_timeout: r.connect_timeout,
        response_timeout: r.response_timeout,
        durability: r.durability,
        replicas_timeout: r.replicas_timeout,
        sentinels: r.sentinels.iter().map(|n| n.expose().to_owned()).collect(),
        sentinel_master: r.sentinel_master.clone(),
    }
}

/// With the shared inbox, pending events left in the data file's own inbox
/// are delivered by nobody: says so, and how to move them.
#[cfg(feature = "redis")]
async fn warn_of_local_events(embedded: &Opened, settings: &Settings) {
    if let Ok(found) = embedded.inbox.inbox_sources().await {
        let pending: u64 = found.iter().map(|(_, n)| n).sum();
        if pending > 0 {
            tracing::warn!(
                pending,
                data = %settings.data_path.display(),
                "gateway.inbox = \"shared\", but the data file holds pending events of this \
                 instance's local inbox: they are not delivered from there; stop the instance and \
                 run `dedupd inbox migrate` to move them into the shared inbox"
            );
        }
    }
}
