//! Ordering through `/v1/streams`: applied, stale and duplicate events, and stream heads.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;
use serde_json::json;

use crate::support::app::assert_problem;
use crate::support::app::spawn_app;
use crate::support::app::spawn_app_with;
const A: &str = "2026-11-29T10:00:00Z";
const B: &str = "2026-11-29T10:05:00Z";

#[tokio::test]
async fn events_arriving_b_a_b_give_applied_stale_duplicate() {
    let app = spawn_app().await;
    let v = app.apply_ok("run-1", "B", B).await;
    assert_eq!(v["outcome"], "applied");
    assert_eq!(v["head"], json!({ "event_id": "B", "created_at": B }));
    let v = app.apply_ok("run-1", "A", A).await;
    assert_eq!(v["outcome"], "stale");
    assert_eq!(v["head"]["event_id"], "B", "a stale event leaves the head");
    let v = app.apply_ok("run-1", "B", B).await;
    assert_eq!(v["outcome"], "duplicate");
    let v = app.apply_ok("run-1", "A", A).await;
    assert_eq!(v["outcome"], "duplicate", "a stale event is recorded too");

    let v: Value = app.head("run-1").await.json().await.unwrap();
    assert_eq!(
        v,
        json!({ "stream": "run-1", "head": { "event_id": "B", "created_at": B } })
    );
}

#[tokio::test]
async fn an_event_with_the_heads_timestamp_is_applied() {
    let app = spawn_app().await;
    app.apply_ok("s", "e1", A).await;
    let v = app.apply_ok("s", "e2", A).await;
    assert_eq!(v["outcome"], "applied");
    assert_eq!(v["head"]["event_id"], "e2");
}

#[tokio::test]
async fn timestamps_are_compared_as_instants_across_offsets() {
    let app = spawn_app().await;
    app.apply_ok("s", "utc", "2026-11-29T10:00:00Z").await;
    // The same instant in +01:00 is not older: applied.
    let v = app
        .apply_ok("s", "paris", "2026-11-29T11:00:00+01:00")
        .await;
    assert_eq!(v["outcome"], "applied");
    assert_eq!(v["head"]["created_at"], "2026-11-29T10:00:00Z");
    // One nanosecond earlier, written in -05:00: stale.
    let v = app
        .apply_ok("s", "ny", "2026-11-29T04:59:59.999999999-05:00")
        .await;
    assert_eq!(v["outcome"], "stale");
    // Later by a millisecond in +09:00: applied.
    let v = app
        .apply_ok("s", "tokyo", "2026-11-29T19:00:00.001+09:00")
        .await;
    assert_eq!(v["outcome"], "applied");
    assert_eq!(v["head"]["created_at"], "2026-11-29T10:00:00.001Z");
}

#[tokio::test]
async fn an_event_id_is_a_duplicate_whatever_its_timestamp_or_stream() {
    let app = spawn_app().await;
    app.apply_ok("s", "e1", A).await;
    assert_eq!(app.apply_ok("s", "e1", B).await["outcome"], "duplicate");
    assert_eq!(app.apply_ok("other", "e1", B).await["outcome"], "duplicate");
    assert_eq!(app.head("other").await.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn streams_are_independent() {
    let app = spawn_app().await;
    app.apply_ok("s1", "x", B).await;
    assert_eq!(app.apply_ok("s2", "y", A).await["outcome"], "applied");
}

#[tokio::test]
async fn the_head_of_an_unknown_stream_is_404() {
    let app = spawn_app().await;
    assert_problem(app.head("nope").await, StatusCode::NOT_FOUND, "not_found").await;
}

#[tokio::test]
async fn a_created_at_that_is_not_rfc3339_with_an_offset_returns_400_saying_what_was_expected() {
    let app = spawn_app().await;
    for bad in [
        "2026-11-29T10:00:00",
        "2026-11-29",
        "1764410400",
        "",
        "10:00 yesterday",
    ] {
        let v = assert_problem(
            app.apply("s", "e", bad).await,
            StatusCode::BAD_REQUEST,
            "invalid_created_at",
        )
        .await;
        assert_eq!(v["field"], "created_at");
        assert!(v["detail"].as_str().unwrap().contains("RFC 3339"), "{v}");
    }
    assert_eq!(app.head("s").await.status(), StatusCode::NOT_FOUND);
    // Nothing was recorded: the event id is still new.
    assert_eq!(app.apply_ok("s", "e", A).await["outcome"], "applied");
}

#[tokio::test]
async fn stream_and_event_ids_are_validated_like_claim_keys() {
    let app = spawn_app().await;
    let long = "s".repeat(513);
    let v = assert_problem(
        app.apply(&long, "e", A).await,
        StatusCode::BAD_REQUEST,
        "invalid_key",
    )
    .await;
    assert_eq!(v["field"], "stream");
    let v = assert_problem(
        app.apply("s", "", A).await,
        StatusCode::BAD_REQUEST,
        "invalid_key",
    )
    .await;
    assert_eq!(v["field"], "event_id");
    let v = assert_problem(
        app.apply("s", "e\n1", A).await,
        StatusCode::BAD_REQUEST,
        "invalid_key",
    )
    .await;
    assert_eq!(v["field"], "event_id");
    let res = app
        .request(reqwest::Method::POST, "/v1/streams/s/apply")
        .json(&json!({ "event_id": "e" }))
        .send()
        .await
        .unwrap();
    let v = assert_problem(res, StatusCode::BAD_REQUEST, "malformed_body").await;
    assert!(v["detail"].as_str().unwrap().contains("created_at"), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_concurrent_applies_of_one_event_give_exactly_one_applied() {
    let app = spawn_app().await;
    let answers =
        futures_util::future::join_all((0..32).map(|_| app.apply_ok("s", "same", A))).await;
    let applied = answers.iter().filter(|v| v["outcome"] == "applied").count();
    let duplicate = answers
        .iter()
        .filter(|v| v["outcome"] == "duplicate")
        .count();
    assert_eq!((applied, duplicate), (1, 31));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_applies_of_different_events_leave_the_head_at_the_newest() {
    let app = spawn_app().await;
    let stamps: Vec<String> = (0..40)
        .map(|i| format!("2026-11-29T10:{:02}:00Z", (i * 17) % 60))
        .collect();
    let ids: Vec<String> = (0..stamps.len()).map(|i| format!("e{i}")).collect();
    futures_util::future::join_all(
        ids.iter()
            .zip(&stamps)
            .map(|(id, t)| app.apply_ok("s", id, t)),
    )
    .await;
    let newest = stamps.iter().max().unwrap();
    let v: Value = app.head("s").await.json().await.unwrap();
    assert_eq!(&v["head"]["created_at"], newest.as_str());
}

#[tokio::test]
async fn heads_and_applied_events_survive_a_restart() {
    let app = spawn_app().await;
    app.apply_ok("s", "B", B).await;
    let app = app.restart().await;
    let v: Value = app.head("s").await.json().await.unwrap();
    assert_eq!(v["head"]["event_id"], "B");
    assert_eq!(app.apply_ok("s", "B", B).await["outcome"], "duplicate");
    assert_eq!(app.apply_ok("s", "A", A).await["outcome"], "stale");
}

#[tokio::test]
async fn applied_events_and_heads_expire_after_the_retention() {
    let app = spawn_app_with(|l| l.settings.ordering.retention = Duration::from_secs(3600)).await;
    app.apply_ok("s", "B", B).await;
    app.clock.advance(Duration::from_secs(3599));
    assert_eq!(app.head("s").await.status(), StatusCode::OK);
    assert_eq!(app.apply_ok("s", "A", A).await["outcome"], "stale");
    app.clock.advance(Duration::from_secs(1));
    assert_eq!(app.head("s").await.status(), StatusCode::NOT_FOUND);
    // Past retention the id is forgotten and the stream starts afresh.
    assert_eq!(app.apply_ok("s", "B", B).await["outcome"], "applied");
    let report = dedupd::reaper::Reaper::new(
        app.store.clone(),
        std::sync::Arc::new(app.clock.clone()),
        Duration::from_secs(60),
        100,
    )
    .purge_once(dedupd::clock::Clock::now_ms(&app.clock) + 3_600_000)
    .await
    .unwrap();
    // One retention after the re-apply, A's record (stale, written 3599 s
    // after B's first apply) and the new B record and head are all due.
    assert_eq!((report.events, report.heads), (2, 1));
}
