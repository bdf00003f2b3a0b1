//! One delivery turn of one leased event, and how it settles.
//!
//! Invariant: an event is settled as delivered only once its stream head
//! has moved to it (or past it). With [`Coordination::Inbox`] both happen in
//! one transaction; with [`Coordination::Shared`] the head moves first, then
//! the event's claim is marked done, then the inbox settles. If recording
//! an acknowledged delivery fails, the turn keeps the event — and so its
//! stream — in flight and retries until it succeeds: settling it otherwise,
//! or letting the stream move on, would let an older event of the stream
//! pass the stale check after it. Only a shutdown ends that wait; the event
//! is then still pending and is sent again after the restart (the
//! application dedupes on `webhook-id`).

use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::backoff::{backoff, millis};
use super::forward::Failed;
use super::schedule::Reached;
use super::{Coordination, Dispatcher, GRACE_MS, Slot};
use crate::clock::Millis;
use crate::domain::{Key, MAX_KEY_BYTES, Namespace, ScopedKey, Token, Ttl};
use crate::gateway::Source;
use crate::store::inbox::{Attempt, InboxEvent, Retention, Settle};
use crate::store::{ClaimOutcome, Store};
use crate::telemetry::traces;

/// First pause between tries to record an acknowledged delivery; doubles
/// each time up to [`RECORD_PAUSE_MAX`].
const RECORD_PAUSE: Duration = Duration::from_millis(50);
/// Longest pause between those tries.
const RECORD_PAUSE_MAX: Duration = Duration::from_secs(2);

impl Dispatcher {
    /// Runs one turn under lease generation `lease`; says whether it
    /// reached the destination, for the source's circuit breaker.
    /// The slot is freed (`slot.answered`) once the destination answered,
    /// before the outcome is recorded.
    pub(super) async fn turn(
        &self,
        source: &Source,
        ev: &InboxEvent,
        lease: u64,
        slot: &Slot,
    ) -> Reached {
        let turn = async {
            match &self.coordination {
                Coordination::Inbox => self.turn_local(source, ev, lease, slot).await,
                Coordination::Shared(store) => {
                    self.turn_shared(store, source, ev, lease, slot).await
                }
            }
        };
        // With traces on: a `deliver` span, a child of the event's ingest.
        traces::attempt(
            &ev.headers,
            traces::EventOf {
                source: &ev.source,
                event_id: &ev.event_id,
                stream: ev.stream.as_deref(),
                received_at_ms: ev.received_at_ms,
            },
            source.lane_of.as_deref().unwrap_or(source.name.as_str()),
            &source.destination,
            ev.attempts.saturating_add(1),
            turn,
        )
        .await
    }

    /// The stale check already ran when the event was leased.
    async fn turn_local(
        &self,
        source: &Source,
        ev: &InboxEvent,
        lease: u64,
        slot: &Slot,
    ) -> Reached {
        let attempt = ev.attempts.saturating_add(1);
        // Frozen or cut off past the grace, this process may have lost the
        // event to another instance: it sends only under a live lease.
        if !self.lease_live(&ev.key(), lease, false).await {
            tracing::info!(source = %source.name, event_id = %ev.event_id, "lease run out or taken by another instance before sending: not sent");
            return Reached::Nothing;
        }
        let (posted, sent) = self.post(source, ev, attempt).await;
        if let Err(failed) = posted {
            self.failed(source, ev, lease, sent, failed, slot).await;
            return Reached::Failure;
        }
        slot.answered(Reached::Success);
        let apply = self
            .ordering_keys(source, ev)
            .map(|(stream, id)| (stream, id, ev.created_at, self.ordering_retention_ms));
        let key = ev.key();
        let recorded = self
            .until_recorded(source, ev, || {
                let now = self.clock.now_ms();
                self.gateway.inbox.settle_delivered(
                    &key,
                    lease,
                    apply.clone(),
                    Some(sent.clone()),
                    source.retention(self.gateway.retention),
                    now,
                )
            })
            .await;
        match recorded {
            Ok(()) => {
                self.metrics.delivery(&source.name, "delivered");
                traces::outcome("delivered");
                tracing::info!(source = %source.name, event_id = %ev.event_id, attempt, outcome = "delivered", "delivered");
            }
            Err(_) => {
                // Shutting down: neither the head nor the status moved, so
                // the event is sent again after the restart.
                tracing::warn!(source = %source.name, event_id = %ev.event_id, "delivered, but not recorded before shutdown; it will be sent again");
            }
        }
        Reached::Success
    }

    /// Retries `write` — recording a delivery the destination acknowledged —
    /// until it succeeds, keeping the event (and so its stream) in flight
    /// meanwhile: settling it any other way, or letting its stream move on,
    /// could let an older event of the stream through after it. Gives up
    /// only when the dispatcher stops, with the last error.
    async fn until_recorded<F, Fut>(
        &self,
        source: &Source,
        ev: &InboxEvent,
        mut write: F,
    ) -> Result<(), String>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<(), crate::store::StoreError>>,
    {
        let mut pause = RECORD_PAUSE;
        let mut logged = false;
        loop {
            let error = match write().await {
                Ok(()) => return Ok(()),
                Err(e) => e.chain().to_string(),
            };
            if !logged {
                tracing::warn!(source = %source.name, event_id = %ev.event_id, %error, "delivered, but cannot record it yet; retrying while the stream waits");
                logged = true;
            }
            if self.stopping() {
                return Err(error);
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(RECORD_PAUSE_MAX);
        }
    }

    async fn turn_shared(
        &self,
        store: &Arc<dyn Store>,
        source: &Source,
        ev: &InboxEvent,
        lease: u64,
        slot: &Slot,
    ) -> Reached {
        let now = self.clock.now_ms();
        let retry_soon = now.saturating_add(millis(source.backoff_min));
        let Some((key, stream_key)) = self.claim_keys(source, ev) else {
            let error = "stored event id or stream is not a valid key".to_owned();
            self.settle(ev, lease, Settle::Dead { error }, None).await;
            return Reached::Nothing;
        };
        let ttl = Ttl::from_ms_unchecked(millis(source.forward_timeout).saturating_add(GRACE_MS));
        // One instance at a time delivers a stream: the lease is a claim in
        // the shared store, held for the whole turn.
        let stream_lease = match &stream_key {
            None => None,
            Some(k) => match store.claim(k, ttl, None, now).await {
                Ok(ClaimOutcome::Claimed { token, .. }) => Some((k.clone(), token)),
                Ok(_) => {
                    let error = "another instance is delivering this stream".to_owned();
                    return self
                        .retry_without_attempt(ev, lease, retry_soon, error)
                        .await;
                }
                Err(e) => {
                    return self
                        .retry_without_attempt(ev, lease, retry_soon, e.chain().to_string())
                        .await;
                }
            },
        };
        let reached = self
            .turn_claimed(
                store,
                source,
                ev,
                lease,
                &key,
                stream_lease.as_ref(),
                ttl,
                retry_soon,
                slot,
            )
            .await;
        if let Some((k, token)) = stream_lease {
            self.release(store, &k, token).await;
        }
        reached
    }

    /// The rest of a shared turn, under the stream lease.
    #[allow(clippy::too_many_arguments)]
    async fn turn_claimed(
        &self,
        store: &Arc<dyn Store>,
        source: &Source,
        ev: &InboxEvent,
        lease: u64,
        key: &ScopedKey,
        stream_lease: Option<&(ScopedKey, Token)>,
        ttl: Ttl,
        retry_soon: Millis,
        slot: &Slot,
    ) -> Reached {
        let now = self.clock.now_ms();
        let token = match store.claim(key, ttl, None, now).await {
            Ok(ClaimOutcome::Claimed { token, .. }) => token,
            Ok(ClaimOutcome::Done { .. }) => {
                // Delivered already, by another instance that received it
                // too, or by this one before a crash cut the turn short.
                // The done claim is written after the head moved, so the
                // head is in place.
                self.settle(ev, lease, Settle::Delivered { attempted: false }, None)
                    .await;
                return Reached::Nothing;
            }
            Ok(_) => {
                let error = "another worker holds this event's claim".to_owned();
                return self
                    .retry_without_attempt(ev, lease, retry_soon, error)
                    .await;
            }
            Err(e) => {
                return self
                    .retry_without_attempt(ev, lease, retry_soon, e.chain().to_string())
                    .await;
            }
        };
        let ordering = self.ordering_keys(source, ev);
        if let Some((stream, _)) = &ordering
            && !ev.force
        {
            match store.head(stream, now).await {
                Ok(Some(head)) if ev.created_at < head.created_at => {
                    self.release(store, key, token).await;
                    tracing::info!(source = %source.name, event_id = %ev.event_id, outcome = "stale", "stale: older than its stream's head");
                    self.settle(ev, lease, Settle::Stale, None).await;
                    return Reached::Nothing;
                }
                Ok(_) => {}
                Err(e) => {
                    self.release(store, key, token).await;
                    return self
                        .retry_without_attempt(ev, lease, retry_soon, e.chain().to_string())
                        .await;
                }
            }
        }
        let attempt = ev.attempts.saturating_add(1);
        let (posted, sent) = self.post(source, ev, attempt).await;
        if let Err(failed) = posted {
            self.release(store, key, token).await;
            self.failed(source, ev, lease, sent, failed, slot).await;
            return Reached::Failure;
        }
        slot.answered(Reached::Success);
        if let Some((stream, id)) = &ordering {
            let moved = self
                .until_recorded(source, ev, || async {
                    let now = self.clock.now_ms();
                    // Keep this turn's claims alive while it waits.
                    let _ = store.extend(key, token, ttl, now).await;
                    if let Some((k, t)) = stream_lease {
                        let _ = store.extend(k, *t, ttl, now).await;
                    }
                    store
                        .apply(stream, id, ev.created_at, self.ordering_retention_ms, now)
                        .await
                        .map(|_| ())
                })
                .await;
            if let Err(error) = moved {
                // Shutting down with the head behind: never settled as
                // delivered; back to pending, sent again after the restart.
                self.release(store, key, token).await;
                let settle = Settle::Retry {
                    retry_at: self.clock.now_ms(),
                    error: format!("delivered, but the stream head could not be moved: {error}"),
                    attempted: true,
                };
                self.settle(ev, lease, settle, Some(sent)).await;
                return Reached::Success;
            }
        }
        let now = self.clock.now_ms();
        if let Err(e) = store.done(key, token, self.done_ttl, now).await {
            // The claim expires; the local inbox still says delivered.
            tracing::warn!(error = %e.chain(), "cannot mark the delivered event done");
        }
        tracing::info!(source = %source.name, event_id = %ev.event_id, attempt, outcome = "delivered", "delivered");
        self.settle(ev, lease, Settle::Delivered { attempted: true }, Some(sent))
            .await;
        Reached::Success
    }

    /// How long `source`'s settled events are kept.
    pub(super) fn retention_of(&self, source: &str) -> Retention {
        let gateway = self.gateway.retention;
        self.gateway
            .source(source)
            .map_or(gateway, |s| s.retention(gateway))
    }

    /// The event's claim key and its stream's lease key; `None` when a
    /// stored id is no longer a valid key.
    fn claim_keys(
        &self,
        source: &Source,
        ev: &InboxEvent,
    ) -> Option<(ScopedKey, Option<ScopedKey>)> {
        // A replay is delivered again: its claim is its own, apart from
        // the (done) claim of the first delivery. An id too long to take
        // the job's suffix is named by its digest instead.
        let id = match &ev.replay {
            None => Key::parse(&ev.event_id, "event_id").ok()?,
            Some(r) => {
                let mut raw = format!("{}#{}", ev.event_id, r.job);
                if raw.len() > MAX_KEY_BYTES {
                    let digest = Sha256::digest(ev.event_id.as_bytes());
                    raw = format!("sha256:{}#{}", hex::encode(digest), r.job);
                }
                Key::parse(&raw, "event_id").ok()?
            }
        };
        let key = ScopedKey::new(&Namespace::Gateway(source.name.clone()), &id);
        let stream = match &ev.stream {
            None => None,
            Some(s) => {
                let s = Key::parse(s, "stream").ok()?;
                Some(ScopedKey::new(
                    &Namespace::GatewayStream(source.name.clone()),
                    &s,
                ))
            }
        };
        Some((key, stream))
    }

    /// The event's stream and id as the ordering table keys them.
    fn ordering_keys(&self, source: &Source, ev: &InboxEvent) -> Option<(ScopedKey, ScopedKey)> {
        let ns = Namespace::Gateway(source.name.clone());
        let stream = Key::parse(ev.stream.as_deref()?, "stream").ok()?;
        let id = Key::parse(&ev.event_id, "event_id").ok()?;
        Some((ScopedKey::new(&ns, &stream), ScopedKey::new(&ns, &id)))
    }

    /// Sends attempt number `attempt`; how it went, and the attempt as
    /// the event's timeline keeps it (sent at the app's clock, its latency
    /// measured on the monotonic clock).
    async fn post(
        &self,
        source: &Source,
        ev: &InboxEvent,
        attempt: u32,
    ) -> (Result<(), Failed>, Attempt) {
        let at_ms = self.clock.now_ms();
        let now_s = i64::try_from(at_ms / 1000).unwrap_or(i64::MAX);
        let started = std::time::Instant::now();
        let result = self.forwarder.post(source, ev, attempt, now_s).await;
        let latency = started.elapsed();
        self.metrics
            .delivery_duration(&source.name, latency.as_secs_f64());
        let sent = match &result {
            Ok(status) => Attempt::new(attempt, at_ms, Some(*status), latency, None),
            Err(f) => Attempt::new(attempt, at_ms, f.status, latency, Some(&f.error)),
        };
        if traces::on() {
            if let Some(status) = sent.status {
                traces::set("http.response.status_code", i64::from(status));
            }
            traces::set("dedupd.latency_ms", latency.as_secs_f64() * 1e3);
        }
        (result.map(|_| ()), sent)
    }

    /// A failed attempt: frees the slot (holding the source back as long as
    /// the destination asked with `Retry-After`, at most `backoff_max`) and
    /// settles the event: retry later, or dead after the last attempt.
    async fn failed(
        &self,
        source: &Source,
        ev: &InboxEvent,
        lease: u64,
        sent: Attempt,
        failed: Failed,
        slot: &Slot,
    ) {
        let attempt = sent.attempt;
        let asked = failed
            .retry_after
            .map(|ms| ms.min(millis(source.backoff_max)));
        if let Some(ms) = asked {
            slot.hold(self.clock.now_ms().saturating_add(ms));
        }
        slot.answered(Reached::Failure);
        let error = failed.error;
        // A replay's retry budget starts afresh from the attempts the
        // event had when it was queued; its attempt numbers count on.
        let base = ev.replay.as_ref().map_or(0, |r| r.base_attempts);
        let tried = attempt.saturating_sub(base);
        if tried >= source.max_attempts {
            tracing::warn!(source = %source.name, event_id = %ev.event_id, attempt, %error, outcome = "dead", "dead: every attempt failed");
            self.settle(ev, lease, Settle::Dead { error }, Some(sent))
                .await;
        } else {
            // The destination's wait replaces the backoff when it is longer.
            let wait = backoff(source, tried).max(asked.unwrap_or(0));
            let retry_at = self.clock.now_ms().saturating_add(wait);
            tracing::info!(source = %source.name, event_id = %ev.event_id, attempt, %error, retry_at, outcome = "retry", "delivery failed; will retry");
            let settle = Settle::Retry {
                retry_at,
                error,
                attempted: true,
            };
            self.settle(ev, lease, settle, Some(sent)).await;
        }
    }

    /// Puts the event back for `retry_at` after a turn that sent nothing
    /// (claim busy, store unavailable): no attempt is counted.
    async fn retry_without_attempt(
        &self,
        ev: &InboxEvent,
        lease: u64,
        retry_at: Millis,
        error: String,
    ) -> Reached {
        let settle = Settle::Retry {
            retry_at,
            error,
            attempted: false,
        };
        self.settle(ev, lease, settle, None).await;
        Reached::Nothing
    }

    /// Records how a turn ended, with the request it sent, if any.
    async fn settle(&self, ev: &InboxEvent, lease: u64, settle: Settle, sent: Option<Attempt>) {
        let now = self.clock.now_ms();
        let outcome = match &settle {
            Settle::Delivered { .. } => Some("delivered"),
            Settle::Stale => Some("stale"),
            Settle::Retry {
                attempted: true, ..
            } => Some("failed"),
            // Nothing was sent: no delivery outcome to count.
            Settle::Retry { .. } => None,
            Settle::Dead { .. } => Some("dead"),
        };
        let dead = match &settle {
            Settle::Dead { error } => Some((error.clone(), sent.as_ref().map(|a| a.attempt))),
            _ => None,
        };
        match &settle {
            Settle::Retry {
                retry_at,
                attempted,
                ..
            } => {
                traces::outcome(if *attempted { "retry" } else { "not_sent" });
                traces::set(
                    "dedupd.retry_at_ms",
                    i64::try_from(*retry_at).unwrap_or(i64::MAX),
                );
            }
            _ => traces::outcome(outcome.unwrap_or("unknown")),
        }
        match &settle {
            Settle::Dead { .. } => traces::failed("dead"),
            Settle::Retry {
                attempted: true, ..
            } => traces::failed("failed; will retry"),
            _ => {}
        }
        let inbox = &self.gateway.inbox;
        let (key, retention) = (ev.key(), self.retention_of(&ev.source));
        let written = match sent {
            Some(sent) => {
                inbox
                    .settle_attempt(&key, lease, settle, sent, retention, now)
                    .await
            }
            None => inbox.settle(&key, lease, settle, retention, now).await,
        };
        if let Err(e) = written {
            // The lease runs out and the event comes due again.
            tracing::warn!(source = %ev.source, event_id = %ev.event_id, error = %e.chain(), "cannot record the delivery outcome");
        } else {
            if let Some(outcome) = outcome {
                self.metrics.delivery(&ev.source, outcome);
            }
            if let Some((error, attempts)) = dead {
                self.gateway.alert(
                    "event.dead",
                    Some(&ev.source),
                    serde_json::json!({
                        "event_id": ev.event_id,
                        "stream": ev.stream,
                        "attempts": attempts,
                        "error": error,
                    }),
                );
            }
        }
    }

    async fn release(&self, store: &Arc<dyn Store>, key: &ScopedKey, token: Token) {
        if let Err(e) = store.release(key, token, self.clock.now_ms()).await {
            // The claim expires by itself after its TTL.
            tracing::warn!(error = %e.chain(), "cannot release a delivery claim");
        }
    }
}
