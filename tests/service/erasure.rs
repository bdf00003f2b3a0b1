//! Erasure erases from the files, not only from the index (issue 50): once
//! `DELETE /v1/sources/S/events/ID` answers, nobody reading the files under
//! the data directory can get the event's body or stored headers back, by
//! searching them for the bytes, or by opening every seal found in them
//! with every key in the key file. At once, after a clean stop, and after
//! a restart. On a source with destinations, for every destination's copy.
//! Nor from a backup taken after the erasure (one taken before holds it).
//! With the shared inbox in a real Redis (`appendonly yes`), from its AOF
//! and snapshot too, once the rewrite dedupd asks for is done.

use std::path::Path;

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use reqwest::{Method, StatusCode};
use serde_json::Value;

use crate::support::app::{TestApp, spawn_app_with, start_again};
use crate::support::gateway::{fan_out, invoice as event, post_with_customer as post};
use crate::support::receiver::{Behaviour, Receiver, eventually};

/// What the erased event's body carries (a personal datum).
const BODY_MARKER: &str = "alice.body.7f3c9e@example.com";
/// What one of its stored headers carries.
const HEADER_MARKER: &str = "alice-header-51d2ab";
/// What an event that is not erased carries: still readable.
const KEPT_MARKER: &str = "bob.kept.0c8d41@example.com";

/// Every file under `dir`, read whole.
fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(files(&path));
        } else if let Ok(bytes) = std::fs::read(&path) {
            out.push((path.display().to_string(), bytes));
        }
    }
    out
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// The keys a backup file holds (its keys frames).
fn backup_keys(bytes: &[u8]) -> Vec<[u8; 32]> {
    use dedupd::store::redb::backup::format::{FrameReader, Kind, keys};
    let Ok(mut frames) = FrameReader::new(bytes) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    while let Ok(Some(frame)) = frames.next_frame() {
        if frame.kind == Kind::Keys {
            for (_, key) in keys(&frame.payload).unwrap() {
                out.push(<[u8; 32]>::try_from(key).unwrap());
            }
        }
    }
    out
}

/// What an attacker holding every file under `dir` reads back that holds
/// `marker`: each file where it is in plain, and each seal found anywhere
/// (by its `DDSEAL1\0` prefix: slot, length, nonce, ciphertext) that opens
/// with a key of any key file or backup there (the one its slot names, or
/// any other) into plaintext holding it.
fn recoverable(dir: &Path, marker: &str) -> Vec<String> {
    let all = files(dir);
    let keys: Vec<[u8; 32]> = all
        .iter()
        .filter(|(name, _)| name.ends_with(".keys"))
        .flat_map(|(_, bytes)| {
            bytes
                .get(32..)
                .unwrap_or_default()
                .chunks_exact(32)
                .map(|k| <[u8; 32]>::try_from(k).unwrap())
                .collect::<Vec<_>>()
        })
        .chain(all.iter().flat_map(|(_, bytes)| backup_keys(bytes)))
        .collect();
    let mut found = Vec::new();
    for (name, bytes) in &all {
        if contains(bytes, marker.as_bytes()) {
            found.push(format!("{name}: in plain"));
        }
        let mut at = 0;
        while let Some(i) = bytes[at..].windows(8).position(|w| w == b"DDSEAL1\0") {
            let start = at + i;
            at = start + 1;
            let Some(header) = bytes.get(start..start + 32) else {
                continue;
            };
            let slot = u64::from_le_bytes(header[8..16].try_into().unwrap());
            let len = u32::from_le_bytes(header[16..20].try_into().unwrap()) as usize;
            let Some(sealed) = bytes.get(start + 32..start + 32 + len) else {
                continue;
            };
            let named = usize::try_from(slot).ok().and_then(|s| keys.get(s));
            for key in named.into_iter().chain(&keys) {
                let plain = Aes256Gcm::new(key.into()).decrypt(
                    Nonce::from_slice(&header[20..32]),
                    Payload {
                        msg: sealed,
                        aad: &header[..20],
                    },
                );
                if let Ok(plain) = plain
                    && contains(&plain, marker.as_bytes())
                {
                    found.push(format!(
                        "{name}: a seal at byte {start} (slot {slot}) opens"
                    ));
                    break;
                }
            }
        }
    }
    found
}

async fn erase(app: &TestApp, source: &str, id: &str) {
    let res = app
        .request(Method::DELETE, &format!("/v1/sources/{source}/events/{id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
}

/// A backup of `app` (`POST /v1/backup`) in the new directory `dir`.
async fn backup_to(app: &TestApp, dir: &Path) {
    let res = app
        .request(Method::POST, "/v1/backup")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    std::fs::create_dir(dir).unwrap();
    std::fs::write(dir.join("dedupd.backup"), res.bytes().await.unwrap()).unwrap();
}

async fn event_json(app: &TestApp, lane: &str, id: &str) -> Value {
    app.request(Method::GET, &format!("/v1/sources/{lane}/events/{id}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Neither marker of the erased event can be read back from `dir`.
fn assert_gone(dir: &Path, when: &str) {
    for marker in [BODY_MARKER, HEADER_MARKER] {
        let found = recoverable(dir, marker);
        assert!(found.is_empty(), "{when}: {marker} is readable: {found:?}");
    }
}

#[tokio::test]
async fn an_erased_event_cannot_be_read_back_from_any_file_of_the_data_file() {
    let billing = Receiver::start(Behaviour::Accept).await;
    let audit = Receiver::start(Behaviour::Accept).await;
    let s = fan_out(&billing.url, &audit.url);
    let app = spawn_app_with(move |l| {
        l.settings.sources.insert("sw".into(), s);
    })
    .await;
    let dir = app.dir.path().to_owned();
    post(&app, &event("inv-1", BODY_MARKER), HEADER_MARKER).await;
    post(&app, &event("inv-2", KEPT_MARKER), "bob").await;
    eventually("both delivered to both", || async {
        billing.received().len() == 2 && audit.received().len() == 2
    })
    .await;
    // A stop checkpoints them into the data file (before, they are in
    // the log): the erasure below must reach both.
    let (loaded, kept_dir, clock) = app.stop().await;
    let app = start_again(loaded, kept_dir, clock).await;
    // Stored and readable through the API, and through the files with
    // the key file (so the search below finds what is there).
    for lane in ["sw.billing", "sw.audit"] {
        let e = event_json(&app, lane, "inv-1").await;
        assert!(e["body"].as_str().unwrap().contains(BODY_MARKER), "{e}");
        assert!(e["headers"].to_string().contains(HEADER_MARKER), "{e}");
    }
    for marker in [BODY_MARKER, HEADER_MARKER] {
        assert!(!recoverable(&dir, marker).is_empty(), "{marker} is stored");
    }
    let backups = tempfile::TempDir::new().unwrap();
    let before = backups.path().join("before");
    backup_to(&app, &before).await;

    erase(&app, "sw", "inv-1").await;
    assert_gone(&dir, "at once");
    // A backup taken after the erasure holds neither the event nor its
    // key; one taken before holds both, for as long as it is kept (the
    // operations guide says so).
    let after = backups.path().join("after");
    backup_to(&app, &after).await;
    assert_gone(&after, "in a backup taken after it");
    assert!(!recoverable(&after, KEPT_MARKER).is_empty());
    for marker in [BODY_MARKER, HEADER_MARKER] {
        assert!(!recoverable(&before, marker).is_empty(), "{marker}");
    }
    for lane in ["sw.billing", "sw.audit"] {
        let e = event_json(&app, lane, "inv-1").await;
        assert_eq!(e["status"], "erased", "{e}");
        let kept = event_json(&app, lane, "inv-2").await;
        assert!(
            kept["body"].as_str().unwrap().contains(KEPT_MARKER),
            "{kept}"
        );
    }
    assert!(
        !recoverable(&dir, KEPT_MARKER).is_empty(),
        "the event not erased stays readable with its key"
    );

    let (loaded, kept_dir, clock) = app.stop().await;
    assert_gone(&dir, "after a clean stop");
    let app = start_again(loaded, kept_dir, clock).await;
    assert_gone(&dir, "after a restart");
    for lane in ["sw.billing", "sw.audit"] {
        let kept = event_json(&app, lane, "inv-2").await;
        assert!(
            kept["body"].as_str().unwrap().contains(KEPT_MARKER),
            "{kept}"
        );
        assert_eq!(event_json(&app, lane, "inv-1").await["status"], "erased");
    }
}

/// The same on the shared inbox in a real Redis that keeps an append-only
/// file (synced at every write) and snapshots: the erasure takes the body
/// out of Redis at once, and out of its files once the AOF rewrite and the
/// snapshot dedupd asks for are done (within `rewrite::EVERY` of the
/// erasure, plus the rewrite's own time: the test waits for them).
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_shared_inbox_an_erased_event_leaves_redis_and_its_files() {
    use crate::support::redis::RedisServer;

    let mut server = tokio::task::spawn_blocking(|| {
        RedisServer::start_with(&[
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--save",
            "3600 1",
        ])
    })
    .await
    .unwrap();
    let billing = Receiver::start(Behaviour::Accept).await;
    let audit = Receiver::start(Behaviour::Accept).await;
    let s = fan_out(&billing.url, &audit.url);
    let url = server.url();
    let app = spawn_app_with(move |l| {
        l.settings.storage.backend = dedupd::config::Backend::Redis;
        l.settings.storage.redis.url = dedupd::config::Secret::new(url);
        l.settings.gateway.inbox = dedupd::config::sources::InboxPlace::Shared;
        l.settings.gateway.inbox_buckets = 2;
        l.settings.sources.insert("sw".into(), s);
    })
    .await;
    post(&app, &event("inv-1", BODY_MARKER), HEADER_MARKER).await;
    post(&app, &event("inv-2", KEPT_MARKER), "bob").await;
    eventually("both delivered to both", || async {
        billing.received().len() == 2 && audit.received().len() == 2
    })
    .await;
    let redis_dir = server.dir().to_owned();
    // A snapshot taken before the erasure holds it too.
    let saved = std::process::Command::new("redis-cli")
        .args(["-s", server.socket.to_str().unwrap(), "save"])
        .output()
        .unwrap();
    assert!(saved.status.success());
    for marker in [BODY_MARKER, HEADER_MARKER] {
        assert!(
            !recoverable(&redis_dir, marker).is_empty(),
            "{marker} is in Redis's files"
        );
    }

    erase(&app, "sw", "inv-1").await;
    for lane in ["sw.billing", "sw.audit"] {
        let e = event_json(&app, lane, "inv-1").await;
        assert_eq!(e["status"], "erased", "{e}");
    }
    // dedupd's own data file never held it (the inbox is Redis's).
    assert_gone(app.dir.path(), "dedupd's data directory");
    // Redis rewrites its files in its own time: waited for.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while [BODY_MARKER, HEADER_MARKER]
        .iter()
        .any(|m| !recoverable(&redis_dir, m).is_empty())
    {
        assert!(
            std::time::Instant::now() < deadline,
            "still in Redis's files 60 s after the erasure: {:?}",
            recoverable(&redis_dir, BODY_MARKER)
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_gone(&redis_dir, "once Redis rewrote its files");
    assert!(
        !recoverable(&redis_dir, KEPT_MARKER).is_empty(),
        "the event not erased is still in Redis's files"
    );

    let _server = tokio::task::spawn_blocking(move || {
        server.shutdown();
        assert_gone(&redis_dir, "after Redis's clean stop");
        server.start_again();
        assert_gone(&redis_dir, "after Redis's restart");
        server
    })
    .await
    .unwrap();
    // Redis loaded the event not erased back from its files.
    app.retrying_until("dedupd reads Redis again", || async {
        let e = event_json(&app, "sw.billing", "inv-2").await;
        e["body"].as_str().is_some_and(|b| b.contains(KEPT_MARKER))
    })
    .await;
    assert_eq!(
        event_json(&app, "sw.audit", "inv-1").await["status"],
        "erased"
    );
}
