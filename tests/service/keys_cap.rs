//! `storage.max_keys_in_memory`: at the cap, a claim or a `SET` of a new
//! key is refused (507, `-OOM`) and changes nothing, while everything else
//! goes on — a second claim of a held key, `done`, a `SET` that replaces a
//! key, reads — and new keys are taken again once the reaper deletes
//! expired ones.

use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::metrics::count;
use crate::resp::{resp_addr, spawn_resp_app_at};
use crate::support::app::T0;

#[tokio::test]
async fn at_the_cap_new_keys_are_refused_and_the_rest_goes_on_until_the_reaper_makes_room() {
    let app = spawn_resp_app_at(T0, |l| l.settings.storage.max_keys_in_memory = 4).await;
    let mut tokens = Vec::new();
    for key in ["k0", "k1", "k2"] {
        let res = app.claim(key, json!({ "ttl_ms": 10_000 })).await;
        assert_eq!(res.status(), StatusCode::CREATED, "{key}");
        let v: Value = res.json().await.unwrap();
        tokens.push(v["token"].as_str().unwrap().to_owned());
    }
    let client = redis::Client::open(format!("redis://{}/", resp_addr(&app))).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let set = |key: &str, value: &str| redis::cmd("SET").arg(key).arg(value).clone();
    let ok: String = set("a", "1").query_async(&mut con).await.unwrap();
    assert_eq!(ok, "OK", "the fourth key is taken");

    // Full: a claim of a new key is refused, with when to retry.
    let res = app.claim("k3", json!({ "ttl_ms": 10_000 })).await;
    assert_eq!(res.status(), StatusCode::INSUFFICIENT_STORAGE);
    assert_eq!(res.headers()["retry-after"], "30");
    let v: Value = res.json().await.unwrap();
    assert_eq!(v["code"], "keys_in_memory_full", "{v}");
    // ... and so is a SET of a new key, with Redis's code for maxmemory.
    let err = set("b", "1")
        .query_async::<String>(&mut con)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("OOM"), "{err}");
    assert!(err.to_string().contains("max_keys_in_memory"), "{err}");

    // Nothing was added: the refused keys are not there.
    let res = app
        .client
        .get(app.url("/v1/claims/k3"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    let b: Option<String> = redis::cmd("GET")
        .arg("b")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(b, None);

    // Keys already held go on as always.
    let res = app.claim("k0", json!({ "ttl_ms": 10_000 })).await;
    assert_eq!(
        res.status(),
        StatusCode::CONFLICT,
        "a duplicate, not a refusal"
    );
    let ok: String = set("a", "2").query_async(&mut con).await.unwrap();
    assert_eq!(ok, "OK", "a SET that replaces a key adds none");
    let res = app.done("k0", json!({ "token": tokens[0] })).await;
    assert_eq!(res.status(), StatusCode::OK);
    let s = app.scrape().await;
    assert_eq!(
        count(&s, "dedupd_store_keys_in_memory", &[("space", "claims")]),
        3.0
    );
    assert_eq!(
        count(&s, "dedupd_store_keys_in_memory", &[("space", "keyspace")]),
        1.0
    );
    assert_eq!(count(&s, "dedupd_store_max_keys_in_memory", &[]), 4.0);

    // k1 and k2 expire; once the reaper deletes them, new keys fit again.
    app.clock.advance(Duration::from_secs(11));
    let res = app.claim("k3", json!({ "ttl_ms": 10_000 })).await;
    assert_eq!(
        res.status(),
        StatusCode::INSUFFICIENT_STORAGE,
        "expired but not reaped: they still take memory"
    );
    dedupd::reaper::Reaper::new(
        app.store.clone(),
        Arc::new(app.clock.clone()),
        Duration::from_secs(60),
        100,
    )
    .purge_once(dedupd::clock::Clock::now_ms(&app.clock))
    .await
    .unwrap();
    let res = app.claim("k3", json!({ "ttl_ms": 10_000 })).await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let ok: String = set("b", "1").query_async(&mut con).await.unwrap();
    assert_eq!(ok, "OK");
}

/// A cap lowered below what the file holds drops nothing: every claim is
/// there after the restart, and only new keys are refused.
#[tokio::test]
async fn a_restart_with_a_lower_cap_keeps_every_key_and_refuses_only_new_ones() {
    let app = crate::support::app::spawn_app().await;
    for key in ["k0", "k1", "k2"] {
        let res = app.claim(key, json!({ "ttl_ms": 10_000 })).await;
        assert_eq!(res.status(), StatusCode::CREATED, "{key}");
    }
    let (mut loaded, dir, clock) = app.stop().await;
    loaded.settings.storage.max_keys_in_memory = 2;
    let app = crate::support::app::start_again(loaded, dir, clock).await;
    for key in ["k0", "k1", "k2"] {
        let res = app
            .client
            .get(app.url(&format!("/v1/claims/{key}")))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{key} kept");
    }
    let res = app.claim("k1", json!({ "ttl_ms": 10_000 })).await;
    assert_eq!(
        res.status(),
        StatusCode::CONFLICT,
        "held keys answer as ever"
    );
    let res = app.claim("k3", json!({ "ttl_ms": 10_000 })).await;
    assert_eq!(res.status(), StatusCode::INSUFFICIENT_STORAGE);
}
