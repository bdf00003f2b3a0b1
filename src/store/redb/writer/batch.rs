//! The transaction the writer keeps open over several batches, and running
//! one batch in it: execute, log, and undo on failure.

use std::sync::atomic::Ordering;
use std::time::Instant;

use redb::{Database, Durability, WriteTransaction};

use super::{Counters, Logged};
use crate::clock::Millis;
use crate::store::redb::counts::StatusDeltas;
use crate::store::redb::engine::Shared;
use crate::store::redb::faults::FaultPlan;
use crate::store::redb::kv_index::KvIndex;
use crate::store::redb::ops::{Finished, Response, Tables};
use crate::store::redb::record::{Lent, LoggedLent, Request};

/// The writer's write transaction, kept open over several batches until it
/// is committed (see `storage.commit_hold`). Each batch in it is logged;
/// its callers are answered once the log is synced, commit or not.
pub(super) struct Open {
    tx: WriteTransaction,
    /// When its first batch ran.
    pub(super) since: Instant,
    /// The number of its first batch.
    first: u64,
    /// Its batches in order, as logged: run again in a fresh transaction
    /// when a later batch fails and the transaction has to be dropped.
    batches: Vec<Vec<(Millis, Request)>>,
}

impl Open {
    fn begin(db: &Database, first: u64) -> Result<Self, redb::Error> {
        let mut tx = db.begin_write()?;
        tx.set_durability(Durability::None)
            .map_err(|e| redb::Error::Corrupted(e.to_string()))?;
        Ok(Self {
            tx,
            since: Instant::now(),
            first,
            batches: Vec::new(),
        })
    }

    /// The number of its last batch.
    fn last(&self) -> u64 {
        self.first + self.batches.len() as u64 - 1
    }
}

/// A batch that ran and was logged.
pub(super) struct Ran {
    pub(super) seq: u64,
    /// Each request's answer.
    pub(super) responses: Vec<Response>,
    /// Inbox counts it moved.
    pub(super) deltas: StatusDeltas,
    /// Key slots it freed, shredded once it is synced (see `seal`).
    pub(super) freed: Vec<u64>,
    /// The key slots its inserts' seals were lent (see [`Lent`]).
    pub(super) lent: Vec<LoggedLent>,
    /// Where its log record begins.
    pub(super) logged_at: u64,
}

/// Commits `open` without a sync (its batches are in the log). If that
/// fails, the keyspace index keeps their changes: its batches before the
/// last are answered (or will be) and must stay visible; the caller marks
/// the store unhealthy, and the reopen rebuilds the index from the file and
/// the log (a read that saw the last batch waits for its sync, which comes
/// only if it is replayed).
pub(super) fn commit(shared: &Shared, counters: &Counters, open: Open) -> Result<(), redb::Error> {
    let last = open.last();
    // Readers that see these batches wait for their sync (see `syncer`).
    shared.watermark.show(last);
    match open.tx.commit() {
        Ok(()) => {
            shared.kv.keep();
            // Counted before readers waiting for it wake, so a reader that
            // made the commit sees it counted.
            counters.commits.fetch_add(1, Ordering::Relaxed);
            shared.watermark.committed(last);
            Ok(())
        }
        Err(e) => {
            // A reader may have taken one of these batches' numbers as one
            // it has to wait for; the reopen that follows tells it to retry.
            Err(redb::Error::Io(std::io::Error::other(format!(
                "the commit failed: {e}"
            ))))
        }
    }
}

/// Runs a batch in the open transaction (begun if there is none) and logs
/// it; the writer then syncs the record. On an error nothing in the batch took
/// effect: the transaction is dropped, and the batches before it in the
/// transaction run again in a fresh one (if that fails too, the error is
/// a disk fault and the reopen replays them from the log).
pub(super) fn run_batch(
    db: &Database,
    log: &mut Logged,
    mut ops: Vec<(Millis, Request)>,
    shared: &Shared,
    open: &mut Option<Open>,
    faults: Option<&FaultPlan>,
) -> Result<Ran, redb::Error> {
    let seq = log.seq + 1;
    let mut o = match open.take() {
        Some(o) => o,
        None => Open::begin(db, seq)?,
    };
    let logged_at = log.segments.active.len();
    match run_logged(&o.tx, log, seq, &ops, &shared.kv, faults) {
        Ok((responses, Finished { deltas, freed })) => {
            log.seq = seq;
            // Logged: the slots its seals were lent go with its answers.
            let lent = ops
                .iter_mut()
                .filter_map(|(_, r)| r.take_lent())
                .map(Lent::logged)
                .collect();
            o.batches.push(ops);
            *open = Some(o);
            Ok(Ran {
                seq,
                responses,
                deltas,
                freed,
                lent,
                logged_at,
            })
        }
        Err(e) => {
            let Open {
                tx,
                since,
                first,
                batches,
            } = o;
            drop(tx);
            if shared.kv.rollback(!batches.is_empty()) {
                shared.watermark.abandoned();
            }
            if !batches.is_empty() {
                // If this fails too, keyspace readers wait until the reopen
                // rebuilds the map.
                *open = Some(redo(db, &shared.kv, since, first, batches).map_err(|again| {
                    redb::Error::Io(std::io::Error::other(format!(
                        "a batch failed ({e}), and running the ones before it again failed too: {again}"
                    )))
                })?);
                shared.kv.redone();
            }
            Err(e)
        }
    }
}

/// Runs batch `seq` in `tx` and logs it.
fn run_logged(
    tx: &WriteTransaction,
    log: &mut Logged,
    seq: u64,
    ops: &[(Millis, Request)],
    kv: &KvIndex,
    faults: Option<&FaultPlan>,
) -> Result<(Vec<Response>, Finished), redb::Error> {
    let (responses, finished) = apply(tx, kv, seq, ops)?;
    if faults.is_some_and(FaultPlan::trip_batch) {
        return Err(redb::Error::Corrupted(
            "injected fault: the batch failed".into(),
        ));
    }
    let refs: Vec<(Millis, &Request)> = ops.iter().map(|(now, r)| (*now, r)).collect();
    log.segments.active.append(seq, &refs)?;
    Ok((responses, finished))
}

/// Runs batch `seq`'s requests in `tx` and records it as the last batch the
/// file holds: the answers, how the inbox counts moved, and the key slots
/// it freed.
pub(super) fn apply(
    tx: &WriteTransaction,
    kv: &KvIndex,
    seq: u64,
    ops: &[(Millis, Request)],
) -> Result<(Vec<Response>, Finished), redb::Error> {
    let mut tables = Tables::open(tx, kv, seq)?;
    let mut responses = Vec::with_capacity(ops.len());
    for (now, request) in ops {
        responses.push(tables.execute(request, *now)?);
    }
    tables.set_wal_seq(seq)?;
    Ok((responses, tables.finish()?))
}

/// A fresh transaction holding `batches` (numbered from `first`) again,
/// after a later batch failed and the one that held them was dropped.
fn redo(
    db: &Database,
    kv: &KvIndex,
    since: Instant,
    first: u64,
    batches: Vec<Vec<(Millis, Request)>>,
) -> Result<Open, redb::Error> {
    let mut o = Open::begin(db, first)?;
    o.since = since;
    for (seq, ops) in (first..).zip(&batches) {
        // Their inbox counts and freed slots were taken when they first
        // ran.
        let _ = apply(&o.tx, kv, seq, ops)?;
    }
    o.batches = batches;
    Ok(o)
}
