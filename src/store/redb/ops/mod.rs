//! Write operations, evaluated inside the writer's transaction: [`Tables`]
//! opens what a batch touches and runs each request
//! ([`Tables::execute`]).
//!
//! Each operation reads the live state, asks the pure rules in
//! [`crate::store::claims`] / [`crate::store::ordering`] what to do, and keeps
//! the expiry indexes in step with the rows. Here: the dispatch, and the
//! writes that span several concerns (a delivered gateway event moves its
//! stream head); `claims` (claims and fences), `streams` (applied events and
//! stream heads), `purge` (the reaper's deletions); the inbox's writes are
//! in `inbox`, the keyspace's in `kv`.

mod claims;
mod purge;
mod streams;

use redb::{ReadableTable, Table, WriteTransaction};

use super::counts::StatusDeltas;
use super::inbox::{InboxResponse, InboxTables};
use super::kv::KvTables;
use super::kv_index::{KvIndex, Space};
use super::record::{InboxRequest, Request};
use super::tables::{
    EVENT_EXPIRY, EVENTS, EventRow, HEAD_EXPIRY, HEADS, HeadRow, Lazy, META, META_FENCE,
    META_KV_NEXT_ID, META_WAL_SEQ, head_from_row,
};
use crate::clock::Millis;
use crate::domain::{CreatedAt, Key, Namespace, ScopedKey};
use crate::store::keyspace::KvResponse;
use crate::store::{
    ApplyResult, ClaimOutcome, DoneOutcome, ExtendOutcome, PurgeReport, ReleaseOutcome,
};

/// The answer to a [`Request`], variant for variant.
#[derive(Debug)]
pub enum Response {
    /// Answer to [`Request::Claim`].
    Claim(ClaimOutcome),
    /// Answer to [`Request::Done`].
    Done(DoneOutcome),
    /// Answer to [`Request::Release`].
    Release(ReleaseOutcome),
    /// Answer to [`Request::Extend`].
    Extend(ExtendOutcome),
    /// Answer to [`Request::Apply`].
    Apply(ApplyResult),
    /// Answer to [`Request::Purge`].
    Purge(PurgeReport),
    /// Answer to [`Request::Inbox`] and [`Request::Delivered`].
    Inbox(InboxResponse),
    /// Answer to [`Request::PurgePending`]: events deleted.
    Purged(u64),
    /// Answer to [`Request::Kv`].
    Kv(KvResponse),
}

/// What a transaction's requests did beside their answers.
#[derive(Debug, Default)]
pub struct Finished {
    /// How the inbox counts moved.
    pub deltas: StatusDeltas,
    /// The key slots it freed, to shred once it is durable (see `seal`).
    pub freed: Vec<u64>,
}

/// The tables of one write transaction, plus the fence counter.
pub struct Tables<'txn> {
    meta: Table<'txn, &'static str, u64>,
    /// Claims' rows, by row id (see [`super::kv`]).
    claims: KvTables<'txn>,
    events: Lazy<'txn, &'static str, EventRow<'static>>,
    event_expiry: Lazy<'txn, (u64, &'static str), ()>,
    heads: Lazy<'txn, &'static str, HeadRow<'static>>,
    head_expiry: Lazy<'txn, (u64, &'static str), ()>,
    inbox: InboxTables<'txn>,
    kv: KvTables<'txn>,
    kv_index: &'txn KvIndex,
    /// Last fence handed out, including in this transaction.
    fence: u64,
    /// Whether `fence` moved and must be written back.
    fence_dirty: bool,
}

impl<'txn> Tables<'txn> {
    /// The tables of `tx`, which runs batch `seq`: `meta` now (for the
    /// fence), the others on first use (see [`Lazy`]). The keyspace's
    /// changes go to `kv` as well, undoable until the writer keeps them.
    pub fn open(
        tx: &'txn WriteTransaction,
        kv: &'txn KvIndex,
        seq: u64,
    ) -> Result<Self, redb::Error> {
        let meta = tx.open_table(META)?;
        kv.begin(seq);
        let fence = meta.get(META_FENCE)?.map_or(0, |g| g.value());
        Ok(Self {
            meta,
            claims: KvTables::open(tx, kv, Space::Claims),
            events: Lazy::new(tx, EVENTS),
            event_expiry: Lazy::new(tx, EVENT_EXPIRY),
            heads: Lazy::new(tx, HEADS),
            head_expiry: Lazy::new(tx, HEAD_EXPIRY),
            inbox: InboxTables::open(tx),
            kv: KvTables::open(tx, kv, Space::Kv),
            kv_index: kv,
            fence,
            fence_dirty: false,
        })
    }

    /// Records that this transaction holds write-ahead-log batch `seq`, so
    /// whatever state of the file survives (a checkpoint, or redb's own
    /// flush when the database is dropped) says which batches it holds, and
    /// a replay never applies one twice.
    pub fn set_wal_seq(&mut self, seq: u64) -> Result<(), redb::Error> {
        self.meta.insert(META_WAL_SEQ, seq)?;
        Ok(())
    }

    /// Writes the fence counter back if it moved. Call before commit.
    pub fn finish(mut self) -> Result<Finished, redb::Error> {
        if self.fence_dirty {
            self.meta.insert(META_FENCE, self.fence)?;
        }
        if let Some(next) = self.kv_index.next_id_moved() {
            self.meta.insert(META_KV_NEXT_ID, next)?;
        }
        Ok(Finished {
            deltas: self.inbox.take_deltas(),
            freed: self.inbox.take_freed(),
        })
    }

    /// Performs one request.
    pub fn execute(&mut self, req: &Request, now: Millis) -> Result<Response, redb::Error> {
        Ok(match req {
            Request::Claim {
                key,
                ttl,
                fingerprint,
                token,
            } => Response::Claim(self.claim(key, *ttl, fingerprint, *token, now)?),
            Request::Done { key, token, ttl } => {
                Response::Done(self.done(key, *token, *ttl, None, now)?)
            }
            Request::DoneResult {
                key,
                token,
                ttl,
                result,
            } => Response::Done(self.done(key, *token, *ttl, Some(result.clone()), now)?),
            Request::Release { key, token } => Response::Release(self.release(key, *token, now)?),
            Request::Extend { key, token, ttl } => {
                Response::Extend(self.extend(key, *token, *ttl, now)?)
            }
            Request::Apply {
                stream,
                event_id,
                created_at,
                retention_ms,
            } => Response::Apply(self.apply(stream, event_id, *created_at, *retention_ms, now)?),
            Request::Purge { limit } => Response::Purge(self.purge(now, *limit, 0)?),
            Request::PurgeExpired {
                limit,
                dedupe_window_ms,
            } => Response::Purge(self.purge(now, *limit, *dedupe_window_ms)?),
            Request::Inbox(req) => Response::Inbox(self.inbox_execute(req, now)?),
            Request::Delivered { apply, settle } => {
                if let Some((stream, id, created_at, retention_ms)) = apply {
                    self.apply(stream, id, *created_at, *retention_ms, now)?;
                }
                Response::Inbox(self.inbox_execute(settle, now)?)
            }
            Request::Kv(req) => Response::Kv(self.kv.execute(req, now)?),
            Request::PurgePending {
                sources,
                before,
                limit,
            } => {
                let mut left = *limit;
                for source in sources {
                    left -= self.inbox.purge_pending(source, *before, left)?;
                }
                Response::Purged(limit - left)
            }
        })
    }

    fn inbox_execute(
        &mut self,
        req: &InboxRequest,
        now: Millis,
    ) -> Result<InboxResponse, redb::Error> {
        let heads = &*self.heads.open()?;
        let head = |source: &str, stream: &str| -> Result<Option<CreatedAt>, redb::Error> {
            let Ok(stream) = Key::parse(stream, "stream") else {
                return Ok(None);
            };
            let key = ScopedKey::new(&Namespace::Gateway(source.to_owned()), &stream);
            Ok(heads
                .get(key.as_str())?
                .map(|g| head_from_row(g.value()))
                .filter(|(_, exp)| *exp > now)
                .map(|(h, _)| h.created_at))
        };
        self.inbox.execute(req, now, &head)
    }
}
