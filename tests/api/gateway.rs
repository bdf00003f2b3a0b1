//! The webhook gateway end to end: a signed post to `/ingest/sume`, a real
//! receiver behind it, the operator API to look inside.
//!
//! The app runs on a manual clock: a retry or a paused source waits until
//! the test moves the clock ([`TestApp::retrying_until`]), so no test
//! depends on how fast anything runs.

use std::future::Future;
use std::time::Duration;

use dedupd::clock::Clock;
use dedupd::config::sources::SourceSettings;
use dedupd::gateway::signature::{Scheme, Verifier, sign};
use reqwest::{Method, Response, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{TestApp, assert_problem, spawn_app_with};
use crate::receiver::{Behaviour, Receiver, eventually, free_port};

pub(crate) const SECRET: &str = "sume_test_secret";
pub(crate) const DESTINATION: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

pub(crate) fn settings(forward_to: &str) -> SourceSettings {
    let toml = format!(
        r#"
        scheme = "sume"
        event_id = "body:/request_id"
        created_at = "body:/created_at"
        stream = "body:/run_id"
        forward_to = "{forward_to}"
        max_attempts = 4
        backoff_min = "10ms"
        backoff_max = "40ms"
        forward_timeout = "30s"
        max_body_bytes = 4096
        secrets = ["{SECRET}"]
        destination_secret = "{DESTINATION}"
        "#
    );
    toml::from_str(&toml).unwrap()
}

pub(crate) async fn gateway_app(
    forward_to: &str,
    tweak: impl FnOnce(&mut SourceSettings),
) -> TestApp {
    let mut s = settings(forward_to);
    tweak(&mut s);
    spawn_app_with(move |l| {
        l.settings.sources.insert("sume".into(), s);
    })
    .await
}

pub(crate) fn body(id: &str, run: &str, created_at: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "request_id": id, "run_id": run, "created_at": created_at, "type": "run.updated",
    }))
    .unwrap()
}

impl TestApp {
    /// The app's clock, in Unix seconds: what signatures are checked against.
    pub(crate) fn now_s(&self) -> i64 {
        i64::try_from(self.clock.now_ms() / 1000).unwrap()
    }

    /// Waits until `check` holds, moving the app's clock on by 50 ms (past
    /// the test sources' longest backoff) between looks, so retries and
    /// pauses come due without anyone sleeping through them.
    pub(crate) async fn retrying_until<F, Fut>(&self, what: &str, mut check: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !check().await {
            assert!(
                std::time::Instant::now() < deadline,
                "timed out waiting for: {what}"
            );
            self.clock.advance(Duration::from_millis(50));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Posts `body` to `/ingest/{source}` signed the way Sume signs, at `ts`.
    pub(crate) async fn post_signed_at(
        &self,
        source: &str,
        body: &[u8],
        ts: i64,
        secret: &str,
    ) -> Response {
        let mut req = self
            .client
            .post(self.url(&format!("/ingest/{source}")))
            .header("content-type", "application/json")
            .body(body.to_vec());
        for (name, value) in sign(Scheme::Sume, secret, ts, "", body) {
            req = req.header(name, value);
        }
        req.send().await.unwrap()
    }

    pub(crate) async fn ingest(&self, body: &[u8]) -> Response {
        self.post_signed_at("sume", body, self.now_s(), SECRET)
            .await
    }

    pub(crate) async fn ingest_ok(&self, body: &[u8]) -> Value {
        let res = self.ingest(body).await;
        assert_eq!(res.status(), StatusCode::OK);
        res.json().await.unwrap()
    }

    /// The source's events with `status`, from the operator API.
    pub(crate) async fn events(&self, status: &str) -> Vec<Value> {
        let res = self
            .request(
                Method::GET,
                &format!("/v1/sources/sume/events?status={status}"),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        let v: Value = res.json().await.unwrap();
        v["events"].as_array().unwrap().clone()
    }

    pub(crate) async fn event_ids(&self, status: &str) -> Vec<String> {
        self.events(status)
            .await
            .iter()
            .map(|e| e["event_id"].as_str().unwrap().to_owned())
            .collect()
    }
}

pub(crate) fn ids(received: &[crate::receiver::Received]) -> Vec<String> {
    received
        .iter()
        .map(|r| r.header("webhook-id").to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_posts_of_one_event_are_all_answered_200_and_delivered_once() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let app = gateway_app(&receiver.url, |_| {}).await;
    let b = body("req_1", "run_1", "2026-11-29T10:00:00Z");
    let answers = futures_util::future::join_all((0..50).map(|_| app.ingest_ok(&b))).await;
    let accepted = answers.iter().filter(|v| v["status"] == "accepted").count();
    assert_eq!(accepted, 1, "{answers:?}");
    app.retrying_until("the event is delivered", || async {
        app.event_ids("delivered").await == ["req_1"]
    })
    .await;
    // A repeat after delivery is a duplicate too, and is not delivered again:
    // long after it (past any lease), a later event is delivered alone.
    assert_eq!(app.ingest_ok(&b).await["status"], "duplicate");
    app.clock.advance(Duration::from_secs(3600));
    app.ingest_ok(&body("req_2", "run_2", "2026-11-29T10:00:00Z"))
        .await;
    app.retrying_until("the later event is delivered", || async {
        app.event_ids("delivered").await.len() == 2
    })
    .await;
    assert_eq!(ids(&receiver.received()), ["req_1", "req_2"]);
}

#[tokio::test]
async fn the_forwarded_request_is_the_original_body_signed_with_standard_webhooks() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let app = gateway_app(&receiver.url, |_| {}).await;
    let b = body("req_sig", "run_1", "2026-11-29T10:00:00Z");
    app.ingest_ok(&b).await;
    app.retrying_until("delivery", || async { !receiver.received().is_empty() })
        .await;
    let got = &receiver.received()[0];
    assert_eq!(got.body, b, "the body is forwarded byte for byte");
    assert_eq!(got.header("webhook-id"), "req_sig");
    assert_eq!(got.header("dedupd-attempt"), "1");
    assert_eq!(got.header("content-type"), "application/json");
    // The application verifies with the Standard Webhooks scheme under the
    // destination secret (the verifier is checked against the reference
    // library's vectors in src/gateway/signature).
    let verifier = Verifier::new(
        Scheme::StandardWebhooks,
        &[DESTINATION.to_owned()],
        Duration::from_secs(300),
    )
    .unwrap();
    let lookup = |name: &str| got.headers.get(name).map(String::as_str);
    verifier.verify(&lookup, &got.body, app.now_s()).unwrap();
    let wrong = Verifier::new(
        Scheme::StandardWebhooks,
        &["whsec_c2VjcmV0LW90aGVy".to_owned()],
        Duration::from_secs(300),
    )
    .unwrap();
    assert!(wrong.verify(&lookup, &got.body, app.now_s()).is_err());
}

#[tokio::test]
async fn events_of_one_stream_pending_together_are_delivered_in_created_at_order() {
    // The application is failing while the events arrive newest first, so
    // they are all pending together.
    let receiver = Receiver::start(Behaviour::Always(503)).await;
    let app = gateway_app(&receiver.url, |s| s.max_attempts = 1000).await;
    for (id, minute) in [("e4", 4), ("e3", 3), ("e1", 1), ("e2", 2)] {
        app.ingest_ok(&body(id, "run_7", &format!("2026-11-29T10:0{minute}:00Z")))
            .await;
    }
    app.retrying_until("every event was tried", || async {
        receiver.received().len() >= 4
    })
    .await;
    receiver.set(Behaviour::Accept);
    app.retrying_until("all delivered", || async {
        app.event_ids("delivered").await.len() == 4
    })
    .await;
    assert_eq!(delivered_order(&receiver), ["e1", "e2", "e3", "e4"]);
    let res = app
        .request(Method::GET, "/v1/streams/run_7")
        .send()
        .await
        .unwrap();
    assert_eq!(
        res.status(),
        StatusCode::NOT_FOUND,
        "gateway streams live in their own namespace"
    );
}

#[tokio::test]
async fn an_event_older_than_a_delivered_one_is_stale_and_not_delivered() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let app = gateway_app(&receiver.url, |_| {}).await;
    app.ingest_ok(&body("new", "run_1", "2026-11-29T10:05:00Z"))
        .await;
    app.retrying_until("the newer event is delivered", || async {
        app.event_ids("delivered").await == ["new"]
    })
    .await;
    app.ingest_ok(&body("old", "run_1", "2026-11-29T10:00:00Z"))
        .await;
    app.retrying_until("the older event is stale", || async {
        app.event_ids("stale").await == ["old"]
    })
    .await;
    assert_eq!(ids(&receiver.received()), ["new"]);
    // Another stream is not affected.
    app.ingest_ok(&body("other", "run_2", "2026-11-29T09:00:00Z"))
        .await;
    app.retrying_until("delivered", || async {
        app.event_ids("delivered").await.len() == 2
    })
    .await;
}

#[tokio::test]
async fn a_receiver_failing_three_times_gets_the_event_once_after_four_attempts() {
    let receiver = Receiver::start(Behaviour::FailTimes(3)).await;
    let app = gateway_app(&receiver.url, |s| s.max_attempts = 10).await;
    app.ingest_ok(&body("flaky", "run_1", "2026-11-29T10:00:00Z"))
        .await;
    app.retrying_until("delivered", || async {
        app.event_ids("delivered").await == ["flaky"]
    })
    .await;
    let got = receiver.received();
    let attempts: Vec<&str> = got.iter().map(|r| r.header("dedupd-attempt")).collect();
    assert_eq!(attempts, ["1", "2", "3", "4"]);
    let ev = &app.events("delivered").await[0];
    let sent = body("flaky", "run_1", "2026-11-29T10:00:00Z");
    assert_eq!(
        ev["body_bytes"],
        sent.len(),
        "listings give the stored body's size"
    );
    assert_eq!(ev["attempts"], 4);
    assert_eq!(ev["last_error"], Value::Null);
}

#[tokio::test]
async fn a_redirect_is_a_failed_delivery_and_is_not_followed() {
    let receiver = Receiver::start(Behaviour::Redirect).await;
    let app = gateway_app(&receiver.url, |s| s.max_attempts = 2).await;
    app.ingest_ok(&body("moved", "run_1", "2026-11-29T10:00:00Z"))
        .await;
    app.retrying_until("dead", || async {
        app.event_ids("dead").await == ["moved"]
    })
    .await;
    assert_eq!(
        receiver.received().len(),
        2,
        "two attempts, no request to the redirect target"
    );
    let ev = &app.events("dead").await[0];
    assert_eq!(ev["attempts"], 2);
    assert!(ev["last_error"].as_str().unwrap().contains("307"), "{ev}");
}

#[tokio::test]
async fn a_receiver_that_is_down_makes_the_event_dead_and_redeliver_brings_it_through() {
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}/hooks");
    let app = gateway_app(&url, |s| s.max_attempts = 3).await;
    app.ingest_ok(&body("lost", "run_1", "2026-11-29T10:00:00Z"))
        .await;
    app.retrying_until("dead", || async { app.event_ids("dead").await == ["lost"] })
        .await;
    let ev = &app.events("dead").await[0];
    assert_eq!(ev["attempts"], 3);
    assert!(
        ev["last_error"]
            .as_str()
            .unwrap()
            .contains("request failed"),
        "{ev}"
    );

    let receiver = Receiver::start_on(port, Behaviour::Accept).await;
    let res = app
        .request(Method::POST, "/v1/sources/sume/events/lost/redeliver")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::ACCEPTED);
    app.retrying_until("delivered", || async {
        app.event_ids("delivered").await == ["lost"]
    })
    .await;
    assert_eq!(ids(&receiver.received()), ["lost"]);
    // Only dead and stale events can be redelivered; unknown ones are 404.
    let res = app
        .request(Method::POST, "/v1/sources/sume/events/lost/redeliver")
        .send()
        .await
        .unwrap();
    assert_problem(res, StatusCode::CONFLICT, "not_redeliverable").await;
    let res = app
        .request(Method::POST, "/v1/sources/sume/events/nope/redeliver")
        .send()
        .await
        .unwrap();
    assert_problem(res, StatusCode::NOT_FOUND, "unknown_event").await;
}

#[tokio::test]
async fn refused_posts_get_the_right_status_and_store_nothing() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let app = gateway_app(&receiver.url, |_| {}).await;
    let b = body("req_x", "run_1", "2026-11-29T10:00:00Z");

    let res = app
        .post_signed_at("sume", &b, app.now_s(), "not-the-secret")
        .await;
    assert_problem(res, StatusCode::UNAUTHORIZED, "bad_signature").await;
    let res = app
        .post_signed_at("sume", &b, app.now_s() - 3600, SECRET)
        .await;
    assert_problem(res, StatusCode::UNAUTHORIZED, "timestamp_out_of_tolerance").await;
    let res = app
        .client
        .post(app.url("/ingest/sume"))
        .body(b.clone())
        .send()
        .await
        .unwrap();
    assert_problem(res, StatusCode::UNAUTHORIZED, "missing_signature").await;

    let no_id = serde_json::to_vec(&json!({ "run_id": "run_1" })).unwrap();
    let v = assert_problem(
        app.ingest(&no_id).await,
        StatusCode::BAD_REQUEST,
        "missing_event_id",
    )
    .await;
    assert!(
        v["detail"].as_str().unwrap().contains("body:/request_id"),
        "{v}"
    );
    let numeric_id = serde_json::to_vec(&json!({ "request_id": 17 })).unwrap();
    assert_problem(
        app.ingest(&numeric_id).await,
        StatusCode::BAD_REQUEST,
        "invalid_event_id",
    )
    .await;
    let long_id = body(&"x".repeat(513), "run_1", "2026-11-29T10:00:00Z");
    let v = assert_problem(
        app.ingest(&long_id).await,
        StatusCode::BAD_REQUEST,
        "invalid_event_id",
    )
    .await;
    assert_eq!(v["field"], "event_id", "{v}");
    let control_id = body("req\u{7}x", "run_1", "2026-11-29T10:00:00Z");
    assert_problem(
        app.ingest(&control_id).await,
        StatusCode::BAD_REQUEST,
        "invalid_event_id",
    )
    .await;
    let control_stream = body("req_s", "run\n1", "2026-11-29T10:00:00Z");
    assert_problem(
        app.ingest(&control_stream).await,
        StatusCode::BAD_REQUEST,
        "invalid_stream",
    )
    .await;
    assert_problem(
        app.ingest(b"not json").await,
        StatusCode::BAD_REQUEST,
        "malformed_body",
    )
    .await;

    let mut big = body("req_big", "run_1", "2026-11-29T10:00:00Z");
    big.resize(5000, b' ');
    assert_problem(
        app.ingest(&big).await,
        StatusCode::PAYLOAD_TOO_LARGE,
        "body_too_large",
    )
    .await;

    let res = app.post_signed_at("nosuch", &b, app.now_s(), SECRET).await;
    assert_problem(res, StatusCode::NOT_FOUND, "unknown_source").await;
    let res = app
        .request(Method::GET, "/v1/sources/nosuch/events?status=dead")
        .send()
        .await
        .unwrap();
    assert_problem(res, StatusCode::NOT_FOUND, "unknown_source").await;

    for status in ["pending", "delivered", "stale", "dead"] {
        assert!(app.events(status).await.is_empty(), "{status}");
    }
    // The same event, correctly signed, is still new, and it is the only
    // one the application gets.
    assert_eq!(app.ingest_ok(&b).await["status"], "accepted");
    app.retrying_until("delivered", || async {
        app.event_ids("delivered").await == ["req_x"]
    })
    .await;
    assert_eq!(ids(&receiver.received()), ["req_x"]);
}

#[tokio::test]
async fn pending_events_are_delivered_after_a_restart() {
    let receiver = Receiver::start(Behaviour::Always(503)).await;
    let port: u16 = receiver
        .url
        .split(':')
        .nth(2)
        .unwrap()
        .trim_end_matches("/hooks")
        .parse()
        .unwrap();
    let app = gateway_app(&receiver.url, |s| s.max_attempts = 1000).await;
    for i in 0..5 {
        app.ingest_ok(&body(
            &format!("p{i}"),
            &format!("run_{i}"),
            "2026-11-29T10:00:00Z",
        ))
        .await;
    }
    app.retrying_until("every event was tried", || async {
        receiver.received().len() >= 5
    })
    .await;
    // The application goes down while dedupd restarts.
    receiver.stop().await;
    let app = app.restart().await;
    assert_eq!(
        app.event_ids("pending").await.len(),
        5,
        "nothing acknowledged was lost"
    );
    let receiver = Receiver::start_on(port, Behaviour::Accept).await;
    app.retrying_until("all delivered after the restart", || async {
        app.event_ids("delivered").await.len() == 5
    })
    .await;
    let mut got = ids(&receiver.received());
    got.sort();
    assert_eq!(got, ["p0", "p1", "p2", "p3", "p4"]);
}

#[tokio::test]
async fn the_event_list_pages_with_a_cursor_and_checks_its_query() {
    let port = free_port();
    let app = gateway_app(&format!("http://127.0.0.1:{port}/hooks"), |s| {
        s.max_attempts = 1
    })
    .await;
    for i in 0..5 {
        app.ingest_ok(&body(
            &format!("d{i}"),
            &format!("run_{i}"),
            "2026-11-29T10:00:00Z",
        ))
        .await;
    }
    app.retrying_until("all dead", || async {
        app.event_ids("dead").await.len() == 5
    })
    .await;
    let mut seen = Vec::new();
    let mut path = "/v1/sources/sume/events?status=dead&limit=2".to_owned();
    loop {
        let v: Value = app
            .request(Method::GET, &path)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let page = v["events"].as_array().unwrap();
        assert!(page.len() <= 2);
        seen.extend(
            page.iter()
                .map(|e| e["event_id"].as_str().unwrap().to_owned()),
        );
        match v["next"].as_str() {
            Some(next) => {
                path = format!("/v1/sources/sume/events?status=dead&limit=2&after={next}")
            }
            None => break,
        }
    }
    seen.sort();
    assert_eq!(seen, ["d0", "d1", "d2", "d3", "d4"]);
    for bad in [
        "status=gone",
        "",
        "status=dead&limit=0",
        "status=dead&after=%21%21",
    ] {
        let res = app
            .request(Method::GET, &format!("/v1/sources/sume/events?{bad}"))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{bad}");
    }
}

#[tokio::test]
async fn stopping_waits_for_a_delivery_in_flight_to_finish() {
    let receiver = Receiver::start(Behaviour::Delay(500)).await;
    let app = gateway_app(&receiver.url, |_| {}).await;
    app.ingest_ok(&body("slow", "run_1", "2026-11-29T10:00:00Z"))
        .await;
    app.retrying_until("the delivery started", || async {
        !receiver.received().is_empty()
    })
    .await;
    // Stop while the application is still answering; the delivery completes
    // and is recorded before the store closes.
    let app = app.restart().await;
    assert_eq!(app.event_ids("delivered").await, ["slow"]);
    assert_eq!(receiver.received().len(), 1);
}

/// The ids of the receiver's successful deliveries, in order (each event's
/// last request is its successful one).
pub(crate) fn delivered_order(receiver: &Receiver) -> Vec<String> {
    let got = receiver.received();
    let mut order = Vec::new();
    for (i, r) in got.iter().enumerate() {
        let id = r.header("webhook-id").to_owned();
        if !got[i + 1..]
            .iter()
            .any(|later| later.header("webhook-id") == id)
        {
            order.push(id);
        }
    }
    order
}

#[tokio::test]
async fn no_answer_within_the_forward_timeout_is_a_failed_attempt() {
    let receiver = Receiver::start(Behaviour::Delay(3_000)).await;
    let app = gateway_app(&receiver.url, |s| {
        s.forward_timeout = Duration::from_millis(200);
        s.max_attempts = 2;
    })
    .await;
    app.ingest_ok(&body("slowpoke", "run_1", "2026-11-29T10:00:00Z"))
        .await;
    app.retrying_until("dead", || async {
        app.event_ids("dead").await == ["slowpoke"]
    })
    .await;
    let ev = &app.events("dead").await[0];
    assert_eq!(ev["attempts"], 2);
    assert!(
        ev["last_error"]
            .as_str()
            .unwrap()
            .contains("no answer within"),
        "{ev}"
    );
}

#[tokio::test]
async fn an_older_event_arriving_while_a_newer_one_is_in_flight_becomes_stale() {
    let receiver = Receiver::start(Behaviour::Delay(300)).await;
    let app = gateway_app(&receiver.url, |_| {}).await;
    app.ingest_ok(&body("newer", "run_1", "2026-11-29T10:05:00Z"))
        .await;
    app.retrying_until("the newer event is in flight", || async {
        !receiver.received().is_empty()
    })
    .await;
    app.ingest_ok(&body("older", "run_1", "2026-11-29T10:00:00Z"))
        .await;
    app.retrying_until("older is stale", || async {
        app.event_ids("stale").await == ["older"]
    })
    .await;
    assert_eq!(app.event_ids("delivered").await, ["newer"]);
    assert_eq!(ids(&receiver.received()), ["newer"]);
}

#[tokio::test]
async fn an_older_event_arriving_while_a_newer_one_backs_off_is_delivered_first() {
    let receiver = Receiver::start(Behaviour::FailTimes(1)).await;
    let app = gateway_app(&receiver.url, |s| {
        s.backoff_min = Duration::from_millis(300);
        s.backoff_max = Duration::from_millis(300);
    })
    .await;
    app.ingest_ok(&body("newer", "run_1", "2026-11-29T10:05:00Z"))
        .await;
    // The clock stands still: the newer event's retry is not due yet.
    eventually("the newer event failed once", || async {
        receiver.received().len() == 1
    })
    .await;
    app.ingest_ok(&body("older", "run_1", "2026-11-29T10:00:00Z"))
        .await;
    app.retrying_until("both delivered", || async {
        app.event_ids("delivered").await.len() == 2
    })
    .await;
    assert_eq!(delivered_order(&receiver), ["older", "newer"]);
}

#[tokio::test]
async fn a_redelivered_stale_event_is_delivered_although_it_is_older_than_the_head() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let app = gateway_app(&receiver.url, |_| {}).await;
    app.ingest_ok(&body("new", "run_1", "2026-11-29T10:05:00Z"))
        .await;
    app.retrying_until("delivered", || async {
        app.event_ids("delivered").await == ["new"]
    })
    .await;
    app.ingest_ok(&body("old", "run_1", "2026-11-29T10:00:00Z"))
        .await;
    app.retrying_until("stale", || async {
        app.event_ids("stale").await == ["old"]
    })
    .await;
    let res = app
        .request(Method::POST, "/v1/sources/sume/events/old/redeliver")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::ACCEPTED);
    app.retrying_until("the operator's choice is delivered", || async {
        app.event_ids("delivered").await.len() == 2
    })
    .await;
    assert_eq!(ids(&receiver.received()), ["new", "old"]);
}

#[tokio::test]
async fn a_stream_never_has_two_deliveries_in_flight_while_streams_run_in_parallel() {
    // Held until every event is in: each stream's oldest is then in flight
    // at once. (A receiver that only answered after a fixed delay let a
    // slow machine ingest so slowly that no two deliveries overlapped.)
    let receiver = Receiver::start(Behaviour::Hold(None)).await;
    let app = gateway_app(&receiver.url, |_| {}).await;
    for i in 0..6 {
        for run in ["run_a", "run_b", "run_c"] {
            let id = format!("{run}-{i}");
            app.ingest_ok(&body(&id, run, &format!("2026-11-29T10:0{i}:00Z")))
                .await;
        }
    }
    eventually("the three streams in flight at once", || async {
        receiver.held() == 3
    })
    .await;
    // The rest are answered after 50 ms each, counting how many overlap.
    receiver.release_to(Behaviour::Delay(50));
    app.retrying_until("all delivered", || async {
        app.event_ids("delivered").await.len() == 18
    })
    .await;
    let (per_run, _) = receiver.max_concurrency();
    assert_eq!(per_run, 1, "one delivery per stream at a time");
    for run in ["run_a", "run_b", "run_c"] {
        let order: Vec<String> = ids(&receiver.received())
            .into_iter()
            .filter(|id| id.starts_with(run))
            .collect();
        let want: Vec<String> = (0..6).map(|i| format!("{run}-{i}")).collect();
        assert_eq!(order, want, "{run} in created_at order");
    }
}

#[tokio::test]
async fn events_of_a_source_that_left_the_configuration_do_not_block_the_others() {
    let receiver = Receiver::start(Behaviour::Always(503)).await;
    let app = gateway_app(&receiver.url, |s| s.max_attempts = 1000).await;
    for i in 0..8 {
        app.ingest_ok(&body(
            &format!("o{i}"),
            &format!("run_{i}"),
            "2026-11-29T10:00:00Z",
        ))
        .await;
    }
    let (mut loaded, dir, clock, real_time) = app.stop().await;
    // The source is renamed: the old events have no source any more.
    receiver.set(Behaviour::Accept);
    let mut s = settings(&receiver.url);
    s.max_attempts = 1000;
    loaded.settings.sources.clear();
    loaded.settings.sources.insert("sume2".into(), s);
    let before = receiver.received().len();
    let app = crate::helpers::start_again(loaded, dir, clock, real_time).await;
    let res = app
        .post_signed_at(
            "sume2",
            &body("fresh", "run_x", "2026-11-29T10:00:00Z"),
            app.now_s(),
            SECRET,
        )
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    app.retrying_until("the new source's event is delivered", || async {
        receiver
            .received()
            .iter()
            .any(|r| r.header("webhook-id") == "fresh")
    })
    .await;
    assert_eq!(
        receiver.received().len(),
        before + 1,
        "orphaned events are not delivered"
    );
}
