//! `GET /metrics`: every family from the first scrape, then the counts
//! after known traffic, read back from a real scrape.

use std::time::Duration;
use std::time::Instant;

use reqwest::Method;
use reqwest::StatusCode;
use serde_json::json;

use dedupd::store::redb::faults::FaultPlan;

use crate::support::app::TestApp;
use crate::support::app::spawn_app_with;
use crate::support::app::spawn_faulty_app_with;
use crate::support::app::with_tokens;
use crate::support::gateway::SECRET;
use crate::support::gateway::body;
use crate::support::gateway::gateway_app;
use crate::support::receiver::Behaviour;
use crate::support::receiver::Receiver;
use crate::support::receiver::eventually;
/// The value of the sample `name{labels}` in a Prometheus text scrape
/// (labels in any order), if present.
fn sample(scrape: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scrape.lines().find_map(|line| {
        if line.starts_with('#') {
            return None;
        }
        let (series, value) = line.rsplit_once(' ')?;
        let (n, rest) = match series.split_once('{') {
            Some((n, rest)) => (n, rest.strip_suffix('}')?),
            None => (series, ""),
        };
        if n != name {
            return None;
        }
        let have: Vec<(&str, &str)> = rest
            .split("\",")
            .filter(|p| !p.is_empty())
            .filter_map(|p| {
                let (k, v) = p.split_once('=')?;
                Some((k, v.trim_matches('"')))
            })
            .collect();
        (have.len() == labels.len() && labels.iter().all(|l| have.contains(l)))
            .then(|| value.parse().ok())
            .flatten()
    })
}

pub(crate) fn count(scrape: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    sample(scrape, name, labels)
        .unwrap_or_else(|| panic!("no sample {name}{labels:?} in:\n{scrape}"))
}

impl TestApp {
    pub(crate) async fn scrape(&self) -> String {
        let res = self.request(Method::GET, "/metrics").send().await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        let ct = res.headers()["content-type"].to_str().unwrap().to_owned();
        assert!(ct.starts_with("text/plain; version=0.0.4"), "{ct}");
        res.text().await.unwrap()
    }
}

#[tokio::test]
async fn every_family_is_there_from_the_first_scrape() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let app = gateway_app(&receiver.url, |_| {}).await;
    let scrape = app.scrape().await;
    for family in [
        "dedupd_http_request_duration_seconds",
        "dedupd_claims_total",
        "dedupd_claim_ops_total",
        "dedupd_applies_total",
        "dedupd_ingest_total",
        "dedupd_deliveries_total",
        "dedupd_delivery_duration_seconds",
        "dedupd_inbox_events",
        "dedupd_oldest_pending_seconds",
        "dedupd_store_commit_seconds",
        "dedupd_store_batch_size",
        "dedupd_reaper_deleted_total",
        "dedupd_store_keys_in_memory",
        "dedupd_build_info",
    ] {
        assert!(
            scrape.contains(&format!("# TYPE {family} ")),
            "{family} missing from the first scrape:\n{scrape}"
        );
    }
    assert_eq!(
        count(&scrape, "dedupd_claims_total", &[("outcome", "busy")]),
        0.0
    );
    assert_eq!(
        count(
            &scrape,
            "dedupd_ingest_total",
            &[("source", "sume"), ("outcome", "bad_signature")]
        ),
        0.0
    );
    assert_eq!(
        count(
            &scrape,
            "dedupd_inbox_events",
            &[("source", "sume"), ("status", "dead")]
        ),
        0.0
    );
    // Each table the reaper deletes from, the Redis protocol's keyspace
    // too (a dashboard's `{table="kv"}` had no series until a first key
    // expired).
    for table in [
        "claims",
        "applied_events",
        "stream_heads",
        "inbox",
        "inbox_dedupe",
        "kv",
    ] {
        assert_eq!(
            count(&scrape, "dedupd_reaper_deleted_total", &[("table", table)]),
            0.0
        );
    }
    assert_eq!(
        count(
            &scrape,
            "dedupd_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        1.0
    );
}

#[tokio::test]
async fn a_scrape_counts_the_traffic_that_happened() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let app = gateway_app(&receiver.url, |_| {}).await;

    // Claims: one claimed, one busy, done by the owner, a wrong-token release.
    let (token, _, _) = app.claim_ok("k1", json!({})).await;
    assert_eq!(
        app.claim("k1", json!({})).await.status(),
        StatusCode::CONFLICT
    );
    assert_eq!(
        app.done("k1", json!({ "token": token })).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        app.claim("k1", json!({})).await.status(),
        StatusCode::CONFLICT
    );
    assert_eq!(
        app.release("k2", &"0".repeat(32)).await.status(),
        StatusCode::NO_CONTENT
    );
    // Applies: B, then A (older: stale), then B again (duplicate).
    app.apply_ok("run", "B", "2026-11-29T10:05:00Z").await;
    app.apply_ok("run", "A", "2026-11-29T10:00:00Z").await;
    app.apply_ok("run", "B", "2026-11-29T10:05:00Z").await;
    // Ingest: accepted, duplicate, forged; then the delivery.
    let b = body("req_1", "run_1", "2026-11-29T10:00:00Z");
    app.ingest_ok(&b).await;
    app.ingest_ok(&b).await;
    let forged = app
        .post_signed_at("sume", &b, app.now_s(), "not_the_secret")
        .await;
    assert_eq!(forged.status(), StatusCode::UNAUTHORIZED);
    assert_ne!(SECRET, "not_the_secret");
    // The dispatcher counts a delivery once the store has recorded it.
    app.retrying_until("the delivery is counted", || async {
        let s = app.scrape().await;
        sample(
            &s,
            "dedupd_deliveries_total",
            &[("source", "sume"), ("outcome", "delivered")],
        ) == Some(1.0)
    })
    .await;
    assert_eq!(app.event_ids("delivered").await, ["req_1"]);

    let s = app.scrape().await;
    let claims = |o| count(&s, "dedupd_claims_total", &[("outcome", o)]);
    assert_eq!(claims("claimed"), 1.0);
    assert_eq!(claims("busy"), 1.0);
    assert_eq!(claims("done"), 1.0);
    assert_eq!(claims("fingerprint_mismatch"), 0.0);
    let op = |op, o| count(&s, "dedupd_claim_ops_total", &[("op", op), ("outcome", o)]);
    assert_eq!(op("done", "done"), 1.0);
    assert_eq!(op("release", "not_held"), 1.0);
    assert_eq!(op("extend", "extended"), 0.0);
    let applies = |o| count(&s, "dedupd_applies_total", &[("outcome", o)]);
    assert_eq!(
        (applies("applied"), applies("stale"), applies("duplicate")),
        (1.0, 1.0, 1.0)
    );
    let ingest = |o| {
        count(
            &s,
            "dedupd_ingest_total",
            &[("source", "sume"), ("outcome", o)],
        )
    };
    assert_eq!(ingest("accepted"), 1.0);
    assert_eq!(ingest("duplicate"), 1.0);
    assert_eq!(ingest("bad_signature"), 1.0);
    let deliveries = |o| {
        count(
            &s,
            "dedupd_deliveries_total",
            &[("source", "sume"), ("outcome", o)],
        )
    };
    assert_eq!(deliveries("delivered"), 1.0);
    assert_eq!(deliveries("failed"), 0.0);
    assert_eq!(
        count(
            &s,
            "dedupd_delivery_duration_seconds_count",
            &[("source", "sume")]
        ),
        1.0
    );
    let inbox = |st| {
        count(
            &s,
            "dedupd_inbox_events",
            &[("source", "sume"), ("status", st)],
        )
    };
    assert_eq!((inbox("pending"), inbox("delivered")), (0.0, 1.0));
    // Every write above went through the embedded store's group commit.
    assert!(count(&s, "dedupd_store_commit_seconds_count", &[]) >= 1.0);
    assert!(count(&s, "dedupd_store_batch_size_sum", &[]) >= 7.0);
    // The route label is the pattern, never the raw path.
    let http = |m, r, st| {
        sample(
            &s,
            "dedupd_http_request_duration_seconds_count",
            &[("method", m), ("route", r), ("status", st)],
        )
    };
    assert_eq!(http("POST", "/v1/claims/{key}", "201"), Some(1.0));
    assert_eq!(http("POST", "/v1/claims/{key}", "409"), Some(2.0));
    assert_eq!(http("POST", "/v1/claims/{key}/done", "200"), Some(1.0));
    assert_eq!(http("DELETE", "/v1/claims/{key}", "204"), Some(1.0));
    assert_eq!(http("POST", "/v1/streams/{stream}/apply", "200"), Some(3.0));
    assert_eq!(http("POST", "/ingest/{source}", "401"), Some(1.0));
    assert!(!s.contains("route=\"/v1/claims/k1\""), "{s}");
    assert!(!s.contains("route=\"/v1/streams/run"), "{s}");
}

/// A client picks the method; only the standard ones become label values,
/// so made-up methods cannot grow the series without bound.
#[tokio::test]
async fn made_up_methods_share_one_series() {
    let app = spawn_app_with(|_| {}).await;
    for method in ["BREW", "WHEN", "BREW"] {
        let method = Method::from_bytes(method.as_bytes()).unwrap();
        let res = app.request(method, "/v1/claims/k1").send().await.unwrap();
        assert!(res.status().is_client_error(), "{}", res.status());
    }
    let s = app.scrape().await;
    assert!(!s.contains("BREW") && !s.contains("WHEN"), "{s}");
    let other: f64 = s
        .lines()
        .filter(|l| {
            l.starts_with("dedupd_http_request_duration_seconds_count{")
                && l.contains("method=\"OTHER\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(other, 3.0, "{s}");
}

/// Each HTTP worker keeps its own handles on the latency series; the
/// counts are still one per request, whichever worker answered, and a
/// refusal is counted under its route, never under the path as sent.
#[tokio::test]
async fn with_two_workers_every_request_is_counted_once_under_its_route() {
    let app = spawn_app_with(|l| {
        l.settings.http.workers = 2;
        with_tokens(l, &["metrics-token"]);
    })
    .await;
    const N: usize = 12;
    for _ in 0..N {
        // A client of its own each: a new connection, which actix hands to
        // its workers in turn.
        let res = crate::support::http::client()
            .get(app.url("/v1/sources"))
            .bearer_auth("metrics-token")
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
    }
    for path in ["/v1/sources", "/%76%31/sources"] {
        let res = crate::support::http::client()
            .get(app.url(path))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "{path}");
    }
    let s = app.scrape().await;
    let series = "dedupd_http_request_duration_seconds_count";
    let labels = |route, status| [("method", "GET"), ("route", route), ("status", status)];
    #[allow(clippy::cast_precision_loss)]
    let n = N as f64;
    assert_eq!(count(&s, series, &labels("/v1/sources", "200")), n);
    assert_eq!(count(&s, series, &labels("/v1/sources", "401")), 1.0);
    assert_eq!(count(&s, series, &labels("unmatched", "401")), 1.0);
    assert!(!s.contains("%76"), "{s}");
}

#[tokio::test]
async fn the_oldest_pending_age_grows_while_the_application_is_down() {
    let receiver = Receiver::start(Behaviour::Always(503)).await;
    let app = gateway_app(&receiver.url, |s| s.max_attempts = 100).await;
    app.ingest_ok(&body("req_1", "run_1", "2026-11-29T10:00:00Z"))
        .await;
    app.clock.advance(std::time::Duration::from_secs(90));
    let s = app.scrape().await;
    assert_eq!(
        count(
            &s,
            "dedupd_inbox_events",
            &[("source", "sume"), ("status", "pending")]
        ),
        1.0
    );
    assert_eq!(
        count(&s, "dedupd_oldest_pending_seconds", &[("source", "sume")]),
        90.0
    );
}

#[tokio::test]
async fn metrics_need_a_token_when_tokens_are_configured() {
    let app = spawn_app_with(|l| with_tokens(l, &["metrics-token"])).await;
    let res = app.client.get(app.url("/metrics")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    let res = app
        .client
        .get(app.url("/metrics"))
        .bearer_auth("metrics-token")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
}

/// A quiet moment takes the checkpoint: once no write has come for
/// `storage.checkpoint_idle`, the writer checkpoints what is logged, so
/// the stall falls there and not on the first writes of the next burst.
/// (Otherwise nothing here would checkpoint: the log holds a few hundred
/// bytes of its 64 MiB, and the interval is an hour.)
#[tokio::test]
async fn a_quiet_moment_takes_the_checkpoint() {
    let app = spawn_app_with(|l| {
        l.settings.storage.checkpoint_idle = Duration::from_millis(50);
        l.settings.storage.checkpoint_interval = Duration::from_secs(3600);
    })
    .await;
    app.claim_ok("quiet-1", json!({})).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let scrape = app.scrape().await;
        if count(&scrape, "dedupd_store_checkpoint_seconds_count", &[]) >= 1.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no checkpoint 10 s after the last write:\n{scrape}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The claim was made durable in the file, and still answers.
    assert_eq!(app.get("quiet-1").await.status(), StatusCode::OK);
}

/// The breaker's state, read by each scrape: 1 from the pause, through
/// the probes (deliveries are still held), to the first 2xx.
#[tokio::test]
async fn a_source_reads_paused_while_its_breaker_holds_deliveries_and_not_once_it_resumes() {
    let receiver = Receiver::start(Behaviour::Always(503)).await;
    let app = gateway_app(&receiver.url, |s| {
        s.pause_after = 3;
        s.max_in_flight = 1;
        s.max_attempts = 100;
    })
    .await;
    let paused = |s: &str| count(s, "dedupd_source_paused", &[("source", "sume")]);
    assert_eq!(paused(&app.scrape().await), 0.0);
    for i in 0..3 {
        app.ingest_ok(&body(
            &format!("e{i}"),
            &format!("run_{i}"),
            "2026-11-29T10:00:00Z",
        ))
        .await;
    }
    // The clock stands still: the pause cannot end under the test.
    eventually("paused after three failures", || async {
        app.source_state("sume").await["delivery"]["state"] == "paused"
    })
    .await;
    assert_eq!(paused(&app.scrape().await), 1.0);

    receiver.set(Behaviour::Accept);
    app.retrying_until("all delivered", || async {
        app.event_ids("delivered").await.len() == 3
    })
    .await;
    assert_eq!(paused(&app.scrape().await), 0.0);
}

/// A disk at the watermark: not ready, but the store is up (it serves
/// reads and takes writes once space frees); each turn of readiness that
/// a probe or a scrape saw is counted.
#[tokio::test]
async fn a_disk_at_the_watermark_reads_not_ready_with_the_store_up_and_counts_the_turns() {
    let plan = FaultPlan::new();
    plan.set_free_bytes(Some(1024 * 1024 * 1024));
    let app = spawn_faulty_app_with(
        |l| l.settings.storage.min_free_bytes = 8 * 1024 * 1024,
        plan.clone(),
    )
    .await;
    let s = app.scrape().await;
    assert_eq!(count(&s, "dedupd_ready", &[]), 1.0);
    assert_eq!(count(&s, "dedupd_store_up", &[]), 1.0);
    assert_eq!(count(&s, "dedupd_ready_changes_total", &[]), 0.0);

    plan.set_free_bytes(Some(4 * 1024 * 1024));
    assert_eq!(
        app.claim("refused", json!({})).await.status(),
        StatusCode::INSUFFICIENT_STORAGE
    );
    let res = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    let s = app.scrape().await;
    assert_eq!(count(&s, "dedupd_ready", &[]), 0.0);
    assert_eq!(count(&s, "dedupd_store_up", &[]), 1.0);
    assert_eq!(
        count(&s, "dedupd_store_free_bytes", &[]),
        4.0 * 1024.0 * 1024.0
    );
    assert_eq!(count(&s, "dedupd_ready_changes_total", &[]), 1.0);

    plan.set_free_bytes(None);
    eventually("ready again", || async {
        app.client
            .get(app.url("/readyz"))
            .send()
            .await
            .unwrap()
            .status()
            == StatusCode::OK
    })
    .await;
    let s = app.scrape().await;
    assert_eq!(count(&s, "dedupd_ready", &[]), 1.0);
    assert_eq!(count(&s, "dedupd_ready_changes_total", &[]), 2.0);
}

/// A disk that refuses every write: the store is down, and so is
/// readiness, in the same scrape.
#[tokio::test]
async fn a_disk_that_refuses_writes_reads_the_store_down_and_not_ready() {
    let plan = FaultPlan::new();
    let app = spawn_faulty_app_with(|_| {}, plan.clone()).await;
    assert_eq!(count(&app.scrape().await, "dedupd_store_up", &[]), 1.0);
    plan.set_full(true);
    assert_eq!(
        app.claim("refused", json!({})).await.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    let s = app.scrape().await;
    assert_eq!(count(&s, "dedupd_store_up", &[]), 0.0);
    assert_eq!(count(&s, "dedupd_ready", &[]), 0.0);
    plan.set_full(false);
    eventually("the store is back", || async {
        count(&app.scrape().await, "dedupd_store_up", &[]) == 1.0
    })
    .await;
}

/// The Redis backend's server stops: the store is down and not ready,
/// and both come back with it, each turn counted.
#[cfg(feature = "redis")]
#[tokio::test]
async fn with_redis_down_the_store_reads_down_and_not_ready_until_it_returns() {
    use crate::support::redis::RedisServer;

    let mut server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let url = server.url();
    let app = spawn_app_with(|l| {
        l.settings.storage.backend = dedupd::config::Backend::Redis;
        l.settings.storage.redis.url = dedupd::config::Secret::new(url);
    })
    .await;
    let s = app.scrape().await;
    assert_eq!(count(&s, "dedupd_ready", &[]), 1.0);
    assert_eq!(count(&s, "dedupd_store_up", &[]), 1.0);

    server = tokio::task::spawn_blocking(move || {
        server.stop();
        server
    })
    .await
    .unwrap();
    let s = app.scrape().await;
    assert_eq!(count(&s, "dedupd_ready", &[]), 0.0);
    assert_eq!(count(&s, "dedupd_store_up", &[]), 0.0);

    server = tokio::task::spawn_blocking(move || {
        server.restart();
        server
    })
    .await
    .unwrap();
    eventually("the store is back", || async {
        count(&app.scrape().await, "dedupd_store_up", &[]) == 1.0
    })
    .await;
    let s = app.scrape().await;
    assert_eq!(count(&s, "dedupd_ready", &[]), 1.0);
    assert_eq!(count(&s, "dedupd_ready_changes_total", &[]), 2.0);
    drop(server);
}

/// A Redis that hangs (stopped, not gone) with the shared inbox and a
/// long `response_timeout`: a scrape still answers before Prometheus's
/// default scrape timeout (10 s), with the store down, so the alert on
/// `dedupd_store_up` can fire. (It took two response timeouts one after
/// the other.)
#[cfg(feature = "redis")]
#[tokio::test]
async fn a_scrape_answers_in_time_with_the_store_down_while_redis_hangs() {
    use crate::support::redis::RedisServer;

    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let url = server.url();
    let app = spawn_app_with(|l| {
        l.settings.storage.backend = dedupd::config::Backend::Redis;
        l.settings.storage.redis.url = dedupd::config::Secret::new(url);
        l.settings.storage.redis.response_timeout = Duration::from_secs(6);
        l.settings.gateway.inbox = dedupd::config::sources::InboxPlace::Shared;
    })
    .await;
    assert_eq!(count(&app.scrape().await, "dedupd_store_up", &[]), 1.0);
    let info = std::process::Command::new("redis-cli")
        .arg("-s")
        .arg(&server.socket)
        .args(["info", "server"])
        .output()
        .unwrap();
    let pid = String::from_utf8_lossy(&info.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("process_id:").map(|p| p.trim().to_owned()))
        .unwrap();
    let signal = |sig: &str| {
        assert!(
            std::process::Command::new("kill")
                .args([sig, &pid])
                .status()
                .unwrap()
                .success()
        );
    };
    signal("-STOP");
    let res = app
        .request(Method::GET, "/metrics")
        .timeout(Duration::from_secs(9))
        .send()
        .await;
    signal("-CONT");
    let text = res
        .expect("a scrape answered within Prometheus's default timeout")
        .text()
        .await
        .unwrap();
    assert_eq!(count(&text, "dedupd_store_up", &[]), 0.0, "{text}");
    drop(server);
}

/// Operators see how many keys the store keeps in memory: each claim
/// counts from when it is made until the reaper deletes it (expired, it
/// still takes its memory until then).
#[tokio::test]
async fn the_keys_in_memory_count_claims_until_the_reaper_deletes_them() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let app = gateway_app(&receiver.url, |_| {}).await;
    let claims = |s: &str| count(s, "dedupd_store_keys_in_memory", &[("space", "claims")]);
    let s = app.scrape().await;
    assert_eq!(claims(&s), 0.0);
    assert_eq!(
        count(&s, "dedupd_store_keys_in_memory", &[("space", "keyspace")]),
        0.0
    );
    for i in 0..5 {
        let res = app
            .claim(&format!("k{i}"), json!({ "ttl_ms": 1_000 }))
            .await;
        assert_eq!(res.status(), StatusCode::CREATED);
    }
    // A second claim of a held key is refused and adds nothing.
    let res = app.claim("k0", json!({ "ttl_ms": 1_000 })).await;
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert_eq!(claims(&app.scrape().await), 5.0);

    app.clock.advance(Duration::from_secs(2));
    assert_eq!(claims(&app.scrape().await), 5.0, "expired, not yet reaped");
    dedupd::reaper::Reaper::new(
        app.store.clone(),
        std::sync::Arc::new(app.clock.clone()),
        Duration::from_secs(60),
        100,
    )
    .purge_once(dedupd::clock::Clock::now_ms(&app.clock))
    .await
    .unwrap();
    assert_eq!(claims(&app.scrape().await), 0.0);
}
