//! Delivery: a dispatcher hands runnable inbox events to a bounded pool of
//! workers.
//!
//! The inbox's due index holds only runnable events: per stream, its oldest
//! pending event; events without a stream, each on its own. The dispatcher
//! also keeps streams with a delivery in flight aside, so one stream never
//! has two events in flight. Before a delivery starts, its event is leased
//! in the inbox (its due time moves past the attempt's timeout), so after a
//! crash it simply comes due again and is delivered again — the application
//! dedupes on `webhook-id`.
//!
//! One delivery: claim `gw/{source}/{event id}` in the store → an event older
//! than its stream's head is `stale` → POST the original body, signed with
//! the Standard Webhooks scheme under the destination secret → 2xx: done,
//! applied to the stream (the head moves only on success) → anything else:
//! release, retry with exponential backoff and jitter, `dead` after
//! `max_attempts`.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

use super::signature::sign_standard_webhooks;
use super::{Gateway, Source};
use crate::clock::{Millis, SharedClock};
use crate::domain::{Key, Namespace, ScopedKey, Ttl};
use crate::store::inbox::{InboxEvent, Settle};
use crate::store::{ClaimOutcome, Store};

/// Longest the dispatcher sleeps without being woken.
const POLL: Duration = Duration::from_millis(500);
/// Extra claim and lease time beyond the attempt's timeout.
const GRACE_MS: u64 = 30_000;

/// The dispatcher and what its workers need.
#[derive(Debug)]
pub struct Dispatcher {
    gateway: Arc<Gateway>,
    store: Arc<dyn Store>,
    clock: SharedClock,
    client: reqwest::Client,
    workers: usize,
    /// TTL of the done record of a delivered event.
    done_ttl: Ttl,
    /// Retention of applied events and heads, ms.
    ordering_retention_ms: u64,
    /// Events and streams with a delivery in flight.
    in_flight: Mutex<InFlight>,
}

/// What is being delivered right now.
#[derive(Debug, Default)]
struct InFlight {
    /// `(source, event id)`.
    events: HashSet<(String, String)>,
    /// `(source, stream)`: one delivery per stream at a time.
    streams: HashSet<(String, String)>,
}

/// An event's place in [`InFlight`], given back when dropped — also when a
/// delivery panics — and the dispatcher woken.
struct Slot {
    dispatcher: Arc<Dispatcher>,
    event: (String, String),
    stream: Option<(String, String)>,
}

impl Slot {
    fn new(dispatcher: Arc<Dispatcher>, ev: &InboxEvent) -> Self {
        Self {
            dispatcher,
            event: (ev.source.clone(), ev.event_id.clone()),
            stream: ev.stream.clone().map(|s| (ev.source.clone(), s)),
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        {
            let mut flying = self.dispatcher.in_flight();
            flying.events.remove(&self.event);
            if let Some(stream) = &self.stream {
                flying.streams.remove(stream);
            }
        }
        self.dispatcher.gateway.wake.notify_one();
    }
}

impl Dispatcher {
    /// A dispatcher with `workers` concurrent deliveries.
    pub fn new(
        gateway: Arc<Gateway>,
        store: Arc<dyn Store>,
        clock: SharedClock,
        workers: usize,
        ordering_retention_ms: u64,
    ) -> reqwest::Result<Self> {
        let client = reqwest::Client::builder()
            // A redirect is a failed delivery, never followed.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("dedupd/", env!("CARGO_PKG_VERSION")))
            .build()?;
        let done_ttl = Ttl::from_ms_unchecked(gateway.retention.delivered_ms);
        Ok(Self {
            gateway,
            store,
            clock,
            client,
            workers: workers.max(1),
            done_ttl,
            ordering_retention_ms,
            in_flight: Mutex::new(InFlight::default()),
        })
    }

    /// Dispatches until `stop` turns true, then waits for deliveries in
    /// flight to finish.
    pub async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let permits = Arc::new(Semaphore::new(self.workers));
        let mut tasks = JoinSet::new();
        loop {
            if *stop.borrow() {
                break;
            }
            while tasks.try_join_next().is_some() {}
            let wake_at = self.dispatch(&permits, &mut tasks).await;
            let now = self.clock.now_ms();
            let sleep = wake_at.map_or(POLL, |t| {
                Duration::from_millis(t.saturating_sub(now)).min(POLL)
            });
            tokio::select! {
                () = self.gateway.wake.notified() => {}
                () = tokio::time::sleep(sleep) => {}
                _ = stop.changed() => {}
            }
        }
        while tasks.join_next().await.is_some() {}
        tracing::debug!("dispatcher stopped");
    }

    /// Starts deliveries for runnable events; returns when to look again.
    async fn dispatch(
        self: &Arc<Self>,
        permits: &Arc<Semaphore>,
        tasks: &mut JoinSet<()>,
    ) -> Option<Millis> {
        let free = permits.available_permits();
        if free == 0 {
            return None;
        }
        let now = self.clock.now_ms();
        let busy_streams = self.in_flight().streams.len();
        // Runnable events blocked by a stream in flight number at most one
        // per such stream, so this limit always reaches `free` others.
        let limit = free + busy_streams + 1;
        let sources = self.gateway.sources.keys().cloned().collect();
        let (events, next) = match self.gateway.inbox.due_events(now, limit, sources).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the inbox; retrying");
                return None;
            }
        };
        let mut picked = Vec::new();
        let mut more = false;
        {
            let mut flying = self.in_flight();
            for ev in events {
                if picked.len() == free {
                    // More is runnable than workers are free: a finishing
                    // delivery wakes the dispatcher.
                    more = true;
                    break;
                }
                let Some(source) = self.gateway.source(&ev.source).cloned() else {
                    continue;
                };
                let key = (ev.source.clone(), ev.event_id.clone());
                if flying.events.contains(&key) {
                    continue;
                }
                if let Some(stream) = &ev.stream
                    && !flying.streams.insert((ev.source.clone(), stream.clone()))
                {
                    continue;
                }
                flying.events.insert(key);
                picked.push((source, ev));
            }
        }
        let slots: Vec<Slot> = picked
            .iter()
            .map(|(_, ev)| Slot::new(self.clone(), ev))
            .collect();
        if picked.is_empty() {
            // Never spin: only a due time still ahead is worth waiting for.
            return next.filter(|t| *t > now);
        }
        let leases = picked
            .iter()
            .map(|(s, ev)| {
                let until = now
                    .saturating_add(millis(s.forward_timeout))
                    .saturating_add(GRACE_MS);
                (ev.source.clone(), ev.event_id.clone(), until)
            })
            .collect();
        let leased = match self.gateway.inbox.lease(leases, now).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "cannot lease events; retrying");
                return None;
            }
        };
        for ((source, ev), slot) in picked.into_iter().zip(slots) {
            // Only events still pending and runnable were leased.
            let Some(generation) = leased
                .iter()
                .find(|(s, id, _)| *s == ev.source && *id == ev.event_id)
                .map(|(_, _, g)| *g)
            else {
                continue;
            };
            let Ok(permit) = permits.clone().acquire_owned().await else {
                break;
            };
            let this = self.clone();
            tasks.spawn(async move {
                this.deliver(&source, &ev, generation).await;
                drop(slot);
                drop(permit);
            });
        }
        if more { None } else { next }
    }

    fn in_flight(&self) -> std::sync::MutexGuard<'_, InFlight> {
        // A panicking delivery cannot leave the sets locked for good.
        self.in_flight
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn settle(&self, ev: &InboxEvent, lease: u64, settle: Settle) {
        let now = self.clock.now_ms();
        if let Err(e) = self
            .gateway
            .inbox
            .settle(
                &ev.source,
                &ev.event_id,
                lease,
                settle,
                self.gateway.retention,
                now,
            )
            .await
        {
            // The lease runs out and the event comes due again.
            tracing::warn!(source = %ev.source, event_id = %ev.event_id, error = %e, "cannot record the delivery outcome");
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
    ) {
        let settle = Settle::Retry {
            retry_at,
            error,
            attempted: false,
        };
        self.settle(ev, lease, settle).await;
    }

    /// One delivery turn of one event.
    async fn deliver(&self, source: &Source, ev: &InboxEvent, lease: u64) {
        let ns = Namespace::Gateway(source.name.clone());
        let now = self.clock.now_ms();
        let retry_soon = now.saturating_add(millis(source.backoff_min));
        let Ok(id) = Key::parse(&ev.event_id, "event_id") else {
            self.settle(
                ev,
                lease,
                Settle::Dead {
                    error: "stored event id is not a valid key".into(),
                },
            )
            .await;
            return;
        };
        let key = ScopedKey::new(&ns, &id);
        let claim_ttl =
            Ttl::from_ms_unchecked(millis(source.forward_timeout).saturating_add(GRACE_MS));
        let token = match self.store.claim(&key, claim_ttl, None, now).await {
            Ok(ClaimOutcome::Claimed { token, .. }) => token,
            Ok(ClaimOutcome::Done { .. }) => {
                // Delivered already: by another instance sharing the store,
                // or by this one before a crash cut the turn short. Make
                // sure the head moved (apply is idempotent).
                self.apply(source, ev, self.clock.now_ms()).await;
                self.settle(ev, lease, Settle::Delivered { attempted: false })
                    .await;
                return;
            }
            Ok(_) => {
                let error = "another worker holds this event's claim".to_owned();
                self.retry_without_attempt(ev, lease, retry_soon, error)
                    .await;
                return;
            }
            Err(e) => {
                self.retry_without_attempt(ev, lease, retry_soon, e.to_string())
                    .await;
                return;
            }
        };
        let stream_key = ev
            .stream
            .as_deref()
            .and_then(|s| Key::parse(s, "stream").ok())
            .map(|s| ScopedKey::new(&ns, &s));
        if let Some(stream_key) = &stream_key
            && !ev.force
        {
            match self.store.head(stream_key, now).await {
                Ok(Some(head)) if ev.created_at < head.created_at => {
                    self.release(&key, token).await;
                    tracing::info!(source = %source.name, event_id = %ev.event_id, "stale: older than its stream's head");
                    self.settle(ev, lease, Settle::Stale).await;
                    return;
                }
                Ok(_) => {}
                Err(e) => {
                    self.release(&key, token).await;
                    self.retry_without_attempt(ev, lease, retry_soon, e.to_string())
                        .await;
                    return;
                }
            }
        }
        let attempt = ev.attempts.saturating_add(1);
        let result = self.post(source, ev, attempt).await;
        let now = self.clock.now_ms();
        match result {
            Ok(()) => {
                // Head first, then done: a crash between the two leaves a
                // claim that expires and a redelivery, never a done event
                // whose stream head did not move.
                self.apply(source, ev, now).await;
                if let Err(e) = self.store.done(&key, token, self.done_ttl, now).await {
                    tracing::warn!(error = %e, "cannot mark the delivered event done");
                }
                tracing::info!(source = %source.name, event_id = %ev.event_id, attempt, "delivered");
                self.settle(ev, lease, Settle::Delivered { attempted: true })
                    .await;
            }
            Err(error) => {
                self.release(&key, token).await;
                if attempt >= source.max_attempts {
                    tracing::warn!(source = %source.name, event_id = %ev.event_id, attempt, %error, "dead: every attempt failed");
                    self.settle(ev, lease, Settle::Dead { error }).await;
                } else {
                    let retry_at = now.saturating_add(backoff(source, attempt));
                    tracing::info!(source = %source.name, event_id = %ev.event_id, attempt, %error, retry_at, "delivery failed; will retry");
                    self.settle(
                        ev,
                        lease,
                        Settle::Retry {
                            retry_at,
                            error,
                            attempted: true,
                        },
                    )
                    .await;
                }
            }
        }
    }

    /// Moves the event's stream head to it (if it has a stream).
    async fn apply(&self, source: &Source, ev: &InboxEvent, now: Millis) {
        let ns = Namespace::Gateway(source.name.clone());
        let (Some(stream), Ok(id)) = (
            ev.stream
                .as_deref()
                .and_then(|s| Key::parse(s, "stream").ok()),
            Key::parse(&ev.event_id, "event_id"),
        ) else {
            return;
        };
        let (stream, id) = (ScopedKey::new(&ns, &stream), ScopedKey::new(&ns, &id));
        if let Err(e) = self
            .store
            .apply(&stream, &id, ev.created_at, self.ordering_retention_ms, now)
            .await
        {
            tracing::warn!(error = %e, "cannot move the stream head");
        }
    }

    async fn release(&self, key: &ScopedKey, token: crate::domain::Token) {
        if let Err(e) = self.store.release(key, token, self.clock.now_ms()).await {
            // The claim expires by itself after its TTL.
            tracing::warn!(error = %e, "cannot release a delivery claim");
        }
    }

    /// POSTs the event to the application; Ok only for a 2xx.
    async fn post(&self, source: &Source, ev: &InboxEvent, attempt: u32) -> Result<(), String> {
        let ts = i64::try_from(self.clock.now_ms() / 1000).unwrap_or(i64::MAX);
        let signature = sign_standard_webhooks(&source.destination_key, &ev.event_id, ts, &ev.body);
        let mut req = self
            .client
            .post(source.forward_to.clone())
            .timeout(source.forward_timeout)
            .body(ev.body.clone());
        for (name, value) in &ev.headers {
            req = req.header(name.as_str(), value.as_str());
        }
        let res = req
            .header("webhook-id", ev.event_id.as_str())
            .header("webhook-timestamp", ts.to_string())
            .header("webhook-signature", signature)
            .header("dedupd-attempt", attempt.to_string())
            .header("dedupd-source", source.name.as_str())
            .send()
            .await;
        match res {
            Ok(r) if r.status().is_success() => Ok(()),
            Ok(r) if r.status().is_redirection() => Err(format!(
                "HTTP {} (redirects count as failures and are not followed)",
                r.status()
            )),
            Ok(r) => Err(format!("HTTP {}", r.status())),
            Err(e) if e.is_timeout() => {
                Err(format!("no answer within {:?}", source.forward_timeout))
            }
            Err(e) => Err(format!("request failed: {}", error_chain(&e.without_url()))),
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Delay before the attempt after `attempt` failures: `backoff_min`
/// doubled per failure, capped at `backoff_max`, then jittered to a uniform
/// value in [delay/2, delay] so retries of many events spread out.
pub fn backoff(source: &Source, attempt: u32) -> Millis {
    let min = millis(source.backoff_min).max(1);
    let max = millis(source.backoff_max).max(min);
    let exp = attempt.saturating_sub(1).min(32);
    let delay = min.saturating_mul(1u64 << exp).min(max);
    rand::rng().random_range(delay / 2..=delay)
}
