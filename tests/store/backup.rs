//! Backups of the data file (`store::redb::backup`): taken while the store
//! serves, they hold every write acknowledged before they began — those the
//! writer still holds uncommitted too — with the keys of their events and
//! of no other; a restore makes a new data file of them that opens as
//! `serve` opens one, with fences above every one handed out; a backup or
//! a data file that is damaged, cut short or of another file is refused,
//! and nothing at the target changes; a disk that fails under a backup
//! stops it without holding the store back.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dedupd::domain::{CreatedAt, Key, ScopedKey, Token, Ttl};
use dedupd::store::inbox::{EraseOutcome, EventStatus, Inbox, IngestOutcome, NewEvent};
use dedupd::store::keyspace::{KvRequest, KvResponse, SetCondition, SetExpiry};
use dedupd::store::redb::backup::format::{FrameReader, Kind, keys as key_slots};
use dedupd::store::redb::backup::restore::{FENCE_FLOOR, RestoreError, RestoreOptions, restore};
use dedupd::store::redb::backup::verify::{VerifyError, verify_backup, verify_data_file};
use dedupd::store::redb::backup::{BackupError, STALL};
use dedupd::store::redb::faults::FaultPlan;
use dedupd::store::redb::{RedbOptions, RedbStore};
use dedupd::store::{ApplyOutcome, ClaimOutcome, ClaimState, DoneOutcome, Store, StoreError};
use tempfile::TempDir;

const T: u64 = 1_800_000_000_000;

pub(crate) fn key(k: &str) -> ScopedKey {
    ScopedKey::api(&Key::parse(k, "key").unwrap())
}

pub(crate) fn ttl() -> Ttl {
    Ttl::from_ms_unchecked(3_600_000)
}

fn event(id: &str, body: &[u8]) -> NewEvent {
    NewEvent {
        source: "sume".into(),
        event_id: id.into(),
        stream: Some("run_1".into()),
        created_at: CreatedAt::from_unix_nanos(i128::from(T) * 1_000_000 + id.len() as i128),
        received_at_ms: T,
        headers: vec![("x-customer".into(), format!("h-{id}"))],
        body: body.to_vec(),
    }
}

/// A store in `dir` holding a transaction open for an hour: only a read,
/// a checkpoint or a close commits what it holds.
fn open_held(dir: &Path, plan: Option<Arc<FaultPlan>>) -> RedbStore {
    let mut opts = RedbOptions::new(dir.join("dedupd.redb"));
    opts.commit_hold = Duration::from_secs(3600);
    opts.checkpoint_interval = Duration::from_secs(3600);
    opts.checkpoint_idle = Duration::from_secs(3600);
    opts.faults = plan;
    RedbStore::open(&opts).unwrap()
}

/// A backup of `store` taken at `now`, as bytes.
async fn backup_of(store: &RedbStore, now: u64) -> Vec<u8> {
    let (bytes, written) = store.backups().write_to(now, Vec::new()).await.unwrap();
    assert_eq!(written.bytes, bytes.len() as u64);
    bytes
}

/// `bytes` written to `dir/name`.
pub(crate) fn file(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// A backup of one claim, written to `dir/b`.
async fn a_backup_in(dir: &Path) -> PathBuf {
    let store = open_held(dir, None);
    claim(&store, "k").await;
    let path = file(dir, "b", &backup_of(&store, T).await);
    store.close().await;
    path
}

/// Restores `backup` to `dir/dedupd.redb` at `now`.
async fn restore_to(backup: &Path, dir: &Path, now: u64) -> Result<PathBuf, RestoreError> {
    let data = dir.join("dedupd.redb");
    restore(RestoreOptions {
        backup: backup.to_owned(),
        data: data.clone(),
        replace: true,
        now_ms: now,
        keep_free: 8 << 20,
    })
    .await
    .map(|_| data)
}

async fn set(store: &RedbStore, k: &str, v: &[u8]) {
    let request = KvRequest::Set {
        key: k.as_bytes().to_vec(),
        value: v.to_vec(),
        condition: SetCondition::Always,
        expiry: SetExpiry::Clear,
        get: false,
    };
    let answer = store.keyspace().submit(request, T).await.unwrap().await;
    assert!(matches!(answer, Ok(KvResponse::Set { .. })), "{answer:?}");
}

async fn claim(store: &RedbStore, k: &str) -> (Token, u64) {
    match store.claim(&key(k), ttl(), None, T).await.unwrap() {
        ClaimOutcome::Claimed { token, fence, .. } => (token, fence),
        other => panic!("{k}: {other:?}"),
    }
}

/// A body larger than a frame takes, so rows cross frames.
fn big_body() -> Vec<u8> {
    (0..3_000_000u32).map(|i| (i % 251) as u8).collect()
}

#[tokio::test]
async fn a_backup_holds_every_acknowledged_write_also_those_the_writer_holds_uncommitted() {
    let dir = TempDir::new().unwrap();
    let store = open_held(dir.path(), None);
    let inbox = store.inbox();
    for (id, body) in [("e1", b"body one".to_vec()), ("e2", big_body())] {
        assert_eq!(
            inbox.ingest(event(id, &body), T).await.unwrap(),
            IngestOutcome::Accepted
        );
    }
    let applied = store
        .apply(
            &key("s1"),
            &key("ev1"),
            CreatedAt::from_unix_nanos(5),
            86_400_000,
            T,
        )
        .await
        .unwrap();
    assert_eq!(applied.outcome, ApplyOutcome::Applied);
    // Every write from here is answered from the log, with no commit: the
    // writer holds them in its open transaction.
    let commits = store.write_stats().commits;
    let mut claims = Vec::new();
    for i in 0..40 {
        claims.push(claim(&store, &format!("k{i}")).await);
    }
    for (i, (token, _)) in claims.iter().enumerate().step_by(2) {
        let done = store
            .done(&key(&format!("k{i}")), *token, ttl(), T)
            .await
            .unwrap();
        assert!(matches!(done, DoneOutcome::Done { .. }));
    }
    set(&store, "plain", b"value").await;
    assert_eq!(
        store.write_stats().commits,
        commits,
        "the writes are held uncommitted (else this test proves nothing)"
    );
    let bytes = backup_of(&store, T).await;
    // Written after the backup began: not in it.
    claim(&store, "after").await;
    let highest = claim(&store, "after-2").await.1;
    store.close().await;

    let backup = file(dir.path(), "b.backup", &bytes);
    let report = verify_backup(&backup).unwrap();
    assert_eq!(report.bytes, bytes.len() as u64, "the whole file's length");
    assert_eq!(report.rows("claim_rows"), 40);
    assert_eq!(report.rows("inbox_events"), 2);
    assert_eq!(report.sealed, 2);
    assert!(report.end.rows.iter().sum::<u64>() > 0);

    let target = TempDir::new().unwrap();
    let data = restore_to(&backup, target.path(), T + 5).await.unwrap();
    let restored = RedbStore::open(&RedbOptions::new(&data)).unwrap();
    for (i, (token, fence)) in claims.iter().enumerate() {
        let k = format!("k{i}");
        let view = restored.get(&key(&k), T).await.unwrap().unwrap();
        assert_eq!(view.fence, *fence, "{k}");
        let state = if i % 2 == 0 {
            ClaimState::Done
        } else {
            ClaimState::Processing
        };
        assert_eq!(view.state, state, "{k}");
        if i % 2 == 1 {
            // The owner's token came along: its holder can finish.
            let done = restored.done(&key(&k), *token, ttl(), T).await.unwrap();
            assert!(matches!(done, DoneOutcome::Done { .. }), "{k}");
        }
    }
    assert!(restored.get(&key("after"), T).await.unwrap().is_none());
    let head = restored.head(&key("s1"), T).await.unwrap().unwrap();
    assert_eq!(head.event_id, key("ev1"));
    let e2 = restored
        .inbox()
        .inbox_event("sume", "e2")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(e2.body, big_body());
    assert_eq!(e2.headers, [("x-customer".to_owned(), "h-e2".to_owned())]);
    // The dedupe of an event backed up holds.
    assert_eq!(
        restored
            .inbox()
            .ingest(event("e1", b"again"), T)
            .await
            .unwrap(),
        IngestOutcome::Duplicate
    );
    // Fences go on above every fence the old store handed out, after the
    // backup too.
    let (_, next) = claim(&restored, "new").await;
    assert!(next > highest, "{next} > {highest}");
    assert!(next > claims.last().unwrap().1 + FENCE_FLOOR);
    let indexes = restored.inbox().inbox_indexes().await.unwrap();
    assert!(indexes.orphan_seals.is_empty() && indexes.shared_slots.is_empty());
    restored.close().await;
}

#[tokio::test]
async fn a_restored_file_is_a_new_one_closed_cleanly_whose_key_file_and_log_are_its_own() {
    let dir = TempDir::new().unwrap();
    let store = open_held(dir.path(), None);
    store.inbox().ingest(event("e1", b"one"), T).await.unwrap();
    let bytes = backup_of(&store, T).await;
    let from = verify_backup(&file(dir.path(), "b", &bytes)).unwrap();
    store.close().await;
    let target = TempDir::new().unwrap();
    let data = restore_to(&dir.path().join("b"), target.path(), T)
        .await
        .unwrap();
    let report = verify_data_file(&data).unwrap();
    assert!(report.closed_cleanly);
    assert_eq!(report.to_replay, 0);
    assert_eq!(report.sealed, 1);
    assert_ne!(format!("{:032x}", report.id), from.header.data_file);
    // The original's log and key file are not the restored file's: put
    // beside it, they are refused (so a stale log is never replayed into
    // a restored file).
    for ext in [".wal", ".keys"] {
        let restored = std::fs::read(format!("{}{ext}", data.display())).unwrap();
        let original = std::fs::read(format!("{}/dedupd.redb{ext}", dir.path().display())).unwrap();
        std::fs::write(format!("{}{ext}", data.display()), &original).unwrap();
        assert!(RedbStore::open(&RedbOptions::new(&data)).is_err(), "{ext}");
        std::fs::write(format!("{}{ext}", data.display()), &restored).unwrap();
    }
    assert_eq!(event_body(&data, "e1").await, b"one");
}

/// The keys in a backup's bytes (its keys frames).
fn keys_in(backup: &[u8]) -> Vec<(u64, Vec<u8>)> {
    let mut r = FrameReader::new(backup).unwrap();
    let mut out = Vec::new();
    while let Some(f) = r.next_frame().unwrap() {
        if f.kind == Kind::Keys {
            out.extend(
                key_slots(&f.payload)
                    .unwrap()
                    .into_iter()
                    .map(|(s, k)| (s, k.to_vec())),
            );
        }
    }
    out
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test]
async fn a_backup_holds_the_keys_of_its_events_only_and_none_of_an_event_erased_before_it() {
    let dir = TempDir::new().unwrap();
    let store = open_held(dir.path(), None);
    let inbox = store.inbox();
    for id in ["gone", "kept"] {
        inbox
            .ingest(event(id, format!("marker-{id}-body").as_bytes()), T)
            .await
            .unwrap();
    }
    let before = backup_of(&store, T).await;
    assert_eq!(
        inbox.erase("sume", "gone", 86_400_000, T).await.unwrap(),
        EraseOutcome::Erased
    );
    let after = backup_of(&store, T).await;
    store.close().await;
    // The backup taken before the erasure holds the event and its key; the
    // one after holds neither: one key, the kept event's, and no seal of
    // the erased one anywhere in its bytes.
    assert_eq!(keys_in(&before).len(), 2);
    let keys = keys_in(&after);
    assert_eq!(keys.len(), 1);
    let kept_slot = keys[0].0;
    let b = file(dir.path(), "after", &after);
    assert_eq!(verify_backup(&b).unwrap().sealed, 1);
    for marker in ["marker-gone-body", "h-gone", "marker-kept-body"] {
        assert!(!contains(&after, marker.as_bytes()), "{marker} in plain");
    }
    let seals = after.windows(8).filter(|w| w == b"DDSEAL1\0").count();
    assert_eq!(seals, 1, "one seal: the kept event's");
    let at = after.windows(8).position(|w| w == b"DDSEAL1\0").unwrap();
    assert_eq!(
        u64::from_le_bytes(after[at + 8..at + 16].try_into().unwrap()),
        kept_slot
    );
    // Restored, the erased event is an erased record; restoring the backup
    // taken before brings it back whole (an erasure cannot reach a backup
    // taken before it: the docs say so).
    let t1 = TempDir::new().unwrap();
    let data = restore_to(&b, t1.path(), T).await.unwrap();
    let r = RedbStore::open(&RedbOptions::new(&data)).unwrap();
    let gone = r
        .inbox()
        .inbox_event("sume", "gone")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(gone.status, EventStatus::Erased);
    assert!(gone.body.is_empty());
    r.close().await;
    let t2 = TempDir::new().unwrap();
    let data = restore_to(&file(dir.path(), "before", &before), t2.path(), T)
        .await
        .unwrap();
    let r = RedbStore::open(&RedbOptions::new(&data)).unwrap();
    let back = r
        .inbox()
        .inbox_event("sume", "gone")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(back.body, b"marker-gone-body");
    r.close().await;
}

/// Hashes of every file in `dir`.
pub(crate) fn snapshot_of(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap_or_default(),
            )
        })
        .collect();
    out.sort();
    out
}

#[tokio::test]
async fn a_backup_changed_anywhere_or_cut_short_is_refused_and_the_target_is_left_as_it_was() {
    let dir = TempDir::new().unwrap();
    let store = open_held(dir.path(), None);
    store.inbox().ingest(event("e1", b"one"), T).await.unwrap();
    claim(&store, "k").await;
    let good = backup_of(&store, T).await;
    store.close().await;
    let scratch = TempDir::new().unwrap();
    let path = scratch.path().join("b");
    // Every byte changed, and every length cut: verify refuses each.
    for i in 0..good.len() {
        let mut bad = good.clone();
        bad[i] ^= 0x01;
        std::fs::write(&path, &bad).unwrap();
        assert!(verify_backup(&path).is_err(), "byte {i} changed");
        std::fs::write(&path, &good[..i]).unwrap();
        assert!(verify_backup(&path).is_err(), "cut at {i}");
    }
    let mut longer = good.clone();
    longer.extend_from_slice(&good);
    std::fs::write(&path, &longer).unwrap();
    assert!(verify_backup(&path).is_err(), "two joined");
    // A restore of a damaged one over a data directory in use elsewhere
    // changes nothing there, even asked to replace.
    let target = TempDir::new().unwrap();
    let live = open_held(target.path(), None);
    claim(&live, "mine").await;
    live.close().await;
    let there = snapshot_of(target.path());
    let seal_at = good.windows(8).position(|w| w == b"DDSEAL1\0").unwrap();
    for (what, bad) in [
        ("cut in half", good[..good.len() / 2].to_vec()),
        ("a body's byte changed", {
            let mut b = good.clone();
            b[seal_at + 40] ^= 0x80;
            b
        }),
        ("bytes after its end", longer.clone()),
    ] {
        std::fs::write(&path, &bad).unwrap();
        let err = restore_to(&path, target.path(), T).await.unwrap_err();
        assert!(matches!(err, RestoreError::Backup { .. }), "{what}: {err}");
        assert!(err.to_string().contains("nothing was restored"), "{err}");
        assert_eq!(snapshot_of(target.path()), there, "{what}: target changed");
    }
    std::fs::write(&path, &good).unwrap();
    restore_to(&path, target.path(), T).await.unwrap();
    assert_ne!(snapshot_of(target.path()), there);
}

#[tokio::test]
async fn a_restore_refuses_a_data_file_in_use_and_files_there_unless_told_to_replace_them() {
    let dir = TempDir::new().unwrap();
    let store = open_held(dir.path(), None);
    claim(&store, "k").await;
    let path = file(dir.path(), "b", &backup_of(&store, T).await);
    let data = dir.path().join("dedupd.redb");
    let opts = |replace| RestoreOptions {
        backup: path.clone(),
        data: data.clone(),
        replace,
        now_ms: T,
        keep_free: 8 << 20,
    };
    let err = restore(opts(true)).await.unwrap_err();
    assert!(matches!(err, RestoreError::InUse(_)), "{err}");
    store.close().await;
    let there = snapshot_of(dir.path());
    let err = restore(opts(false)).await.unwrap_err();
    assert!(matches!(err, RestoreError::Exists(_)), "{err}");
    assert_eq!(snapshot_of(dir.path()), there);
    let done = restore(opts(true)).await.unwrap();
    // The four files that were there are kept aside, whole.
    assert_eq!(done.moved_aside.len(), 4, "{:?}", done.moved_aside);
    for aside in &done.moved_aside {
        let name = aside.file_name().unwrap().to_string_lossy();
        let was = name.split(".before-restore-").next().unwrap();
        let old = there.iter().find(|(n, _)| n == was).unwrap();
        assert_eq!(std::fs::read(aside).unwrap(), old.1, "{name}");
    }
    let r = RedbStore::open(&RedbOptions::new(&data)).unwrap();
    assert!(r.get(&key("k"), T).await.unwrap().is_some());
    r.close().await;
}

/// A FIFO where the data file goes is refused at once, and left there: a
/// read-only open of it (to see whether a server has it) would wait for a
/// writer for ever.
#[tokio::test]
async fn a_restore_onto_a_fifo_is_refused_without_waiting_for_a_writer() {
    let dir = TempDir::new().unwrap();
    let path = a_backup_in(dir.path()).await;
    let target = TempDir::new().unwrap();
    let data = target.path().join("dedupd.redb");
    crate::support::process::mkfifo(&data);
    let into = target.path().to_owned();
    let err = crate::support::process::unblocked("the restore", move || {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(restore_to(&path, &into, T)).err()
    })
    .expect("a restore onto a FIFO is refused");
    assert!(matches!(err, RestoreError::NotAFile(_)), "{err}");
    use std::os::unix::fs::FileTypeExt as _;
    assert!(
        std::fs::symlink_metadata(&data)
            .unwrap()
            .file_type()
            .is_fifo()
    );
}

/// A data_path that is a symbolic link (to a file on another disk) is
/// refused, link and file left as they are: the renames would have put
/// the restored file where the link was, on the link's disk.
#[tokio::test]
async fn a_restore_onto_a_link_is_refused_and_changes_nothing() {
    let dir = TempDir::new().unwrap();
    let path = a_backup_in(dir.path()).await;
    let target = TempDir::new().unwrap();
    let elsewhere = TempDir::new().unwrap();
    let real = elsewhere.path().join("dedupd.redb");
    std::fs::write(&real, b"the file on the other disk").unwrap();
    let data = target.path().join("dedupd.redb");
    std::os::unix::fs::symlink(&real, &data).unwrap();
    let err = restore_to(&path, target.path(), T)
        .await
        .expect_err("a link is refused");
    assert!(matches!(err, RestoreError::Link(_)), "{err}");
    assert!(err.to_string().contains("symbolic link"), "{err}");
    assert_eq!(std::fs::read_link(&data).unwrap(), real);
    assert_eq!(std::fs::read(&real).unwrap(), b"the file on the other disk");
    assert_eq!(std::fs::read_dir(target.path()).unwrap().count(), 1);
    // So is a key file linked elsewhere (a volume of secrets).
    std::fs::remove_file(&data).unwrap();
    let keys = target.path().join("dedupd.redb.keys");
    let real_keys = elsewhere.path().join("dedupd.redb.keys");
    std::fs::write(&real_keys, b"the keys elsewhere").unwrap();
    std::os::unix::fs::symlink(&real_keys, &keys).unwrap();
    let err = restore_to(&path, target.path(), T)
        .await
        .expect_err("a linked key file is refused");
    assert!(matches!(&err, RestoreError::Link(p) if *p == keys), "{err}");
    assert_eq!(std::fs::read_link(&keys).unwrap(), real_keys);
    assert_eq!(std::fs::read(&real_keys).unwrap(), b"the keys elsewhere");
}

/// A writer that fails once it took `room` bytes: a full disk under the
/// backup file.
#[derive(Debug)]
struct FullAfter {
    room: usize,
    took: usize,
}

impl Write for FullAfter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.took + buf.len() > self.room {
            return Err(std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                "no space left on device",
            ));
        }
        self.took += buf.len();
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_full_disk_under_the_backup_fails_it_and_the_next_one_is_whole() {
    let dir = TempDir::new().unwrap();
    let store = open_held(dir.path(), None);
    store
        .inbox()
        .ingest(event("e1", &big_body()), T)
        .await
        .unwrap();
    let err = store
        .backups()
        .write_to(
            T,
            FullAfter {
                room: 2 << 20,
                took: 0,
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(err, BackupError::Write(_)), "{err}");
    // Its turn and its snapshot are given back: the store writes, and the
    // next backup is whole.
    claim(&store, "k").await;
    let bytes = backup_of(&store, T).await;
    let report = verify_backup(&file(dir.path(), "b", &bytes)).unwrap();
    assert_eq!(report.rows("claim_rows"), 1);
    store.close().await;
}

/// A writer that waits, at its first write, until told to go on.
#[derive(Debug)]
struct Gate {
    reached: Arc<AtomicBool>,
    go: Arc<AtomicBool>,
}

impl Write for Gate {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.reached.store(true, Ordering::SeqCst);
        while !self.go.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Lets the [`Gate`] go on when dropped.
struct Release(Arc<AtomicBool>);

impl Drop for Release {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

async fn until(what: &str, f: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(tokio::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_fault_during_a_backup_stops_it_and_the_store_recovers_without_waiting_for_it() {
    let dir = TempDir::new().unwrap();
    let plan = FaultPlan::new();
    let store = open_held(dir.path(), Some(plan.clone()));
    let (_, fence) = claim(&store, "before").await;
    let (reached, go) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let gate = Gate {
        reached: reached.clone(),
        go: go.clone(),
    };
    // A failed assertion below must not leave the copy waiting forever.
    let _release = Release(go.clone());
    let backups = store.backups();
    let copy = tokio::spawn(async move { backups.write_to(T, gate).await });
    until("the copy began", || reached.load(Ordering::SeqCst)).await;
    // A second one waits its turn: refused at once.
    assert!(matches!(
        store.backups().write_to(T, Vec::new()).await,
        Err(BackupError::Busy)
    ));
    // The disk fails under a write while the copy holds its snapshot.
    plan.fail_next_syncs(1);
    let failed = store.claim(&key("during"), ttl(), None, T).await;
    assert!(
        matches!(failed, Err(StoreError::Unavailable(_))),
        "{failed:?}"
    );
    go.store(true, Ordering::SeqCst);
    let err = copy.await.unwrap().unwrap_err();
    assert!(
        matches!(err, BackupError::Store(_)),
        "the copy stops at the fault: {err}"
    );
    // The writer reopens the file (the copy let go of it) and writes again.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let next = loop {
        match store.claim(&key("after"), ttl(), None, T).await {
            Ok(ClaimOutcome::Claimed { fence, .. }) => break fence,
            Ok(other) => panic!("{other:?}"),
            Err(_) => {
                assert!(tokio::time::Instant::now() < deadline, "no recovery");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    assert!(next > fence);
    let bytes = backup_of(&store, T).await;
    let report = verify_backup(&file(dir.path(), "b", &bytes)).unwrap();
    assert_eq!(
        report.rows("claim_rows"),
        2,
        "before and after; not the refused one"
    );
    store.close().await;
}

/// A store holding 24 MB that no compression shrinks (more than a
/// streaming reader's queue takes: chunks of up to a frame), and a backup of it streamed to a
/// reader that takes nothing: returned once its queue is full, the copy
/// waiting on it with its snapshot held.
async fn stalled_stream(
    dir: &Path,
) -> (
    RedbStore,
    tokio::sync::mpsc::Receiver<std::io::Result<bytes::Bytes>>,
) {
    let store = open_held(dir, None);
    for i in 0..24u32 {
        let value: Vec<u8> = (0..1_000_000u32)
            .map(|j| (j.wrapping_mul(2_654_435_761) >> 13) as u8 ^ i as u8)
            .collect();
        set(&store, &format!("big-{i}"), &value).await;
    }
    let (_, chunks) = store.backups().stream(T).await.unwrap();
    until("the reader's queue is full", || chunks.capacity() == 0).await;
    (store, chunks)
}

/// What a streaming reader gets to the end: how many chunks, then the
/// error that ended the stream (a stream that ends without one fails).
async fn read_to_the_error(
    chunks: &mut tokio::sync::mpsc::Receiver<std::io::Result<bytes::Bytes>>,
) -> (usize, std::io::Error) {
    let mut n = 0;
    loop {
        match chunks.recv().await {
            Some(Ok(_)) => n += 1,
            Some(Err(e)) => {
                assert!(chunks.recv().await.is_none(), "nothing after the error");
                return (n, e);
            }
            None => panic!("the stream ended without an error after {n} chunks: a whole file?"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_stopping_ends_a_backup_whose_reader_takes_nothing_at_once_and_refuses_the_next() {
    let dir = TempDir::new().unwrap();
    let (store, mut chunks) = stalled_stream(dir.path()).await;
    // Returns once the copy has let go of its snapshot, the reader having
    // taken nothing: long before the copy would give it up.
    tokio::time::timeout(STALL / 2, store.backups().stop())
        .await
        .expect("the stop waited for the reader");
    // The reader gets what was queued, then the error: its file is cut
    // short, and refused.
    let (n, err) = read_to_the_error(&mut chunks).await;
    assert!(n > 0);
    assert!(err.to_string().contains("the server is stopping"), "{err}");
    // No backup begins once the server is stopping.
    let refused = store.backups().write_to(T, Vec::new()).await.unwrap_err();
    assert!(matches!(refused, BackupError::Closing), "{refused}");
    // The store goes on writing, and closes: nothing holds the file.
    claim(&store, "after").await;
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_the_store_ends_a_backup_whose_reader_takes_nothing_at_once() {
    let dir = TempDir::new().unwrap();
    let (store, mut chunks) = stalled_stream(dir.path()).await;
    // The close waits for every reader of the file, the copy's snapshot
    // among them: the copy stops rather than waiting on its reader.
    tokio::time::timeout(STALL / 2, store.close())
        .await
        .expect("the close waited for the backup's reader");
    let (_, err) = read_to_the_error(&mut chunks).await;
    assert!(err.to_string().contains("the server is stopping"), "{err}");
}

/// The files of a store in `dir` as a crash leaves them: the data file
/// from before `writes`, its log and key file after.
async fn crashed(dir: &Path) -> PathBuf {
    let path = dir.join("dedupd.redb");
    let store = open_held(dir, None);
    store.inbox().ingest(event("e0", b"zero"), T).await.unwrap();
    let read = store.inbox().inbox_event("sume", "e0").await.unwrap();
    assert!(read.is_some());
    store.close().await;
    let store = open_held(dir, None);
    let data = std::fs::read(&path).unwrap();
    claim(&store, "k").await;
    store.inbox().ingest(event("e1", b"one"), T).await.unwrap();
    let copies: Vec<(String, Vec<u8>)> = [".wal", ".wal2", ".keys"]
        .into_iter()
        .map(|ext| {
            let p = format!("{}{ext}", path.display());
            (p.clone(), std::fs::read(&p).unwrap())
        })
        .collect();
    store.close().await;
    std::fs::write(&path, data).unwrap();
    for (p, bytes) in copies {
        std::fs::write(p, bytes).unwrap();
    }
    path
}

#[tokio::test]
async fn verify_checks_a_stopped_data_file_its_log_and_key_file_and_changes_nothing() {
    let dir = TempDir::new().unwrap();
    let data = crashed(dir.path()).await;
    let there = snapshot_of(dir.path());
    let report = verify_data_file(&data).unwrap();
    assert!(!report.closed_cleanly);
    assert!(report.to_replay > 0, "{report:?}");
    assert_eq!(report.sealed, 1, "e0 is in the file; e1 in the log");
    assert_eq!(snapshot_of(dir.path()), there, "verify wrote nothing");
    // Without its log: what the log held is missing.
    let wal = format!("{}.wal", data.display());
    let log = std::fs::read(&wal).unwrap();
    std::fs::remove_file(&wal).unwrap();
    let err = verify_data_file(&data).unwrap_err();
    assert!(err.to_string().contains("not closed cleanly"), "{err}");
    // A damaged record in the middle of the log.
    let mut damaged = log.clone();
    let mid = 28 + 12;
    damaged[mid] ^= 0xff;
    std::fs::write(&wal, &damaged).unwrap();
    let err = verify_data_file(&data).unwrap_err();
    assert!(err.to_string().contains("write-ahead log"), "{err}");
    std::fs::write(&wal, &log).unwrap();
    // Another data file's key file.
    let other = TempDir::new().unwrap();
    let o = open_held(other.path(), None);
    o.inbox().ingest(event("x", b"x"), T).await.unwrap();
    o.close().await;
    let keys = format!("{}.keys", data.display());
    let ours = std::fs::read(&keys).unwrap();
    std::fs::copy(other.path().join("dedupd.redb.keys"), &keys).unwrap();
    let err = verify_data_file(&data).unwrap_err();
    assert!(err.to_string().contains("key file"), "{err}");
    std::fs::write(&keys, ours).unwrap();
    // While a store has it open: refused.
    let open = RedbStore::open(&RedbOptions::new(&data)).unwrap();
    assert!(matches!(verify_data_file(&data), Err(VerifyError::InUse)));
    open.close().await;
    let report = verify_data_file(&data).unwrap();
    assert!(report.closed_cleanly && report.to_replay == 0);
    assert_eq!(report.sealed, 2);
    assert!(report.notes.is_empty(), "{:?}", report.notes);
    // A page changed under redb's checksums.
    let bytes = std::fs::read(&data).unwrap();
    let mut bad = bytes.clone();
    let mut changed = 0;
    for i in 0..bad.len() - 7 {
        if &bad[i..i + 7] == b"DDSEAL1" {
            bad[i + 40] ^= 0xff;
            changed += 1;
        }
    }
    assert!(changed > 0);
    std::fs::write(&data, &bad).unwrap();
    let err = verify_data_file(&data).unwrap_err();
    assert!(err.to_string().contains("checksum"), "{err}");
    assert_eq!(std::fs::read(&data).unwrap(), bad, "verify wrote nothing");
}

/// A bulk job's record (an erase job's names the person it erases) is
/// stored sealed under a key slot of its own: it opens after a crash's
/// log replay and after a restore (a backup holds it as the job runner
/// wrote it, and no key for it), and once the job ended, or its record is
/// deleted, no version before opens from any file of the data file.
#[tokio::test]
async fn a_jobs_record_opens_after_a_crash_and_a_restore_and_none_replaced_opens_once_it_ended() {
    use crate::support::recover::{contains, recoverable};
    const PERSON: &str = "dana.job.5c2e71@example.com";
    let running = format!("{{\"state\":\"running\",\"value\":\"{PERSON}\"}}").into_bytes();
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("dedupd.redb");
    let store = open_held(dir.path(), None);
    store
        .inbox()
        .put_job("job_a", running.clone(), T)
        .await
        .unwrap();
    store
        .inbox()
        .put_job("job_b", b"{\"n\":1}".to_vec(), T)
        .await
        .unwrap();
    assert!(
        !contains(
            &std::fs::read(format!("{}.wal", path.display())).unwrap(),
            PERSON.as_bytes()
        ),
        "the log holds the record sealed"
    );
    // A crash: the data file from before the puts (the store holds them
    // uncommitted), its log and key file as they are.
    let crash = TempDir::new().unwrap();
    for ext in ["", ".wal", ".wal2", ".keys"] {
        let from = format!("{}{ext}", path.display());
        std::fs::copy(&from, crash.path().join(format!("dedupd.redb{ext}"))).unwrap();
    }
    let replayed = RedbStore::open(&RedbOptions::new(crash.path().join("dedupd.redb"))).unwrap();
    let jobs = replayed.inbox().jobs().await.unwrap();
    assert_eq!(jobs.len(), 2);
    assert_eq!((jobs[0].id.as_str(), &jobs[0].record), ("job_a", &running));
    replayed.close().await;
    // In a backup as written, with no key (it holds no event).
    let bytes = backup_of(&store, T).await;
    assert!(contains(&bytes, PERSON.as_bytes()));
    assert!(keys_in(&bytes).is_empty());
    let target = TempDir::new().unwrap();
    let data = restore_to(&file(dir.path(), "b", &bytes), target.path(), T)
        .await
        .unwrap();
    // Sealed again in the restored file, and gone from it once the job
    // ended there.
    let in_plain = |dir: &Path| {
        recoverable(dir, PERSON)
            .into_iter()
            .filter(|found| found.ends_with("in plain"))
            .collect::<Vec<_>>()
    };
    assert_eq!(in_plain(target.path()), Vec::<String>::new());
    let restored = RedbStore::open(&RedbOptions::new(&data)).unwrap();
    let jobs = restored.inbox().jobs().await.unwrap();
    assert_eq!(jobs[0].record, running);
    assert!(!recoverable(target.path(), PERSON).is_empty());
    restored
        .inbox()
        .end_job("job_a", b"{\"state\":\"done\"}".to_vec(), T + 1)
        .await
        .unwrap();
    assert_eq!(recoverable(target.path(), PERSON), Vec::<String>::new());
    restored.close().await;
    assert_eq!(recoverable(target.path(), PERSON), Vec::<String>::new());
    std::fs::remove_file(dir.path().join("b")).unwrap();
    assert!(
        !recoverable(dir.path(), PERSON).is_empty(),
        "stored while it runs"
    );

    // It ended: the versions before no longer open, at once and after a
    // clean stop; the last one does.
    let ended = b"{\"state\":\"done\",\"value\":\"(dropped)\"}".to_vec();
    store
        .inbox()
        .end_job("job_a", ended.clone(), T + 1)
        .await
        .unwrap();
    assert_eq!(recoverable(dir.path(), PERSON), Vec::<String>::new());
    store
        .inbox()
        .put_job("job_b", running.clone(), T + 1)
        .await
        .unwrap();
    store.inbox().delete_job("job_b", T + 2).await.unwrap();
    assert_eq!(recoverable(dir.path(), PERSON), Vec::<String>::new());
    store.close().await;
    assert_eq!(recoverable(dir.path(), PERSON), Vec::<String>::new());
    let store = RedbStore::open(&RedbOptions::new(&path)).unwrap();
    let jobs = store.inbox().jobs().await.unwrap();
    assert_eq!(jobs.len(), 1);
    assert_eq!((jobs[0].id.as_str(), &jobs[0].record), ("job_a", &ended));
    store.close().await;
}

/// A job's record read while the next version is written is found, the
/// one or the other: never left out because the version the read saw had
/// its key shredded meanwhile (each `end_job` shreds the slots of the
/// versions before it; a put leaves that to the store's next shred).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_jobs_record_read_while_it_is_replaced_is_always_found() {
    let dir = TempDir::new().unwrap();
    let store =
        Arc::new(RedbStore::open(&RedbOptions::new(dir.path().join("dedupd.redb"))).unwrap());
    store
        .inbox()
        .put_job("job_a", b"{\"n\":0}".to_vec(), T)
        .await
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (store, stop) = (store.clone(), stop.clone());
            tokio::spawn(async move {
                let mut reads = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    let jobs = store.inbox().jobs().await.unwrap();
                    assert_eq!(jobs.len(), 1, "after {reads} reads: {jobs:?}");
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    for n in 1..=400 {
        let record = format!("{{\"n\":{n}}}").into_bytes();
        store.inbox().end_job("job_a", record, T + n).await.unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for reader in readers {
        assert!(reader.await.unwrap() > 0);
    }
    let jobs = store.inbox().jobs().await.unwrap();
    assert_eq!(jobs[0].record, b"{\"n\":400}");
}

/// A job's record that does not open (another key in its slot: a key file
/// copied at another moment) is not listed, and left out of a backup, which
/// restores without it.
#[tokio::test]
async fn a_jobs_record_that_does_not_open_is_left_out_of_a_backup_that_restores() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("dedupd.redb");
    let store = RedbStore::open(&RedbOptions::new(&path)).unwrap();
    store
        .inbox()
        .put_job("job_a", b"{\"n\":1}".to_vec(), T)
        .await
        .unwrap();
    store.inbox().ingest(event("e1", b"one"), T).await.unwrap();
    store.close().await;
    // The job's seal names its slot (bytes 8..16 after `DDSEAL1\0`): a
    // new key there.
    let keys_path = format!("{}.keys", path.display());
    let mut keys = std::fs::read(&keys_path).unwrap();
    let data = std::fs::read(&path).unwrap();
    let slot = data
        .windows(8)
        .enumerate()
        .filter(|(_, w)| *w == b"DDSEAL1\0")
        .map(|(i, _)| u64::from_le_bytes(data[i + 8..i + 16].try_into().unwrap()))
        .collect::<std::collections::BTreeSet<_>>();
    let events = store_slots_of_events(&path).await;
    let job_slot = *slot.difference(&events).next().expect("the job's slot");
    let at = 32 + 32 * usize::try_from(job_slot).unwrap();
    for b in &mut keys[at..at + 32] {
        *b ^= 0x5a;
    }
    std::fs::write(&keys_path, &keys).unwrap();

    let store = RedbStore::open(&RedbOptions::new(&path)).unwrap();
    assert!(store.inbox().jobs().await.unwrap().is_empty(), "not listed");
    let bytes = backup_of(&store, T).await;
    store.close().await;
    let target = TempDir::new().unwrap();
    let restored = restore_to(&file(dir.path(), "b", &bytes), target.path(), T)
        .await
        .unwrap();
    let store = RedbStore::open(&RedbOptions::new(&restored)).unwrap();
    assert!(store.inbox().jobs().await.unwrap().is_empty());
    store.close().await;
    assert_eq!(event_body(&restored, "e1").await, b"one");
}

/// The body of the event `id` of source `sume` in the data file at `data`
/// (opened and closed for it).
async fn event_body(data: &Path, id: &str) -> Vec<u8> {
    let store = RedbStore::open(&RedbOptions::new(data)).unwrap();
    let e = store
        .inbox()
        .inbox_event("sume", id)
        .await
        .unwrap()
        .unwrap();
    store.close().await;
    e.body
}

/// The key slots of the events of the closed data file at `path`.
async fn store_slots_of_events(path: &Path) -> std::collections::BTreeSet<u64> {
    use redb::{ReadableDatabase, ReadableTable};
    let seals: redb::TableDefinition<(&str, &str), u64> = redb::TableDefinition::new("inbox_seals");
    let db = redb::Database::open(path).unwrap();
    let tx = db.begin_read().unwrap();
    let table = tx.open_table(seals).unwrap();
    table
        .iter()
        .unwrap()
        .map(|r| r.unwrap().1.value())
        .collect()
}
