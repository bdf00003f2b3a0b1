//! Bulk jobs and erasure against a real receiver: a redeliver job replays
//! what its filter matches (in `created_at` order per stream, with a
//! `dedupd-replay` header, attempts counting on, the head never moving
//! back), keeps at most half the source's slots, can be cancelled, resumes
//! after a restart; erasure (one event, or a job) deletes bodies and
//! headers and keeps the id a duplicate.

use std::collections::HashMap;

use reqwest::Method;
use reqwest::StatusCode;
use serde_json::Value;
use serde_json::json;

use crate::support::app::TestApp;
use crate::support::app::assert_problem;
use crate::support::app::start_again;
use crate::support::gateway::body;
use crate::support::gateway::gateway_app;
use crate::support::receiver::Behaviour;
use crate::support::receiver::Receiver;
use crate::support::receiver::eventually;

async fn start_job(app: &TestApp, kind: &str, filter: Value) -> Value {
    let res = app
        .request(Method::POST, "/v1/sources/sume/jobs")
        .json(&json!({ "kind": kind, "filter": filter }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    res.json().await.unwrap()
}

async fn job(app: &TestApp, id: &str) -> Value {
    let res = app
        .request(Method::GET, &format!("/v1/jobs/{id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    res.json().await.unwrap()
}

async fn finished(app: &TestApp, id: &str) -> Value {
    eventually("the job to finish", || async {
        job(app, id).await["state"] != "running"
    })
    .await;
    job(app, id).await
}

async fn ingest_delivered(app: &TestApp, events: &[(&str, &str, &str)]) {
    for (id, run, at) in events {
        app.ingest_ok(&body(id, run, at)).await;
    }
    eventually("every event delivered", || async {
        app.event_ids("delivered").await.len() == events.len()
    })
    .await;
}

/// The replays the receiver got: (event id, dedupd-replay, dedupd-attempt,
/// run) in arrival order.
fn replays(receiver: &Receiver) -> Vec<(String, String, String, String)> {
    receiver
        .received()
        .iter()
        .filter(|r| !r.header("dedupd-replay").is_empty())
        .map(|r| {
            let b: Value = serde_json::from_slice(&r.body).unwrap();
            (
                r.header("webhook-id").to_owned(),
                r.header("dedupd-replay").to_owned(),
                r.header("dedupd-attempt").to_owned(),
                b["run_id"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_redeliver_job_replays_in_order_with_its_header_and_the_head_never_moves_back() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let app = gateway_app(&receiver.url, |s| s.max_in_flight = 4).await;
    ingest_delivered(
        &app,
        &[
            ("a3", "run_1", "2026-11-29T10:00:03Z"),
            ("b1", "run_2", "2026-11-29T10:00:01Z"),
            ("a5", "run_1", "2026-11-29T10:00:05Z"),
            ("b2", "run_2", "2026-11-29T10:00:02Z"),
        ],
    )
    .await;
    // a4 comes after a5: stale, not delivered, and not matched below.
    app.ingest_ok(&body("a4", "run_1", "2026-11-29T10:00:04Z"))
        .await;
    eventually("a4 stale", || async {
        app.event_ids("stale").await == ["a4"]
    })
    .await;

    // The dry run counts what the job would touch.
    let res = app
        .request(Method::POST, "/v1/sources/sume/jobs")
        .json(&json!({ "kind": "redeliver", "filter": { "status": "delivered" }, "dry_run": true }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let dry: Value = res.json().await.unwrap();
    assert_eq!(dry["matched"], 4, "{dry}");

    let started = start_job(&app, "redeliver", json!({ "status": "delivered" })).await;
    let id = started["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("job_"), "{started}");
    let done = finished(&app, &id).await;
    assert_eq!(done["state"], "done", "{done}");
    assert_eq!(
        (
            &done["matched"],
            &done["delivered"],
            &done["failed"],
            &done["queued"]
        ),
        (&json!(4), &json!(4), &json!(0), &json!(0)),
        "{done}"
    );

    let got = replays(&receiver);
    assert_eq!(got.len(), 4, "{got:?}");
    for (event, job, attempt, _) in &got {
        assert_eq!(job, &id, "{event}");
        // Its first delivery was attempt 1: the replay counts on.
        assert_eq!(attempt, "2", "{event}");
    }
    // Per stream, in created_at order.
    let run_1: Vec<&str> = got
        .iter()
        .filter(|r| r.3 == "run_1")
        .map(|r| r.0.as_str())
        .collect();
    assert_eq!(run_1, ["a3", "a5"]);
    let run_2: Vec<&str> = got
        .iter()
        .filter(|r| r.3 == "run_2")
        .map(|r| r.0.as_str())
        .collect();
    assert_eq!(run_2, ["b1", "b2"]);

    // The head stayed at a5: an event older than it is still stale.
    app.ingest_ok(&body("a4b", "run_1", "2026-11-29T10:00:04Z"))
        .await;
    eventually("a4b stale", || async {
        app.event_ids("stale").await.contains(&"a4b".to_owned())
    })
    .await;

    // The replayed events show the job and their attempts.
    let e: Value = app
        .request(Method::GET, "/v1/sources/sume/events/a3")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(e["attempts"], 2, "{e}");
    assert_eq!(e["status"], "delivered", "{e}");
    assert_eq!(e["replay_job"], id.as_str(), "{e}");

    // A second job over the same filter replays them again, as its own.
    let again = start_job(
        &app,
        "redeliver",
        json!({ "status": "delivered", "stream": "run_2" }),
    )
    .await;
    let again_id = again["id"].as_str().unwrap().to_owned();
    let done = finished(&app, &again_id).await;
    assert_eq!(done["delivered"], 2, "{done}");
    let by_job: Vec<String> = replays(&receiver)
        .into_iter()
        .filter(|r| r.1 == again_id)
        .map(|r| r.0)
        .collect();
    assert_eq!(by_job, ["b1", "b2"]);
}

#[tokio::test]
async fn a_replayed_dead_event_gets_a_fresh_retry_budget_and_its_attempts_count_on() {
    let receiver = Receiver::start(Behaviour::Always(503)).await;
    let app = gateway_app(&receiver.url, |s| s.max_attempts = 2).await;
    app.ingest_ok(&body("d1", "run_1", "2026-11-29T10:00:00Z"))
        .await;
    app.retrying_until("dead", || async { app.event_ids("dead").await == ["d1"] })
        .await;
    // Fails twice more under the job, then succeeds: with a budget of two
    // attempts counted from the replay it would die first.
    receiver.set(Behaviour::FailTimes(1));
    let started = start_job(&app, "redeliver", json!({ "status": "dead" })).await;
    let id = started["id"].as_str().unwrap().to_owned();
    app.retrying_until("the job to finish", || async {
        job(&app, &id).await["state"] != "running"
    })
    .await;
    let done = job(&app, &id).await;
    assert_eq!(
        (&done["delivered"], &done["failed"]),
        (&json!(1), &json!(0)),
        "{done}"
    );
    let attempts: Vec<String> = replays(&receiver).into_iter().map(|r| r.2).collect();
    assert_eq!(attempts, ["3", "4"]);
}

#[tokio::test]
async fn a_job_keeps_half_the_slots_and_a_cancel_stops_it_queuing() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let app = gateway_app(&receiver.url, |s| s.max_in_flight = 4).await;
    let events: Vec<(String, String)> = (0..12)
        .map(|i| (format!("e{i:02}"), format!("run_{i}")))
        .collect();
    for (id, run) in &events {
        app.ingest_ok(&body(id, run, "2026-11-29T10:00:00Z")).await;
    }
    eventually("every event delivered", || async {
        app.event_ids("delivered").await.len() == 12
    })
    .await;
    receiver.set(Behaviour::Hold(None));
    let started = start_job(&app, "redeliver", json!({ "status": "delivered" })).await;
    let id = started["id"].as_str().unwrap().to_owned();
    // A window of 2 (half of 4): two replays held, no third.
    eventually("two replays held", || async { receiver.held() == 2 }).await;
    let j = job(&app, &id).await;
    assert_eq!((&j["matched"], &j["queued"]), (&json!(2), &json!(2)), "{j}");
    // The gauge the oldest-pending alert holds off on.
    assert_eq!(jobs_running(&app).await, 1.0);
    // Live traffic still has the other two slots.
    app.ingest_ok(&body("live", "run_live", "2026-11-29T10:00:00Z"))
        .await;
    eventually("the live event in flight too", || async {
        receiver.held() == 3
    })
    .await;

    let res = app
        .request(Method::POST, &format!("/v1/jobs/{id}/cancel"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::ACCEPTED);
    receiver.release();
    let done = finished(&app, &id).await;
    assert_eq!(done["state"], "cancelled", "{done}");
    assert_eq!(
        (&done["matched"], &done["delivered"], &done["cancelled"]),
        (&json!(2), &json!(2), &json!(true)),
        "{done}"
    );
    assert_eq!(replays(&receiver).len(), 2);
    assert_eq!(jobs_running(&app).await, 0.0);
}

/// `dedupd_jobs_running{source="sume"}` as a scrape reads it.
async fn jobs_running(app: &TestApp) -> f64 {
    let text = app
        .request(Method::GET, "/metrics")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("dedupd_jobs_running{source=\"sume\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no dedupd_jobs_running for sume in:\n{text}"))
}

#[tokio::test]
async fn a_job_resumes_after_a_restart_and_sends_each_event_once() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let app = gateway_app(&receiver.url, |s| {
        s.max_in_flight = 2;
        s.max_attempts = 50;
    })
    .await;
    let events: Vec<(String, String)> = (0..6)
        .map(|i| (format!("e{i}"), format!("run_{i}")))
        .collect();
    for (id, run) in &events {
        app.ingest_ok(&body(id, run, "2026-11-29T10:00:00Z")).await;
    }
    eventually("every event delivered", || async {
        app.event_ids("delivered").await.len() == 6
    })
    .await;
    // The destination fails: the job's one replay in flight keeps failing.
    receiver.set(Behaviour::Always(503));
    let started = start_job(&app, "redeliver", json!({ "status": "delivered" })).await;
    let id = started["id"].as_str().unwrap().to_owned();
    eventually("a replay tried", || async {
        !replays(&receiver).is_empty()
    })
    .await;
    let (loaded, dir, clock) = app.stop().await;
    receiver.set(Behaviour::Accept);
    let app = start_again(loaded, dir, clock).await;
    app.retrying_until("the job to finish", || async {
        job(&app, &id).await["state"] != "running"
    })
    .await;
    let done = job(&app, &id).await;
    assert_eq!(
        (&done["state"], &done["matched"], &done["delivered"]),
        (&json!("done"), &json!(6), &json!(6)),
        "{done}"
    );
    // Each event acknowledged once under the job.
    let mut acked: HashMap<String, usize> = HashMap::new();
    for r in receiver.received() {
        if r.header("dedupd-replay") == id {
            *acked.entry(r.header("webhook-id").to_owned()).or_default() += 1;
        }
    }
    assert_eq!(acked.len(), 6, "{acked:?}");
}

#[tokio::test]
async fn an_erased_event_keeps_its_record_and_its_id_stays_a_duplicate() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let app = gateway_app(&receiver.url, |_| {}).await;
    ingest_delivered(&app, &[("x1", "run_1", "2026-11-29T10:00:00Z")]).await;
    let res = app
        .request(Method::DELETE, "/v1/sources/sume/events/x1")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let v: Value = res.json().await.unwrap();
    assert_eq!(v["status"], "erased");
    let e: Value = app
        .request(Method::GET, "/v1/sources/sume/events/x1")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(e["status"], "erased", "{e}");
    assert_eq!(e["body"], "", "{e}");
    assert_eq!(e["headers"], json!([]), "{e}");
    assert_eq!(app.event_ids("erased").await, ["x1"]);
    assert!(app.event_ids("delivered").await.is_empty());
    // A late retry of it is a duplicate, and not delivered again.
    let again = app
        .ingest_ok(&body("x1", "run_1", "2026-11-29T10:00:00Z"))
        .await;
    assert_eq!(again["status"], "duplicate", "{again}");
    // Erasing again answers the same; an unknown id is a 404.
    let res = app
        .request(Method::DELETE, "/v1/sources/sume/events/x1")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let res = app
        .request(Method::DELETE, "/v1/sources/sume/events/nope")
        .send()
        .await
        .unwrap();
    assert_problem(res, StatusCode::NOT_FOUND, "unknown_event").await;
    // An erased event is not redeliverable.
    let res = app
        .request(Method::POST, "/v1/sources/sume/events/x1/redeliver")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CONFLICT);
}

#[tokio::test]
async fn an_erased_pending_event_is_never_delivered_and_its_stream_moves_on() {
    let receiver = Receiver::start(Behaviour::Hold(None)).await;
    let app = gateway_app(&receiver.url, |_| {}).await;
    app.ingest_ok(&body("p1", "run_1", "2026-11-29T10:00:01Z"))
        .await;
    eventually("p1 in flight", || async { receiver.held() == 1 }).await;
    app.ingest_ok(&body("p2", "run_1", "2026-11-29T10:00:02Z"))
        .await;
    app.ingest_ok(&body("p3", "run_1", "2026-11-29T10:00:03Z"))
        .await;
    // p2 waits behind p1: erased, it never goes out.
    let res = app
        .request(Method::DELETE, "/v1/sources/sume/events/p2")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    receiver.release();
    eventually("p1 and p3 delivered", || async {
        app.event_ids("delivered").await.len() == 2
    })
    .await;
    let sent: Vec<String> = receiver
        .received()
        .iter()
        .map(|r| r.header("webhook-id").to_owned())
        .collect();
    assert!(!sent.contains(&"p2".to_owned()), "{sent:?}");
    assert_eq!(app.event_ids("erased").await, ["p2"]);
}

#[tokio::test]
async fn an_erase_job_erases_what_its_filter_matches_and_nothing_else() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let app = gateway_app(&receiver.url, |_| {}).await;
    ingest_delivered(
        &app,
        &[
            ("k1", "run_1", "2026-11-29T10:00:01Z"),
            ("k2", "run_2", "2026-11-29T10:00:01Z"),
            ("k3", "run_1", "2026-11-29T10:00:02Z"),
        ],
    )
    .await;
    let started = start_job(
        &app,
        "erase",
        json!({ "status": "delivered", "field": "/run_id", "value": "run_1" }),
    )
    .await;
    let id = started["id"].as_str().unwrap().to_owned();
    let done = finished(&app, &id).await;
    assert_eq!(
        (&done["state"], &done["matched"], &done["erased"]),
        (&json!("done"), &json!(2), &json!(2)),
        "{done}"
    );
    // While it runs, the filter comes back as it was posted.
    assert_eq!(
        started["filter"],
        json!({ "status": "delivered", "field": "/run_id", "value": "run_1" }),
        "{started}"
    );
    // Once it ended, its shape without its values: an erasure's filter
    // names the person erased, and any read-only token reads jobs.
    assert_eq!(
        done["filter"],
        json!({ "status": "delivered", "field": "/run_id", "value": "(dropped when the job ended)" }),
        "{done}"
    );
    assert_eq!(app.event_ids("erased").await, ["k1", "k3"]);
    assert_eq!(app.event_ids("delivered").await, ["k2"]);
    // Listed by /v1/jobs, newest first, without the values.
    let list: Value = app
        .request(Method::GET, "/v1/jobs")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["jobs"][0]["id"], id.as_str(), "{list}");
    assert!(!list.to_string().contains("run_1"), "{list}");
}

#[tokio::test]
async fn a_job_that_cannot_be_is_refused_with_a_clear_error() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let app = gateway_app(&receiver.url, |_| {}).await;
    let post = |body: Value| {
        let app = &app;
        async move {
            app.request(Method::POST, "/v1/sources/sume/jobs")
                .json(&body)
                .send()
                .await
                .unwrap()
        }
    };
    let res = post(json!({ "kind": "redeliver", "filter": { "status": "pending" } })).await;
    assert_problem(res, StatusCode::BAD_REQUEST, "invalid_status").await;
    let res = post(json!({ "kind": "erase", "filter": { "status": "erased" } })).await;
    assert_problem(res, StatusCode::BAD_REQUEST, "invalid_status").await;
    let res = post(json!({ "kind": "replay", "filter": { "status": "dead" } })).await;
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    let res =
        post(json!({ "kind": "erase", "filter": { "status": "dead", "field": "type" } })).await;
    assert_problem(res, StatusCode::BAD_REQUEST, "invalid_field").await;
    let long = "x".repeat(1025);
    let res =
        post(json!({ "kind": "erase", "filter": { "status": "dead", "stream": long } })).await;
    assert_problem(res, StatusCode::BAD_REQUEST, "too_long").await;
    let res = app
        .request(Method::POST, "/v1/sources/nope/jobs")
        .json(&json!({ "kind": "erase", "filter": { "status": "dead" } }))
        .send()
        .await
        .unwrap();
    assert_problem(res, StatusCode::NOT_FOUND, "unknown_source").await;
    let res = app
        .request(Method::GET, "/v1/jobs/job_0000000000000000")
        .send()
        .await
        .unwrap();
    assert_problem(res, StatusCode::NOT_FOUND, "unknown_job").await;
    let res = app
        .request(Method::POST, "/v1/jobs/job_0000000000000000/cancel")
        .send()
        .await
        .unwrap();
    assert_problem(res, StatusCode::NOT_FOUND, "unknown_job").await;
}

#[tokio::test]
async fn a_job_takes_only_what_was_there_when_it_started() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let app = gateway_app(&receiver.url, |s| s.max_in_flight = 2).await;
    ingest_delivered(
        &app,
        &[
            ("old1", "run_1", "2026-11-29T10:00:01Z"),
            ("old2", "run_1", "2026-11-29T10:00:02Z"),
        ],
    )
    .await;
    // The job's first replay hangs: it is still running when a live event
    // is received and delivered.
    receiver.set(Behaviour::Hold(Some("run_1")));
    let started = start_job(&app, "redeliver", json!({ "status": "delivered" })).await;
    let id = started["id"].as_str().unwrap().to_owned();
    eventually("a replay held", || async { receiver.held() == 1 }).await;
    app.clock.advance(std::time::Duration::from_secs(1));
    app.ingest_ok(&body("live", "run_2", "2026-11-29T10:00:03Z"))
        .await;
    eventually("the live event delivered", || async {
        app.event_ids("delivered")
            .await
            .contains(&"live".to_owned())
    })
    .await;
    receiver.release();
    let done = finished(&app, &id).await;
    assert_eq!(
        (&done["matched"], &done["delivered"]),
        (&json!(2), &json!(2)),
        "{done}"
    );
    let replayed: Vec<String> = replays(&receiver).into_iter().map(|r| r.0).collect();
    assert_eq!(replayed, ["old1", "old2"]);
}

#[tokio::test]
async fn jobs_started_all_at_once_still_run_at_most_eight() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let app = gateway_app(&receiver.url, |s| s.max_in_flight = 2).await;
    let events: Vec<(String, String)> = (0..12)
        .map(|i| (format!("m{i:02}"), format!("run_{i}")))
        .collect();
    for (id, run) in &events {
        app.ingest_ok(&body(id, run, "2026-11-29T10:00:00Z")).await;
    }
    eventually("every event delivered", || async {
        app.event_ids("delivered").await.len() == 12
    })
    .await;
    // Held: each job's one replay (a window of one) never settles, so
    // every job started stays running.
    receiver.set(Behaviour::Hold(None));
    let posts = (0..12).map(|_| {
        app.request(Method::POST, "/v1/sources/sume/jobs")
            .json(&json!({ "kind": "redeliver", "filter": { "status": "delivered" } }))
            .send()
    });
    let answers = futures_util::future::join_all(posts).await;
    let statuses: Vec<u16> = answers
        .into_iter()
        .map(|r| r.unwrap().status().as_u16())
        .collect();
    let started = statuses.iter().filter(|s| **s == 201).count();
    let refused = statuses.iter().filter(|s| **s == 409).count();
    assert_eq!((started, refused), (8, 4), "{statuses:?}");
    let list: Value = app
        .request(Method::GET, "/v1/jobs")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let running = list["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|j| j["state"] == "running")
        .count();
    assert!(running <= 8, "{list}");
    receiver.release();
}

#[tokio::test]
async fn a_receive_time_past_year_9999_is_refused_and_starts_nothing() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let app = gateway_app(&receiver.url, |_| {}).await;
    // 10000-01-01T00:00:00Z: no RFC 3339 time, nor the console's Date,
    // can show it (a job listing it broke the console's jobs page).
    let far: u64 = 253_402_300_800_000;
    for filter in [
        json!({ "status": "dead", "received_from": far }),
        json!({ "status": "dead", "received_to": u64::MAX }),
    ] {
        let res = app
            .request(Method::POST, "/v1/sources/sume/jobs")
            .json(&json!({ "kind": "erase", "filter": filter }))
            .send()
            .await
            .unwrap();
        assert_problem(res, StatusCode::BAD_REQUEST, "invalid_time").await;
    }
    let res = app
        .request(
            Method::GET,
            &format!("/v1/sources/sume/count?status=dead&received_to={far}"),
        )
        .send()
        .await
        .unwrap();
    assert_problem(res, StatusCode::BAD_REQUEST, "invalid_time").await;
    let list: Value = app
        .request(Method::GET, "/v1/jobs")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["jobs"], json!([]), "{list}");
    // The last millisecond of 9999 is a time like any other.
    let res = app
        .request(
            Method::GET,
            &format!("/v1/sources/sume/count?status=dead&received_to={}", far - 1),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
}

#[tokio::test]
async fn two_jobs_on_one_source_still_leave_live_events_half_its_slots() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let app = gateway_app(&receiver.url, |s| s.max_in_flight = 4).await;
    let events: Vec<(String, String)> = (0..8)
        .map(|i| (format!("e{i}"), format!("run_{i}")))
        .collect();
    for (id, run) in &events {
        app.ingest_ok(&body(id, run, "2026-11-29T10:00:00Z")).await;
    }
    eventually("every event delivered", || async {
        app.event_ids("delivered").await.len() == 8
    })
    .await;
    receiver.set(Behaviour::Hold(None));
    let first = start_job(&app, "redeliver", json!({ "status": "delivered" })).await;
    eventually("two replays held", || async { receiver.held() == 2 }).await;
    let second = start_job(&app, "redeliver", json!({ "status": "delivered" })).await;
    // Live traffic still has two of the four slots: the two jobs share
    // their half.
    app.ingest_ok(&body("live1", "run_live1", "2026-11-29T10:00:00Z"))
        .await;
    app.ingest_ok(&body("live2", "run_live2", "2026-11-29T10:00:00Z"))
        .await;
    eventually("both live events in flight", || async {
        let held = receiver.received();
        ["live1", "live2"]
            .iter()
            .all(|id| held.iter().any(|r| r.header("webhook-id") == *id))
    })
    .await;
    assert_eq!(receiver.held(), 4);
    let mut queued = 0;
    for j in [&first, &second] {
        queued += job(&app, j["id"].as_str().unwrap()).await["queued"]
            .as_u64()
            .unwrap();
    }
    assert_eq!(queued, 2, "the jobs' windows together are half the slots");
    receiver.release();
    for j in [&first, &second] {
        let done = finished(&app, j["id"].as_str().unwrap()).await;
        assert_eq!(done["state"], "done", "{done}");
    }
}

/// At `storage.max_key_memory_bytes`, clients' new claims are refused, but
/// a redeliver job's own hold (a claim in the gateway's namespace) is not:
/// the operator's recovery tools work when the cap is reached.
#[tokio::test]
async fn a_redeliver_job_runs_while_clients_keys_are_at_the_memory_cap() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let source = crate::support::gateway::settings(&receiver.url);
    let app = crate::support::app::spawn_app_with(move |l| {
        l.settings.sources.insert("sume".into(), source);
        l.settings.storage.max_key_memory_bytes = 1024;
    })
    .await;
    ingest_delivered(&app, &[("a1", "run_1", "2026-11-29T10:00:01Z")]).await;
    let mut taken = 0;
    loop {
        let res = app
            .claim(&format!("k{taken}"), json!({ "ttl_ms": 60_000 }))
            .await;
        if res.status() != StatusCode::CREATED {
            assert_problem(res, StatusCode::INSUFFICIENT_STORAGE, "keys_in_memory_full").await;
            break;
        }
        taken += 1;
        assert!(taken < 20, "a cap of 1024 bytes took 20 claims");
    }
    let started = start_job(&app, "redeliver", json!({ "status": "delivered" })).await;
    let done = finished(&app, started["id"].as_str().unwrap()).await;
    assert_eq!(done["state"], "done", "{done}");
    assert_eq!(done["delivered"], 1, "{done}");
    assert_eq!(replays(&receiver).len(), 1);
}
