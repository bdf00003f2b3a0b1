//! Claims over HTTP: every cell of the claim state table, and racing clients.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;
use serde_json::json;

use crate::support::app::T0;
use crate::support::app::assert_problem;
use crate::support::app::spawn_app;
const OTHER: &str = "00000000000000000000000000000000";

// --- claim ---------------------------------------------------------------

#[tokio::test]
async fn claim_of_an_absent_key_returns_201_with_token_fence_and_expiry() {
    let app = spawn_app().await;
    let res = app.claim("evt_1", json!({ "ttl_ms": 5_000 })).await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let v: Value = res.json().await.unwrap();
    assert_eq!(v["key"], "evt_1");
    assert_eq!(v["state"], "processing");
    assert_eq!(v["token"].as_str().unwrap().len(), 32);
    assert!(v["fence"].as_u64().unwrap() >= 1);
    assert_eq!(v["expires_at_ms"], T0 + 5_000);
}

#[tokio::test]
async fn claim_without_a_body_uses_the_default_ttl() {
    let app = spawn_app().await;
    let res = app
        .request(reqwest::Method::POST, "/v1/claims/no-body")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let v: Value = res.json().await.unwrap();
    assert_eq!(v["expires_at_ms"], T0 + 300_000);
}

#[tokio::test]
async fn claim_of_an_expired_claim_succeeds_with_a_larger_fence() {
    let app = spawn_app().await;
    let (_, fence1, _) = app.claim_ok("k", json!({ "ttl_ms": 1_000 })).await;
    app.clock.advance(Duration::from_millis(1_000));
    let (_, fence2, _) = app.claim_ok("k", json!({ "ttl_ms": 1_000 })).await;
    assert!(fence2 > fence1);
}

#[tokio::test]
async fn claim_of_an_expired_done_record_succeeds() {
    let app = spawn_app().await;
    let (token, _, _) = app.claim_ok("k", json!({})).await;
    let res = app
        .done("k", json!({ "token": token, "ttl_ms": 2_000 }))
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    app.clock.advance(Duration::from_millis(2_000));
    app.claim_ok("k", json!({})).await;
}

#[tokio::test]
async fn claim_of_a_processing_key_returns_409_busy_without_the_token() {
    let app = spawn_app().await;
    let (token, _, expires) = app.claim_ok("k", json!({})).await;
    let res = app.claim("k", json!({})).await;
    let v = assert_problem(res, StatusCode::CONFLICT, "busy").await;
    assert_eq!(v["state"], "processing");
    assert_eq!(v["expires_at_ms"], expires);
    assert!(!v.to_string().contains(&token), "the token must not leak");
}

#[tokio::test]
async fn claim_of_a_done_key_returns_409_done() {
    let app = spawn_app().await;
    let (token, _, _) = app.claim_ok("k", json!({})).await;
    app.done("k", json!({ "token": token, "ttl_ms": 60_000 }))
        .await;
    let v = assert_problem(
        app.claim("k", json!({})).await,
        StatusCode::CONFLICT,
        "done",
    )
    .await;
    assert_eq!(v["state"], "done");
    assert_eq!(v["expires_at_ms"], T0 + 60_000);
}

// --- done ----------------------------------------------------------------

#[tokio::test]
async fn done_on_an_absent_key_records_done() {
    let app = spawn_app().await;
    let res = app
        .done("k", json!({ "token": OTHER, "ttl_ms": 10_000 }))
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    let v: Value = res.json().await.unwrap();
    assert_eq!(v["state"], "done");
    assert_eq!(v["expires_at_ms"], T0 + 10_000);
    let v: Value = app.get("k").await.json().await.unwrap();
    assert_eq!(v["state"], "done");
    assert_problem(
        app.claim("k", json!({})).await,
        StatusCode::CONFLICT,
        "done",
    )
    .await;
}

#[tokio::test]
async fn done_after_the_claim_expired_still_records_the_finished_work() {
    let app = spawn_app().await;
    let (token, _, _) = app.claim_ok("k", json!({ "ttl_ms": 1_000 })).await;
    app.clock.advance(Duration::from_secs(5));
    let res = app.done("k", json!({ "token": token })).await;
    assert_eq!(res.status(), StatusCode::OK);
    let v: Value = app.get("k").await.json().await.unwrap();
    assert_eq!(v["state"], "done");
}

#[tokio::test]
async fn done_with_the_owner_token_marks_done_with_the_default_done_ttl() {
    let app = spawn_app().await;
    let (token, fence, _) = app.claim_ok("k", json!({})).await;
    let res = app.done("k", json!({ "token": token })).await;
    assert_eq!(res.status(), StatusCode::OK);
    let v: Value = res.json().await.unwrap();
    assert_eq!(v["state"], "done");
    assert_eq!(v["expires_at_ms"], T0 + 86_400_000);
    let v: Value = app.get("k").await.json().await.unwrap();
    assert_eq!(v["state"], "done");
    assert_eq!(v["fence"], fence, "done keeps the claim's fence");
}

#[tokio::test]
async fn done_with_another_token_on_a_processing_key_returns_409_not_owner() {
    let app = spawn_app().await;
    app.claim_ok("k", json!({})).await;
    let v = assert_problem(
        app.done("k", json!({ "token": OTHER })).await,
        StatusCode::CONFLICT,
        "not_owner",
    )
    .await;
    assert_eq!(v["state"], "processing");
    let v: Value = app.get("k").await.json().await.unwrap();
    assert_eq!(v["state"], "processing", "a refused done changes nothing");
}

#[tokio::test]
async fn done_repeated_with_the_same_token_is_idempotent() {
    let app = spawn_app().await;
    let (token, _, _) = app.claim_ok("k", json!({})).await;
    let first: Value = app
        .done("k", json!({ "token": token, "ttl_ms": 60_000 }))
        .await
        .json()
        .await
        .unwrap();
    app.clock.advance(Duration::from_secs(10));
    let res = app
        .done("k", json!({ "token": token, "ttl_ms": 60_000 }))
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    let second: Value = res.json().await.unwrap();
    assert_eq!(first, second, "a repeated done changes nothing");
}

#[tokio::test]
async fn done_with_another_token_on_a_done_key_is_refused() {
    let app = spawn_app().await;
    let (token, _, _) = app.claim_ok("k", json!({})).await;
    app.done("k", json!({ "token": token })).await;
    let v = assert_problem(
        app.done("k", json!({ "token": OTHER })).await,
        StatusCode::CONFLICT,
        "not_owner",
    )
    .await;
    assert_eq!(v["state"], "done");
}

// --- release -------------------------------------------------------------

#[tokio::test]
async fn release_of_an_absent_key_returns_204() {
    let app = spawn_app().await;
    assert_eq!(
        app.release("k", OTHER).await.status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(app.get("k").await.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn release_with_the_owner_token_frees_the_key() {
    let app = spawn_app().await;
    let (token, _, _) = app.claim_ok("k", json!({})).await;
    assert_eq!(
        app.release("k", &token).await.status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(app.get("k").await.status(), StatusCode::NOT_FOUND);
    app.claim_ok("k", json!({})).await;
}

#[tokio::test]
async fn release_with_another_token_returns_409_not_owner_and_keeps_the_claim() {
    let app = spawn_app().await;
    app.claim_ok("k", json!({})).await;
    assert_problem(
        app.release("k", OTHER).await,
        StatusCode::CONFLICT,
        "not_owner",
    )
    .await;
    assert_problem(
        app.claim("k", json!({})).await,
        StatusCode::CONFLICT,
        "busy",
    )
    .await;
}

#[tokio::test]
async fn release_of_a_done_key_returns_409_done() {
    let app = spawn_app().await;
    let (token, _, _) = app.claim_ok("k", json!({})).await;
    app.done("k", json!({ "token": token })).await;
    assert_problem(app.release("k", &token).await, StatusCode::CONFLICT, "done").await;
    let v: Value = app.get("k").await.json().await.unwrap();
    assert_eq!(v["state"], "done");
}

// --- extend --------------------------------------------------------------

#[tokio::test]
async fn extend_of_an_absent_key_returns_404_lost() {
    let app = spawn_app().await;
    assert_problem(
        app.extend("k", json!({ "token": OTHER })).await,
        StatusCode::NOT_FOUND,
        "lost",
    )
    .await;
}

#[tokio::test]
async fn extend_of_an_expired_claim_returns_404_lost() {
    let app = spawn_app().await;
    let (token, _, _) = app.claim_ok("k", json!({ "ttl_ms": 1_000 })).await;
    app.clock.advance(Duration::from_millis(1_000));
    assert_problem(
        app.extend("k", json!({ "token": token })).await,
        StatusCode::NOT_FOUND,
        "lost",
    )
    .await;
}

#[tokio::test]
async fn extend_with_the_owner_token_moves_the_expiry() {
    let app = spawn_app().await;
    let (token, _, _) = app.claim_ok("k", json!({ "ttl_ms": 1_000 })).await;
    app.clock.advance(Duration::from_millis(900));
    let res = app
        .extend("k", json!({ "token": token, "ttl_ms": 5_000 }))
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    let v: Value = res.json().await.unwrap();
    assert_eq!(v["expires_at_ms"], T0 + 900 + 5_000);
    app.clock.advance(Duration::from_millis(1_000));
    let v: Value = app.get("k").await.json().await.unwrap();
    assert_eq!(
        v["state"], "processing",
        "the extended claim outlives its first ttl"
    );
}

#[tokio::test]
async fn extend_with_another_token_returns_409_not_owner() {
    let app = spawn_app().await;
    let (_, _, expires) = app.claim_ok("k", json!({})).await;
    assert_problem(
        app.extend("k", json!({ "token": OTHER, "ttl_ms": 999_999 }))
            .await,
        StatusCode::CONFLICT,
        "not_owner",
    )
    .await;
    let v: Value = app.get("k").await.json().await.unwrap();
    assert_eq!(v["expires_at_ms"], expires);
}

#[tokio::test]
async fn extend_of_a_done_key_returns_409_done() {
    let app = spawn_app().await;
    let (token, _, _) = app.claim_ok("k", json!({})).await;
    app.done("k", json!({ "token": token })).await;
    assert_problem(
        app.extend("k", json!({ "token": token })).await,
        StatusCode::CONFLICT,
        "done",
    )
    .await;
}

// --- get -----------------------------------------------------------------

#[tokio::test]
async fn get_shows_state_fence_and_expiry_but_never_the_token() {
    let app = spawn_app().await;
    let (token, fence, expires) = app.claim_ok("k", json!({})).await;
    let res = app.get("k").await;
    assert_eq!(res.status(), StatusCode::OK);
    let v: Value = res.json().await.unwrap();
    assert_eq!(
        v,
        json!({ "key": "k", "state": "processing", "fence": fence, "expires_at_ms": expires })
    );
    assert!(!v.to_string().contains(&token));
}

#[tokio::test]
async fn get_of_an_absent_or_expired_key_returns_404() {
    let app = spawn_app().await;
    assert_problem(app.get("k").await, StatusCode::NOT_FOUND, "not_found").await;
    app.claim_ok("k", json!({ "ttl_ms": 1_000 })).await;
    app.clock.advance(Duration::from_millis(999));
    assert_eq!(app.get("k").await.status(), StatusCode::OK);
    app.clock.advance(Duration::from_millis(1));
    assert_problem(app.get("k").await, StatusCode::NOT_FOUND, "not_found").await;
}

// --- tokens, fingerprints, ttls --------------------------------------------

#[tokio::test]
async fn a_token_from_an_expired_claim_cannot_release_or_complete_the_new_owners_claim() {
    let app = spawn_app().await;
    let (slow, _, _) = app.claim_ok("k", json!({ "ttl_ms": 1_000 })).await;
    app.clock.advance(Duration::from_secs(2));
    let (fast, fast_fence, _) = app.claim_ok("k", json!({ "ttl_ms": 60_000 })).await;

    assert_problem(
        app.release("k", &slow).await,
        StatusCode::CONFLICT,
        "not_owner",
    )
    .await;
    assert_problem(
        app.done("k", json!({ "token": slow })).await,
        StatusCode::CONFLICT,
        "not_owner",
    )
    .await;
    assert_problem(
        app.extend("k", json!({ "token": slow })).await,
        StatusCode::CONFLICT,
        "not_owner",
    )
    .await;

    let v: Value = app.get("k").await.json().await.unwrap();
    assert_eq!(v["state"], "processing");
    assert_eq!(v["fence"], fast_fence);
    assert_eq!(
        app.done("k", json!({ "token": fast })).await.status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn a_claim_with_a_different_fingerprint_returns_422() {
    let app = spawn_app().await;
    let (token, _, _) = app
        .claim_ok("k", json!({ "fingerprint": "sha256:aaa" }))
        .await;
    let v = assert_problem(
        app.claim("k", json!({ "fingerprint": "sha256:bbb" })).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "fingerprint_mismatch",
    )
    .await;
    assert_eq!(v["state"], "processing");
    // Same fingerprint, or none: the ordinary busy answer.
    assert_problem(
        app.claim("k", json!({ "fingerprint": "sha256:aaa" })).await,
        StatusCode::CONFLICT,
        "busy",
    )
    .await;
    assert_problem(
        app.claim("k", json!({})).await,
        StatusCode::CONFLICT,
        "busy",
    )
    .await;
    // The fingerprint stays with the done record.
    app.done("k", json!({ "token": token })).await;
    assert_problem(
        app.claim("k", json!({ "fingerprint": "sha256:bbb" })).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "fingerprint_mismatch",
    )
    .await;
}

#[tokio::test]
async fn ttls_outside_the_bounds_return_400_and_change_nothing() {
    let app = spawn_app().await;
    let max = 30 * 86_400_000u64;
    for ttl in [json!(0), json!(max + 1)] {
        assert_problem(
            app.claim("k", json!({ "ttl_ms": ttl })).await,
            StatusCode::BAD_REQUEST,
            "invalid_ttl",
        )
        .await;
    }
    assert_eq!(app.get("k").await.status(), StatusCode::NOT_FOUND);
    let (token, _, expires) = app.claim_ok("k", json!({ "ttl_ms": max })).await;
    assert_eq!(expires, T0 + max);
    for ttl in [0, max + 1] {
        let refused = assert_problem(
            app.done("k", json!({ "token": token, "ttl_ms": ttl }))
                .await,
            StatusCode::BAD_REQUEST,
            "invalid_ttl",
        )
        .await;
        // Over the maximum, the answer names it (`claims.max_ttl`), for a
        // client to send again within it.
        let maximum = if ttl > max { json!(max) } else { Value::Null };
        assert_eq!(refused["maximum"], maximum, "{refused}");
        assert_problem(
            app.extend("k", json!({ "token": token, "ttl_ms": ttl }))
                .await,
            StatusCode::BAD_REQUEST,
            "invalid_ttl",
        )
        .await;
    }
    let v: Value = app.get("k").await.json().await.unwrap();
    assert_eq!(v["state"], "processing");
    assert_eq!(v["expires_at_ms"], expires);
}

#[tokio::test]
async fn keys_are_percent_decoded_and_may_hold_any_printable_text() {
    let app = spawn_app().await;
    for key in ["a/b", "sp ace", "ü✓", "%41", "q?x=1#f"] {
        let res = app.claim(key, json!({})).await;
        assert_eq!(res.status(), StatusCode::CREATED, "{key}");
        let v: Value = res.json().await.unwrap();
        assert_eq!(v["key"], key);
        let v: Value = app.get(key).await.json().await.unwrap();
        assert_eq!(v["key"], key);
    }
    // "%41" was decoded once: it is not the key "A".
    assert_eq!(app.get("A").await.status(), StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_concurrent_claims_of_one_key_give_exactly_one_201() {
    let app = spawn_app().await;
    let requests = (0..64).map(|_| app.claim("contended", json!({})));
    let statuses: Vec<StatusCode> = futures_util::future::join_all(requests)
        .await
        .into_iter()
        .map(|r| r.status())
        .collect();
    let created = statuses
        .iter()
        .filter(|s| **s == StatusCode::CREATED)
        .count();
    let busy = statuses
        .iter()
        .filter(|s| **s == StatusCode::CONFLICT)
        .count();
    assert_eq!((created, busy), (1, 63), "{statuses:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_claims_of_different_keys_all_succeed_with_distinct_fences() {
    let app = spawn_app().await;
    let keys: Vec<String> = (0..64).map(|i| format!("key-{i}")).collect();
    let answers =
        futures_util::future::join_all(keys.iter().map(|k| app.claim_ok(k, json!({})))).await;
    let mut fences: Vec<u64> = answers.iter().map(|(_, f, _)| *f).collect();
    fences.sort_unstable();
    fences.dedup();
    assert_eq!(fences.len(), 64, "every claim got its own fence");
}
