//! Store claim throughput, one caller against 64 concurrent callers, to show
//! what group commit buys: with one caller every claim pays its own durable
//! commit; with 64, claims that arrive during a commit share the next one.
//!
//! Run: `cargo bench --bench store`. Besides divan's timings (items/s is
//! claims per second), each case prints the claims per commit it achieved.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dedupd::domain::{Key, ScopedKey, Ttl};
use dedupd::store::Store;
use dedupd::store::redb::{RedbOptions, RedbStore};
use divan::Bencher;
use divan::counter::ItemsCount;

fn main() {
    divan::main();
}

/// Claims per benchmark iteration, split evenly among the callers.
const CLAIMS: usize = 640;

#[divan::bench(args = [1, 64], sample_count = 10, sample_size = 1)]
fn claim(bencher: Bencher, callers: usize) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::TempDir::new().unwrap();
    let store =
        Arc::new(RedbStore::open(&RedbOptions::new(dir.path().join("bench.redb"))).unwrap());
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
