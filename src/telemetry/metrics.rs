//! Prometheus metrics: the families, their labels, and the registry behind
//! `GET /metrics`.
//!
//! Each application owns its registry (no global recorder), so two apps in
//! one process — the tests start many — count only their own traffic.
//! Every family is registered when the app is built, with every label
//! value known then (sources, outcomes, refusal codes), so a dashboard sees
//! zeros from the first scrape instead of missing series.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, PoisonError, RwLock};

use arc_swap::ArcSwap;
use metrics::{Counter, Gauge, Histogram, Key, Label, Metadata, Recorder, Unit};
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};

use crate::clock::Millis;
use crate::domain::AuthPort;
use crate::store::StoreError;
use crate::store::inbox::{DiskSpace, KeysInMemory, SourceSummary};

/// HTTP request latency by `method`, `route` (the pattern), `status`.
pub const HTTP_DURATION: &str = "dedupd_http_request_duration_seconds";
/// Claim requests by `outcome`.
pub const CLAIMS: &str = "dedupd_claims_total";
/// done / release / extend requests by `op` and `outcome`.
pub const CLAIM_OPS: &str = "dedupd_claim_ops_total";
/// Stream applies by `outcome`.
pub const APPLIES: &str = "dedupd_applies_total";
/// Webhooks received by `source` and `outcome` (accepted, filtered,
/// duplicate, handshake, or the refusal's error code).
pub const INGEST: &str = "dedupd_ingest_total";
/// Delivery turns by `source` and `outcome`.
pub const DELIVERIES: &str = "dedupd_deliveries_total";
/// Time of one delivery request to the application, by `source`.
pub const DELIVERY_DURATION: &str = "dedupd_delivery_duration_seconds";
/// Events in the inbox by `source` and `status`.
pub const INBOX_EVENTS: &str = "dedupd_inbox_events";
/// Age of each source's oldest pending event.
pub const OLDEST_PENDING: &str = "dedupd_oldest_pending_seconds";
/// 1 while a source's circuit breaker holds its deliveries (paused or
/// probing), by `source`.
pub const SOURCE_PAUSED: &str = "dedupd_source_paused";
/// Bulk jobs running on a source (on any instance of a shared inbox), by
/// `source`.
pub const JOBS_RUNNING: &str = "dedupd_jobs_running";
/// 1 while `/readyz` would answer 200.
pub const READY: &str = "dedupd_ready";
/// Times readiness, as evaluated by `/readyz` and each scrape, turned.
pub const READY_CHANGES: &str = "dedupd_ready_changes_total";
/// 1 while the store answers (readiness fails for another reason, or not
/// at all), 0 while it cannot be reached or written.
pub const STORE_UP: &str = "dedupd_store_up";
/// Time of one group commit (a batch: one log record and sync) of the
/// embedded store.
pub const STORE_COMMIT: &str = "dedupd_store_commit_seconds";
/// Writes per group commit.
pub const STORE_BATCH: &str = "dedupd_store_batch_size";
/// Time of one checkpoint of the embedded store.
pub const STORE_CHECKPOINT: &str = "dedupd_store_checkpoint_seconds";
/// Bytes free on the data file's disk, read at each scrape.
pub const STORE_FREE_BYTES: &str = "dedupd_store_free_bytes";
/// `storage.min_free_bytes`: writes are refused below it.
pub const STORE_MIN_FREE_BYTES: &str = "dedupd_store_min_free_bytes";
/// Keys the embedded store keeps in memory, by `space` (`claims`,
/// `keyspace`).
pub const STORE_KEYS_IN_MEMORY: &str = "dedupd_store_keys_in_memory";
/// The memory those keys take, estimated.
pub const STORE_KEY_MEMORY: &str = "dedupd_store_key_memory_bytes";
/// `storage.max_key_memory_bytes`, resolved: at it, new keys are refused.
pub const STORE_MAX_KEY_MEMORY: &str = "dedupd_store_max_key_memory_bytes";
/// Records the reaper deleted, by `table`.
pub const REAPER_DELETED: &str = "dedupd_reaper_deleted_total";
/// Always 1; the `version` label carries the build's version.
pub const BUILD_INFO: &str = "dedupd_build_info";
/// Credentials that did not authenticate, by `port` (`http`, `resp`).
pub const AUTH_FAILURES: &str = "dedupd_auth_failures_total";
/// Attempts refused unread because their peer failed too often, by `port`.
pub const AUTH_THROTTLED: &str = "dedupd_auth_throttled_total";
/// Gates of the fleet's lane state asked, by source and answer.
pub const FLEET_GATES: &str = "dedupd_fleet_gates_total";
/// Leases on events of the shared inbox renewed by the heartbeat, by outcome.
pub const LEASE_RENEWALS: &str = "dedupd_lease_renewals_total";
/// Outcomes of `dedupd_lease_renewals_total`.
pub const LEASE_RENEWAL_OUTCOMES: [&str; 3] = ["renewed", "lost", "failed"];
/// Trace spans sent to the collector (with `[telemetry.traces]`).
pub const TRACE_SPANS_EXPORTED: &str = "dedupd_trace_spans_exported_total";
/// Trace spans dropped, by `reason`: `queue_full` (the exporter fell
/// behind) or `export_failed` (the collector refused, failed or timed out).
pub const TRACE_SPANS_DROPPED: &str = "dedupd_trace_spans_dropped_total";
/// HTTP connections closed at once because their address held
/// `http.max_connections_per_address` already.
pub const HTTP_PEER_REFUSED: &str = "dedupd_http_connections_refused_total";
/// Alerts (`[alerts]`) by `kind` and `outcome`.
pub const ALERTS: &str = "dedupd_alerts_total";

/// Outcomes of a claim request.
pub const CLAIM_OUTCOMES: [&str; 4] = ["claimed", "busy", "done", "fingerprint_mismatch"];
/// Outcomes of done, release and extend, by op.
pub const CLAIM_OP_OUTCOMES: [(&str, &[&str]); 3] = [
    ("done", &["done", "not_owner"]),
    ("release", &["released", "not_held", "not_owner", "done"]),
    ("extend", &["extended", "lost", "not_owner", "done"]),
];
/// Outcomes of an apply.
pub const APPLY_OUTCOMES: [&str; 3] = ["applied", "stale", "duplicate"];
/// Outcomes of ingest known up front: the answers and every refusal code.
pub const INGEST_OUTCOMES: [&str; 16] = [
    "accepted",
    "filtered",
    "duplicate",
    "handshake",
    "missing_signature",
    "malformed_signature",
    "timestamp_out_of_tolerance",
    "bad_signature",
    "body_too_large",
    "body_timeout",
    "missing_event_id",
    "invalid_event_id",
    "invalid_stream",
    "invalid_created_at",
    "store_unavailable",
    "internal",
];
/// Outcomes of a delivery turn: `failed` is an attempt to be retried,
/// `dead` the attempt after which no more are made.
pub const DELIVERY_OUTCOMES: [&str; 4] = ["delivered", "failed", "stale", "dead"];
/// Inbox statuses.
pub const STATUSES: [&str; 4] = ["pending", "delivered", "stale", "dead"];
/// The kinds of alert (`[alerts]`).
pub const ALERT_KINDS: [&str; 6] = [
    "source.paused",
    "source.resumed",
    "event.dead",
    "backlog.stale",
    "store.degraded",
    "store.recovered",
];
/// What became of an alert: `sent` (stored for delivery), `folded` (into
/// a later one of its kind and source, by this instance or the fleet),
/// `gone` (a folded one another instance of the fleet sent), `dropped`
/// (the queue of alerts waiting for the store was full).
pub const ALERT_OUTCOMES: [&str; 4] = ["sent", "folded", "gone", "dropped"];
/// Tables the reaper deletes from (`kv`: the Redis protocol's keyspace).
pub const REAPED_TABLES: [&str; 6] = [
    "claims",
    "applied_events",
    "stream_heads",
    "inbox",
    "inbox_dedupe",
    "kv",
];

/// Latency buckets, seconds: 0.1 ms to 30 s.
const SECONDS_BUCKETS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    10.0, 30.0,
];
/// Batch-size buckets, writes per commit.
const BATCH_BUCKETS: [f64; 10] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0];

/// Metadata the recorder asks for; the Prometheus exporter ignores it.
static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

/// Counters of one source's ingest and delivery.
#[derive(Debug, Clone)]
struct SourceHandles {
    /// `dedupd_ingest_total` by outcome.
    ingest: HashMap<&'static str, Counter>,
    /// `dedupd_deliveries_total` by outcome.
    deliveries: HashMap<&'static str, Counter>,
    /// `dedupd_delivery_duration_seconds`.
    delivery_duration: Histogram,
    /// `dedupd_source_paused`.
    paused: Gauge,
    /// `dedupd_jobs_running`.
    jobs: Gauge,
}

impl SourceHandles {
    /// Registers `source`'s series in `recorder`, the gauges at zero.
    fn register(recorder: &PrometheusRecorder, s: &str) -> Self {
        let counter = |name: &'static str, labels: Vec<Label>| {
            recorder.register_counter(&Key::from_parts(name, labels), &METADATA)
        };
        let source = || Label::new("source", s.to_owned());
        let handles = SourceHandles {
            ingest: INGEST_OUTCOMES
                .iter()
                .map(|o| {
                    (
                        *o,
                        counter(INGEST, vec![source(), Label::new("outcome", *o)]),
                    )
                })
                .collect(),
            deliveries: DELIVERY_OUTCOMES
                .iter()
                .map(|o| {
                    (
                        *o,
                        counter(DELIVERIES, vec![source(), Label::new("outcome", *o)]),
                    )
                })
                .collect(),
            delivery_duration: recorder.register_histogram(
                &Key::from_parts(DELIVERY_DURATION, vec![source()]),
                &METADATA,
            ),
            paused: recorder
                .register_gauge(&Key::from_parts(SOURCE_PAUSED, vec![source()]), &METADATA),
            jobs: recorder
                .register_gauge(&Key::from_parts(JOBS_RUNNING, vec![source()]), &METADATA),
        };
        handles.paused.set(0.0);
        handles.jobs.set(0.0);
        handles
    }
}

/// One latency series of a route: method, status, its handle.
type HttpSeries = (String, u16, Histogram);

/// The application's metrics.
pub struct Metrics {
    /// The registry every handle records into.
    recorder: PrometheusRecorder,
    /// Renders the registry.
    handle: PrometheusHandle,
    /// `dedupd_claims_total` by outcome, in [`CLAIM_OUTCOMES`] order.
    claims: [Counter; 4],
    /// `dedupd_applies_total` by outcome, in [`APPLY_OUTCOMES`] order.
    applies: [Counter; 3],
    /// Per source configured since the start: one a reload adds is
    /// registered then ([`Metrics::add_sources`]); one it removes keeps
    /// its series (counters do not go back).
    sources: ArcSwap<HashMap<String, SourceHandles>>,
    /// Sources whose inbox gauges were set: configured ones, and removed
    /// ones once they had events.
    gauge_sources: Mutex<BTreeSet<String>>,
    /// `dedupd_http_request_duration_seconds` handles by route, then
    /// method and status: registering a series per request (three label
    /// strings, the registry's lookup) was a few percent of a claim's
    /// HTTP time.
    http: RwLock<HashMap<String, Vec<HttpSeries>>>,
    /// `dedupd_store_commit_seconds`.
    pub store_commit: Histogram,
    /// `dedupd_store_batch_size`.
    pub store_batch: Histogram,
    /// `dedupd_store_checkpoint_seconds`.
    pub store_checkpoint: Histogram,
    /// `dedupd_auth_failures_total`, in [`AuthPort::ALL`] order.
    auth_failures: [Counter; 2],
    /// `dedupd_auth_throttled_total`, in [`AuthPort::ALL`] order.
    auth_throttled: [Counter; 2],
    /// `dedupd_http_connections_refused_total`.
    http_peer_refused: Counter,
    /// `dedupd_ready`.
    ready: Gauge,
    /// `dedupd_ready_changes_total`.
    ready_changes: Counter,
    /// `dedupd_store_up`.
    store_up: Gauge,
    /// The last readiness evaluated: [`UNKNOWN`] before the first, else
    /// [`READY_NO`] or [`READY_YES`].
    last_ready: AtomicU8,
}

/// [`Metrics::last_ready`] before readiness was first evaluated: the first
/// evaluation is not a change.
const UNKNOWN: u8 = 0;
/// [`Metrics::last_ready`]: not ready.
const READY_NO: u8 = 1;
/// [`Metrics::last_ready`]: ready.
const READY_YES: u8 = 2;

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// A registry with every family registered for `sources`.
    pub fn new(sources: &[String]) -> Self {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &SECONDS_BUCKETS)
            .and_then(|b| {
                b.set_buckets_for_metric(Matcher::Full(STORE_BATCH.into()), &BATCH_BUCKETS)
            })
            .expect("the bucket lists are not empty")
            .build_recorder();
        let handle = recorder.handle();
        describe(&recorder);
        let counter = |name: &'static str, labels: Vec<Label>| {
            recorder.register_counter(&Key::from_parts(name, labels), &METADATA)
        };
        let claims = CLAIM_OUTCOMES.map(|o| counter(CLAIMS, vec![Label::new("outcome", o)]));
        for (op, outcomes) in CLAIM_OP_OUTCOMES {
            for o in outcomes {
                counter(
                    CLAIM_OPS,
                    vec![Label::new("op", op), Label::new("outcome", *o)],
                )
                .increment(0);
            }
        }
        let applies = APPLY_OUTCOMES.map(|o| counter(APPLIES, vec![Label::new("outcome", o)]));
        let sources: HashMap<String, SourceHandles> = sources
            .iter()
            .map(|s| (s.clone(), SourceHandles::register(&recorder, s)))
            .collect();
        for table in REAPED_TABLES {
            counter(REAPER_DELETED, vec![Label::new("table", table)]).increment(0);
        }
        for kind in ALERT_KINDS {
            for outcome in ALERT_OUTCOMES {
                counter(
                    ALERTS,
                    vec![Label::new("kind", kind), Label::new("outcome", outcome)],
                )
                .increment(0);
            }
        }
        recorder
            .register_gauge(
                &Key::from_parts(
                    BUILD_INFO,
                    vec![Label::new("version", env!("CARGO_PKG_VERSION"))],
                ),
                &METADATA,
            )
            .set(1.0);
        // The latency family exists before any request; its first series is
        // the one the first scrape is counted in.
        let _first_series = recorder.register_histogram(
            &Key::from_parts(
                HTTP_DURATION,
                vec![
                    Label::new("method", "GET"),
                    Label::new("route", "/metrics"),
                    Label::new("status", "200"),
                ],
            ),
            &METADATA,
        );
        let store_commit = recorder.register_histogram(&Key::from_name(STORE_COMMIT), &METADATA);
        let store_batch = recorder.register_histogram(&Key::from_name(STORE_BATCH), &METADATA);
        let store_checkpoint =
            recorder.register_histogram(&Key::from_name(STORE_CHECKPOINT), &METADATA);
        let by_port = |name: &'static str| {
            AuthPort::ALL.map(|p| counter(name, vec![Label::new("port", p.label())]))
        };
        let auth_failures = by_port(AUTH_FAILURES);
        let auth_throttled = by_port(AUTH_THROTTLED);
        let http_peer_refused = counter(HTTP_PEER_REFUSED, Vec::new());
        http_peer_refused.increment(0);
        let gauge = |name: &'static str| recorder.register_gauge(&Key::from_name(name), &METADATA);
        // Until readiness is first evaluated (each scrape does, before it
        // renders), nothing is known to answer.
        let ready = gauge(READY);
        ready.set(0.0);
        let store_up = gauge(STORE_UP);
        store_up.set(0.0);
        let ready_changes = counter(READY_CHANGES, Vec::new());
        ready_changes.increment(0);
        // At zero from the start, so the dashboard's panel has its series
        // (they move only with the shared inbox).
        for outcome in LEASE_RENEWAL_OUTCOMES {
            counter(LEASE_RENEWALS, vec![Label::new("outcome", outcome)]).increment(0);
        }
        let metrics = Self {
            recorder,
            handle,
            claims,
            applies,
            gauge_sources: Mutex::new(sources.keys().cloned().collect()),
            sources: ArcSwap::from_pointee(sources),
            http: RwLock::default(),
            store_commit,
            store_batch,
            store_checkpoint,
            auth_failures,
            auth_throttled,
            http_peer_refused,
            ready,
            ready_changes,
            store_up,
            last_ready: AtomicU8::new(UNKNOWN),
        };
        // The gauges exist (at zero) before the first scrape sets them.
        metrics.set_inbox(&[], 0);
        metrics
    }

    /// Registers the series of each of `sources` not known yet (sources a
    /// reload added), so they count from now on.
    pub fn add_sources(&self, sources: &[String]) {
        self.sources.rcu(|known| {
            let mut all = HashMap::clone(known);
            for s in sources {
                if !all.contains_key(s) {
                    all.insert(s.clone(), SourceHandles::register(&self.recorder, s));
                }
            }
            all
        });
        let mut seen = self
            .gauge_sources
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        seen.extend(sources.iter().cloned());
    }

    /// Every source with series: those configured since the start.
    pub fn source_names(&self) -> Vec<String> {
        self.sources.load().keys().cloned().collect()
    }

    /// Counts a claim request's outcome (one of [`CLAIM_OUTCOMES`]).
    pub fn claim(&self, outcome: &'static str) {
        if let Some(i) = CLAIM_OUTCOMES.iter().position(|o| *o == outcome) {
            self.claims[i].increment(1);
        }
    }

    /// Counts a done, release or extend.
    pub fn claim_op(&self, op: &'static str, outcome: &'static str) {
        self.counter(
            CLAIM_OPS,
            vec![Label::new("op", op), Label::new("outcome", outcome)],
        )
        .increment(1);
    }

    /// Counts an apply's outcome (one of [`APPLY_OUTCOMES`]).
    pub fn apply(&self, outcome: &'static str) {
        if let Some(i) = APPLY_OUTCOMES.iter().position(|o| *o == outcome) {
            self.applies[i].increment(1);
        }
    }

    /// Counts a webhook of a configured source: accepted, filtered,
    /// duplicate, handshake, or the error code that refused it. Unknown sources are not counted (the
    /// name comes from the request path: anyone could grow the label set).
    pub fn ingest(&self, source: &str, outcome: &'static str) {
        let sources = self.sources.load();
        let Some(handles) = sources.get(source) else {
            return;
        };
        match handles.ingest.get(outcome) {
            Some(c) => c.increment(1),
            None => self
                .counter(
                    INGEST,
                    vec![
                        Label::new("source", source.to_owned()),
                        Label::new("outcome", outcome),
                    ],
                )
                .increment(1),
        }
    }

    /// Counts a delivery turn's outcome (one of [`DELIVERY_OUTCOMES`]).
    pub fn delivery(&self, source: &str, outcome: &'static str) {
        if let Some(c) = self
            .sources
            .load()
            .get(source)
            .and_then(|h| h.deliveries.get(outcome))
        {
            c.increment(1);
        }
    }

    /// Records how long one delivery request took.
    pub fn delivery_duration(&self, source: &str, seconds: f64) {
        if let Some(h) = self.sources.load().get(source) {
            h.delivery_duration.record(seconds);
        }
    }

    /// The latency histogram of answers with `status` to `method` on
    /// `route`, registered on first use. A handle to keep: recording into
    /// it takes no lock.
    pub fn http_histogram(&self, method: &str, route: &str, status: u16) -> Histogram {
        let known = self
            .http
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(route)
            .and_then(|series| {
                series
                    .iter()
                    .find(|(m, s, _)| m == method && *s == status)
                    .map(|(_, _, h)| h.clone())
            });
        known.unwrap_or_else(|| {
            let h = self.recorder.register_histogram(
                &Key::from_parts(
                    HTTP_DURATION,
                    vec![
                        Label::new("method", method.to_owned()),
                        Label::new("route", route.to_owned()),
                        Label::new("status", status.to_string()),
                    ],
                ),
                &METADATA,
            );
            self.http
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(route.to_owned())
                .or_default()
                .push((method.to_owned(), status, h.clone()));
            h
        })
    }

    /// Sets whether `source`'s circuit breaker holds its deliveries.
    pub fn set_source_paused(&self, source: &str, paused: bool) {
        if let Some(h) = self.sources.load().get(source) {
            h.paused.set(if paused { 1.0 } else { 0.0 });
        }
    }

    /// Sets how many bulk jobs run on `source`.
    pub fn set_jobs_running(&self, source: &str, running: usize) {
        if let Some(h) = self.sources.load().get(source) {
            #[allow(clippy::cast_precision_loss)]
            h.jobs.set(running as f64);
        }
    }

    /// Records readiness as just evaluated: `Ok`, or why not. A low disk
    /// leaves the store up (it answers reads, and writes once space
    /// frees); any other failure takes it down. Counts a change when this
    /// differs from the previous evaluation, so flapping between scrapes,
    /// as the load balancer's probes saw it, still shows.
    pub fn set_readiness(&self, readiness: &Result<(), StoreError>) {
        let ready = readiness.is_ok();
        let store_up = !matches!(
            readiness,
            Err(StoreError::Unavailable(_) | StoreError::Failed(_))
        );
        self.ready.set(if ready { 1.0 } else { 0.0 });
        self.store_up.set(if store_up { 1.0 } else { 0.0 });
        let now = if ready { READY_YES } else { READY_NO };
        let was = self.last_ready.swap(now, Ordering::Relaxed);
        if was != UNKNOWN && was != now {
            self.ready_changes.increment(1);
        }
        // Said once per turn, whoever asked (a probe of /readyz, or a
        // scrape): the cause of an alert is in the log.
        if was != now {
            match readiness {
                Err(e) => tracing::warn!(error = %e.chain(), "not ready"),
                Ok(()) if was != UNKNOWN => tracing::info!("ready again"),
                Ok(()) => {}
            }
        }
    }

    /// Counts a credential that did not authenticate on `port`.
    pub fn auth_failed(&self, port: AuthPort) {
        self.auth_failures[port as usize].increment(1);
    }

    /// Counts an attempt on `port` refused because its peer failed too often.
    pub fn auth_throttled(&self, port: AuthPort) {
        self.auth_throttled[port as usize].increment(1);
    }

    /// Counts an HTTP connection closed because its address held the most
    /// connections one address may.
    pub fn http_peer_refused(&self) {
        self.http_peer_refused.increment(1);
    }

    /// Counts what became of an alert of `kind` (one of [`ALERT_OUTCOMES`]).
    pub fn alert(&self, kind: &'static str, outcome: &'static str) {
        self.counter(
            ALERTS,
            vec![Label::new("kind", kind), Label::new("outcome", outcome)],
        )
        .increment(1);
    }

    /// Counts records the reaper deleted from `table` (one of
    /// [`REAPED_TABLES`]).
    pub fn reaped(&self, table: &'static str, n: u64) {
        if n > 0 {
            self.counter(REAPER_DELETED, vec![Label::new("table", table)])
                .increment(n);
        }
    }

    /// Counts a gate of the fleet's lane state for `source` answered
    /// `answer` (`open`, `held`, `paused`, `probe`, `probing`, `limited`).
    pub fn fleet_gate(&self, source: &str, answer: &'static str) {
        self.counter(
            FLEET_GATES,
            vec![
                Label::new("source", source.to_owned()),
                Label::new("answer", answer),
            ],
        )
        .increment(1);
    }

    /// Counts `n` leases of the shared inbox's heartbeat with `outcome`
    /// (one of [`LEASE_RENEWAL_OUTCOMES`]).
    pub fn lease_renewals(&self, outcome: &'static str, n: u64) {
        if n > 0 {
            self.counter(LEASE_RENEWALS, vec![Label::new("outcome", outcome)])
                .increment(n);
        }
    }

    /// The `dedupd_inbox_events` gauge of a source and status.
    pub fn inbox_events(&self, source: &str, status: &'static str) -> Gauge {
        self.recorder.register_gauge(
            &Key::from_parts(
                INBOX_EVENTS,
                vec![
                    Label::new("source", source.to_owned()),
                    Label::new("status", status),
                ],
            ),
            &METADATA,
        )
    }

    /// The `dedupd_oldest_pending_seconds` gauge of a source.
    pub fn oldest_pending(&self, source: &str) -> Gauge {
        self.recorder.register_gauge(
            &Key::from_parts(
                OLDEST_PENDING,
                vec![Label::new("source", source.to_owned())],
            ),
            &METADATA,
        )
    }

    /// Sets the trace span counters to the process's counts (they are
    /// counted where spans end, outside any one registry).
    pub fn set_trace_spans(&self, counts: crate::telemetry::traces::SpanCounts) {
        self.counter(TRACE_SPANS_EXPORTED, Vec::new())
            .absolute(counts.exported);
        for (reason, n) in [
            ("queue_full", counts.dropped_queue_full),
            ("export_failed", counts.dropped_export_failed),
        ] {
            self.counter(TRACE_SPANS_DROPPED, vec![Label::new("reason", reason)])
                .absolute(n);
        }
    }

    /// Sets the disk space gauges.
    pub fn set_disk_space(&self, space: DiskSpace) {
        let gauge = |name: &'static str| {
            self.recorder
                .register_gauge(&Key::from_parts(name, Vec::<Label>::new()), &METADATA)
        };
        gauge(STORE_FREE_BYTES).set(space.free_bytes as f64);
        gauge(STORE_MIN_FREE_BYTES).set(space.min_free_bytes as f64);
    }

    /// Sets the keys-in-memory gauge of each space.
    pub fn set_keys_in_memory(&self, keys: KeysInMemory) {
        for (space, n) in [("claims", keys.claims), ("keyspace", keys.keyspace)] {
            self.recorder
                .register_gauge(
                    &Key::from_parts(STORE_KEYS_IN_MEMORY, vec![Label::new("space", space)]),
                    &METADATA,
                )
                .set(n as f64);
        }
        for (name, n) in [
            (STORE_KEY_MEMORY, keys.bytes),
            (STORE_MAX_KEY_MEMORY, keys.cap_bytes),
        ] {
            self.recorder
                .register_gauge(&Key::from_parts(name, Vec::<Label>::new()), &METADATA)
                .set(n as f64);
        }
    }

    /// Sets the inbox gauges from `summary` (sources with events) at `now`:
    /// every source seen before and not in `summary` now reads zero.
    pub fn set_inbox(&self, summary: &[SourceSummary], now: Millis) {
        let mut seen = self
            .gauge_sources
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for gone in seen
            .iter()
            .filter(|s| !summary.iter().any(|x| &x.source == *s))
        {
            for status in STATUSES {
                self.inbox_events(gone, status).set(0.0);
            }
            self.oldest_pending(gone).set(0.0);
        }
        for s in summary {
            let counts = [s.pending, s.delivered, s.stale, s.dead];
            for (status, n) in STATUSES.iter().zip(counts) {
                self.inbox_events(&s.source, status).set(n as f64);
            }
            let age_ms = s.oldest_pending_ms.map_or(0, |at| now.saturating_sub(at));
            self.oldest_pending(&s.source).set(age_ms as f64 / 1e3);
            seen.insert(s.source.clone());
        }
    }

    /// The registry in the Prometheus text format.
    pub fn render(&self) -> String {
        self.handle.render()
    }

    /// Folds recorded histogram samples into their buckets, so memory stays
    /// bounded when nobody scrapes. Call every few seconds.
    pub fn upkeep(&self) {
        self.handle.run_upkeep();
    }

    fn counter(&self, name: &'static str, labels: Vec<Label>) -> Counter {
        self.recorder
            .register_counter(&Key::from_parts(name, labels), &METADATA)
    }
}

/// The HELP lines.
fn describe(r: &PrometheusRecorder) {
    let seconds = Some(Unit::Seconds);
    r.describe_histogram(
        HTTP_DURATION.into(),
        seconds,
        "HTTP requests by method, route pattern and status".into(),
    );
    r.describe_counter(
        CLAIMS.into(),
        None,
        "Claim requests by outcome: claimed, busy, done, fingerprint_mismatch".into(),
    );
    r.describe_counter(
        CLAIM_OPS.into(),
        None,
        "done, release and extend requests by op and outcome".into(),
    );
    r.describe_counter(
        APPLIES.into(),
        None,
        "Stream applies by outcome: applied, stale, duplicate".into(),
    );
    r.describe_counter(
        INGEST.into(),
        None,
        "Webhooks received by source and outcome: accepted, filtered, duplicate, handshake, or the refusal's code"
            .into(),
    );
    r.describe_counter(
        DELIVERIES.into(),
        None,
        "Delivery turns by source and outcome: delivered, failed (retried), stale, dead".into(),
    );
    r.describe_histogram(
        DELIVERY_DURATION.into(),
        seconds,
        "Time of one delivery request to the application".into(),
    );
    r.describe_gauge(
        STORE_FREE_BYTES.into(),
        Some(Unit::Bytes),
        "Bytes free on the data file's disk, read at each scrape".into(),
    );
    r.describe_gauge(
        STORE_KEYS_IN_MEMORY.into(),
        None,
        "Keys the embedded store keeps in memory, by space (claims, keyspace), read at each scrape; expired ones count until the reaper deletes them".into(),
    );
    r.describe_gauge(
        STORE_KEY_MEMORY.into(),
        Some(Unit::Bytes),
        "Memory the keys of the embedded store take, estimated (about 275 bytes for a claim with a 26-byte key)".into(),
    );
    r.describe_gauge(
        STORE_MAX_KEY_MEMORY.into(),
        Some(Unit::Bytes),
        "storage.max_key_memory_bytes, resolved: at it, clients' claims and SETs of new keys are refused (507, -OOM)".into(),
    );
    r.describe_gauge(
        STORE_MIN_FREE_BYTES.into(),
        Some(Unit::Bytes),
        "storage.min_free_bytes: writes are refused (507) while fewer bytes are free".into(),
    );
    r.describe_gauge(
        INBOX_EVENTS.into(),
        None,
        "Events in the inbox by source and status".into(),
    );
    r.describe_gauge(
        OLDEST_PENDING.into(),
        seconds,
        "Age of the source's oldest pending event (0 when none): alert on this".into(),
    );
    r.describe_histogram(
        STORE_COMMIT.into(),
        seconds,
        "Time of one group commit (a batch: one log record and sync) of the embedded store, from the writer taking it to the answers".into(),
    );
    r.describe_histogram(
        STORE_BATCH.into(),
        None,
        "Writes per group commit of the embedded store".into(),
    );
    r.describe_histogram(
        STORE_CHECKPOINT.into(),
        seconds,
        "Time of one checkpoint of the embedded store (a durable commit; writes wait for it)"
            .into(),
    );
    r.describe_counter(
        REAPER_DELETED.into(),
        None,
        "Expired records the reaper deleted, by table".into(),
    );
    r.describe_counter(
        AUTH_FAILURES.into(),
        None,
        "Credentials that did not authenticate (a wrong bearer token, a failed AUTH), by port"
            .into(),
    );
    r.describe_counter(
        AUTH_THROTTLED.into(),
        None,
        "Attempts refused without their token being read: their address failed too often, by port"
            .into(),
    );
    r.describe_counter(
        FLEET_GATES.into(),
        None,
        "With the shared inbox: asks of the fleet's lane state before starting deliveries, by source and answer (open, held, paused, probe, probing, limited)"
            .into(),
    );
    r.describe_counter(
        TRACE_SPANS_EXPORTED.into(),
        None,
        "Trace spans the collector took (telemetry.traces)".into(),
    );
    r.describe_counter(
        TRACE_SPANS_DROPPED.into(),
        None,
        "Trace spans dropped: queue_full (the exporter fell behind the spans made), export_failed (the collector refused, failed or timed out); never waited for"
            .into(),
    );
    r.describe_counter(
        LEASE_RENEWALS.into(),
        None,
        "Leases on shared-inbox events the heartbeat renewed, found lost (taken by another instance, settled, or run out), or could not reach Redis to renew"
            .into(),
    );
    r.describe_counter(
        HTTP_PEER_REFUSED.into(),
        None,
        "HTTP connections closed at once: their address held http.max_connections_per_address already"
            .into(),
    );
    r.describe_counter(
        ALERTS.into(),
        None,
        "Alerts by kind and outcome: sent (stored for delivery), folded (into a later one, by this instance or the fleet), gone (a folded one another instance sent), dropped (the queue was full)"
            .into(),
    );
    r.describe_gauge(
        SOURCE_PAUSED.into(),
        None,
        "1 while the source's circuit breaker holds its deliveries (paused, or one probe at a time), 0 while they run"
            .into(),
    );
    r.describe_gauge(
        JOBS_RUNNING.into(),
        None,
        "Bulk jobs (redelivery, erasure) running on the source, on any instance that shares its inbox"
            .into(),
    );
    r.describe_gauge(
        READY.into(),
        None,
        "1 while /readyz answers 200 (evaluated at each scrape and each /readyz)".into(),
    );
    r.describe_counter(
        READY_CHANGES.into(),
        None,
        "Times readiness turned, counted at each /readyz and scrape: flapping shows here even between scrapes"
            .into(),
    );
    r.describe_gauge(
        STORE_UP.into(),
        None,
        "1 while the store answers (a low disk keeps it up), 0 while it cannot be reached or written".into(),
    );
    r.describe_gauge(
        BUILD_INFO.into(),
        None,
        "Always 1; the version label names the running build".into(),
    );
}
