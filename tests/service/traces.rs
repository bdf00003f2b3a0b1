//! OpenTelemetry traces end to end, with real processes: `dedupd serve`
//! exporting to a real OTLP/HTTP receiver that decodes each export with the
//! OpenTelemetry project's own protobuf definitions (`opentelemetry-proto`
//! in Python, `tests/support/otlp_receiver.py`), and a real receiver of the
//! forwards. Those need `DEDUPD_TEST_PYTHON` (a python with
//! `opentelemetry-proto`); `.ci/run` runs them. A test of what the event's
//! page names, worked out without a collector, runs with the rest.
//!
//! These run on the real clock (separate processes): they wait for what
//! they check, with deadlines, and never assert on how fast it came.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dedupd::gateway::signature::{Scheme, sign};
use serde_json::Value;
use tempfile::TempDir;

use crate::support::process::{Drain, Running, serve_config, stop_logged};
use crate::support::receiver::{Behaviour, Receiver};

const SECRET: &str = "trace-signing-secret-5d1c";
const DESTINATION_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
/// Text only the body holds: no span may carry it.
const BODY_MARKER: &str = "card-4242-body-only-9f1e";
/// An upstream proxy's trace: linked from the ingest span, never its parent.
const UPSTREAM_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const UPSTREAM: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
/// A collector's API key, sent by `OTEL_EXPORTER_OTLP_HEADERS`.
const COLLECTOR_KEY: &str = "api-key-7f3e91c2";

/// A real OTLP/HTTP receiver (Python, `opentelemetry-proto`).
struct Collector {
    _child: Running,
    port: u16,
    out: PathBuf,
}

impl Collector {
    fn start(dir: &Path, mode: &str) -> Self {
        let python = std::env::var("DEDUPD_TEST_PYTHON")
            .expect("DEDUPD_TEST_PYTHON names a python that has opentelemetry-proto (see .ci/run)");
        let out = dir.join(format!("spans-{mode}.jsonl"));
        let mut child = Command::new(python)
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/support/otlp_receiver.py"
            ))
            .arg(&out)
            .arg(mode)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let port = line.trim().parse().expect("the receiver prints its port");
        Self {
            _child: Running(child),
            port,
            out,
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every span received so far.
    fn spans(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.out).unwrap_or_default();
        // Whole lines only: one being written is read next time.
        let whole = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
        whole
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// Waits until `check` holds of the spans received; them.
    async fn until(&self, what: &str, check: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let spans = self.spans();
            if check(&spans) {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; spans: {spans:#?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A served dedupd.
struct Node {
    child: Running,
    port: u16,
    drain: Drain,
}

/// Settings exporting to `collector`, delivering to `receiver`, stored in
/// `dir`, with `source` lines for the source and `traces` lines for
/// `[telemetry.traces]`.
fn config(dir: &Path, collector: &str, receiver: &str, source: &str, traces: &str) -> PathBuf {
    let file = dir.join("dedupd.toml");
    std::fs::write(
        &file,
        format!(
            r#"
listen = "127.0.0.1:0"
data_path = "{data}"
[sources.sume]
scheme = "sume"
secrets = ["{SECRET}"]
event_id = "body:/request_id"
stream = "body:/run_id"
created_at = "body:/created_at"
forward_to = "{receiver}"
forward_headers = ["traceparent", "tracestate"]
destination_secret = "{DESTINATION_SECRET}"
{source}
[telemetry.traces]
otlp_endpoint = "{collector}"
{traces}
"#,
            data = dir.join("dedupd.redb").display(),
        ),
    )
    .unwrap();
    file
}

/// A collector in `mode` (see `otlp_receiver.py`), a receiver answering
/// by `behaviour`, and [`config`] exporting to the one and delivering to
/// the other.
async fn setup(
    mode: &str,
    behaviour: Behaviour,
    source: &str,
    traces: &str,
) -> (TempDir, Collector, Receiver, PathBuf) {
    let dir = TempDir::new().unwrap();
    let collector = Collector::start(dir.path(), mode);
    let receiver = Receiver::start(behaviour).await;
    let file = config(dir.path(), &collector.url(), &receiver.url, source, traces);
    (dir, collector, receiver, file)
}

/// A collector that takes everything, a receiver that fails its first
/// request, and settings with the source's `backoff` lines.
async fn one_retry(backoff: &str) -> (TempDir, Collector, Receiver, PathBuf) {
    setup("accept", Behaviour::FailTimes(1), backoff, "").await
}

fn start(file: &Path) -> Node {
    let (child, port, drain) = serve_config(file);
    Node { child, port, drain }
}

fn body(id: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "request_id": id,
        "run_id": "run_1",
        "created_at": "2026-12-06T10:00:00Z",
        "card": BODY_MARKER,
    }))
    .unwrap()
}

/// Posts `body` signed now, with an upstream `traceparent`; the signature
/// header's value.
async fn post(port: u16, body: &[u8]) -> String {
    post_with(port, body, &[UPSTREAM]).await
}

/// Posts `body` signed now, with these `traceparent` headers.
async fn post_with(port: u16, body: &[u8], traceparents: &[&str]) -> String {
    let ts = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    )
    .unwrap();
    let mut req = crate::support::http::client()
        .post(format!("http://127.0.0.1:{port}/ingest/sume"))
        .body(body.to_vec());
    for tp in traceparents {
        req = req.header("traceparent", *tp);
    }
    let mut signature = String::new();
    for (k, v) in sign(Scheme::Sume, SECRET, ts, "", body) {
        if k.to_ascii_lowercase().contains("signature") {
            signature = v.clone();
        }
        req = req.header(k, v);
    }
    let res = req.send().await.unwrap();
    assert_eq!(res.status(), 200);
    signature
}

fn named<'a>(spans: &'a [Value], name: &str) -> Vec<&'a Value> {
    spans.iter().filter(|s| s["name"] == name).collect()
}

/// The `deliver` spans of trace `trace`, by attempt.
fn attempts<'a>(spans: &'a [Value], trace: &str) -> Vec<&'a Value> {
    let mut a: Vec<&Value> = named(spans, "deliver")
        .into_iter()
        .filter(|s| s["trace_id"] == trace)
        .collect();
    a.sort_by_key(|s| s["attributes"]["dedupd.attempt"].as_i64());
    a
}

/// Waits until the receiver got `n` requests; them.
async fn received(receiver: &Receiver, n: usize) -> Vec<crate::support::receiver::Received> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while receiver.received().len() < n {
        assert!(
            Instant::now() < deadline,
            "the receiver never got {n} requests"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    receiver.received()
}

/// No span holds a secret, the signature, or the body.
fn nothing_secret(spans: &[Value], signature: &str) {
    let text = serde_json::to_string(spans).unwrap();
    for secret in [SECRET, DESTINATION_SECRET, BODY_MARKER, signature] {
        assert!(!secret.is_empty());
        assert!(!text.contains(secret), "a span holds {secret:?}: {text}");
    }
}

/// One webhook whose first forward fails and whose retry succeeds is one
/// trace: an `ingest` span (its events `verified` and `stored`, and a
/// link, not a parent, to the upstream `traceparent` it came with) and
/// one `deliver` span per attempt under it. Each forward carries its
/// attempt's `traceparent`, not the upstream one; the event's view names
/// the trace; log lines inside the ingest carry its ids; no span holds a
/// secret or the body.
#[tokio::test]
#[ignore = "needs DEDUPD_TEST_PYTHON (a python with opentelemetry-proto); .ci/run runs it"]
async fn one_webhook_with_a_retry_is_one_trace_from_ingest_to_each_attempt() {
    let (_dir, collector, receiver, file) =
        one_retry("backoff_min = \"100ms\"\nbackoff_max = \"1s\"").await;
    let node = start(&file);
    let signature = post(node.port, &body("evt_1")).await;
    let forwards = received(&receiver, 2).await;
    let spans = collector
        .until("an ingest and two attempts", |s| {
            named(s, "ingest").len() == 1 && named(s, "deliver").len() == 2
        })
        .await;
    let ingest = named(&spans, "ingest")[0];
    let trace = ingest["trace_id"].as_str().unwrap().to_owned();
    eprintln!("trace {trace}: {spans:#?}");
    assert_ne!(trace, UPSTREAM_TRACE, "the upstream context is not adopted");
    assert_eq!(
        ingest["parent_span_id"], "",
        "the ingest is the trace's root"
    );
    assert_eq!(
        ingest["links"][0]["trace_id"], UPSTREAM_TRACE,
        "the upstream traceparent is linked"
    );
    let a = &ingest["attributes"];
    assert_eq!(
        (
            &a["dedupd.source"],
            &a["dedupd.scheme"],
            &a["dedupd.event_id"],
            &a["dedupd.outcome"],
            &a["http.response.status_code"]
        ),
        (
            &Value::from("sume"),
            &Value::from("sume"),
            &Value::from("evt_1"),
            &Value::from("accepted"),
            &Value::from(200)
        )
    );
    assert_eq!(ingest["resource"]["service.name"], "dedupd");
    let steps: Vec<&Value> = ingest["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["name"])
        .collect();
    assert_eq!(
        steps,
        ["verified", "stored"],
        "the ingest's steps, in order"
    );
    let tries = attempts(&spans, &trace);
    assert_eq!(tries.len(), 2, "both attempts in the ingest's trace");
    // OTLP's kinds: 2 server, 3 client; status code 2 is an error.
    assert_eq!(ingest["kind"], 2);
    assert_ne!(ingest["status"], 2);
    assert_eq!(
        (&tries[0]["status"], &tries[1]["status"]),
        (&Value::from(2), &Value::from(0)),
        "the failed attempt is an error, the delivered one is not"
    );
    for (t, (outcome, status)) in tries.iter().zip([("retry", 500), ("delivered", 204)]) {
        assert_eq!(t["kind"], 3, "an attempt is a client span");
        assert_eq!(t["parent_span_id"], ingest["span_id"], "under the ingest");
        assert_eq!(t["attributes"]["dedupd.outcome"], outcome);
        assert_eq!(t["attributes"]["http.response.status_code"], status);
        assert_eq!(t["attributes"]["dedupd.destination"], "default");
        assert!(t["attributes"]["dedupd.latency_ms"].as_f64().is_some());
    }
    assert!(
        tries[0]["attributes"]["dedupd.retry_at_ms"]
            .as_i64()
            .is_some()
    );
    // Each forward continues its attempt's span; the stored context stays.
    for (f, t) in forwards.iter().zip(&tries) {
        assert!(
            !f.headers.contains_key("dedupd-trace-context"),
            "{:?}",
            f.headers
        );
        assert_eq!(
            f.header("traceparent"),
            format!("00-{trace}-{}-01", t["span_id"].as_str().unwrap()),
            "the forward carries its attempt's context"
        );
    }
    nothing_secret(&spans, &signature);
    let shown = crate::support::http::shown(node.port, "evt_1").await;
    assert_eq!(shown["trace_id"], trace.as_str(), "{shown}");
    assert!(
        shown["headers"]
            .as_array()
            .unwrap()
            .iter()
            .all(|h| h["name"] == "traceparent"),
        "only the forwarded header is shown: {shown}"
    );
    // A bulk replay, however much later, is a third attempt in the trace.
    let started = crate::support::http::client()
        .post(format!(
            "http://127.0.0.1:{}/v1/sources/sume/jobs",
            node.port
        ))
        .json(&serde_json::json!({"kind": "redeliver", "filter": {"status": "delivered"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(started.status(), 201);
    let forwards = received(&receiver, 3).await;
    assert!(!forwards[2].header("dedupd-replay").is_empty());
    let spans = collector
        .until("the replay's attempt", |s| named(s, "deliver").len() == 3)
        .await;
    let replayed = attempts(&spans, &trace);
    assert_eq!(replayed.len(), 3, "the replay is in the event's trace");
    assert_eq!(replayed[2]["parent_span_id"], ingest["span_id"]);
    assert_eq!(replayed[2]["attributes"]["dedupd.outcome"], "delivered");
    let (status, log) = stop_logged(node.child, "-TERM", node.drain).await;
    assert!(status.success());
    let accepted: Vec<&String> = log
        .iter()
        .filter(|l| l.contains("\"event accepted\""))
        .collect();
    assert_eq!(accepted.len(), 1, "{log:#?}");
    let line: Value = serde_json::from_str(accepted[0]).unwrap();
    assert_eq!(line["trace_id"], trace.as_str(), "{line}");
    assert_eq!(line["span_id"], ingest["span_id"], "{line}");
    // And inside an attempt, the attempt's.
    let delivered: Vec<Value> = log
        .iter()
        .filter(|l| l.contains("\"message\":\"delivered\"") && l.contains("\"attempt\":2"))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(delivered.len(), 1, "{log:#?}");
    assert_eq!(delivered[0]["trace_id"], trace.as_str());
    assert_eq!(delivered[0]["span_id"], tries[1]["span_id"]);
}

/// A restart between the two attempts keeps them in the event's trace:
/// the context is stored with the event, not held in memory.
#[tokio::test]
#[ignore = "needs DEDUPD_TEST_PYTHON (a python with opentelemetry-proto); .ci/run runs it"]
async fn a_restart_between_attempts_keeps_them_in_one_trace() {
    let (_dir, collector, receiver, file) =
        one_retry("backoff_min = \"2s\"\nbackoff_max = \"2s\"").await;
    let first = start(&file);
    post(first.port, &body("evt_restart")).await;
    received(&receiver, 1).await;
    let (status, _) = stop_logged(first.child, "-TERM", first.drain).await;
    assert!(status.success());
    let second = start(&file);
    received(&receiver, 2).await;
    let spans = collector
        .until("the ingest and both attempts", |s| {
            named(s, "ingest").len() == 1 && named(s, "deliver").len() == 2
        })
        .await;
    let ingest = named(&spans, "ingest")[0];
    let trace = ingest["trace_id"].as_str().unwrap();
    let tries = attempts(&spans, trace);
    assert_eq!(tries.len(), 2, "{spans:#?}");
    assert_eq!(
        tries
            .iter()
            .map(|t| (
                t["parent_span_id"].clone(),
                t["attributes"]["dedupd.outcome"].clone()
            ))
            .collect::<Vec<_>>(),
        [
            (ingest["span_id"].clone(), Value::from("retry")),
            (ingest["span_id"].clone(), Value::from("delivered"))
        ]
    );
    let (status, _) = stop_logged(second.child, "-TERM", second.drain).await;
    assert!(status.success());
}

/// An event received with traces off has no ingest span to join: once
/// they are on, its attempts share one trace of their own, derived from
/// the event (so a restart, or another instance, finds the same), the
/// forwards continue it, and the event's page names it.
#[tokio::test]
#[ignore = "needs DEDUPD_TEST_PYTHON (a python with opentelemetry-proto); .ci/run runs it"]
async fn an_event_received_with_traces_off_has_its_later_attempts_in_one_trace() {
    let (dir, collector, receiver, file) = setup(
        "accept",
        Behaviour::FailTimes(2),
        "backoff_min = \"2s\"\nbackoff_max = \"2s\"",
        "",
    )
    .await;
    let on = std::fs::read_to_string(&file).unwrap();
    let endpoint = format!("otlp_endpoint = \"{}\"", collector.url());
    assert!(on.contains(&endpoint));
    let off = dir.path().join("traces-off.toml");
    std::fs::write(&off, on.replace(&endpoint, "")).unwrap();

    let first = start(&off);
    post_with(first.port, &body("evt_late"), &[]).await;
    let forwards = received(&receiver, 1).await;
    assert_eq!(forwards[0].header("traceparent"), "", "traces are off");
    let shown = crate::support::http::shown(first.port, "evt_late").await;
    assert!(shown["trace_id"].is_null(), "{shown}");
    let (status, _) = stop_logged(first.child, "-TERM", first.drain).await;
    assert!(status.success());

    let second = start(&file);
    let forwards = received(&receiver, 3).await;
    let spans = collector
        .until("both later attempts", |s| named(s, "deliver").len() == 2)
        .await;
    assert!(named(&spans, "ingest").is_empty(), "{spans:#?}");
    let trace = named(&spans, "deliver")[0]["trace_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let tries = attempts(&spans, &trace);
    assert_eq!(tries.len(), 2, "both attempts in one trace: {spans:#?}");
    for (t, (attempt, outcome)) in tries.iter().zip([(2, "retry"), (3, "delivered")]) {
        assert_eq!(t["parent_span_id"], "", "no ingest span to be under");
        assert_eq!(t["attributes"]["dedupd.attempt"], attempt);
        assert_eq!(t["attributes"]["dedupd.outcome"], outcome);
        assert_eq!(t["attributes"]["dedupd.event_id"], "evt_late");
    }
    for (f, t) in forwards[1..].iter().zip(&tries) {
        assert_eq!(
            f.header("traceparent"),
            format!("00-{trace}-{}-01", t["span_id"].as_str().unwrap()),
            "the forward carries its attempt's context"
        );
    }
    let shown = crate::support::http::shown(second.port, "evt_late").await;
    assert_eq!(shown["trace_id"], trace.as_str(), "{shown}");
    let (status, _) = stop_logged(second.child, "-TERM", second.drain).await;
    assert!(status.success());
}

/// An erased event's page names no trace: erasing deletes its stored
/// trace context with its other headers, and the trace derived for an
/// event received with traces off (the one the page would fall back to)
/// has no span of this event's. Needs no collector: the page's trace id
/// is worked out, not read from one, so the endpoint is a port nothing
/// listens on (every span is dropped).
#[tokio::test]
async fn an_erased_events_page_names_no_trace() {
    let dir = TempDir::new().unwrap();
    let receiver = Receiver::start(Behaviour::Accept).await;
    let nowhere = format!("http://127.0.0.1:{}", crate::support::ports::free_port());
    let file = config(dir.path(), &nowhere, &receiver.url, "", "");
    let node = start(&file);
    post(node.port, &body("er1")).await;
    received(&receiver, 1).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let shown = loop {
        let shown = crate::support::http::shown(node.port, "er1").await;
        if shown["status"] == "delivered" {
            break shown;
        }
        assert!(Instant::now() < deadline, "never delivered: {shown}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let trace = shown["trace_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{shown}"));
    assert_eq!(trace.len(), 32, "the ingest's trace: {shown}");
    let erased = crate::support::http::client()
        .delete(format!(
            "http://127.0.0.1:{}/v1/sources/sume/events/er1",
            node.port
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(erased.status(), 200);
    let shown = crate::support::http::shown(node.port, "er1").await;
    assert_eq!(shown["status"], "erased", "{shown}");
    assert!(shown["trace_id"].is_null(), "{shown}");
    assert_eq!(
        shown["timeline"].as_array().map(Vec::len),
        Some(1),
        "{shown}"
    );
}

/// A collector that never answers, or refuses every export, changes
/// nothing a provider or the application sees: every webhook is answered
/// 200 and delivered, and the spans that could not go are counted as
/// dropped.
#[tokio::test]
#[ignore = "needs DEDUPD_TEST_PYTHON (a python with opentelemetry-proto); .ci/run runs it"]
async fn a_collector_that_hangs_or_refuses_costs_spans_not_webhooks() {
    for mode in ["hang", "refuse", "redirect"] {
        let (_dir, collector, receiver, file) =
            setup(mode, Behaviour::Accept, "", "queue = 64").await;
        // With a key for the collector, and every debug line of dedupd's
        // (a failed export's error among them): the key is in none.
        let mut cmd = crate::support::process::dedupd();
        cmd.args(["serve", "--config"])
            .arg(&file)
            .env(
                "OTEL_EXPORTER_OTLP_HEADERS",
                format!("authorization=Bearer%20{COLLECTOR_KEY}"),
            )
            .env("RUST_LOG", "info,dedupd=debug");
        let (child, port, drain) = crate::support::process::spawn_serving(cmd);
        let node = Node { child, port, drain };
        for i in 0..60 {
            post(node.port, &body(&format!("evt_{mode}_{i}"))).await;
        }
        received(&receiver, 60).await;
        let metric = |body: &str, reason: &str| -> f64 {
            body.lines()
                .filter(|l| {
                    l.starts_with("dedupd_trace_spans_dropped_total")
                        && l.contains(&format!("reason=\"{reason}\""))
                })
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        // A hanging collector holds the batch it was sent until the export
        // times out, then the queue fills: either counts.
        let reasons: &[&str] = if mode == "hang" {
            &["queue_full", "export_failed"]
        } else {
            &["export_failed"]
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let text = crate::support::http::client()
                .get(format!("http://127.0.0.1:{}/metrics", node.port))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            if reasons.iter().map(|r| metric(&text, r)).sum::<f64>() > 0.0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{mode}: no span counted as dropped ({reasons:?})"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (status, log) = stop_logged(node.child, "-TERM", node.drain).await;
        assert!(status.success(), "{mode}: stops cleanly");
        assert!(
            log.iter().any(|l| l.contains("\"level\":\"DEBUG\"")),
            "{mode}: debug lines were written"
        );
        if mode == "hang" {
            // The stop waits a while for the collector, then says what
            // it left behind, before the last line (once after it).
            let at = |what: &str| log.iter().position(|l| l.contains(what));
            let warned = at("the last trace spans were not all exported");
            assert!(warned.is_some(), "{mode}: {log:#?}");
            assert!(
                warned < at("\"stopped\""),
                "{mode}: the warning is not before `stopped`: {log:#?}"
            );
        }
        assert!(
            !log.iter().any(|l| l.contains(COLLECTOR_KEY)),
            "{mode}: the collector's key is in the log: {log:#?}"
        );
        // A redirect is not followed: it could carry the collector's
        // credentials to another host.
        assert!(
            collector.spans().is_empty(),
            "{mode}: {:?}",
            collector.spans()
        );
    }
}

/// The upstream `traceparent` is linked only for a webhook taken, and
/// sent once: not for a duplicate (a captured webhook sent again, its
/// signature still good, with a context of the sender's choosing: no
/// signature covers the header), and not when the request has several
/// (W3C: no context then).
#[tokio::test]
#[ignore = "needs DEDUPD_TEST_PYTHON (a python with opentelemetry-proto); .ci/run runs it"]
async fn an_upstream_context_is_linked_only_for_a_webhook_taken_that_has_one() {
    const PLANTED: &str = "00-dddddddddddddddddddddddddddddddd-eeeeeeeeeeeeeeee-01";
    let (_dir, collector, receiver, file) = setup("accept", Behaviour::Accept, "", "").await;
    let node = start(&file);
    post(node.port, &body("evt_l")).await;
    post_with(node.port, &body("evt_l"), &[PLANTED]).await;
    post_with(node.port, &body("evt_two"), &[UPSTREAM, PLANTED]).await;
    received(&receiver, 2).await;
    let spans = collector
        .until("three ingests", |s| named(s, "ingest").len() == 3)
        .await;
    let linked = |event: &str, outcome: &str| -> Vec<String> {
        let ingest = named(&spans, "ingest")
            .into_iter()
            .find(|s| {
                s["attributes"]["dedupd.event_id"] == event
                    && s["attributes"]["dedupd.outcome"] == outcome
            })
            .unwrap_or_else(|| panic!("{event} {outcome}: {spans:#?}"));
        ingest["links"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["trace_id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(linked("evt_l", "accepted"), [UPSTREAM_TRACE]);
    assert!(linked("evt_l", "duplicate").is_empty());
    assert!(linked("evt_two", "accepted").is_empty());
    let (status, _) = stop_logged(node.child, "-TERM", node.drain).await;
    assert!(status.success());
}

/// `OTEL_EXPORTER_OTLP_HEADERS` reaches the collector with every export
/// (a hosted collector's API key); the hang/refuse test checks it is in
/// no log line. `OTEL_EXPORTER_OTLP_COMPRESSION=gzip` compresses them.
/// `OTEL_RESOURCE_ATTRIBUTES` is on every span's resource, its values
/// percent-decoded (once sent as written), `service.name` still dedupd's.
#[tokio::test]
#[ignore = "needs DEDUPD_TEST_PYTHON (a python with opentelemetry-proto); .ci/run runs it"]
async fn the_standard_headers_and_compression_variables_reach_the_collector() {
    let (_dir, collector, receiver, file) = setup("accept", Behaviour::Accept, "", "").await;
    let mut cmd = crate::support::process::dedupd();
    cmd.args(["serve", "--config"])
        .arg(&file)
        .env(
            "OTEL_EXPORTER_OTLP_HEADERS",
            format!("authorization=Bearer%20{COLLECTOR_KEY}"),
        )
        .env("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
        .env(
            "OTEL_RESOURCE_ATTRIBUTES",
            "deployment.environment=eu%2Cwest, team=a%20b,service.name=other",
        );
    let (child, port, drain) = crate::support::process::spawn_serving(cmd);
    post(port, &body("evt_h")).await;
    received(&receiver, 1).await;
    // Stopped at once: the stop exports what is queued.
    let (status, _) = stop_logged(child, "-TERM", drain).await;
    assert!(status.success());
    let spans = collector
        .until("the ingest and its attempt", |s| {
            !named(s, "ingest").is_empty() && !named(s, "deliver").is_empty()
        })
        .await;
    for s in &spans {
        assert_eq!(s["authorization"], format!("Bearer {COLLECTOR_KEY}"), "{s}");
        assert_eq!(s["encoding"], "gzip", "{s}");
        let resource = &s["resource"];
        assert_eq!(resource["deployment.environment"], "eu,west", "{s}");
        assert_eq!(resource["team"], "a b", "{s}");
        assert_eq!(resource["service.name"], "dedupd", "{s}");
        assert_eq!(resource["telemetry.sdk.name"], "opentelemetry", "{s}");
    }
}

/// At `sample_ratio = 0` nothing is exported and no trace id is shown,
/// but each forward still carries a `traceparent` (not sampled), so the
/// application's own sampling follows dedupd's.
#[tokio::test]
#[ignore = "needs DEDUPD_TEST_PYTHON (a python with opentelemetry-proto); .ci/run runs it"]
async fn a_trace_sampled_out_is_neither_exported_nor_shown_but_still_propagated() {
    let (_dir, collector, receiver, file) =
        setup("accept", Behaviour::Accept, "", "sample_ratio = 0.0").await;
    let node = start(&file);
    post(node.port, &body("evt_s")).await;
    let forwards = received(&receiver, 1).await;
    let traceparent = forwards[0].header("traceparent");
    let fields: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(fields.len(), 4, "{traceparent}");
    assert_ne!(fields[1], UPSTREAM_TRACE, "a trace of dedupd's own");
    assert_eq!(fields[3], "00", "not sampled: {traceparent}");
    let client = crate::support::http::client();
    let shown = crate::support::http::shown(node.port, "evt_s").await;
    assert!(shown["trace_id"].is_null(), "{shown}");
    let claimed = client
        .post(format!("http://127.0.0.1:{}/v1/claims/k1", node.port))
        .json(&serde_json::json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(claimed.status(), 201);
    // The stop exports what is queued (as the headers test shows): nothing
    // was.
    let (status, _) = stop_logged(node.child, "-TERM", node.drain).await;
    assert!(status.success());
    assert!(collector.spans().is_empty(), "{:?}", collector.spans());
}

/// With the shared inbox, an attempt on one instance and the retry on
/// another stay in the event's trace: the context is stored in Redis with
/// the event.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs DEDUPD_TEST_PYTHON (a python with opentelemetry-proto); .ci/run runs it"]
async fn the_shared_inbox_keeps_attempts_on_two_instances_in_one_trace() {
    use crate::support::fleet::{Backing, Instance, event, post, start_node};

    let dir = TempDir::new().unwrap();
    let collector = Collector::start(dir.path(), "accept");
    let receiver = Receiver::start(Behaviour::FailTimes(1)).await;
    let backing = Backing::one().await;
    let redis = backing.line();
    let rest = format!(
        "[telemetry.traces]\notlp_endpoint = \"{}\"",
        collector.url()
    );
    let settings = |i: usize| {
        Instance {
            redis: &redis,
            forward_to: &receiver.url,
            source: "backoff_min = \"1s\"\nbackoff_max = \"1s\"",
            rest: &rest,
            ..Instance::default()
        }
        .write(dir.path(), &format!("t{i}"))
    };
    let first = start_node(&settings(0));
    let (id, body) = event("run_shared", 0);
    assert_eq!(
        post(&crate::support::http::client(), first.port, &body).await,
        200
    );
    received(&receiver, 1).await;
    crate::support::fleet::stop_all(vec![first]);
    let second = start_node(&settings(1));
    received(&receiver, 2).await;
    let spans = collector
        .until("the ingest and both attempts", |s| {
            named(s, "ingest").len() == 1 && named(s, "deliver").len() == 2
        })
        .await;
    let ingest = named(&spans, "ingest")[0];
    let trace = ingest["trace_id"].as_str().unwrap();
    let tries = attempts(&spans, trace);
    assert_eq!(tries.len(), 2, "{spans:#?}");
    for t in &tries {
        assert_eq!(t["parent_span_id"], ingest["span_id"]);
        assert_eq!(t["attributes"]["dedupd.event_id"], id.as_str());
    }
    assert_ne!(
        tries[0]["resource"]["process.pid"], tries[1]["resource"]["process.pid"],
        "the attempts ran on two instances"
    );
    assert_eq!(
        tries[1]["attributes"]["dedupd.outcome"], "delivered",
        "{spans:#?}"
    );
    crate::support::fleet::stop_all(vec![second]);
    drop(backing);
}

/// Claims and ordering requests are spans of their own, with the key as a
/// keyed hash (never raw: keys can hold an e-mail address; the same for
/// every request of one key), the outcome and the fence.
#[tokio::test]
#[ignore = "needs DEDUPD_TEST_PYTHON (a python with opentelemetry-proto); .ci/run runs it"]
async fn claims_and_applies_are_spans_with_the_key_hashed() {
    use sha2::{Digest, Sha256};

    let (_dir, collector, _receiver, file) = setup("accept", Behaviour::Accept, "", "").await;
    let node = start(&file);
    let key = "order-4711-ada@example.com";
    let client = crate::support::http::client();
    let base = format!("http://127.0.0.1:{}/v1", node.port);
    let claimed: Value = client
        .post(format!("{base}/claims/{key}"))
        .json(&serde_json::json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let busy = client
        .post(format!("{base}/claims/{key}"))
        .json(&serde_json::json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(busy.status(), 409);
    let applied = client
        .post(format!("{base}/streams/{key}/apply"))
        .json(&serde_json::json!({"event_id": "e1", "created_at": "2026-12-06T10:00:00Z"}))
        .send()
        .await
        .unwrap();
    assert_eq!(applied.status(), 200);
    // A refusal's span names its code as the outcome.
    let refused = client
        .post(format!("{base}/claims/{key}/done"))
        .json(&serde_json::json!({"token": "not-the-owners"}))
        .send()
        .await
        .unwrap();
    assert!(refused.status().is_client_error(), "{}", refused.status());
    let problem: Value = refused.json().await.unwrap();
    let spans = collector
        .until("two claims, an apply and a done", |s| {
            named(s, "claim").len() == 2
                && named(s, "apply").len() == 1
                && named(s, "done").len() == 1
        })
        .await;
    let done = named(&spans, "done")[0];
    assert_eq!(
        done["attributes"]["dedupd.outcome"], problem["code"],
        "{done}"
    );
    assert_ne!(done["status"], 2, "a refusal is no server error: {done}");
    let claims = named(&spans, "claim");
    let hash = claims[0]["attributes"]["dedupd.key_hash"]
        .as_str()
        .expect("a key hash")
        .to_owned();
    assert!(
        hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()),
        "{hash}"
    );
    assert_ne!(
        hash,
        hex::encode(&Sha256::digest(key.as_bytes())[..8]),
        "not a plain hash: one could try likely keys against it"
    );
    let outcomes: Vec<(&Value, &Value)> = claims
        .iter()
        .map(|s| {
            let a = &s["attributes"];
            (&a["dedupd.outcome"], &a["dedupd.fence"])
        })
        .collect();
    assert!(
        outcomes.contains(&(&Value::from("claimed"), &claimed["fence"])),
        "{outcomes:?}"
    );
    assert!(
        outcomes.contains(&(&Value::from("busy"), &Value::Null)),
        "{outcomes:?}"
    );
    let apply = named(&spans, "apply")[0];
    assert_eq!(apply["attributes"]["dedupd.outcome"], "applied");
    for s in claims.iter().chain([&apply]) {
        assert_eq!(s["attributes"]["dedupd.key_hash"], hash.as_str(), "{s}");
    }
    let text = serde_json::to_string(&spans).unwrap();
    assert!(
        !text.contains("ada@example"),
        "a span holds the raw key: {text}"
    );
    let (status, _) = stop_logged(node.child, "-TERM", node.drain).await;
    assert!(status.success());
}
