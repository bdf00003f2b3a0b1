//! Racing clients.

use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::spawn_app;

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
