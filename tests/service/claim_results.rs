//! A done keeps the work's result (issue 53): returned by a read of the key
//! and in the `409 done` a later claim gets, exactly as sent, within
//! `claims.max_result_bytes`.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::app::{T0, assert_problem, spawn_app, spawn_app_with};

/// A result as sent, byte for byte: key order, a number no float holds,
/// unicode and escapes.
const RESULT: &str = r#"{"z": 1, "a": [1.50, 123456789012345678901234567890], "s": "é\n\"x\""}"#;

async fn done_raw(
    app: &crate::support::app::TestApp,
    key: &str,
    body: String,
) -> reqwest::Response {
    app.request(reqwest::Method::POST, &format!("/v1/claims/{key}/done"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_later_claim_and_a_read_get_the_result_as_it_was_sent() {
    let app = spawn_app().await;
    let (token, fence, _) = app.claim_ok("k", json!({})).await;
    let res = done_raw(
        &app,
        "k",
        format!(r#"{{"token": "{token}", "ttl_ms": 60000, "result": {RESULT}}}"#),
    )
    .await;
    assert_eq!(res.status(), StatusCode::OK);
    let v: Value = res.json().await.unwrap();
    assert_eq!(v["state"], "done");
    assert!(v.get("result").is_none(), "done's own answer is unchanged");

    let res = app.get("k").await;
    assert_eq!(res.status(), StatusCode::OK);
    let text = res.text().await.unwrap();
    assert!(text.contains(&format!(r#""result":{RESULT}"#)), "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["fence"], fence);

    let res = app.claim("k", json!({})).await;
    assert_eq!(res.status(), StatusCode::CONFLICT);
    let text = res.text().await.unwrap();
    assert!(text.contains(&format!(r#""result":{RESULT}"#)), "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!((&v["code"], &v["state"]), (&json!("done"), &json!("done")));
    assert_eq!(v["expires_at_ms"], T0 + 60_000);
}

#[tokio::test]
async fn a_repeated_done_keeps_the_first_result_and_null_is_no_result() {
    let app = spawn_app().await;
    let (token, _, _) = app.claim_ok("k", json!({})).await;
    let res = app
        .done("k", json!({ "token": token, "result": { "n": 1 } }))
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    let res = app
        .done("k", json!({ "token": token, "result": { "n": 2 } }))
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    let v: Value = app.get("k").await.json().await.unwrap();
    assert_eq!(v["result"], json!({ "n": 1 }));

    let (token, _, _) = app.claim_ok("null", json!({})).await;
    let res = app
        .done("null", json!({ "token": token, "result": null }))
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    let v: Value = app.get("null").await.json().await.unwrap();
    assert!(v.get("result").is_none(), "{v}");
    let v = assert_problem(
        app.claim("null", json!({})).await,
        StatusCode::CONFLICT,
        "done",
    )
    .await;
    assert!(v.get("result").is_none(), "{v}");
}

#[tokio::test]
async fn a_result_at_the_cap_is_kept_even_with_the_default_body_limit() {
    let app = spawn_app().await;
    // 64 KiB of JSON text: the default claims.max_result_bytes, and as
    // much as the default http.max_body_bytes, with the token around it.
    let big = format!("\"{}\"", "x".repeat(64 * 1024 - 2));
    let (token, _, _) = app.claim_ok("k", json!({})).await;
    let res = done_raw(
        &app,
        "k",
        format!(r#"{{"token":"{token}","result":{big}}}"#),
    )
    .await;
    assert_eq!(res.status(), StatusCode::OK);
    let v: Value = app.get("k").await.json().await.unwrap();
    assert_eq!(v["result"].as_str().map(str::len), Some(64 * 1024 - 2));
}

#[tokio::test]
async fn a_result_over_the_cap_is_413_and_changes_nothing() {
    let app = spawn_app_with(|l| l.settings.claims.max_result_bytes = 100).await;
    let (token, _, expires) = app.claim_ok("k", json!({})).await;
    let over = format!("\"{}\"", "x".repeat(99));
    let res = done_raw(
        &app,
        "k",
        format!(r#"{{"token":"{token}","result":{over}}}"#),
    )
    .await;
    let v = assert_problem(res, StatusCode::PAYLOAD_TOO_LARGE, "result_too_large").await;
    assert!(v["detail"].as_str().unwrap().contains("101 bytes"), "{v}");
    // Still processing, with its expiry: nothing changed.
    let v: Value = app.get("k").await.json().await.unwrap();
    assert_eq!(
        (&v["state"], &v["expires_at_ms"]),
        (&json!("processing"), &json!(expires))
    );
    // At the cap it is kept.
    let at = format!("\"{}\"", "x".repeat(98));
    let res = done_raw(&app, "k", format!(r#"{{"token":"{token}","result":{at}}}"#)).await;
    assert_eq!(res.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_body_past_the_results_room_or_nested_deep_is_refused_and_changes_nothing() {
    let app = spawn_app().await;
    let (token, _, _) = app.claim_ok("k", json!({})).await;
    // Past the cap and its room: refused as a body before it is parsed.
    let huge = format!("\"{}\"", "x".repeat(80 * 1024));
    let res = done_raw(
        &app,
        "k",
        format!(r#"{{"token":"{token}","result":{huge}}}"#),
    )
    .await;
    assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE);
    // 60 KB of nesting, within the body limit: a clear 400 (past the 128
    // levels a reader's parser takes), no stack overflow. (80 KB is past
    // the body limit, refused as above.)
    let deep = format!("{}{}", "[".repeat(30_000), "]".repeat(30_000));
    let res = done_raw(
        &app,
        "k",
        format!(r#"{{"token":"{token}","result":{deep}}}"#),
    )
    .await;
    let v = assert_problem(res, StatusCode::BAD_REQUEST, "invalid_result").await;
    assert_eq!(v["field"], "result");
    let deep = format!("{}{}", "[".repeat(129), "]".repeat(129));
    let res = done_raw(
        &app,
        "k",
        format!(r#"{{"token":"{token}","result":{deep}}}"#),
    )
    .await;
    assert_problem(res, StatusCode::BAD_REQUEST, "invalid_result").await;
    // JSON the body's parser skips over but strict readers refuse (a lone
    // surrogate, a number out of any float's range): refused, so every
    // answer that carries a result stays JSON every client reads.
    for bad in [r#""\ud800""#, "1e400"] {
        let res = done_raw(
            &app,
            "k",
            format!(r#"{{"token":"{token}","result":{bad}}}"#),
        )
        .await;
        assert_problem(res, StatusCode::BAD_REQUEST, "invalid_result").await;
    }
    // Not JSON at all.
    let res = done_raw(&app, "k", format!(r#"{{"token":"{token}","result":nope}}"#)).await;
    assert_problem(res, StatusCode::BAD_REQUEST, "malformed_body").await;
    let v: Value = app.get("k").await.json().await.unwrap();
    assert_eq!(v["state"], "processing");
    // Extend takes no result.
    let res = app
        .extend("k", json!({ "token": token, "result": 1 }))
        .await;
    assert_problem(res, StatusCode::BAD_REQUEST, "malformed_body").await;
}
