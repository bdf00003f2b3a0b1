//! Store claim throughput, one caller against 64 concurrent callers, to show
//! what group commit buys: with one caller every claim pays its own durable
//! commit; with 64, claims that arrive during a commit share the next one.
//! And a failing destination's retry turns (lease, then settle for a later
//! attempt) on events with small and large bodies: since the bodies have a
//! table of their own, a turn costs the same whatever the body's size.
//!
//! And the reaper: deleting expired claims, spread over a table of
//! 200,000, 100 or 2,000 per write request.
//!
//! Run: `cargo bench --bench store`. Besides divan's timings (items/s is
//! claims or turns per second), each claim case prints the claims per
//! commit it achieved.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dedupd::domain::CreatedAt;
use dedupd::domain::{Key, ScopedKey, Ttl};
use dedupd::store::Store;
use dedupd::store::inbox::{EventKey, Inbox, NewEvent, Retention, Settle};
use dedupd::store::keyspace::{KvRequest, SetCondition, SetExpiry};
use dedupd::store::redb::{RedbOptions, RedbStore};
use divan::Bencher;
use divan::counter::ItemsCount;

fn main() {
    divan::main();
}

/// A two-thread runtime and a store on a fresh file (kept while the
/// returned directory lives).
fn setup() -> (tokio::runtime::Runtime, tempfile::TempDir, Arc<RedbStore>) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::TempDir::new().unwrap();
    let store =
        Arc::new(RedbStore::open(&RedbOptions::new(dir.path().join("bench.redb"))).unwrap());
    (rt, dir, store)
}

/// Claims per benchmark iteration, split evenly among the callers.
const CLAIMS: usize = 640;

#[divan::bench(args = [1, 64], sample_count = 10, sample_size = 1)]
fn claim(bencher: Bencher, callers: usize) {
    let (rt, _dir, store) = setup();
    let next = Arc::new(AtomicU64::new(0));
    let before = store.write_stats();
    bencher.counter(ItemsCount::new(CLAIMS)).bench_local(|| {
        rt.block_on(async {
            let tasks: Vec<_> = (0..callers)
                .map(|_| {
                    let store = store.clone();
                    let next = next.clone();
                    tokio::spawn(async move {
                        for _ in 0..CLAIMS / callers {
                            let n = next.fetch_add(1, Ordering::Relaxed);
                            let key =
                                ScopedKey::api(&Key::parse(&format!("bench-{n}"), "key").unwrap());
                            store
                                .claim(&key, Ttl::from_ms_unchecked(60_000), None, 1)
                                .await
                                .unwrap();
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
        });
    });
    let after = store.write_stats();
    let ops = after.operations - before.operations;
    let commits = (after.commits - before.commits).max(1);
    eprintln!(
        "claim, {callers} caller(s): {ops} claims in {commits} commits = {:.1} claims per commit",
        ops as f64 / commits as f64
    );
    rt.block_on(store.close());
}

/// Events per retry-turn iteration, all turned concurrently.
const EVENTS: usize = 64;

#[divan::bench(args = [1, 256], sample_count = 10, sample_size = 1)]
fn retry_turn(bencher: Bencher, body_kib: usize) {
    let (rt, _dir, store) = setup();
    let inbox = store.inbox();
    let ids: Vec<String> = (0..EVENTS).map(|i| format!("ev{i}")).collect();
    rt.block_on(async {
        for id in &ids {
            let event = NewEvent {
                source: "sume".into(),
                event_id: id.clone(),
                stream: None,
                created_at: CreatedAt::from_unix_nanos(1),
                received_at_ms: 1,
                headers: vec![("x-sume-signature".into(), "t=1,v1=00".into())],
                body: vec![b'x'; body_kib * 1024],
            };
            inbox.ingest(event, 1).await.unwrap();
        }
    });
    let retention = Retention {
        delivered_ms: 60_000,
        dead_ms: 60_000,
    };
    let turn = Arc::new(AtomicU64::new(1));
    bencher.counter(ItemsCount::new(EVENTS)).bench_local(|| {
        rt.block_on(async {
            // Every event is due at `now`: the last turn moved it there.
            let now = turn.fetch_add(1, Ordering::Relaxed);
            let tasks: Vec<_> = ids
                .iter()
                .map(|id| {
                    let inbox = inbox.clone();
                    let id = id.clone();
                    tokio::spawn(async move {
                        let leased = inbox
                            .lease(
                                vec![(EventKey::new("sume", &id, None), now + 30_000)],
                                None,
                                now,
                            )
                            .await
                            .unwrap();
                        let lease = leased.leased[0].lease;
                        let settle = Settle::Retry {
                            retry_at: now + 1,
                            error: "HTTP 503".into(),
                            attempted: true,
                        };
                        inbox
                            .settle(
                                &EventKey::new("sume", &id, None),
                                lease,
                                settle,
                                retention,
                                now,
                            )
                            .await
                            .unwrap();
                    })
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
        });
    });
    rt.block_on(store.close());
}

/// Claims stored before the reaper's benchmark, in [`SLICES`] slices that
/// expire one second apart: each iteration deletes one slice.
const STORED: u64 = 200_000;
/// Expiry times among the stored claims.
const SLICES: u64 = 10;

/// The reaper's deletions: what it costs the writer to delete expired
/// claims (keys spread over the table, as random keys are), `limit` per
/// write request (the reaper's `batch_size`, default 100).
#[divan::bench(args = [100, 2000], sample_count = 10, sample_size = 1)]
fn purge(bencher: Bencher, limit: u64) {
    fill_then_purge(
        bencher,
        limit,
        |store, n| async move {
            // Keys in no relation to their expiry order.
            let name = format!("k{:016x}", n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let key = ScopedKey::api(&Key::parse(&name, "key").unwrap());
            let ttl = Ttl::from_ms_unchecked(60_000 + (n % SLICES) * 1_000);
            store.claim(&key, ttl, None, 1).await.unwrap();
        },
        |r| r.claims,
    );
}

/// The reaper's deletions in the Redis-protocol keyspace: [`STORED`] keys
/// set with an expiry (row ids in the order they were set, expiries in
/// [`SLICES`] slices unrelated to it), one slice deleted per iteration,
/// `limit` per write request.
#[divan::bench(args = [100, 2000], sample_count = 10, sample_size = 1)]
fn kv_purge(bencher: Bencher, limit: u64) {
    fill_then_purge(
        bencher,
        limit,
        |store, n| async move {
            let request = KvRequest::Set {
                key: format!("k{n}").into_bytes(),
                value: b"processing".to_vec(),
                condition: SetCondition::IfAbsent,
                // Stored at 1 with an expiry 60 s later, as the claims above.
                expiry: SetExpiry::At((1 + 60_000 + (n % SLICES) * 1_000) as i64),
                get: false,
            };
            let keyspace = store.keyspace();
            keyspace.submit(request, 1).await.unwrap().await.unwrap();
        },
        |r| r.kv,
    );
}

/// Stores [`STORED`] records with `write` (record `n`, from 64 callers),
/// then measures deleting one of [`SLICES`] expiry slices per iteration
/// (`limit` per request); `deleted` says which of a report's counts is
/// the slice's.
fn fill_then_purge<W, F>(
    bencher: Bencher,
    limit: u64,
    write: W,
    deleted: fn(&dedupd::store::PurgeReport) -> u64,
) where
    W: Fn(Arc<RedbStore>, u64) -> F + Clone + Send + 'static,
    F: std::future::Future<Output = ()> + Send,
{
    let (rt, _dir, store) = setup();
    let next = Arc::new(AtomicU64::new(0));
    rt.block_on(async {
        let tasks: Vec<_> = (0..64)
            .map(|_| {
                let (store, next, write) = (store.clone(), next.clone(), write.clone());
                tokio::spawn(async move {
                    loop {
                        let n = next.fetch_add(1, Ordering::Relaxed);
                        if n >= STORED {
                            break;
                        }
                        write(store.clone(), n).await;
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
    });
    let slice = Arc::new(AtomicU64::new(0));
    bencher
        .counter(ItemsCount::new(STORED / SLICES))
        .bench_local(|| {
            let now = 1 + 60_000 + slice.fetch_add(1, Ordering::Relaxed) * 1_000;
            rt.block_on(async {
                let mut gone = 0;
                loop {
                    let r = store.purge_expired(now, limit).await.unwrap();
                    gone += deleted(&r);
                    if !r.more {
                        break;
                    }
                }
                assert_eq!(gone, STORED / SLICES, "one slice expires at a time");
            });
        });
    rt.block_on(store.close());
}
