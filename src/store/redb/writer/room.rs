//! Before a batch runs: room on the disk for it (see [`space`]). A batch
//! is run only as far as the disk has room for it and for a checkpoint of
//! everything logged; the rest is answered `LowSpace` at once, having
//! changed nothing. Clients' writes stop at the watermark; the engine's own
//! upkeep (a delivery's lease and outcome, the reaper) goes on down to half
//! of it, so deliveries finish and the reaper frees room.
//!
//! And room in memory: at `storage.max_key_memory_bytes` (see
//! `key_memory`), expired keys are deleted first, then clients' writes
//! that would add a key are answered `KeysFull` at once.

use crate::store::redb::error::EngineError;
use crate::store::redb::kv_index::Space;
use crate::store::redb::ops::Response;
use crate::store::redb::space;
use crate::store::redb::wal::GROW;

use super::{Reply, Writer};
use crate::clock::Millis;
use crate::store::redb::record::Request;

impl Writer<'_> {
    /// Keeps the disk from filling: checkpoints first when what the log
    /// holds would no longer fit in the data file, then refuses the writes
    /// of the batch there is no room for.
    pub(super) fn make_room(&mut self) {
        // The shared state outlives this borrow of the writer, so the
        // batch can be sifted while `space` is in use.
        let shared = self.shared;
        let space = &shared.space;
        let floor = space.floor();
        let mut free = space.free();
        let total: u64 = self.batch.iter().map(|(r, _, _)| r.estimated_bytes()).sum();
        // What a checkpoint would write: the batches in the segment appended
        // to (the other's are in the file's pages since their checkpoint).
        let logged = self.log.as_ref().map_or(0, |l| l.segments.active.len());
        // What the log holds would crowd out this batch: checkpoint it into
        // the file first, while it still fits.
        let crowded = !space::admits(free, floor, logged, total);
        if (crowded || space::checkpoint_first(free, floor, logged))
            && self
                .log
                .as_ref()
                .is_some_and(|l| !l.segments.active.is_empty())
            && self.db.is_some()
        {
            self.commit_open();
            if self.shared.is_healthy() && self.checkpoint_now("space") {
                free = space.read();
                // Low on room: the zeros written ahead of the log are given
                // back (the log grows again, a little at a time). Only
                // after a checkpoint that was made: the log holds what a
                // failed one did not make durable.
                if free < floor.saturating_mul(2)
                    && let Some(log) = self.log.as_mut()
                    && log.segments.active.capacity() + log.segments.spare.capacity() > 0
                    && log.segments.start_over().is_ok()
                {
                    free = space.read();
                }
            }
        }
        let logged = self.log.as_ref().map_or(0, |l| l.segments.active.len());
        space.set_logged(logged.saturating_add(total));
        if let Some(log) = self.log.as_mut() {
            let growth = space::log_growth(GROW, free, floor);
            log.segments.active.set_growth(growth);
            log.segments.spare.set_growth(growth);
        }
        // The common case, far from the watermark: the whole batch fits.
        if space::admits(free, floor, logged, total) {
            space.set_low(false);
            return;
        }
        let mut taken = 0u64;
        let refused = self.sift(|request, _| {
            let bytes = request.estimated_bytes();
            let floor_here = if request.is_upkeep() {
                floor / 2
            } else {
                floor
            };
            let admitted = space::admits(
                free.saturating_sub(taken),
                floor_here,
                logged.saturating_add(taken),
                bytes,
            );
            if admitted {
                taken += bytes;
            } else if !request.is_upkeep() {
                space.refused(bytes);
            }
            admitted
        });
        // Whether a client's next write would be taken.
        space.set_logged(logged.saturating_add(taken));
        // Refusing while a client's write (the largest refused) would not
        // be taken.
        let low = !space.takes_a_write(free.saturating_sub(taken));
        space.set_low(low);
        for reply in refused {
            let _ = reply.send(Err(EngineError::LowSpace { free, floor }));
        }
    }
}

/// Fewest records a reclaim at the cap deletes (the reaper's default
/// batch).
const RECLAIM_LEAST: u64 = 100;
/// Most: a reclaim holds the batch behind it about as long as one of the
/// reaper's batches of the largest size.
const RECLAIM_MOST: u64 = 1000;
/// After a reclaim that freed nothing, the wait before the next (ms of
/// the callers' clock).
const RECLAIM_AGAIN_MS: u64 = 100;

impl Writer<'_> {
    /// Keeps the in-memory index within `storage.max_key_memory_bytes`: at
    /// the cap, clients' writes that would grow it (see
    /// [`Request::key_growth`](crate::store::redb::record::Request::key_growth))
    /// are answered `KeysFull` at once, having changed nothing; the rest
    /// run (a second claim of a held key, done of a claim, release,
    /// extend, deletes, the gateway's own claims, the reaper's purge,
    /// which makes room). The index passes the cap by one write's key at
    /// most.
    pub(super) fn cap_keys(&mut self) {
        // At most what the batch's writes would add, were all their keys
        // new: nothing for a batch of other writes (no index read).
        let most: u64 = self
            .batch
            .iter()
            .filter_map(|(r, _, _)| r.key_growth())
            .map(|g| g.most() as u64)
            .sum();
        if most == 0 {
            return;
        }
        let shared = self.shared;
        let cap = self.opts.max_key_memory_bytes;
        let mut held = self.held_keys();
        // Near the cap: expired keys the reaper has not deleted yet go
        // first, so they never crowd out live ones.
        if held.saturating_add(most) >= cap && self.reclaim(held) {
            held = self.held_keys();
        }
        if held >= cap && !self.keys_full {
            self.keys_full = true;
            tracing::warn!(
                held,
                cap,
                "keys in memory at storage.max_key_memory_bytes: clients' claims and SETs of new keys answer 507 (-OOM) until keys expire or are deleted"
            );
        } else if self.keys_full && held < cap / 10 * 9 {
            self.keys_full = false;
            tracing::info!(
                held,
                cap,
                "keys in memory below 90 % of storage.max_key_memory_bytes again"
            );
        }
        // Far from the cap, even if every write added its key: all run.
        if held.saturating_add(most) < cap {
            return;
        }
        let ix = shared.kv.read();
        // Near it: each write is counted by what it adds (a key already
        // held, a second claim of it, a SET no longer than its value, add
        // nothing), and the ones that add are refused once the cap is
        // reached, this batch's additions included.
        let mut added = 0u64;
        let refused = self.sift(|request, now| {
            let adds = request
                .key_growth()
                .map_or(0, |g| g.added(ix.get(g.space, g.key), now) as u64);
            let taken = adds == 0 || held.saturating_add(added) < cap;
            if taken {
                added += adds;
            }
            taken
        });
        drop(ix);
        for reply in refused {
            let _ = reply.send(Err(EngineError::KeysFull { held, cap }));
        }
    }

    /// The memory the keys of the index take (estimated).
    fn held_keys(&self) -> u64 {
        let ix = self.shared.kv.read();
        (ix.bytes(Space::Claims) + ix.bytes(Space::Kv)) as u64
    }

    /// At the cap, before the batch: deletes expired records ahead of it,
    /// as the reaper would (in its order: claims, applied events, stream
    /// heads, Redis-protocol keys, settled inbox events; each table in
    /// expiry order), up to twice as many as the batch's writes could add
    /// keys, [`RECLAIM_LEAST`] to [`RECLAIM_MOST`]. It is a purge of its
    /// own, logged and synced like the reaper's, at the batch's earliest
    /// clock reading (nothing any of its writes still sees as live goes).
    /// So short-lived keys written faster than the reaper's share of the
    /// writer deletes them do not fill the cap while few are live. The
    /// reaper's next pass shreds the keys of any sealed events it deleted
    /// (see `seal`). After one that deleted nothing, none is tried for
    /// [`RECLAIM_AGAIN_MS`]: a cap reached by live keys costs no purge per
    /// batch; after one that deleted other records but no key, the next
    /// batch goes on from there. A purge that fails (the disk) refuses the
    /// batch: nothing runs before the file is reopened. Whether the keys
    /// take less memory than `held` now.
    fn reclaim(&mut self, held: u64) -> bool {
        let Some(now) = self.batch.iter().map(|(_, now, _)| *now).min() else {
            return false;
        };
        if self.reclaim_after.is_some_and(|t| now < t) {
            return false;
        }
        let adding = self
            .batch
            .iter()
            .filter(|(r, _, _)| r.key_growth().is_some())
            .count() as u64;
        let limit = (adding * 2).clamp(RECLAIM_LEAST, RECLAIM_MOST);
        let (reply, mut answer) = Reply::direct();
        let purge = Request::PurgeExpired {
            limit,
            dedupe_window_ms: u64::try_from(self.opts.dedupe_window.as_millis())
                .unwrap_or(u64::MAX),
        };
        let clients = std::mem::replace(&mut self.batch, vec![(purge, now, reply)]);
        self.run_collected();
        self.batch = clients;
        if !self.shared.is_healthy() {
            for (_, _, reply) in self.batch.drain(..) {
                let _ = reply.send(Err(EngineError::DiskRefused));
            }
            return false;
        }
        let deleted = match answer.try_recv() {
            // Synced and answered before `run_collected` returned.
            Ok(Ok(Response::Purge(report))) => report.total(),
            // Synced on the syncer's own thread (one CPU), not answered
            // yet: whether the index lost keys.
            Err(tokio::sync::oneshot::error::TryRecvError::Empty) => {
                u64::from(self.held_keys() < held)
            }
            _ => 0,
        };
        self.reclaim_after = (deleted == 0).then(|| now.saturating_add(RECLAIM_AGAIN_MS));
        self.held_keys() < held
    }

    /// Keeps the batch's writes that `keep` takes, in their order, and
    /// returns the replies of the others.
    fn sift(&mut self, mut keep: impl FnMut(&Request, Millis) -> bool) -> Vec<Reply> {
        let mut kept = Vec::with_capacity(self.max_batch);
        let mut refused = Vec::new();
        for (request, now, reply) in self.batch.drain(..) {
            if keep(&request, now) {
                kept.push((request, now, reply));
            } else {
                refused.push(reply);
            }
        }
        self.batch = kept;
        refused
    }
}
