//! The backends the suite runs against.

use std::sync::Arc;

use async_trait::async_trait;
use dedupd::store::Store;
use dedupd::store::redb::{RedbOptions, RedbStore};
use tempfile::TempDir;

use crate::Backend;

/// redb in a temp dir.
pub struct Redb {
    dir: TempDir,
    store: Arc<RedbStore>,
}

fn options(dir: &TempDir) -> RedbOptions {
    let mut opts = RedbOptions::new(dir.path().join("store.redb"));
    opts.cache_bytes = 4 * 1024 * 1024;
    opts
}

/// A fresh, empty redb backend.
pub async fn redb() -> Redb {
    let dir = TempDir::new().unwrap();
    let store = Arc::new(RedbStore::open(&options(&dir)).unwrap());
    Redb { dir, store }
}

#[async_trait]
impl Backend for Redb {
    fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    async fn restart(&mut self) {
        self.store.close().await;
        self.store = Arc::new(RedbStore::open(&options(&self.dir)).unwrap());
    }
}

crate::conformance!(redb_store, crate::backends::redb);
