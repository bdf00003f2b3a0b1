//! What the instances on one shared inbox agree on besides its events
//! ([`Fleet`]), against real redis-servers, with explicit times: an alert
//! kind and source's interval (`alert.lua`), on one server and on the
//! three-master cluster.

use std::time::{Duration, Instant};

use dedupd::store::fleet::{AlertMode, AlertTurn, Fleet};
use dedupd::store::inbox::Inbox;
use dedupd::store::redis::RedisInbox;

use crate::backends::redis::{shared_cluster, shared_inbox};
use crate::support::redis::RedisServer;

const T: u64 = 1_800_000_000_000;
/// `alerts.every` in these tests, ms.
const EVERY: u64 = 60_000;

/// One instance's handle on the shared inbox.
fn instance(url: String, nodes: Vec<String>, prefix: &str) -> RedisInbox {
    shared_inbox(url, nodes, prefix, 4)
}

fn fleet(inbox: &RedisInbox) -> &dyn Fleet {
    inbox.fleet().expect("the shared inbox has a fleet")
}

async fn raise(f: &dyn Fleet, source: &str, local: u64, now: u64) -> AlertTurn {
    f.alert_turn(
        "backlog.stale",
        Some(source),
        EVERY,
        AlertMode::Raise,
        local,
        now,
    )
    .await
    .unwrap()
}

async fn flush(f: &dyn Fleet, source: &str, local: u64, now: u64) -> AlertTurn {
    f.alert_turn(
        "backlog.stale",
        Some(source),
        EVERY,
        AlertMode::Flush,
        local,
        now,
    )
    .await
    .unwrap()
}

/// Two instances through one interval and the next: one alert at once,
/// one at the interval's end counting the rest, the other's fold gone.
async fn one_alert_per_interval_for_two_instances(a: &dyn Fleet, b: &dyn Fleet, source: &str) {
    let fold = |until| AlertTurn::Fold { until };
    assert_eq!(
        raise(a, source, 0, T).await,
        AlertTurn::Send { suppressed: 0 }
    );
    assert_eq!(raise(b, source, 0, T + 1).await, fold(T + EVERY));
    // A raise carrying two this instance folded itself counts three.
    assert_eq!(raise(a, source, 2, T + 2).await, fold(T + EVERY));
    // Before the interval's end a flush waits.
    assert_eq!(flush(b, source, 0, T + EVERY - 1).await, fold(T + EVERY));
    // At its end the first to flush sends, counting the others (1 + 3).
    assert_eq!(
        flush(b, source, 0, T + EVERY).await,
        AlertTurn::Send { suppressed: 3 }
    );
    // The other's fold was counted in it.
    assert_eq!(flush(a, source, 2, T + EVERY + 1).await, AlertTurn::Gone);
    // The flush started an interval, as a raise does.
    assert_eq!(
        raise(a, source, 0, T + EVERY + 2).await,
        fold(T + 2 * EVERY)
    );
    // Nobody flushes that one: the next interval's first alert carries it.
    assert_eq!(
        raise(b, source, 0, T + 3 * EVERY).await,
        AlertTurn::Send { suppressed: 1 }
    );
    assert_eq!(
        flush(a, source, 0, T + 3 * EVERY + 1).await,
        AlertTurn::Gone
    );
    // Other kinds and sources have intervals of their own.
    assert_eq!(
        raise(b, &format!("{source}_other"), 0, T + 3 * EVERY + 2).await,
        AlertTurn::Send { suppressed: 0 }
    );
    assert_eq!(
        a.alert_turn(
            "source.paused",
            Some(source),
            EVERY,
            AlertMode::Raise,
            0,
            T + 3 * EVERY + 2
        )
        .await
        .unwrap(),
        AlertTurn::Send { suppressed: 0 }
    );
}

#[tokio::test]
async fn two_instances_send_an_alert_once_per_interval_and_the_last_fold_at_its_end() {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let a = instance(server.url(), Vec::new(), "fleet-alerts");
    let b = instance(server.url(), Vec::new(), "fleet-alerts");
    one_alert_per_interval_for_two_instances(fleet(&a), fleet(&b), "sume").await;
    // One key per kind and source, under a hash tag of its own.
    let keys = server.cli(&["--scan", "--pattern", "fleet-alerts:{a:*"]);
    let mut keys: Vec<&str> = keys.lines().collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "fleet-alerts:{a:backlog.stale:sume_other}",
            "fleet-alerts:{a:backlog.stale:sume}",
            "fleet-alerts:{a:source.paused:sume}",
        ]
    );
}

#[tokio::test]
async fn an_alerts_key_expires_after_two_intervals_and_a_flush_then_sends_what_it_carries() {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let a = instance(server.url(), Vec::new(), "fleet-expiry");
    let f = fleet(&a);
    let key = "fleet-expiry:{a:backlog.stale:sume}";
    assert_eq!(
        raise(f, "sume", 0, T).await,
        AlertTurn::Send { suppressed: 0 }
    );
    let ttl: u64 = server.cli(&["PTTL", key]).parse().unwrap();
    assert!(0 < ttl && ttl <= 2 * EVERY, "PTTL {ttl}");
    // A short interval, so Redis expires the key within the test.
    let every = 200;
    let turn = |mode, local, now| f.alert_turn("event.dead", Some("sume"), every, mode, local, now);
    assert_eq!(
        turn(AlertMode::Raise, 0, T).await.unwrap(),
        AlertTurn::Send { suppressed: 0 }
    );
    assert_eq!(
        turn(AlertMode::Raise, 0, T + 1).await.unwrap(),
        AlertTurn::Fold { until: T + every }
    );
    let key = "fleet-expiry:{a:event.dead:sume}";
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.cli(&["EXISTS", key]) != "0" {
        assert!(Instant::now() < deadline, "{key} never expired");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The fleet's count is gone with it: nobody can have sent what the
    // held alert carries (itself and two folded here), so it goes.
    assert_eq!(
        turn(AlertMode::Flush, 2, T + every).await.unwrap(),
        AlertTurn::Send { suppressed: 2 }
    );
    // And it started an interval.
    assert_eq!(
        turn(AlertMode::Raise, 0, T + every + 1).await.unwrap(),
        AlertTurn::Fold {
            until: T + 2 * every
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_each_alert_kind_and_source_is_one_slot_and_they_spread_over_the_masters() {
    let cluster = shared_cluster().await;
    let a = instance(String::new(), cluster.nodes.clone(), "fleet-cluster");
    let b = instance(String::new(), cluster.nodes.clone(), "fleet-cluster");
    one_alert_per_interval_for_two_instances(fleet(&a), fleet(&b), "sume").await;
    for n in 0..30 {
        let source = format!("s{n}");
        assert_eq!(
            raise(fleet(&a), &source, 0, T).await,
            AlertTurn::Send { suppressed: 0 }
        );
        assert_eq!(
            raise(fleet(&b), &source, 0, T + 1).await,
            AlertTurn::Fold { until: T + EVERY }
        );
    }
    let mut total = 0;
    for i in 0..cluster.nodes.len() {
        let here = cluster
            .cli(i, &["--scan", "--pattern", "fleet-cluster:{a:*"])
            .unwrap()
            .lines()
            .count();
        assert!(here > 0, "master {i} holds no alert's interval");
        total += here;
    }
    assert_eq!(total, 3 + 30);
}

/// Once: an alert key no instance wrote (another program's string, a
/// count of `1e20` or `nan`, an interval starting in a year) failed every
/// turn, and the alert waiting for it held back every alert behind it,
/// of every kind and source, until someone deleted the key. Such a key or
/// field is now taken as absent.
#[tokio::test]
async fn an_alerts_key_no_instance_wrote_is_taken_as_absent() {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let a = instance(server.url(), Vec::new(), "fleet-planted");
    let f = fleet(&a);
    let key = "fleet-planted:{a:backlog.stale:sume}";
    server.cli(&["SET", key, "poisoned"]);
    assert_eq!(
        raise(f, "sume", 0, T).await,
        AlertTurn::Send { suppressed: 0 },
        "a string"
    );
    let year = (T + 365 * 86_400_000).to_string();
    let planted: [&[&str]; 5] = [
        &["since", "nan", "n", "3"],
        &["since", "inf"],
        &["since", &year],
        &["since", "-5", "n", "-1"],
        &["n", "1e20"],
    ];
    for fields in planted {
        server.cli(&["DEL", key]);
        let mut hset = vec!["HSET", key];
        hset.extend_from_slice(fields);
        server.cli(&hset);
        let turn = f
            .alert_turn("backlog.stale", Some("sume"), EVERY, AlertMode::Raise, 0, T)
            .await
            .unwrap_or_else(|e| panic!("{fields:?}: {e}"));
        assert!(
            matches!(turn, AlertTurn::Send { suppressed } if suppressed <= 3),
            "{fields:?}: {turn:?}"
        );
        // And the fleet folds the next as it should.
        assert_eq!(
            raise(f, "sume", 0, T + 1).await,
            AlertTurn::Fold { until: T + EVERY },
            "{fields:?}"
        );
    }
}
