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
    /// `(source, stream)` pairs with a delivery in flight.
    busy_streams: Mutex<HashSet<(String, String)>>,
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
            busy_streams: Mutex::new(HashSet::new()),
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
        let busy = self.busy_streams.lock().map(|b| b.len()).unwrap_or(0);
        let (events, next) = match self.gateway.inbox.due_events(now, free + busy + 1).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the inbox; retrying");
                return None;
            }
        };
        let mut picked = Vec::new();
        let mut more = false;
        for ev in events {
            if picked.len() == free {
                // More is runnable than workers are free: a finishing
                // delivery wakes the dispatcher.
                more = true;
                break;
            }
            let Some(source) = self.gateway.source(&ev.source).cloned() else {
                // Its source left the configuration; it stays pending.
                continue;
            };
            if let Some(stream) = &ev.stream {
                let Ok(mut busy) = self.busy_streams.lock() else {
                    continue;
                };
                if !busy.insert((ev.source.clone(), stream.clone())) {
                    continue;
                }
            }
            picked.push((source, ev));
        }
        if picked.is_empty() {
            return next;
        }
        let leases = picked
            .iter()
            .map(|(s, ev)| {
                let timeout = u64::try_from(s.forward_timeout.as_millis()).unwrap_or(u64::MAX);
                (
                    ev.source.clone(),
                    ev.event_id.clone(),
                    now.saturating_add(timeout).saturating_add(GRACE_MS),
                )
            })
            .collect();
        if let Err(e) = self.gateway.inbox.lease(leases, now).await {
            tracing::warn!(error = %e, "cannot lease events; retrying");
            for (_, ev) in &picked {
                self.unbusy(ev);
            }
            return None;
        }
        for (source, ev) in picked {
            let Ok(permit) = permits.clone().acquire_owned().await else {
                break;
            };
            let this = self.clone();
            tasks.spawn(async move {
                this.deliver(&source, &ev).await;
                this.unbusy(&ev);
                drop(permit);
                this.gateway.wake.notify_one();
            });
        }
        if more { None } else { next }
    }

    fn unbusy(&self, ev: &InboxEvent) {
        if let (Some(stream), Ok(mut busy)) = (&ev.stream, self.busy_streams.lock()) {
            busy.remove(&(ev.source.clone(), stream.clone()));
        }
    }

    async fn settle(&self, ev: &InboxEvent, settle: Settle) {
        let now = self.clock.now_ms();
        if let Err(e) = self
            .gateway
            .inbox
            .settle(
                &ev.source,
                &ev.event_id,
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

    /// One delivery turn of one event.
    async fn deliver(&self, source: &Source, ev: &InboxEvent) {
        let ns = Namespace::Gateway(source.name.clone());
        let now = self.clock.now_ms();
        let retry_soon = now.saturating_add(millis(source.backoff_min));
        let Ok(id) = Key::parse(&ev.event_id, "event_id") else {
            self.settle(
                ev,
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
                // Delivered already, by another instance sharing the store.
                self.settle(ev, Settle::Delivered { attempted: false })
                    .await;
                return;
            }
            Ok(_) => {
                let error = "another worker holds this event's claim".to_owned();
                self.settle(
                    ev,
                    Settle::Retry {
                        retry_at: retry_soon,
                        error,
                        attempted: false,
                    },
                )
                .await;
                return;
            }
            Err(e) => {
                self.settle(
                    ev,
                    Settle::Retry {
                        retry_at: retry_soon,
                        error: e.to_string(),
                        attempted: false,
                    },
                )
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
                    self.settle(ev, Settle::Stale).await;
                    return;
                }
                Ok(_) => {}
                Err(e) => {
                    self.release(&key, token).await;
                    self.settle(
                        ev,
                        Settle::Retry {
                            retry_at: retry_soon,
                            error: e.to_string(),
                            attempted: false,
                        },
                    )
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
                if let Err(e) = self.store.done(&key, token, self.done_ttl, now).await {
                    tracing::warn!(error = %e, "cannot mark the delivered event done");
                }
                if let Some(stream_key) = &stream_key
                    && let Err(e) = self
                        .store
                        .apply(
                            stream_key,
                            &key,
                            ev.created_at,
                            self.ordering_retention_ms,
                            now,
                        )
                        .await
                {
                    tracing::warn!(error = %e, "cannot move the stream head");
                }
                tracing::info!(source = %source.name, event_id = %ev.event_id, attempt, "delivered");
                self.settle(ev, Settle::Delivered { attempted: true }).await;
            }
            Err(error) => {
                self.release(&key, token).await;
                if attempt >= source.max_attempts {
                    tracing::warn!(source = %source.name, event_id = %ev.event_id, attempt, %error, "dead: every attempt failed");
                    self.settle(ev, Settle::Dead { error }).await;
                } else {
                    let retry_at = now.saturating_add(backoff(source, attempt));
                    tracing::info!(source = %source.name, event_id = %ev.event_id, attempt, %error, retry_at, "delivery failed; will retry");
                    self.settle(
                        ev,
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
            Err(e) => Err(format!("request failed: {}", error_chain(&e))),
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
