//! An event's attempt timeline in the data file: the last
//! `TIMELINE_ATTEMPTS` requests sent, oldest first, each with its time,
//! status, latency and error; written with the settle of the turn that sent
//! it, replayed from the log after a crash, and deleted with the event.

use std::time::Duration;

use dedupd::domain::CreatedAt;
use dedupd::store::Store;
use dedupd::store::inbox::{
    ATTEMPT_ERROR_BYTES, Attempt, EventKey, Inbox, NewEvent, Retention, Settle, TIMELINE_ATTEMPTS,
};
use dedupd::store::redb::{RedbOptions, RedbStore};
use tempfile::TempDir;

const T: u64 = 1_800_000_000_000;
const RETENTION: Retention = Retention {
    delivered_ms: 1_000,
    dead_ms: 5_000,
};

fn event(id: &str) -> NewEvent {
    NewEvent {
        source: "sume".into(),
        event_id: id.into(),
        stream: Some("run_1".into()),
        created_at: CreatedAt::from_unix_nanos(1),
        received_at_ms: T,
        headers: Vec::new(),
        body: b"{}".to_vec(),
    }
}

/// Attempt `n`, answered 503 (an error as long as `error_len`).
fn failed(n: u32, error_len: usize) -> Attempt {
    Attempt::new(
        n,
        T + u64::from(n),
        Some(503),
        Duration::from_micros(1_000 + u64::from(n)),
        Some(&"x".repeat(error_len)),
    )
}

fn retry(n: u32) -> Settle {
    Settle::Retry {
        retry_at: T + u64::from(n),
        error: format!("HTTP 503 ({n})"),
        attempted: true,
    }
}

fn wal_of(path: &std::path::Path) -> std::path::PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".wal");
    p.into()
}

fn keys_of(path: &std::path::Path) -> std::path::PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".keys");
    p.into()
}

fn second_of(path: &std::path::Path) -> std::path::PathBuf {
    let mut p = wal_of(path).into_os_string();
    p.push("2");
    p.into()
}

#[tokio::test]
async fn the_timeline_keeps_the_last_attempts_oldest_first_with_errors_cut() {
    let dir = TempDir::new().unwrap();
    let s = RedbStore::open(&RedbOptions::new(dir.path().join("t.redb"))).unwrap();
    let inbox = s.inbox();
    inbox.ingest(event("e"), T).await.unwrap();
    let e = inbox.inbox_event("sume", "e").await.unwrap().unwrap();
    assert!(e.timeline.is_empty(), "never attempted: {:?}", e.timeline);

    let total = u32::try_from(TIMELINE_ATTEMPTS).unwrap() + 3;
    for n in 1..=total {
        // A settle without a request (a busy claim, a paused source) adds
        // nothing to the timeline.
        inbox
            .settle(
                &EventKey::new("sume", "e", None),
                0,
                Settle::Retry {
                    retry_at: T,
                    error: "another instance is delivering this stream".into(),
                    attempted: false,
                },
                RETENTION,
                T,
            )
            .await
            .unwrap();
        inbox
            .settle_attempt(
                &EventKey::new("sume", "e", None),
                0,
                retry(n),
                failed(n, 5_000),
                RETENTION,
                T,
            )
            .await
            .unwrap();
    }
    let e = inbox.inbox_event("sume", "e").await.unwrap().unwrap();
    let numbers: Vec<u32> = e.timeline.iter().map(|a| a.attempt).collect();
    let first_kept = total - u32::try_from(TIMELINE_ATTEMPTS).unwrap() + 1;
    assert_eq!(numbers, (first_kept..=total).collect::<Vec<_>>());
    assert_eq!(e.attempts, total, "the count goes on past what is kept");
    let last = e.timeline.last().unwrap();
    assert_eq!(last.at_ms, T + u64::from(total));
    assert_eq!(last.status, Some(503));
    assert_eq!(last.latency_us, 1_000 + u64::from(total));
    let error = last.error.as_deref().unwrap();
    assert!(error.len() <= ATTEMPT_ERROR_BYTES, "{}", error.len());
    assert!(error.ends_with('…'), "a cut error says so: {error}");

    // A listing or the dispatcher's read does not carry it.
    let due = inbox
        .due_events(T + 1_000_000, vec![("sume".into(), 10)], u64::MAX)
        .await
        .unwrap();
    assert!(due[0].events.iter().all(|e| e.timeline.is_empty()));
    s.close().await;
}

#[tokio::test]
async fn the_delivering_attempt_is_kept_and_the_timeline_goes_with_the_reaped_event() {
    let dir = TempDir::new().unwrap();
    let s = RedbStore::open(&RedbOptions::new(dir.path().join("t.redb"))).unwrap();
    let inbox = s.inbox();
    inbox.ingest(event("e"), T).await.unwrap();
    inbox
        .settle_attempt(
            &EventKey::new("sume", "e", None),
            0,
            retry(1),
            failed(1, 8),
            RETENTION,
            T,
        )
        .await
        .unwrap();
    let ok = Attempt::new(2, T + 10, Some(204), Duration::from_micros(700), None);
    inbox
        .settle_delivered(
            &EventKey::new("sume", "e", None),
            0,
            None,
            Some(ok.clone()),
            RETENTION,
            T + 10,
        )
        .await
        .unwrap();
    let e = inbox.inbox_event("sume", "e").await.unwrap().unwrap();
    assert_eq!(e.timeline, vec![failed(1, 8), ok]);

    // A late outcome of a superseded turn is ignored, but the request it
    // sent is still shown: it reached the destination.
    let late = Attempt::new(1, T + 20, None, Duration::from_secs(10), Some("timed out"));
    inbox
        .settle_attempt(
            &EventKey::new("sume", "e", None),
            0,
            retry(3),
            late.clone(),
            RETENTION,
            T + 20,
        )
        .await
        .unwrap();
    let e = inbox.inbox_event("sume", "e").await.unwrap().unwrap();
    assert_eq!(e.status, dedupd::store::inbox::EventStatus::Delivered);
    assert_eq!(e.timeline.last(), Some(&late));

    // Reaped after its retention: row, body and timeline together.
    s.purge_expired(T + 10 + RETENTION.delivered_ms, 100)
        .await
        .unwrap();
    let left = s.inbox().inbox_indexes().await.unwrap();
    assert!(left.rows.is_empty());
    assert!(
        left.orphan_timelines.is_empty(),
        "{:?}",
        left.orphan_timelines
    );
    // An attempt for an event that is gone writes nothing.
    inbox
        .settle_attempt(
            &EventKey::new("sume", "e", None),
            0,
            retry(4),
            failed(4, 8),
            RETENTION,
            T + 30,
        )
        .await
        .unwrap();
    assert!(
        s.inbox()
            .inbox_indexes()
            .await
            .unwrap()
            .orphan_timelines
            .is_empty()
    );
    s.close().await;
}

#[tokio::test]
async fn after_a_crash_the_log_replays_every_acknowledged_attempt() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("t.redb");
    let mut opts = RedbOptions::new(&path);
    opts.checkpoint_idle = Duration::from_secs(3600);
    opts.checkpoint_interval = Duration::from_secs(3600);
    let s = RedbStore::open(&opts).unwrap();
    // The data file as a crash would leave it: nothing checkpointed yet.
    let data = std::fs::read(&path).unwrap();
    let inbox = s.inbox();
    inbox.ingest(event("e"), T).await.unwrap();
    for n in 1..=3 {
        inbox
            .settle_attempt(
                &EventKey::new("sume", "e", None),
                0,
                retry(n),
                failed(n, 20),
                RETENTION,
                T,
            )
            .await
            .unwrap();
    }
    let log = std::fs::read(wal_of(&path)).unwrap();
    // The key file (see `seal`): written as keys are lent, not with the
    // checkpoints.
    let keys = std::fs::read(keys_of(&path)).unwrap();
    // The log's second segment: no batch in it (nothing but the open
    // checkpointed), but the file says its log has two.
    let second = std::fs::read(second_of(&path)).unwrap();
    let before = inbox.inbox_event("sume", "e").await.unwrap().unwrap();
    s.close().await;

    let crashed = TempDir::new().unwrap();
    let path = crashed.path().join("t.redb");
    std::fs::write(&path, data).unwrap();
    std::fs::write(wal_of(&path), log).unwrap();
    std::fs::write(second_of(&path), second).unwrap();
    std::fs::write(keys_of(&path), keys).unwrap();
    let s = RedbStore::open(&RedbOptions::new(&path)).unwrap();
    let after = s.inbox().inbox_event("sume", "e").await.unwrap().unwrap();
    assert_eq!(after.timeline.len(), 3);
    assert_eq!(after, before);
    s.close().await;
}
