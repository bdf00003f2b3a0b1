//! Disk faults on every write path of the redb store, injected through a
//! storage backend that fails writes and syncs on demand: each refused
//! write answers `Unavailable` and changes nothing, readiness fails while
//! the file cannot commit, the store recovers by itself once the disk takes
//! writes again, and nothing acknowledged is lost.

use std::sync::Arc;
use std::time::Duration;

use dedupd::domain::{CreatedAt, Key, Namespace, ScopedKey, Ttl};
use dedupd::store::inbox::{EventKey, EventStatus, Inbox, ListOrder, NewEvent, Retention, Settle};
use dedupd::store::redb::faults::FaultPlan;
use dedupd::store::redb::{RedbOptions, RedbStore};
use dedupd::store::{ClaimOutcome, ClaimState, Store, StoreError};
use tempfile::TempDir;

const T: u64 = 1_800_000_000_000;
const RETENTION: Retention = Retention {
    delivered_ms: 1_000,
    dead_ms: 5_000,
};

fn key(k: &str) -> ScopedKey {
    ScopedKey::api(&Key::parse(k, "key").unwrap())
}

fn event(id: &str) -> NewEvent {
    NewEvent {
        source: "sume".into(),
        event_id: id.into(),
        stream: Some("run".into()),
        created_at: CreatedAt::parse("2026-11-29T10:00:00Z", "created_at").unwrap(),
        received_at_ms: T,
        headers: Vec::new(),
        body: b"{}".to_vec(),
    }
}

fn ttl(ms: u64) -> Ttl {
    Ttl::from_ms_unchecked(ms)
}

/// Reads that wait as long as a loaded machine may need for a reopen or a
/// sync (the default 2 s is what a service wants; a test asserting that a
/// read waits must not fail because the machine was slow).
fn patient_reads(o: &mut RedbOptions) {
    o.read_reopen_wait = Duration::from_secs(30);
}

struct Faulty {
    _dir: TempDir,
    opts: RedbOptions,
    plan: Arc<FaultPlan>,
    store: RedbStore,
}

impl Faulty {
    fn open() -> Self {
        Self::with(|_| {})
    }

    fn with(tune: impl FnOnce(&mut RedbOptions)) -> Self {
        let dir = TempDir::new().unwrap();
        let plan = FaultPlan::new();
        let mut opts = RedbOptions::new(dir.path().join("faulty.redb"));
        opts.cache_bytes = 2 * 1024 * 1024;
        opts.faults = Some(plan.clone());
        tune(&mut opts);
        let store = RedbStore::open(&opts).unwrap();
        Self {
            _dir: dir,
            opts,
            plan,
            store,
        }
    }

    /// Fills the disk, runs `op`, which must be refused as unavailable,
    /// checks readiness fails, frees the disk and waits for the store to
    /// recover by itself.
    async fn refused_then_recovered<T: std::fmt::Debug>(
        &self,
        what: &str,
        op: impl std::future::Future<Output = Result<T, StoreError>>,
    ) {
        self.plan.set_full(true);
        match op.await {
            Err(StoreError::Unavailable(_)) => {}
            other => panic!("{what}: expected Unavailable on a full disk, got {other:?}"),
        }
        assert!(
            self.store.ready().await.is_err(),
            "{what}: not ready while the disk is full"
        );
        self.plan.set_full(false);
        self.recovered(what).await;
    }

    /// Waits (up to 30 s) for the store to be ready again by itself.
    async fn recovered(&self, what: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while self.store.ready().await.is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "{what}: no recovery within 30 s of the disk taking writes"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test]
async fn every_write_path_is_refused_unchanged_on_a_full_disk_and_recovers_by_itself() {
    let f = Faulty::open();
    let s = &f.store;

    // Acknowledged before any fault.
    let kept = match s.claim(&key("kept"), ttl(60_000), None, T).await.unwrap() {
        ClaimOutcome::Claimed { token, .. } => token,
        o => panic!("{o:?}"),
    };
    s.done(&key("kept"), kept, ttl(86_400_000), T)
        .await
        .unwrap();

    // Claims.
    f.refused_then_recovered("claim", s.claim(&key("a"), ttl(60_000), None, T))
        .await;
    assert!(
        s.get(&key("a"), T).await.unwrap().is_none(),
        "claim left nothing"
    );
    let token = match s.claim(&key("a"), ttl(60_000), None, T).await.unwrap() {
        ClaimOutcome::Claimed { token, .. } => token,
        o => panic!("{o:?}"),
    };
    f.refused_then_recovered("extend", s.extend(&key("a"), token, ttl(90_000), T))
        .await;
    assert_eq!(
        s.get(&key("a"), T).await.unwrap().unwrap().expires_at_ms,
        T + 60_000,
        "extend left the expiry"
    );
    f.refused_then_recovered("done", s.done(&key("a"), token, ttl(60_000), T))
        .await;
    assert_eq!(
        s.get(&key("a"), T).await.unwrap().unwrap().state,
        ClaimState::Processing
    );
    f.refused_then_recovered("release", s.release(&key("a"), token, T))
        .await;
    assert!(
        s.get(&key("a"), T).await.unwrap().is_some(),
        "release left it"
    );
    s.release(&key("a"), token, T).await.unwrap();

    // Ordering.
    let ns = Namespace::Api;
    let stream = ScopedKey::new(&ns, &Key::parse("st", "k").unwrap());
    let created = CreatedAt::parse("2026-11-29T10:00:00Z", "c").unwrap();
    f.refused_then_recovered(
        "apply",
        s.apply(&stream, &key("e1"), created, 86_400_000, T),
    )
    .await;
    assert!(
        s.head(&stream, T).await.unwrap().is_none(),
        "apply left no head"
    );
    s.apply(&stream, &key("e1"), created, 86_400_000, T)
        .await
        .unwrap();

    // The inbox: ingest, lease, settle, redeliver.
    f.refused_then_recovered("ingest", s.inbox().ingest(event("ev"), T))
        .await;
    assert!(s.inbox().inbox_event("sume", "ev").await.unwrap().is_none());
    s.inbox().ingest(event("ev"), T).await.unwrap();
    let lease = vec![(EventKey::new("sume", "ev", None), T + 60_000)];
    f.refused_then_recovered("lease", s.inbox().lease(lease.clone(), None, T))
        .await;
    assert_eq!(
        s.inbox()
            .inbox_event("sume", "ev")
            .await
            .unwrap()
            .unwrap()
            .lease,
        0
    );
    let generation = s.inbox().lease(lease, None, T).await.unwrap().leased[0].lease;
    let dead = Settle::Dead {
        error: "HTTP 503".into(),
    };
    f.refused_then_recovered(
        "settle",
        s.inbox().settle(
            &EventKey::new("sume", "ev", None),
            generation,
            dead.clone(),
            RETENTION,
            T,
        ),
    )
    .await;
    assert_eq!(
        s.inbox()
            .inbox_event("sume", "ev")
            .await
            .unwrap()
            .unwrap()
            .status,
        EventStatus::Pending
    );
    s.inbox()
        .settle(
            &EventKey::new("sume", "ev", None),
            generation,
            dead,
            RETENTION,
            T,
        )
        .await
        .unwrap();
    assert_eq!(
        s.inbox()
            .inbox_event("sume", "ev")
            .await
            .unwrap()
            .unwrap()
            .status,
        EventStatus::Dead
    );
    f.refused_then_recovered("redeliver", s.inbox().redeliver("sume", "ev", T))
        .await;
    assert_eq!(
        s.inbox()
            .inbox_event("sume", "ev")
            .await
            .unwrap()
            .unwrap()
            .status,
        EventStatus::Dead
    );

    // The reaper.
    let later = T + 120_000;
    f.refused_then_recovered("purge", s.purge_expired(later, 100))
        .await;
    assert!(s.inbox().inbox_event("sume", "ev").await.unwrap().is_some());
    assert!(s.purge_expired(later, 100).await.unwrap().total() > 0);
    assert!(f.plan.injected() > 0);

    // Nothing acknowledged was lost: open the file afresh, without faults.
    s.close().await;
    let mut opts = f.opts.clone();
    opts.faults = None;
    let s = RedbStore::open(&opts).unwrap();
    assert_eq!(
        s.get(&key("kept"), T).await.unwrap().unwrap().state,
        ClaimState::Done
    );
    assert!(s.head(&stream, T).await.unwrap().is_some());
    s.close().await;
}

#[tokio::test]
async fn a_write_whose_log_sync_failed_is_refused_and_gone_once_the_store_recovers() {
    let f = Faulty::open();
    let held = match f.store.claim(&key("before"), ttl(60_000), None, T).await {
        Ok(ClaimOutcome::Claimed { fence, .. }) => fence,
        other => panic!("{other:?}"),
    };
    f.plan.fail_next_syncs(1);
    let r = f.store.claim(&key("x"), ttl(60_000), None, T).await;
    assert!(matches!(r, Err(StoreError::Unavailable(_))), "{r:?}");
    // The writer reopens the file and replays the log up to the last batch
    // answered `Ok`: the refused claim is not there, the earlier one is.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match f.store.claim(&key("x"), ttl(60_000), None, T).await {
            Ok(ClaimOutcome::Claimed { .. }) => break,
            Err(StoreError::Unavailable(_)) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => panic!("the refused claim must be gone: {other:?}"),
        }
    }
    let before = f.store.get(&key("before"), T).await.unwrap().unwrap();
    assert_eq!(before.fence, held);
    assert!(f.store.ready().await.is_ok());
    f.store.close().await;
}

/// Under load batch follows batch, each synced before the next runs (its
/// writes queue meanwhile). A sync that fails refuses
/// the batches it covered and every one after them until the file is
/// reopened: afterwards, every claim answered `Ok` is there with its fence,
/// and no refused one is.
#[tokio::test(flavor = "current_thread")]
async fn a_failed_sync_under_load_refuses_exactly_what_was_not_acknowledged() {
    failed_sync_under_load(false).await;
}

/// The same with the log synced on a thread of its own (the default with
/// one CPU), where the writer runs the next batches while a sync covering
/// several of them fails.
#[tokio::test(flavor = "current_thread")]
async fn with_the_sync_on_its_own_thread_a_failed_sync_refuses_exactly_what_was_not_acknowledged() {
    failed_sync_under_load(true).await;
}

async fn failed_sync_under_load(sync_thread: bool) {
    // Batches of at most 8, 200 queued claims at a time: the first 200 go
    // through; the next sync, in the middle of the second 200, fails.
    // (Armed once the first wave is answered: how many batches one sync
    // covers depends on the machine's speed, so "the second sync fails"
    // could fall after the last batch, or right after the first.)
    let f = Arc::new(Faulty::with(|o| {
        o.max_batch = 8;
        o.sync_thread = sync_thread;
    }));
    let before = f.store.claim(&key("before"), ttl(60_000), None, T).await;
    assert!(matches!(before, Ok(ClaimOutcome::Claimed { .. })));
    let wave = |range: std::ops::Range<usize>| {
        range
            .map(|i| {
                let f = f.clone();
                let c = tokio::spawn(async move {
                    f.store
                        .claim(&key(&format!("k{i}")), ttl(60_000), None, T)
                        .await
                });
                (i, c)
            })
            .collect::<Vec<_>>()
    };
    let (mut acknowledged, mut refused) = (Vec::new(), Vec::new());
    for (i, c) in wave(0..200) {
        match c.await.unwrap() {
            Ok(ClaimOutcome::Claimed { fence, .. }) => acknowledged.push((i, fence)),
            other => panic!("k{i} before any fault: {other:?}"),
        }
    }
    f.plan.fail_next_syncs(1);
    for (i, c) in wave(200..400) {
        match c.await.unwrap() {
            Ok(ClaimOutcome::Claimed { fence, .. }) => acknowledged.push((i, fence)),
            Err(StoreError::Unavailable(_)) => refused.push(i),
            other => panic!("k{i}: {other:?}"),
        }
    }
    assert_eq!(f.plan.injected(), 1);
    assert!(!refused.is_empty(), "the failed sync refused nothing");
    f.recovered("after the failed sync").await;
    for (i, fence) in acknowledged {
        let got = f.store.get(&key(&format!("k{i}")), T).await.unwrap();
        assert_eq!(got.map(|c| c.fence), Some(fence), "acknowledged claim k{i}");
    }
    for i in refused {
        let got = f.store.get(&key(&format!("k{i}")), T).await.unwrap();
        assert!(got.is_none(), "refused claim k{i} is there: {got:?}");
    }
}

/// A read of a keyspace key waits for no claim's sync, nor a read of a
/// claim for a keyspace write's: each space of the index in memory keeps
/// the last batch that changed it, and a read waits only for that one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_of_one_space_waits_for_no_sync_of_the_other() {
    use dedupd::store::keyspace::{KvRequest, SetCondition, SetExpiry};

    let f = Arc::new(Faulty::with(patient_reads));
    let set = |k: &'static str| {
        let f = f.clone();
        async move {
            let request = KvRequest::Set {
                key: k.as_bytes().to_vec(),
                value: b"v".to_vec(),
                condition: SetCondition::Always,
                expiry: SetExpiry::Clear,
                get: false,
            };
            f.store.keyspace().submit(request, T).await?.await
        }
    };
    set("kv").await.unwrap();
    f.store
        .claim(&key("claim"), ttl(60_000), None, T)
        .await
        .unwrap();
    // A batch that ran (and changed the index) but whose sync hangs.
    let ran_one_more = |f: &Faulty, before: u64| f.store.write_stats().operations > before;
    let hang = Duration::from_secs(5);

    let before = f.store.write_stats().operations;
    f.plan.set_hung(true);
    let claim = tokio::spawn({
        let f = f.clone();
        async move { f.store.claim(&key("slow"), ttl(60_000), None, T).await }
    });
    while !ran_one_more(&f, before) {
        tokio::task::yield_now().await;
    }
    let read = tokio::time::timeout(hang, f.store.keyspace().get(b"kv".to_vec(), T)).await;
    assert_eq!(
        read.expect("a keyspace read waited for a claim's sync")
            .unwrap()
            .map(|e| e.value),
        Some(b"v".to_vec())
    );
    f.plan.set_hung(false);
    assert!(matches!(
        claim.await.unwrap(),
        Ok(ClaimOutcome::Claimed { .. })
    ));

    let before = f.store.write_stats().operations;
    f.plan.set_hung(true);
    let write = tokio::spawn(set("slow"));
    while !ran_one_more(&f, before) {
        tokio::task::yield_now().await;
    }
    let read = tokio::time::timeout(hang, f.store.get(&key("claim"), T)).await;
    assert_eq!(
        read.expect("a claim's read waited for a keyspace write's sync")
            .unwrap()
            .map(|v| v.state),
        Some(ClaimState::Processing)
    );
    f.plan.set_hung(false);
    write.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_never_shows_a_write_whose_sync_has_not_returned() {
    let f = Arc::new(Faulty::with(patient_reads));
    f.plan.set_hung(true);
    let claim = tokio::spawn({
        let f = f.clone();
        async move { f.store.claim(&key("slow"), ttl(60_000), None, T).await }
    });
    // Until the sync returns, a read of the key waits (it would otherwise
    // show a claim that a crash now would lose).
    let mut read = tokio::spawn({
        let f = f.clone();
        async move {
            loop {
                // The first read may run before the claim's batch commits.
                if let Some(v) = f.store.get(&key("slow"), T).await.unwrap() {
                    return v.state;
                }
                tokio::task::yield_now().await;
            }
        }
    });
    // Reads of the key answer "absent" until the batch commits; from then
    // on they wait for its sync. Either way none answers before the claim.
    let hang = Duration::from_millis(300);
    assert!(
        tokio::time::timeout(hang, &mut read).await.is_err(),
        "a read showed the claim while its sync hung"
    );
    assert!(!claim.is_finished());
    f.plan.set_hung(false);
    assert!(matches!(
        claim.await.unwrap(),
        Ok(ClaimOutcome::Claimed { .. })
    ));
    assert_eq!(read.await.unwrap(), ClaimState::Processing);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_wait_out_the_reopen_after_a_disk_fault_instead_of_failing() {
    let f = Arc::new(Faulty::with(patient_reads));
    let s = &f.store;
    assert!(matches!(
        s.claim(&key("kept"), ttl(60_000), None, T).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    s.inbox().ingest(event("e1"), T).await.unwrap();

    // A write fails: redb poisons the handle, and the writer gives it up
    // and reopens the file, which fails while the disk is full.
    f.plan.set_full(true);
    assert!(matches!(
        s.claim(&key("refused"), ttl(60_000), None, T).await,
        Err(StoreError::Unavailable(_))
    ));
    let after_claim = f.plan.injected();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while f.plan.injected() == after_claim {
        assert!(
            std::time::Instant::now() < deadline,
            "the writer never tried to reopen"
        );
        tokio::task::yield_now().await;
    }
    // Reads issued now find no open file; they wait for it rather than
    // answering 503 to an operator looking at the inbox.
    let reads = tokio::spawn({
        let f = f.clone();
        async move {
            let claim = f.store.get(&key("kept"), T).await;
            let listing = f
                .store
                .inbox()
                .list_events(
                    "sume",
                    EventStatus::Pending,
                    ListOrder::OldestFirst,
                    None,
                    10,
                )
                .await;
            let refused = f.store.get(&key("refused"), T).await;
            (claim, listing, refused)
        }
    });
    let mut reads = reads;
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut reads)
            .await
            .is_err(),
        "the reads answered while the file could not be opened"
    );
    f.plan.set_full(false);
    let (claim, listing, refused) = reads.await.unwrap();
    assert_eq!(
        claim.expect("a read across the reopen").unwrap().state,
        ClaimState::Processing
    );
    let (events, _) = listing.expect("a listing across the reopen");
    assert_eq!(events.len(), 1);
    assert!(refused.unwrap().is_none(), "the refused claim left nothing");
    Arc::try_unwrap(f).ok().unwrap().store.close().await;
}

#[tokio::test(start_paused = true)]
async fn a_read_answers_unavailable_when_the_file_cannot_be_reopened_at_all() {
    let f = Faulty::open();
    let s = &f.store;
    f.plan.set_full(true);
    assert!(matches!(
        s.claim(&key("refused"), ttl(60_000), None, T).await,
        Err(StoreError::Unavailable(_))
    ));
    let after_claim = f.plan.injected();
    while f.plan.injected() == after_claim {
        tokio::task::yield_now().await;
    }
    // Every write fails, so the file never reopens: the read gives up at
    // its deadline (on the paused clock) instead of hanging.
    match s.get(&key("refused"), T).await {
        Err(StoreError::Unavailable(_)) => {}
        other => panic!("expected Unavailable, got {other:?}"),
    }
    f.plan.set_full(false);
    f.store.close().await;
}

#[tokio::test]
async fn a_read_after_a_failed_sync_wakes_the_idle_writer_and_answers() {
    let f = Faulty::open();
    f.plan.fail_next_syncs(1);
    let r = f.store.claim(&key("x"), ttl(60_000), None, T).await;
    assert!(matches!(r, Err(StoreError::Unavailable(_))), "{r:?}");
    // Nothing else is written, so the writer sits idle with the refused
    // claim committed but unsynced. A read of it must not wait for a write
    // that never comes: it wakes the writer, which reopens the file without
    // the refused claim, and the read answers from the reopened file.
    let got = f.store.get(&key("x"), T).await;
    assert!(
        matches!(got, Ok(None)),
        "the read answers, and the refused claim is gone: {got:?}"
    );
    f.store.close().await;
}

/// The keyspace's keys are found through a map in memory that the writer
/// changes as it runs a batch, before the batch's log record is synced.
/// What a read finds there must wait for that sync like any other read,
/// and a write refused after it was in the map must be gone from the map
/// once the file is reopened. Small values are answered from the map,
/// large ones from their rows: both are checked.
mod keyspace {
    use super::*;
    use dedupd::store::keyspace::{KvRequest, KvResponse, SetCondition, SetExpiry};

    fn set(key: &str, value: Vec<u8>) -> KvRequest {
        KvRequest::Set {
            key: key.as_bytes().to_vec(),
            value,
            condition: SetCondition::IfAbsent,
            expiry: SetExpiry::At((T + 60_000) as i64),
            get: false,
        }
    }

    async fn submit(s: &RedbStore, req: KvRequest) -> Result<KvResponse, StoreError> {
        s.keyspace().submit(req, T).await?.await
    }

    const WRITTEN: KvResponse = KvResponse::Set {
        written: true,
        old: None,
    };

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_read_never_shows_a_set_whose_sync_has_not_returned() {
        for value in [b"processing".to_vec(), vec![9u8; 4_000]] {
            let f = Arc::new(Faulty::with(patient_reads));
            f.plan.set_hung(true);
            let write = tokio::spawn({
                let f = f.clone();
                let value = value.clone();
                async move { submit(&f.store, set("slow", value)).await }
            });
            let mut read = tokio::spawn({
                let f = f.clone();
                async move {
                    loop {
                        if let Some(e) = f.store.keyspace().get(b"slow".to_vec(), T).await.unwrap()
                        {
                            return e.value;
                        }
                        tokio::task::yield_now().await;
                    }
                }
            });
            let mut count = tokio::spawn({
                let f = f.clone();
                async move {
                    loop {
                        if f.store
                            .keyspace()
                            .count(vec![b"slow".to_vec()], T)
                            .await
                            .unwrap()
                            == 1
                        {
                            return;
                        }
                        tokio::task::yield_now().await;
                    }
                }
            });
            let hang = Duration::from_millis(300);
            assert!(
                tokio::time::timeout(hang, &mut read).await.is_err(),
                "GET showed the key while its sync hung"
            );
            assert!(
                tokio::time::timeout(hang, &mut count).await.is_err(),
                "EXISTS showed the key while its sync hung"
            );
            assert!(!write.is_finished());
            f.plan.set_hung(false);
            assert_eq!(write.await.unwrap().unwrap(), WRITTEN);
            assert_eq!(read.await.unwrap(), value);
            count.await.unwrap();
        }
    }

    #[tokio::test]
    async fn a_set_whose_sync_failed_is_gone_from_reads_once_the_file_is_reopened() {
        for value in [b"processing".to_vec(), vec![9u8; 4_000]] {
            let f = Faulty::open();
            assert_eq!(
                submit(&f.store, set("before", value.clone()))
                    .await
                    .unwrap(),
                WRITTEN
            );
            f.plan.fail_next_syncs(1);
            let r = submit(&f.store, set("x", value.clone())).await;
            assert!(matches!(r, Err(StoreError::Unavailable(_))), "{r:?}");
            // The refused SET was in the map; the read wakes the writer,
            // which reopens the file and rebuilds the map without it.
            let got = f.store.keyspace().get(b"x".to_vec(), T).await;
            assert!(matches!(got, Ok(None)), "the refused SET is gone: {got:?}");
            let n = f
                .store
                .keyspace()
                .count(vec![b"x".to_vec(), b"before".to_vec()], T)
                .await;
            assert!(matches!(n, Ok(1)), "only the acknowledged key: {n:?}");
            let before = f.store.keyspace().get(b"before".to_vec(), T).await.unwrap();
            assert_eq!(before.map(|e| e.value), Some(value.clone()));
            // And NX now writes it: the writer's map agrees.
            assert_eq!(submit(&f.store, set("x", value)).await.unwrap(), WRITTEN);
            f.store.close().await;
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_failed_sync_under_load_loses_no_acknowledged_set_and_keeps_no_refused_one() {
        // Two waves of 200, the fault armed between them (as for claims).
        let f = Arc::new(Faulty::with(|o| o.max_batch = 8));
        let wave = |range: std::ops::Range<usize>| {
            range
                .map(|i| {
                    let f = f.clone();
                    // Every third value is read from its row.
                    let value = if i % 3 == 0 {
                        vec![1u8; 600]
                    } else {
                        vec![2u8; 10]
                    };
                    let w = tokio::spawn(async move {
                        submit(&f.store, set(&format!("k{i}"), value)).await
                    });
                    (i, w)
                })
                .collect::<Vec<_>>()
        };
        let (mut acknowledged, mut refused) = (Vec::new(), Vec::new());
        for (i, w) in wave(0..200) {
            match w.await.unwrap() {
                Ok(r) if r == WRITTEN => acknowledged.push(i),
                other => panic!("k{i} before any fault: {other:?}"),
            }
        }
        f.plan.fail_next_syncs(1);
        for (i, w) in wave(200..400) {
            match w.await.unwrap() {
                Ok(r) if r == WRITTEN => acknowledged.push(i),
                Err(StoreError::Unavailable(_)) => refused.push(i),
                other => panic!("k{i}: {other:?}"),
            }
        }
        assert_eq!(f.plan.injected(), 1);
        assert!(!refused.is_empty(), "the failed sync refused nothing");
        f.recovered("after the failed sync").await;
        for i in acknowledged {
            let got = f
                .store
                .keyspace()
                .get(format!("k{i}").into_bytes(), T)
                .await
                .unwrap();
            assert!(got.is_some(), "acknowledged SET k{i} is missing");
        }
        for i in refused {
            let got = f
                .store
                .keyspace()
                .get(format!("k{i}").into_bytes(), T)
                .await
                .unwrap();
            assert!(got.is_none(), "refused SET k{i} is there: {got:?}");
            // The writer's map agrees: NX writes it now.
            let again = submit(&f.store, set(&format!("k{i}"), vec![3]))
                .await
                .unwrap();
            assert_eq!(again, WRITTEN, "k{i}");
        }
    }
}

/// The keyspace's map names a new key's row from the moment the writer
/// runs its SET, and the row is there only once the batch commits, after
/// its log append. While the append hangs (a slow or stuck disk), a GET of
/// the key waits and never answers an error of its own: it answers
/// "unavailable" (retry) at its deadline, or the value once the write is
/// acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_of_a_large_value_whose_batch_has_not_committed_waits_for_it() {
    use dedupd::store::keyspace::{KvRequest, KvResponse, SetCondition, SetExpiry};
    let f = Arc::new(Faulty::open());
    let value = vec![7u8; 4_000];
    f.plan.set_appends_hung(true);
    let write = tokio::spawn({
        let f = f.clone();
        let value = value.clone();
        async move {
            let req = KvRequest::Set {
                key: b"big".to_vec(),
                value,
                condition: SetCondition::IfAbsent,
                expiry: SetExpiry::Clear,
                get: false,
            };
            f.store.keyspace().submit(req, T).await?.await
        }
    });
    // Until the writer has run the SET, the key reads as absent; from then
    // on, reads wait for it.
    let mut read = tokio::spawn({
        let f = f.clone();
        async move {
            loop {
                match f.store.keyspace().get(b"big".to_vec(), T).await {
                    Ok(None) => tokio::task::yield_now().await,
                    other => return other,
                }
            }
        }
    });
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut read)
            .await
            .is_err(),
        "a GET answered while the SET's batch had not committed"
    );
    // Held past the reads' own deadline (2 s): they answer "unavailable",
    // never an error of another kind, and never the value.
    let held = tokio::time::timeout(Duration::from_millis(2_500), &mut read).await;
    if let Ok(answer) = held {
        let answer = answer.unwrap();
        assert!(
            matches!(answer, Err(StoreError::Unavailable(_))),
            "while the append hangs: {answer:?}"
        );
    }
    f.plan.set_appends_hung(false);
    let written = write.await.unwrap().unwrap();
    assert_eq!(
        written,
        KvResponse::Set {
            written: true,
            old: None
        }
    );
    let got = f.store.keyspace().get(b"big".to_vec(), T).await.unwrap();
    assert_eq!(got.map(|e| e.value), Some(value));
    if !read.is_finished() {
        let answer = read.await.unwrap().unwrap();
        assert_eq!(answer.map(|e| e.value.len()), Some(4_000));
    }
}

/// At `max_key_memory_bytes` the writer purges expired keys ahead of a
/// batch, in a logged, synced write of its own. When that sync fails, the
/// batch that waited for it is refused and nothing runs before the file is
/// reopened: afterwards every claim acknowledged before is there, the
/// refused one is not, and the purge's room is taken again.
#[tokio::test]
async fn a_failed_sync_of_a_purge_at_the_key_cap_refuses_the_batch_behind_it() {
    failed_purge_at_the_cap(false).await;
}

/// The same with the log synced on a thread of its own: the batch behind
/// the purge runs, and is refused by the failed sync that covers both.
#[tokio::test]
async fn with_the_sync_on_its_own_thread_a_failed_purge_at_the_cap_refuses_the_batch_behind_it() {
    failed_purge_at_the_cap(true).await;
}

async fn failed_purge_at_the_cap(sync_thread: bool) {
    let f = Faulty::with(|o| {
        o.max_key_memory_bytes = 1024;
        o.sync_thread = sync_thread;
    });
    let mut held = Vec::new();
    loop {
        let k = format!("k{}", held.len());
        match f.store.claim(&key(&k), ttl(1_000), None, T).await {
            Ok(ClaimOutcome::Claimed { fence, .. }) => held.push((k, fence)),
            Err(StoreError::KeysFull { .. }) => break,
            other => panic!("{k}: {other:?}"),
        }
        assert!(held.len() < 20, "a cap of 1 KiB took 20 claims");
    }
    // All expired: the next new key makes the writer purge first, and
    // that purge's sync fails.
    f.plan.fail_next_syncs(1);
    let r = f
        .store
        .claim(&key("new"), ttl(60_000), None, T + 2_000)
        .await;
    assert!(matches!(r, Err(StoreError::Unavailable(_))), "{r:?}");
    assert_eq!(f.plan.injected(), 1);
    f.recovered("after the purge's failed sync").await;
    // The refused purge is not replayed: the claims it would have deleted
    // are still stored, expired, with their fences.
    for (k, fence) in &held {
        let got = f.store.get(&key(k), T).await.unwrap();
        assert_eq!(got.map(|c| c.fence), Some(*fence), "{k}");
    }
    assert!(f.store.get(&key("new"), T + 2_000).await.unwrap().is_none());
    // The disk takes writes again: the purge makes room and the key is
    // taken.
    let r = f
        .store
        .claim(&key("new"), ttl(60_000), None, T + 2_000)
        .await;
    assert!(matches!(r, Ok(ClaimOutcome::Claimed { .. })), "{r:?}");
    f.store.close().await;
}
