//! The keyspace's rows are keyed by row id, and the map from key to row is
//! in memory, rebuilt from the table on open and then brought up to date by
//! replaying the write-ahead log. So every way the store can close and open
//! again must find the keyspace exactly as it was answered. Random keyspace
//! writes run on two stores side by side: one never closes, the other is
//! closed and opened again at random points, with a checkpoint (`close`)
//! or without one (dropped: the file keeps its last checkpoint, the log
//! the batches since). Values are small (kept in the map too) or large
//! (read from their row). Every answer and every key must agree.

use std::sync::Arc;

use dedupd::store::Store;
use dedupd::store::keyspace::{
    ExpireCondition, KvEntry, KvRequest, KvResponse, SetCondition, SetExpiry,
};
use dedupd::store::redb::{OpenError, RedbOptions, RedbStore};
use proptest::prelude::*;
use tempfile::TempDir;

const T0: u64 = 1_800_000_000_000;
const KEYS: u8 = 8;

#[derive(Debug, Clone)]
enum Expiry {
    Clear,
    Keep,
    /// Milliseconds from now; zero or less deletes the key.
    In(i64),
}

#[derive(Debug, Clone)]
enum Op {
    Set {
        key: u8,
        value: u8,
        condition: SetCondition,
        expiry: Expiry,
        get: bool,
    },
    Delete(Vec<u8>),
    Expire {
        key: u8,
        in_ms: i64,
        condition: ExpireCondition,
    },
    Persist(u8),
    /// Several writes in one pipeline (one batch, usually).
    Burst(Vec<(u8, u8)>),
    Advance(u64),
    Reap,
    Reopen {
        checkpoint: bool,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0..KEYS;
    let condition = prop_oneof![
        Just(SetCondition::Always),
        Just(SetCondition::IfAbsent),
        Just(SetCondition::IfPresent),
    ];
    let expiry = prop_oneof![
        Just(Expiry::Clear),
        Just(Expiry::Keep),
        (-1_000i64..5_000).prop_map(Expiry::In),
    ];
    let expire_condition = prop_oneof![
        Just(ExpireCondition::Always),
        Just(ExpireCondition::IfNone),
        Just(ExpireCondition::IfSome),
        Just(ExpireCondition::Later),
        Just(ExpireCondition::Earlier),
    ];
    prop_oneof![
        6 => (key.clone(), any::<u8>(), condition, expiry, any::<bool>()).prop_map(
            |(key, value, condition, expiry, get)| Op::Set {
                key,
                value,
                condition,
                expiry,
                get
            }
        ),
        2 => proptest::collection::vec(key.clone(), 1..4).prop_map(Op::Delete),
        2 => (key.clone(), -1_000i64..5_000, expire_condition).prop_map(|(key, in_ms, condition)| {
            Op::Expire {
                key,
                in_ms,
                condition,
            }
        }),
        1 => key.clone().prop_map(Op::Persist),
        2 => proptest::collection::vec((key, any::<u8>()), 1..12).prop_map(Op::Burst),
        2 => (1u64..3_000).prop_map(Op::Advance),
        1 => Just(Op::Reap),
        2 => any::<bool>().prop_map(|checkpoint| Op::Reopen { checkpoint }),
    ]
}

fn name(key: u8) -> Vec<u8> {
    format!("sume:wh:{key}").into_bytes()
}

fn options(dir: &TempDir) -> RedbOptions {
    let mut opts = RedbOptions::new(dir.path().join("kv.redb"));
    opts.cache_bytes = 2 * 1024 * 1024;
    opts
}

/// A value of `byte`: small (kept in the map) or, for odd bytes over 200,
/// larger than the map keeps (read from the row).
fn value_of(byte: u8) -> Vec<u8> {
    let len = if byte > 200 && byte % 2 == 1 {
        300 + usize::from(byte)
    } else {
        usize::from(byte % 40) + 1
    };
    vec![byte; len]
}

/// Opens the file, waiting while a dropped store's writer still has it.
fn open(opts: &RedbOptions) -> RedbStore {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match RedbStore::open(opts) {
            Ok(s) => return s,
            Err(OpenError::InUse(_)) if std::time::Instant::now() < deadline => {
                std::thread::yield_now();
            }
            Err(e) => panic!("reopening: {e}"),
        }
    }
}

async fn everything(store: &RedbStore, now: u64) -> Vec<Option<KvEntry>> {
    let mut all = Vec::new();
    for key in 0..KEYS {
        all.push(store.keyspace().get(name(key), now).await.unwrap());
    }
    all
}

async fn check(ops: Vec<Op>) {
    let kept_dir = TempDir::new().unwrap();
    let kept = RedbStore::open(&options(&kept_dir)).unwrap();
    let dir = TempDir::new().unwrap();
    let opts = options(&dir);
    let mut moved = Some(RedbStore::open(&opts).unwrap());
    let mut now = T0;
    for (step, op) in ops.into_iter().enumerate() {
        let ctx = format!("step {step} at {now}: {op:?}");
        let store = moved.as_ref().unwrap();
        let requests: Vec<KvRequest> = match op {
            Op::Set {
                key,
                value,
                condition,
                expiry,
                get,
            } => vec![KvRequest::Set {
                key: name(key),
                value: value_of(value),
                condition,
                expiry: match expiry {
                    Expiry::Clear => SetExpiry::Clear,
                    Expiry::Keep => SetExpiry::Keep,
                    Expiry::In(ms) => SetExpiry::At(now as i64 + ms),
                },
                get,
            }],
            Op::Delete(keys) => vec![KvRequest::Delete {
                keys: keys.into_iter().map(name).collect(),
            }],
            Op::Expire {
                key,
                in_ms,
                condition,
            } => vec![KvRequest::Expire {
                key: name(key),
                at: now as i64 + in_ms,
                condition,
            }],
            Op::Persist(key) => vec![KvRequest::Persist { key: name(key) }],
            Op::Burst(writes) => writes
                .into_iter()
                .map(|(key, value)| KvRequest::Set {
                    key: name(key),
                    value: value_of(value),
                    condition: SetCondition::Always,
                    expiry: SetExpiry::At(now as i64 + 4_000),
                    get: false,
                })
                .collect(),
            Op::Advance(ms) => {
                now += ms;
                Vec::new()
            }
            Op::Reap => {
                let a = kept.purge_expired(now, 2).await.unwrap();
                let b = store.purge_expired(now, 2).await.unwrap();
                assert_eq!((a.kv, a.more), (b.kv, b.more), "{ctx}");
                Vec::new()
            }
            Op::Reopen { checkpoint } => {
                let old = moved.take().unwrap();
                if checkpoint {
                    old.close().await;
                } else {
                    drop(old);
                }
                moved = Some(tokio::task::block_in_place(|| open(&opts)));
                Vec::new()
            }
        };
        let store = moved.as_ref().unwrap();
        // Submitted together, answered in order: one batch on each side.
        let mut pending = Vec::new();
        for req in &requests {
            let a = kept.keyspace().submit(req.clone(), now).await.unwrap();
            let b = store.keyspace().submit(req.clone(), now).await.unwrap();
            pending.push((a, b));
        }
        for (a, b) in pending {
            assert_eq!(a.await.unwrap(), b.await.unwrap(), "{ctx}");
        }
        assert_eq!(
            everything(&kept, now).await,
            everything(store, now).await,
            "{ctx}"
        );
    }
    let store = moved.take().unwrap();
    store.close().await;
    let store = RedbStore::open(&opts).unwrap();
    assert_eq!(
        everything(&kept, now).await,
        everything(&store, now).await,
        "after the last close"
    );
    store.close().await;
    kept.close().await;
}

#[test]
fn keyspace_writes_survive_every_close_and_open() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let config = ProptestConfig {
        cases: 48,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(ops in proptest::collection::vec(op(), 1..40))| {
        rt.block_on(check(ops));
    });
}

/// A thousand keys, half with values read from their rows, dropped
/// without a checkpoint: every one is there after the reopen (rebuilt from
/// the file, then the log), again after a clean close, and once reaped,
/// gone for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_keys_survive_a_drop_and_a_close_and_stay_gone_once_reaped() {
    let dir = TempDir::new().unwrap();
    let opts = options(&dir);
    // Every other value is larger than the map keeps.
    let big = |i: u32| {
        let mut v = i.to_le_bytes().to_vec();
        if i.is_multiple_of(2) {
            v.resize(1_000, b'x');
        }
        v
    };
    let store = Arc::new(RedbStore::open(&opts).unwrap());
    let mut answers = Vec::new();
    for i in 0..1_000u32 {
        let req = KvRequest::Set {
            key: format!("k{i}").into_bytes(),
            value: big(i),
            condition: SetCondition::IfAbsent,
            expiry: SetExpiry::At((T0 + 60_000) as i64),
            get: false,
        };
        answers.push(store.keyspace().submit(req, T0).await.unwrap());
    }
    for a in answers {
        assert_eq!(
            a.await.unwrap(),
            KvResponse::Set {
                written: true,
                old: None
            }
        );
    }
    drop(Arc::into_inner(store).unwrap());
    let store = tokio::task::block_in_place(|| open(&opts));
    for i in (0..1_000u32).step_by(7) {
        let got = store
            .keyspace()
            .get(format!("k{i}").into_bytes(), T0)
            .await
            .unwrap();
        assert_eq!(got.map(|e| e.value), Some(big(i)), "k{i}");
    }
    assert_eq!(
        store
            .keyspace()
            .count(
                (0..1_000u32)
                    .map(|i| format!("k{i}").into_bytes())
                    .collect(),
                T0
            )
            .await
            .unwrap(),
        1_000
    );
    store.close().await;
    let store = RedbStore::open(&opts).unwrap();
    assert_eq!(
        store
            .keyspace()
            .count(
                (0..1_000u32)
                    .map(|i| format!("k{i}").into_bytes())
                    .collect(),
                T0
            )
            .await
            .unwrap(),
        1_000
    );
    // Expired, reaped and gone, and it stays gone after a reopen.
    let later = T0 + 60_000;
    let mut more = true;
    let mut reaped = 0;
    while more {
        let r = store.purge_expired(later, 256).await.unwrap();
        reaped += r.kv;
        more = r.more;
    }
    assert_eq!(reaped, 1_000);
    store.close().await;
    let store = RedbStore::open(&opts).unwrap();
    assert_eq!(
        store.keyspace().get(b"k1".to_vec(), T0).await.unwrap(),
        None
    );
    assert_eq!(store.purge_expired(later, 256).await.unwrap().kv, 0);
    store.close().await;
}
