//! Claims, ordering and expiry in the data file: [`RedbStore`], the
//! embedded [`Store`]. Opening it opens the file (the engine, with its
//! writer); [`RedbStore::inbox`] and [`RedbStore::keyspace`] hand out the
//! other handles over the same file.

use std::sync::Arc;

use async_trait::async_trait;
use redb::ReadableTable;

use super::RedbOptions;
use super::backup::Backups;
use super::engine::Engine;
use super::error::EngineError;
use super::inbox::{self, RedbInbox};
use super::keyspace::Keyspace;
use super::kv::{self, Space};
use super::open::OpenError;
use super::ops::Response;
use super::record::Request;
use super::tables::{self, EVENT_EXPIRY, HEAD_EXPIRY, HEADS, claim_from_value, head_from_row};
use crate::clock::Millis;
use crate::domain::{ClaimResult, CreatedAt, Fingerprint, ScopedKey, Token, Ttl};
use crate::store::{
    ApplyResult, ClaimOutcome, ClaimView, DoneOutcome, ExtendOutcome, Head, PurgeReport,
    ReleaseOutcome, Store, StoreError, WriteStats,
};

/// The redb-backed [`Store`]: a handle on the open data file (cheap to
/// clone). Closing it closes the file for every handle.
#[derive(Debug, Clone)]
pub struct RedbStore {
    engine: Arc<Engine>,
}

impl RedbStore {
    /// Opens (or creates) the data file and starts the writer.
    pub fn open(opts: &RedbOptions) -> Result<Self, OpenError> {
        Ok(Self {
            engine: Arc::new(Engine::open(opts)?),
        })
    }

    /// The gateway inbox in this file.
    pub fn inbox(&self) -> RedbInbox {
        RedbInbox::new(self.engine.clone())
    }

    /// The Redis-protocol keyspace in this file.
    pub fn keyspace(&self) -> Keyspace {
        Keyspace::new(self.engine.clone())
    }

    /// Backups of this file.
    pub fn backups(&self) -> Backups {
        Backups::new(self.engine.clone())
    }

    /// Finishes queued writes, stops the writer and releases the file, so
    /// the same path can be opened again. Later calls of every handle
    /// answer `Unavailable`.
    pub async fn close(&self) {
        self.engine.close().await;
    }
}

fn unexpected(what: &'static str) -> StoreError {
    EngineError::Unexpected(what).into()
}

#[async_trait]
impl Store for RedbStore {
    async fn claim(
        &self,
        key: &ScopedKey,
        ttl: Ttl,
        fingerprint: Option<Fingerprint>,
        now: Millis,
    ) -> Result<ClaimOutcome, StoreError> {
        let request = Request::Claim {
            key: key.clone(),
            ttl,
            fingerprint,
            token: Token::random(),
        };
        match self.engine.write(request, now).await? {
            Response::Claim(o) => Ok(o),
            _ => Err(unexpected("claim")),
        }
    }

    async fn done_with(
        &self,
        key: &ScopedKey,
        token: Token,
        ttl: Ttl,
        result: Option<ClaimResult>,
        now: Millis,
    ) -> Result<DoneOutcome, StoreError> {
        let key = key.clone();
        let request = match result {
            None => Request::Done { key, token, ttl },
            Some(result) => Request::DoneResult {
                key,
                token,
                ttl,
                result,
            },
        };
        match self.engine.write(request, now).await? {
            Response::Done(o) => Ok(o),
            _ => Err(unexpected("done")),
        }
    }

    async fn release(
        &self,
        key: &ScopedKey,
        token: Token,
        now: Millis,
    ) -> Result<ReleaseOutcome, StoreError> {
        let request = Request::Release {
            key: key.clone(),
            token,
        };
        match self.engine.write(request, now).await? {
            Response::Release(o) => Ok(o),
            _ => Err(unexpected("release")),
        }
    }

    async fn extend(
        &self,
        key: &ScopedKey,
        token: Token,
        ttl: Ttl,
        now: Millis,
    ) -> Result<ExtendOutcome, StoreError> {
        let request = Request::Extend {
            key: key.clone(),
            token,
            ttl,
        };
        match self.engine.write(request, now).await? {
            Response::Extend(o) => Ok(o),
            _ => Err(unexpected("extend")),
        }
    }

    async fn get(&self, key: &ScopedKey, now: Millis) -> Result<Option<ClaimView>, StoreError> {
        let key = key.as_str().as_bytes().to_vec();
        let Some(entry) = kv::read_key(&self.engine, Space::Claims, key, now).await? else {
            return Ok(None);
        };
        let at = entry.expires_at_ms.unwrap_or(0);
        let record = claim_from_value(&entry.value, at)
            .ok_or(EngineError::Unexpected("a claim row that cannot be read"))?;
        Ok(Some(record)
            .filter(|r| !r.is_expired(now))
            .map(|r| r.view()))
    }

    async fn apply(
        &self,
        stream: &ScopedKey,
        event_id: &ScopedKey,
        created_at: CreatedAt,
        retention_ms: u64,
        now: Millis,
    ) -> Result<ApplyResult, StoreError> {
        let request = Request::Apply {
            stream: stream.clone(),
            event_id: event_id.clone(),
            created_at,
            retention_ms,
        };
        match self.engine.write(request, now).await? {
            Response::Apply(r) => Ok(r),
            _ => Err(unexpected("apply")),
        }
    }

    async fn head(&self, stream: &ScopedKey, now: Millis) -> Result<Option<Head>, StoreError> {
        let stream = stream.clone();
        let read = self.engine.read(move |tx| {
            let table = tx.open_table(HEADS)?;
            let head = table
                .get(stream.as_str())?
                .map(|g| head_from_row(g.value()));
            Ok(head.filter(|(_, exp)| *exp > now).map(|(h, _)| h))
        });
        Ok(read.await?)
    }

    async fn purge_expired(&self, now: Millis, limit: u64) -> Result<PurgeReport, StoreError> {
        let request = Request::PurgeExpired {
            limit,
            dedupe_window_ms: self.engine.dedupe_window_ms,
        };
        let report = match self.engine.write(request, now).await? {
            Response::Purge(r) => r,
            _ => return Err(unexpected("purge")),
        };
        // The reaped events' keys (see `seal`).
        self.engine.shred().await?;
        Ok(report)
    }

    async fn next_expiry(&self) -> Result<Option<Millis>, StoreError> {
        let read = self.engine.read(|tx| {
            let mut next: Option<Millis> = None;
            for def in [EVENT_EXPIRY, HEAD_EXPIRY] {
                let table = tx.open_table(def)?;
                if let Some((k, _)) = table.first()? {
                    let at = k.value().0;
                    next = Some(next.map_or(at, |n| n.min(at)));
                }
            }
            if let Some((k, _)) = tx.open_table(tables::INBOX_EXPIRY)?.first()? {
                let at = k.value().0;
                next = Some(next.map_or(at, |n| n.min(at)));
            }
            for at in [
                kv::next_expiry(tx, Space::Kv)?,
                kv::next_expiry(tx, Space::Claims)?,
                inbox::next_dedupe_expiry(tx)?,
            ]
            .into_iter()
            .flatten()
            {
                next = Some(next.map_or(at, |n| n.min(at)));
            }
            Ok(next)
        });
        Ok(read.await?)
    }

    async fn ready(&self) -> Result<(), StoreError> {
        Ok(self.engine.ready().await?)
    }

    fn write_stats(&self) -> WriteStats {
        self.engine.write_stats()
    }

    async fn close(&self) {
        RedbStore::close(self).await;
    }
}
