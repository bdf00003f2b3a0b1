//! The writer keeps one redb transaction open over several batches
//! (`storage.commit_hold`): each batch is durable in the write-ahead log
//! before it is answered, and redb commits later. A user must not be able
//! to tell: a read sees every write answered before it, a large keyspace
//! value overwritten in the open transaction reads as the new one, and a
//! batch that fails, or a disk fault, undoes none of the answered batches
//! the transaction held. The hold is an hour here, so only a read, a
//! failure or a close can end the transaction.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use dedupd::domain::{Key, ScopedKey, Ttl};
use dedupd::store::keyspace::{KvRequest, KvResponse, SetCondition, SetExpiry};
use dedupd::store::redb::faults::FaultPlan;
use dedupd::store::redb::{RedbOptions, RedbStore};
use dedupd::store::{ClaimOutcome, ClaimState, Store, StoreError};
use tempfile::TempDir;

const T: u64 = 1_800_000_000_000;

fn key(k: &str) -> ScopedKey {
    ScopedKey::api(&Key::parse(k, "key").unwrap())
}

fn ttl() -> Ttl {
    Ttl::from_ms_unchecked(60_000)
}

struct Held {
    dir: TempDir,
    plan: Arc<FaultPlan>,
    store: RedbStore,
}

impl Held {
    fn open() -> Self {
        let dir = TempDir::new().unwrap();
        let plan = FaultPlan::new();
        let store = RedbStore::open(&Self::options(&dir, &plan)).unwrap();
        Self { dir, plan, store }
    }

    fn options(dir: &TempDir, plan: &Arc<FaultPlan>) -> RedbOptions {
        let mut opts = RedbOptions::new(dir.path().join("held.redb"));
        opts.commit_hold = Duration::from_secs(3600);
        opts.faults = Some(plan.clone());
        opts
    }

    fn commits(&self) -> u64 {
        self.store.write_stats().commits
    }

    async fn claim(&self, k: &str) -> Result<ClaimOutcome, StoreError> {
        self.store.claim(&key(k), ttl(), None, T).await
    }

    async fn state(&self, k: &str) -> Option<ClaimState> {
        self.store.get(&key(k), T).await.unwrap().map(|v| v.state)
    }

    async fn set(&self, k: &str, value: Vec<u8>) {
        let request = KvRequest::Set {
            key: k.as_bytes().to_vec(),
            value,
            condition: SetCondition::Always,
            expiry: SetExpiry::Clear,
            get: false,
        };
        let answer = self
            .store
            .keyspace()
            .submit(request, T)
            .await
            .unwrap()
            .await;
        assert!(matches!(answer, Ok(KvResponse::Set { .. })), "{answer:?}");
    }

    async fn value(&self, k: &str) -> Option<Vec<u8>> {
        self.store
            .keyspace()
            .get(k.as_bytes().to_vec(), T)
            .await
            .unwrap()
            .map(|e| e.value)
    }
}

#[tokio::test]
async fn answered_writes_share_one_commit_until_a_read_needs_them() {
    let h = Held::open();
    let before = h.commits();
    for i in 0..20 {
        let outcome = h.claim(&format!("k{i}")).await.unwrap();
        assert!(
            matches!(outcome, ClaimOutcome::Claimed { .. }),
            "{outcome:?}"
        );
    }
    assert_eq!(
        h.commits(),
        before,
        "twenty answered claims, one after another, are all in the open transaction"
    );
    for i in 0..20 {
        assert_eq!(
            h.state(&format!("k{i}")).await,
            Some(ClaimState::Processing),
            "claim k{i} was answered, so a read sees it"
        );
    }
    assert_eq!(
        h.commits(),
        before,
        "a claim is read from the index in memory: no commit for it"
    );
    // A read of a table (a stream's head) needs them committed.
    let stream = key("orders");
    assert_eq!(h.store.head(&stream, T).await.unwrap(), None);
    assert_eq!(h.store.head(&stream, T).await.unwrap(), None);
    assert_eq!(
        h.commits(),
        before + 1,
        "the first read of the file committed them all at once; the next found them committed"
    );
}

/// A claim whose record is too large for the index in memory (a 256-byte
/// fingerprint) is read from its row: answered in the open transaction, it
/// reads back at once, and a claim of it with another fingerprint is told
/// apart from one with the same.
#[tokio::test]
async fn a_claim_too_large_for_the_index_reads_from_its_row() {
    use dedupd::domain::Fingerprint;
    let h = Held::open();
    let mine = Fingerprint::parse(&"a".repeat(256)).unwrap();
    let other = Fingerprint::parse(&"b".repeat(256)).unwrap();
    let outcome = h
        .store
        .claim(&key("big"), ttl(), Some(mine.clone()), T)
        .await
        .unwrap();
    let ClaimOutcome::Claimed { fence, .. } = outcome else {
        panic!("{outcome:?}");
    };
    let view = h
        .store
        .get(&key("big"), T)
        .await
        .unwrap()
        .expect("answered");
    assert_eq!((view.state, view.fence), (ClaimState::Processing, fence));
    let same = h
        .store
        .claim(&key("big"), ttl(), Some(mine), T)
        .await
        .unwrap();
    let differs = h
        .store
        .claim(&key("big"), ttl(), Some(other), T)
        .await
        .unwrap();
    assert!(
        matches!(same, ClaimOutcome::Busy { .. }),
        "the same fingerprint: busy, {same:?}"
    );
    assert!(
        matches!(differs, ClaimOutcome::FingerprintMismatch { .. }),
        "the stored fingerprint was read back from the row: {differs:?}"
    );
}

#[tokio::test]
async fn a_large_value_overwritten_in_the_open_transaction_reads_as_the_new_one() {
    let h = Held::open();
    let (old, new) = (vec![b'o'; 4096], vec![b'n'; 4096]);
    h.set("big", old.clone()).await;
    assert_eq!(h.value("big").await, Some(old));
    // The row keeps its id, and the committed row still holds this key:
    // only the commit the read asks for makes the new value readable.
    h.set("big", new.clone()).await;
    assert_eq!(h.value("big").await, Some(new));
}

#[tokio::test]
async fn a_failed_batch_undoes_none_of_the_answered_batches_before_it() {
    let h = Held::open();
    assert!(matches!(
        h.claim("before").await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    h.set("kv-before", vec![b'v'; 1024]).await;
    let commits = h.commits();

    h.plan.fail_next_batches(1);
    match h.claim("failed").await {
        Err(StoreError::Failed(_)) => {}
        other => panic!("the failing batch answers its error, got {other:?}"),
    }
    assert_eq!(h.commits(), commits, "nothing was committed by the failure");

    // The dropped transaction's answered batches were run again.
    assert_eq!(h.state("before").await, Some(ClaimState::Processing));
    assert_eq!(h.value("kv-before").await, Some(vec![b'v'; 1024]));
    assert_eq!(
        h.state("failed").await,
        None,
        "the failed claim left nothing"
    );
    assert!(matches!(
        h.claim("after").await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));

    // And all of it is in the file after a restart.
    h.store.close().await;
    let again = RedbStore::open(&Held::options(&h.dir, &h.plan)).unwrap();
    for k in ["before", "after"] {
        assert!(again.get(&key(k), T).await.unwrap().is_some(), "{k}");
    }
    assert!(again.get(&key("failed"), T).await.unwrap().is_none());
}

#[tokio::test]
async fn a_disk_fault_after_answered_uncommitted_batches_keeps_them() {
    let h = Held::open();
    for k in ["a", "b"] {
        assert!(matches!(
            h.claim(k).await.unwrap(),
            ClaimOutcome::Claimed { .. }
        ));
    }
    let commits = h.commits();

    h.plan.set_full(true);
    match h.claim("refused").await {
        Err(StoreError::Unavailable(_)) => {}
        other => panic!("a full disk refuses the claim, got {other:?}"),
    }
    assert_eq!(h.commits(), commits, "a and b were never committed");
    h.plan.set_full(false);

    // The file is reopened and the log replayed: a and b are there.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while h.store.ready().await.is_err() {
        assert!(std::time::Instant::now() < deadline, "no recovery in 30 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(h.state("a").await, Some(ClaimState::Processing));
    assert_eq!(h.state("b").await, Some(ClaimState::Processing));
    assert_eq!(h.state("refused").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_value_reads_while_other_keys_are_written_without_pause() {
    let h = Arc::new(Held::open());
    let big = vec![b'b'; 4096];
    h.set("big", big.clone()).await;
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    // Many writers, each with one set in flight: a batch is always running.
    let writers: Vec<_> = (0..64)
        .map(|w| {
            let (h, stop, written) = (h.clone(), stop.clone(), written.clone());
            tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    h.set(&format!("other-{w}-{n}"), vec![b'o'; 512]).await;
                    written.fetch_add(1, Ordering::Relaxed);
                    n += 1;
                }
            })
        })
        .collect();
    // The reads start only once the writers are under way (on a busy machine
    // the reads could otherwise all finish before the first set does).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while written.load(Ordering::Relaxed) < 256 {
        assert!(
            std::time::Instant::now() < deadline,
            "the writers never got going"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for _ in 0..50 {
        assert_eq!(
            h.value("big").await,
            Some(big.clone()),
            "the big key's own batch is long committed: later batches of other keys do not hold its read back"
        );
    }
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
}
