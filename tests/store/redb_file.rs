//! What only the redb backend has: the data file and its writer.

use std::sync::Arc;

use dedupd::domain::{Key, ScopedKey, Ttl};
use dedupd::store::Store;
use dedupd::store::inbox::Inbox;
use dedupd::store::redb::{OpenError, RedbOptions, RedbStore, SCHEMA_VERSION};
use tempfile::TempDir;

#[test]
fn a_file_with_an_unknown_schema_version_is_refused_with_a_clear_message() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("future.redb");
    {
        let db = redb::Database::create(&path).unwrap();
        let tx = db.begin_write().unwrap();
        set_schema_version(&tx, 99);
        tx.commit().unwrap();
    }
    let err = RedbStore::open(&RedbOptions::new(&path)).unwrap_err();
    assert!(
        matches!(err, OpenError::UnknownSchema { found: 99, .. }),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("schema version 99") && msg.contains("reads schema version 14"),
        "{msg}"
    );
}

/// The keyspace's rows as schema 6 keeps them: row id to (key, value,
/// expiry).
type KvRows = redb::TableDefinition<'static, u64, (&'static [u8], &'static [u8], Option<u64>)>;

/// Writes `version` into a hand-made file's `meta` table, as a release
/// with that schema would have.
fn set_schema_version(tx: &redb::WriteTransaction, version: u64) {
    let meta: redb::TableDefinition<&str, u64> = redb::TableDefinition::new("meta");
    tx.open_table(meta)
        .unwrap()
        .insert("schema_version", version)
        .unwrap();
}

/// Schema 1's inbox row, as the previous release wrote it.
type InboxRowV1<'a> = (
    u8,
    u64,
    i128,
    Option<&'a str>,
    u32,
    u64,
    Option<&'a str>,
    bool,
    &'a str,
    &'a [u8],
    u64,
    u64,
);

/// The earliest schema 1 inbox row: no lease generation.
type InboxRowNoLease<'a> = (
    u8,
    u64,
    i128,
    Option<&'a str>,
    u32,
    u64,
    Option<&'a str>,
    bool,
    &'a str,
    &'a [u8],
    u64,
);

const T1: u64 = 1_800_000_000_000;

/// Writes what a schema 1 release left: meta at version 1 and one pending
/// event `id` (received at `T1`, on `stream` if any) indexed as that
/// release did — its runnable entry keyed by time first. `insert_row` puts
/// the event's row into `inbox`, in the row format under test.
fn write_v1_file(
    path: &std::path::Path,
    id: &str,
    stream: Option<&str>,
    insert_row: impl FnOnce(&redb::WriteTransaction),
) {
    let db = redb::Database::create(path).unwrap();
    let tx = db.begin_write().unwrap();
    {
        set_schema_version(&tx, 1);
        insert_row(&tx);
        let status: redb::TableDefinition<(&str, u8, u64, &str), ()> =
            redb::TableDefinition::new("inbox_status");
        tx.open_table(status)
            .unwrap()
            .insert(("sume", 0, T1, id), ())
            .unwrap();
        if let Some(stream) = stream {
            let queue: redb::TableDefinition<(&str, &str, i128, u64, &str), ()> =
                redb::TableDefinition::new("inbox_queue");
            tx.open_table(queue)
                .unwrap()
                .insert(("sume", stream, 1_000, T1, id), ())
                .unwrap();
        }
        let due: redb::TableDefinition<(u64, &str, &str), ()> =
            redb::TableDefinition::new("inbox_due");
        tx.open_table(due)
            .unwrap()
            .insert((T1, "sume", id), ())
            .unwrap();
    }
    tx.commit().unwrap();
}

async fn runnable(s: &RedbStore) -> Vec<String> {
    s.inbox()
        .due_events(T1, vec![("sume".to_owned(), 10)], u64::MAX)
        .await
        .unwrap()
        .remove(0)
        .events
        .into_iter()
        .map(|e| e.event_id)
        .collect()
}

#[tokio::test]
async fn a_schema_1_file_is_migrated_and_its_pending_events_stay_runnable() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("v1.redb");
    write_v1_file(&path, "ev1", None, |tx| {
        let rows: redb::TableDefinition<(&str, &str), InboxRowV1<'static>> =
            redb::TableDefinition::new("inbox");
        let row: InboxRowV1<'_> = (
            0,
            T1,
            1_000,
            None,
            0,
            T1,
            None,
            false,
            "[]",
            b"{}".as_slice(),
            0,
            0,
        );
        tx.open_table(rows)
            .unwrap()
            .insert(("sume", "ev1"), row)
            .unwrap();
    });
    let s = RedbStore::open(&RedbOptions::new(&path)).unwrap();
    assert_eq!(runnable(&s).await, ["ev1"]);
    s.close().await;
    // Migrated once: it opens again as the current version.
    let s = RedbStore::open(&RedbOptions::new(&path)).unwrap();
    assert_eq!(runnable(&s).await, ["ev1"]);
    s.close().await;
}

#[tokio::test]
async fn an_early_schema_1_file_without_lease_generations_is_migrated_too() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("v1-early.redb");
    write_v1_file(&path, "early", Some("run_1"), |tx| {
        let rows: redb::TableDefinition<(&str, &str), InboxRowNoLease<'static>> =
            redb::TableDefinition::new("inbox");
        let row: InboxRowNoLease<'_> = (
            0,
            T1,
            1_000,
            Some("run_1"),
            2,
            T1,
            Some("HTTP 503"),
            false,
            "[]",
            b"{\"a\":1}".as_slice(),
            0,
        );
        tx.open_table(rows)
            .unwrap()
            .insert(("sume", "early"), row)
            .unwrap();
    });
    let s = RedbStore::open(&RedbOptions::new(&path)).unwrap();
    let e = s
        .inbox()
        .inbox_event("sume", "early")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (
            e.attempts,
            e.lease,
            e.body.as_slice(),
            e.last_error.as_deref()
        ),
        (2, 0, b"{\"a\":1}".as_slice(), Some("HTTP 503"))
    );
    assert_eq!(runnable(&s).await, ["early"]);
    s.close().await;
}

#[test]
fn a_redb_file_of_another_program_is_refused() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("other.redb");
    {
        let db = redb::Database::create(&path).unwrap();
        let tx = db.begin_write().unwrap();
        {
            let def: redb::TableDefinition<&str, &str> = redb::TableDefinition::new("users");
            tx.open_table(def).unwrap().insert("ann", "admin").unwrap();
        }
        tx.commit().unwrap();
    }
    let err = RedbStore::open(&RedbOptions::new(&path)).unwrap_err();
    assert!(matches!(err, OpenError::Foreign(_)), "{err}");
}

#[tokio::test]
async fn a_second_open_of_the_same_file_is_refused_until_the_first_closes() {
    let dir = TempDir::new().unwrap();
    let opts = RedbOptions::new(dir.path().join("d.redb"));
    let first = RedbStore::open(&opts).unwrap();
    let err = RedbStore::open(&opts).unwrap_err();
    assert!(matches!(err, OpenError::InUse(_)), "{err}");
    assert!(err.to_string().contains("already open"));
    first.close().await;
    RedbStore::open(&opts).unwrap().close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writes_share_commits() {
    let dir = TempDir::new().unwrap();
    let store = Arc::new(RedbStore::open(&RedbOptions::new(dir.path().join("g.redb"))).unwrap());
    let before = store.write_stats();
    let tasks: Vec<_> = (0..256)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let key = ScopedKey::api(&Key::parse(&format!("k{i}"), "key").unwrap());
                store
                    .claim(&key, Ttl::from_ms_unchecked(1_000), None, 1)
                    .await
                    .unwrap();
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let after = store.write_stats();
    assert_eq!(
        after.operations - before.operations,
        256,
        "every claim was answered after a commit"
    );
    assert!(
        after.commits - before.commits < 256,
        "256 concurrent claims took {} commits: none were batched",
        after.commits - before.commits
    );
}

mod inbox {
    use dedupd::domain::CreatedAt;
    use dedupd::store::Store;
    use dedupd::store::inbox::{
        EventKey, EventStatus, Inbox, IngestOutcome, ListOrder, NewEvent, RedeliverOutcome,
        Retention, Settle,
    };
    use dedupd::store::redb::{RedbOptions, RedbStore};
    use tempfile::TempDir;

    const T: u64 = 1_800_000_000_000;
    const RETENTION: Retention = Retention {
        delivered_ms: 1_000,
        dead_ms: 5_000,
    };

    fn event(id: &str, stream: Option<&str>, minute: u32) -> NewEvent {
        NewEvent {
            source: "sume".into(),
            event_id: id.into(),
            stream: stream.map(str::to_owned),
            created_at: CreatedAt::parse(&format!("2026-11-29T10:{minute:02}:00Z"), "created_at")
                .unwrap(),
            received_at_ms: T,
            headers: vec![("content-type".into(), "application/json".into())],
            body: b"{}".to_vec(),
        }
    }

    /// `due_events` shows what the file shows (an insert the writer still
    /// holds shows within `storage.commit_hold`): a read of what was
    /// acknowledged commits it first.
    async fn committed(s: &RedbStore) {
        s.inbox().inbox_sources().await.unwrap();
    }

    async fn due_ids(s: &RedbStore, now: u64) -> Vec<String> {
        committed(s).await;
        s.inbox()
            .due_events(now, vec![("sume".to_owned(), 100)], u64::MAX)
            .await
            .unwrap()
            .remove(0)
            .events
            .into_iter()
            .map(|e| e.event_id)
            .collect()
    }

    #[tokio::test]
    async fn only_the_oldest_pending_event_of_a_stream_is_runnable() {
        let dir = TempDir::new().unwrap();
        let s = RedbStore::open(&RedbOptions::new(dir.path().join("i.redb"))).unwrap();
        assert_eq!(
            s.inbox().ingest(event("b", Some("r"), 5), T).await.unwrap(),
            IngestOutcome::Accepted
        );
        assert_eq!(
            s.inbox().ingest(event("b", Some("r"), 5), T).await.unwrap(),
            IngestOutcome::Duplicate
        );
        s.inbox().ingest(event("x", None, 9), T).await.unwrap();
        assert_eq!(due_ids(&s, T).await, ["b", "x"]);
        // An older event of the stream arrives: it goes first, alone.
        s.inbox().ingest(event("a", Some("r"), 1), T).await.unwrap();
        let mut due = due_ids(&s, T).await;
        due.sort();
        assert_eq!(due, ["a", "x"]);
        // A failed attempt keeps it first, due later.
        let retry = Settle::Retry {
            retry_at: T + 500,
            error: "HTTP 500".into(),
            attempted: true,
        };
        s.inbox()
            .settle(&EventKey::new("sume", "a", None), 0, retry, RETENTION, T)
            .await
            .unwrap();
        assert_eq!(due_ids(&s, T).await, ["x"]);
        assert_eq!(due_ids(&s, T + 500).await, ["x", "a"]);
        s.inbox()
            .settle(
                &EventKey::new("sume", "a", None),
                0,
                Settle::Delivered { attempted: true },
                RETENTION,
                T + 600,
            )
            .await
            .unwrap();
        assert_eq!(due_ids(&s, T + 600).await, ["b", "x"]);
        let a = s.inbox().inbox_event("sume", "a").await.unwrap().unwrap();
        assert_eq!((a.status, a.attempts), (EventStatus::Delivered, 2));
        s.close().await;
    }

    #[tokio::test]
    async fn settled_events_are_reaped_after_their_retention_and_dead_ones_can_be_redelivered() {
        let dir = TempDir::new().unwrap();
        let s = RedbStore::open(&RedbOptions::new(dir.path().join("i.redb"))).unwrap();
        for id in ["ok", "gone", "stale"] {
            s.inbox().ingest(event(id, None, 1), T).await.unwrap();
        }
        s.inbox()
            .settle(
                &EventKey::new("sume", "ok", None),
                0,
                Settle::Delivered { attempted: true },
                RETENTION,
                T,
            )
            .await
            .unwrap();
        s.inbox()
            .settle(
                &EventKey::new("sume", "gone", None),
                0,
                Settle::Dead {
                    error: "down".into(),
                },
                RETENTION,
                T,
            )
            .await
            .unwrap();
        s.inbox()
            .settle(
                &EventKey::new("sume", "stale", None),
                0,
                Settle::Stale,
                RETENTION,
                T,
            )
            .await
            .unwrap();
        assert!(due_ids(&s, T + 10_000).await.is_empty());
        assert_eq!(
            s.inbox().redeliver("sume", "ok", T).await.unwrap(),
            RedeliverOutcome::NotRedeliverable(EventStatus::Delivered)
        );
        assert_eq!(
            s.inbox().redeliver("sume", "nope", T).await.unwrap(),
            RedeliverOutcome::NotFound
        );

        // Delivered and stale go after 1 s, dead after 5 s.
        let r = s.purge_expired(T + 1_000, 100).await.unwrap();
        assert_eq!(r.inbox, 2);
        assert!(s.inbox().inbox_event("sume", "ok").await.unwrap().is_none());
        assert!(
            s.inbox()
                .inbox_event("sume", "gone")
                .await
                .unwrap()
                .is_some()
        );
        let (dead, _) = s
            .inbox()
            .list_events("sume", EventStatus::Dead, ListOrder::OldestFirst, None, 10)
            .await
            .unwrap();
        assert_eq!(dead.len(), 1);

        // Redelivered, the dead event is pending again and no longer expires.
        assert_eq!(
            s.inbox()
                .redeliver("sume", "gone", T + 2_000)
                .await
                .unwrap(),
            RedeliverOutcome::Requeued
        );
        assert_eq!(due_ids(&s, T + 2_000).await, ["gone"]);
        let r = s.purge_expired(T + 60_000, 100).await.unwrap();
        assert_eq!(r.inbox, 0);
        let e = s
            .inbox()
            .inbox_event("sume", "gone")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (e.status, e.attempts, e.force),
            (EventStatus::Pending, 0, false),
            "a dead event is redelivered in order: it still yields to newer events"
        );
        s.close().await;
    }

    #[tokio::test]
    async fn a_delivered_event_moves_its_head_and_a_later_older_one_is_stale_at_lease() {
        use dedupd::domain::{Key, Namespace, ScopedKey};
        let dir = TempDir::new().unwrap();
        let s = RedbStore::open(&RedbOptions::new(dir.path().join("i.redb"))).unwrap();
        let ns = Namespace::Gateway("sume".into());
        let scoped = |k: &str| ScopedKey::new(&ns, &Key::parse(k, "k").unwrap());
        s.inbox()
            .ingest(event("new", Some("r"), 5), T)
            .await
            .unwrap();
        let leased = s
            .inbox()
            .lease(
                vec![(EventKey::new("sume", "new", None), T + 60_000)],
                Some(RETENTION),
                T,
            )
            .await
            .unwrap();
        assert!(leased.stale.is_empty());
        let generation = leased.leased[0].lease;
        let created = event("new", Some("r"), 5).created_at;
        s.inbox()
            .settle_delivered(
                &EventKey::new("sume", "new", None),
                generation,
                Some((scoped("r"), scoped("new"), created, 86_400_000)),
                None,
                RETENTION,
                T,
            )
            .await
            .unwrap();
        let head = s.head(&scoped("r"), T).await.unwrap().unwrap();
        assert_eq!(
            head.created_at, created,
            "delivered and head moved together"
        );
        let new = s.inbox().inbox_event("sume", "new").await.unwrap().unwrap();
        assert_eq!(new.status, EventStatus::Delivered);

        s.inbox()
            .ingest(event("old", Some("r"), 1), T)
            .await
            .unwrap();
        let leased = s
            .inbox()
            .lease(
                vec![(EventKey::new("sume", "old", None), T + 60_000)],
                Some(RETENTION),
                T,
            )
            .await
            .unwrap();
        assert!(leased.leased.is_empty());
        assert_eq!(leased.stale, [("sume".to_owned(), "old".to_owned())]);
        let old = s.inbox().inbox_event("sume", "old").await.unwrap().unwrap();
        assert_eq!(old.status, EventStatus::Stale);
        s.close().await;
    }

    #[tokio::test]
    async fn a_lease_takes_only_what_is_due_now_and_answers_the_current_attempts() {
        let dir = TempDir::new().unwrap();
        let s = RedbStore::open(&RedbOptions::new(dir.path().join("i.redb"))).unwrap();
        s.inbox().ingest(event("e", Some("r"), 1), T).await.unwrap();
        let lease = |now: u64| {
            let s = &s;
            async move {
                s.inbox()
                    .lease(
                        vec![(EventKey::new("sume", "e", None), now + 60_000)],
                        None,
                        now,
                    )
                    .await
                    .unwrap()
            }
        };
        let first = lease(T).await;
        assert_eq!(first.leased[0].attempts, 0);
        let retry = Settle::Retry {
            retry_at: T + 1_000,
            error: "HTTP 503".into(),
            attempted: true,
        };
        s.inbox()
            .settle(
                &EventKey::new("sume", "e", None),
                first.leased[0].lease,
                retry,
                RETENTION,
                T,
            )
            .await
            .unwrap();
        // A dispatcher that read the event before that settle asks again:
        // not due before its retry, nothing is leased.
        assert!(lease(T + 500).await.leased.is_empty());
        let again = lease(T + 1_000).await;
        assert_eq!(again.leased.len(), 1);
        assert_eq!(again.leased[0].attempts, 1, "what the row says now");
        assert!(!again.leased[0].force);
        s.close().await;
    }

    #[tokio::test]
    async fn due_events_reads_only_the_sources_asked_for_and_lists_every_source() {
        let dir = TempDir::new().unwrap();
        let s = RedbStore::open(&RedbOptions::new(dir.path().join("i.redb"))).unwrap();
        s.inbox().ingest(event("a", None, 1), T).await.unwrap();
        let mut other = event("b", None, 1);
        other.source = "gone".into();
        s.inbox().ingest(other, T).await.unwrap();
        committed(&s).await;
        let due = s
            .inbox()
            .due_events(T, vec![("sume".to_owned(), 10)], u64::MAX)
            .await
            .unwrap();
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].events.len(), 1);
        assert_eq!(due[0].events[0].source, "sume");
        assert_eq!(
            s.inbox().inbox_sources().await.unwrap(),
            [("gone".to_owned(), 1), ("sume".to_owned(), 1)]
        );
        assert!(s.inbox().has_source("gone").await.unwrap());
        assert!(!s.inbox().has_source("go").await.unwrap());
        // Pending events of a removed source go once old enough, and only
        // those of the sources named.
        assert_eq!(
            s.inbox()
                .purge_pending(vec!["gone".into()], T + 1, 100, T + 1)
                .await
                .unwrap(),
            1
        );
        assert_eq!(
            s.inbox().inbox_sources().await.unwrap(),
            [("sume".to_owned(), 1)]
        );
        s.close().await;
    }

    /// The dedupe window of the stores below, ms: longer than the delivered
    /// retention, shorter than the dead one.
    const WINDOW: u64 = 3_000;

    fn open_with_window(dir: &TempDir) -> RedbStore {
        let opts = RedbOptions {
            dedupe_window: std::time::Duration::from_millis(WINDOW),
            ..RedbOptions::new(dir.path().join("i.redb"))
        };
        RedbStore::open(&opts).unwrap()
    }

    async fn deliver(s: &RedbStore, id: &str, now: u64) {
        s.inbox()
            .settle(
                &EventKey::new("sume", id, None),
                0,
                Settle::Delivered { attempted: true },
                RETENTION,
                now,
            )
            .await
            .unwrap();
    }

    /// A reaped event leaves a record, not an event: its id stays a
    /// duplicate (nothing stored) until the window from its receipt ends,
    /// and nothing lists or counts it; then the reaper removes the record
    /// and the id is new again.
    #[tokio::test]
    async fn a_reaped_event_stays_a_duplicate_until_its_dedupe_window_from_receipt_ends() {
        let dir = TempDir::new().unwrap();
        let s = open_with_window(&dir);
        s.inbox().ingest(event("a", None, 1), T).await.unwrap();
        deliver(&s, "a", T + 500).await;
        let r = s.purge_expired(T + 1_500, 100).await.unwrap();
        assert_eq!((r.inbox, r.dedupe, r.more), (1, 0, false));
        assert!(s.inbox().inbox_event("sume", "a").await.unwrap().is_none());
        let left = s.inbox().inbox_indexes().await.unwrap();
        assert!(left.rows.is_empty() && left.status.is_empty() && left.expiry.is_empty());
        assert_eq!(left.dedupe, [("sume".into(), "a".into(), T + WINDOW)]);
        assert_eq!(
            left.dedupe_expiry,
            [(T + WINDOW, "sume".into(), "a".into())]
        );
        // Not an event: not listed, not counted, the source holds none.
        let (delivered, _) = s
            .inbox()
            .list_events(
                "sume",
                EventStatus::Delivered,
                ListOrder::OldestFirst,
                None,
                10,
            )
            .await
            .unwrap();
        assert!(delivered.is_empty());
        assert!(s.inbox().inbox_summary().await.unwrap().is_empty());
        assert!(s.inbox().inbox_sources().await.unwrap().is_empty());
        assert!(!s.inbox().has_source("sume").await.unwrap());
        assert_eq!(s.next_expiry().await.unwrap(), Some(T + WINDOW));

        // A repeat within the window is a duplicate and is not stored.
        for now in [T + 1_500, T + WINDOW - 1] {
            assert!(
                s.inbox()
                    .knows_event(&EventKey::new("sume", "a", None), now)
                    .await
                    .unwrap()
            );
            assert_eq!(
                s.inbox().ingest(event("a", None, 1), now).await.unwrap(),
                IngestOutcome::Duplicate
            );
        }
        assert!(s.inbox().inbox_event("sume", "a").await.unwrap().is_none());
        assert!(due_ids(&s, T + WINDOW).await.is_empty());
        let r = s.purge_expired(T + WINDOW - 1, 100).await.unwrap();
        assert_eq!((r.dedupe, r.more), (0, false), "not due before its end");

        // Then the reaper removes the record, and the id is new.
        assert!(
            !s.inbox()
                .knows_event(&EventKey::new("sume", "a", None), T + WINDOW)
                .await
                .unwrap()
        );
        let r = s.purge_expired(T + WINDOW, 100).await.unwrap();
        assert_eq!((r.inbox, r.dedupe, r.more), (0, 1, false));
        let left = s.inbox().inbox_indexes().await.unwrap();
        assert!(left.dedupe.is_empty() && left.dedupe_expiry.is_empty());
        assert_eq!(s.next_expiry().await.unwrap(), None);
        assert_eq!(
            s.inbox()
                .ingest(event("a", None, 1), T + WINDOW)
                .await
                .unwrap(),
            IngestOutcome::Accepted
        );
        s.close().await;
    }

    /// The window counts from receipt: an event kept past it (dead events
    /// here) leaves no record, its row having protected it all along; an
    /// event of a removed source purged while pending leaves none either.
    #[tokio::test]
    async fn only_events_reaped_within_the_window_leave_a_record() {
        let dir = TempDir::new().unwrap();
        let s = open_with_window(&dir);
        s.inbox().ingest(event("dead", None, 1), T).await.unwrap();
        s.inbox()
            .settle(
                &EventKey::new("sume", "dead", None),
                0,
                Settle::Dead {
                    error: "down".into(),
                },
                RETENTION,
                T,
            )
            .await
            .unwrap();
        let mut orphan = event("p", None, 1);
        orphan.source = "gone".into();
        s.inbox().ingest(orphan.clone(), T).await.unwrap();
        assert_eq!(
            s.inbox()
                .ingest(event("dead", None, 1), T + WINDOW)
                .await
                .unwrap(),
            IngestOutcome::Duplicate,
            "the row protects it past the window"
        );
        let r = s.purge_expired(T + 5_000, 100).await.unwrap();
        assert_eq!((r.inbox, r.dedupe), (1, 0));
        assert_eq!(
            s.inbox()
                .purge_pending(vec!["gone".into()], T + 1, 100, T + 5_000)
                .await
                .unwrap(),
            1
        );
        let left = s.inbox().inbox_indexes().await.unwrap();
        assert!(left.rows.is_empty() && left.dedupe.is_empty(), "{left:?}");
        assert_eq!(
            s.inbox()
                .ingest(event("dead", None, 1), T + 5_000)
                .await
                .unwrap(),
            IngestOutcome::Accepted
        );
        assert_eq!(
            s.inbox().ingest(orphan, T + 5_000).await.unwrap(),
            IngestOutcome::Accepted
        );
        s.close().await;
    }

    /// A record past its window that the reaper has not reached yet does
    /// not make its id a duplicate: the new event takes its place (record
    /// and index entry go), and the reaper then has nothing left of it.
    #[tokio::test]
    async fn an_expired_record_not_yet_reaped_gives_way_to_the_new_event() {
        let dir = TempDir::new().unwrap();
        let s = open_with_window(&dir);
        s.inbox().ingest(event("a", None, 1), T).await.unwrap();
        deliver(&s, "a", T).await;
        s.purge_expired(T + 1_000, 100).await.unwrap();
        assert_eq!(
            s.inbox()
                .ingest(event("a", None, 1), T + WINDOW)
                .await
                .unwrap(),
            IngestOutcome::Accepted
        );
        let left = s.inbox().inbox_indexes().await.unwrap();
        assert_eq!(left.rows.len(), 1);
        assert!(
            left.dedupe.is_empty() && left.dedupe_expiry.is_empty(),
            "{left:?}"
        );
        let r = s.purge_expired(T + WINDOW, 100).await.unwrap();
        assert_eq!((r.inbox, r.dedupe, r.more), (0, 0, false));
        let e = s.inbox().inbox_event("sume", "a").await.unwrap().unwrap();
        assert_eq!(e.status, EventStatus::Pending);
        s.close().await;
    }

    /// Records are removed in expiry order, in batches of the reaper's
    /// size shared with everything else it reaps, and a restart (a replay
    /// of the log) keeps them.
    #[tokio::test]
    async fn dedupe_records_are_reaped_in_expiry_order_in_bounded_batches() {
        let dir = TempDir::new().unwrap();
        let mut s = open_with_window(&dir);
        // 250 events received 1 ms apart, newest first by id, delivered
        // together: their records expire in receipt order.
        for i in 0..250u64 {
            let mut e = event(&format!("e{:03}", 249 - i), None, 1);
            e.received_at_ms = T + i;
            s.inbox().ingest(e, T + i).await.unwrap();
        }
        for i in 0..250u64 {
            deliver(&s, &format!("e{:03}", 249 - i), T + 250).await;
        }
        let mut reaped = 0;
        loop {
            let r = s.purge_expired(T + 1_250, 100).await.unwrap();
            assert!(r.inbox <= 100 && r.dedupe == 0, "{r:?}");
            reaped += r.inbox;
            if !r.more {
                break;
            }
        }
        assert_eq!(reaped, 250);
        s.close().await;
        s = open_with_window(&dir);
        assert_eq!(s.inbox().inbox_indexes().await.unwrap().dedupe.len(), 250);

        // Ten more events reaped at the same pass as the first records.
        for i in 0..10u64 {
            let id = format!("late{i}");
            let mut e = event(&id, None, 1);
            e.received_at_ms = T + WINDOW;
            s.inbox().ingest(e, T + WINDOW).await.unwrap();
            deliver(&s, &id, T + WINDOW).await;
        }
        let end = T + WINDOW + 1_000;
        assert_eq!(s.next_expiry().await.unwrap(), Some(T + WINDOW));
        let r = s.purge_expired(end, 100).await.unwrap();
        assert_eq!((r.inbox, r.dedupe, r.more), (10, 90, true));
        let left = s.inbox().inbox_indexes().await.unwrap().dedupe;
        // The 90 received first (ids e249 down to e160) went first.
        let mut want: Vec<String> = (0..160).map(|i| format!("e{i:03}")).collect();
        want.extend((0..10).map(|i| format!("late{i}")));
        want.sort();
        let mut got: Vec<String> = left.into_iter().map(|(_, id, _)| id).collect();
        got.sort();
        assert_eq!(got, want);
        let r = s.purge_expired(end, 100).await.unwrap();
        assert_eq!((r.dedupe, r.more), (100, true));
        let r = s.purge_expired(end, 100).await.unwrap();
        assert_eq!((r.dedupe, r.more), (60, false));
        let left = s.inbox().inbox_indexes().await.unwrap();
        assert_eq!(
            left.dedupe
                .iter()
                .map(|(_, id, _)| id.as_str())
                .collect::<Vec<_>>(),
            (0..10).map(|i| format!("late{i}")).collect::<Vec<_>>(),
            "the late events' records wait for their own window"
        );
        assert_eq!(left.dedupe_expiry.len(), 10);
        s.close().await;
    }
}

#[tokio::test]
async fn a_schema_3_file_gains_the_keyspace_tables_and_keeps_its_claims() {
    use dedupd::store::keyspace::{KvRequest, KvResponse, SetCondition, SetExpiry};
    let dir = TempDir::new().unwrap();
    let opts = RedbOptions::new(dir.path().join("v3.redb"));
    let key = ScopedKey::api(&Key::parse("kept", "key").unwrap());
    let ttl = Ttl::from_ms_unchecked(60_000);
    {
        let s = RedbStore::open(&opts).unwrap();
        s.claim(&key, ttl, None, 1_000).await.unwrap();
        s.close().await;
    }
    // As the previous release left it: version 3, no keyspace tables.
    {
        let db = redb::Database::create(&opts.path).unwrap();
        let tx = db.begin_write().unwrap();
        let kv: KvRows = redb::TableDefinition::new("kv_rows");
        let kv_expiry: redb::TableDefinition<(u64, u64), ()> =
            redb::TableDefinition::new("kv_row_expiry");
        assert!(tx.delete_table(kv).unwrap());
        assert!(tx.delete_table(kv_expiry).unwrap());
        set_schema_version(&tx, 3);
        tx.commit().unwrap();
    }
    let s = RedbStore::open(&opts).unwrap();
    assert!(
        s.get(&key, 2_000).await.unwrap().is_some(),
        "the claim is kept"
    );
    let set = KvRequest::Set {
        key: b"k".to_vec(),
        value: b"v".to_vec(),
        condition: SetCondition::IfAbsent,
        expiry: SetExpiry::At(10_000),
        get: false,
    };
    let answer = s
        .keyspace()
        .submit(set, 2_000)
        .await
        .unwrap()
        .await
        .unwrap();
    assert_eq!(
        answer,
        KvResponse::Set {
            written: true,
            old: None
        }
    );
    assert_eq!(
        s.keyspace()
            .count(vec![b"k".to_vec()], 2_000)
            .await
            .unwrap(),
        1
    );
    s.close().await;
    assert_eq!(stored_schema(&opts.path).0, SCHEMA_VERSION);
}

#[tokio::test]
async fn a_schema_4_file_keeps_every_event_whole_once_bodies_move_to_their_own_table() {
    use dedupd::store::inbox::{EventKey, EventStatus, Inbox, ListOrder, Retention, Settle};
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("v4.redb");
    let body = vec![42u8; 300 * 1024];
    let headers = r#"[["x-sume-signature","t=1,v1=ab"]]"#;
    // As the previous release left it: version 4, each row with its
    // headers and body; one pending event and one dead one.
    {
        let db = redb::Database::create(&path).unwrap();
        let tx = db.begin_write().unwrap();
        {
            set_schema_version(&tx, 4);
            let rows: redb::TableDefinition<(&str, &str), InboxRowV1<'static>> =
                redb::TableDefinition::new("inbox");
            let mut rows = tx.open_table(rows).unwrap();
            rows.insert(
                ("sume", "pending"),
                (
                    0,
                    T1,
                    1_000,
                    None,
                    0,
                    T1,
                    None,
                    false,
                    headers,
                    body.as_slice(),
                    0,
                    3,
                ),
            )
            .unwrap();
            rows.insert(
                ("sume", "dead"),
                (
                    3,
                    T1,
                    2_000,
                    None,
                    5,
                    T1,
                    Some("HTTP 500"),
                    false,
                    "[]",
                    b"{}".as_slice(),
                    T1 + 60_000,
                    7,
                ),
            )
            .unwrap();
            let status: redb::TableDefinition<(&str, u8, u64, &str), ()> =
                redb::TableDefinition::new("inbox_status");
            let mut status = tx.open_table(status).unwrap();
            status.insert(("sume", 0, T1, "pending"), ()).unwrap();
            status.insert(("sume", 3, T1, "dead"), ()).unwrap();
            let runnable: redb::TableDefinition<(&str, u64, &str), ()> =
                redb::TableDefinition::new("inbox_runnable");
            tx.open_table(runnable)
                .unwrap()
                .insert(("sume", T1, "pending"), ())
                .unwrap();
            let expiry: redb::TableDefinition<(u64, &str, &str), ()> =
                redb::TableDefinition::new("inbox_expiry");
            tx.open_table(expiry)
                .unwrap()
                .insert((T1 + 60_000, "sume", "dead"), ())
                .unwrap();
        }
        tx.commit().unwrap();
    }
    let s = RedbStore::open(&RedbOptions::new(&path)).unwrap();
    let due = s
        .inbox()
        .due_events(T1, vec![("sume".to_owned(), 10)], u64::MAX)
        .await
        .unwrap()
        .remove(0)
        .events;
    assert_eq!(due.len(), 1);
    let e = &due[0];
    assert_eq!((e.event_id.as_str(), e.lease), ("pending", 3));
    assert_eq!(e.body, body, "the body survived the move");
    assert_eq!(
        e.headers,
        [("x-sume-signature".to_owned(), "t=1,v1=ab".to_owned())]
    );
    let dead = s
        .inbox()
        .inbox_event("sume", "dead")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(dead.status, EventStatus::Dead);
    assert_eq!(dead.last_error.as_deref(), Some("HTTP 500"));
    assert_eq!((dead.attempts, dead.body.as_slice()), (5, b"{}".as_slice()));
    let (listed, _) = s
        .inbox()
        .list_events(
            "sume",
            EventStatus::Pending,
            ListOrder::OldestFirst,
            None,
            10,
        )
        .await
        .unwrap();
    assert_eq!(listed[0].body_bytes, body.len());
    // It delivers as before; settled events are reaped whole, body too.
    let retention = Retention {
        delivered_ms: 1,
        dead_ms: 1,
    };
    let leased = s
        .inbox()
        .lease(
            vec![(EventKey::new("sume", "pending", None), T1 + 30_000)],
            None,
            T1,
        )
        .await
        .unwrap();
    let lease = leased.leased[0].lease;
    s.inbox()
        .settle(
            &EventKey::new("sume", "pending", None),
            lease,
            Settle::Delivered { attempted: true },
            retention,
            T1,
        )
        .await
        .unwrap();
    s.purge_expired(T1 + 120_000, 100).await.unwrap();
    let left = s.inbox().inbox_indexes().await.unwrap();
    assert!(left.rows.is_empty(), "{:?}", left.rows);
    assert!(left.orphan_bodies.is_empty(), "{:?}", left.orphan_bodies);
    s.close().await;

    let (version, tables) = stored_schema(&path);
    assert_eq!(version, SCHEMA_VERSION);
    assert!(!tables.contains(&"inbox".to_owned()), "{tables:?}");
}

#[tokio::test]
async fn a_schema_5_keyspace_moves_to_row_ids_with_every_value_and_expiry() {
    use dedupd::store::keyspace::{KvRequest, KvResponse, SetCondition, SetExpiry};
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("v5.redb");
    let big = vec![7u8; 5000];
    {
        let s = RedbStore::open(&RedbOptions::new(&path)).unwrap();
        s.close().await;
    }
    // As the previous release left it: version 5, rows keyed by the key,
    // an expiry index keyed by (expiry, key).
    {
        let db = redb::Database::create(&path).unwrap();
        let tx = db.begin_write().unwrap();
        let rows: KvRows = redb::TableDefinition::new("kv_rows");
        let index: redb::TableDefinition<(u64, u64), ()> =
            redb::TableDefinition::new("kv_row_expiry");
        assert!(tx.delete_table(rows).unwrap());
        assert!(tx.delete_table(index).unwrap());
        let kv: redb::TableDefinition<&[u8], (&[u8], Option<u64>)> =
            redb::TableDefinition::new("kv");
        let kv_expiry: redb::TableDefinition<(u64, &[u8]), ()> =
            redb::TableDefinition::new("kv_expiry");
        {
            let mut kv = tx.open_table(kv).unwrap();
            let mut kv_expiry = tx.open_table(kv_expiry).unwrap();
            kv.insert(b"forever".as_slice(), (b"v1".as_slice(), None))
                .unwrap();
            kv.insert(b"big".as_slice(), (big.as_slice(), Some(50_000)))
                .unwrap();
            kv_expiry.insert((50_000, b"big".as_slice()), ()).unwrap();
            kv.insert(b"soon".as_slice(), (b"v3".as_slice(), Some(3_000)))
                .unwrap();
            kv_expiry.insert((3_000, b"soon".as_slice()), ()).unwrap();
        }
        set_schema_version(&tx, 5);
        tx.commit().unwrap();
    }
    let s = RedbStore::open(&RedbOptions::new(&path)).unwrap();
    let keyspace = s.keyspace();
    let get = |k: &'static [u8], now| keyspace.get(k.to_vec(), now);
    let forever = get(b"forever", 2_000).await.unwrap().unwrap();
    assert_eq!(
        (forever.value, forever.expires_at_ms),
        (b"v1".to_vec(), None)
    );
    let stored = get(b"big", 2_000).await.unwrap().unwrap();
    assert_eq!(
        (stored.value, stored.expires_at_ms),
        (big.clone(), Some(50_000))
    );
    assert_eq!(get(b"soon", 2_000).await.unwrap().unwrap().value, b"v3");
    // Expiries still work: `soon` is gone at 3 000 and the reaper removes
    // it; a new key lands after the moved ones, and NX sees the old keys.
    assert!(get(b"soon", 3_000).await.unwrap().is_none());
    assert_eq!(s.purge_expired(3_000, 100).await.unwrap().kv, 1);
    let set = |key: &[u8]| KvRequest::Set {
        key: key.to_vec(),
        value: b"new".to_vec(),
        condition: SetCondition::IfAbsent,
        expiry: SetExpiry::At(60_000),
        get: false,
    };
    let refused = s
        .keyspace()
        .submit(set(b"forever"), 3_000)
        .await
        .unwrap()
        .await
        .unwrap();
    assert_eq!(
        refused,
        KvResponse::Set {
            written: false,
            old: None
        }
    );
    let added = s
        .keyspace()
        .submit(set(b"fresh"), 3_000)
        .await
        .unwrap()
        .await
        .unwrap();
    assert_eq!(
        added,
        KvResponse::Set {
            written: true,
            old: None
        }
    );
    s.close().await;

    let (version, tables) = stored_schema(&path);
    assert_eq!(version, SCHEMA_VERSION);
    assert!(!tables.contains(&"kv".to_owned()), "{tables:?}");
    assert!(!tables.contains(&"kv_expiry".to_owned()), "{tables:?}");
    let s = RedbStore::open(&RedbOptions::new(&path)).unwrap();
    assert_eq!(
        s.keyspace()
            .count(
                vec![
                    b"forever".to_vec(),
                    b"big".to_vec(),
                    b"soon".to_vec(),
                    b"fresh".to_vec()
                ],
                3_000
            )
            .await
            .unwrap(),
        3
    );
    let fresh = s
        .keyspace()
        .get(b"fresh".to_vec(), 3_000)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(fresh.value, b"new");
    s.close().await;
}

/// A file of the previous release (schema 6: no dedupe records) opens,
/// keeps its events, gains the record tables, and from then on a reaped
/// event's id stays a duplicate.
#[tokio::test]
async fn a_schema_6_file_gains_the_dedupe_tables_and_its_reaped_events_stay_duplicates() {
    use dedupd::store::inbox::{
        EventKey, EventStatus, Inbox, IngestOutcome, NewEvent, Retention, Settle,
    };
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("v6.redb");
    let event = |id: &str| NewEvent {
        source: "sume".into(),
        event_id: id.into(),
        stream: None,
        created_at: dedupd::domain::CreatedAt::from_unix_nanos(0),
        received_at_ms: T1,
        headers: Vec::new(),
        body: b"{}".to_vec(),
    };
    let retention = Retention {
        delivered_ms: 1_000,
        dead_ms: 1_000,
    };
    {
        let s = RedbStore::open(&RedbOptions::new(&path)).unwrap();
        for id in ["pending", "done"] {
            s.inbox().ingest(event(id), T1).await.unwrap();
        }
        s.inbox()
            .settle(
                &EventKey::new("sume", "done", None),
                0,
                Settle::Delivered { attempted: true },
                retention,
                T1,
            )
            .await
            .unwrap();
        s.close().await;
    }
    // As the previous release left it: version 6, no dedupe tables.
    {
        let db = redb::Database::create(&path).unwrap();
        let tx = db.begin_write().unwrap();
        let records: redb::TableDefinition<(&str, &str), u64> =
            redb::TableDefinition::new("inbox_dedupe");
        let index: redb::TableDefinition<(u64, &str, &str), ()> =
            redb::TableDefinition::new("inbox_dedupe_expiry");
        assert!(tx.delete_table(records).unwrap());
        assert!(tx.delete_table(index).unwrap());
        set_schema_version(&tx, 6);
        tx.commit().unwrap();
    }
    let s = RedbStore::open(&RedbOptions::new(&path)).unwrap();
    let pending = s
        .inbox()
        .inbox_event("sume", "pending")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(pending.status, EventStatus::Pending);
    assert!(
        s.inbox()
            .knows_event(&EventKey::new("sume", "pending", None), T1)
            .await
            .unwrap()
    );
    let r = s.purge_expired(T1 + 1_000, 100).await.unwrap();
    assert_eq!(r.inbox, 1);
    assert_eq!(
        s.inbox().ingest(event("done"), T1 + 2_000).await.unwrap(),
        IngestOutcome::Duplicate,
        "reaped, but within the window"
    );
    s.close().await;
    let (version, tables) = stored_schema(&path);
    assert_eq!(version, SCHEMA_VERSION);
    for table in ["inbox_dedupe", "inbox_dedupe_expiry", "inbox_attempts"] {
        assert!(tables.contains(&table.to_owned()), "{tables:?}");
    }
}

/// The schema version a closed file records, and its tables' names.
fn stored_schema(path: &std::path::Path) -> (u64, Vec<String>) {
    let db = redb::Database::create(path).unwrap();
    let tx = redb::ReadableDatabase::begin_read(&db).unwrap();
    let tables = tx
        .list_tables()
        .unwrap()
        .map(|t| redb::TableHandle::name(&t).to_owned())
        .collect();
    let meta: redb::TableDefinition<&str, u64> = redb::TableDefinition::new("meta");
    let version = tx
        .open_table(meta)
        .unwrap()
        .get("schema_version")
        .unwrap()
        .unwrap()
        .value();
    (version, tables)
}

/// A claim row that cannot be read (a file written by hand, or damaged:
/// a value too short to be a claim) is an error for that key, never a
/// panic, and later claims of other keys go on. (A write of it fails the
/// batch it ran in, as any error inside a transaction does.)
#[tokio::test]
async fn a_claim_row_that_cannot_be_read_is_an_error_and_the_rest_goes_on() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("bad-row.redb");
    let bad = ScopedKey::api(&Key::parse("bad", "key").unwrap());
    let good = ScopedKey::api(&Key::parse("good", "key").unwrap());
    let ttl = Ttl::from_ms_unchecked(60_000);
    {
        let s = RedbStore::open(&RedbOptions::new(&path)).unwrap();
        s.claim(&good, ttl, None, 1_000).await.unwrap();
        s.close().await;
    }
    {
        let db = redb::Database::create(&path).unwrap();
        let tx = db.begin_write().unwrap();
        let rows: KvRows = redb::TableDefinition::new("claim_rows");
        tx.open_table(rows)
            .unwrap()
            .insert(
                1_000_000,
                (bad.as_str().as_bytes(), &[1u8, 2, 3][..], Some(61_000)),
            )
            .unwrap();
        tx.commit().unwrap();
    }
    let s = RedbStore::open(&RedbOptions::new(&path)).unwrap();
    assert!(
        s.get(&bad, 1_000).await.is_err(),
        "the damaged row reads as an error"
    );
    assert!(s.claim(&bad, ttl, None, 1_000).await.is_err());
    assert!(
        s.get(&good, 1_000).await.unwrap().is_some(),
        "the others read"
    );
    let other = ScopedKey::api(&Key::parse("other", "key").unwrap());
    assert!(matches!(
        s.claim(&other, ttl, None, 1_000).await.unwrap(),
        dedupd::store::ClaimOutcome::Claimed { .. }
    ));
    s.close().await;
}

/// The reaper trusts a claim's row over its expiry index: an index entry
/// whose row now expires at another time (as a file written by a bug or by
/// hand could hold) removes only itself, and the claim lives on until its
/// own expiry.
#[tokio::test]
async fn a_stray_expiry_entry_does_not_reap_a_claim_that_expires_later() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("stray.redb");
    let key = ScopedKey::api(&Key::parse("order-1", "key").unwrap());
    let fence = {
        let s = RedbStore::open(&RedbOptions::new(&path)).unwrap();
        s.claim(&key, Ttl::from_ms_unchecked(60_000), None, 1_000)
            .await
            .unwrap();
        let fence = s.get(&key, 1_000).await.unwrap().unwrap().fence;
        s.close().await;
        fence
    };
    {
        let db = redb::Database::create(&path).unwrap();
        let tx = db.begin_write().unwrap();
        // The claim's row id, from the claims' rows (by row id).
        let rows: KvRows = redb::TableDefinition::new("claim_rows");
        let id = {
            use redb::ReadableTable as _;
            let rows = tx.open_table(rows).unwrap();
            let mut found = rows
                .iter()
                .unwrap()
                .map(|e| e.unwrap())
                .filter_map(|(id, row)| {
                    (row.value().0 == key.as_str().as_bytes()).then(|| id.value())
                });
            found.next().expect("the claim's row")
        };
        let index: redb::TableDefinition<(u64, u64), ()> =
            redb::TableDefinition::new("claim_row_expiry");
        tx.open_table(index)
            .unwrap()
            .insert((2_000, id), ())
            .unwrap();
        tx.commit().unwrap();
    }
    let s = RedbStore::open(&RedbOptions::new(&path)).unwrap();
    let r = s.purge_expired(5_000, 100).await.unwrap();
    assert_eq!(r.claims, 1, "the stray entry is gone");
    let view = s.get(&key, 5_000).await.unwrap().expect("the claim stays");
    assert_eq!((view.fence, view.expires_at_ms), (fence, 61_000));
    assert_eq!(s.purge_expired(5_000, 100).await.unwrap().claims, 0);
    assert_eq!(s.purge_expired(61_000, 100).await.unwrap().claims, 1);
    // Read as of 1 000, when the row would still be live: it is deleted,
    // not merely expired.
    assert!(s.get(&key, 1_000).await.unwrap().is_none(), "then it goes");
    s.close().await;
}
