//! Bearer tokens on `/v1/*`.

use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{assert_problem, claim_path, spawn_app_with, with_tokens};

const TOKEN: &str = "test-token-0123456789";
const ROTATED: &str = "next-token-9876543210";

#[tokio::test]
async fn with_tokens_configured_v1_requires_a_valid_bearer_token() {
    let app = spawn_app_with(|l| with_tokens(l, &[TOKEN, ROTATED])).await;
    let url = app.url(&claim_path("k"));

    let res = app.client.post(&url).send().await.unwrap();
    assert_eq!(res.headers()["www-authenticate"], "Bearer");
    assert_problem(res, StatusCode::UNAUTHORIZED, "unauthorized").await;

    let res = app
        .client
        .post(&url)
        .bearer_auth("wrong-token-0123456789")
        .send()
        .await
        .unwrap();
    assert_problem(res, StatusCode::UNAUTHORIZED, "unauthorized").await;
    let res = app
        .client
        .post(&url)
        .header("authorization", TOKEN)
        .send()
        .await
        .unwrap();
    assert_problem(res, StatusCode::UNAUTHORIZED, "unauthorized").await;

    // Refused requests changed nothing.
    let res = app
        .client
        .get(&url)
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NOT_FOUND);

    let res = app
        .client
        .post(&url)
        .bearer_auth(TOKEN)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let res = app
        .client
        .get(&url)
        .bearer_auth(ROTATED)
        .send()
        .await
        .unwrap();
    assert_eq!(
        res.status(),
        StatusCode::OK,
        "every configured token is accepted"
    );
}

#[tokio::test]
async fn health_endpoints_need_no_token() {
    let app = spawn_app_with(|l| with_tokens(l, &[TOKEN])).await;
    for path in ["/healthz", "/readyz"] {
        let res = app.client.get(app.url(path)).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{path}");
    }
}
