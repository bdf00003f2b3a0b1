//! The app on the Redis backend (feature `redis`), against a redis-server
//! the test starts, stops and starts again.

use std::time::Duration;

use dedupd::config::Backend;
use dedupd::config::Loaded;
use dedupd::config::Secret;
use reqwest::Method;
use reqwest::StatusCode;
use serde_json::json;

use crate::support::app::assert_problem;
use crate::support::app::spawn_app_with;
use crate::support::receiver::eventually;
use crate::support::redis::RedisServer;
/// The app on the Redis backend at `url`, with room for a slow test host
/// in its timeouts.
fn on_redis(l: &mut Loaded, url: String) {
    l.settings.storage.backend = Backend::Redis;
    l.settings.storage.redis.url = Secret::new(url);
    l.settings.storage.redis.response_timeout = Duration::from_secs(5);
    l.settings.storage.redis.connect_timeout = Duration::from_secs(5);
}

/// Stops the server (off the async threads: it waits for the process).
async fn stopped(mut server: RedisServer) -> RedisServer {
    tokio::task::spawn_blocking(move || {
        server.stop();
        server
    })
    .await
    .unwrap()
}

/// Starts the server again on its socket, empty.
async fn restarted(mut server: RedisServer) -> RedisServer {
    tokio::task::spawn_blocking(move || {
        server.restart();
        server
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn with_redis_down_claims_and_applies_answer_503_and_recover_when_it_returns() {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let url = server.url();
    let app = spawn_app_with(|l| {
        on_redis(l, url);
        l.settings.storage.redis.expiry_slack = Duration::from_secs(600);
    })
    .await;
    let (token, _, _) = app.claim_ok("k", json!({})).await;
    assert_eq!(
        app.client
            .get(app.url("/readyz"))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );

    let server = stopped(server).await;
    let res = app.claim("k2", json!({})).await;
    let v = assert_problem(res, StatusCode::SERVICE_UNAVAILABLE, "store_unavailable").await;
    assert!(
        !v["detail"].as_str().unwrap().contains("redis+unix"),
        "no internals leak: {v}"
    );
    let res = app.apply("s", "e", "2026-11-29T10:00:00Z").await;
    assert_problem(res, StatusCode::SERVICE_UNAVAILABLE, "store_unavailable").await;
    assert_problem(
        app.get("k").await,
        StatusCode::SERVICE_UNAVAILABLE,
        "store_unavailable",
    )
    .await;
    for res in [
        app.done("k", json!({ "token": token })).await,
        app.extend("k", json!({ "token": token })).await,
        app.release("k", &token).await,
    ] {
        assert_problem(res, StatusCode::SERVICE_UNAVAILABLE, "store_unavailable").await;
    }
    let res = app.request(Method::GET, "/readyz").send().await.unwrap();
    assert_problem(res, StatusCode::SERVICE_UNAVAILABLE, "store_unavailable").await;

    // Redis comes back (empty: this test server keeps nothing on disk).
    let server = restarted(server).await;
    eventually("dedupd reconnects by itself", || async {
        app.client
            .get(app.url("/readyz"))
            .send()
            .await
            .unwrap()
            .status()
            == StatusCode::OK
    })
    .await;
    app.claim_ok("k2", json!({})).await;
    assert_eq!(
        app.apply_ok("s", "e", "2026-11-29T10:00:00Z").await["outcome"],
        "applied"
    );
    // The token from before the outage is unknown to the new, empty Redis.
    assert_eq!(
        app.release("k", &token).await.status(),
        StatusCode::NO_CONTENT
    );
    drop(server);
}

#[tokio::test]
async fn dedupd_starts_not_ready_while_redis_is_down_and_becomes_ready_when_it_appears() {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let url = server.url();
    let server = stopped(server).await;
    let app = spawn_app_with(|l| {
        l.settings.storage.backend = Backend::Redis;
        l.settings.storage.redis.url = Secret::new(url);
        l.settings.storage.redis.connect_timeout = Duration::from_secs(5);
    })
    .await;
    let res = app.request(Method::GET, "/readyz").send().await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_problem(
        app.claim("k", json!({})).await,
        StatusCode::SERVICE_UNAVAILABLE,
        "store_unavailable",
    )
    .await;
    let server = restarted(server).await;
    eventually("ready", || async {
        app.client
            .get(app.url("/readyz"))
            .send()
            .await
            .unwrap()
            .status()
            == StatusCode::OK
    })
    .await;
    app.claim_ok("k", json!({})).await;
    drop(server);
}

/// Issue 54: a source's view says whether the store takes writes: while
/// Redis is down it is `unavailable` (the delivery's own state may still
/// say `running`: nothing is taken in or delivered then), and `ready` once
/// dedupd has reconnected.
#[tokio::test]
async fn a_sources_view_shows_the_store_down_and_back() {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let url = server.url();
    let app = spawn_app_with(|l| {
        on_redis(l, url);
        let s = crate::support::gateway::settings("http://127.0.0.1:9/hook");
        l.settings.sources.insert("sume".into(), s);
    })
    .await;
    let store_state = || async {
        let v: serde_json::Value = app
            .request(Method::GET, "/v1/sources/sume")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        v["store"]["state"].as_str().unwrap_or_default().to_owned()
    };
    let held_by = || async {
        let v: serde_json::Value = app
            .request(Method::GET, "/v1/sources")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        (
            v["store"]["state"].as_str().unwrap_or_default().to_owned(),
            v["sources"][0]["delivery"]["held_by"].clone(),
        )
    };
    assert_eq!(store_state().await, "ready");
    assert_eq!(
        held_by().await,
        ("ready".to_owned(), serde_json::Value::Null)
    );
    let server = stopped(server).await;
    assert_eq!(store_state().await, "unavailable");
    // The overview says so too, and what holds deliveries back: the store.
    assert_eq!(
        held_by().await,
        ("unavailable".to_owned(), serde_json::json!("store"))
    );
    let _server = restarted(server).await;
    eventually("the view says ready again", || async {
        store_state().await == "ready"
    })
    .await;
}
