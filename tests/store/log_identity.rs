//! The write-ahead log is bound to its data file: a log is replayed only
//! into the file it was written for, and a log that cannot be replayed is
//! refused and left exactly as it was.

use dedupd::domain::{Key, ScopedKey, Ttl};
use dedupd::store::redb::{OpenError, RedbOptions, RedbStore};
use dedupd::store::{ClaimOutcome, Store};
use tempfile::TempDir;

const NOW: u64 = 1_800_000_000_000;

fn key(k: &str) -> ScopedKey {
    ScopedKey::api(&Key::parse(k, "key").unwrap())
}

fn wal_of(path: &std::path::Path) -> std::path::PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".wal");
    p.into()
}

/// A store in `dir` that claims `a` and `b`: copies of its data file as it
/// was before the claims and of its log after them, as a crash would leave
/// them (the claims are in the log, synced before their answers, and not
/// yet checkpointed into the file).
async fn crashed_with_claims(dir: &TempDir) -> (Vec<u8>, Vec<u8>) {
    let path = dir.path().join("a.redb");
    let mut opts = RedbOptions::new(&path);
    opts.checkpoint_idle = std::time::Duration::from_secs(3600);
    opts.checkpoint_interval = std::time::Duration::from_secs(3600);
    let store = RedbStore::open(&opts).unwrap();
    // Nothing is being written: the file is as its creation left it.
    let data = std::fs::read(&path).unwrap();
    let ttl = Ttl::from_ms_unchecked(86_400_000);
    for k in ["a", "b"] {
        assert!(matches!(
            store.claim(&key(k), ttl, None, NOW).await.unwrap(),
            ClaimOutcome::Claimed { .. }
        ));
    }
    let log = std::fs::read(wal_of(&path)).unwrap();
    store.close().await;
    (data, log)
}

#[tokio::test]
async fn a_log_without_its_data_file_is_refused_and_left_as_it_is() {
    let a = TempDir::new().unwrap();
    let (_, log) = crashed_with_claims(&a).await;
    // A fresh directory that has only the log: a clone, a moved file, a
    // data file deleted by hand.
    let b = TempDir::new().unwrap();
    let path = b.path().join("dedupd.redb");
    std::fs::write(wal_of(&path), &log).unwrap();
    let err = RedbStore::open(&RedbOptions::new(&path)).unwrap_err();
    assert!(matches!(err, OpenError::OrphanLog { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains(&path.display().to_string())
            && msg.contains(&wal_of(&path).display().to_string())
            && msg.contains("move"),
        "{msg}"
    );
    assert_eq!(std::fs::read(wal_of(&path)).unwrap(), log, "not touched");
    assert!(!path.exists(), "no data file was created");
}

#[tokio::test]
async fn a_log_beside_another_data_file_is_refused_and_left_as_it_is() {
    let a = TempDir::new().unwrap();
    let (_, log) = crashed_with_claims(&a).await;
    // Another store's data file (say, restored from a backup), with the
    // first store's log put beside it.
    let b = TempDir::new().unwrap();
    let path = b.path().join("dedupd.redb");
    RedbStore::open(&RedbOptions::new(&path))
        .unwrap()
        .close()
        .await;
    std::fs::write(wal_of(&path), &log).unwrap();
    let err = RedbStore::open(&RedbOptions::new(&path)).unwrap_err();
    assert!(matches!(err, OpenError::ForeignLog { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("belongs to another data file")
            && msg.contains(&path.display().to_string())
            && msg.contains(&wal_of(&path).display().to_string()),
        "{msg}"
    );
    assert_eq!(std::fs::read(wal_of(&path)).unwrap(), log, "not touched");
    // Moved away as the message says, the data file opens, without the
    // other store's claims.
    std::fs::rename(wal_of(&path), b.path().join("kept.wal")).unwrap();
    let store = RedbStore::open(&RedbOptions::new(&path)).unwrap();
    assert!(store.get(&key("a"), NOW).await.unwrap().is_none());
    store.close().await;
}

#[tokio::test]
async fn a_log_beside_its_own_data_file_is_replayed() {
    let a = TempDir::new().unwrap();
    let (data, log) = crashed_with_claims(&a).await;
    // Both files as the crash left them, in another directory (moved
    // together, as a backup of both would be).
    let b = TempDir::new().unwrap();
    let path = b.path().join("moved.redb");
    std::fs::write(&path, &data).unwrap();
    std::fs::write(wal_of(&path), &log).unwrap();
    let store = RedbStore::open(&RedbOptions::new(&path)).unwrap();
    assert!(store.get(&key("a"), NOW).await.unwrap().is_some());
    assert!(store.get(&key("b"), NOW).await.unwrap().is_some());
    store.close().await;
}
