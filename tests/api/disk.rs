//! A data disk that fills up and frees again, with the real app: 503 with
//! `Retry-After` and nothing changed, `/readyz` failing meanwhile, and
//! recovery without a restart.

use dedupd::store::redb::faults::FaultPlan;
use reqwest::StatusCode;
use serde_json::json;

use crate::gateway::{body, ids, settings};
use crate::helpers::{TestApp, assert_problem, spawn_faulty_app_with};
use crate::receiver::{Behaviour, Receiver, eventually};
use crate::resp::{Raw, resp_addr, with_resp};

async fn ready(app: &TestApp) -> StatusCode {
    app.client
        .get(app.url("/readyz"))
        .send()
        .await
        .unwrap()
        .status()
}

#[tokio::test]
async fn a_full_disk_answers_503_with_retry_after_and_readyz_fails_until_it_frees() {
    let plan = FaultPlan::new();
    let app = spawn_faulty_app_with(|_| {}, plan.clone()).await;
    app.claim_ok("before", json!({ "ttl_ms": 86_400_000 }))
        .await;

    plan.set_full(true);
    let res = app.claim("during", json!({})).await;
    assert_eq!(
        res.headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap()),
        Some("1")
    );
    assert_problem(res, StatusCode::SERVICE_UNAVAILABLE, "store_unavailable").await;
    assert_eq!(ready(&app).await, StatusCode::SERVICE_UNAVAILABLE);

    plan.set_full(false);
    eventually("ready again without a restart", || async {
        ready(&app).await == StatusCode::OK
    })
    .await;
    // The refused claim changed nothing; the acknowledged one is there.
    assert_eq!(app.get("during").await.status(), StatusCode::NOT_FOUND);
    app.claim_ok("during", json!({})).await;
    let app = app.restart().await;
    assert_eq!(app.get("before").await.status(), StatusCode::OK);
    assert_eq!(app.get("during").await.status(), StatusCode::OK);
}

/// What a refused write tells each client: HTTP says only "retry later"
/// (the cause is logged), a Redis client reads the cause, in the words of
/// the releases before.
#[tokio::test]
async fn a_full_disk_refuses_http_without_its_cause_and_resp_with_it() {
    let plan = FaultPlan::new();
    let app = spawn_faulty_app_with(with_resp, plan.clone()).await;
    let mut c = Raw::connect(&resp_addr(&app)).await;
    assert_eq!(c.cmd("SET before v").await, b"+OK\r\n");

    plan.set_full(true);
    let res = app.claim("during", json!({})).await;
    let problem = assert_problem(res, StatusCode::SERVICE_UNAVAILABLE, "store_unavailable").await;
    assert_eq!(
        problem["detail"],
        "the store cannot be reached; retry later"
    );
    assert_eq!(
        crate::resp::show(&c.cmd("SET during v").await),
        "-ERR store unavailable: the data file cannot be written now (disk full or failing); \
         nothing was changed\\r\\n"
    );
}

#[tokio::test]
async fn a_delivery_acknowledged_while_the_disk_is_full_is_recorded_once_it_frees() {
    let plan = FaultPlan::new();
    let receiver = Receiver::start(Behaviour::Hold(None)).await;
    let s = settings(&receiver.url);
    let app = spawn_faulty_app_with(
        move |l| {
            l.settings.sources.insert("sume".into(), s);
        },
        plan.clone(),
    )
    .await;
    app.ingest_ok(&body("e1", "run_1", "2026-11-29T10:00:00Z"))
        .await;
    eventually("e1 is out", || async { receiver.held() == 1 }).await;

    // The disk fills while the application answers: the delivery cannot be
    // recorded, and new webhooks are refused with 503 (providers retry).
    plan.set_full(true);
    receiver.release();
    eventually("e1 answered", || async { receiver.held() == 0 }).await;
    let res = app
        .ingest(&body("e2", "run_1", "2026-11-29T10:05:00Z"))
        .await;
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(ready(&app).await, StatusCode::SERVICE_UNAVAILABLE);

    plan.set_full(false);
    eventually("e1 recorded as delivered", || async {
        ready(&app).await == StatusCode::OK && app.event_ids("delivered").await == ["e1"]
    })
    .await;
    app.ingest_ok(&body("e2", "run_1", "2026-11-29T10:05:00Z"))
        .await;
    app.retrying_until("e2 delivered", || async {
        app.event_ids("delivered").await.len() == 2
    })
    .await;
    assert_eq!(ids(&receiver.received()), ["e1", "e2"], "each sent once");
}
