//! Operational alerts (`[alerts]`): events dedupd stores in its own inbox
//! as the internal source [`ALERT_SOURCE`], so the dispatcher delivers
//! them with its retries, signing, dead letters and breaker.
//!
//! Raising an alert never waits: [`Alerts::raise`] queues it in memory
//! and [`Alerts::run`] stores it. While the store cannot take it (a disk
//! fault, Redis down) it stays queued, in order, and is stored once the
//! store answers; a restart loses what was queued.
//!
//! Rate limit, per instance: the first alert of a kind and source goes
//! out at once and starts an interval of `alerts.every`. Later ones within
//! the interval are folded: at its end the last of them is sent, its
//! `suppressed` counting the others. So a flapping breaker sends at most
//! one `source.paused` per interval, and the last alert of each kind is
//! never lost.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{Notify, watch};

use super::Gateway;
use crate::clock::{Millis, SharedClock};
pub use crate::config::alerts::ALERT_SOURCE;
use crate::domain::CreatedAt;
use crate::store::inbox::NewEvent;
use crate::store::{Store, StoreError};

/// Most alerts held in memory while the store cannot take them; beyond,
/// the oldest are dropped (and logged).
const QUEUE_MAX: usize = 1000;
/// How often queued and folded alerts, the backlog and the store are
/// looked at.
const TICK: Duration = Duration::from_secs(1);

/// One alert, as its receiver gets it (the JSON body).
#[derive(Debug, Clone, Serialize)]
pub struct Alert {
    /// `source.paused`, `source.resumed`, `event.dead`, `backlog.stale`,
    /// `store.degraded` or `store.recovered`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// When it happened, RFC 3339.
    pub at: String,
    /// The source it is about, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// What happened, by kind.
    pub detail: serde_json::Value,
    /// Alerts of this kind and source folded into this one.
    pub suppressed: u64,
    /// When it happened, Unix ms (the event's id and `created_at`).
    #[serde(skip)]
    at_ms: Millis,
}

/// Per kind and source: when its interval started and what it folded.
#[derive(Debug, Default)]
struct Limit {
    /// Start of the current interval, Unix ms; 0 before the first alert.
    since: Millis,
    /// The latest alert folded into this interval, and how many were.
    folded: Option<(Alert, u64)>,
}

#[derive(Debug, Default)]
struct State {
    /// By kind and source: at most six kinds per configured source (and
    /// two without one), so bounded by the configuration.
    limits: HashMap<(&'static str, Option<String>), Limit>,
    /// Alerts to store, oldest first.
    queue: VecDeque<Alert>,
    /// Sources whose backlog is stale now (alerted once per stale spell).
    stale: HashMap<String, bool>,
    /// Whether the store was ready at the last look.
    ready: Option<bool>,
    /// Alerts stored by this process: with `run`, makes each event id
    /// unique (two alerts may share a millisecond).
    seq: u64,
}

/// Raises, rate-limits and stores alerts.
#[derive(Debug)]
pub struct Alerts {
    /// Times the alerts (`at`) and the rate limit.
    clock: SharedClock,
    /// `alerts.every`, ms.
    every_ms: u64,
    /// `alerts.backlog_after`, ms.
    backlog_after_ms: u64,
    /// Distinguishes this process's alert ids from a restarted one's.
    run: u32,
    /// Rate limits and the queue; held briefly, never across an await.
    state: Mutex<State>,
    /// Wakes [`Alerts::run`] when an alert is queued.
    queued: Notify,
}

impl Alerts {
    /// Alerts limited to one per kind and source per `every`.
    pub fn new(clock: SharedClock, every: Duration, backlog_after: Duration) -> Self {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        Self {
            clock,
            every_ms: ms(every).max(1),
            backlog_after_ms: ms(backlog_after),
            run: rand::random(),
            state: Mutex::new(State::default()),
            queued: Notify::new(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Raises an alert of `kind`, about `source` if any. Never about the
    /// alerts source itself: its own failures would raise alerts about
    /// alerts.
    pub fn raise(&self, kind: &'static str, source: Option<&str>, detail: serde_json::Value) {
        if source == Some(ALERT_SOURCE) {
            return;
        }
        let now = self.clock.now_ms();
        let alert = Alert {
            kind,
            at: rfc3339(now),
            source: source.map(str::to_owned),
            detail,
            suppressed: 0,
            at_ms: now,
        };
        let mut state = self.state();
        let limit = state
            .limits
            .entry((kind, source.map(str::to_owned)))
            .or_default();
        if limit.since != 0 && now < limit.since.saturating_add(self.every_ms) {
            let count = limit.folded.as_ref().map_or(0, |(_, n)| *n) + 1;
            limit.folded = Some((alert, count));
            return;
        }
        limit.since = now.max(1);
        push(&mut state.queue, alert);
        drop(state);
        self.queued.notify_one();
    }

    /// Queues the folded alert of each interval that ended by `now`; it
    /// starts a new interval.
    fn flush(&self, now: Millis) {
        let mut state = self.state();
        let mut due: Vec<Alert> = Vec::new();
        for limit in state.limits.values_mut() {
            if now >= limit.since.saturating_add(self.every_ms)
                && let Some((mut alert, n)) = limit.folded.take()
            {
                alert.suppressed = n - 1;
                limit.since = now.max(1);
                due.push(alert);
            }
        }
        due.sort_by_key(|a| a.at_ms);
        for alert in due {
            push(&mut state.queue, alert);
        }
    }

    /// Stores the queued alerts in the inbox, in order, until one fails
    /// (it stays first in the queue for the next try).
    async fn store_queued(&self, gateway: &Gateway) {
        loop {
            let Some(alert) = self.state().queue.front().cloned() else {
                return;
            };
            let event = self.event(&alert);
            let now = self.clock.now_ms();
            match gateway.inbox.ingest(event, now).await {
                Ok(_) => {
                    self.state().queue.pop_front();
                    gateway.arrivals.push(
                        ALERT_SOURCE,
                        None,
                        CreatedAt::from_unix_nanos(i128::from(alert.at_ms) * 1_000_000),
                    );
                    gateway.wake.notify_one();
                }
                Err(e) => {
                    tracing::warn!(kind = alert.kind, error = %e.chain(), "cannot store an alert yet; kept in memory");
                    return;
                }
            }
        }
    }

    fn event(&self, alert: &Alert) -> NewEvent {
        let seq = {
            let mut state = self.state();
            state.seq += 1;
            state.seq
        };
        NewEvent {
            source: ALERT_SOURCE.to_owned(),
            event_id: format!("alert_{}_{:08x}_{seq}", alert.at_ms, self.run),
            stream: None,
            created_at: CreatedAt::from_unix_nanos(i128::from(alert.at_ms) * 1_000_000),
            received_at_ms: alert.at_ms,
            headers: vec![("content-type".into(), "application/json".into())],
            body: serde_json::to_vec(alert).unwrap_or_default(),
        }
    }

    /// `backlog.stale` for each source whose oldest pending event is older
    /// than `alerts.backlog_after`, once per stale spell.
    async fn check_backlog(&self, gateway: &Gateway, now: Millis) {
        let Ok(summary) = gateway.inbox.inbox_summary().await else {
            return;
        };
        // A bulk job replays old events: no backlog alert for its source
        // while it runs (as the shipped alert rule holds off).
        let Ok(jobs) = super::jobs::list(gateway.inbox.as_ref()).await else {
            return;
        };
        let mut raise = Vec::new();
        {
            let mut state = self.state();
            // Rebuilt each look: a source that left the summary (its
            // events reaped) starts its next stale spell afresh.
            let mut stale_now = HashMap::new();
            for s in summary {
                if s.source == ALERT_SOURCE {
                    continue;
                }
                let age = s.oldest_pending_ms.map(|t| now.saturating_sub(t));
                let replaying = jobs
                    .iter()
                    .any(|j| j.source == s.source && j.state == super::jobs::JobState::Running);
                let stale = age.is_some_and(|a| a > self.backlog_after_ms) && !replaying;
                let was = state.stale.get(&s.source).copied().unwrap_or(false);
                if stale && !was {
                    raise.push((s.source.clone(), s.pending, age.unwrap_or(0)));
                }
                stale_now.insert(s.source, stale);
            }
            state.stale = stale_now;
        }
        for (source, pending, age) in raise {
            self.raise(
                "backlog.stale",
                Some(&source),
                serde_json::json!({ "pending": pending, "oldest_pending_age_ms": age }),
            );
        }
    }

    /// `store.degraded` when the store stops answering (or its disk fills),
    /// `store.recovered` when it answers again. Told by each look at
    /// readiness: this task's own, once a tick, and every `/readyz` and
    /// scrape (`routes::health::readiness`), so a turn a probe saw is
    /// never missed between two ticks.
    pub fn readiness(&self, ready: &Result<(), StoreError>) {
        let was = self.state().ready.replace(ready.is_ok());
        match (was, ready) {
            (Some(true) | None, Err(e)) => {
                let reason = match e {
                    StoreError::LowSpace { .. } => "disk_low",
                    _ => "store_unavailable",
                };
                self.raise(
                    "store.degraded",
                    None,
                    serde_json::json!({ "reason": reason, "error": e.to_string() }),
                );
            }
            (Some(false), Ok(())) => self.raise("store.recovered", None, serde_json::json!({})),
            _ => {}
        }
    }

    async fn check_store(&self, gateway: &Gateway, store: &dyn Store) {
        let ready = match store.ready().await {
            Ok(()) => gateway.inbox.ready().await,
            failed => failed,
        };
        self.readiness(&ready);
    }

    /// Stores queued alerts, sends folded ones at their interval's end and
    /// watches the backlog and the store, until `stop`.
    pub async fn run(
        self: Arc<Self>,
        gateway: Arc<Gateway>,
        store: Arc<dyn Store>,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut tick = tokio::time::interval(TICK);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    let now = self.clock.now_ms();
                    self.check_store(&gateway, store.as_ref()).await;
                    self.check_backlog(&gateway, now).await;
                    self.flush(now);
                }
                _ = self.queued.notified() => {}
                _ = stop.changed() => return,
            }
            self.store_queued(&gateway).await;
        }
    }
}

fn push(queue: &mut VecDeque<Alert>, alert: Alert) {
    if queue.len() >= QUEUE_MAX
        && let Some(lost) = queue.pop_front()
    {
        tracing::warn!(
            kind = lost.kind,
            "alert queue full: the oldest alert is dropped"
        );
    }
    queue.push_back(alert);
}

fn rfc3339(ms: Millis) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock};

    fn queued(alerts: &Alerts) -> Vec<(&'static str, Option<String>, u64)> {
        alerts
            .state()
            .queue
            .drain(..)
            .map(|a| (a.kind, a.source, a.suppressed))
            .collect()
    }

    #[test]
    fn the_first_alert_of_a_kind_and_source_goes_at_once_and_the_rest_fold_into_the_last() {
        let clock = ManualClock::new(1_000_000);
        let alerts = Alerts::new(
            Arc::new(clock.clone()),
            Duration::from_secs(60),
            Duration::from_secs(900),
        );
        let none = serde_json::json!({});
        alerts.raise("source.paused", Some("a"), none.clone());
        alerts.raise("source.paused", Some("b"), none.clone());
        alerts.raise("source.resumed", Some("a"), none.clone());
        for _ in 0..3 {
            clock.advance(Duration::from_secs(1));
            alerts.raise("source.paused", Some("a"), none.clone());
        }
        assert_eq!(
            queued(&alerts),
            [
                ("source.paused", Some("a".into()), 0),
                ("source.paused", Some("b".into()), 0),
                ("source.resumed", Some("a".into()), 0),
            ]
        );
        // Never about the alerts source itself.
        alerts.raise("event.dead", Some(ALERT_SOURCE), none.clone());
        alerts.flush(clock.now_ms());
        assert!(queued(&alerts).is_empty(), "the interval has not ended");

        clock.advance(Duration::from_secs(60));
        alerts.flush(clock.now_ms());
        assert_eq!(queued(&alerts), [("source.paused", Some("a".into()), 2)]);
        // The flush started a new interval: the next one folds again.
        alerts.raise("source.paused", Some("a"), none.clone());
        assert!(queued(&alerts).is_empty());
        clock.advance(Duration::from_secs(60));
        alerts.flush(clock.now_ms());
        assert_eq!(queued(&alerts), [("source.paused", Some("a".into()), 0)]);
        // A quiet interval: the next alert goes at once.
        clock.advance(Duration::from_secs(60));
        alerts.flush(clock.now_ms());
        alerts.raise("source.paused", Some("a"), none);
        assert_eq!(queued(&alerts), [("source.paused", Some("a".into()), 0)]);
    }
}
