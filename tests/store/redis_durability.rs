//! What an acknowledged write survives with the Redis backend
//! (`storage.redis.durability`), against real redis-servers:
//! - `"fsync"`: not ready, and no write, while the server does not sync
//!   every write (`appendonly yes`, `appendfsync always`);
//! - `"replicas = N"`: a write answered only once N replicas have it; with
//!   fewer, the answer is 503 (the write may be on the master: a retry
//!   finds it).

use std::time::Duration;

use dedupd::domain::{Durability, Key, ScopedKey, Ttl};
use dedupd::store::redis::RedisStore;
use dedupd::store::{ClaimOutcome, Store, StoreError};

use crate::backends::redis::options;
use crate::support::ports::free_port;
use crate::support::redis::RedisServer;

const NOW: u64 = 1_800_000_000_000;

fn key(k: &str) -> ScopedKey {
    ScopedKey::api(&Key::parse(k, "key").unwrap())
}

fn ttl() -> Ttl {
    Ttl::from_ms_unchecked(60_000)
}

fn redis_cli(server: &RedisServer, args: &[&str]) -> String {
    let out = std::process::Command::new("redis-cli")
        .arg("-s")
        .arg(&server.socket)
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "redis-cli {args:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn store(server: &RedisServer, durability: Durability) -> RedisStore {
    let mut opts = options(server.url(), Vec::new(), "durability-test".into());
    opts.durability = durability;
    opts.replicas_timeout = Duration::from_millis(200);
    RedisStore::new(opts).unwrap()
}

#[tokio::test]
async fn with_fsync_a_server_that_does_not_sync_every_write_is_not_ready_and_takes_no_write() {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let s = store(&server, Durability::Fsync);
    // The test server runs without persistence.
    let err = s.ready().await.unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    let text = err.chain().to_string();
    assert!(
        text.contains("appendonly no") && text.contains("appendfsync always"),
        "{text}"
    );
    let refused = s.claim(&key("k"), ttl(), None, NOW).await.unwrap_err();
    assert!(matches!(refused, StoreError::Unavailable(_)), "{refused:?}");
    assert_eq!(redis_cli(&server, &["dbsize"]), "0", "nothing written");

    // Every write synced: ready, and writes go through.
    redis_cli(&server, &["config", "set", "appendonly", "yes"]);
    redis_cli(&server, &["config", "set", "appendfsync", "always"]);
    s.ready().await.unwrap();
    assert!(matches!(
        s.claim(&key("k"), ttl(), None, NOW).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));

    // Syncing turned off again: seen by the next readiness check.
    redis_cli(&server, &["config", "set", "appendfsync", "everysec"]);
    assert!(s.ready().await.is_err());
    assert!(s.claim(&key("k2"), ttl(), None, NOW).await.is_err());
}

#[tokio::test]
async fn with_fsync_a_server_that_refuses_config_is_trusted() {
    let server = tokio::task::spawn_blocking(|| {
        RedisServer::start_with(&["--rename-command", "CONFIG", ""])
    })
    .await
    .unwrap();
    let s = store(&server, Durability::Fsync);
    s.ready().await.unwrap();
    assert!(matches!(
        s.claim(&key("k"), ttl(), None, NOW).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
}

#[tokio::test]
async fn with_replicas_a_write_is_answered_once_a_replica_has_it_and_503_without_one() {
    let port = free_port();
    let (master, mut replica) = tokio::task::spawn_blocking(move || {
        let p = port.to_string();
        let master = RedisServer::start_with(&["--port", &p, "--bind", "127.0.0.1"]);
        let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &p]);
        (master, replica)
    })
    .await
    .unwrap();
    // Until the replica has synced, nothing is acknowledged.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !redis_cli(&master, &["info", "replication"]).contains("state=online") {
        assert!(
            std::time::Instant::now() < deadline,
            "the replica never synced"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let s = store(&master, Durability::Replicas(1));
    s.ready().await.unwrap();
    let ClaimOutcome::Claimed { token, .. } = s.claim(&key("k"), ttl(), None, NOW).await.unwrap()
    else {
        panic!("claimed");
    };
    // The replica has it by the time the claim was answered.
    assert_eq!(
        redis_cli(&replica, &["hget", "{durability-test}:c:a/k", "t"]),
        token.to_hex()
    );

    // The replica gone: the write is not acknowledged.
    tokio::task::spawn_blocking(move || replica.stop())
        .await
        .unwrap();
    let err = s.claim(&key("k2"), ttl(), None, NOW).await.unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    assert!(
        err.chain().to_string().contains("0 of the 1 replicas"),
        "{}",
        err.chain()
    );
}
