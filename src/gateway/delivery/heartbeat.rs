//! Lease renewal where several instances lease from one inbox (the shared
//! inbox, `gateway.lease_grace`): a lease lasts the grace, and a live
//! instance renews every lease it holds (events in flight and events held
//! ahead) every quarter of it, the way a Kafka consumer keeps its session.
//! However long a delivery takes, a live instance keeps its events; a dead
//! one loses them to the others within the grace of its last renewal,
//! whatever `forward_timeout` is.
//!
//! A lease the inbox no longer renews (it ran out while this process was
//! frozen or cut off from Redis, and another instance may have taken the
//! event) is forgotten: a turn that has not sent yet asks the inbox first
//! when its lease was last confirmed long ago ([`Dispatcher::lease_live`]),
//! and a turn that already sent settles under the old lease generation,
//! which the inbox ignores (the fence), so it never undoes what another
//! instance did.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::Dispatcher;
use super::backoff::millis;
use crate::clock::Millis;
use crate::store::inbox::{EventKey, Renewal};

/// A lease this process holds.
#[derive(Debug)]
struct Held {
    key: EventKey,
    /// Its generation (the fence).
    lease: u64,
    /// When the inbox last confirmed it (leased or renewed), by the clock.
    confirmed: Millis,
}

/// The leases this process holds, by source and event id.
#[derive(Debug, Default)]
pub(super) struct Leases {
    held: Mutex<HashMap<(String, String), Held>>,
}

impl Leases {
    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Held>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records a lease the inbox just gave (or renewed) at `now`.
    pub(super) fn hold(&self, key: EventKey, lease: u64, now: Millis) {
        let id = (key.source.clone(), key.event_id.clone());
        self.held().insert(
            id,
            Held {
                key,
                lease,
                confirmed: now,
            },
        );
    }

    /// Forgets a lease whose turn ended (if it is still this generation).
    pub(super) fn forget(&self, source: &str, event_id: &str, lease: u64) {
        let mut held = self.held();
        let id = (source.to_owned(), event_id.to_owned());
        if held.get(&id).is_some_and(|h| h.lease == lease) {
            held.remove(&id);
        }
    }

    /// When the inbox last confirmed this lease; `None` once it is known
    /// lost (or was never recorded).
    fn confirmed(&self, source: &str, event_id: &str, lease: u64) -> Option<Millis> {
        self.held()
            .get(&(source.to_owned(), event_id.to_owned()))
            .filter(|h| h.lease == lease)
            .map(|h| h.confirmed)
    }

    /// Every lease held, to renew.
    fn all(&self) -> Vec<(EventKey, u64)> {
        self.held()
            .values()
            .map(|h| (h.key.clone(), h.lease))
            .collect()
    }

    /// Takes the inbox's answers to a renewal of `asked` at `now`: a
    /// renewed lease is confirmed, an ended or lost one forgotten, one
    /// whose part of the store did not answer left as it is. Counts
    /// (renewed, lost, unknown) of those still held when the answer came
    /// (a turn that ended, or settled, meanwhile is no loss).
    fn renewed(
        &self,
        asked: &[(EventKey, u64)],
        renewed: &[Option<Renewal>],
        now: Millis,
    ) -> (u64, u64, u64) {
        let mut held = self.held();
        let (mut ok, mut lost, mut unknown) = (0, 0, 0);
        for ((key, lease), r) in asked.iter().zip(renewed) {
            let id = (key.source.clone(), key.event_id.clone());
            let Some(h) = held.get_mut(&id).filter(|h| h.lease == *lease) else {
                continue;
            };
            if *r == Some(Renewal::Renewed) {
                h.confirmed = h.confirmed.max(now);
                ok += 1;
            } else if r.is_none() {
                unknown += 1;
            } else if *r == Some(Renewal::Ended) {
                held.remove(&id);
            } else {
                held.remove(&id);
                lost += 1;
                tracing::warn!(source = %key.source, event_id = %key.event_id, "lease lost (run out, or taken by another instance): this instance sends it no more, and its late outcome is ignored");
            }
        }
        (ok, lost, unknown)
    }
}

impl Dispatcher {
    /// The lease grace of the inbox, if its leases are renewed.
    pub(super) fn lease_grace(&self) -> Option<Duration> {
        self.gateway.inbox.lease_grace()
    }

    /// Renews every lease this process holds, every quarter of `grace`
    /// (so a lease has three renewals in flight or landed before it ends,
    /// even if one times out), until aborted (after the last turn ended).
    pub(super) async fn heartbeat(self: Arc<Self>, grace: Duration) {
        let mut tick = tokio::time::interval(grace / 4);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tick.tick().await;
            let asked = self.leases.all();
            if asked.is_empty() {
                continue;
            }
            let now = self.clock.now_ms();
            let until = now.saturating_add(millis(grace));
            match self
                .gateway
                .inbox
                .renew_leases(asked.clone(), until, now)
                .await
            {
                Ok(renewed) => {
                    if std::mem::take(&mut failing) {
                        tracing::info!("leases renewed again");
                    }
                    let (ok, lost, unknown) = self.leases.renewed(&asked, &renewed, now);
                    self.metrics.lease_renewals("renewed", ok);
                    self.metrics.lease_renewals("lost", lost);
                    self.metrics.lease_renewals("failed", unknown);
                }
                Err(e) => {
                    if !std::mem::replace(&mut failing, true) {
                        tracing::warn!(error = %e.chain(), leases = asked.len(), "cannot renew leases: unless a renewal lands within gateway.lease_grace, other instances take their events");
                    }
                    self.metrics.lease_renewals("failed", asked.len() as u64);
                }
            }
        }
    }

    /// Whether this process still holds `ev`'s lease `lease`, asked just
    /// before sending. Without a grace, a lease outlives the turn: true.
    /// Confirmed within a third of the grace, and not `asking`: true
    /// without a round trip. Otherwise (the process may have been frozen,
    /// or cut off from Redis, past the grace; with `asking`, an event held
    /// ahead that another instance's operator may have erased or
    /// redelivered since) the inbox renews it now or says it is gone.
    pub(super) async fn lease_live(&self, key: &EventKey, lease: u64, asking: bool) -> bool {
        let Some(grace) = self.lease_grace() else {
            return true;
        };
        let now = self.clock.now_ms();
        let fresh = !asking
            && self
                .leases
                .confirmed(&key.source, &key.event_id, lease)
                .is_some_and(|at| now.saturating_sub(at) < millis(grace) / 3);
        if fresh {
            return true;
        }
        let until = now.saturating_add(millis(grace));
        let asked = vec![(key.clone(), lease)];
        match self
            .gateway
            .inbox
            .renew_leases(asked.clone(), until, now)
            .await
        {
            Ok(renewed) => {
                let (ok, lost, unknown) = self.leases.renewed(&asked, &renewed, now);
                self.metrics.lease_renewals("renewed", ok);
                self.metrics.lease_renewals("lost", lost);
                self.metrics.lease_renewals("failed", unknown);
                renewed.first().copied().flatten() == Some(Renewal::Renewed)
            }
            Err(e) => {
                tracing::debug!(source = %key.source, event_id = %key.event_id, error = %e.chain(), "cannot confirm the lease before sending: not sent; it comes due at its lease's end");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_renewal_confirms_what_is_still_held_and_forgets_what_is_lost() {
        let leases = Leases::default();
        let a = EventKey::new("s", "a", None);
        let b = EventKey::new("s", "b", Some("run"));
        let c = EventKey::new("s", "c", None);
        leases.hold(a.clone(), 1, 100);
        leases.hold(b.clone(), 4, 100);
        leases.hold(c.clone(), 2, 100);
        let asked = leases.all();
        // c's turn ends while the renewal is on its way: no loss.
        leases.forget("s", "c", 2);
        let answers: Vec<Option<Renewal>> = asked
            .iter()
            .map(|(k, _)| {
                Some(if k.event_id == "b" {
                    Renewal::Lost
                } else {
                    Renewal::Renewed
                })
            })
            .collect();
        assert_eq!(leases.renewed(&asked, &answers, 200), (1, 1, 0));
        assert_eq!(leases.confirmed("s", "a", 1), Some(200));
        assert_eq!(leases.confirmed("s", "b", 4), None, "lost");
        assert_eq!(leases.confirmed("s", "c", 2), None, "ended");
        // Leased again under a newer generation: the old one's answer and
        // end leave it alone.
        // Unanswered (its master down): neither confirmed nor forgotten.
        leases.hold(b.clone(), 5, 250);
        assert_eq!(leases.renewed(&[(b.clone(), 5)], &[None], 260), (0, 0, 1));
        assert_eq!(leases.confirmed("s", "b", 5), Some(250));
        leases.forget("s", "b", 5);
        leases.hold(a.clone(), 3, 300);
        assert_eq!(
            leases.renewed(&[(a.clone(), 1)], &[Some(Renewal::Lost)], 400),
            (0, 0, 0)
        );
        leases.forget("s", "a", 1);
        assert_eq!(leases.confirmed("s", "a", 3), Some(300));
        assert_eq!(leases.all(), [(a, 3)]);
        // Settled under its lease while the renewal was out: no loss.
        let d = EventKey::new("s", "d", None);
        leases.hold(d.clone(), 9, 500);
        assert_eq!(
            leases.renewed(&[(d, 9)], &[Some(Renewal::Ended)], 600),
            (0, 0, 0)
        );
        assert_eq!(leases.confirmed("s", "d", 9), None);
    }
}
