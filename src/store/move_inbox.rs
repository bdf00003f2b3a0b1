//! `dedupd inbox migrate`: moves the pending events of this instance's
//! local inbox (its data file) into the shared inbox in Redis, so an
//! operator can switch to `gateway.inbox = "shared"` without losing or
//! duplicating an event.
//!
//! Each pending event is ingested into the shared inbox as it was received
//! (its id, stream, `created_at`, receive time, headers and body); one the
//! shared inbox already holds is a duplicate there and is not stored twice.
//! Once every pending event of a source is in, they are deleted from the
//! file. A run cut short is run again: what moved already answers
//! duplicate, and the file still holds what did not. Settled events
//! (delivered, stale, dead) stay in the file; their dedupe records (and
//! those of erased and filtered events) received within
//! `gateway.dedupe_window` are copied, so a provider's retry of one is a
//! duplicate in the shared inbox too.
//!
//! The stream heads go first: for every stream of an event the file still
//! holds (any status), the head kept by the local mode — in the data file,
//! or in Redis's claims keys when the backend was Redis — is copied into
//! the shared inbox unless it has a newer one, so an event older than one
//! delivered before the move is still stale after it.

use std::sync::Arc;

use anyhow::Context;

use std::collections::BTreeSet;

use super::inbox::{EventStatus, Inbox, IngestOutcome, ListOrder, NewEvent};
use super::redb::{CommitMetrics, RedbOptions, RedbStore};
use super::redis::{Client, RedisInbox, RedisStore, SharedInboxOptions};
use super::{Head, Store};
use crate::clock::Millis;
use crate::config::sources::InboxPlace;
use crate::config::{Backend, Settings};
use crate::domain::{Key, Namespace, ScopedKey};

/// Ids a dry run names per source.
const NAMED: usize = 5;

/// What a run did (or, dry, would do) with one source's pending events.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Moved {
    pub source: String,
    /// Pending events found in the file.
    pub pending: u64,
    /// Of those, stored in the shared inbox by this run.
    pub stored: u64,
    /// Of those, already in the shared inbox (a run before this one, or
    /// the provider's retry that reached another instance).
    pub already: u64,
    /// The first few ids, oldest received first.
    pub first_ids: Vec<String>,
    /// Stream heads copied into the shared inbox (would be, dry).
    pub heads: u64,
    /// Dedupe records of settled (and filtered) events still within
    /// `gateway.dedupe_window` copied into the shared inbox: a provider's
    /// retry of one is a duplicate there too.
    pub dedupe: u64,
}

/// Moves (or, with `dry_run`, counts) the local inbox's pending events
/// into the shared inbox `settings` name. The instance must be stopped:
/// the data file opens for one process at a time.
pub async fn move_to_shared(
    settings: &Settings,
    dry_run: bool,
    now: Millis,
) -> anyhow::Result<Vec<Moved>> {
    if settings.storage.backend != Backend::Redis || settings.gateway.inbox != InboxPlace::Shared {
        anyhow::bail!(
            "set storage.backend = \"redis\" and gateway.inbox = \"shared\" first: the \
             migration moves this instance's local inbox into the shared inbox those settings name"
        );
    }
    let opts = RedbOptions::from_settings(settings, CommitMetrics::default());
    let path = opts.path.clone();
    let file = tokio::task::spawn_blocking(move || RedbStore::open(&opts))
        .await
        .context("opening the data file panicked")?
        .with_context(|| {
            format!(
                "cannot open the data file {} (stop the instance that uses it first)",
                path.display()
            )
        })?;
    let local = file.inbox();
    let client = Arc::new(Client::new(super::open::redis_options(settings))?);
    let shared = RedisInbox::new(
        client.clone(),
        SharedInboxOptions {
            buckets: settings.gateway.inbox_buckets,
            lease_grace: settings.gateway.lease_grace,
            dedupe_window: settings.gateway.dedupe_window,
        },
    );
    // The heads a local inbox on the Redis backend kept.
    let claims = RedisStore::new(client);
    let heads = Heads {
        file: &file,
        redis: &claims,
        shared: &shared,
        retention_ms: u64::try_from(settings.ordering.retention.as_millis()).unwrap_or(u64::MAX),
    };
    let window_ms = u64::try_from(settings.gateway.dedupe_window.as_millis()).unwrap_or(u64::MAX);
    let result = async {
        shared
            .ready()
            .await
            .context("the shared inbox in Redis is not ready")?;
        let mut report = Vec::new();
        for (source, _) in local.inbox_sources().await? {
            let copied = heads.copy(&local, &source, dry_run, now).await?;
            let mut moved = move_source(&local, &shared, &source, dry_run, now).await?;
            if !dry_run {
                moved.dedupe = move_dedupe(&local, &shared, &source, window_ms, now).await?;
            }
            moved.heads = copied;
            report.push(moved);
        }
        anyhow::Ok(report)
    }
    .await;
    file.close().await;
    result
}

/// Moves one source's pending events.
async fn move_source(
    local: &dyn Inbox,
    shared: &RedisInbox,
    source: &str,
    dry_run: bool,
    now: Millis,
) -> anyhow::Result<Moved> {
    let mut moved = Moved {
        source: source.to_owned(),
        ..Moved::default()
    };
    let mut after = None;
    loop {
        let (page, next) = local
            .list_events(
                source,
                EventStatus::Pending,
                ListOrder::OldestFirst,
                after,
                200,
            )
            .await?;
        for listed in page {
            moved.pending += 1;
            if moved.first_ids.len() < NAMED {
                moved.first_ids.push(listed.event_id.clone());
            }
            if dry_run {
                continue;
            }
            // The listing leaves bodies out.
            let Some(e) = local.inbox_event(source, &listed.event_id).await? else {
                continue;
            };
            let new = NewEvent {
                source: e.source,
                event_id: e.event_id,
                stream: e.stream,
                created_at: e.created_at,
                received_at_ms: e.received_at_ms,
                headers: e.headers,
                body: e.body,
            };
            match shared.ingest(new, now).await? {
                IngestOutcome::Accepted => moved.stored += 1,
                IngestOutcome::Duplicate => moved.already += 1,
            }
        }
        match next {
            Some(cursor) => after = Some(cursor),
            None => break,
        }
    }
    if !dry_run && moved.pending > 0 {
        // Every one is in the shared inbox now: the file lets them go.
        let gone = local
            .purge_pending(vec![source.to_owned()], Millis::MAX, moved.pending, now)
            .await?;
        anyhow::ensure!(
            gone == moved.pending,
            "{source}: moved {} pending events but deleted {gone} from the data file",
            moved.pending
        );
    }
    Ok(moved)
}

/// Copies the dedupe records of `source`'s settled and filtered events
/// received within the dedupe window into the shared inbox (they stay in
/// the file): how many were copied.
async fn move_dedupe(
    local: &dyn Inbox,
    shared: &RedisInbox,
    source: &str,
    window_ms: u64,
    now: Millis,
) -> anyhow::Result<u64> {
    let mut copied = 0;
    for status in [
        EventStatus::Delivered,
        EventStatus::Stale,
        EventStatus::Dead,
        EventStatus::Erased,
        EventStatus::Filtered,
    ] {
        let mut after = None;
        loop {
            let (page, next) = local
                .list_events(source, status, ListOrder::NewestFirst, after, 500)
                .await?;
            let mut past = false;
            for e in page {
                let until = e.received_at_ms.saturating_add(window_ms);
                if until <= now {
                    // Newest first: the rest are older still.
                    past = true;
                    break;
                }
                let set = shared
                    .import_dedupe(source, &e.event_id, e.stream.as_deref(), until, now)
                    .await?;
                copied += u64::from(set);
            }
            match next {
                Some(cursor) if !past => after = Some(cursor),
                _ => break,
            }
        }
    }
    Ok(copied)
}

/// Where the local mode kept stream heads, and where they go.
struct Heads<'a> {
    file: &'a RedbStore,
    redis: &'a RedisStore,
    shared: &'a RedisInbox,
    /// `ordering.retention`: how long a copied head lives from now.
    retention_ms: u64,
}

impl Heads<'_> {
    /// Copies the live head of every stream of `source` the file holds
    /// events of: how many were copied (or, dry, would be).
    async fn copy(
        &self,
        local: &dyn Inbox,
        source: &str,
        dry_run: bool,
        now: Millis,
    ) -> anyhow::Result<u64> {
        let mut streams = BTreeSet::new();
        for status in [
            EventStatus::Pending,
            EventStatus::Delivered,
            EventStatus::Stale,
            EventStatus::Dead,
        ] {
            let mut after = None;
            loop {
                let (page, next) = local
                    .list_events(source, status, ListOrder::OldestFirst, after, 500)
                    .await?;
                streams.extend(page.into_iter().filter_map(|e| e.stream));
                match next {
                    Some(cursor) => after = Some(cursor),
                    None => break,
                }
            }
        }
        let ns = Namespace::Gateway(source.to_owned());
        let mut copied = 0;
        for stream in streams {
            let Ok(key) = Key::parse(&stream, "stream") else {
                continue;
            };
            let key = ScopedKey::new(&ns, &key);
            let newest: Option<Head> = [
                self.file.head(&key, now).await?,
                self.redis.head(&key, now).await?,
            ]
            .into_iter()
            .flatten()
            .max_by_key(|h| h.created_at);
            let Some(head) = newest else {
                continue;
            };
            if dry_run {
                copied += 1;
                continue;
            }
            let set = self
                .shared
                .import_head(
                    source,
                    &stream,
                    head.created_at,
                    head.event_id.key_part(),
                    now.saturating_add(self.retention_ms),
                    now,
                )
                .await?;
            copied += u64::from(set);
        }
        Ok(copied)
    }
}
