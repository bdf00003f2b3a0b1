//! What only the redb backend has: the data file and its writer.

use std::sync::Arc;

use dedupd::domain::{Key, ScopedKey, Ttl};
use dedupd::store::Store;
use dedupd::store::redb::{OpenError, RedbOptions, RedbStore};
use tempfile::TempDir;

#[test]
fn a_file_with_an_unknown_schema_version_is_refused_with_a_clear_message() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("future.redb");
    {
        let db = redb::Database::create(&path).unwrap();
        let tx = db.begin_write().unwrap();
        {
            let def: redb::TableDefinition<&str, u64> = redb::TableDefinition::new("meta");
            tx.open_table(def)
                .unwrap()
                .insert("schema_version", 99)
                .unwrap();
        }
        tx.commit().unwrap();
    }
    let err = RedbStore::open(&RedbOptions::new(&path)).unwrap_err();
    assert!(
        matches!(err, OpenError::UnknownSchema { found: 99, .. }),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("schema version 99") && msg.contains("reads version 1"),
        "{msg}"
    );
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
