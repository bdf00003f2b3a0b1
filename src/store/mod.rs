//! Storage: what the rest of the crate asks of it, and the backends.
//!
//! - Claims, ordering and expiry: the [`Store`] trait here, with the pure
//!   rules every backend shares in [`claims`] and [`ordering`].
//! - The gateway inbox: the [`inbox::Inbox`] trait and its vocabulary;
//!   with the shared inbox, what its instances agree on besides the
//!   events: [`fleet::Fleet`] (alerts) and [`lanes::Lanes`] (delivery
//!   lanes' rate limits, holds and breakers), reached through the inbox.
//! - The Redis-protocol keyspace: [`keyspace`].
//! - [`open()`]: opens what the settings name and hands out a handle for
//!   each ([`Opened`]). Nothing outside `store` names a backend.
//! - The backends: [`redb`] (the data file: one engine under all three
//!   handles) and, with the `redis` feature, `redis` (claims and ordering
//!   shared by several instances).
//!
//! Every method takes `now` (Unix milliseconds) from the caller's clock, so a
//! store never reads time itself: the same inputs give the same answers, which
//! is what lets one conformance suite and a model test cover every backend.
//!
//! Invariant shared by all backends: a record whose `expires_at_ms <= now`
//! reads as absent everywhere, whether or not the reaper has removed it yet.

pub mod claims;
pub mod fleet;
pub mod inbox;
pub mod keyspace;
pub mod lanes;
#[cfg(feature = "redis")]
pub mod move_inbox;
mod open;
pub mod ordering;
pub mod redb;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "redis")]
mod shared;

use std::sync::Arc;

use async_trait::async_trait;
use serde::Serialize;

use crate::clock::Millis;
use crate::domain::{ClaimResult, CreatedAt, Fingerprint, ScopedKey, Token, Ttl};

pub use claims::{
    ClaimOutcome, ClaimRecord, ClaimState, ClaimView, DoneOutcome, ExtendOutcome, ReleaseOutcome,
};
pub use ordering::{ApplyOutcome, ApplyResult, Head};

pub use self::open::{Opened, open};
pub use self::redb::{CommitMetrics, inbox_sources_in_file};

/// Called on each HTTP worker thread as it starts, on its runtime: the
/// answers to its requests' writes come back with one wake a batch (see
/// the embedded store's `answers`). Needs a local runtime or a `LocalSet`,
/// as actix's workers have.
pub fn on_http_worker_start() {
    self::redb::answers::install();
}

/// Why a store could not answer. Refusals (busy, not owner, …) are not
/// errors: they are outcomes.
///
/// The variant says what it means for the caller (retry later, or not);
/// its cause, the error's [`source`](std::error::Error::source), says why.
/// Its own message does not repeat the cause: [`StoreError::chain`] shows
/// both, and is what logs, RESP error replies and an event's `last_error`
/// show (`store unavailable: the data file cannot be written now …`).
#[derive(Debug, Clone)]
pub enum StoreError {
    /// The store cannot be reached now; retrying later may work (HTTP 503).
    Unavailable(Cause),
    /// The store failed; the operation did not take effect (HTTP 500).
    Failed(Cause),
    /// Free disk space is below the watermark (`storage.min_free_bytes`):
    /// writes are refused, nothing was changed, and they resume by
    /// themselves once space frees (HTTP 507 with `Retry-After`).
    LowSpace {
        /// Bytes free on the data file's filesystem.
        free: u64,
        /// The watermark.
        floor: u64,
    },
    /// The embedded store's keys in memory take
    /// `storage.max_key_memory_bytes`: a client's write that would add one
    /// (a claim, a `SET`) is refused, nothing was changed, and such writes
    /// resume once the reaper deletes expired keys (HTTP 507 with
    /// `Retry-After`).
    KeysFull {
        /// Bytes they take, estimated.
        held: u64,
        /// The cap.
        cap: u64,
    },
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Unavailable(_) => f.write_str("store unavailable"),
            StoreError::Failed(_) => f.write_str("storage failure"),
            StoreError::LowSpace { free, floor } => write!(
                f,
                "disk space low: {free} bytes free, below storage.min_free_bytes ({floor}); \
                 writes resume once space frees"
            ),
            StoreError::KeysFull { held, cap } => write!(
                f,
                "keys in memory take about {held} bytes, at storage.max_key_memory_bytes \
                 ({cap}); new keys are refused until expired ones are reaped"
            ),
        }
    }
}

impl std::error::Error for StoreError {
    /// The cause itself (not the `Arc` around it), so it can be downcast.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StoreError::Unavailable(cause) | StoreError::Failed(cause) => Some(&**cause),
            StoreError::LowSpace { .. } | StoreError::KeysFull { .. } => None,
        }
    }
}

/// What a [`StoreError`] keeps as its cause. Shared, so the error stays
/// `Clone`: every caller in a failed batch gets the same one.
pub type Cause = Arc<dyn std::error::Error + Send + Sync + 'static>;

impl StoreError {
    /// [`StoreError::Unavailable`] because of `cause` (an error, or a
    /// message).
    pub fn unavailable(cause: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self::Unavailable(Arc::from(cause.into()))
    }

    /// [`StoreError::Failed`] because of `cause` (an error, or a message).
    pub fn failed(cause: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self::Failed(Arc::from(cause.into()))
    }

    /// The error and each of its causes, joined by `: ` on one line.
    pub fn chain(&self) -> impl std::fmt::Display + '_ {
        Chain(self)
    }
}

/// An error with its sources, as [`StoreError::chain`] shows them.
struct Chain<'a>(&'a (dyn std::error::Error + Send + Sync + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(e) = cause {
            write!(f, ": {e}")?;
            cause = e.source();
        }
        Ok(())
    }
}

/// What one reaper pass removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PurgeReport {
    /// Expired claims removed.
    pub claims: u64,
    /// Applied-event records removed after their retention.
    pub events: u64,
    /// Stream heads removed after their retention.
    pub heads: u64,
    /// Settled gateway events removed after their retention.
    pub inbox: u64,
    /// Expired keys of the Redis-protocol keyspace removed.
    pub kv: u64,
    /// Dedupe records of reaped gateway events removed once their
    /// `gateway.dedupe_window` passed.
    pub dedupe: u64,
    /// True when the pass stopped at its limit with more expired records left.
    pub more: bool,
}

impl PurgeReport {
    /// Records removed in all.
    pub fn total(&self) -> u64 {
        self.claims + self.events + self.heads + self.inbox + self.kv + self.dedupe
    }
}

/// Counters that show group commit at work.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct WriteStats {
    /// Write operations answered.
    pub operations: u64,
    /// Commits made for them (with the embedded store, redb commits; several
    /// batches may share one).
    pub commits: u64,
}

/// Claims, ordering and expiry: the behaviour docs/claims.md specifies, identical
/// across backends.
#[async_trait]
pub trait Store: Send + Sync + std::fmt::Debug + 'static {
    /// Claims `key` for `ttl`: absent → processing with a new token and fence.
    async fn claim(
        &self,
        key: &ScopedKey,
        ttl: Ttl,
        fingerprint: Option<Fingerprint>,
        now: Millis,
    ) -> Result<ClaimOutcome, StoreError>;

    /// Records that the work for `key` finished; the record lives for `ttl`
    /// and keeps `result` (returned to later claims and reads of the key).
    async fn done_with(
        &self,
        key: &ScopedKey,
        token: Token,
        ttl: Ttl,
        result: Option<ClaimResult>,
        now: Millis,
    ) -> Result<DoneOutcome, StoreError>;

    /// [`Store::done_with`] without a result.
    async fn done(
        &self,
        key: &ScopedKey,
        token: Token,
        ttl: Ttl,
        now: Millis,
    ) -> Result<DoneOutcome, StoreError> {
        self.done_with(key, token, ttl, None, now).await
    }

    /// Gives up a claim so the next delivery can try again.
    async fn release(
        &self,
        key: &ScopedKey,
        token: Token,
        now: Millis,
    ) -> Result<ReleaseOutcome, StoreError>;

    /// Moves a held claim's expiry to `now + ttl`.
    async fn extend(
        &self,
        key: &ScopedKey,
        token: Token,
        ttl: Ttl,
        now: Millis,
    ) -> Result<ExtendOutcome, StoreError>;

    /// The live record for `key`, without its token.
    async fn get(&self, key: &ScopedKey, now: Millis) -> Result<Option<ClaimView>, StoreError>;

    /// Applies `event_id` to `stream` unless it is a duplicate or stale.
    /// Records live for `retention_ms` after they were written.
    async fn apply(
        &self,
        stream: &ScopedKey,
        event_id: &ScopedKey,
        created_at: CreatedAt,
        retention_ms: u64,
        now: Millis,
    ) -> Result<ApplyResult, StoreError>;

    /// The live head of `stream`.
    async fn head(&self, stream: &ScopedKey, now: Millis) -> Result<Option<Head>, StoreError>;

    /// Deletes at most `limit` expired records, oldest expiry first.
    async fn purge_expired(&self, now: Millis, limit: u64) -> Result<PurgeReport, StoreError>;

    /// The earliest expiry of any stored record, if any.
    async fn next_expiry(&self) -> Result<Option<Millis>, StoreError>;

    /// Ok when the store can serve requests.
    async fn ready(&self) -> Result<(), StoreError>;

    /// Group-commit counters since the store was opened.
    fn write_stats(&self) -> WriteStats;

    /// Finishes queued writes and releases the backend's resources. Later
    /// calls answer [`StoreError::Unavailable`].
    async fn close(&self);
}
