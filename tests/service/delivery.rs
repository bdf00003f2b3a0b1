//! Delivery to the application: the forwarded request and its signature,
//! per-stream order and stale events, retries and timeouts, dead events and
//! redelivery, one delivery in flight per stream, and the delivery engine
//! under stress (destinations that hang, a store that fails the head
//! update, sources that leave the configuration). The app runs on a manual
//! clock: a retry waits until the test moves it ([`TestApp::retrying_until`]).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_trait::async_trait;
use dedupd::clock::ManualClock;
use dedupd::clock::Millis;
use dedupd::config::Secret;
use dedupd::domain::CreatedAt;
use dedupd::domain::Fingerprint;
use dedupd::domain::ScopedKey;
use dedupd::domain::Token;
use dedupd::domain::Ttl;
use dedupd::gateway::signature::Scheme;
use dedupd::gateway::signature::Verifier;
use dedupd::gateway::signature::parse_whsec;
use dedupd::gateway::signature::sign_standard_webhooks;
use dedupd::store::ApplyResult;
use dedupd::store::ClaimOutcome;
use dedupd::store::ClaimView;
use dedupd::store::DoneOutcome;
use dedupd::store::ExtendOutcome;
use dedupd::store::Head;
use dedupd::store::PurgeReport;
use dedupd::store::ReleaseOutcome;
use dedupd::store::Store;
use dedupd::store::StoreError;
use dedupd::store::WriteStats;
use reqwest::Method;
use reqwest::StatusCode;
use serde_json::Value;

use crate::support::app::assert_problem;
use crate::support::app::spawn_app_at;
use crate::support::app::spawn_shared_app_with;
use crate::support::gateway::DESTINATION;
use crate::support::gateway::SECRET;
use crate::support::gateway::app_with_sources;
use crate::support::gateway::body;
use crate::support::gateway::delivered_order;
use crate::support::gateway::gateway_app;
use crate::support::gateway::ids;
use crate::support::gateway::settings;
use crate::support::ports::free_port;
use crate::support::receiver::Behaviour;
use crate::support::receiver::Receiver;
use crate::support::receiver::eventually;
#[tokio::test]
async fn a_hanging_receiver_holds_only_its_own_sources_slots() {
    let slow = Receiver::start(Behaviour::Hold(None)).await;
    let fast = Receiver::start(Behaviour::Accept).await;
    let app = app_with_sources(vec![
        ("slow", slow.url.clone(), Box::new(|s| s.max_in_flight = 4)),
        ("fast", fast.url.clone(), Box::new(|_| {})),
    ])
    .await;
    for i in 0..10 {
        app.post_to(
            "slow",
            &body(
                &format!("s{i}"),
                &format!("run_{i}"),
                "2026-11-29T10:00:00Z",
            ),
        )
        .await;
    }
    eventually("the slow source's slots are all held", || async {
        slow.held() == 4
    })
    .await;
    app.post_to("fast", &body("f", "run_f", "2026-11-29T10:00:00Z"))
        .await;
    eventually("the other source's event is delivered", || async {
        app.ids_of("fast", "delivered").await == ["f"]
    })
    .await;
    assert_eq!(slow.held(), 4, "the slow source is still hanging");
    assert_eq!(slow.received().len(), 4, "never more than its own limit");
    let state = app.source_state("slow").await;
    assert_eq!(state["delivery"]["in_flight"], 4, "{state}");
    assert_eq!(state["delivery"]["max_in_flight"], 4, "{state}");
    slow.release();
    eventually("the slow source catches up", || async {
        app.ids_of("slow", "delivered").await.len() == 10
    })
    .await;
}

#[tokio::test]
async fn one_hanging_stream_does_not_block_the_other_streams_of_its_source() {
    let receiver = Receiver::start(Behaviour::Hold(Some("run_hang"))).await;
    let app = gateway_app(&receiver.url, |_| {}).await;
    app.ingest_ok(&body("h1", "run_hang", "2026-11-29T10:01:00Z"))
        .await;
    app.ingest_ok(&body("h2", "run_hang", "2026-11-29T10:02:00Z"))
        .await;
    for i in 0..5 {
        app.ingest_ok(&body(
            &format!("o{i}"),
            &format!("run_{i}"),
            "2026-11-29T10:00:00Z",
        ))
        .await;
    }
    eventually("the other streams are delivered", || async {
        app.event_ids("delivered").await.len() == 5
    })
    .await;
    assert_eq!(
        receiver.held(),
        1,
        "only the hanging stream's first event is out"
    );
    let mut pending = app.event_ids("pending").await;
    pending.sort();
    assert_eq!(pending, ["h1", "h2"]);
    receiver.release();
    eventually("the hanging stream finishes in order", || async {
        app.event_ids("delivered").await.len() == 7
    })
    .await;
    let hang: Vec<String> = ids(&receiver.received())
        .into_iter()
        .filter(|id| id.starts_with('h'))
        .collect();
    assert_eq!(hang, ["h1", "h2"]);
}

/// A store that refuses stream-head updates while `failing` is set.
#[derive(Debug)]
struct FailingApply {
    inner: Arc<dyn Store>,
    failing: Arc<AtomicBool>,
}

#[async_trait]
impl Store for FailingApply {
    async fn claim(
        &self,
        key: &ScopedKey,
        ttl: Ttl,
        fp: Option<Fingerprint>,
        now: Millis,
    ) -> Result<ClaimOutcome, StoreError> {
        self.inner.claim(key, ttl, fp, now).await
    }
    async fn done_with(
        &self,
        key: &ScopedKey,
        token: Token,
        ttl: Ttl,
        result: Option<dedupd::domain::ClaimResult>,
        now: Millis,
    ) -> Result<DoneOutcome, StoreError> {
        self.inner.done_with(key, token, ttl, result, now).await
    }
    async fn release(
        &self,
        key: &ScopedKey,
        token: Token,
        now: Millis,
    ) -> Result<ReleaseOutcome, StoreError> {
        self.inner.release(key, token, now).await
    }
    async fn extend(
        &self,
        key: &ScopedKey,
        token: Token,
        ttl: Ttl,
        now: Millis,
    ) -> Result<ExtendOutcome, StoreError> {
        self.inner.extend(key, token, ttl, now).await
    }
    async fn get(&self, key: &ScopedKey, now: Millis) -> Result<Option<ClaimView>, StoreError> {
        self.inner.get(key, now).await
    }
    async fn apply(
        &self,
        stream: &ScopedKey,
        event_id: &ScopedKey,
        created_at: CreatedAt,
        retention_ms: u64,
        now: Millis,
    ) -> Result<ApplyResult, StoreError> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(StoreError::unavailable("injected: head update refused"));
        }
        self.inner
            .apply(stream, event_id, created_at, retention_ms, now)
            .await
    }
    async fn head(&self, stream: &ScopedKey, now: Millis) -> Result<Option<Head>, StoreError> {
        self.inner.head(stream, now).await
    }
    async fn purge_expired(&self, now: Millis, limit: u64) -> Result<PurgeReport, StoreError> {
        self.inner.purge_expired(now, limit).await
    }
    async fn next_expiry(&self) -> Result<Option<Millis>, StoreError> {
        self.inner.next_expiry().await
    }
    async fn ready(&self) -> Result<(), StoreError> {
        self.inner.ready().await
    }
    fn write_stats(&self) -> WriteStats {
        self.inner.write_stats()
    }
    async fn close(&self) {
        self.inner.close().await;
    }
}

#[tokio::test]
async fn an_event_is_settled_delivered_only_after_its_stream_head_moved() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let failing = Arc::new(AtomicBool::new(true));
    let flag = failing.clone();
    let url = receiver.url.clone();
    let s = settings(&url);
    let app = spawn_shared_app_with(
        move |l| {
            l.settings.sources.insert("sume".into(), s);
        },
        move |file| {
            Arc::new(FailingApply {
                inner: file,
                failing: flag,
            })
        },
    )
    .await;
    app.ingest_ok(&body("new", "run_1", "2026-11-29T10:05:00Z"))
        .await;
    eventually("the application got the event", || async {
        !receiver.received().is_empty()
    })
    .await;
    // The head cannot move: the event is not settled as delivered, and an
    // older event of its stream that arrives now must wait behind it.
    app.ingest_ok(&body("old", "run_1", "2026-11-29T10:00:00Z"))
        .await;
    let pending = app.event_ids("pending").await;
    assert!(pending.contains(&"new".to_owned()), "{pending:?}");
    assert!(app.event_ids("delivered").await.is_empty());
    // The store recovers: the head moves, then the event settles; the
    // older event is found stale and never sent.
    failing.store(false, Ordering::SeqCst);
    app.retrying_until("new delivered, old stale", || async {
        app.event_ids("delivered").await == ["new"] && app.event_ids("stale").await == ["old"]
    })
    .await;
    assert_eq!(
        ids(&receiver.received()),
        ["new"],
        "sent once, and nothing older after it"
    );
}

#[tokio::test]
async fn events_of_a_removed_source_stay_listable_and_go_after_their_retention() {
    let receiver = Receiver::start(Behaviour::Always(503)).await;
    let app = gateway_app(&receiver.url, |s| s.max_attempts = 2).await;
    app.ingest_ok(&body("dead1", "run_1", "2026-11-29T10:00:00Z"))
        .await;
    app.retrying_until("dead", || async {
        app.event_ids("dead").await == ["dead1"]
    })
    .await;
    // One failed attempt, and the clock stands still: it stays pending.
    app.ingest_ok(&body("pend1", "run_2", "2026-11-29T10:00:00Z"))
        .await;
    eventually("pend1 was tried", || async {
        app.events("pending")
            .await
            .first()
            .is_some_and(|e| e["attempts"] == 1)
    })
    .await;
    let (mut loaded, dir, clock) = app.stop().await;
    loaded.settings.sources.clear();
    loaded.settings.reaper.interval = Duration::from_millis(20);
    loaded.settings.gateway.dead_retention = Duration::from_secs(3600);
    let tried = receiver.received().len();
    let app = crate::support::app::start_again(loaded, dir, clock).await;

    // Without the source: listable, not delivered, redeliverable by name.
    assert_eq!(app.event_ids("pending").await, ["pend1"]);
    assert_eq!(app.event_ids("dead").await, ["dead1"]);
    let state = app.source_state("sume").await;
    assert_eq!(state["configured"], false, "{state}");
    let res = app
        .request(Method::POST, "/v1/sources/sume/events/dead1/redeliver")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::ACCEPTED);
    let res = app
        .post_signed_at(
            "sume",
            &body("x", "run_9", "2026-11-29T10:00:00Z"),
            app.now_s(),
            SECRET,
        )
        .await;
    assert_problem(res, StatusCode::NOT_FOUND, "unknown_source").await;
    app.clock.advance(Duration::from_secs(60));
    let mut pending = app.event_ids("pending").await;
    pending.sort();
    assert_eq!(pending, ["dead1", "pend1"]);

    // After the dead-event retention the reaper removes them, and then the
    // source is unknown.
    app.clock.advance(Duration::from_secs(3600));
    eventually("the removed source's events are reaped", || async {
        app.request(Method::GET, "/v1/sources/sume/events?status=pending")
            .send()
            .await
            .unwrap()
            .status()
            == StatusCode::NOT_FOUND
    })
    .await;
    assert_eq!(receiver.received().len(), tried, "nothing was delivered");
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

/// An id that is not plain ASCII goes out percent-encoded in `webhook-id`,
/// and the signature covers what is sent: raw, `commande_é1` was a header
/// most receivers cannot read (this one's `to_str` among them), and each
/// attempt failed until the event was dead; a space at an end is trimmed
/// by the receiver's parser. A plain id goes out as it is.
#[tokio::test]
async fn an_id_that_is_not_plain_ascii_is_forwarded_percent_encoded_and_verifies() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let app = gateway_app(&receiver.url, |_| {}).await;
    let verifier = Verifier::new(
        Scheme::StandardWebhooks,
        &[DESTINATION.to_owned()],
        Duration::from_secs(300),
    )
    .unwrap();
    for (id, sent) in [
        ("commande_é1", "commande_%C3%A91"),
        (" padded 50% ", "%20padded%2050%25%20"),
        ("req 50% a+b", "req 50% a+b"),
    ] {
        let b = body(id, "run_1", "2026-11-29T10:00:00Z");
        app.ingest_ok(&b).await;
        app.retrying_until("delivery", || async {
            receiver.received().iter().any(|r| r.body == b)
        })
        .await;
        let received = receiver.received();
        let got = received.iter().find(|r| r.body == b).unwrap();
        assert_eq!(got.header("webhook-id"), sent, "{id:?}");
        let lookup = |name: &str| got.headers.get(name).map(String::as_str);
        verifier.verify(&lookup, &got.body, app.now_s()).unwrap();
    }
}

/// The secret a rotation brings in (the reference libraries' test key);
/// [`DESTINATION`] is the one it retires.
const NEW_DESTINATION: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

/// A source signing with the new and the old destination secret, in that
/// order, as during a rotation.
fn rotating(s: &mut dedupd::config::sources::SourceSettings) {
    s.destination_secret = None;
    s.destination_secrets = [NEW_DESTINATION, DESTINATION].map(Secret::new).to_vec();
}

#[tokio::test]
async fn a_forward_carries_one_signature_per_destination_secret_and_each_verifies_alone() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let app = gateway_app(&receiver.url, rotating).await;
    let b = body("req_rot", "run_1", "2026-11-29T10:00:00Z");
    app.ingest_ok(&b).await;
    app.retrying_until("delivery", || async { !receiver.received().is_empty() })
        .await;
    let got = &receiver.received()[0];
    let ts: i64 = got.header("webhook-timestamp").parse().unwrap();
    let entries: Vec<&str> = got.header("webhook-signature").split(' ').collect();
    let signed_with =
        |secret: &str| sign_standard_webhooks(&parse_whsec(secret).unwrap(), "req_rot", ts, &b);
    assert_eq!(
        entries,
        [signed_with(NEW_DESTINATION), signed_with(DESTINATION)],
        "one v1 entry per secret, in the listed order"
    );
    let lookup = |name: &str| got.headers.get(name).map(String::as_str);
    let mut tampered = got.body.clone();
    tampered[0] = b' ';
    for secret in [NEW_DESTINATION, DESTINATION] {
        let alone = Verifier::new(
            Scheme::StandardWebhooks,
            &[secret.to_owned()],
            Duration::from_secs(300),
        )
        .unwrap();
        alone.verify(&lookup, &got.body, app.now_s()).unwrap();
        assert!(alone.verify(&lookup, &tampered, app.now_s()).is_err());
    }
}

/// The official Python library (`standardwebhooks`, as docs/gateway.md
/// shows it) verifies one forward of a source in rotation holding the new
/// secret alone, then the old one alone, and refuses the body changed by
/// one byte. Its clock is the machine's, so the app's runs from now. Needs
/// a Python with the package: `.ci/run` makes a virtualenv and names its
/// interpreter in `DEDUPD_TEST_PYTHON`.
#[tokio::test]
#[ignore = "needs DEDUPD_TEST_PYTHON (a python with standardwebhooks); .ci/run runs it"]
async fn the_standardwebhooks_library_verifies_a_forward_with_either_secret_of_a_rotation() {
    let python = std::env::var("DEDUPD_TEST_PYTHON")
        .expect("DEDUPD_TEST_PYTHON names a python that has standardwebhooks (see .ci/run)");
    let receiver = Receiver::start(Behaviour::Accept).await;
    let mut s = settings(&receiver.url);
    rotating(&mut s);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let app = spawn_app_at(ManualClock::new(u64::try_from(now_ms).unwrap()), |l| {
        l.settings.sources.insert("sume".into(), s);
    })
    .await;
    let b = body("req_py", "run_1", "2026-11-29T10:00:00Z");
    app.ingest_ok(&b).await;
    app.retrying_until("delivery", || async { !receiver.received().is_empty() })
        .await;
    let got = &receiver.received()[0];
    let original = String::from_utf8(got.body.clone()).unwrap();
    let case = serde_json::json!({
        "headers": got.headers,
        "bodies": [["original", original], ["tampered", original.replacen("req_py", "req_pz", 1)]],
        "secrets": [["new", NEW_DESTINATION], ["old", DESTINATION], ["other", "whsec_c2VjcmV0LW90aGVy"]],
    });
    const SCRIPT: &str = r#"
import json, sys
from standardwebhooks.webhooks import Webhook, WebhookVerificationError
case = json.load(sys.stdin)
for who, secret in case["secrets"]:
    wh = Webhook(secret)
    for what, body in case["bodies"]:
        try:
            wh.verify(body.encode(), case["headers"])
            print(who, what, "verified")
        except WebhookVerificationError as e:
            print(who, what, "refused:", e)
"#;
    let out =
        crate::support::process::run_with_json(python, vec!["-c".into(), SCRIPT.into()], case)
            .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        [
            "new original verified",
            "new tampered refused: No matching signature found",
            "old original verified",
            "old tampered refused: No matching signature found",
            "other original refused: No matching signature found",
            "other tampered refused: No matching signature found",
        ]
    );
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
    let (mut loaded, dir, clock) = app.stop().await;
    // The source is renamed: the old events have no source any more.
    receiver.set(Behaviour::Accept);
    let mut s = settings(&receiver.url);
    s.max_attempts = 1000;
    loaded.settings.sources.clear();
    loaded.settings.sources.insert("sume2".into(), s);
    let before = receiver.received().len();
    let app = crate::support::app::start_again(loaded, dir, clock).await;
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

#[tokio::test]
async fn a_dispatcher_with_nothing_due_reads_nothing_on_its_poll() {
    // One delivery held open, nothing else due: the dispatcher's poll
    // timer (500 ms) goes off twice below. A read of the inbox on it would
    // make the writer commit the claim it holds, taking group commit away.
    let receiver = Receiver::start(Behaviour::Hold(None)).await;
    let source = settings(&receiver.url);
    let app = crate::support::app::spawn_app_with(move |l| {
        l.settings.sources.insert("sume".into(), source);
        let s = &mut l.settings.storage;
        s.commit_hold = Duration::from_secs(3600);
        s.checkpoint_interval = Duration::from_secs(3600);
        s.checkpoint_idle = Duration::from_secs(3600);
    })
    .await;
    app.ingest_ok(&body("held", "run_1", "2026-11-29T10:00:00Z"))
        .await;
    eventually("held is being delivered", || async { receiver.held() == 1 }).await;
    assert_eq!(app.get("absent").await.status(), StatusCode::NOT_FOUND);
    let commits = || app.store.write_stats().commits;
    // Each window: a claim the writer holds, then 1.2 s of polls.
    let before = app
        .window_without_commits(|i| {
            let app = &app;
            async move {
                app.claim_ok(&format!("k{i}"), serde_json::json!({})).await;
                tokio::time::sleep(Duration::from_millis(1_200)).await;
            }
        })
        .await;
    let before = before.expect("a poll read the inbox: a commit in every window");
    // A claim is read from the index in memory: no commit for it.
    assert_eq!(app.get("k0").await.status(), StatusCode::OK);
    assert_eq!(commits(), before);
    // A read of the inbox does commit it, so the count above could have
    // moved.
    assert!(app.ids_of("sume", "delivered").await.is_empty());
    assert_eq!(commits(), before + 1);
    receiver.release();
}

/// A source's own retention overrides the gateway's: its delivered and
/// dead events are kept that long, another source's as the gateway says.
#[tokio::test]
async fn a_sources_own_retention_overrides_the_gateways() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let app = app_with_sources(vec![
        (
            "brief",
            receiver.url.clone(),
            Box::new(|s| {
                s.delivered_retention = Some(std::time::Duration::from_secs(3600));
                s.dead_retention = Some(std::time::Duration::from_secs(7200));
            }),
        ),
        ("usual", receiver.url.clone(), Box::new(|_| {})),
    ])
    .await;
    for source in ["brief", "usual"] {
        app.post_to(source, &body("e", "run", "2026-11-29T10:00:00Z"))
            .await;
    }
    eventually("both delivered", || async {
        app.ids_of("brief", "delivered").await == ["e"]
            && app.ids_of("usual", "delivered").await == ["e"]
    })
    .await;
    let kept = |source: &'static str| {
        let app = &app;
        async move {
            let v: serde_json::Value = app
                .request(
                    reqwest::Method::GET,
                    &format!("/v1/sources/{source}/events/e"),
                )
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            v["expires_at_ms"].as_u64().unwrap() - v["due_at_ms"].as_u64().unwrap()
        }
    };
    assert_eq!(kept("brief").await, 3_600_000);
    assert_eq!(
        kept("usual").await,
        u64::try_from(app.loaded.settings.gateway.delivered_retention.as_millis()).unwrap()
    );
}
