//! The webhook edge: a signed post to `/ingest/{source}` is answered once
//! stored, refused posts store nothing, concurrent posts of one event are
//! one event, and a request replayed after its event was reaped is a
//! duplicate within `gateway.dedupe_window` (dedupd signs each forward
//! afresh, so the application's own timestamp check cannot catch it).

use std::sync::Arc;
use std::time::Duration;

use dedupd::clock::Clock;
use dedupd::config::sources::SourceSettings;
use dedupd::gateway::signature::Scheme;
use dedupd::gateway::signature::sign;
use dedupd::reaper::Reaper;
use reqwest::Method;
use reqwest::StatusCode;
use serde_json::Value;
use serde_json::json;

use crate::support::app::TestApp;
use crate::support::app::assert_problem;
use crate::support::app::spawn_app_with;
use crate::support::gateway::DESTINATION;
use crate::support::gateway::SECRET;
use crate::support::gateway::body;
use crate::support::gateway::gateway_app;
use crate::support::gateway::ids;
use crate::support::receiver::Behaviour;
use crate::support::receiver::Receiver;
use crate::support::receiver::eventually;
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

/// The Standard Webhooks signing secret of the provider.
const PROVIDER_WHSEC: &str = "whsec_C2FtcGxlLXByb3ZpZGVyLXNlY3JldC0zMmJ5dGVz";

/// A request as the provider signed it, to be posted again byte for byte.
struct Captured {
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
}

/// An app with one source `name` of `scheme` (event id at `event_id`),
/// delivered events kept for 2 s, the dedupe window at its default.
async fn app_with(name: &str, scheme: &str, event_id: &str, secret: &str, to: &str) -> TestApp {
    let source: SourceSettings = toml::from_str(&format!(
        r#"
        scheme = "{scheme}"
        event_id = "{event_id}"
        forward_to = "{to}"
        secrets = ["{secret}"]
        destination_secret = "{DESTINATION}"
        "#
    ))
    .unwrap();
    let name = name.to_owned();
    spawn_app_with(move |l| {
        l.settings.gateway.delivered_retention = Duration::from_secs(2);
        l.settings.sources.insert(name, source);
    })
    .await
}

impl TestApp {
    fn now_unix_s(&self) -> i64 {
        i64::try_from(self.clock.now_ms() / 1000).unwrap()
    }

    async fn post_captured(&self, source: &str, c: &Captured) -> reqwest::Response {
        let mut req = self
            .client
            .post(self.url(&format!("/ingest/{source}")))
            .header("content-type", "application/json")
            .body(c.body.clone());
        for (name, value) in &c.headers {
            req = req.header(*name, value);
        }
        req.send().await.unwrap()
    }

    /// Posts `c` and returns the `status` it was answered with (200 only).
    async fn post_status(&self, source: &str, c: &Captured) -> String {
        let res = self.post_captured(source, c).await;
        assert_eq!(res.status(), StatusCode::OK);
        let v: Value = res.json().await.unwrap();
        v["status"].as_str().unwrap().to_owned()
    }

    async fn listed(&self, source: &str, status: &str) -> Vec<String> {
        let res = self
            .request(
                Method::GET,
                &format!("/v1/sources/{source}/events?status={status}"),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        let v: Value = res.json().await.unwrap();
        v["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["event_id"].as_str().unwrap().to_owned())
            .collect()
    }

    /// One reaper pass at the app's clock, as the background reaper makes
    /// it (which may have made it already: either way it is done after).
    async fn reap(&self) {
        Reaper::new(
            self.store.clone(),
            Arc::new(self.clock.clone()),
            Duration::from_secs(60),
            100,
        )
        .purge_once(self.clock.now_ms())
        .await
        .unwrap();
    }
}

fn github(id: &str, ts: i64) -> Captured {
    let body = serde_json::to_vec(&json!({ "request_id": id, "action": "opened" })).unwrap();
    Captured {
        headers: sign(Scheme::Github, SECRET, ts, "", &body),
        body,
    }
}

fn standard(id: &str, ts: i64) -> Captured {
    let body = serde_json::to_vec(&json!({ "type": "invoice.paid" })).unwrap();
    Captured {
        headers: sign(Scheme::StandardWebhooks, PROVIDER_WHSEC, ts, id, &body),
        body,
    }
}

/// GitHub signs no timestamp: a captured request verifies forever. Past
/// the delivered retention (2 s) its event is reaped, and the same request
/// is still a duplicate, not delivered again, for the dedupe window (30
/// days from its receipt); after that it is a new event.
#[tokio::test]
async fn a_github_request_replayed_after_its_event_is_reaped_is_a_duplicate_for_the_window() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let app = app_with("gh", "github", "body:/request_id", SECRET, &receiver.url).await;
    let first = github("gh_1", app.now_unix_s());
    assert_eq!(app.post_status("gh", &first).await, "accepted");
    eventually("gh_1 is delivered", || async {
        app.listed("gh", "delivered").await == ["gh_1"]
    })
    .await;

    app.clock.advance(Duration::from_secs(3));
    app.reap().await;
    assert!(app.listed("gh", "delivered").await.is_empty(), "reaped");
    assert_eq!(app.post_status("gh", &first).await, "duplicate");
    assert!(app.listed("gh", "pending").await.is_empty(), "not stored");
    // Nothing more reaches the receiver: the next event arrives alone.
    assert_eq!(
        app.post_status("gh", &github("gh_2", app.now_unix_s()))
            .await,
        "accepted"
    );
    eventually("gh_2 is delivered", || async {
        receiver.received().len() >= 2
    })
    .await;
    assert_eq!(ids(&receiver.received()), ["gh_1", "gh_2"]);

    // A day before the window ends it still holds; once it has ended and
    // the reaper has removed the record, the request is a new event.
    app.clock.advance(Duration::from_secs(29 * 86_400));
    app.reap().await;
    assert_eq!(app.post_status("gh", &first).await, "duplicate");
    app.clock.advance(Duration::from_secs(86_400));
    app.reap().await;
    assert_eq!(app.post_status("gh", &first).await, "accepted");
    eventually("gh_1 is delivered again", || async {
        receiver.received().len() >= 3
    })
    .await;
    assert_eq!(ids(&receiver.received()), ["gh_1", "gh_2", "gh_1"]);
}

/// Standard Webhooks signs a timestamp, but with the delivered retention
/// (2 s) shorter than `tolerance` (5 m) the event was reaped while a
/// replay still verified: it is a duplicate all the same, and once the
/// tolerance has passed the signature refuses it.
#[tokio::test]
async fn a_standard_webhooks_replay_within_tolerance_after_the_event_is_reaped_is_a_duplicate() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let app = app_with(
        "sw",
        "standard-webhooks",
        "header:webhook-id",
        PROVIDER_WHSEC,
        &receiver.url,
    )
    .await;
    let first = standard("msg_1", app.now_unix_s());
    assert_eq!(app.post_status("sw", &first).await, "accepted");
    eventually("msg_1 is delivered", || async {
        app.listed("sw", "delivered").await == ["msg_1"]
    })
    .await;

    app.clock.advance(Duration::from_secs(3));
    app.reap().await;
    assert!(app.listed("sw", "delivered").await.is_empty(), "reaped");
    assert_eq!(app.post_status("sw", &first).await, "duplicate");
    assert!(app.listed("sw", "pending").await.is_empty(), "not stored");
    assert_eq!(
        app.post_status("sw", &standard("msg_2", app.now_unix_s()))
            .await,
        "accepted"
    );
    eventually("msg_2 is delivered", || async {
        receiver.received().len() >= 2
    })
    .await;
    assert_eq!(ids(&receiver.received()), ["msg_1", "msg_2"]);

    app.clock.advance(Duration::from_secs(300));
    let res = app.post_captured("sw", &first).await;
    assert_problem(res, StatusCode::UNAUTHORIZED, "timestamp_out_of_tolerance").await;
}

/// Anyone who captured one signed request may post it again and again
/// (a GitHub one verifies forever): each answer, `duplicate`, must come
/// from what the file shows without making the writer commit what it holds
/// (`storage.commit_hold`); the red team measured a commit per replay,
/// which took group commit away from every write.
#[tokio::test]
async fn a_flood_of_one_replayed_request_does_not_defeat_group_commit() {
    // The delivery is held open while counting: a dispatcher with a turn
    // in flight and nothing else due reads nothing, so only the requests
    // below could make the writer commit.
    let receiver = Receiver::start(Behaviour::Hold(None)).await;
    let source: SourceSettings = toml::from_str(&format!(
        r#"
        scheme = "github"
        event_id = "body:/request_id"
        forward_to = "{}"
        secrets = ["{SECRET}"]
        destination_secret = "{DESTINATION}"
        "#,
        receiver.url
    ))
    .unwrap();
    let app = spawn_app_with(move |l| {
        l.settings.sources.insert("gh".into(), source);
        let s = &mut l.settings.storage;
        s.commit_hold = Duration::from_secs(3600);
        s.checkpoint_interval = Duration::from_secs(3600);
        s.checkpoint_idle = Duration::from_secs(3600);
    })
    .await;
    let captured = github("evt-replayed", app.now_unix_s());
    assert_eq!(app.post_status("gh", &captured).await, "accepted");
    eventually("evt-replayed is being delivered", || async {
        receiver.held() == 1
    })
    .await;
    // A read of what was acknowledged commits the lease, so nothing is
    // held when counting starts.
    assert_eq!(app.listed("gh", "pending").await, ["evt-replayed"]);
    // Claims amid the replays: each replay could commit the claim before it.
    let quiet = app
        .window_without_commits(|attempt| {
            let (app, captured) = (&app, &captured);
            async move {
                for i in 0..20 {
                    app.claim_ok(&format!("k{attempt}-{i}"), json!({})).await;
                    for _ in 0..5 {
                        assert_eq!(app.post_status("gh", captured).await, "duplicate");
                    }
                }
            }
        })
        .await;
    assert!(
        quiet.is_some(),
        "the replays committed the held writes, in every window"
    );
    receiver.release();
    eventually("evt-replayed is delivered", || async {
        app.listed("gh", "delivered").await == ["evt-replayed"]
    })
    .await;
    assert_eq!(
        ids(&receiver.received()),
        ["evt-replayed"],
        "delivered once"
    );
}
