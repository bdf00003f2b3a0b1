//! What a destination asks, respected: a source's `rate_limit` (deliveries
//! beyond it wait, never fail, and a restart does not burst), and a 429 or
//! 503 with `Retry-After` (the source waits until then, at most
//! `backoff_max`; the answer counts as an attempt); and what it answered,
//! kept: each event's attempt timeline. A real receiver, and the app's
//! clock moved by the test: with the clock standing still, nothing held
//! back can start.

use std::time::Duration;

use dedupd::clock::Clock;

use crate::support::gateway::gateway_app;
use crate::support::receiver::{Behaviour, Receiver, eventually};

/// Waits until the source is held after a `Retry-After`; until when.
async fn held_until(app: &crate::support::app::TestApp) -> u64 {
    eventually("the source holds", || async {
        !app.source_state("sume").await["delivery"]["retry_after_until_ms"].is_null()
    })
    .await;
    let state = app.source_state("sume").await;
    state["delivery"]["retry_after_until_ms"]
        .as_u64()
        .unwrap_or_else(|| panic!("{state}"))
}

#[tokio::test]
async fn deliveries_beyond_the_rate_limit_wait_for_tokens_and_never_fail() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let app = gateway_app(&receiver.url, |s| {
        s.rate_limit = Some("2/s".parse().unwrap());
        s.rate_burst = Some(2);
    })
    .await;
    app.post_events(0, 7).await;
    // The bucket starts empty: nothing goes before a token is there.
    let state = app.source_state("sume").await;
    assert_eq!(state["delivery"]["in_flight"], 0, "{state}");
    assert!(receiver.received().is_empty());

    // One second: two tokens (the burst), two deliveries, no more.
    app.clock.advance(Duration::from_secs(1));
    eventually("two delivered", || async {
        app.event_ids("delivered").await.len() == 2
    })
    .await;
    assert_eq!(receiver.received().len(), 2);

    // Half a second: one token.
    app.clock.advance(Duration::from_millis(500));
    eventually("three delivered", || async {
        app.event_ids("delivered").await.len() == 3
    })
    .await;
    assert_eq!(receiver.received().len(), 3);

    // A long quiet time fills the bucket to its burst only.
    app.clock.advance(Duration::from_secs(60));
    eventually("five delivered", || async {
        app.event_ids("delivered").await.len() == 5
    })
    .await;
    assert_eq!(
        receiver.received().len(),
        5,
        "more than the burst started at once"
    );

    // Every event goes through in the end, each on its first attempt.
    app.clock.advance(Duration::from_secs(1));
    eventually("all delivered", || async {
        app.event_ids("delivered").await.len() == 7
    })
    .await;
    let delivered = app.events("delivered").await;
    assert!(
        delivered.iter().all(|e| e["attempts"] == 1),
        "{delivered:?}"
    );
    assert!(app.events("dead").await.is_empty());
}

#[tokio::test]
async fn a_restart_does_not_burst_past_the_rate_limit() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let app = gateway_app(&receiver.url, |s| {
        s.rate_limit = Some("1/s".parse().unwrap());
        s.rate_burst = Some(5);
    })
    .await;
    app.post_events(0, 8).await;
    app.clock.advance(Duration::from_secs(1));
    eventually("one delivered", || async {
        app.event_ids("delivered").await.len() == 1
    })
    .await;

    // Stopped and started again at the same instant: the bucket of the new
    // process is empty, so the restart cannot spend a burst the old one
    // did not have.
    let app = app.restart().await;
    let state = app.source_state("sume").await;
    assert_eq!(state["delivery"]["in_flight"], 0, "{state}");
    assert_eq!(receiver.received().len(), 1);
    app.clock.advance(Duration::from_secs(1));
    eventually("two delivered", || async {
        app.event_ids("delivered").await.len() == 2
    })
    .await;
    assert_eq!(receiver.received().len(), 2);
}

#[tokio::test]
async fn a_429_with_retry_after_holds_the_source_until_then_and_counts_as_an_attempt() {
    let receiver = Receiver::start(Behaviour::RetryAfter {
        status: 429,
        value: "120",
        times: 1,
    })
    .await;
    let app = gateway_app(&receiver.url, |s| {
        s.max_in_flight = 1;
        s.backoff_min = Duration::from_secs(1);
        s.backoff_max = Duration::from_secs(600);
    })
    .await;
    let t0 = app.clock.now_ms();
    app.post_events(0, 2).await;
    assert_eq!(held_until(&app).await, t0 + 120_000);
    // The hold came before the slot was free: the other event never went.
    assert_eq!(receiver.received().len(), 1);
    let pending = app.events("pending").await;
    let asked = pending
        .iter()
        .find(|e| e["attempts"] == 1)
        .expect("the refused event");
    assert_eq!(
        asked["due_at_ms"],
        t0 + 120_000,
        "the wait replaces the shorter backoff"
    );
    assert!(
        asked["last_error"].as_str().unwrap().contains("429"),
        "{asked}"
    );

    app.clock.advance(Duration::from_secs(119));
    let state = app.source_state("sume").await;
    assert_eq!(
        state["delivery"]["retry_after_until_ms"],
        t0 + 120_000,
        "{state}"
    );
    assert_eq!(receiver.received().len(), 1);

    app.clock.advance(Duration::from_secs(1));
    eventually("both delivered", || async {
        app.event_ids("delivered").await.len() == 2
    })
    .await;
    let mut attempts: Vec<u64> = app
        .events("delivered")
        .await
        .iter()
        .map(|e| e["attempts"].as_u64().unwrap())
        .collect();
    attempts.sort_unstable();
    assert_eq!(attempts, [1, 2], "the 429 counted as an attempt");
    assert!(app.source_state("sume").await["delivery"]["retry_after_until_ms"].is_null());
}

#[tokio::test]
async fn a_503_asking_for_longer_than_backoff_max_waits_backoff_max() {
    let receiver = Receiver::start(Behaviour::RetryAfter {
        status: 503,
        value: "7200",
        times: 1,
    })
    .await;
    let app = gateway_app(&receiver.url, |s| {
        s.backoff_min = Duration::from_secs(1);
        s.backoff_max = Duration::from_secs(60);
    })
    .await;
    let t0 = app.clock.now_ms();
    app.post_events(0, 1).await;
    assert_eq!(held_until(&app).await, t0 + 60_000);
    app.clock.advance(Duration::from_secs(60));
    eventually("delivered", || async {
        app.event_ids("delivered").await.len() == 1
    })
    .await;
}

/// One event as the operator API shows it.
async fn event(app: &crate::support::app::TestApp, id: &str) -> serde_json::Value {
    let res = app
        .request(
            reqwest::Method::GET,
            &format!("/v1/sources/sume/events/{id}"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    res.json().await.unwrap()
}

#[tokio::test]
async fn the_event_shows_each_attempt_with_its_time_status_latency_and_error() {
    let receiver = Receiver::start(Behaviour::RetryAfter {
        status: 503,
        value: "30",
        times: 1,
    })
    .await;
    let app = gateway_app(&receiver.url, |s| {
        s.backoff_min = Duration::from_secs(1);
        s.backoff_max = Duration::from_secs(600);
    })
    .await;
    let t0 = app.clock.now_ms();
    app.post_events(0, 1).await;
    // (Not "no attempt yet": the first may be recorded before a look.)
    assert_eq!(held_until(&app).await, t0 + 30_000);
    // The hold starts as the answer comes; the settle is written after it.
    eventually("the first attempt recorded", || async {
        event(&app, "e0").await["attempts"] == 1
    })
    .await;
    let e = event(&app, "e0").await;
    let first = &e["timeline"][0];
    assert_eq!(first["attempt"], 1, "{e}");
    assert_eq!(first["at_ms"], t0, "sent at the app's clock: {e}");
    assert_eq!(first["status"], 503, "{e}");
    assert!(
        first["error"]
            .as_str()
            .unwrap()
            .contains("Retry-After 30 s"),
        "{e}"
    );
    assert!(first["latency_ms"].as_f64().unwrap() > 0.0, "{e}");

    // The receiver slows down: the latency it took is what is kept.
    receiver.set(Behaviour::Delay(150));
    app.clock.advance(Duration::from_secs(30));
    eventually("delivered", || async {
        app.event_ids("delivered").await == ["e0"]
    })
    .await;
    let e = event(&app, "e0").await;
    let timeline = e["timeline"].as_array().unwrap();
    assert_eq!(timeline.len(), 2, "{e}");
    let second = &timeline[1];
    assert_eq!(second["attempt"], 2, "{e}");
    assert_eq!(second["at_ms"], t0 + 30_000, "{e}");
    assert_eq!(second["status"], 204, "{e}");
    assert!(second["error"].is_null(), "{e}");
    assert!(
        second["latency_ms"].as_f64().unwrap() >= 150.0,
        "the receiver took 150 ms before answering: {e}"
    );
    assert_eq!(e["attempts"], 2);
}
