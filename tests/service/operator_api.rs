//! The operator API, as the console and the CLI read it: the overview of every source, one
//! event whole, listings newest first — and the console's own files: no
//! token needed, a strict Content-Security-Policy, revalidated by ETag.
//! The page itself is driven in a real browser by `tests/ui`.
//! Also the event listing's cursor and its query checks.

use std::time::Duration;

use reqwest::Method;
use reqwest::StatusCode;
use serde_json::Value;

use crate::support::app::assert_problem;
use crate::support::app::spawn_app_with;
use crate::support::app::start_again;
use crate::support::app::with_tokens;
use crate::support::gateway::body;
use crate::support::gateway::gateway_app;
use crate::support::gateway::settings;
use crate::support::ports::free_port;
use crate::support::receiver::Behaviour;
use crate::support::receiver::Receiver;
use crate::support::receiver::eventually;
async fn get_json(app: &crate::support::app::TestApp, path: &str) -> Value {
    let res = app.request(Method::GET, path).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK, "{path}");
    res.json().await.unwrap()
}

#[tokio::test]
async fn the_overview_counts_each_sources_events_and_keeps_a_removed_source_with_events() {
    let receiver = Receiver::start(Behaviour::Always(503)).await;
    let app = gateway_app(&receiver.url, |s| s.max_attempts = 1).await;
    // Configured, nothing received yet: listed with zeros.
    let v = get_json(&app, "/v1/sources").await;
    assert_eq!(v["sources"][0]["source"], "sume");
    assert_eq!(v["sources"][0]["configured"], true);
    assert_eq!(v["sources"][0]["pending"], 0);
    assert_eq!(v["sources"][0]["oldest_pending_age_ms"], Value::Null);
    assert_eq!(v["sources"][0]["delivery"]["state"], "running");

    app.ingest_ok(&body("d1", "run_1", "2026-11-29T10:00:00Z"))
        .await;
    app.ingest_ok(&body("d2", "run_2", "2026-11-29T10:00:00Z"))
        .await;
    eventually("two dead events", || async {
        app.event_ids("dead").await.len() == 2
    })
    .await;
    // A pending one that waits: the receiver holds it.
    receiver.set(Behaviour::Hold(None));
    app.ingest_ok(&body("p1", "run_3", "2026-11-29T10:00:00Z"))
        .await;
    eventually("the held delivery", || async { receiver.held() == 1 }).await;
    app.clock.advance(Duration::from_secs(90));
    let v = get_json(&app, "/v1/sources").await;
    let row = &v["sources"][0];
    assert_eq!(
        (
            &row["pending"],
            &row["delivered"],
            &row["stale"],
            &row["dead"]
        ),
        (
            &Value::from(1),
            &Value::from(0),
            &Value::from(0),
            &Value::from(2)
        ),
        "{v}"
    );
    assert_eq!(row["oldest_pending_age_ms"], 90_000, "{v}");
    assert_eq!(row["delivery"]["in_flight"], 1, "{v}");
    receiver.release();
    eventually("p1 delivered", || async {
        app.event_ids("delivered").await == ["p1"]
    })
    .await;

    // The source leaves the configuration; another one comes in.
    let (mut loaded, dir, clock) = app.stop().await;
    loaded.settings.sources.clear();
    loaded
        .settings
        .sources
        .insert("billing".into(), settings(&receiver.url));
    let app = start_again(loaded, dir, clock).await;
    let v = get_json(&app, "/v1/sources").await;
    let names: Vec<(&str, bool)> = v["sources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["source"].as_str().unwrap(), s["configured"] == true))
        .collect();
    assert_eq!(names, [("billing", true), ("sume", false)], "{v}");
    let removed = &v["sources"][1];
    assert_eq!(
        (&removed["dead"], &removed["delivered"]),
        (&2.into(), &1.into())
    );
    assert_eq!(removed["delivery"], Value::Null);
}

#[tokio::test]
async fn one_event_is_shown_whole_with_its_headers_and_body() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let app = gateway_app(&receiver.url, |_| {}).await;
    let b = body("ev_1", "run_1", "2026-11-29T10:00:00Z");
    app.ingest_ok(&b).await;
    eventually("delivered", || async {
        app.event_ids("delivered").await == ["ev_1"]
    })
    .await;
    let v = get_json(&app, "/v1/sources/sume/events/ev_1").await;
    assert_eq!(v["event_id"], "ev_1");
    assert_eq!(v["status"], "delivered");
    assert_eq!(v["stream"], "run_1");
    assert_eq!(v["attempts"], 1);
    assert_eq!(v["body"], String::from_utf8(b.clone()).unwrap());
    assert_eq!(v["body_bytes"], b.len());
    assert_eq!(
        v["headers"],
        serde_json::json!([{"name": "content-type", "value": "application/json"}])
    );
    let res = app
        .request(Method::GET, "/v1/sources/sume/events/nope")
        .send()
        .await
        .unwrap();
    assert_problem(res, StatusCode::NOT_FOUND, "unknown_event").await;
    let res = app
        .request(Method::GET, "/v1/sources/nope/events/ev_1")
        .send()
        .await
        .unwrap();
    assert_problem(res, StatusCode::NOT_FOUND, "unknown_source").await;
}

#[tokio::test]
async fn a_listing_pages_newest_first_when_asked() {
    let receiver = Receiver::start(Behaviour::Hold(None)).await;
    let app = gateway_app(&receiver.url, |_| {}).await;
    // One stream: the first is held in flight, the rest wait behind it.
    for i in 0..5 {
        app.ingest_ok(&body(&format!("e{i}"), "run_1", "2026-11-29T10:00:00Z"))
            .await;
        app.clock.advance(Duration::from_millis(1));
    }
    let mut seen = Vec::new();
    let mut path = "/v1/sources/sume/events?status=pending&order=newest&limit=2".to_owned();
    loop {
        let v = get_json(&app, &path).await;
        seen.extend(
            v["events"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["event_id"].as_str().unwrap().to_owned()),
        );
        match v["next"].as_str() {
            Some(next) => {
                path = format!(
                    "/v1/sources/sume/events?status=pending&order=newest&limit=2&after={next}"
                );
            }
            None => break,
        }
    }
    assert_eq!(seen, ["e4", "e3", "e2", "e1", "e0"]);
    let res = app
        .request(
            Method::GET,
            "/v1/sources/sume/events?status=pending&order=sideways",
        )
        .send()
        .await
        .unwrap();
    assert_problem(res, StatusCode::BAD_REQUEST, "invalid_order").await;
    receiver.release();
}

#[tokio::test]
async fn the_console_is_served_without_a_token_under_a_strict_content_security_policy() {
    let app = spawn_app_with(|l| with_tokens(l, &["a-token-of-sixteen-chars"])).await;
    for (path, content_type) in [
        ("/ui", "text/html; charset=utf-8"),
        ("/ui/app.js", "text/javascript; charset=utf-8"),
        ("/ui/app.css", "text/css; charset=utf-8"),
        ("/ui/favicon.svg", "image/svg+xml"),
    ] {
        // No bearer token: the files hold no data.
        let res = app.client.get(app.url(path)).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{path}");
        let h = res.headers().clone();
        assert_eq!(h["content-type"], content_type, "{path}");
        assert_eq!(
            h["content-security-policy"],
            "default-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
        );
        assert_eq!(h["x-content-type-options"], "nosniff");
        assert_eq!(h["cache-control"], "no-cache");
        let etag = h["etag"].to_str().unwrap().to_owned();
        let again = app
            .client
            .get(app.url(path))
            .header("if-none-match", &etag)
            .send()
            .await
            .unwrap();
        assert_eq!(again.status(), StatusCode::NOT_MODIFIED, "{path}");
        assert!(again.bytes().await.unwrap().is_empty());
    }
    // No inline script or style for the policy to refuse.
    let html = app
        .client
        .get(app.url("/ui"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for tag in html.split("<script").skip(1) {
        assert!(tag.trim_start().starts_with("src="), "inline script: {tag}");
    }
    assert!(!html.contains("<style") && !html.contains("style="));
    // The data is not: /v1 still wants the token.
    let res = app.client.get(app.url("/v1/sources")).send().await.unwrap();
    assert_problem(res, StatusCode::UNAUTHORIZED, "unauthorized").await;
    let res = app.client.get(app.url("/ui/nope.js")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    let res = app.client.post(app.url("/ui")).send().await.unwrap();
    assert_problem(res, StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed").await;
}

#[tokio::test]
async fn a_body_that_is_not_utf8_is_shown_in_base64() {
    use dedupd::gateway::signature::{Scheme, sign};
    const WHSEC: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let receiver = Receiver::start(Behaviour::Hold(None)).await;
    let s: dedupd::config::sources::SourceSettings = toml::from_str(&format!(
        r#"
        scheme = "standard-webhooks"
        secrets = ["{WHSEC}"]
        event_id = "header:webhook-id"
        forward_to = "{}"
        destination_secret = "{WHSEC}"
        "#,
        receiver.url
    ))
    .unwrap();
    let app = spawn_app_with(move |l| {
        l.settings.sources.insert("bin".into(), s);
    })
    .await;
    let raw = vec![0xff, 0x00, 0xfe, b'a'];
    let ts = i64::try_from(dedupd::clock::Clock::now_ms(&app.clock) / 1000).unwrap();
    let mut req = app
        .client
        .post(app.url("/ingest/bin"))
        .header("content-type", "application/octet-stream")
        .body(raw.clone());
    for (name, value) in sign(Scheme::StandardWebhooks, WHSEC, ts, "msg_bin", &raw) {
        req = req.header(name, value);
    }
    assert_eq!(req.send().await.unwrap().status(), StatusCode::OK);
    let v = get_json(&app, "/v1/sources/bin/events/msg_bin").await;
    assert_eq!(v["body"], Value::Null, "{v}");
    assert_eq!(v["body_base64"], "/wD+YQ==", "{v}");
    assert_eq!(v["body_bytes"], 4);
    receiver.release();
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

/// `GET /v1/sources/{source}/count`: each part of the filter narrows the
/// count; a wrong parameter is a 400 that names it.
#[tokio::test]
async fn a_count_by_filter_narrows_with_each_part_and_refuses_what_it_cannot_read() {
    let receiver = Receiver::start(Behaviour::Always(503)).await;
    let app = gateway_app(&receiver.url, |s| s.max_attempts = 1).await;
    let received = dedupd::clock::Clock::now_ms(&app.clock);
    for (id, run, kind) in [
        ("a", "run_1", "run.failed"),
        ("b", "run_1", "run.updated"),
        ("c", "run_2", "run.failed"),
    ] {
        let b = serde_json::to_vec(&serde_json::json!({
            "request_id": id, "run_id": run, "created_at": "2026-11-29T10:00:00Z", "type": kind,
        }))
        .unwrap();
        app.ingest_ok(&b).await;
    }
    app.retrying_until("all dead", || async {
        app.event_ids("dead").await.len() == 3
    })
    .await;
    let count = |query: String| {
        let app = &app;
        async move { get_json(app, &format!("/v1/sources/sume/count?{query}")).await }
    };
    let all = count("status=dead".into()).await;
    assert_eq!(
        (
            all["matched"].as_u64(),
            all["scanned"].as_u64(),
            all["complete"].as_bool()
        ),
        (Some(3), Some(3), Some(true)),
        "{all}"
    );
    assert_eq!(all["first_ids"], serde_json::json!(["a", "b", "c"]));
    let cases = [
        ("status=dead&stream=run_1".to_owned(), 2),
        ("status=dead&field=%2Ftype&value=run.failed".to_owned(), 2),
        (
            "status=dead&stream=run_1&field=%2Ftype&value=run.failed".to_owned(),
            1,
        ),
        ("status=dead&error_contains=503".to_owned(), 3),
        ("status=dead&error_contains=504".to_owned(), 0),
        (format!("status=dead&received_from={received}"), 3),
        (format!("status=dead&received_to={received}"), 0),
        (
            "status=dead&created_from=2026-11-29T10:00:00Z".to_owned(),
            3,
        ),
        ("status=dead&created_to=2026-11-29T10:00:00Z".to_owned(), 0),
        ("status=delivered".to_owned(), 0),
    ];
    for (query, want) in cases {
        assert_eq!(count(query.clone()).await["matched"], want, "{query}");
    }
    for (query, code) in [
        ("status=gone", "invalid_status"),
        ("status=dead&field=type&value=x", "invalid_field"),
        ("status=dead&field=%2Ftype", "invalid_field"),
        ("status=dead&created_from=yesterday", "invalid_created_at"),
        ("status=dead&colour=red", "invalid_query"),
        ("status=dead&received_from=-1", "invalid_query"),
    ] {
        let res = app
            .request(Method::GET, &format!("/v1/sources/sume/count?{query}"))
            .send()
            .await
            .unwrap();
        let problem = assert_problem(res, StatusCode::BAD_REQUEST, code).await;
        // The problem names what is wrong.
        let name = query.rsplit('&').next().unwrap().split('=').next().unwrap();
        let detail = problem["detail"].as_str().unwrap_or_default();
        assert!(
            detail.contains(name) || code != "invalid_query",
            "{query}: {problem}"
        );
    }
    let res = app
        .request(Method::GET, "/v1/sources/nope/count?status=dead")
        .send()
        .await
        .unwrap();
    assert_problem(res, StatusCode::NOT_FOUND, "unknown_source").await;
}
