//! Operational alerts (`[alerts]`): events dedupd stores in its own inbox
//! as the internal source [`ALERT_SOURCE`], so the dispatcher delivers
//! them with its retries, signing, dead letters and breaker.
//!
//! Raising an alert never waits: [`Alerts::raise`] queues it in memory
//! and [`Alerts::run`] stores it. While the store cannot take it (a disk
//! fault, Redis down) it stays queued, in order, and is stored once the
//! store answers; a restart loses what was queued.
//!
//! Rate limit: the first alert of a kind and source goes out at once and
//! starts an interval of `alerts.every`. Later ones within the interval
//! are folded: at its end the last of them is sent, its `suppressed`
//! counting the others. So a flapping breaker sends at most one
//! `source.paused` per interval, and the last alert of each kind is never
//! lost.
//!
//! Per instance, in memory, first. Where several instances share the inbox
//! (its [`Fleet`]), an alert this instance would send is then put to the
//! fleet before it is stored ([`Fleet::alert_turn`]): the fleet sends one
//! per interval, and an alert it folds is held until the fleet's interval
//! ends, then sent counting the fleet's folds, or dropped if another
//! instance sent them. `store.*` alerts skip the fleet: each says whether
//! *this* instance reaches the store (with the store down, instances could
//! not agree anyway), and names the instance.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{Notify, watch};

use super::Gateway;
use crate::clock::{Millis, SharedClock};
pub use crate::config::alerts::ALERT_SOURCE;
use crate::domain::CreatedAt;
use crate::store::fleet::{AlertMode, AlertTurn, Fleet};
use crate::store::inbox::NewEvent;
use crate::store::{Store, StoreError};
use crate::telemetry::metrics::Metrics;

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
    /// How the fleet is still to be asked about it, if there is one:
    /// `None` once it answered "send".
    #[serde(skip)]
    ask: Option<AlertMode>,
}

/// Per kind and source: when its interval started and what it folded.
#[derive(Debug, Default)]
struct Limit {
    /// Start of the current interval, Unix ms; 0 before the first alert.
    since: Millis,
    /// The latest alert folded into this interval, and how many were.
    folded: Option<(Alert, u64)>,
    /// The latest alert the fleet folded, and when the fleet's interval
    /// ends: it is put to the fleet again then.
    held: Option<(Alert, Millis)>,
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
    /// This process, as `store.*` alerts name it: `HOST:PID`.
    instance: String,
    /// Counts what became of each alert.
    metrics: Option<Arc<Metrics>>,
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
            instance: instance(),
            metrics: None,
            state: Mutex::new(State::default()),
            queued: Notify::new(),
        }
    }

    /// Counts what becomes of each alert in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    fn count(&self, kind: &'static str, outcome: &'static str) {
        if let Some(m) = &self.metrics {
            m.alert(kind, outcome);
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
            ask: Some(AlertMode::Raise),
        };
        let mut state = self.state();
        let limit = state
            .limits
            .entry((kind, source.map(str::to_owned)))
            .or_default();
        if limit.since != 0 && now < limit.since.saturating_add(self.every_ms) {
            let count = limit.folded.as_ref().map_or(0, |(_, n)| *n) + 1;
            limit.folded = Some((alert, count));
            drop(state);
            self.count(kind, "folded");
            return;
        }
        limit.since = now.max(1);
        self.push(&mut state.queue, alert);
        drop(state);
        self.queued.notify_one();
    }

    /// Queues the folded alert of each interval that ended by `now` (it
    /// starts a new interval), and each alert the fleet folded whose
    /// interval ended by `now`.
    fn flush(&self, now: Millis) {
        let mut state = self.state();
        let mut due: Vec<Alert> = Vec::new();
        for limit in state.limits.values_mut() {
            if now >= limit.since.saturating_add(self.every_ms)
                && let Some((mut alert, n)) = limit.folded.take()
            {
                alert.suppressed = n - 1;
                alert.ask = Some(AlertMode::Raise);
                limit.since = now.max(1);
                due.push(alert);
            }
            if limit.held.as_ref().is_some_and(|(_, until)| now >= *until)
                && let Some((mut alert, _)) = limit.held.take()
            {
                alert.ask = Some(AlertMode::Flush);
                due.push(alert);
            }
        }
        due.sort_by_key(|a| a.at_ms);
        for alert in due {
            self.push(&mut state.queue, alert);
        }
    }

    /// Asks the fleet about the first queued alert, if it is one the
    /// fleet decides and has not answered yet: whether it is still to be
    /// stored. Err when the fleet could not be asked (it stays first in
    /// the queue for the next try).
    async fn ask_fleet(&self, fleet: &dyn Fleet, alert: &Alert) -> Result<bool, StoreError> {
        let Some(mode) = alert.ask.filter(|_| fleet_wide(alert.kind)) else {
            return Ok(true);
        };
        let turn = fleet
            .alert_turn(
                alert.kind,
                alert.source.as_deref(),
                self.every_ms,
                mode,
                alert.suppressed,
                self.clock.now_ms(),
            )
            .await?;
        Ok(self.answered(turn))
    }

    /// Applies the fleet's answer about the first queued alert: whether
    /// it is still to be stored. Folded, it is held until the fleet's
    /// interval ends (in place of one held before, which the fleet counted
    /// too); gone, it is dropped.
    fn answered(&self, turn: AlertTurn) -> bool {
        let mut state = self.state();
        let Some(alert) = state.queue.front_mut() else {
            return false;
        };
        let kind = alert.kind;
        let outcome = match turn {
            AlertTurn::Send { suppressed } => {
                alert.suppressed = suppressed;
                alert.ask = None;
                return true;
            }
            AlertTurn::Fold { until } => {
                let Some(mut alert) = state.queue.pop_front() else {
                    return false;
                };
                let limit = state
                    .limits
                    .entry((alert.kind, alert.source.clone()))
                    .or_default();
                let until = match limit.held.take() {
                    // Should the fleet lose its count, the one sent at the
                    // end still counts both.
                    Some((before, was)) => {
                        alert.suppressed += 1 + before.suppressed;
                        until.max(was)
                    }
                    None => until,
                };
                limit.held = Some((alert, until));
                "folded"
            }
            AlertTurn::Gone => {
                state.queue.pop_front();
                "gone"
            }
        };
        drop(state);
        self.count(kind, outcome);
        false
    }

    /// Stores the queued alerts in the inbox, in order, each put to the
    /// fleet first where there is one, until one fails (it stays first in
    /// the queue for the next try: with Redis down, the fleet is asked
    /// once it is back).
    async fn store_queued(&self, gateway: &Gateway) {
        loop {
            let Some(alert) = self.state().queue.front().cloned() else {
                return;
            };
            if let Some(fleet) = gateway.inbox.fleet() {
                match self.ask_fleet(fleet, &alert).await {
                    Ok(true) => {}
                    Ok(false) => continue,
                    Err(e) => {
                        tracing::warn!(kind = alert.kind, error = %e.chain(), "cannot ask the fleet about an alert yet; kept in memory");
                        return;
                    }
                }
            }
            let Some(alert) = self.state().queue.front().cloned() else {
                return;
            };
            let event = self.event(&alert);
            let now = self.clock.now_ms();
            match gateway.inbox.ingest(event, now).await {
                Ok(_) => {
                    self.state().queue.pop_front();
                    self.count(alert.kind, "sent");
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
                    serde_json::json!({
                        "reason": reason,
                        "error": e.to_string(),
                        "instance": self.instance,
                    }),
                );
            }
            (Some(false), Ok(())) => self.raise(
                "store.recovered",
                None,
                serde_json::json!({ "instance": self.instance }),
            ),
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

    /// Queues `alert` last; with the queue full, the oldest goes.
    fn push(&self, queue: &mut VecDeque<Alert>, alert: Alert) {
        if queue.len() >= QUEUE_MAX
            && let Some(lost) = queue.pop_front()
        {
            tracing::warn!(
                kind = lost.kind,
                "alert queue full: the oldest alert is dropped"
            );
            self.count(lost.kind, "dropped");
        }
        queue.push_back(alert);
    }
}

/// Whether the fleet decides when alerts of `kind` go out: all but the
/// store's, which each instance tells of itself.
fn fleet_wide(kind: &str) -> bool {
    !kind.starts_with("store.")
}

/// `HOST:PID`: which instance a `store.*` alert is about.
fn instance() -> String {
    let host = rustix::system::uname();
    format!(
        "{}:{}",
        host.nodename().to_string_lossy(),
        std::process::id()
    )
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

    fn front(alerts: &Alerts) -> Option<(u64, Option<AlertMode>)> {
        alerts.state().queue.front().map(|a| (a.suppressed, a.ask))
    }

    #[test]
    fn an_alert_the_fleet_folds_is_held_until_the_fleets_interval_ends_then_flushed() {
        let clock = ManualClock::new(1_000_000);
        let metrics = Arc::new(Metrics::new(&[]));
        let alerts = Alerts::new(
            Arc::new(clock.clone()),
            Duration::from_secs(60),
            Duration::from_secs(900),
        )
        .with_metrics(metrics.clone());
        let none = serde_json::json!({});
        alerts.raise("backlog.stale", Some("a"), none.clone());
        assert_eq!(front(&alerts), Some((0, Some(AlertMode::Raise))));
        // Folded by the fleet: held, not stored.
        assert!(!alerts.answered(AlertTurn::Fold { until: 1_030_000 }));
        assert_eq!(front(&alerts), None);
        alerts.flush(1_029_999);
        assert_eq!(front(&alerts), None);
        alerts.flush(1_030_000);
        assert_eq!(front(&alerts), Some((0, Some(AlertMode::Flush))));
        // Another instance sent it.
        assert!(!alerts.answered(AlertTurn::Gone));
        assert_eq!(front(&alerts), None);

        // Two folded by the fleet in a row: the later is held in place of
        // the earlier, and carries it.
        clock.advance(Duration::from_secs(60));
        alerts.raise("backlog.stale", Some("a"), none.clone());
        assert!(!alerts.answered(AlertTurn::Fold { until: 1_090_000 }));
        clock.advance(Duration::from_secs(60));
        alerts.raise("backlog.stale", Some("a"), none.clone());
        assert!(!alerts.answered(AlertTurn::Fold { until: 1_150_000 }));
        alerts.flush(1_149_999);
        assert_eq!(front(&alerts), None);
        alerts.flush(1_150_000);
        assert_eq!(front(&alerts), Some((1, Some(AlertMode::Flush))));
        // Sent: stored with the fleet's count, not asked again.
        assert!(alerts.answered(AlertTurn::Send { suppressed: 4 }));
        assert_eq!(front(&alerts), Some((4, None)));

        let text = metrics.render();
        for (outcome, n) in [("folded", 3), ("gone", 1)] {
            let line =
                format!("dedupd_alerts_total{{kind=\"backlog.stale\",outcome=\"{outcome}\"}} {n}");
            assert!(text.contains(&line), "{line} in:\n{text}");
        }
    }
}
