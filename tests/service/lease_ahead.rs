//! Events leased ahead (the dispatcher leases the next events in line with
//! the ones it starts, so a freed slot starts one at once): they keep every
//! guarantee of the others. A stream still goes oldest first when an older
//! event arrives or is redelivered while a newer one is held ahead; held
//! events are handed back (runnable at once, no attempt spent) at a clean
//! stop and when they would wait longer than a turn may take. A real
//! receiver; a rate limit of one token at a time holds events ahead, and
//! the test moves the app's clock.

use std::time::Duration;

use dedupd::clock::Clock;
use reqwest::Method;

use crate::support::app::TestApp;
use crate::support::gateway::{body, gateway_app};
use crate::support::receiver::{Behaviour, Receiver, eventually};

/// The webhook-ids the receiver got, in order.
fn sent(receiver: &Receiver) -> Vec<String> {
    receiver
        .received()
        .iter()
        .map(|r| r.header("webhook-id").to_owned())
        .collect()
}

/// Waits until `id` is pending and leased (its due time is its lease's
/// end, after `now`), or handed back (`leased` false: due by `now`).
async fn wait_lease(app: &TestApp, id: &str, now: u64, leased: bool) {
    eventually(&format!("{id} leased: {leased}"), || async {
        app.events("pending")
            .await
            .iter()
            .any(|e| e["event_id"] == id && (e["due_at_ms"].as_u64().unwrap() > now) == leased)
    })
    .await;
}

/// One token at a time: a source that starts one delivery per second.
async fn one_per_second(receiver: &Receiver) -> TestApp {
    gateway_app(&receiver.url, |s| {
        s.rate_limit = Some("1/s".parse().unwrap());
        s.rate_burst = Some(1);
    })
    .await
}

#[tokio::test]
async fn an_older_event_arriving_while_a_newer_one_is_held_ahead_goes_first() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let app = one_per_second(&receiver).await;
    app.ingest_ok(&body("a_filler", "run_f", "2026-11-29T10:00:00Z"))
        .await;
    app.ingest_ok(&body("b_newer", "run_s", "2026-11-29T10:00:10Z"))
        .await;
    app.clock.advance(Duration::from_secs(1));
    eventually("the filler delivered", || async {
        app.event_ids("delivered").await == ["a_filler"]
    })
    .await;
    let now = app.clock.now_ms();
    wait_lease(&app, "b_newer", now, true).await;

    // An older event of the stream arrives while b_newer waits, unsent: it
    // goes first, and b_newer is handed back until then.
    app.ingest_ok(&body("c_older", "run_s", "2026-11-29T10:00:05Z"))
        .await;
    wait_lease(&app, "b_newer", now, false).await;
    app.clock.advance(Duration::from_secs(1));
    eventually("c_older delivered", || async {
        app.event_ids("delivered").await.len() == 2
    })
    .await;
    app.clock.advance(Duration::from_secs(1));
    eventually("b_newer delivered", || async {
        app.event_ids("delivered").await.len() == 3
    })
    .await;
    assert_eq!(sent(&receiver), ["a_filler", "c_older", "b_newer"]);
    assert!(app.event_ids("stale").await.is_empty());
}

#[tokio::test]
async fn a_redelivered_event_goes_before_a_newer_one_held_ahead() {
    let receiver = Receiver::start(Behaviour::Always(500)).await;
    let app = gateway_app(&receiver.url, |s| {
        s.rate_limit = Some("1/s".parse().unwrap());
        s.rate_burst = Some(1);
        s.max_attempts = 1;
    })
    .await;
    // x_old dies (its one attempt fails); the destination then recovers.
    app.ingest_ok(&body("x_old", "run_s", "2026-11-29T10:00:01Z"))
        .await;
    app.clock.advance(Duration::from_secs(1));
    eventually("x_old dead", || async {
        app.event_ids("dead").await == ["x_old"]
    })
    .await;
    receiver.set(Behaviour::Accept);
    app.ingest_ok(&body("a_filler", "run_f", "2026-11-29T10:00:00Z"))
        .await;
    app.ingest_ok(&body("z_new", "run_s", "2026-11-29T10:00:10Z"))
        .await;
    app.clock.advance(Duration::from_secs(1));
    eventually("the filler delivered", || async {
        app.event_ids("delivered").await == ["a_filler"]
    })
    .await;
    let now = app.clock.now_ms();
    wait_lease(&app, "z_new", now, true).await;

    // Redelivered, x_old is pending with z_new again, and older: first.
    let res = app
        .request(Method::POST, "/v1/sources/sume/events/x_old/redeliver")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 202);
    wait_lease(&app, "z_new", now, false).await;
    for n in [2, 3] {
        app.clock.advance(Duration::from_secs(1));
        eventually("one more delivered", || async {
            app.event_ids("delivered").await.len() == n
        })
        .await;
    }
    assert_eq!(sent(&receiver), ["x_old", "a_filler", "x_old", "z_new"]);
    assert!(app.event_ids("stale").await.is_empty());
}

#[tokio::test]
async fn events_leased_ahead_are_given_back_at_shutdown_and_go_right_after_a_restart() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let app = one_per_second(&receiver).await;
    app.post_events(0, 5).await;
    // One token: one delivery; the dispatcher leases the others ahead in
    // the same write, to start as tokens come.
    app.clock.advance(Duration::from_secs(1));
    eventually("one delivered", || async {
        app.event_ids("delivered").await.len() == 1
    })
    .await;
    let now = app.clock.now_ms();
    eventually("the rest leased ahead", || async {
        let pending = app.events("pending").await;
        pending.len() == 4
            && pending
                .iter()
                .all(|e| e["due_at_ms"].as_u64().unwrap() > now)
    })
    .await;

    // A clean stop gives them back: runnable at once, no attempt spent, so
    // the next token after the restart delivers one at the same instant,
    // not a lease (forward_timeout + 30 s) later.
    let app = app.restart().await;
    let pending = app.events("pending").await;
    assert!(
        pending
            .iter()
            .all(|e| e["due_at_ms"].as_u64().unwrap() <= now
                && e["attempts"] == 0
                && e["last_error"].is_null()),
        "{pending:?}"
    );
    app.clock.advance(Duration::from_secs(1));
    eventually("a second delivered after the restart", || async {
        app.event_ids("delivered").await.len() == 2
    })
    .await;
    assert_eq!(receiver.received().len(), 2);
}

#[tokio::test]
async fn events_held_ahead_longer_than_a_turn_may_take_are_given_back() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    // A token every 5 s: ten seconds of tokens, two events, may wait ahead.
    let app = gateway_app(&receiver.url, |s| {
        s.rate_limit = Some("12/m".parse().unwrap());
        s.rate_burst = Some(1);
    })
    .await;
    app.post_events(0, 3).await;
    app.clock.advance(Duration::from_secs(5));
    eventually("one delivered", || async {
        app.event_ids("delivered").await.len() == 1
    })
    .await;
    let now = app.clock.now_ms();
    for id in ["e1", "e2"] {
        wait_lease(&app, id, now, true).await;
    }
    // 16 s on, a turn started now could outlive their leases: they go back
    // to runnable, and the token there delivers one at once instead of
    // after the lease (forward_timeout + 30 s).
    app.clock.advance(Duration::from_secs(16));
    eventually("a second delivered", || async {
        app.event_ids("delivered").await.len() == 2
    })
    .await;
    let pending = app.events("pending").await;
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(pending[0]["attempts"], 0, "{pending:?}");
}

#[tokio::test]
async fn an_event_held_ahead_then_erased_is_never_sent() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let app = one_per_second(&receiver).await;
    app.ingest_ok(&body("a_filler", "run_f", "2026-11-29T10:00:00Z"))
        .await;
    app.ingest_ok(&body("b_erased", "run_s", "2026-11-29T10:00:10Z"))
        .await;
    app.clock.advance(Duration::from_secs(1));
    eventually("the filler delivered", || async {
        app.event_ids("delivered").await == ["a_filler"]
    })
    .await;
    let now = app.clock.now_ms();
    wait_lease(&app, "b_erased", now, true).await;

    // Erased while held ahead, its body in the dispatcher's memory: it
    // must not go out when the next token comes.
    let res = app
        .request(Method::DELETE, "/v1/sources/sume/events/b_erased")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    app.ingest_ok(&body("c_next", "run_c", "2026-11-29T10:00:20Z"))
        .await;
    app.retrying_until("c_next delivered", || async {
        app.event_ids("delivered")
            .await
            .contains(&"c_next".to_owned())
    })
    .await;
    assert_eq!(sent(&receiver), ["a_filler", "c_next"]);
    assert_eq!(app.event_ids("erased").await, ["b_erased"]);
}

#[tokio::test]
async fn an_event_held_ahead_then_erased_by_a_job_is_never_sent() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let app = one_per_second(&receiver).await;
    app.ingest_ok(&body("a_filler", "run_f", "2026-11-29T10:00:00Z"))
        .await;
    app.ingest_ok(&body("b_erased", "run_s", "2026-11-29T10:00:10Z"))
        .await;
    app.clock.advance(Duration::from_secs(1));
    eventually("the filler delivered", || async {
        app.event_ids("delivered").await == ["a_filler"]
    })
    .await;
    let now = app.clock.now_ms();
    wait_lease(&app, "b_erased", now, true).await;

    let res = app
        .request(Method::POST, "/v1/sources/sume/jobs")
        .json(&serde_json::json!({
            "kind": "erase",
            "filter": { "status": "pending", "stream": "run_s" },
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    let job: serde_json::Value = res.json().await.unwrap();
    let id = job["id"].as_str().unwrap().to_owned();
    eventually("the erase job done", || async {
        let j: serde_json::Value = app
            .request(Method::GET, &format!("/v1/jobs/{id}"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        j["state"] == "done" && j["erased"] == 1
    })
    .await;
    app.ingest_ok(&body("c_next", "run_c", "2026-11-29T10:00:20Z"))
        .await;
    app.retrying_until("c_next delivered", || async {
        app.event_ids("delivered")
            .await
            .contains(&"c_next".to_owned())
    })
    .await;
    assert_eq!(sent(&receiver), ["a_filler", "c_next"]);
    assert_eq!(app.event_ids("erased").await, ["b_erased"]);
}
