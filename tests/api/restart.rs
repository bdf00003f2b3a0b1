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

/// A fresh checkout that holds a stray `dedupd.redb.wal` (one was once
/// committed to this repository): `serve` refuses to replay it into a new
/// data file, says what to do, and touches neither file.
#[tokio::test]
async fn serve_refuses_a_log_whose_data_file_is_missing_and_leaves_it() {
    use crate::cli::{dedupd, serve, stop};
    // A real log with claims in it: served, killed, its data file removed.
    let first = tempfile::TempDir::new().unwrap();
    let (child, port, drain) = serve(&first);
    let client = reqwest::Client::new();
    for k in ["one", "two"] {
        let res = client
            .post(format!("http://127.0.0.1:{port}/v1/claims/{k}"))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::CREATED);
    }
    let _ = stop(child, "-KILL", drain).await;
    let log = std::fs::read(first.path().join("dedupd.redb.wal")).unwrap();

    let fresh = tempfile::TempDir::new().unwrap();
    std::fs::write(fresh.path().join("dedupd.redb.wal"), &log).unwrap();
    let out = dedupd()
        .arg("serve")
        .current_dir(fresh.path())
        .env("DEDUPD_LISTEN", "127.0.0.1:0")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("dedupd.redb.wal exists but its data file dedupd.redb does not"),
        "{stderr}"
    );
    assert!(stderr.contains("move dedupd.redb.wal away"), "{stderr}");
    assert_eq!(
        std::fs::read(fresh.path().join("dedupd.redb.wal")).unwrap(),
        log,
        "the log is left as it was"
    );
    assert!(!fresh.path().join("dedupd.redb").exists());
}
