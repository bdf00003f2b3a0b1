//! Counts and bulk jobs over a source with destinations read every
//! destination's copies (each in a lane of its own) and count each event
//! once; a redeliver job names its destination; a count stops at its
//! budget and answers with a cursor to go on from; a received-time range
//! reads only that range. On the data file's inbox and on the shared inbox
//! in a real Redis.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::app::{TestApp, assert_problem, spawn_app_with};
use crate::support::gateway::{fan_out, invoice, post_with_customer};
use crate::support::receiver::{Behaviour, Receiver, eventually};

/// An app with the fan-out source `sw` (on the shared inbox in `redis`,
/// when given), every scan within `scan_bytes` of bodies.
async fn app(
    billing: &Receiver,
    audit: &Receiver,
    redis: Option<String>,
    scan_bytes: u64,
) -> TestApp {
    let s = fan_out(&billing.url, &audit.url);
    spawn_app_with(move |l| {
        if let Some(url) = redis {
            l.settings.storage.backend = dedupd::config::Backend::Redis;
            l.settings.storage.redis.url = dedupd::config::Secret::new(url);
            l.settings.gateway.inbox = dedupd::config::sources::InboxPlace::Shared;
            l.settings.gateway.inbox_buckets = 2;
        }
        l.settings.gateway.scan_bytes = scan_bytes;
        // The budget these tests mean is bytes: on a machine busy with
        // the whole suite, 250 ms could run out first and cut a count of
        // six rows short (complete: false).
        l.settings.gateway.scan_time = dedupd::config::sources::MAX_SCAN_TIME;
        l.settings.sources.insert("sw".into(), s);
    })
    .await
}

async fn get(app: &TestApp, path: &str) -> (StatusCode, Value) {
    let res = app.request(Method::GET, path).send().await.unwrap();
    (res.status(), res.json().await.unwrap())
}

async fn post_job(app: &TestApp, source: &str, body: Value) -> reqwest::Response {
    app.request(Method::POST, &format!("/v1/sources/{source}/jobs"))
        .json(&body)
        .send()
        .await
        .unwrap()
}

async fn finished(app: &TestApp, id: &str) -> Value {
    let path = format!("/v1/jobs/{id}");
    eventually("the job to finish", || async {
        get(app, &path).await.1["state"] != "running"
    })
    .await;
    get(app, &path).await.1
}

/// alice's two invoices and bob's one, each delivered to both.
async fn three_invoices(app: &TestApp, billing: &Receiver, audit: &Receiver) {
    post_with_customer(app, &invoice("inv-1", "alice@example.com"), "c1").await;
    post_with_customer(app, &invoice("inv-2", "bob@example.com"), "c2").await;
    post_with_customer(app, &invoice("inv-3", "alice@example.com"), "c1").await;
    all_delivered(app, billing, audit).await;
}

/// Waits until the three events posted are delivered to both receivers
/// and dedupd has recorded it.
async fn all_delivered(app: &TestApp, billing: &Receiver, audit: &Receiver) {
    eventually("each delivered to both", || async {
        billing.received().len() == 3 && audit.received().len() == 3
    })
    .await;
    // A receiver has its copy before dedupd records the answer: wait for
    // the six records too, or a count may find a copy still pending.
    eventually("each delivery recorded", || async {
        let (_, all) = get(app, "/v1/sources/sw/count?status=delivered").await;
        all["matched"] == 3 && all["scanned"] == 6
    })
    .await;
}

#[tokio::test]
async fn a_count_and_an_erase_job_on_a_source_with_destinations_cover_every_lane() {
    fan_out_erasure(None).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_shared_inbox_a_count_and_an_erase_job_cover_every_lane() {
    let server = tokio::task::spawn_blocking(crate::support::redis::RedisServer::start)
        .await
        .unwrap();
    fan_out_erasure(Some(server.url())).await;
}

async fn fan_out_erasure(redis: Option<String>) {
    let billing = Receiver::start(Behaviour::Accept).await;
    let audit = Receiver::start(Behaviour::Accept).await;
    let app = app(&billing, &audit, redis, 16 * 1024 * 1024).await;
    three_invoices(&app, &billing, &audit).await;
    let alice = json!({ "status": "delivered", "field": "/email", "value": "alice@example.com" });

    // Each event once, though two lanes hold it.
    let (status, count) = get(
        &app,
        "/v1/sources/sw/count?status=delivered&field=/email&value=alice@example.com",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{count}");
    assert_eq!(
        (&count["matched"], &count["complete"], &count["first_ids"]),
        (&json!(2), &json!(true), &json!(["inv-1", "inv-3"])),
        "{count}"
    );
    assert_eq!(count["scanned"], 6, "both lanes read: {count}");
    // One destination's copies alone.
    let (_, one) = get(
        &app,
        "/v1/sources/sw/count?status=delivered&destination=audit&field=/email&value=alice@example.com",
    )
    .await;
    assert_eq!(
        (&one["matched"], &one["scanned"]),
        (&json!(2), &json!(3)),
        "{one}"
    );
    let res = get(
        &app,
        "/v1/sources/sw/count?status=delivered&destination=nope",
    )
    .await;
    assert_eq!(res.0, StatusCode::NOT_FOUND, "{}", res.1);
    assert_eq!(res.1["code"], "unknown_destination");

    // The dry run says the same; the job erases both copies of each.
    let dry = post_job(
        &app,
        "sw",
        json!({ "kind": "erase", "filter": alice, "dry_run": true }),
    )
    .await;
    let dry: Value = dry.json().await.unwrap();
    assert_eq!(dry["matched"], 2, "{dry}");
    let started = post_job(&app, "sw", json!({ "kind": "erase", "filter": alice })).await;
    assert_eq!(started.status(), StatusCode::CREATED);
    let started: Value = started.json().await.unwrap();
    assert_eq!(started["lanes"], json!(["sw", "sw.billing", "sw.audit"]));
    let done = finished(&app, started["id"].as_str().unwrap()).await;
    assert_eq!(
        (&done["state"], &done["matched"], &done["erased"]),
        (&json!("done"), &json!(2), &json!(2)),
        "{done}"
    );
    for lane in ["sw.billing", "sw.audit"] {
        for (id, status) in [
            ("inv-1", "erased"),
            ("inv-2", "delivered"),
            ("inv-3", "erased"),
        ] {
            let (_, e) = get(&app, &format!("/v1/sources/{lane}/events/{id}")).await;
            assert_eq!(e["status"], status, "{lane}/{id}: {e}");
            let body = e["body"].as_str().unwrap_or_default();
            assert!(!body.contains("alice"), "{lane}/{id}: {e}");
        }
    }
    // Nothing of alice's is left to count.
    let (_, after) = get(
        &app,
        "/v1/sources/sw/count?status=delivered&field=/email&value=alice@example.com",
    )
    .await;
    assert_eq!(after["matched"], 0, "{after}");
}

#[tokio::test]
async fn a_redeliver_job_on_a_source_with_destinations_names_its_destination() {
    let billing = Receiver::start(Behaviour::Accept).await;
    let audit = Receiver::start(Behaviour::Accept).await;
    let app = app(&billing, &audit, None, 16 * 1024 * 1024).await;
    three_invoices(&app, &billing, &audit).await;
    let all = json!({ "status": "delivered" });
    // Which destination would it go to? Refused, and the answer says how.
    let res = post_job(&app, "sw", json!({ "kind": "redeliver", "filter": all })).await;
    let v = assert_problem(res, StatusCode::CONFLICT, "delivers_through_destinations").await;
    assert!(
        v["detail"].as_str().unwrap().contains("`destination`"),
        "{v}"
    );
    let res = post_job(
        &app,
        "sw",
        json!({ "kind": "redeliver", "filter": { "status": "delivered", "destination": "nope" } }),
    )
    .await;
    assert_problem(res, StatusCode::NOT_FOUND, "unknown_destination").await;
    // Named, it replays that destination's copies only.
    let res = post_job(
        &app,
        "sw",
        json!({ "kind": "redeliver", "filter": { "status": "delivered", "destination": "audit" } }),
    )
    .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let started: Value = res.json().await.unwrap();
    assert_eq!(
        (&started["source"], &started["lanes"]),
        (&json!("sw.audit"), &json!(["sw.audit"])),
        "{started}"
    );
    let done = finished(&app, started["id"].as_str().unwrap()).await;
    assert_eq!(
        (&done["matched"], &done["delivered"]),
        (&json!(3), &json!(3)),
        "{done}"
    );
    assert_eq!(audit.received().len(), 6);
    assert_eq!(billing.received().len(), 3);
}

#[tokio::test]
async fn a_count_stops_at_its_budget_and_goes_on_from_its_cursor() {
    budgeted_count(None).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_shared_inbox_a_count_stops_at_its_budget_and_goes_on_from_its_cursor() {
    let server = tokio::task::spawn_blocking(crate::support::redis::RedisServer::start)
        .await
        .unwrap();
    budgeted_count(Some(server.url())).await;
}

async fn budgeted_count(redis: Option<String>) {
    let billing = Receiver::start(Behaviour::Accept).await;
    let audit = Receiver::start(Behaviour::Accept).await;
    // One body parsed per count at most: each is over 100 bytes.
    let app = app(&billing, &audit, redis, 100).await;
    three_invoices(&app, &billing, &audit).await;
    let filter = "status=delivered&field=/email&value=alice@example.com";
    let mut path = format!("/v1/sources/sw/count?{filter}");
    let (mut matched, mut answers, mut ids) = (0, 0, Vec::new());
    loop {
        let (status, v) = get(&app, &path).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        answers += 1;
        matched += v["matched"].as_u64().unwrap();
        ids.extend(v["first_ids"].as_array().unwrap().iter().cloned());
        assert!(
            v["matched"].as_u64().unwrap() <= 1,
            "one body per answer: {v}"
        );
        match v["next"].as_str() {
            Some(next) => {
                assert_eq!(v["complete"], false, "{v}");
                path = format!("/v1/sources/sw/count?{filter}&after={next}");
            }
            None => {
                assert_eq!(v["complete"], true, "{v}");
                break;
            }
        }
        assert!(answers < 20, "the cursor must move on");
    }
    assert_eq!((matched, ids), (2, vec![json!("inv-1"), json!("inv-3")]));
    assert!(answers >= 3, "{answers} answers for 6 bodies");
    // A cursor of another count is refused.
    let (status, v) = get(&app, &format!("/v1/sources/sw/count?{filter}&after=bm9wZQ")).await;
    assert_eq!(
        (status, &v["code"]),
        (StatusCode::BAD_REQUEST, &json!("invalid_cursor"))
    );
    // A job does not take a cursor.
    let res = post_job(
        &app,
        "sw",
        json!({ "kind": "erase", "filter": { "status": "delivered", "after": "x" } }),
    )
    .await;
    assert_problem(res, StatusCode::BAD_REQUEST, "invalid_filter").await;
}

#[tokio::test]
async fn a_received_range_reads_only_that_range() {
    let billing = Receiver::start(Behaviour::Accept).await;
    let audit = Receiver::start(Behaviour::Accept).await;
    let app = app(&billing, &audit, None, 16 * 1024 * 1024).await;
    post_with_customer(&app, &invoice("old-1", "a@example.com"), "c").await;
    post_with_customer(&app, &invoice("old-2", "a@example.com"), "c").await;
    app.clock.advance(std::time::Duration::from_secs(60));
    let from = dedupd::clock::Clock::now_ms(&app.clock);
    post_with_customer(&app, &invoice("new-1", "a@example.com"), "c").await;
    all_delivered(&app, &billing, &audit).await;
    let (_, v) = get(
        &app,
        &format!("/v1/sources/sw/count?status=delivered&destination=audit&received_from={from}"),
    )
    .await;
    // The two before were never read.
    assert_eq!(
        (&v["matched"], &v["scanned"]),
        (&json!(1), &json!(1)),
        "{v}"
    );
}
