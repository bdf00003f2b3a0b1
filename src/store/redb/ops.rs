//! Write operations, evaluated inside the writer's transaction.
//!
//! Each operation reads the live state, asks the pure rules in
//! [`crate::store::claims`] / [`crate::store::ordering`] what to do, and keeps
//! the expiry indexes in step with the rows.

use redb::{ReadableTable, Table, Value, WriteTransaction};

use super::counts::StatusDeltas;
use super::inbox::{InboxResponse, InboxTables};
use super::kv::KvTables;
use super::kv_index::KvIndex;
use super::record::{InboxRequest, Request};
use super::tables::{
    CLAIM_EXPIRY, CLAIMS, ClaimRow, EVENT_EXPIRY, EVENTS, EventRow, HEAD_EXPIRY, HEADS, HeadRow,
    Lazy, META, META_FENCE, META_KV_NEXT_ID, META_WAL_SEQ, claim_from_row, claim_to_row,
    event_from_row, event_to_row, head_from_row,
};
use crate::clock::Millis;
use crate::domain::{CreatedAt, Key, Namespace, ScopedKey};
use crate::store::claims::{self, Change, ClaimRecord};
use crate::store::keyspace::KvResponse;
use crate::store::ordering::{self, EventRecord};
use crate::store::{
    ApplyResult, ClaimOutcome, DoneOutcome, ExtendOutcome, Head, PurgeReport, ReleaseOutcome,
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

/// The tables of one write transaction, plus the fence counter.
pub struct Tables<'txn> {
    meta: Table<'txn, &'static str, u64>,
    claims: Lazy<'txn, &'static str, ClaimRow<'static>>,
    claim_expiry: Lazy<'txn, (u64, &'static str), ()>,
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
            claims: Lazy::new(tx, CLAIMS),
            claim_expiry: Lazy::new(tx, CLAIM_EXPIRY),
            events: Lazy::new(tx, EVENTS),
            event_expiry: Lazy::new(tx, EVENT_EXPIRY),
            heads: Lazy::new(tx, HEADS),
            head_expiry: Lazy::new(tx, HEAD_EXPIRY),
            inbox: InboxTables::open(tx),
            kv: KvTables::open(tx, kv),
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
    pub fn finish(mut self) -> Result<StatusDeltas, redb::Error> {
        if self.fence_dirty {
            self.meta.insert(META_FENCE, self.fence)?;
        }
        if let Some(next) = self.kv_index.next_id_moved() {
            self.meta.insert(META_KV_NEXT_ID, next)?;
        }
        Ok(self.inbox.take_deltas())
    }

    /// Performs one request.
    pub fn execute(&mut self, req: &Request, now: Millis) -> Result<Response, redb::Error> {
        Ok(match req {
            Request::Claim {
                key,
                ttl,
                fingerprint,
                token,
            } => {
                let stored = self.load_claim(key)?;
                let live = stored.as_ref().filter(|r| !r.is_expired(now));
                let fence = &mut self.fence;
                let dirty = &mut self.fence_dirty;
                let (outcome, change) =
                    claims::claim(live, *ttl, fingerprint.clone(), now, *token, || {
                        *fence += 1;
                        *dirty = true;
                        *fence
                    });
                self.change_claim(key, stored.as_ref(), change)?;
                Response::Claim(outcome)
            }
            Request::Done { key, token, ttl } => {
                let stored = self.load_claim(key)?;
                let live = stored.as_ref().filter(|r| !r.is_expired(now));
                let fence = &mut self.fence;
                let dirty = &mut self.fence_dirty;
                let (outcome, change) = claims::done(live, *token, *ttl, now, || {
                    *fence += 1;
                    *dirty = true;
                    *fence
                });
                self.change_claim(key, stored.as_ref(), change)?;
                Response::Done(outcome)
            }
            Request::Release { key, token } => {
                let stored = self.load_claim(key)?;
                let live = stored.as_ref().filter(|r| !r.is_expired(now));
                let (outcome, change) = claims::release(live, *token);
                self.change_claim(key, stored.as_ref(), change)?;
                Response::Release(outcome)
            }
            Request::Extend { key, token, ttl } => {
                let stored = self.load_claim(key)?;
                let live = stored.as_ref().filter(|r| !r.is_expired(now));
                let (outcome, change) = claims::extend(live, *token, *ttl, now);
                self.change_claim(key, stored.as_ref(), change)?;
                Response::Extend(outcome)
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

    fn load_claim(&mut self, key: &ScopedKey) -> Result<Option<ClaimRecord>, redb::Error> {
        Ok(self
            .claims
            .open()?
            .get(key.as_str())?
            .map(|g| claim_from_row(g.value())))
    }

    /// Applies `change`; `stored` is the row as stored (expired or not), whose
    /// index entry must go when the row is replaced or removed.
    fn change_claim(
        &mut self,
        key: &ScopedKey,
        stored: Option<&ClaimRecord>,
        change: Change,
    ) -> Result<(), redb::Error> {
        let k = key.as_str();
        match change {
            Change::Keep => {}
            Change::Put(new) => {
                if let Some(old) = stored {
                    self.claim_expiry.open()?.remove((old.expires_at_ms, k))?;
                }
                self.claims.open()?.insert(k, claim_to_row(&new))?;
                self.claim_expiry
                    .open()?
                    .insert((new.expires_at_ms, k), ())?;
            }
            Change::Delete => {
                if let Some(old) = stored {
                    self.claim_expiry.open()?.remove((old.expires_at_ms, k))?;
                }
                self.claims.open()?.remove(k)?;
            }
        }
        Ok(())
    }

    fn apply(
        &mut self,
        stream: &ScopedKey,
        event_id: &ScopedKey,
        created_at: CreatedAt,
        retention_ms: u64,
        now: Millis,
    ) -> Result<ApplyResult, redb::Error> {
        let stored_event = self
            .events
            .open()?
            .get(event_id.as_str())?
            .map(|g| event_from_row(g.value()));
        let seen = stored_event.as_ref().is_some_and(|e| e.expires_at_ms > now);
        let stored_head = self
            .heads
            .open()?
            .get(stream.as_str())?
            .map(|g| head_from_row(g.value()));
        let live_head = stored_head
            .as_ref()
            .filter(|(_, exp)| *exp > now)
            .map(|(h, _)| h.clone());
        let decision = ordering::decide(seen, live_head.as_ref(), created_at);
        let expires_at_ms = now.saturating_add(retention_ms);
        if let Some(outcome) = decision.record {
            if let Some(old) = &stored_event {
                self.event_expiry
                    .open()?
                    .remove((old.expires_at_ms, event_id.as_str()))?;
            }
            let record = EventRecord {
                stream: stream.clone(),
                created_at,
                applied_at_ms: now,
                expires_at_ms,
                outcome,
            };
            self.events
                .open()?
                .insert(event_id.as_str(), event_to_row(&record))?;
            self.event_expiry
                .open()?
                .insert((expires_at_ms, event_id.as_str()), ())?;
        }
        let head = if decision.move_head {
            if let Some((_, old_exp)) = &stored_head {
                self.head_expiry
                    .open()?
                    .remove((*old_exp, stream.as_str()))?;
            }
            self.heads.open()?.insert(
                stream.as_str(),
                (created_at.unix_nanos(), event_id.as_str(), expires_at_ms),
            )?;
            self.head_expiry
                .open()?
                .insert((expires_at_ms, stream.as_str()), ())?;
            Some(Head {
                created_at,
                event_id: event_id.clone(),
            })
        } else {
            live_head
        };
        Ok(ApplyResult {
            outcome: decision.outcome,
            head,
        })
    }

    /// Deletes up to `limit` expired rows, claims first (then applied
    /// events, stream heads, keyspace keys, settled inbox events, dedupe
    /// records of reaped inbox events), each table in expiry order. Reads
    /// only index entries that are due. An inbox event received less than
    /// `dedupe_window_ms` ago leaves a dedupe record (written, not counted:
    /// at most one per event deleted).
    fn purge(
        &mut self,
        now: Millis,
        limit: u64,
        dedupe_window_ms: u64,
    ) -> Result<PurgeReport, redb::Error> {
        let mut report = PurgeReport::default();
        let mut budget = limit;
        let claims = self.claims.open()?;
        report.claims = purge_table(self.claim_expiry.open()?, now, budget, |k, at| {
            remove_expiring(claims, k, at, |r| r.3)
        })?;
        budget -= report.claims;
        let events = self.events.open()?;
        report.events = purge_table(self.event_expiry.open()?, now, budget, |k, at| {
            remove_expiring(events, k, at, |r| r.3)
        })?;
        budget -= report.events;
        let heads = self.heads.open()?;
        report.heads = purge_table(self.head_expiry.open()?, now, budget, |k, at| {
            remove_expiring(heads, k, at, |r| r.2)
        })?;
        budget -= report.heads;
        report.kv = self.kv.purge(now, budget)?;
        budget -= report.kv;
        report.inbox = self.inbox.purge(now, budget, dedupe_window_ms)?;
        budget -= report.inbox;
        report.dedupe = self.inbox.purge_dedupe(now, budget)?;
        let mut more = self.inbox.has_due_expiry(now)? || self.kv.has_due(now)?;
        for index in [
            &mut self.claim_expiry,
            &mut self.event_expiry,
            &mut self.head_expiry,
        ] {
            more |= index
                .open()?
                .first()?
                .is_some_and(|(k, _)| k.value().0 <= now);
        }
        report.more = more;
        Ok(report)
    }
}

/// Removes up to `limit` due entries of one expiry index, calling `remove_row`
/// for each so the indexed row goes too.
///
/// The due entries are the index's first ones (it sorts by expiry): one
/// cursor pass takes them off. Their rows then go in key order, so walks to
/// neighbouring keys share the upper pages of the table.
fn purge_table(
    index: &mut Table<'_, (u64, &'static str), ()>,
    now: Millis,
    limit: u64,
    mut remove_row: impl FnMut(&str, Millis) -> Result<(), redb::Error>,
) -> Result<u64, redb::Error> {
    if limit == 0 {
        return Ok(0);
    }
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let mut due: Vec<(String, u64)> = Vec::new();
    let mut taken = index.extract_from_if(..(now.saturating_add(1), ""), |_, _| true)?;
    for entry in taken.by_ref().take(limit) {
        let (k, _) = entry?;
        let (at, key) = k.value();
        due.push((key.to_owned(), at));
    }
    taken.close()?;
    due.sort_unstable();
    for (key, at) in &due {
        remove_row(key, *at)?;
    }
    Ok(due.len() as u64)
}

/// Removes `key`'s row if it still expires at `at`: an index entry is never
/// trusted over its row. One walk of the table: the row is taken out, and
/// put back in the rare case that it was rewritten with another expiry.
fn remove_expiring<V: Value + 'static>(
    table: &mut Table<'_, &'static str, V>,
    key: &str,
    at: Millis,
    expires_at: impl for<'a> Fn(V::SelfType<'a>) -> u64,
) -> Result<(), redb::Error> {
    let rewritten = match table.remove(key)? {
        Some(old) if expires_at(old.value()) != at => {
            Some(V::as_bytes(&old.value()).as_ref().to_vec())
        }
        _ => None,
    };
    if let Some(bytes) = rewritten {
        table.insert(key, V::from_bytes(&bytes))?;
    }
    Ok(())
}
