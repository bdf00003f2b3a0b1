//! Drills of a fleet on the shared inbox, with real processes: `dedupd
//! serve` instances on one real `redis-server` (AOF, `appendfsync always`,
//! `durability = "fsync"`), a real receiver, and a provider that posts
//! signed events to any instance and retries whatever is not answered 2xx,
//! as providers do. In every drill, every event answered 2xx is delivered,
//! and each stream reaches the application in `created_at` order.
//!
//! These run on the real clock (separate processes cannot share a moved
//! one): they wait for what they check, with deadlines, and never assert
//! on how fast it came.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::support::fleet::{Instance, Node, event, post, start_node, stop_all};
use crate::support::receiver::{Behaviour, Receiver, eventually};
use crate::support::redis::RedisServer;

/// Streams per posting worker: each worker posts its streams' events in
/// order, as a provider sends one object's changes.
const STREAMS_PER_WORKER: usize = 3;
const WORKERS: usize = 4;

/// One instance's settings file, with `redis` as its `[storage.redis]`.
fn config_with(dir: &TempDir, i: usize, redis: &str, forward_to: &str) -> PathBuf {
    Instance {
        redis,
        forward_to,
        source: "forward_timeout = \"2s\"\nbackoff_min = \"100ms\"\nbackoff_max = \"1s\"",
        ..Instance::default()
    }
    .write(dir.path(), &format!("n{i}"))
}

/// One instance's settings file on the redis-server at `redis_url`, each
/// write fsynced there.
fn config(dir: &TempDir, i: usize, redis_url: &str, forward_to: &str) -> PathBuf {
    let redis = format!("url = \"{redis_url}\"\ndurability = \"fsync\"");
    config_with(dir, i, &redis, forward_to)
}

/// What the provider saw.
#[derive(Debug, Default)]
struct Posted {
    /// Event ids answered 2xx.
    acked: BTreeSet<String>,
    /// Every answer that was not 2xx, by status (0: no answer).
    refused: BTreeMap<u16, usize>,
}

/// A provider: `WORKERS` workers, each posting `per_stream` events of its
/// streams in order, every event to the instances in turn until one
/// answers 2xx (pausing between rounds, as a provider's retries do).
fn provider(
    ports: Arc<Mutex<Vec<u16>>>,
    per_stream: usize,
) -> (Arc<Mutex<Posted>>, Vec<tokio::task::JoinHandle<()>>) {
    let posted = Arc::new(Mutex::new(Posted::default()));
    let client = crate::support::http::client();
    let workers = (0..WORKERS)
        .map(|w| {
            let (posted, client, ports) = (posted.clone(), client.clone(), ports.clone());
            tokio::spawn(async move {
                let mut turn = w;
                for k in 0..per_stream {
                    for s in 0..STREAMS_PER_WORKER {
                        let (id, body) = event(&format!("run_{w}_{s}"), k);
                        let deadline = Instant::now() + Duration::from_secs(180);
                        loop {
                            let live = ports.lock().unwrap().clone();
                            turn += 1;
                            let port = live[turn % live.len()];
                            let status = post(&client, port, &body).await;
                            if status == 200 {
                                posted.lock().unwrap().acked.insert(id.clone());
                                break;
                            }
                            *posted.lock().unwrap().refused.entry(status).or_default() += 1;
                            assert!(Instant::now() < deadline, "{id} never accepted");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                }
            })
        })
        .collect();
    (posted, workers)
}

/// Waits until `posted` has at least `n` events acknowledged.
async fn acked_at_least(posted: &Mutex<Posted>, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while posted.lock().unwrap().acked.len() < n {
        assert!(
            Instant::now() < deadline,
            "the provider stalled before {n} events"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the receiver has every acknowledged event, then checks
/// each stream's order: no event reaches the application after a newer
/// one of its stream (an event sent again after a crash repeats itself,
/// right after itself).
async fn every_acked_event_delivered_in_order(receiver: &Receiver, acked: &BTreeSet<String>) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let got: BTreeSet<String> = receiver
            .received()
            .iter()
            .map(|r| r.header("webhook-id").to_owned())
            .collect();
        let missing: Vec<&String> = acked.difference(&got).collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} acknowledged events never delivered, such as {:?}",
            missing.len(),
            &missing[..missing.len().min(5)]
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut last: BTreeMap<String, String> = BTreeMap::new();
    for r in receiver.received() {
        let id = r.header("webhook-id").to_owned();
        let (run, _) = id.rsplit_once('-').unwrap();
        if let Some(before) = last.get(run) {
            assert!(
                *before <= id,
                "{id} reached the application after {before}, a newer event of its stream"
            );
        }
        last.insert(run.to_owned(), id);
    }
}

/// The instance's `dedupd_oldest_pending_seconds` (0 when it has none).
async fn oldest_pending(port: u16) -> f64 {
    let text = crate::support::http::client()
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with("dedupd_oldest_pending_seconds"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .fold(0.0, f64::max)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_instances_and_a_sigkill_under_load_lose_nothing_acknowledged() {
    // The application hangs on one stream's events until told otherwise,
    // so the instance about to be killed surely has a delivery in flight.
    let held = "run_0_0";
    let receiver = Receiver::start(Behaviour::Hold(Some(held))).await;
    let redis = tokio::task::spawn_blocking(|| {
        RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"])
    })
    .await
    .unwrap();
    let dir = TempDir::new().unwrap();
    let first = start_node(&config(&dir, 0, &redis.url(), &receiver.url));
    let ports = Arc::new(Mutex::new(vec![first.port]));
    let per_stream = 40;
    let total = WORKERS * STREAMS_PER_WORKER * per_stream;
    let (posted, workers) = provider(ports.clone(), per_stream);
    // Alone, the first instance ingests and leases, and one of its
    // deliveries hangs.
    eventually("a delivery of the first instance in flight", || async {
        receiver.held() == 1
    })
    .await;
    let nodes: Vec<Node> = (1..3)
        .map(|i| start_node(&config(&dir, i, &redis.url(), &receiver.url)))
        .collect();
    ports.lock().unwrap().extend(nodes.iter().map(|n| n.port));
    acked_at_least(&posted, total / 2).await;
    // SIGKILL it under load: what it leased (the hanging delivery, and
    // what it leased ahead) waits for its lease, `gateway.lease_grace`
    // after its last renewal, and the others deliver it then.
    let mut killed = first;
    killed.child.0.kill().unwrap();
    killed.child.0.wait().unwrap();
    ports.lock().unwrap().retain(|p| *p != killed.port);
    receiver.release_to(Behaviour::Delay(2));
    for w in workers {
        w.await.unwrap();
    }
    let posted = std::mem::take(&mut *posted.lock().unwrap());
    assert_eq!(
        posted.acked.len(),
        total,
        "every event was acknowledged in the end"
    );
    every_acked_event_delivered_in_order(&receiver, &posted.acked).await;
    // The hanging delivery was sent again by another instance.
    let sent: Vec<String> = receiver
        .received()
        .iter()
        .map(|r| r.header("webhook-id").to_owned())
        .collect();
    let first_held = sent
        .iter()
        .find(|id| id.starts_with(held))
        .expect("the held stream was sent")
        .clone();
    assert!(
        sent.iter().filter(|id| **id == first_held).count() >= 2,
        "{first_held}, in flight on the killed instance, was delivered again by another"
    );
    // Across the fleet, one delivery per stream at a time.
    assert_eq!(receiver.max_concurrency().0, 1);
    for n in &nodes {
        let deadline = Instant::now() + Duration::from_secs(30);
        while oldest_pending(n.port).await > 0.0 {
            assert!(
                Instant::now() < deadline,
                "pending events left on the fleet"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    stop_all(nodes);
    drop(redis);
}

/// Redis goes away for `outage` under load, with two instances: ingest
/// answers 503 meanwhile (the provider retries), and when Redis returns,
/// both resume by themselves and deliver everything acknowledged.
async fn outage_drill(outage: Duration) {
    let receiver = Receiver::start(Behaviour::Delay(2)).await;
    let mut redis = tokio::task::spawn_blocking(|| {
        RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"])
    })
    .await
    .unwrap();
    let dir = TempDir::new().unwrap();
    let nodes: Vec<Node> = (0..2)
        .map(|i| start_node(&config(&dir, i, &redis.url(), &receiver.url)))
        .collect();
    let ports = Arc::new(Mutex::new(
        nodes.iter().map(|n| n.port).collect::<Vec<u16>>(),
    ));
    let per_stream = 30;
    let total = WORKERS * STREAMS_PER_WORKER * per_stream;
    let (posted, workers) = provider(ports.clone(), per_stream);
    acked_at_least(&posted, total / 3).await;
    redis = tokio::task::spawn_blocking(move || {
        redis.stop();
        redis
    })
    .await
    .unwrap();
    let acked_before = posted.lock().unwrap().acked.len();
    tokio::time::sleep(outage).await;
    let during = posted.lock().unwrap().acked.len();
    redis = tokio::task::spawn_blocking(move || {
        redis.restart();
        redis
    })
    .await
    .unwrap();
    for w in workers {
        w.await.unwrap();
    }
    let posted = std::mem::take(&mut *posted.lock().unwrap());
    assert!(
        during <= acked_before + WORKERS,
        "events were acknowledged while Redis was down ({acked_before} before, {during} after)"
    );
    assert!(
        posted.refused.keys().all(|s| *s == 503),
        "while Redis was down ingest answered only 503: {:?}",
        posted.refused
    );
    assert!(posted.refused.contains_key(&503), "the outage was seen");
    assert_eq!(posted.acked.len(), total);
    every_acked_event_delivered_in_order(&receiver, &posted.acked).await;
    for n in &nodes {
        let deadline = Instant::now() + Duration::from_secs(30);
        while oldest_pending(n.port).await > 0.0 {
            assert!(
                Instant::now() < deadline,
                "dedupd_oldest_pending_seconds stays up"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    stop_all(nodes);
    drop(redis);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_3_s_redis_outage_under_load_loses_nothing_and_nothing_stays_stuck() {
    outage_drill(Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_60_s_redis_outage_under_load_loses_nothing_and_nothing_stays_stuck() {
    outage_drill(Duration::from_secs(60)).await;
}

fn cli_port(port: u16, args: &[&str]) -> String {
    std::process::Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

async fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !check() {
        assert!(Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A master, a replica and three sentinels; two instances reach Redis
/// through the sentinels with `durability = "replicas = 1"`. The master
/// is SIGKILLed under ingest load; Sentinel promotes the replica, and the
/// instances follow it without a restart: every event answered 2xx is
/// delivered, each stream in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn through_sentinel_a_master_sigkilled_under_load_loses_nothing_acknowledged() {
    use crate::support::ports::free_port;
    use crate::support::redis::RedisSentinels;

    let receiver = Receiver::start(Behaviour::Delay(2)).await;
    let master_port = free_port();
    let replica_port = loop {
        let p = free_port();
        if p != master_port {
            break p;
        }
    };
    let (mut master, _replica, sentinels) = tokio::task::spawn_blocking(move || {
        let (m, r) = (master_port.to_string(), replica_port.to_string());
        let master = RedisServer::start_with(&["--port", &m, "--bind", "127.0.0.1"]);
        let replica = RedisServer::start_with(&[
            "--port",
            &r,
            "--bind",
            "127.0.0.1",
            "--replicaof",
            "127.0.0.1",
            &m,
        ]);
        (master, replica, RedisSentinels::start(master_port))
    })
    .await
    .unwrap();
    until("the replica in sync", || {
        cli_port(master_port, &["info", "replication"]).contains("state=online")
    })
    .await;
    let sentinel_port: u16 = sentinels.urls[0]
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    until("the sentinels know the replica and each other", || {
        cli_port(
            sentinel_port,
            &["sentinel", "master", RedisSentinels::MASTER],
        )
        .lines()
        .collect::<Vec<_>>()
        .windows(2)
        .any(|w| w[0] == "num-other-sentinels" && w[1] == "2")
            && cli_port(
                sentinel_port,
                &["sentinel", "replicas", RedisSentinels::MASTER],
            )
            .contains(&replica_port.to_string())
    })
    .await;
    let redis = format!(
        "url = \"redis://127.0.0.1:{master_port}\"\nsentinels = [{}]\n\
         sentinel_master = \"{}\"\ndurability = \"replicas = 1\"\nreplicas_timeout = \"500ms\"",
        sentinels
            .urls
            .iter()
            .map(|u| format!("\"{u}\""))
            .collect::<Vec<_>>()
            .join(", "),
        RedisSentinels::MASTER
    );
    let dir = TempDir::new().unwrap();
    let nodes: Vec<Node> = (0..2)
        .map(|i| start_node(&config_with(&dir, i, &redis, &receiver.url)))
        .collect();
    let ports = Arc::new(Mutex::new(
        nodes.iter().map(|n| n.port).collect::<Vec<u16>>(),
    ));
    let per_stream = 30;
    let total = WORKERS * STREAMS_PER_WORKER * per_stream;
    let (posted, workers) = provider(ports.clone(), per_stream);
    acked_at_least(&posted, total / 3).await;
    // SIGKILL the master; Sentinel promotes the replica; the old master,
    // back, becomes the new one's replica (Sentinel sees to it).
    let _old = tokio::task::spawn_blocking(move || {
        master.stop();
        let deadline = Instant::now() + Duration::from_secs(60);
        while sentinels.master_port() != Some(replica_port) {
            assert!(Instant::now() < deadline, "the replica was never promoted");
            std::thread::sleep(Duration::from_millis(50));
        }
        master.restart();
        // Sentinel turns the old master into the new one's replica by
        // itself, but on a loaded machine not always soon: the test does
        // it, as an operator would (`replicas = 1` needs a replica).
        cli_port(
            master_port,
            &["replicaof", "127.0.0.1", &replica_port.to_string()],
        );
        (master, sentinels)
    })
    .await
    .unwrap();
    for w in workers {
        w.await.unwrap();
    }
    let posted = std::mem::take(&mut *posted.lock().unwrap());
    assert_eq!(posted.acked.len(), total);
    assert!(
        posted.refused.keys().all(|s| *s == 503),
        "during the failover ingest answered only 503: {:?}",
        posted.refused
    );
    every_acked_event_delivered_in_order(&receiver, &posted.acked).await;
    stop_all(nodes);
}

/// `dedupd inbox migrate`, run as an operator would: an instance on its
/// local inbox holds pending events (its application is down); one of them
/// also reached an instance already on the shared inbox. A dry run names
/// what would move and changes nothing; the migration moves every pending
/// event once; a second run finds nothing; the instance, started on the
/// shared inbox, delivers each event once, each stream in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_local_inbox_migrates_into_the_shared_one_without_loss_or_duplicates() {
    use crate::support::process::dedupd;

    let receiver = Receiver::start(Behaviour::Always(503)).await;
    let redis = tokio::task::spawn_blocking(|| {
        RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"])
    })
    .await
    .unwrap();
    let dir = TempDir::new().unwrap();
    let shared = config(&dir, 0, &redis.url(), &receiver.url);
    let local = dir.path().join("n0-local.toml");
    let text = std::fs::read_to_string(&shared).unwrap();
    assert!(text.contains("inbox = \"shared\""));
    std::fs::write(
        &local,
        text.replace("inbox = \"shared\"", "inbox = \"local\""),
    )
    .unwrap();
    let client = crate::support::http::client();

    let node = start_node(&local);
    let mut ids = Vec::new();
    for k in 0..3 {
        for run in ["mig_a", "mig_b"] {
            let (id, body) = event(run, k);
            assert_eq!(post(&client, node.port, &body).await, 200, "{id}");
            ids.push(id);
        }
    }
    stop_all(vec![node]);
    let other = start_node(&config(&dir, 1, &redis.url(), &receiver.url));
    assert_eq!(post(&client, other.port, &event("mig_a", 0).1).await, 200);
    stop_all(vec![other]);

    let migrate = |dry: bool| {
        let mut cmd = dedupd();
        cmd.args(["inbox", "migrate", "--config"]).arg(&shared);
        if dry {
            cmd.arg("--dry-run");
        }
        let out = cmd.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    };
    // check-config says what the switch leaves behind, and what to run.
    let checked = crate::support::process::check_config(&shared);
    let said = String::from_utf8_lossy(&checked.stdout).into_owned();
    assert!(checked.status.success(), "{said}");
    assert!(
        said.contains("holds 6 pending event(s) of this instance's local inbox")
            && said.contains("dedupd inbox migrate"),
        "{said}"
    );
    let dry = migrate(true);
    assert!(
        dry.contains("sume: 6 pending events would move (mig_a-0000, mig_b-0000, mig_a-0001"),
        "{dry}"
    );
    assert!(dry.contains("dry run: nothing changed"), "{dry}");
    let moved = migrate(false);
    assert!(
        moved.contains(
            "sume: 6 pending events moved to the shared inbox (5 stored, 1 already there)"
        ),
        "{moved}"
    );
    let again = migrate(false);
    assert!(
        again.contains("no pending events in the data file: nothing to move"),
        "{again}"
    );

    let before = receiver.received().len();
    receiver.set(Behaviour::Accept);
    let node = start_node(&shared);
    let delivered = || async {
        let v: serde_json::Value = client
            .get(format!(
                "http://127.0.0.1:{}/v1/sources/sume/events?status=delivered",
                node.port
            ))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        v["events"].as_array().unwrap().len()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while delivered().await < ids.len() {
        assert!(
            Instant::now() < deadline,
            "not every moved event was delivered"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let after: Vec<String> = receiver.received()[before..]
        .iter()
        .map(|r| r.header("webhook-id").to_owned())
        .collect();
    let mut sorted = after.clone();
    sorted.sort();
    let mut want = ids.clone();
    want.sort();
    assert_eq!(sorted, want, "each moved event delivered once");
    for run in ["mig_a", "mig_b"] {
        let order: Vec<&String> = after.iter().filter(|id| id.starts_with(run)).collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{run}: {order:?}");
    }
    stop_all(vec![node]);
}
