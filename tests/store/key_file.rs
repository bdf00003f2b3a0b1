//! The key file (`dedupd.redb.keys`, see `store::redb::seal`) is bound to
//! its data file: a data file with sealed events opens only beside its own
//! key file, whole; anything else is refused with the files named, and
//! nothing is changed. And every event, on a source with several lanes
//! too, opens after a crash (the log replayed) and after a restart.

use dedupd::domain::CreatedAt;
use dedupd::store::inbox::{Inbox, NewEvent};
use dedupd::store::redb::{OpenError, RedbOptions, RedbStore};
use tempfile::TempDir;

const NOW: u64 = 1_800_000_000_000;

fn keys_of(path: &std::path::Path) -> std::path::PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".keys");
    p.into()
}

fn event(id: &str, body: &str) -> NewEvent {
    NewEvent {
        source: "sume".into(),
        event_id: id.into(),
        stream: None,
        created_at: CreatedAt::from_unix_nanos(1),
        received_at_ms: NOW,
        headers: vec![("x-customer".into(), format!("h-{id}"))],
        body: body.as_bytes().to_vec(),
    }
}

/// A closed store in `dir` holding the events `e1` and `e2`.
async fn with_events(dir: &TempDir) -> std::path::PathBuf {
    let path = dir.path().join("dedupd.redb");
    let store = RedbStore::open(&RedbOptions::new(&path)).unwrap();
    let inbox = store.inbox();
    inbox.ingest(event("e1", "body one"), NOW).await.unwrap();
    inbox.ingest(event("e2", "body two"), NOW).await.unwrap();
    store.close().await;
    path
}

#[tokio::test]
async fn every_event_opens_after_a_restart_with_its_headers_and_body() {
    let dir = TempDir::new().unwrap();
    let path = with_events(&dir).await;
    let store = RedbStore::open(&RedbOptions::new(&path)).unwrap();
    let e = store
        .inbox()
        .inbox_event("sume", "e2")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(e.body, b"body two");
    assert_eq!(e.headers, [("x-customer".to_owned(), "h-e2".to_owned())]);
    let indexes = store.inbox().inbox_indexes().await.unwrap();
    assert!(indexes.orphan_seals.is_empty() && indexes.shared_slots.is_empty());
    store.close().await;
}

/// Every event opens, whole (the files were left fit to serve).
async fn opens_whole(path: &std::path::Path) {
    let store = RedbStore::open(&RedbOptions::new(path)).unwrap();
    for (id, body) in [("e1", "body one"), ("e2", "body two")] {
        let e = store
            .inbox()
            .inbox_event("sume", id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(e.body, body.as_bytes(), "{id}");
    }
    store.close().await;
}

#[tokio::test]
async fn a_data_file_with_sealed_events_is_refused_without_its_key_file() {
    let dir = TempDir::new().unwrap();
    let path = with_events(&dir).await;
    let keys = std::fs::read(keys_of(&path)).unwrap();
    std::fs::remove_file(keys_of(&path)).unwrap();
    let err = RedbStore::open(&RedbOptions::new(&path)).unwrap_err();
    assert!(matches!(err, OpenError::MissingKeys { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains(&keys_of(&path).display().to_string()) && msg.contains("missing"),
        "{msg}"
    );
    assert!(!keys_of(&path).exists(), "no key file was made up");
    assert!(!msg.contains("before-restore"), "{msg}");
    // A restore stopped between its renames left the key file renamed
    // aside: the error names it, so it can be put back.
    let mut aside = keys_of(&path).into_os_string();
    aside.push(".before-restore-20261207T180100Z");
    std::fs::write(&aside, &keys).unwrap();
    let msg = RedbStore::open(&RedbOptions::new(&path))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains(".keys.before-restore-20261207T180100Z"),
        "{msg}"
    );
    std::fs::remove_file(&aside).unwrap();
    std::fs::write(keys_of(&path), keys).unwrap();
    opens_whole(&path).await;
}

#[tokio::test]
async fn a_key_file_of_another_data_file_is_refused_and_left_as_it_is() {
    let a = TempDir::new().unwrap();
    let b = TempDir::new().unwrap();
    let path = with_events(&a).await;
    let other = with_events(&b).await;
    let own = std::fs::read(keys_of(&path)).unwrap();
    std::fs::copy(keys_of(&other), keys_of(&path)).unwrap();
    let foreign = std::fs::read(keys_of(&path)).unwrap();
    let err = RedbStore::open(&RedbOptions::new(&path)).unwrap_err();
    assert!(matches!(err, OpenError::ForeignKeys { .. }), "{err}");
    assert!(err.to_string().contains("belongs to data file"), "{err}");
    assert!(
        std::fs::read(keys_of(&path)).unwrap() == foreign,
        "left as it was"
    );
    // Not a key file at all.
    std::fs::write(keys_of(&path), b"{\"not\": \"a key file, not at all\"}").unwrap();
    let err = RedbStore::open(&RedbOptions::new(&path)).unwrap_err();
    assert!(
        err.to_string().contains("is not a dedupd key file"),
        "{err}"
    );
    std::fs::write(keys_of(&path), own).unwrap();
    opens_whole(&path).await;
}

#[tokio::test]
async fn a_key_file_cut_short_is_refused_as_damaged() {
    let dir = TempDir::new().unwrap();
    let path = with_events(&dir).await;
    let keys = std::fs::read(keys_of(&path)).unwrap();
    // The header and no slot.
    std::fs::write(keys_of(&path), &keys[..32]).unwrap();
    let err = RedbStore::open(&RedbOptions::new(&path)).unwrap_err();
    assert!(matches!(err, OpenError::DamagedKeys { .. }), "{err}");
    assert!(err.to_string().contains("key slot"), "{err}");
}

#[tokio::test]
async fn a_key_file_left_beside_a_new_data_file_is_refused() {
    let dir = TempDir::new().unwrap();
    let path = with_events(&dir).await;
    // The operator deleted the data file and its log, not the key file.
    for ext in ["", ".wal", ".wal2"] {
        let mut p = path.as_os_str().to_owned();
        p.push(ext);
        let _ = std::fs::remove_file(std::path::PathBuf::from(p));
    }
    let err = RedbStore::open(&RedbOptions::new(&path)).unwrap_err();
    assert!(matches!(err, OpenError::ForeignKeys { .. }), "{err}");
    assert!(err.to_string().contains("move"), "{err}");
}

/// A data file whose only seals are bulk jobs' records (every event
/// erased or reaped) is refused without its key file too, before its log
/// is replayed; `verify` opens each job's record with its key, and names
/// one whose key is not the one it was sealed with.
#[tokio::test]
async fn a_data_file_with_only_sealed_job_records_needs_its_key_file_and_verify_opens_them() {
    use dedupd::store::redb::backup::verify::{VerifyError, verify_data_file};
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("dedupd.redb");
    let store = RedbStore::open(&RedbOptions::new(&path)).unwrap();
    let record = b"{\"value\":\"erin@example.com\"}".to_vec();
    store
        .inbox()
        .put_job("job_a", record.clone(), NOW)
        .await
        .unwrap();
    store.close().await;
    let report = verify_data_file(&path).unwrap();
    assert_eq!((report.sealed, report.sealed_jobs), (0, 1));

    // A crash with a batch in the log (the store holds it uncommitted).
    let mut held = RedbOptions::new(&path);
    held.commit_hold = std::time::Duration::from_secs(3600);
    held.checkpoint_interval = std::time::Duration::from_secs(3600);
    held.checkpoint_idle = std::time::Duration::from_secs(3600);
    let store = RedbStore::open(&held).unwrap();
    store
        .inbox()
        .put_job("job_b", b"{}".to_vec(), NOW)
        .await
        .unwrap();
    let crashed = TempDir::new().unwrap();
    let image = crashed.path().join("dedupd.redb");
    for ext in ["", ".wal", ".wal2"] {
        std::fs::copy(
            format!("{}{ext}", path.display()),
            format!("{}{ext}", image.display()),
        )
        .unwrap();
    }
    store.close().await;
    // Refused before its log is replayed into it.
    let logs = |p: &std::path::Path| {
        [".wal", ".wal2"].map(|ext| std::fs::read(format!("{}{ext}", p.display())).unwrap())
    };
    let before = logs(&image);
    let err = RedbStore::open(&RedbOptions::new(&image)).unwrap_err();
    assert!(matches!(err, OpenError::MissingKeys { .. }), "{err}");
    assert!(err.to_string().contains("bulk jobs' records"), "{err}");
    assert!(logs(&image) == before, "the log was changed");
    {
        use redb::{ReadableDatabase, ReadableTableMetadata};
        let jobs: redb::TableDefinition<&str, (&[u8], bool)> =
            redb::TableDefinition::new("inbox_jobs");
        let db = redb::Database::open(&image).unwrap();
        let tx = db.begin_read().unwrap();
        assert_eq!(
            tx.open_table(jobs).unwrap().len().unwrap(),
            1,
            "no batch was replayed"
        );
    }
    assert!(!keys_of(&image).exists(), "no key file was made up");
    assert!(verify_data_file(&image).is_err());

    // Another key in the job's slot: refused by verify, by name.
    let keys = std::fs::read(keys_of(&path)).unwrap();
    let mut other = keys.clone();
    for b in &mut other[32..] {
        *b ^= 0x5a;
    }
    std::fs::write(keys_of(&path), &other).unwrap();
    match verify_data_file(&path) {
        Err(VerifyError::JobSeal { job, .. }) => assert_eq!(job, "job_a"),
        other => panic!("{other:?}"),
    }
    std::fs::write(keys_of(&path), keys).unwrap();
    let store = RedbStore::open(&RedbOptions::new(&path)).unwrap();
    let jobs = store.inbox().jobs().await.unwrap();
    assert_eq!((jobs.len(), &jobs[0].record), (2, &record));
    store.close().await;
}
