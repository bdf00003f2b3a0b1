//! A fleet's delivery lanes, with real processes: three `dedupd serve`
//! instances on the shared inbox of a real Redis (and, where the keys'
//! layout matters, a real three-master cluster), each sending to its own
//! `?n=I` of one real receiver. A lane's `rate_limit`, a `Retry-After` and
//! its circuit breaker are the fleet's (`P:{d:LANE}`, see
//! `src/store/redis/lanes.lua`): three instances send as one sender. Each
//! instance on its own would send three times the rate, keep sending
//! through another's `Retry-After`, and probe a paused destination three
//! times.
//!
//! These run on the real clock (separate processes cannot share a moved
//! one). They wait for what they check, with deadlines; the only times
//! they assert are the behaviours' own bounds (a rate over seconds, a
//! three-second hold, a probe's success seen by every instance within
//! seconds), never how fast something came.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;
use tempfile::TempDir;

use crate::support::fleet::{
    ALERT_SECRET, Backing, Instance, Node, api, event, metric, post, start_node, stop_all, within,
};
use crate::support::receiver::{Behaviour, Received, Receiver};

const GATES: &str = "dedupd_fleet_gates_total";

/// Instance `i`'s settings: `redis` is its `[storage.redis]` address, and
/// `source` the lines of `[sources.sume]` a test sets; `rest`, more tables.
fn config(
    dir: &TempDir,
    i: usize,
    redis: &str,
    receiver: &str,
    source: &str,
    rest: &str,
) -> PathBuf {
    Instance {
        redis,
        forward_to: &format!("{receiver}?n={i}"),
        source,
        rest,
        ..Instance::default()
    }
    .write(dir.path(), &format!("l{i}"))
}

/// The instances' ports.
fn ports(nodes: &[Node]) -> Vec<u16> {
    nodes.iter().map(|n| n.port).collect()
}

/// Three instances with the same settings.
fn start_three(dir: &TempDir, redis: &str, receiver: &str, source: &str, rest: &str) -> Vec<Node> {
    (0..3)
        .map(|i| start_node(&config(dir, i, redis, receiver, source, rest)))
        .collect()
}

/// Posts event `k` of each stream `{prefix}_{s}`, for `s` in `streams` and
/// `k` in `0..per_stream`, each stream's in order, the streams in eight
/// concurrent workers, event `k` of stream `s` to instance `(s + k) % 3`.
/// Their ids.
async fn post_spread(
    ports: Vec<u16>,
    prefix: &str,
    streams: usize,
    per_stream: usize,
) -> Vec<String> {
    let client = crate::support::http::client();
    let workers: Vec<_> = (0..8)
        .map(|w| {
            let (client, ports, prefix) = (client.clone(), ports.clone(), prefix.to_owned());
            tokio::spawn(async move {
                let mut ids = Vec::new();
                for s in (w..streams).step_by(8) {
                    for k in 0..per_stream {
                        let (id, body) = event(&format!("{prefix}_{s}"), k);
                        let port = ports[(s + k) % ports.len()];
                        assert_eq!(post(&client, port, &body).await, 200, "{id} to {port}");
                        ids.push(id);
                    }
                }
                ids
            })
        })
        .collect();
    let mut ids = Vec::new();
    for w in workers {
        ids.extend(w.await.unwrap());
    }
    ids
}

/// The event ids the receiver got (each once, whatever its copies).
fn ids_received(receiver: &Receiver) -> std::collections::BTreeSet<String> {
    receiver
        .received()
        .iter()
        .map(|r| r.header("webhook-id").to_owned())
        .collect()
}

/// Waits until the receiver got every one of `ids`.
async fn all_received(receiver: &Receiver, ids: &[String], within_: Duration) {
    let deadline = Instant::now() + within_;
    loop {
        let got = ids_received(receiver);
        let missing: Vec<&String> = ids.iter().filter(|id| !got.contains(*id)).collect();
        if missing.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} events never reached the receiver, such as {:?}",
            missing.len(),
            &missing[..missing.len().min(5)]
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The most arrivals in any window of `width` (a sliding window starting
/// at each arrival), of arrival times `at` in order.
fn most_in_window(at: &[Instant], width: Duration) -> usize {
    let mut most = 0;
    let mut end = 0;
    for (i, start) in at.iter().enumerate() {
        while end < at.len() && at[end].duration_since(*start) < width {
            end += 1;
        }
        most = most.max(end - i);
    }
    most
}

/// Which instance sent a request (`?n=I`).
fn sender(r: &Received) -> usize {
    r.path
        .rsplit_once("n=")
        .and_then(|(_, n)| n.parse().ok())
        .unwrap()
}

/// `rate_limit = "20/s"` and `rate_burst = 20` on three instances: 400
/// events on 200 streams, posted to the three in turn, reach the
/// application at the fleet's rate, not three times it. In any second at
/// most burst + rate + 1 arrive (the 1 for arrival jitter); over the run,
/// between 15/s and 22/s (tokens neither multiply nor leak). Each
/// instance with its own bucket sends about 60/s.
async fn three_instances_share_one_rate_limit(backing: Backing) {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let dir = TempDir::new().unwrap();
    let source = r#"
rate_limit = "20/s"
rate_burst = 20
backoff_min = "100ms"
backoff_max = "1s"
"#;
    let nodes = start_three(&dir, &backing.line(), &receiver.url, source, "");
    let ids = post_spread(ports(&nodes), "rate", 200, 2).await;
    assert_eq!(ids.len(), 400);
    // While the fleet's tokens are out, every instance says so: held by
    // the rate limit until the fleet's next token, which comes within a
    // token's time (50 ms at 20/s; a second allows for the reading).
    for (i, n) in nodes.iter().enumerate() {
        within(
            &format!("instance {i} shows the fleet's rate limit holding"),
            Duration::from_secs(20),
            || async {
                let d = delivery(n.port).await;
                let now = unix_ms();
                d["scope"] == "fleet"
                    && d["held_by"] == "rate_limit"
                    && d["rate_limited_until_ms"]
                        .as_u64()
                        .is_some_and(|t| t + 1000 > now && t < now + 1000)
                    && d["held_until_ms"] == d["rate_limited_until_ms"]
            },
        )
        .await;
    }
    all_received(&receiver, &ids, Duration::from_secs(120)).await;
    let got = receiver.received();
    let at: Vec<Instant> = {
        let mut at: Vec<Instant> = got.iter().map(|r| r.at).collect();
        at.sort();
        at
    };
    let most = most_in_window(&at, Duration::from_secs(1));
    let span = at[at.len() - 1].duration_since(at[0]).as_secs_f64();
    let rate = (at.len() - 1) as f64 / span;
    let mut by_sender = [0usize; 3];
    for r in &got {
        by_sender[sender(r)] += 1;
    }
    eprintln!(
        "rate limit: {} arrivals over {span:.2} s ({rate:.1}/s), at most {most} in a second, by instance {by_sender:?}",
        at.len()
    );
    assert!(
        most <= 20 + 20 + 1,
        "at most burst + rate + 1 in any second, fleet-wide: {most} ({by_sender:?})"
    );
    assert!(
        (15.0..=22.0).contains(&rate),
        "the fleet's rate over the run is its rate_limit (20/s): {rate:.1}/s over {span:.2} s"
    );
    assert!(
        by_sender.iter().all(|n| *n > 0),
        "every instance delivered some: {by_sender:?}"
    );
    stop_all(nodes);
    drop(backing);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_instances_share_one_rate_limit_on_one_redis() {
    three_instances_share_one_rate_limit(Backing::one().await).await;
}

/// On a cluster: the lane's bucket is one key, on one master, whichever
/// masters the events' buckets are on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_instances_share_one_rate_limit_on_a_cluster() {
    three_instances_share_one_rate_limit(Backing::cluster().await).await;
}

/// Now, Unix ms.
fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The delivery view of `sume` on instance `port`.
async fn delivery(port: u16) -> Value {
    api(port, "/v1/sources/sume").await["delivery"].clone()
}

/// How many of `sume`'s events instance `port` lists with `status`.
async fn count_with(port: u16, status: &str) -> usize {
    let mut n = 0;
    let mut after: Option<String> = None;
    loop {
        let mut path = format!("/v1/sources/sume/events?status={status}&limit=500");
        if let Some(a) = &after {
            path.push_str(&format!("&after={a}"));
        }
        let page = api(port, &path).await;
        n += page["events"].as_array().map_or(0, Vec::len);
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => return n,
        }
    }
}

/// The application answers one request 429 with `Retry-After: 3`: the
/// instance that got it holds the lane in the fleet's state, and no
/// instance sends anything for three seconds (after 250 ms for requests
/// already on their way); each shows the hold. Then everything is
/// delivered. Each instance on its own sends on through the others' hold.
async fn a_retry_after_seen_by_one_instance_holds_all_three(backing: Backing) {
    let receiver = Receiver::start(Behaviour::RetryAfter {
        status: 429,
        value: "3",
        times: 1,
    })
    .await;
    let dir = TempDir::new().unwrap();
    let source = r#"
backoff_min = "100ms"
backoff_max = "5s"
"#;
    let nodes = start_three(&dir, &backing.line(), &receiver.url, source, "");
    // Posted while the fleet delivers: the hold is watched for as it
    // comes, however long the posting takes.
    let posting = tokio::spawn(post_spread(ports(&nodes), "hold", 100, 3));
    within(
        "the application answered 429",
        Duration::from_secs(30),
        || async { !receiver.received().is_empty() },
    )
    .await;
    let first = receiver.received()[0].clone();
    let t429 = first.at;
    let hold_ends = t429 + Duration::from_secs(3);
    // Every instance shows the hold while it lasts: each asks the fleet's
    // lane state before it starts anything, and is answered "held".
    let mut shown_held = Vec::new();
    for n in &nodes {
        let mut seen = None;
        while Instant::now() < hold_ends {
            let d = delivery(n.port).await;
            if let Some(until) = d["retry_after_until_ms"].as_u64() {
                seen = Some(until);
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        shown_held.push(seen);
    }
    let ids = posting.await.unwrap();
    assert_eq!(ids.len(), 300);
    all_received(&receiver, &ids, Duration::from_secs(120)).await;
    let got = receiver.received();
    let margin = t429 + Duration::from_millis(250);
    let in_hold: Vec<(usize, Duration)> = got
        .iter()
        .filter(|r| r.at > margin && r.at < hold_ends)
        .map(|r| (sender(r), r.at.duration_since(t429)))
        .collect();
    let before = got.iter().filter(|r| r.at <= margin).count();
    let last_before = got
        .iter()
        .filter(|r| r.at > t429 && r.at <= margin)
        .map(|r| r.at.duration_since(t429))
        .max();
    eprintln!(
        "retry-after: 429 from instance {}; {before} arrivals up to t429 + 250 ms (the last at {last_before:?}), {} in (t429 + 250 ms, t429 + 3 s): {in_hold:?}; shown held: {shown_held:?}",
        sender(&first),
        in_hold.len()
    );
    assert!(
        in_hold.is_empty(),
        "nothing sent while the fleet is held (instance, after the 429): {in_hold:?}"
    );
    assert!(
        shown_held.iter().all(Option::is_some),
        "each instance's delivery view shows the hold: {shown_held:?}"
    );
    for n in &nodes {
        within(
            "every event delivered, as each instance lists them",
            Duration::from_secs(60),
            || async { count_with(n.port, "delivered").await == 300 },
        )
        .await;
    }
    stop_all(nodes);
    drop(backing);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retry_after_seen_by_one_instance_holds_all_three_on_one_redis() {
    a_retry_after_seen_by_one_instance_holds_all_three(Backing::one().await).await;
}

/// On a cluster: the hold is in the lane's key, on one master.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retry_after_seen_by_one_instance_holds_all_three_on_a_cluster() {
    a_retry_after_seen_by_one_instance_holds_all_three(Backing::cluster().await).await;
}

/// `dedupd_alerts_total` of `kind` over the instances, all outcomes: the
/// alerts raised fleet-wide.
async fn alerts_raised(nodes: &[Node], kind: &str) -> f64 {
    let mut n = 0.0;
    for node in nodes {
        n += metric(
            node.port,
            "dedupd_alerts_total",
            &format!("kind=\"{kind}\""),
        )
        .await;
    }
    n
}

/// Alerts of `kind` the alert endpoint got.
fn alerts_of(alerts: &Receiver, kind: &str) -> Vec<Value> {
    alerts
        .received()
        .iter()
        .filter_map(|r| serde_json::from_slice::<Value>(&r.body).ok())
        .filter(|v| v["type"] == kind)
        .collect()
}

/// The fleet's gates of `sume` instance `port` counted, by answer.
async fn gates(port: u16, answer: &str) -> f64 {
    metric(port, GATES, &format!("answer=\"{answer}\"")).await
}

/// A failing destination pauses the fleet's breaker once (one
/// `source.paused`); when the pause ends one probe, from one instance,
/// decides for all three (the others are answered "probing"); its success
/// resumes every instance (one `source.resumed`). Instances with their
/// own breakers would each pause, each alert, and each probe.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_probe_decides_for_the_fleet() {
    let receiver = Receiver::start(Behaviour::Always(503)).await;
    let alerts = Receiver::start(Behaviour::Accept).await;
    let backing = Backing::one().await;
    let dir = TempDir::new().unwrap();
    let source = r#"
forward_timeout = "60s"
backoff_min = "2s"
backoff_max = "4s"
max_in_flight = 1
pause_after = 3
"#;
    let rest = format!(
        r#"
[alerts]
forward_to = "{}"
destination_secret = "{ALERT_SECRET}"
every = "1h"
backlog_after = "1h"
backoff_min = "10ms"
backoff_max = "40ms"
"#,
        alerts.url
    );
    let nodes = start_three(&dir, &backing.line(), &receiver.url, source, &rest);
    post_spread(ports(&nodes), "probe", 6, 1).await;
    for (i, n) in nodes.iter().enumerate() {
        within(
            &format!("instance {i} is answered \"paused\" by the fleet"),
            Duration::from_secs(60),
            || async { gates(n.port, "paused").await >= 1.0 },
        )
        .await;
    }
    // While paused, every instance shows the fleet's one pause: the same
    // `paused_until_ms` from all three, read together (instances with
    // their own breakers would each pause at their own time).
    within(
        "the three instances show one pause",
        Duration::from_secs(30),
        || async {
            let mut views = Vec::new();
            for n in &nodes {
                views.push(delivery(n.port).await);
            }
            let until = views[0]["paused_until_ms"].as_u64();
            until.is_some()
                && views.iter().all(|d| {
                    d["scope"] == "fleet"
                        && d["state"] == "paused"
                        && d["held_by"] == "paused"
                        && d["paused_until_ms"].as_u64() == until
                        && d["held_until_ms"].as_u64() == until
                })
        },
    )
    .await;
    // The destination hangs from now on: a probe sent is held.
    receiver.set(Behaviour::Hold(None));
    within("a probe held", Duration::from_secs(60), || async {
        receiver.held() >= 1
    })
    .await;
    let sent = receiver.received().len();
    let probe = receiver.received()[sent - 1].clone();
    let holder = sender(&probe);
    // The others ask again (every half second at most while another's
    // probe is out) and are answered "probing", twice each: they know.
    let mut asked = Vec::new();
    for n in &nodes {
        asked.push(gates(n.port, "probing").await);
    }
    for (i, n) in nodes.iter().enumerate() {
        if i == holder {
            continue;
        }
        within(
            &format!("instance {i} answered \"probing\" twice more"),
            Duration::from_secs(30),
            || async { gates(n.port, "probing").await >= asked[i] + 2.0 },
        )
        .await;
    }
    let held = receiver.held();
    let since: Vec<String> = receiver.received()[sent..]
        .iter()
        .map(|r| r.path.clone())
        .collect();
    eprintln!("probe: from instance {holder}; held {held}; sent since: {since:?}");
    assert_eq!(held, 1, "one probe for the fleet");
    assert!(since.is_empty(), "nothing sent beside the probe: {since:?}");

    // It succeeds: every instance delivers again. The application takes
    // 150 ms per request from now on, so that with one in flight per
    // instance the work lasts seconds: each instance has its share left
    // when it learns of the success.
    let released = Instant::now();
    receiver.release_to(Behaviour::Delay(150));
    let late = post_spread(ports(&nodes), "after", 45, 1).await;
    let delivered_by = || {
        let mut by = [0usize; 3];
        for r in receiver.received() {
            if r.at > released {
                by[sender(&r)] += 1;
            }
        }
        by
    };
    let deadline = released + Duration::from_secs(5);
    while delivered_by().contains(&0) {
        if Instant::now() >= deadline {
            let mut seen = Vec::new();
            for n in &nodes {
                let mut answers = Vec::new();
                for a in ["open", "paused", "probe", "probing", "held", "limited"] {
                    answers.push((a, gates(n.port, a).await));
                }
                seen.push((answers, delivery(n.port).await));
            }
            panic!(
                "not every instance delivered within 5 s of the probe's success: {:?}; gates and views: {seen:?}",
                delivered_by()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let first_after: Vec<Option<Duration>> = (0..3)
        .map(|i| {
            receiver
                .received()
                .iter()
                .find(|r| r.at > released && sender(r) == i)
                .map(|r| r.at.duration_since(released))
        })
        .collect();
    eprintln!("after the probe's success, each instance's first delivery: {first_after:?}");
    all_received(&receiver, &late, Duration::from_secs(30)).await;
    within(
        "one source.paused and one source.resumed delivered",
        Duration::from_secs(30),
        || async {
            !alerts_of(&alerts, "source.paused").is_empty()
                && !alerts_of(&alerts, "source.resumed").is_empty()
        },
    )
    .await;
    let paused = alerts_raised(&nodes, "source.paused").await;
    let resumed = alerts_raised(&nodes, "source.resumed").await;
    eprintln!("alerts raised fleet-wide: source.paused {paused}, source.resumed {resumed}");
    assert_eq!(alerts_of(&alerts, "source.paused").len(), 1);
    assert_eq!(alerts_of(&alerts, "source.resumed").len(), 1);
    assert_eq!(
        (paused, resumed),
        (1.0, 1.0),
        "each transition raised once, by the instance whose report made it"
    );
    stop_all(nodes);
    drop(backing);
}
