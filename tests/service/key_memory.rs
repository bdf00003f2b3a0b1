//! `storage.max_key_memory_bytes`: once the keys held in memory take that
//! much (as estimated), a client's claim, `done` or `SET` of a new key is
//! refused (507, `-OOM`) and changes nothing, while everything else goes
//! on — a second claim of a held key, `done` of a claim, a `SET` that
//! replaces a key, reads — and new keys are taken again once keys expire:
//! the writer deletes expired ones at the cap, without the reaper.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::metrics::count;
use crate::resp::{resp_addr, spawn_resp_app_at};
use crate::support::app::T0;

/// The cap of these tests: a handful of keys.
const CAP: u64 = 1024;

#[tokio::test]
async fn at_the_cap_new_keys_are_refused_and_the_rest_goes_on_until_keys_expire() {
    let app = spawn_resp_app_at(T0, |l| l.settings.storage.max_key_memory_bytes = CAP).await;
    let client = redis::Client::open(format!("redis://{}/", resp_addr(&app))).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let set = |key: &str, value: &str| redis::cmd("SET").arg(key).arg(value).clone();
    let ok: String = set("a", "1").query_async(&mut con).await.unwrap();
    assert_eq!(ok, "OK");

    // Claims are taken until their keys reach the cap; then refused, with
    // when to retry.
    let mut tokens = Vec::new();
    let refused = loop {
        let res = app
            .claim(&format!("k{}", tokens.len()), json!({ "ttl_ms": 10_000 }))
            .await;
        if res.status() != StatusCode::CREATED {
            break res;
        }
        let v: Value = res.json().await.unwrap();
        tokens.push(v["token"].as_str().unwrap().to_owned());
        assert!(tokens.len() < 20, "a cap of {CAP} bytes took 20 claims");
    };
    assert!(tokens.len() >= 2, "{} claims before the cap", tokens.len());
    assert_eq!(refused.status(), StatusCode::INSUFFICIENT_STORAGE);
    assert_eq!(refused.headers()["retry-after"], "30");
    let v: Value = refused.json().await.unwrap();
    assert_eq!(v["code"], "keys_in_memory_full", "{v}");
    let new = format!("k{}", tokens.len());
    // A `done` of a key nobody claimed stores one: refused as well.
    let res = app
        .done(
            "never-claimed",
            json!({ "token": "00112233445566778899aabbccddeeff" }),
        )
        .await;
    assert_eq!(res.status(), StatusCode::INSUFFICIENT_STORAGE);
    // ... and so is a SET of a new key, with Redis's code for maxmemory.
    let err = set("b", "1")
        .query_async::<String>(&mut con)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("OOM"), "{err}");
    assert!(err.to_string().contains("max_key_memory_bytes"), "{err}");

    // Nothing was added: the refused keys are not there.
    for key in [new.as_str(), "never-claimed"] {
        let res = app.get(key).await;
        assert_eq!(res.status(), StatusCode::NOT_FOUND, "{key}");
    }
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
    assert_eq!(
        ok, "OK",
        "a SET that replaces a value with one as long adds nothing"
    );
    let err = set("a", &"x".repeat(200))
        .query_async::<String>(&mut con)
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        Some("OOM"),
        "a longer value grows the key: {err}"
    );
    let res = app.done("k0", json!({ "token": tokens[0] })).await;
    assert_eq!(res.status(), StatusCode::OK);
    let s = app.scrape().await;
    assert_eq!(
        count(&s, "dedupd_store_keys_in_memory", &[("space", "claims")]),
        tokens.len() as f64
    );
    assert_eq!(
        count(&s, "dedupd_store_keys_in_memory", &[("space", "keyspace")]),
        1.0
    );
    assert!(count(&s, "dedupd_store_key_memory_bytes", &[]) >= CAP as f64);
    assert_eq!(
        count(&s, "dedupd_store_max_key_memory_bytes", &[]),
        CAP as f64
    );

    // All but k0 (done, kept a day) expire; they are still in memory.
    app.clock.advance(Duration::from_secs(11));
    let before = count(
        &app.scrape().await,
        "dedupd_store_keys_in_memory",
        &[("space", "claims")],
    );
    // A claim at the cap: the writer deletes the expired keys first,
    // without waiting for the reaper (which this app never runs), so an
    // expired key is claimed again and a new key is taken.
    let res = app.claim("k1", json!({ "ttl_ms": 10_000 })).await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let res = app.claim(&new, json!({ "ttl_ms": 10_000 })).await;
    assert_eq!(res.status(), StatusCode::CREATED, "expired keys make room");
    let ok: String = set("b", "1").query_async(&mut con).await.unwrap();
    assert_eq!(ok, "OK");
    let after = count(
        &app.scrape().await,
        "dedupd_store_keys_in_memory",
        &[("space", "claims")],
    );
    // k0 (done), k1 (claimed again) and the new key are left.
    assert_eq!((before, after), (tokens.len() as f64, 3.0));
    for (key, status) in [
        ("k0", StatusCode::OK),
        ("k1", StatusCode::OK),
        (new.as_str(), StatusCode::OK),
        ("k2", StatusCode::NOT_FOUND),
    ] {
        assert_eq!(app.get(key).await.status(), status, "{key}");
    }
}

/// At the cap with nothing expired, a new key is refused as ever, and a
/// key that expires later makes room for one then, with no reaper.
#[tokio::test]
async fn at_a_cap_of_live_keys_new_ones_wait_for_an_expiry_not_the_reaper() {
    let app = crate::support::app::spawn_app_with(|l| {
        l.settings.storage.max_key_memory_bytes = CAP;
    })
    .await;
    let mut n = 0;
    while app
        .claim(&format!("k{n}"), json!({ "ttl_ms": 5_000 + n * 1_000 }))
        .await
        .status()
        == StatusCode::CREATED
    {
        n += 1;
        assert!(n < 20, "a cap of {CAP} bytes took 20 claims");
    }
    // Refused again and again: nothing to reclaim, and after one reclaim
    // that found nothing no other is tried for 100 ms (each is a logged
    // write of its own).
    let written = app.store.write_stats().operations;
    for _ in 0..3 {
        let res = app.claim("new", json!({ "ttl_ms": 10_000 })).await;
        assert_eq!(res.status(), StatusCode::INSUFFICIENT_STORAGE);
    }
    assert!(
        app.store.write_stats().operations - written <= 1,
        "a reclaim per refused claim"
    );
    // k0 expires: one key's room. (Reclaims that found nothing wait
    // 100 ms before the next: a cap reached by live keys costs no purge
    // per batch.)
    app.clock.advance(Duration::from_millis(5_500));
    let status = app.claim("new", json!({ "ttl_ms": 10_000 })).await.status();
    assert_eq!(status, StatusCode::CREATED, "k0's room");
    assert_eq!(app.get("k0").await.status(), StatusCode::NOT_FOUND);
    assert_eq!(
        app.get("k1").await.status(),
        StatusCode::OK,
        "live keys stay"
    );
}

/// A cap lowered below what the file holds drops nothing: every claim is
/// there after the restart, and only new keys are refused.
#[tokio::test]
async fn a_restart_with_a_lower_cap_keeps_every_key_and_refuses_only_new_ones() {
    let app = crate::support::app::spawn_app().await;
    let keys: Vec<String> = (0..8).map(|i| format!("k{i}")).collect();
    for key in &keys {
        let res = app.claim(key, json!({ "ttl_ms": 10_000 })).await;
        assert_eq!(res.status(), StatusCode::CREATED, "{key}");
    }
    let (mut loaded, dir, clock) = app.stop().await;
    loaded.settings.storage.max_key_memory_bytes = CAP;
    let app = crate::support::app::start_again(loaded, dir, clock).await;
    for key in &keys {
        let res = app.get(key).await;
        assert_eq!(res.status(), StatusCode::OK, "{key} kept");
    }
    let res = app.claim("k1", json!({ "ttl_ms": 10_000 })).await;
    assert_eq!(
        res.status(),
        StatusCode::CONFLICT,
        "held keys answer as ever"
    );
    let res = app.claim("new", json!({ "ttl_ms": 10_000 })).await;
    assert_eq!(res.status(), StatusCode::INSUFFICIENT_STORAGE);
}

/// Concurrent claims, taken by the writer in batches, stop at the cap
/// too: no batch passes it by more than one key.
#[tokio::test]
async fn concurrent_claims_stop_at_the_cap() {
    let app = crate::support::app::spawn_app_with(|l| {
        l.settings.storage.max_key_memory_bytes = CAP;
    })
    .await;
    let claims = (0..40).map(|i| app.claim_key(format!("c{i}")));
    let statuses: Vec<StatusCode> = futures_util::future::join_all(claims).await;
    let taken = statuses
        .iter()
        .filter(|s| **s == StatusCode::CREATED)
        .count();
    let refused = statuses
        .iter()
        .filter(|s| **s == StatusCode::INSUFFICIENT_STORAGE)
        .count();
    assert_eq!(taken + refused, 40, "{statuses:?}");
    // A claim of a 3-byte key takes about 250 bytes of the 1024: four fit
    // under the cap, and the one that reaches it.
    assert!(
        (1..=5).contains(&taken),
        "{taken} claims taken: {statuses:?}"
    );
    let s = app.scrape().await;
    assert_eq!(
        count(&s, "dedupd_store_keys_in_memory", &[("space", "claims")]),
        taken as f64
    );
}

impl crate::support::app::TestApp {
    async fn claim_key(&self, key: String) -> StatusCode {
        self.claim(&key, json!({ "ttl_ms": 10_000 })).await.status()
    }
}

/// A done's result is kept in its row, never in memory: at the cap, every
/// held claim's done with a result is taken (a finished work is never
/// refused), and the keys' memory does not grow past the cap by it.
#[tokio::test]
async fn at_the_cap_dones_with_results_are_taken_and_grow_no_key() {
    let app =
        crate::support::app::spawn_app_with(|l| l.settings.storage.max_key_memory_bytes = CAP)
            .await;
    let bytes = |s: &str| count(s, "dedupd_store_key_memory_bytes", &[]);
    let mut tokens = Vec::new();
    for i in 0.. {
        let res = app.claim(&format!("k{i}"), json!({})).await;
        if res.status() == StatusCode::INSUFFICIENT_STORAGE {
            break;
        }
        assert_eq!(res.status(), StatusCode::CREATED);
        let v: Value = res.json().await.unwrap();
        tokens.push(v["token"].as_str().unwrap().to_owned());
    }
    assert!(tokens.len() >= 2, "{} keys under the cap", tokens.len());
    let before = bytes(&app.scrape().await);
    // Results of every size an inline value could take, and larger.
    for (i, token) in tokens.iter().enumerate() {
        let result = format!("\"{}\"", "r".repeat(10 + 100 * i));
        let body = format!(r#"{{"token":"{token}","result":{result}}}"#);
        let res = app
            .request(reqwest::Method::POST, &format!("/v1/claims/k{i}/done"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK, "k{i}");
    }
    let after = bytes(&app.scrape().await);
    // Each key's 25-byte value (state, token, fence) is no longer held.
    assert_eq!(after, before - 25.0 * tokens.len() as f64);
    for (i, _) in tokens.iter().enumerate() {
        let v: Value = app.get(&format!("k{i}")).await.json().await.unwrap();
        assert_eq!(
            v["result"].as_str().map(str::len),
            Some(10 + 100 * i),
            "k{i}"
        );
    }
}
