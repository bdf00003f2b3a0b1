//! Failover on the shared inbox, with real processes: three `dedupd serve`
//! instances on a real Redis (and on a real three-master cluster), each
//! sending to its own `?n=I` of one real receiver, so the test knows who
//! sent what. `gateway.lease_grace` is 3 s and `forward_timeout` 120 s:
//! before the heartbeat, a lease lasted `forward_timeout` + 30 s, so a
//! dead instance held its events for 150 s.
//!
//! These run on the real clock (separate processes cannot share a moved
//! one). The bounds they check are a dead instance's events going to the
//! others within 10 s, against 150 s without renewals: a behaviour, not a
//! speed.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::support::fleet::{
    Backing, Instance, Node, event, metric, post, shown, start_node, stop_all, within,
};
use crate::support::process::signal;
use crate::support::receiver::{Behaviour, Received, Receiver};

/// `gateway.lease_grace` in these tests.
const GRACE: Duration = Duration::from_secs(3);
/// How soon after a kill (or a freeze) the others must send the dead
/// instance's events again: the grace plus a generous margin for a
/// loaded machine, far below the 150 s a lease lasted before renewals.
const FAILOVER_BOUND: Duration = Duration::from_secs(10);

/// Instance `i`'s settings: `redis` is its `[storage.redis]` address.
/// A response timeout of 1 s, for a grace of 3 s (at least three).
fn config(dir: &TempDir, i: usize, redis: &str, receiver: &str) -> std::path::PathBuf {
    Instance {
        redis: &format!("{redis}\nresponse_timeout = \"1s\""),
        gateway: &format!("lease_grace = \"{}s\"", GRACE.as_secs()),
        forward_to: &format!("{receiver}?n={i}"),
        source: "forward_timeout = \"120s\"\nbackoff_min = \"100ms\"\nbackoff_max = \"1s\"",
        ..Instance::default()
    }
    .write(dir.path(), &format!("f{i}"))
}

/// The event id a request carried.
fn id_of(r: &Received) -> String {
    r.header("webhook-id").to_owned()
}

/// Requests of `id`, in arrival order.
fn copies(receiver: &Receiver, id: &str) -> Vec<Received> {
    receiver
        .received()
        .into_iter()
        .filter(|r| id_of(r) == id)
        .collect()
}

/// Posts the first event of each of `runs` to `port`; their ids.
async fn post_firsts(port: u16, runs: &[String]) -> Vec<String> {
    let client = crate::support::http::client();
    let mut ids = Vec::new();
    for run in runs {
        let (id, body) = event(run, 0);
        assert_eq!(post(&client, port, &body).await, 200, "{id}");
        ids.push(id);
    }
    ids
}

/// Instance 0 alone leases the first event of five streams and hangs in
/// their requests; instances 1 and 2 join; instance 0 is SIGKILLed. Each
/// of its streams is sent again by another instance within the bound (the
/// grace after its last renewal), not after `forward_timeout` + 30 s.
async fn sigkilled_instances_streams_go_to_the_others(backing: Backing) {
    let receiver = Receiver::start(Behaviour::HoldQuery("n=0")).await;
    let dir = TempDir::new().unwrap();
    let redis = backing.line();
    let first = start_node(&config(&dir, 0, &redis, &receiver.url));
    let runs: Vec<String> = (0..5).map(|s| format!("kill_{s}")).collect();
    let ids = post_firsts(first.port, &runs).await;
    within(
        "instance 0 holds five requests",
        Duration::from_secs(30),
        || async { receiver.held() == 5 },
    )
    .await;
    let others: Vec<Node> = (1..3)
        .map(|i| start_node(&config(&dir, i, &redis, &receiver.url)))
        .collect();
    // Alive, it keeps them: two grace periods, and nobody else sent one.
    let leased_until = shown(others[0].port, &ids[0]).await["due_at_ms"]
        .as_u64()
        .unwrap();
    within(
        "instance 0 renews its leases",
        Duration::from_secs(30),
        || async {
            shown(others[1].port, &ids[0]).await["due_at_ms"]
                .as_u64()
                .unwrap()
                > leased_until + 2 * GRACE.as_millis() as u64
        },
    )
    .await;
    assert_eq!(receiver.received().len(), 5, "no event was sent twice");

    let mut killed = first;
    let killed_at = Instant::now();
    killed.child.0.kill().unwrap();
    killed.child.0.wait().unwrap();
    within(
        "every stream of the killed instance sent again",
        Duration::from_secs(60),
        || async { ids.iter().all(|id| copies(&receiver, id).len() >= 2) },
    )
    .await;
    let mut again: BTreeMap<String, Duration> = BTreeMap::new();
    for id in &ids {
        let second = &copies(&receiver, id)[1];
        assert_ne!(second.path, "/hooks?n=0", "{id} sent again by another");
        again.insert(id.clone(), second.at.duration_since(killed_at));
    }
    assert!(
        again.values().all(|d| *d <= FAILOVER_BOUND),
        "each stream sent again within {FAILOVER_BOUND:?} of the kill (lease_grace {GRACE:?}): {again:?}"
    );
    for id in &ids {
        within("delivered", Duration::from_secs(30), || async {
            shown(others[0].port, id).await["status"] == "delivered"
        })
        .await;
    }
    receiver.release();
    stop_all(others);
    drop(backing);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sigkilled_instances_streams_go_to_the_others_within_the_lease_grace() {
    sigkilled_instances_streams_go_to_the_others(Backing::one().await).await;
}

/// On a cluster, renewals reach the buckets on every master.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_a_cluster_a_sigkilled_instances_streams_go_to_the_others_within_the_lease_grace() {
    sigkilled_instances_streams_go_to_the_others(Backing::cluster().await).await;
}

/// A live instance whose delivery takes ten times the grace keeps its
/// lease the whole time (its heartbeat renews it); nobody else sends the
/// event, and once answered it is delivered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_live_instance_keeps_its_lease_however_long_its_delivery_takes() {
    let receiver = Receiver::start(Behaviour::HoldQuery("n=0")).await;
    let backing = Backing::one().await;
    let dir = TempDir::new().unwrap();
    let redis = backing.line();
    let slow = start_node(&config(&dir, 0, &redis, &receiver.url));
    let ids = post_firsts(slow.port, &["live".to_owned()]).await;
    within(
        "instance 0 holds the request",
        Duration::from_secs(30),
        || async { receiver.held() == 1 },
    )
    .await;
    let others: Vec<Node> = (1..3)
        .map(|i| start_node(&config(&dir, i, &redis, &receiver.url)))
        .collect();
    let first = shown(others[0].port, &ids[0]).await;
    let leased_until = first["due_at_ms"].as_u64().unwrap();
    // Ten grace periods pass, watched through the lease's end moving on.
    within(
        "the lease renewed through ten grace periods",
        Duration::from_secs(60),
        || async {
            let e = shown(others[1].port, &ids[0]).await;
            assert_eq!(e["status"], "pending", "{e}");
            e["due_at_ms"].as_u64().unwrap() > leased_until + 10 * GRACE.as_millis() as u64
        },
    )
    .await;
    assert_eq!(copies(&receiver, &ids[0]).len(), 1, "sent once so far");
    assert!(metric(slow.port, "dedupd_lease_renewals_total", "renewed").await >= 9.0);
    receiver.release();
    within("delivered", Duration::from_secs(30), || async {
        shown(others[0].port, &ids[0]).await["status"] == "delivered"
    })
    .await;
    // Later events of the stream go through any instance.
    let client = crate::support::http::client();
    let (next, body) = event("live", 1);
    assert_eq!(post(&client, others[0].port, &body).await, 200);
    within(
        "the next event delivered",
        Duration::from_secs(30),
        || async { shown(others[1].port, &next).await["status"] == "delivered" },
    )
    .await;
    assert_eq!(copies(&receiver, &ids[0]).len(), 1, "delivered once");
    assert_eq!(
        metric(slow.port, "dedupd_lease_renewals_total", "lost").await,
        0.0
    );
    stop_all(vec![slow]);
    stop_all(others);
    drop(backing);
}

/// Instance 0 hangs in E1's request and is frozen (SIGSTOP) past the
/// grace: another instance sends E1 again, and then E2 of the same stream.
/// Resumed (SIGCONT), instance 0 finds its lease lost, and its late
/// outcome for E1 (a 500) changes nothing: the lease's generation fences
/// it out, so E1 is not made pending again nor sent a third time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_instance_frozen_past_the_grace_loses_its_lease_and_its_late_outcome_changes_nothing() {
    let receiver = Receiver::start(Behaviour::HoldQuery("n=0")).await;
    let backing = Backing::one().await;
    let dir = TempDir::new().unwrap();
    let redis = backing.line();
    let frozen = start_node(&config(&dir, 0, &redis, &receiver.url));
    let ids = post_firsts(frozen.port, &["frozen".to_owned()]).await;
    let e1 = ids[0].clone();
    within(
        "instance 0 holds E1's request",
        Duration::from_secs(30),
        || async { receiver.held() == 1 },
    )
    .await;
    let others: Vec<Node> = (1..3)
        .map(|i| start_node(&config(&dir, i, &redis, &receiver.url)))
        .collect();
    // It renews while it lives: past its first lease's end, still its.
    let leased_until = shown(others[0].port, &e1).await["due_at_ms"]
        .as_u64()
        .unwrap();
    within(
        "instance 0 renews its lease",
        Duration::from_secs(30),
        || async {
            shown(others[0].port, &e1).await["due_at_ms"]
                .as_u64()
                .unwrap()
                > leased_until + GRACE.as_millis() as u64
        },
    )
    .await;
    assert_eq!(copies(&receiver, &e1).len(), 1);

    signal(&frozen.child.0, "-STOP");
    let frozen_at = Instant::now();
    within(
        "E1 sent again by another instance",
        Duration::from_secs(60),
        || async { copies(&receiver, &e1).len() >= 2 },
    )
    .await;
    let second = &copies(&receiver, &e1)[1];
    assert_ne!(second.path, "/hooks?n=0");
    let took = second.at.duration_since(frozen_at);
    assert!(
        took <= FAILOVER_BOUND,
        "E1 sent again {took:?} after the freeze (lease_grace {GRACE:?})"
    );
    within("E1 delivered", Duration::from_secs(30), || async {
        shown(others[0].port, &e1).await["status"] == "delivered"
    })
    .await;
    let client = crate::support::http::client();
    let (e2, body) = event("frozen", 1);
    assert_eq!(post(&client, others[1].port, &body).await, 200);
    within("E2 delivered", Duration::from_secs(30), || async {
        shown(others[0].port, &e2).await["status"] == "delivered"
    })
    .await;

    // Resumed: its heartbeat finds the lease gone; then its request fails.
    signal(&frozen.child.0, "-CONT");
    within(
        "instance 0 finds its lease lost",
        Duration::from_secs(30),
        || async { metric(frozen.port, "dedupd_lease_renewals_total", "lost").await >= 1.0 },
    )
    .await;
    receiver.release_with(500, Behaviour::Accept);
    within(
        "instance 0 records its failed attempt",
        Duration::from_secs(30),
        || async { metric(frozen.port, "dedupd_deliveries_total", "failed").await >= 1.0 },
    )
    .await;
    // Had the late outcome counted, E1 would be pending again and sent
    // within the backoff (100 ms to 1 s): watch for three grace periods.
    let watch_until = Instant::now() + 3 * GRACE;
    while Instant::now() < watch_until {
        for (id, port) in [
            (&e1, others[0].port),
            (&e2, others[1].port),
            (&e1, frozen.port),
        ] {
            let e = shown(port, id).await;
            assert_eq!(e["status"], "delivered", "{e}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let sent: Vec<String> = copies(&receiver, &e1)
        .iter()
        .map(|r| r.path.clone())
        .collect();
    assert_eq!(sent.len(), 2, "E1 was not sent a third time: {sent:?}");
    assert_eq!(copies(&receiver, &e2).len(), 1);
    stop_all(vec![frozen]);
    stop_all(others);
    drop(backing);
}
