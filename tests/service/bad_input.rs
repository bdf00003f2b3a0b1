//! Bad input gets a problem+json 4xx and changes nothing; nothing panics.

use rand::Rng;
use rand::SeedableRng;
use reqwest::Method;
use reqwest::StatusCode;
use serde_json::Value;
use serde_json::json;

use crate::support::app::assert_problem;
use crate::support::app::claim_path;
use crate::support::app::spawn_app;
#[tokio::test]
async fn an_empty_key_is_not_a_resource() {
    let app = spawn_app().await;
    let res = app
        .request(Method::POST, "/v1/claims/")
        .send()
        .await
        .unwrap();
    assert_problem(res, StatusCode::NOT_FOUND, "not_found").await;
}

/// The claims and streams routes are dispatched by hand: paths their
/// patterns would not match are 404, whatever the method.
#[tokio::test]
async fn paths_beside_the_claims_and_streams_routes_are_not_found() {
    let app = spawn_app().await;
    for (method, path) in [
        (Method::POST, "/v1/claims"),
        (Method::POST, "/v1/claims//done"),
        (Method::POST, "/v1/claims/k/"),
        (Method::POST, "/v1/claims/k/finish"),
        (Method::POST, "/v1/claims/k/done/more"),
        (Method::GET, "/v1/streams"),
        (Method::GET, "/v1/streams/"),
        (Method::POST, "/v1/streams//apply"),
        (Method::GET, "/v1/streams/s/"),
        (Method::POST, "/v1/streams/s/append"),
        (Method::POST, "/v1/streams/s/apply/more"),
    ] {
        let res = app.request(method.clone(), path).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::NOT_FOUND, "{method} {path}");
        assert_problem(res, StatusCode::NOT_FOUND, "not_found").await;
    }
}

#[tokio::test]
async fn a_key_over_512_bytes_returns_400_naming_the_limit() {
    let app = spawn_app().await;
    let key = "k".repeat(513);
    let v = assert_problem(
        app.claim(&key, json!({})).await,
        StatusCode::BAD_REQUEST,
        "invalid_key",
    )
    .await;
    assert_eq!(v["field"], "key");
    assert!(v["detail"].as_str().unwrap().contains("512"));
    assert_eq!(app.get(&key).await.status(), StatusCode::BAD_REQUEST);
    // 512 bytes is fine.
    app.claim_ok(&"k".repeat(512), json!({})).await;
}

#[tokio::test]
async fn keys_with_control_characters_return_400() {
    let app = spawn_app().await;
    for key in ["a\nb", "a\u{0}b", "tab\there", "del\u{7f}"] {
        let res = app.claim(key, json!({})).await;
        assert_problem(res, StatusCode::BAD_REQUEST, "invalid_key").await;
    }
}

#[tokio::test]
async fn malformed_json_returns_400_and_changes_nothing() {
    let app = spawn_app().await;
    let res = app
        .request(Method::POST, &claim_path("k"))
        .header("content-type", "application/json")
        .body("{\"ttl_ms\": ")
        .send()
        .await
        .unwrap();
    assert_problem(res, StatusCode::BAD_REQUEST, "malformed_body").await;
    assert_eq!(app.get("k").await.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn wrong_types_return_400_naming_the_field() {
    let app = spawn_app().await;
    for body in [
        json!({ "ttl_ms": "5000" }),
        json!({ "ttl_ms": -1 }),
        json!({ "ttl_ms": 1.5 }),
        json!({ "fingerprint": 7 }),
        json!([1, 2]),
        json!("text"),
    ] {
        let v = assert_problem(
            app.claim("k", body.clone()).await,
            StatusCode::BAD_REQUEST,
            "malformed_body",
        )
        .await;
        let detail = v["detail"].as_str().unwrap();
        if body.is_object() {
            let field = body.as_object().unwrap().keys().next().unwrap().clone();
            assert!(detail.contains(&field), "{detail} should name {field}");
        }
    }
    assert_eq!(app.get("k").await.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn unknown_fields_return_400_naming_the_field() {
    let app = spawn_app().await;
    let v = assert_problem(
        app.claim("k", json!({ "ttl": 5 })).await,
        StatusCode::BAD_REQUEST,
        "malformed_body",
    )
    .await;
    assert!(v["detail"].as_str().unwrap().contains("`ttl`"), "{v}");
    let (token, _, _) = app.claim_ok("k", json!({})).await;
    let v = assert_problem(
        app.done("k", json!({ "token": token, "state": "done" }))
            .await,
        StatusCode::BAD_REQUEST,
        "malformed_body",
    )
    .await;
    assert!(v["detail"].as_str().unwrap().contains("`state`"), "{v}");
    let v: Value = app.get("k").await.json().await.unwrap();
    assert_eq!(v["state"], "processing");
}

#[tokio::test]
async fn a_missing_or_malformed_token_returns_400() {
    let app = spawn_app().await;
    app.claim_ok("k", json!({})).await;
    let v = assert_problem(
        app.done("k", json!({})).await,
        StatusCode::BAD_REQUEST,
        "malformed_body",
    )
    .await;
    assert!(v["detail"].as_str().unwrap().contains("token"), "{v}");
    assert_problem(
        app.extend("k", json!({})).await,
        StatusCode::BAD_REQUEST,
        "malformed_body",
    )
    .await;
    let res = app
        .request(Method::DELETE, &claim_path("k"))
        .send()
        .await
        .unwrap();
    assert_problem(res, StatusCode::BAD_REQUEST, "malformed_body").await;
    assert_problem(
        app.release("k", "not-hex").await,
        StatusCode::BAD_REQUEST,
        "invalid_token",
    )
    .await;
    let v: Value = app.get("k").await.json().await.unwrap();
    assert_eq!(v["state"], "processing");
}

#[tokio::test]
async fn a_body_over_the_limit_returns_413_and_changes_nothing() {
    let app = spawn_app().await;
    let huge = "x".repeat(app.loaded.settings.http.max_body_bytes + 1);
    let res = app.claim("k", json!({ "fingerprint": huge })).await;
    assert_problem(res, StatusCode::PAYLOAD_TOO_LARGE, "body_too_large").await;
    // Also when the client does not announce the length (chunked).
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        (0..80).map(|_| Ok(vec![b' '; 1024])).collect();
    let res = app
        .request(Method::POST, &claim_path("k"))
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )))
        .send()
        .await
        .unwrap();
    assert_problem(res, StatusCode::PAYLOAD_TOO_LARGE, "body_too_large").await;
    assert_eq!(app.get("k").await.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_wrong_method_returns_405_with_allow() {
    let app = spawn_app().await;
    for (method, path, allow) in [
        (Method::PUT, "/v1/claims/k", "GET, HEAD, POST, DELETE"),
        (Method::GET, "/v1/claims/k/done", "POST"),
        (Method::DELETE, "/v1/claims/k/extend", "POST"),
        (Method::POST, "/v1/streams/s", "GET, HEAD"),
        (Method::GET, "/v1/streams/s/apply", "POST"),
    ] {
        let res = app.request(method, path).send().await.unwrap();
        assert_eq!(res.headers()["allow"], allow);
        assert_problem(res, StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed").await;
    }
}

#[tokio::test]
async fn random_bodies_and_keys_never_cause_a_5xx() {
    let app = spawn_app().await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
    let paths = ["", "/done", "/extend"];
    for i in 0..150 {
        let len = rng.random_range(0..200);
        let body: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        let key_len = rng.random_range(1..40);
        let key: String = (0..key_len)
            .map(|_| char::from(rng.random_range(0x20u8..0x7f)))
            .collect();
        let path = format!("{}{}", claim_path(&key), paths[i % 3]);
        let method = if i % 7 == 0 {
            Method::DELETE
        } else {
            Method::POST
        };
        let res = app.request(method, &path).body(body).send().await.unwrap();
        assert!(!res.status().is_server_error(), "{path}: {}", res.status());
    }
    assert_eq!(
        app.client
            .get(app.url("/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn keys_that_are_not_utf8_or_badly_escaped_return_400_and_never_collide() {
    let app = spawn_app().await;
    for raw in ["%FF", "%C3%28", "%ZZ", "abc%4", "%"] {
        let res = app
            .request(Method::POST, &format!("/v1/claims/{raw}"))
            .send()
            .await
            .unwrap();
        assert_problem(res, StatusCode::BAD_REQUEST, "invalid_key").await;
    }
    // U+FFFD itself is a fine key, and unrelated to the refused bytes above.
    app.claim_ok("\u{FFFD}", json!({})).await;
    let res = app
        .request(Method::POST, "/v1/claims/%FE")
        .send()
        .await
        .unwrap();
    assert_problem(res, StatusCode::BAD_REQUEST, "invalid_key").await;
}
