//! A checkpoint's sync made beside new writes: the writer hands the data
//! file's sync to the flusher thread and goes on logging batches in the
//! log's other segment (`dedupd.redb.wal2`). A crash before that sync
//! replays the batches of both segments; the file's writes wait for it; a
//! sync that fails is a disk fault the store recovers from, losing nothing.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use dedupd::domain::{Key, ScopedKey, Ttl};
use dedupd::store::keyspace::{KvRequest, KvResponse, SetCondition, SetExpiry};
use dedupd::store::redb::faults::FaultPlan;
use dedupd::store::redb::{OpenError, RedbOptions, RedbStore, WalContents, decode_wal};
use dedupd::store::{ClaimOutcome, Store};
use tempfile::TempDir;

const NOW: u64 = 1_800_000_000_000;

fn key(k: &str) -> ScopedKey {
    ScopedKey::api(&Key::parse(k, "key").unwrap())
}

fn segments(data: &Path) -> [PathBuf; 2] {
    ["wal", "wal2"].map(|ext| {
        let mut p = data.as_os_str().to_owned();
        p.push(".");
        p.push(ext);
        p.into()
    })
}

async fn claim(store: &RedbStore, k: &str) {
    let ttl = Ttl::from_ms_unchecked(86_400_000);
    assert!(
        matches!(
            store.claim(&key(k), ttl, None, NOW).await.unwrap(),
            ClaimOutcome::Claimed { .. }
        ),
        "{k}"
    );
}

/// The batches of a segment numbered after `after`, and where its records
/// end.
fn batches(bytes: &[u8], after: u64) -> (Vec<u64>, usize) {
    match decode_wal(bytes, after) {
        WalContents::Log { seqs, end, .. } => (seqs, end),
        other => panic!("not a log: {other:?}"),
    }
}

/// Options whose only checkpoint comes when the log holds three claims'
/// records: no checkpoint when idle or by time, and no commit of the held
/// transaction but the checkpoint's (so nothing writes to the data file
/// unless a test asks).
fn opts_at(path: &Path, plan: &Arc<FaultPlan>, checkpoint_bytes: u64) -> RedbOptions {
    let mut opts = RedbOptions::new(path);
    opts.checkpoint_idle = Duration::from_secs(3600);
    opts.checkpoint_interval = Duration::from_secs(3600);
    opts.commit_hold = Duration::from_secs(3600);
    opts.read_reopen_wait = Duration::from_secs(30);
    opts.faults = Some(plan.clone());
    opts.checkpoint_bytes = checkpoint_bytes;
    opts
}

/// A store in a new directory, with no checkpoint when idle or by time:
/// its log keeps every batch, to be measured.
fn scratch_store() -> (TempDir, PathBuf, RedbStore) {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("measure.redb");
    let mut opts = RedbOptions::new(&path);
    opts.checkpoint_idle = Duration::from_secs(3600);
    opts.checkpoint_interval = Duration::from_secs(3600);
    let store = RedbStore::open(&opts).unwrap();
    (dir, path, store)
}

/// Bytes of a log that holds three claims of the keys the tests use (keys
/// of one length, so records of one length), and of an empty log (its
/// header), measured on a scratch store.
async fn three_claims_of_log() -> (u64, u64) {
    let (_dir, path, store) = scratch_store();
    let [wal, _] = segments(&path);
    let (_, empty) = batches(&std::fs::read(&wal).unwrap(), 0);
    claim(&store, "k0").await;
    let (_, one) = batches(&std::fs::read(&wal).unwrap(), 0);
    claim(&store, "k9").await;
    let (_, two) = batches(&std::fs::read(&wal).unwrap(), 0);
    assert_eq!(two - one, one - empty, "records of one length");
    store.close().await;
    ((empty + 3 * (one - empty)) as u64, empty as u64)
}

/// Lets the checkpoints' syncs through when dropped, so a failed assertion
/// does not leave the store's close waiting for a sync that hangs.
struct Unhang(Arc<FaultPlan>);

impl Drop for Unhang {
    fn drop(&mut self) {
        self.0.set_handed_over_syncs_hung(false);
    }
}

/// Waits until the first segment's batches are checkpointed and the second
/// segment holds the batches after them (the writer swapped).
async fn swapped(data: &Path, later: usize) -> (Vec<u8>, Vec<u8>) {
    let [first, second] = segments(data);
    for _ in 0..3000 {
        let a = std::fs::read(&first).unwrap();
        let b = std::fs::read(&second).unwrap();
        let (before, _) = batches(&a, 0);
        let last = before.last().copied().unwrap_or(0);
        if matches!(decode_wal(&b, last), WalContents::Log { ref seqs, .. } if seqs.len() == later)
        {
            return (a, b);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the log did not go on in its second segment");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_before_a_checkpoints_sync_replays_both_segments_and_writes_wait_for_it() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("d.redb");
    let plan = FaultPlan::new();
    let (bytes, _) = three_claims_of_log().await;
    let store = Arc::new(RedbStore::open(&opts_at(&path, &plan, bytes)).unwrap());
    // The data file as a crash would leave it while the checkpoint's sync
    // has not been made: as the last durable commit (the open's) left it.
    let data = std::fs::read(&path).unwrap();
    let empty_log = std::fs::read(&segments(&path)[0]).unwrap();
    plan.set_handed_over_syncs_hung(true);
    let _unhang = Unhang(plan.clone());
    for k in ["k1", "k2", "k3"] {
        claim(&store, k).await;
    }
    // The third claim made the checkpoint due; its sync hangs, and the
    // next claims are answered all the same, logged in the second segment.
    for k in ["k4", "k5"] {
        claim(&store, k).await;
    }
    let (a, b) = swapped(&path, 2).await;
    let (first, _) = batches(&a, 0);
    assert_eq!(first.len(), 3, "the checkpoint covers the first three");

    // The sixth claim makes the next checkpoint due. It is answered (its
    // record is synced in the log), but that checkpoint waits for the
    // first one's sync: the segment it empties holds the batches the
    // first covers. Writes queue behind it.
    claim(&store, "k6").await;
    let seventh = tokio::spawn({
        let store = store.clone();
        async move { claim(&store, "k7").await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !seventh.is_finished(),
        "a checkpoint went ahead of the sync of the one before"
    );
    plan.set_handed_over_syncs_hung(false);
    seventh.await.unwrap();

    // The crash: both segments as they were, beside the data file without
    // the checkpoint.
    let crashed = TempDir::new().unwrap();
    let moved = crashed.path().join("d.redb");
    std::fs::write(&moved, &data).unwrap();
    let [wal, wal2] = segments(&moved);
    std::fs::write(&wal, &a).unwrap();
    std::fs::write(&wal2, &b).unwrap();
    let reopened = RedbStore::open(&opts_at(&moved, &FaultPlan::new(), bytes)).unwrap();
    for k in ["k1", "k2", "k3", "k4", "k5"] {
        assert!(
            reopened.get(&key(k), NOW).await.unwrap().is_some(),
            "{k} was answered, and is gone after the crash"
        );
    }
    reopened.close().await;

    // Without the first segment, the second's batches do not follow the
    // file's: refused, not replayed with a hole; likewise with a first
    // segment that holds none of them (one of another moment).
    std::fs::write(&moved, &data).unwrap();
    std::fs::write(&wal, []).unwrap();
    std::fs::write(&wal2, &b).unwrap();
    let err = RedbStore::open(&opts_at(&moved, &FaultPlan::new(), bytes)).unwrap_err();
    assert!(matches!(err, OpenError::MissingLog { .. }), "{err}");
    std::fs::write(&moved, &data).unwrap();
    std::fs::write(&wal, empty_log).unwrap();
    std::fs::write(&wal2, &b).unwrap();
    let err = RedbStore::open(&opts_at(&moved, &FaultPlan::new(), bytes)).unwrap_err();
    assert!(matches!(err, OpenError::LogAhead { holds: 0, .. }), "{err}");
    assert_eq!(std::fs::read(&wal2).unwrap(), b, "left as it was");
    // The second segment lost: the file says its log has two, so it is
    // missing, as the first would be.
    std::fs::write(&moved, &data).unwrap();
    std::fs::write(&wal, &a).unwrap();
    std::fs::remove_file(&wal2).unwrap();
    match RedbStore::open(&opts_at(&moved, &FaultPlan::new(), bytes)).unwrap_err() {
        OpenError::MissingLog { log, .. } => assert_eq!(log, wal2),
        err => panic!("{err}"),
    }

    store.close().await;
    all_there(&path, bytes, &["k1", "k2", "k3", "k4", "k5", "k6", "k7"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoints_pages_are_written_beside_new_writes_and_a_crash_before_loses_nothing() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("d.redb");
    let plan = FaultPlan::new();
    let (bytes, _) = three_claims_of_log().await;
    let store = RedbStore::open(&opts_at(&path, &plan, bytes)).unwrap();
    let before = std::fs::read(&path).unwrap();
    plan.set_handed_over_syncs_hung(true);
    let _unhang = Unhang(plan.clone());
    for k in ["k1", "k2", "k3", "k4"] {
        claim(&store, k).await;
    }
    let (a, b) = swapped(&path, 1).await;
    // The writer made the checkpoint's commit and went on; its pages wait
    // in memory for the flusher, so the file is as the open left it.
    let now = std::fs::read(&path).unwrap();
    assert!(
        now == before,
        "the writer wrote the checkpoint's pages itself"
    );

    // A crash now loses the pages held in memory: the log has the batches.
    let crashed = TempDir::new().unwrap();
    let moved = crashed.path().join("d.redb");
    std::fs::write(&moved, &now).unwrap();
    let [wal, wal2] = segments(&moved);
    std::fs::write(&wal, &a).unwrap();
    std::fs::write(&wal2, &b).unwrap();
    all_there(&moved, bytes, &["k1", "k2", "k3", "k4"]).await;

    // Once the flusher goes on, it writes the pages.
    plan.set_handed_over_syncs_hung(false);
    let mut waited = 0;
    while std::fs::read(&path).unwrap() == before {
        waited += 1;
        assert!(
            waited < 3000,
            "the checkpoint's pages never reached the file"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    claim(&store, "k5").await;
    store.close().await;
    all_there(&path, bytes, &["k1", "k2", "k3", "k4", "k5"]).await;
}

/// The Redis-protocol key numbered `i`, and its value: 2,000 bytes, too
/// long to be kept in memory, so a read of it reads its row from redb.
fn kv(i: usize) -> (Vec<u8>, Vec<u8>) {
    let key = format!("kv-{i:04}").into_bytes();
    let value = format!("{i:0>2000}").into_bytes();
    (key, value)
}

async fn set(store: &RedbStore, i: usize) {
    let (key, value) = kv(i);
    let set = KvRequest::Set {
        key,
        value,
        condition: SetCondition::Always,
        expiry: SetExpiry::Clear,
        get: false,
    };
    assert!(matches!(
        store
            .keyspace()
            .submit(set, NOW)
            .await
            .unwrap()
            .await
            .unwrap(),
        KvResponse::Set { written: true, .. }
    ));
}

/// Bytes of the log after [`set`] of keys `0..n`, one after the other,
/// measured on a scratch store without checkpoints.
async fn log_of_sets(n: usize) -> u64 {
    let (_dir, path, store) = scratch_store();
    for i in 0..n {
        set(&store, i).await;
    }
    let (_, end) = batches(&std::fs::read(&segments(&path)[0]).unwrap(), 0);
    store.close().await;
    end as u64
}

/// With a page cache far smaller than the table read, redb reads its
/// pages from the file. Right after a checkpoint whose page writes are
/// held in memory (its sync hangs), the file has none of the rows that
/// checkpoint wrote: each read finds them in the held writes laid over
/// the file, or reads the wrong bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_tiny_cache_reads_find_a_checkpoints_pages_while_they_are_held() {
    const KEYS: usize = 150;
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("d.redb");
    let plan = FaultPlan::new();
    // The last of the sets makes the only checkpoint due.
    let checkpoint_bytes = log_of_sets(KEYS).await;
    let mut opts = opts_at(&path, &plan, checkpoint_bytes);
    // 16 pages; the rows take about 75.
    opts.cache_bytes = 64 * 1024;
    let store = RedbStore::open(&opts).unwrap();
    plan.set_handed_over_syncs_hung(true);
    let unhang = Unhang(plan.clone());
    for i in 0..KEYS {
        set(&store, i).await;
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while plan.handed_over_taken() == 0 {
        assert!(std::time::Instant::now() < deadline, "no checkpoint");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The small write buffer sent some of the rows' pages to the file
    // before the checkpoint; the checkpoint's own writes are held.
    let held = std::fs::read(&path).unwrap();
    // Out of order: not one leaf after the other. With nothing written
    // meanwhile, a read does not wait for the checkpoint's sync: redb's
    // readers write buffered pages back to make room, and a read's writes
    // are refused meanwhile (the pages stay buffered).
    for i in (0..KEYS).map(|i| (i * 7919) % KEYS) {
        let (key, value) = kv(i);
        let got = tokio::time::timeout(Duration::from_secs(30), store.keyspace().get(key, NOW))
            .await
            .expect("a read waited for the checkpoint's sync")
            .unwrap();
        assert!(
            got.as_ref().is_some_and(|e| e.value == value),
            "key {i} read wrong while the checkpoint's pages were held"
        );
    }
    assert!(
        std::fs::read(&path).unwrap() == held,
        "the checkpoint's pages reached the file while its sync hung"
    );
    drop(unhang);
    let mut waited = 0;
    while std::fs::read(&path).unwrap() == held {
        waited += 1;
        assert!(waited < 3000, "no checkpoint's pages were held");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    store.close().await;

    // The file they were written to is whole, and holds every row.
    let copy = TempDir::new().unwrap();
    let copied = copy.path().join("d.redb");
    std::fs::copy(&path, &copied).unwrap();
    let mut db = redb::Database::open(&copied).unwrap();
    assert!(db.check_integrity().unwrap(), "the file needed repair");
    drop(db);
    let store = RedbStore::open(&opts_at(&path, &FaultPlan::new(), checkpoint_bytes)).unwrap();
    for i in 0..KEYS {
        let (key, value) = kv(i);
        let got = store.keyspace().get(key, NOW).await.unwrap();
        assert!(got.is_some_and(|e| e.value == value), "key {i}");
    }
    store.close().await;
}

/// Opens the store at `path` again and finds every one of `keys`.
async fn all_there(path: &Path, checkpoint_bytes: u64, keys: &[&str]) {
    let store = RedbStore::open(&opts_at(path, &FaultPlan::new(), checkpoint_bytes)).unwrap();
    for k in keys {
        assert!(store.get(&key(k), NOW).await.unwrap().is_some(), "{k}");
    }
    store.close().await;
}

/// Waits (up to 30 s) until the store is ready and `also` holds.
async fn ready_and(store: &RedbStore, what: &str, also: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while store.ready().await.is_err() || !also() {
        assert!(std::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoints_sync_that_fails_is_a_disk_fault_that_loses_nothing() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("d.redb");
    let plan = FaultPlan::new();
    let (bytes, empty) = three_claims_of_log().await;
    let store = RedbStore::open(&opts_at(&path, &plan, bytes)).unwrap();
    plan.fail_next_handed_over_syncs(1);
    for k in ["k1", "k2", "k3", "k4", "k5"] {
        claim(&store, k).await;
    }
    let _ = swapped(&path, 2).await;
    // The sixth claim makes the next checkpoint due, which finds the
    // first one's sync failed: the file is given up and reopened, the log
    // replayed into it, and both segments started over (only their
    // headers are left: nothing else shrinks them).
    claim(&store, "k6").await;
    ready_and(
        &store,
        "the file was not reopened after its checkpoint's sync failed",
        || {
            segments(&path)
                .iter()
                .all(|p| std::fs::metadata(p).unwrap().len() == empty)
        },
    )
    .await;
    assert_eq!(plan.injected(), 1, "the checkpoint's sync failed");
    for k in ["k1", "k2", "k3", "k4", "k5", "k6"] {
        assert!(store.get(&key(k), NOW).await.unwrap().is_some(), "{k}");
    }
    claim(&store, "k7").await;
    store.close().await;
    all_there(&path, bytes, &["k1", "k2", "k3", "k4", "k5", "k6", "k7"]).await;
}

/// Low on room right after a checkpoint's sync failed: the writer's
/// checkpoint for room fails too, and must not give the log's space back
/// (that empties both segments), or the batches neither checkpoint made
/// durable would be lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_for_room_after_a_failed_sync_keeps_the_log() {
    const MIB: u64 = 1024 * 1024;
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("d.redb");
    let plan = FaultPlan::new();
    plan.set_free_bytes(Some(100 * MIB));
    let (bytes, _) = three_claims_of_log().await;
    let mut opts = opts_at(&path, &plan, bytes);
    opts.min_free_bytes = 8 * MIB;
    let store = RedbStore::open(&opts).unwrap();
    plan.fail_next_handed_over_syncs(1);
    for k in ["k1", "k2", "k3"] {
        claim(&store, k).await;
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while plan.injected() == 0 {
        assert!(std::time::Instant::now() < deadline, "no checkpoint sync");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    claim(&store, "k4").await;
    // Close to the floor: the next write checkpoints first, for room, and
    // with little room the log's space would be given back after it.
    plan.set_free_bytes(Some(9 * MIB));
    let ttl = Ttl::from_ms_unchecked(86_400_000);
    assert!(store.claim(&key("k5"), ttl, None, NOW).await.is_err());
    plan.set_free_bytes(Some(100 * MIB));
    ready_and(
        &store,
        "the file was not reopened: its log lost batches",
        || true,
    )
    .await;
    for k in ["k1", "k2", "k3", "k4"] {
        assert!(store.get(&key(k), NOW).await.unwrap().is_some(), "{k}");
    }
    claim(&store, "k5").await;
    store.close().await;
}
