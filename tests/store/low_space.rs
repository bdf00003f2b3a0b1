//! The free-space watermark (`storage.min_free_bytes`): below it writes
//! are refused and change nothing, reads are served, the engine's upkeep
//! goes on, and writes resume by themselves once space frees; the log is
//! checkpointed before what it holds stops fitting; a restart at the
//! watermark opens and serves. The free space the store reads is set by the
//! test's fault plan (the real-disk drill on a tmpfs is in `tests/service/disk_full.rs`).

use std::sync::Arc;
use std::time::Duration;

use dedupd::domain::{CreatedAt, Key, ScopedKey, Ttl};
use dedupd::store::inbox::{EventKey, Inbox, IngestOutcome, NewEvent};
use dedupd::store::keyspace::{KvRequest, KvResponse, SetCondition, SetExpiry};
use dedupd::store::redb::faults::FaultPlan;
use dedupd::store::redb::{OpenError, RedbOptions, RedbStore};
use dedupd::store::{ClaimOutcome, Store, StoreError};
use tempfile::TempDir;

const T: u64 = 1_800_000_000_000;
const MIB: u64 = 1024 * 1024;

fn key(k: &str) -> ScopedKey {
    ScopedKey::api(&Key::parse(k, "key").unwrap())
}

fn event(id: &str, body_bytes: usize) -> NewEvent {
    NewEvent {
        source: "sume".into(),
        event_id: id.into(),
        stream: None,
        created_at: CreatedAt::parse("2026-11-29T10:00:00Z", "created_at").unwrap(),
        received_at_ms: T,
        headers: Vec::new(),
        body: vec![b'x'; body_bytes],
    }
}

fn ttl() -> Ttl {
    Ttl::from_ms_unchecked(86_400_000)
}

/// A store whose disk reads as `free` bytes free, with an 8 MiB watermark.
fn open_at(path: &std::path::Path, plan: &Arc<FaultPlan>) -> RedbStore {
    let mut opts = RedbOptions::new(path);
    opts.min_free_bytes = 8 * MIB;
    opts.faults = Some(plan.clone());
    RedbStore::open(&opts).unwrap()
}

fn low(e: Result<impl std::fmt::Debug, StoreError>) -> (u64, u64) {
    match e {
        Err(StoreError::LowSpace { free, floor }) => (free, floor),
        other => panic!("expected LowSpace, got {other:?}"),
    }
}

#[tokio::test]
async fn below_the_watermark_writes_are_refused_reads_served_and_writes_resume_with_space() {
    let dir = TempDir::new().unwrap();
    let plan = FaultPlan::new();
    plan.set_free_bytes(Some(100 * MIB));
    let store = open_at(&dir.path().join("d.redb"), &plan);
    let inbox = store.inbox();
    let keyspace = store.keyspace();
    assert!(matches!(
        store.claim(&key("before"), ttl(), None, T).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    store.ready().await.unwrap();

    plan.set_free_bytes(Some(7 * MIB));
    let (free, floor) = low(store.claim(&key("refused"), ttl(), None, T).await);
    assert_eq!((free, floor), (7 * MIB, 8 * MIB));
    low(inbox.ingest(event("refused", 100), T).await);
    let set = KvRequest::Set {
        key: b"k".to_vec(),
        value: b"v".to_vec(),
        condition: SetCondition::Always,
        expiry: SetExpiry::Keep,
        get: false,
    };
    low(keyspace.submit(set, T).await.unwrap().await);
    let (free, _) = low(store.ready().await);
    assert_eq!(free, 7 * MIB, "readiness says why");
    // Reads are served all the while.
    assert!(store.get(&key("before"), T).await.unwrap().is_some());
    assert!(store.get(&key("refused"), T).await.unwrap().is_none());
    assert!(
        !inbox
            .knows_event(&EventKey::new("sume", "refused", None), T)
            .await
            .unwrap()
    );
    assert_eq!(keyspace.get(b"k".to_vec(), T).await.unwrap(), None);

    // Space back: ready at once, and writes go through.
    plan.set_free_bytes(Some(100 * MIB));
    store.ready().await.unwrap();
    assert!(matches!(
        store.claim(&key("after"), ttl(), None, T).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    assert_eq!(
        inbox.ingest(event("after", 100), T).await.unwrap(),
        IngestOutcome::Accepted
    );
    store.close().await;
}

#[tokio::test]
async fn the_engines_upkeep_goes_on_down_to_half_the_watermark() {
    let dir = TempDir::new().unwrap();
    let plan = FaultPlan::new();
    plan.set_free_bytes(Some(100 * MIB));
    let store = open_at(&dir.path().join("d.redb"), &plan);
    // Between half the watermark and the watermark: the reaper's passes
    // (they free room) run; a client's claim does not.
    plan.set_free_bytes(Some(6 * MIB));
    store.purge_expired(T, 100).await.unwrap();
    low(store.claim(&key("k"), ttl(), None, T).await);
    // Below half: nothing is written.
    plan.set_free_bytes(Some(3 * MIB));
    low(store.purge_expired(T, 100).await);
    store.close().await;
}

/// With 20 MiB free and an 8 MiB watermark, a log holding a few MiB of
/// bodies would crowd out the next: it is checkpointed into the file, and
/// writing goes on. Without the checkpoint the fifth body would be refused.
#[tokio::test]
async fn the_log_is_checkpointed_before_what_it_holds_crowds_out_writes() {
    let dir = TempDir::new().unwrap();
    let plan = FaultPlan::new();
    plan.set_free_bytes(Some(20 * MIB));
    let store = open_at(&dir.path().join("d.redb"), &plan);
    let inbox = store.inbox();
    for i in 0..24 {
        assert_eq!(
            inbox
                .ingest(event(&format!("e{i}"), 1024 * 1024), T)
                .await
                .unwrap(),
            IngestOutcome::Accepted,
            "event {i}"
        );
    }
    store.close().await;
}

#[tokio::test]
async fn a_restart_at_the_watermark_opens_and_serves_reads() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("d.redb");
    let plan = FaultPlan::new();
    plan.set_free_bytes(Some(100 * MIB));
    let store = open_at(&path, &plan);
    store.claim(&key("kept"), ttl(), None, T).await.unwrap();
    plan.set_free_bytes(Some(5 * MIB));
    store.close().await;
    let store = open_at(&path, &plan);
    assert!(store.get(&key("kept"), T).await.unwrap().is_some());
    low(store.claim(&key("new"), ttl(), None, T).await);
    store.close().await;
}

/// A log to replay needs room in the data file: with none, opening is
/// refused before anything is written, and works once there is room.
#[tokio::test]
async fn a_log_that_cannot_be_replayed_for_want_of_room_is_refused_until_there_is_room() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("d.redb");
    let plan = FaultPlan::new();
    plan.set_free_bytes(Some(100 * MIB));
    let mut opts = RedbOptions::new(&path);
    opts.faults = Some(plan.clone());
    opts.checkpoint_idle = Duration::from_secs(3600);
    opts.checkpoint_interval = Duration::from_secs(3600);
    let store = RedbStore::open(&opts).unwrap();
    let data = std::fs::read(&path).unwrap();
    store.claim(&key("logged"), ttl(), None, T).await.unwrap();
    let mut wal = path.as_os_str().to_owned();
    wal.push(".wal");
    let log = std::fs::read(&wal).unwrap();
    store.close().await;
    // As a crash left them: the claim only in the log.
    std::fs::write(&path, &data).unwrap();
    std::fs::write(&wal, &log).unwrap();

    plan.set_free_bytes(Some(0));
    let err = RedbStore::open(&opts).unwrap_err();
    assert!(matches!(err, OpenError::NoRoomToReplay { .. }), "{err}");
    assert!(err.to_string().contains("free some space"), "{err}");
    assert!(
        std::fs::read(&wal).unwrap() == log,
        "the log is left as it is"
    );
    plan.set_free_bytes(Some(100 * MIB));
    let store = RedbStore::open(&opts).unwrap();
    assert!(store.get(&key("logged"), T).await.unwrap().is_some());
    store.close().await;
}

#[tokio::test]
async fn a_stranger_s_keyspace_set_is_answered_low_space_too() {
    // The RESP listener maps this to Redis's MISCONF; here the store's
    // answer for the keyspace.
    let dir = TempDir::new().unwrap();
    let plan = FaultPlan::new();
    plan.set_free_bytes(Some(1));
    let store = open_at(&dir.path().join("d.redb"), &plan);
    let set = KvRequest::Set {
        key: b"k".to_vec(),
        value: vec![0; 10],
        condition: SetCondition::Always,
        expiry: SetExpiry::Keep,
        get: false,
    };
    let answer = store.keyspace().submit(set, T).await.unwrap().await;
    assert!(!matches!(answer, Ok(KvResponse::Set { .. })));
    low(answer);
    store.close().await;
}
