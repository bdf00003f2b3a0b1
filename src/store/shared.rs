//! The gateway inbox of `gateway.inbox = "shared"`: the events in Redis,
//! while this instance's data file (the Redis-protocol keyspace, the
//! file's own records) still answers for its disk and its writer.

use std::time::Duration;

use async_trait::async_trait;

use super::StoreError;
use super::fleet::Fleet;
use super::inbox::{
    Attempt, Cursor, DiskSpace, EraseOutcome, EventKey, EventStatus, Inbox, InboxEvent,
    IngestOutcome, KeysInMemory, Leased, ListOrder, NewEvent, RedeliverOutcome, Retention, Settle,
    SourceDue, SourceSummary, StoredJob,
};
use super::redis::RedisInbox;
use crate::clock::Millis;
use crate::domain::{CreatedAt, ScopedKey};

/// The shared inbox, with the data file beside it.
#[derive(Debug)]
pub struct SharedInbox {
    /// Where the events are.
    pub shared: RedisInbox,
    /// The data file's inbox: asked about the file's disk and writer, and
    /// to erase what it kept from before the move.
    pub file: std::sync::Arc<dyn Inbox>,
}

#[async_trait]
impl Inbox for SharedInbox {
    async fn ingest(&self, event: NewEvent, now: Millis) -> Result<IngestOutcome, StoreError> {
        self.shared.ingest(event, now).await
    }

    async fn ingest_routed(
        &self,
        event: NewEvent,
        lanes: Vec<String>,
        known_in: Vec<String>,
        filtered_ms: u64,
        now: Millis,
    ) -> Result<IngestOutcome, StoreError> {
        self.shared
            .ingest_routed(event, lanes, known_in, filtered_ms, now)
            .await
    }

    async fn knows_event(&self, event: &EventKey, now: Millis) -> Result<bool, StoreError> {
        self.shared.knows_event(event, now).await
    }

    fn precheck_duplicates(&self) -> bool {
        self.shared.precheck_duplicates()
    }

    fn written_elsewhere(&self) -> bool {
        self.shared.written_elsewhere()
    }

    async fn lease_holds(&self, event: &EventKey, lease: u64) -> Result<bool, StoreError> {
        self.shared.lease_holds(event, lease).await
    }

    fn lanes(&self) -> Option<&dyn super::lanes::Lanes> {
        self.shared.lanes()
    }

    fn lease_grace(&self) -> Option<Duration> {
        self.shared.lease_grace()
    }

    async fn renew_leases(
        &self,
        leases: Vec<(EventKey, u64)>,
        until: Millis,
        now: Millis,
    ) -> Result<Vec<Option<super::inbox::Renewal>>, StoreError> {
        self.shared.renew_leases(leases, until, now).await
    }

    fn dedupe_window(&self) -> Duration {
        self.shared.dedupe_window()
    }

    fn fleet(&self) -> Option<&dyn Fleet> {
        self.shared.fleet()
    }

    /// Ready when the data file and Redis both are.
    async fn ready(&self) -> Result<(), StoreError> {
        self.file.ready().await?;
        self.shared.ready().await
    }

    fn disk_space(&self) -> Option<DiskSpace> {
        self.file.disk_space()
    }

    fn keys_in_memory(&self) -> Option<KeysInMemory> {
        self.file.keys_in_memory()
    }

    async fn lease(
        &self,
        events: Vec<(EventKey, Millis)>,
        stale_check: Option<Retention>,
        now: Millis,
    ) -> Result<Leased, StoreError> {
        self.shared.lease(events, stale_check, now).await
    }

    async fn settle(
        &self,
        event: &EventKey,
        lease: u64,
        settle: Settle,
        retention: Retention,
        now: Millis,
    ) -> Result<(), StoreError> {
        self.shared
            .settle(event, lease, settle, retention, now)
            .await
    }

    async fn settle_attempt(
        &self,
        event: &EventKey,
        lease: u64,
        settle: Settle,
        attempt: Attempt,
        retention: Retention,
        now: Millis,
    ) -> Result<(), StoreError> {
        self.shared
            .settle_attempt(event, lease, settle, attempt, retention, now)
            .await
    }

    async fn settle_delivered(
        &self,
        event: &EventKey,
        lease: u64,
        apply: Option<(ScopedKey, ScopedKey, CreatedAt, u64)>,
        attempt: Option<Attempt>,
        retention: Retention,
        now: Millis,
    ) -> Result<(), StoreError> {
        self.shared
            .settle_delivered(event, lease, apply, attempt, retention, now)
            .await
    }

    async fn redeliver(
        &self,
        source: &str,
        event_id: &str,
        now: Millis,
    ) -> Result<RedeliverOutcome, StoreError> {
        self.shared.redeliver(source, event_id, now).await
    }

    async fn replay(
        &self,
        source: &str,
        event_id: &str,
        job: &str,
        now: Millis,
    ) -> Result<RedeliverOutcome, StoreError> {
        self.shared.replay(source, event_id, job, now).await
    }

    async fn erase(
        &self,
        source: &str,
        event_id: &str,
        retention_ms: u64,
        now: Millis,
    ) -> Result<EraseOutcome, StoreError> {
        // Events the data file kept from before the move to the shared
        // inbox (settled ones stay there until reaped) are erased too: a
        // deletion request reaches every copy.
        let shared = self
            .shared
            .erase(source, event_id, retention_ms, now)
            .await?;
        let file = self.file.erase(source, event_id, retention_ms, now).await?;
        Ok(match (shared, file) {
            (EraseOutcome::Erased, _) | (_, EraseOutcome::Erased) => EraseOutcome::Erased,
            (EraseOutcome::AlreadyErased, _) | (_, EraseOutcome::AlreadyErased) => {
                EraseOutcome::AlreadyErased
            }
            _ => EraseOutcome::NotFound,
        })
    }

    /// In Redis with the events, so every instance's job runner sees them.
    async fn put_job(&self, id: &str, record: Vec<u8>, now: Millis) -> Result<(), StoreError> {
        self.shared.put_job(id, record, now).await
    }

    async fn end_job(&self, id: &str, record: Vec<u8>, now: Millis) -> Result<(), StoreError> {
        self.shared.end_job(id, record, now).await
    }

    async fn cancel_job(&self, id: &str, now: Millis) -> Result<bool, StoreError> {
        self.shared.cancel_job(id, now).await
    }

    async fn delete_job(&self, id: &str, now: Millis) -> Result<(), StoreError> {
        self.shared.delete_job(id, now).await
    }

    async fn jobs(&self) -> Result<Vec<StoredJob>, StoreError> {
        self.shared.jobs().await
    }

    async fn purge_pending(
        &self,
        sources: Vec<String>,
        before: Millis,
        limit: u64,
        now: Millis,
    ) -> Result<u64, StoreError> {
        self.shared.purge_pending(sources, before, limit, now).await
    }

    async fn purge_settled(&self, now: Millis, limit: u64) -> Result<(u64, bool), StoreError> {
        self.shared.purge_settled(now, limit).await
    }

    async fn due_events(
        &self,
        now: Millis,
        wants: Vec<(String, usize)>,
        max_bytes: u64,
    ) -> Result<Vec<SourceDue>, StoreError> {
        self.shared.due_events(now, wants, max_bytes).await
    }

    async fn inbox_sources(&self) -> Result<Vec<(String, u64)>, StoreError> {
        self.shared.inbox_sources().await
    }

    async fn inbox_summary(&self) -> Result<Vec<SourceSummary>, StoreError> {
        self.shared.inbox_summary().await
    }

    async fn has_source(&self, source: &str) -> Result<bool, StoreError> {
        self.shared.has_source(source).await
    }

    async fn inbox_event(
        &self,
        source: &str,
        event_id: &str,
    ) -> Result<Option<InboxEvent>, StoreError> {
        self.shared.inbox_event(source, event_id).await
    }

    async fn list_events(
        &self,
        source: &str,
        status: EventStatus,
        order: ListOrder,
        after: Option<Cursor>,
        limit: usize,
    ) -> Result<(Vec<InboxEvent>, Option<Cursor>), StoreError> {
        self.shared
            .list_events(source, status, order, after, limit)
            .await
    }

    /// The data file's writer: the systemd watchdog asks about this
    /// process, and a Redis outage is no reason to restart it.
    async fn writer_responds(&self, within: Duration) -> bool {
        self.file.writer_responds(within).await
    }
}
