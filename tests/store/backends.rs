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
    /// The log synced on a thread of its own (the default on one CPU).
    sync_thread: bool,
}

fn options(dir: &TempDir, sync_thread: bool) -> RedbOptions {
    let mut opts = RedbOptions::new(dir.path().join("store.redb"));
    opts.cache_bytes = 4 * 1024 * 1024;
    opts.sync_thread = sync_thread;
    opts
}

async fn redb_with(sync_thread: bool) -> Redb {
    let dir = TempDir::new().unwrap();
    let store = Arc::new(RedbStore::open(&options(&dir, sync_thread)).unwrap());
    Redb {
        dir,
        store,
        sync_thread,
    }
}

/// A fresh, empty redb backend, its log synced by the writer.
pub async fn redb() -> Redb {
    redb_with(false).await
}

/// The same, its log synced on a thread of its own.
pub async fn redb_sync_thread() -> Redb {
    redb_with(true).await
}

#[async_trait]
impl Backend for Redb {
    fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    async fn restart(&mut self) {
        self.store.close().await;
        self.store = Arc::new(RedbStore::open(&options(&self.dir, self.sync_thread)).unwrap());
    }
}

crate::conformance!(redb_store, crate::backends::redb);
crate::conformance!(redb_sync_thread_store, crate::backends::redb_sync_thread);

/// The Redis backend against real servers the tests start.
#[cfg(feature = "redis")]
pub mod redis {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, OnceLock};
    use std::time::Duration;

    use async_trait::async_trait;
    use dedupd::store::Store;
    use dedupd::store::redis::{RedisInbox, RedisOptions, RedisStore, SharedInboxOptions};

    use crate::Backend;
    use crate::support::redis::{RedisCluster, RedisServer};

    /// A store over one redis-server of its own (or a shared cluster).
    pub struct Redis {
        _server: Option<RedisServer>,
        opts: RedisOptions,
        store: Arc<RedisStore>,
    }

    /// The three-master cluster the cluster tests share (each under a key
    /// prefix of its own), started on first use.
    pub async fn shared_cluster() -> &'static RedisCluster {
        static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
        tokio::task::spawn_blocking(|| CLUSTER.get_or_init(RedisCluster::start))
            .await
            .unwrap()
    }

    /// Options with a large expiry slack: the suite moves the logical clock
    /// far ahead of real time, and Redis must not reclaim a key that is
    /// still live at the logical time. (`redis_expires_its_keys_by_itself`
    /// checks the Redis expiry with no slack.)
    pub fn options(url: String, cluster_nodes: Vec<String>, prefix: String) -> RedisOptions {
        RedisOptions {
            url,
            cluster_nodes,
            prefix,
            expiry_slack: Duration::from_secs(600),
            connect_timeout: Duration::from_secs(10),
            response_timeout: Duration::from_secs(10),
            durability: dedupd::domain::Durability::Server,
            replicas_timeout: Duration::from_secs(1),
            sentinels: Vec::new(),
            sentinel_master: String::new(),
        }
    }

    /// One instance's handle on a shared inbox of `buckets` buckets (with
    /// the fleet's state beside it: alerts, lanes), an hour's dedupe
    /// window and the default lease grace.
    pub fn shared_inbox(url: String, nodes: Vec<String>, prefix: &str, buckets: u16) -> RedisInbox {
        RedisInbox::connect(
            options(url, nodes, prefix.into()),
            SharedInboxOptions {
                buckets,
                dedupe_window: Duration::from_secs(3600),
                lease_grace: Duration::from_secs(10),
            },
        )
        .unwrap()
    }

    /// A fresh single-node backend.
    pub async fn single() -> Redis {
        let server = tokio::task::spawn_blocking(RedisServer::start)
            .await
            .unwrap();
        let opts = options(server.url(), Vec::new(), "dedupd-test".into());
        Redis {
            store: Arc::new(RedisStore::connect(opts.clone()).unwrap()),
            opts,
            _server: Some(server),
        }
    }

    /// A fresh backend on the shared three-master cluster, under a key
    /// prefix of its own.
    pub async fn cluster() -> Redis {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nodes = shared_cluster().await.nodes.clone();
        let prefix = format!("t{}", NEXT.fetch_add(1, Ordering::SeqCst));
        let opts = options(String::new(), nodes, prefix);
        Redis {
            store: Arc::new(RedisStore::connect(opts.clone()).unwrap()),
            opts,
            _server: None,
        }
    }

    #[async_trait]
    impl Backend for Redis {
        fn store(&self) -> Arc<dyn Store> {
            self.store.clone()
        }

        /// A new connection to the same server: the data stays in Redis.
        async fn restart(&mut self) {
            self.store = Arc::new(RedisStore::connect(self.opts.clone()).unwrap());
        }

        fn expires_by_itself(&self) -> bool {
            true
        }

        fn fences_per_key(&self) -> bool {
            !self.opts.cluster_nodes.is_empty()
        }
    }

    /// Runs one of dedupd's scripts (with its shared prelude) by EVAL.
    fn eval(server: &RedisServer, file: &str, keys: &[&str], args: &[&str]) -> Vec<String> {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/store/redis/");
        let script = format!(
            "{}\n{}",
            std::fs::read_to_string(format!("{dir}common.lua")).unwrap(),
            std::fs::read_to_string(format!("{dir}{file}")).unwrap()
        );
        let n = keys.len().to_string();
        let mut cmd = std::process::Command::new("redis-cli");
        cmd.args(["-s", server.socket.to_str().unwrap(), "eval", &script, &n]);
        cmd.args(keys).args(args);
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    }

    #[tokio::test]
    async fn a_claim_retried_with_its_own_token_is_answered_as_the_same_claim() {
        // RedisStore retries a claim once, with the same token, when the
        // answer was lost: the script must recognise its own claim.
        let server = tokio::task::spawn_blocking(RedisServer::start)
            .await
            .unwrap();
        let keys = ["{t}:c:k", "{t}:fence"];
        let claim = |token: &str| {
            eval(
                &server,
                "claim.lua",
                &keys,
                &["1000", "500", "", token, "0", "0"],
            )
        };
        let first = claim("aaaa");
        assert_eq!(first, ["claimed", "1", "1500"]);
        assert_eq!(
            claim("aaaa"),
            first,
            "the retry gets the same fence and expiry"
        );
        assert_eq!(
            claim("bbbb"),
            ["busy", "p", "1500"],
            "anyone else is refused"
        );
    }

    /// Counts the keys Redis holds under `prefix`.
    fn keys(server: &RedisServer, prefix: &str) -> usize {
        let out = std::process::Command::new("redis-cli")
            .args([
                "-s",
                server.socket.to_str().unwrap(),
                "--scan",
                "--pattern",
                &format!("*{prefix}*"),
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).lines().count()
    }

    #[tokio::test]
    async fn redis_expires_its_keys_by_itself() {
        use dedupd::domain::{CreatedAt, Key, ScopedKey, Ttl};
        let server = tokio::task::spawn_blocking(RedisServer::start)
            .await
            .unwrap();
        let mut opts = options(server.url(), Vec::new(), "exp".into());
        opts.expiry_slack = Duration::ZERO;
        let store = RedisStore::connect(opts).unwrap();
        let now = dedupd::clock::Clock::now_ms(&dedupd::clock::SystemClock);
        let k = |s: &str| ScopedKey::api(&Key::parse(s, "key").unwrap());
        store
            .claim(&k("short"), Ttl::from_ms_unchecked(3_000), None, now)
            .await
            .unwrap();
        let at = CreatedAt::parse("2026-11-29T10:00:00Z", "created_at").unwrap();
        store.apply(&k("s"), &k("e"), at, 3_000, now).await.unwrap();
        // claim, fence counter, head, event record, event marker (3 s: long
        // enough that none is gone before they are counted on a busy machine)
        assert_eq!(keys(&server, "exp"), 5);
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while keys(&server, "exp") > 1 {
            assert!(
                std::time::Instant::now() < deadline,
                "Redis kept expired keys"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Only the fence counter stays: fences grow for ever.
        assert_eq!(keys(&server, "exp:fence") + keys(&server, "{exp}:fence"), 1);
    }

    crate::conformance!(redis_single, crate::backends::redis::single);
    crate::conformance!(redis_cluster, crate::backends::redis::cluster);
}
