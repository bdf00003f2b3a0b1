//! What survives a restart.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::spawn_app;

#[tokio::test]
async fn claims_and_done_records_survive_a_restart() {
    let app = spawn_app().await;
    let (token, fence, expires) = app.claim_ok("held", json!({})).await;
    let (t2, _, _) = app.claim_ok("finished", json!({})).await;
    assert_eq!(
        app.done("finished", json!({ "token": t2 })).await.status(),
        StatusCode::OK
    );

    let app = app.restart().await;

    let v: Value = app.get("held").await.json().await.unwrap();
    assert_eq!(
        v,
        json!({ "key": "held", "state": "processing", "fence": fence, "expires_at_ms": expires })
    );
    let v: Value = app.get("finished").await.json().await.unwrap();
    assert_eq!(v["state"], "done");
    // The token still owns the claim after the restart.
    assert_eq!(
        app.done("held", json!({ "token": token })).await.status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn fences_strictly_increase_across_restarts() {
    let mut app = spawn_app().await;
    let mut last = 0;
    for round in 0..3 {
        for i in 0..5 {
            let (_, fence, _) = app.claim_ok(&format!("r{round}-{i}"), json!({})).await;
            assert!(fence > last, "fence {fence} after {last}");
            last = fence;
        }
        app = app.restart().await;
    }
    // Expired claims do not reset the counter either.
    app.clock.advance(Duration::from_secs(3600));
    let (_, fence, _) = app.claim_ok("r0-0", json!({})).await;
    assert!(fence > last);
}
