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

/// The log's first segment. These tests checkpoint only when the store
/// opens and closes, so the second (`.wal2`) never holds a batch.
fn wal_of(path: &std::path::Path) -> std::path::PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".wal");
    p.into()
}

/// A store in `dir` that claims `a` and `b`: copies of its data file as it
/// was before the claims and of its log after them, as a crash would leave
/// them (the claims are in the log, synced before their answers, and not
/// yet checkpointed into the file).
/// The third is the log's second segment (`.wal2`), as it was: it holds
/// no batch, since nothing but the open checkpointed.
async fn crashed_with_claims(dir: &TempDir) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
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
    let second = std::fs::read(second_of(&path)).unwrap();
    store.close().await;
    (data, log, second)
}

fn second_of(path: &std::path::Path) -> std::path::PathBuf {
    let mut p = wal_of(path).into_os_string();
    p.push("2");
    p.into()
}

#[tokio::test]
async fn a_log_without_its_data_file_is_refused_and_left_as_it_is() {
    let a = TempDir::new().unwrap();
    let (_, log, _) = crashed_with_claims(&a).await;
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
    assert!(std::fs::read(wal_of(&path)).unwrap() == log, "not touched");
    assert!(!path.exists(), "no data file was created");
}

#[tokio::test]
async fn the_logs_second_segment_without_its_data_file_is_refused_too() {
    let a = TempDir::new().unwrap();
    let path = a.path().join("d.redb");
    RedbStore::open(&RedbOptions::new(&path))
        .unwrap()
        .close()
        .await;
    let second = second_of(&path);
    let bytes = std::fs::read(&second).unwrap();
    // Only the second segment is left beside where the data file was.
    std::fs::remove_file(&path).unwrap();
    std::fs::remove_file(wal_of(&path)).unwrap();
    let err = RedbStore::open(&RedbOptions::new(&path)).unwrap_err();
    match &err {
        OpenError::OrphanLog { log, .. } => assert_eq!(log, &second),
        other => panic!("{other}"),
    }
    assert!(err.to_string().contains(".wal2"), "{err}");
    assert_eq!(std::fs::read(&second).unwrap(), bytes, "not touched");
    assert!(!path.exists(), "no data file was created");
}

#[tokio::test]
async fn a_log_beside_another_data_file_is_refused_and_left_as_it_is() {
    let a = TempDir::new().unwrap();
    let (_, log, _) = crashed_with_claims(&a).await;
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
    assert!(std::fs::read(wal_of(&path)).unwrap() == log, "not touched");
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
    let (data, log, second) = crashed_with_claims(&a).await;
    // Both files as the crash left them, in another directory (moved
    // together, as a backup of both would be).
    let b = TempDir::new().unwrap();
    let path = b.path().join("moved.redb");
    std::fs::write(&path, &data).unwrap();
    std::fs::write(wal_of(&path), &log).unwrap();
    std::fs::write(second_of(&path), &second).unwrap();
    let store = RedbStore::open(&RedbOptions::new(&path)).unwrap();
    assert!(store.get(&key("a"), NOW).await.unwrap().is_some());
    assert!(store.get(&key("b"), NOW).await.unwrap().is_some());
    store.close().await;
}

fn opts_at(path: &std::path::Path) -> RedbOptions {
    let mut opts = RedbOptions::new(path);
    opts.checkpoint_idle = std::time::Duration::from_secs(3600);
    opts.checkpoint_interval = std::time::Duration::from_secs(3600);
    opts
}

async fn claim(store: &RedbStore, k: &str) {
    let ttl = Ttl::from_ms_unchecked(86_400_000);
    assert!(matches!(
        store.claim(&key(k), ttl, None, NOW).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
}

/// A backup of the data file put back while its log stayed: the log
/// continues from a batch after the ones the backup holds, and replaying it
/// there would lose the batches between and hand out fences again (the red
/// team found `phase1` gone and fence 3 given twice).
#[tokio::test]
async fn a_backup_of_the_data_file_beside_a_newer_log_is_refused() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("d.redb");
    let store = RedbStore::open(&opts_at(&path)).unwrap();
    claim(&store, "phase0").await;
    store.close().await;
    let backup = std::fs::read(&path).unwrap();
    let store = RedbStore::open(&opts_at(&path)).unwrap();
    claim(&store, "phase1").await;
    store.close().await;
    let store = RedbStore::open(&opts_at(&path)).unwrap();
    claim(&store, "phase2").await;
    // A crash now: phase2 is in the log only.
    let log = std::fs::read(wal_of(&path)).unwrap();
    store.close().await;

    std::fs::write(&path, &backup).unwrap();
    std::fs::write(wal_of(&path), &log).unwrap();
    let err = RedbStore::open(&opts_at(&path)).unwrap_err();
    assert!(matches!(err, OpenError::LogAhead { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("older than its log") && msg.contains("--accept-missing-log"),
        "{msg}"
    );
    assert!(
        std::fs::read(wal_of(&path)).unwrap() == log,
        "the log is untouched"
    );
    // Moved away as the message says, the backup serves as it was.
    std::fs::rename(wal_of(&path), dir.path().join("kept.wal")).unwrap();
    let mut accept = opts_at(&path);
    accept.accept_missing_log = true;
    let store = RedbStore::open(&accept).unwrap();
    assert!(store.get(&key("phase0"), NOW).await.unwrap().is_some());
    assert!(store.get(&key("phase1"), NOW).await.unwrap().is_none());
    store.close().await;
}

/// A data file that was not closed cleanly, moved without its log: the
/// log holds acknowledged writes, so opening it alone is refused; the
/// operator may accept the loss for one start.
#[tokio::test]
async fn a_data_file_left_open_without_its_log_is_refused_unless_the_loss_is_accepted() {
    let a = TempDir::new().unwrap();
    let (data, _, _) = crashed_with_claims(&a).await;
    let b = TempDir::new().unwrap();
    let path = b.path().join("moved.redb");
    std::fs::write(&path, &data).unwrap();
    let err = RedbStore::open(&opts_at(&path)).unwrap_err();
    assert!(matches!(err, OpenError::MissingLog { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("was not closed cleanly") && msg.contains("--accept-missing-log"),
        "{msg}"
    );
    assert!(!wal_of(&path).exists(), "no log was made up");

    let mut accept = opts_at(&path);
    accept.accept_missing_log = true;
    let store = RedbStore::open(&accept).unwrap();
    assert!(
        store.get(&key("a"), NOW).await.unwrap().is_none(),
        "lost, as accepted"
    );
    store.close().await;
    // Closed cleanly now: it opens alone again.
    std::fs::remove_file(wal_of(&path)).unwrap();
    RedbStore::open(&opts_at(&path)).unwrap().close().await;
}

/// A damaged record in the middle of the log (a flipped bit) with intact
/// later batches after it is corruption, not a torn tail: refused, nothing
/// replayed, nothing cut. A damaged last record is a torn tail: the
/// batches before it are replayed.
#[tokio::test]
async fn a_damaged_record_before_intact_ones_is_refused_and_a_torn_last_one_is_cut() {
    let a = TempDir::new().unwrap();
    let (data, log, second) = crashed_with_claims(&a).await;
    // The records after the 28-byte header: (start, end) of each.
    let mut records = Vec::new();
    let mut at = 28;
    while at + 8 <= log.len() {
        let len = u32::from_le_bytes(log[at..at + 4].try_into().unwrap()) as usize;
        if len == 0 || at + 8 + len > log.len() {
            break;
        }
        records.push((at, at + 8 + len));
        at += 8 + len;
    }
    assert!(records.len() >= 2, "{records:?}");

    let b = TempDir::new().unwrap();
    let path = b.path().join("d.redb");
    let mut damaged = log.clone();
    damaged[records[0].1 - 1] ^= 0x10;
    std::fs::write(&path, &data).unwrap();
    std::fs::write(wal_of(&path), &damaged).unwrap();
    std::fs::write(second_of(&path), &second).unwrap();
    let err = RedbStore::open(&opts_at(&path)).unwrap_err();
    assert!(matches!(err, OpenError::DamagedLog { .. }), "{err}");
    assert!(err.to_string().contains("follows intact"), "{err}");
    assert!(
        std::fs::read(wal_of(&path)).unwrap() == damaged,
        "nothing cut"
    );

    let mut torn = log.clone();
    let last = *records.last().unwrap();
    torn[last.1 - 1] ^= 0x10;
    std::fs::write(&path, &data).unwrap();
    std::fs::write(wal_of(&path), &torn).unwrap();
    let store = RedbStore::open(&opts_at(&path)).unwrap();
    assert!(store.get(&key("a"), NOW).await.unwrap().is_some());
    store.close().await;
}
