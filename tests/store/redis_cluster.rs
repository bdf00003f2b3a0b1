//! Claims in a Redis Cluster, against real redis-servers: each claim in a
//! slot of its own with that slot's fence counter, so claims spread over
//! every master; fences that grow per key; and the move from the one-slot
//! layout of earlier versions (`{P}:c:{key}`, `{P}:fence`).

use std::collections::HashMap;
use std::sync::Arc;

use dedupd::domain::{Key, ScopedKey, Token, Ttl};
use dedupd::store::redis::RedisStore;
use dedupd::store::{ClaimOutcome, ClaimState, ReleaseOutcome, Store};

use crate::backends::redis::{options, shared_cluster};
use crate::support::redis::RedisCluster;

const NOW: u64 = 1_800_000_000_000;

fn key(k: &str) -> ScopedKey {
    ScopedKey::api(&Key::parse(k, "key").unwrap())
}

fn ttl(ms: u64) -> Ttl {
    Ttl::from_ms_unchecked(ms)
}

fn store(cluster: &RedisCluster, prefix: &str) -> Arc<RedisStore> {
    let opts = options(String::new(), cluster.nodes.clone(), prefix.into());
    Arc::new(RedisStore::connect(opts).unwrap())
}

async fn claim(s: &RedisStore, k: &str, ms: u64, now: u64) -> (Token, u64) {
    match s.claim(&key(k), ttl(ms), None, now).await.unwrap() {
        ClaimOutcome::Claimed { token, fence, .. } => (token, fence),
        other => panic!("expected a claim of {k}, got {other:?}"),
    }
}

/// The keys node `i` holds that match `pattern`.
fn keys_on(cluster: &RedisCluster, i: usize, pattern: &str) -> Vec<String> {
    cluster
        .cli(i, &["--scan", "--pattern", pattern])
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// `redis-cli -c` (following redirects to the key's master).
fn cli(cluster: &RedisCluster, args: &[&str]) -> String {
    let mut all = vec!["-c"];
    all.extend_from_slice(args);
    cluster
        .cli(0, &all)
        .unwrap_or_else(|| panic!("redis-cli {args:?}"))
        .trim()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_and_their_fence_counters_spread_over_every_master() {
    let cluster = shared_cluster().await;
    let s = store(cluster, "spread");
    for n in 0..300 {
        claim(&s, &format!("k{n}"), 60_000, NOW).await;
    }
    let mut claims = 0;
    for i in 0..cluster.nodes.len() {
        assert!(
            cluster
                .cli(i, &["role"])
                .is_some_and(|r| r.starts_with("master")),
            "node {i} is a master"
        );
        let here = keys_on(cluster, i, "spread:{c:*").len();
        let counters = keys_on(cluster, i, "spread:{f*}:fence").len();
        assert!(
            here > 0 && counters > 0,
            "node {i}: {here} claims, {counters} counters"
        );
        claims += here;
    }
    assert_eq!(claims, 300);
    // Nothing in the one-slot layout but the record of the (empty) move.
    for i in 0..cluster.nodes.len() {
        assert!(keys_on(cluster, i, "{spread}:c:*").is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_fence_only_grows_across_release_expiry_done_and_restart() {
    let cluster = shared_cluster().await;
    let mut s = store(cluster, "grow");
    let keys: Vec<String> = (0..40).map(|n| format!("k{n}")).collect();
    let mut last: HashMap<String, u64> = HashMap::new();
    let mut grew = |k: &str, fence: u64, how: &str| {
        let before = last.insert(k.to_owned(), fence).unwrap_or(0);
        assert!(fence > before, "{k} {how}: {fence} after {before}");
    };
    for k in &keys {
        let (token, fence) = claim(&s, k, 1_000, NOW).await;
        grew(k, fence, "claimed");
        assert_eq!(
            s.release(&key(k), token, NOW).await.unwrap(),
            ReleaseOutcome::Released
        );
        grew(k, claim(&s, k, 1_000, NOW).await.1, "after a release");
        // The claim expires at NOW + 1000.
        grew(k, claim(&s, k, 1_000, NOW + 1_000).await.1, "after expiry");
        // A done from absent, once that claim expired, takes a fence too.
        s.done(&key(k), Token::random(), ttl(1_000), NOW + 2_000)
            .await
            .unwrap();
        let view = s.get(&key(k), NOW + 2_000).await.unwrap().unwrap();
        assert_eq!(view.state, ClaimState::Done);
        grew(k, view.fence, "done from absent");
    }
    s.close().await;
    s = store(cluster, "grow");
    for k in &keys {
        grew(
            k,
            claim(&s, k, 1_000, NOW + 3_000).await.1,
            "after a restart",
        );
    }
}

/// Writes a claim record as versions before the per-slot layout did.
fn old_claim(
    cluster: &RedisCluster,
    prefix: &str,
    k: &str,
    state: &str,
    token: &Token,
    fence: u64,
) {
    let at = format!("{{{prefix}}}:c:{}", key(k).as_str());
    let (t, f, e) = (
        token.to_hex(),
        fence.to_string(),
        (NOW + 60_000).to_string(),
    );
    cli(
        cluster,
        &["hset", &at, "s", state, "t", &t, "f", &f, "e", &e, "fp", ""],
    );
    cli(cluster, &["pexpire", &at, "600000"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_upgrade_keeps_the_one_slot_layouts_claims_and_fences_grow_past_its_counter() {
    let cluster = shared_cluster().await;
    let p = "upgrade";
    // A cluster that ran an earlier version: the one counter at 1000, a
    // held claim, a done record, and 300 more held claims.
    let held = Token::random();
    cli(cluster, &["set", &format!("{{{p}}}:fence"), "1000"]);
    old_claim(cluster, p, "held", "p", &held, 998);
    old_claim(cluster, p, "finished", "d", &Token::random(), 999);
    for n in 0..300 {
        old_claim(cluster, p, &format!("old{n}"), "p", &Token::random(), n);
    }

    // Two instances of the new version start together: both move.
    let (a, b) = (store(cluster, p), store(cluster, p));
    let (held_key, finished_key) = (key("held"), key("finished"));
    let (busy, done) = tokio::join!(
        a.claim(&held_key, ttl(1_000), None, NOW),
        b.claim(&finished_key, ttl(1_000), None, NOW),
    );
    assert_eq!(
        busy.unwrap(),
        ClaimOutcome::Busy {
            expires_at_ms: NOW + 60_000
        }
    );
    assert_eq!(
        done.unwrap(),
        ClaimOutcome::Done {
            expires_at_ms: NOW + 60_000,
            result: None,
        }
    );
    for n in 0..300 {
        let view = b.get(&key(&format!("old{n}")), NOW).await.unwrap().unwrap();
        assert_eq!(
            (view.state, view.fence),
            (ClaimState::Processing, n),
            "old{n}"
        );
    }
    for i in 0..cluster.nodes.len() {
        assert!(
            keys_on(cluster, i, &format!("{{{p}}}:c:*")).is_empty(),
            "node {i} kept claims in the one-slot layout"
        );
    }

    // The holder still holds it: its token releases it, and the key's next
    // fence is above every fence of the old layout.
    assert_eq!(a.get(&key("held"), NOW).await.unwrap().unwrap().fence, 998);
    assert_eq!(
        a.release(&key("held"), held, NOW).await.unwrap(),
        ReleaseOutcome::Released
    );
    let (_, fence) = claim(&a, "held", 1_000, NOW).await;
    assert!(fence > 1000, "{fence}");
    for n in 0..50 {
        let (_, fence) = claim(&b, &format!("new{n}"), 1_000, NOW).await;
        assert!(fence > 1000, "new{n}: {fence}");
    }
    // The old counter stays, as the floor.
    assert_eq!(cli(cluster, &["get", &format!("{{{p}}}:fence")]), "1000");

    // An instance of the earlier version ran after the upgrade (which the
    // docs forbid): the next start moves its claim and raises the floor.
    old_claim(cluster, p, "late", "p", &Token::random(), 1001);
    cli(cluster, &["set", &format!("{{{p}}}:fence"), "1001"]);
    let c = store(cluster, p);
    let view = c.get(&key("late"), NOW).await.unwrap().unwrap();
    assert_eq!((view.state, view.fence), (ClaimState::Processing, 1001));
    for n in 0..50 {
        let (_, fence) = claim(&c, &format!("newer{n}"), 1_000, NOW).await;
        assert!(fence > 1001, "newer{n}: {fence}");
    }
}

/// Polls `check` every 50 ms for up to 60 s.
async fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !check() {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// A master is SIGKILLed and its replica takes over: the claims it held
/// arrive with their slots' counters (one slot, one replication stream), so
/// each key's next fence is above its last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_fence_only_grows_across_a_failover() {
    use dedupd::domain::Durability;

    let mut cluster = tokio::task::spawn_blocking(|| RedisCluster::start_with_replicas(1))
        .await
        .unwrap();
    let role = |cluster: &RedisCluster, i: usize| cluster.cli(i, &["role"]).unwrap_or_default();
    for i in 0..cluster.nodes.len() {
        until("the node's replication settled", || {
            let r = role(&cluster, i);
            r.starts_with("master") && r.lines().count() > 2
                || r.starts_with("slave") && r.contains("connected")
        })
        .await;
    }
    let mut opts = options(String::new(), cluster.nodes.clone(), "failover".into());
    opts.durability = Durability::Replicas(1);
    let s = RedisStore::connect(opts.clone()).unwrap();
    let keys: Vec<String> = (0..60).map(|n| format!("k{n}")).collect();
    let mut last = HashMap::new();
    for k in &keys {
        // Answered only once the master's replica has the claim and its
        // counter.
        last.insert(k.clone(), claim(&s, k, 1_000, NOW).await.1);
    }
    s.close().await;

    // SIGKILL a master that holds claims; its replica takes over.
    let port = |i: usize| cluster.nodes[i].rsplit(':').next().unwrap().to_owned();
    let master = (0..cluster.nodes.len())
        .find(|&i| {
            role(&cluster, i).starts_with("master")
                && !keys_on(&cluster, i, "failover:{c:*").is_empty()
        })
        .unwrap();
    let replica = (0..cluster.nodes.len())
        .find(|&i| {
            let r = role(&cluster, i);
            r.starts_with("slave") && r.lines().nth(2) == Some(port(master).as_str())
        })
        .unwrap();
    let held = keys_on(&cluster, master, "failover:{c:*").len();
    cluster.stop(master);
    cluster
        .cli(replica, &["cluster", "failover", "takeover"])
        .unwrap();
    until("the replica promoted", || {
        role(&cluster, replica).starts_with("master")
            && cluster
                .cli(replica, &["cluster", "info"])
                .is_some_and(|i| i.contains("cluster_state:ok"))
    })
    .await;
    assert_eq!(keys_on(&cluster, replica, "failover:{c:*").len(), held);

    // An instance started after the failover (the promoted master has no
    // replica left, so without `replicas = 1`).
    opts.durability = Durability::Server;
    let s = RedisStore::connect(opts).unwrap();
    for k in &keys {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        // The claims at NOW have expired at NOW + 1000.
        let fence = loop {
            match s.claim(&key(k), ttl(1_000), None, NOW + 1_000).await {
                Ok(ClaimOutcome::Claimed { fence, .. }) => break fence,
                Ok(other) => panic!("{k}: {other:?}"),
                Err(e) => {
                    assert!(std::time::Instant::now() < deadline, "{k}: {}", e.chain());
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            }
        };
        assert!(fence > last[k], "{k}: {fence} after {}", last[k]);
    }
}
