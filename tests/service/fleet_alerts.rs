//! Alerts of a fleet on the shared inbox, with real processes: three
//! `dedupd serve` instances on one real `redis-server`, and on a real
//! three-master Redis Cluster (the fleet's keys spread over its slots),
//! each seeing the same stale backlog. The fleet sends the alert once.
//!
//! These run on the real clock: they wait for what they check, with
//! deadlines, and never assert on how fast it came.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;
use tempfile::TempDir;

use crate::support::fleet::{ALERT_SECRET, Backing, Instance, Node, event, post, start_node};
use crate::support::receiver::{Behaviour, Receiver};

/// One instance's settings file: `redis` is its `[storage.redis]`. The
/// application answers 503 and the source retries after an hour, without
/// a breaker, so its events stay pending and the backlog grows stale.
fn config(dir: &TempDir, i: usize, redis: &str, forward_to: &str, alerts_to: &str) -> PathBuf {
    Instance {
        redis,
        forward_to,
        source: "backoff_min = \"1h\"\nbackoff_max = \"1h\"\npause_after = 0",
        rest: &format!(
            r#"
[alerts]
forward_to = "{alerts_to}"
destination_secret = "{ALERT_SECRET}"
every = "1h"
backlog_after = "1m"
backoff_min = "10ms"
backoff_max = "40ms"
"#
        ),
        ..Instance::default()
    }
    .write(dir.path(), &format!("n{i}"))
}

/// `dedupd_alerts_total` of `kind` at instance `port`, by outcome.
async fn alerts_counted(client: &reqwest::Client, port: u16, kind: &str) -> Vec<(String, f64)> {
    let text = client
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let kind = format!("kind=\"{kind}\"");
    text.lines()
        .filter(|l| l.starts_with("dedupd_alerts_total{") && l.contains(&kind))
        .filter_map(|l| {
            let outcome = l.split("outcome=\"").nth(1)?.split('"').next()?;
            Some((outcome.to_owned(), l.rsplit(' ').next()?.parse().ok()?))
        })
        .collect()
}

/// The ids of the alerts source's events with `status`, as instance
/// `port` lists them (the whole fleet's).
async fn alert_events(client: &reqwest::Client, port: u16, status: &str) -> usize {
    let v: Value = client
        .get(format!(
            "http://127.0.0.1:{port}/v1/sources/dedupd-alerts/events?status={status}"
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["events"].as_array().map_or(0, Vec::len)
}

/// Alerts of `kind` the alert endpoint got.
fn received(alerts: &Receiver, kind: &str) -> Vec<Value> {
    alerts
        .received()
        .iter()
        .filter_map(|r| serde_json::from_slice::<Value>(&r.body).ok())
        .filter(|v| v["type"] == kind)
        .collect()
}

/// Three instances on the shared inbox (`redis`, their `[storage.redis]`)
/// see one stale backlog: each raises `backlog.stale`, and the fleet sends
/// one, the two others folded (held until the interval's end, an hour).
async fn three_instances_send_one_backlog_stale_alert(redis: &str) {
    let app = Receiver::start(Behaviour::Always(503)).await;
    let alerts = Receiver::start(Behaviour::Accept).await;
    let dir = TempDir::new().unwrap();
    let nodes: Vec<Node> = (0..3)
        .map(|i| start_node(&config(&dir, i, redis, &app.url, &alerts.url)))
        .collect();
    let client = crate::support::http::client();
    for (i, n) in nodes.iter().enumerate() {
        let (id, body) = event(&format!("run_{i}"), 0);
        assert_eq!(
            post(&client, n.port, &body).await,
            200,
            "{id} to {}",
            n.port
        );
    }
    // Once the backlog is a minute old, each instance raises the alert
    // and puts it to the fleet: sent or folded, each counts it. Then the
    // one sent is delivered.
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut outcomes: Vec<(String, f64)>;
    loop {
        outcomes = Vec::new();
        for n in &nodes {
            outcomes.extend(alerts_counted(&client, n.port, "backlog.stale").await);
        }
        let decided: f64 = outcomes.iter().map(|(_, v)| v).sum();
        if decided >= 3.0
            && alert_events(&client, nodes[0].port, "pending").await == 0
            && alert_events(&client, nodes[0].port, "delivered").await > 0
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the fleet never settled its backlog.stale alerts: {outcomes:?}, {} received",
            received(&alerts, "backlog.stale").len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let sum = |outcome: &str| -> f64 {
        outcomes
            .iter()
            .filter(|(o, _)| o == outcome)
            .map(|(_, v)| v)
            .sum()
    };
    let got = received(&alerts, "backlog.stale");
    assert_eq!(got.len(), 1, "one backlog.stale from the fleet: {got:?}");
    assert_eq!(got[0]["source"], "sume", "{got:?}");
    assert_eq!(got[0]["detail"]["pending"], 3, "{got:?}");
    assert_eq!(
        (sum("sent"), sum("folded"), sum("gone"), sum("dropped")),
        (1.0, 2.0, 0.0, 0.0),
        "{outcomes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_instances_send_one_backlog_stale_alert_on_one_redis() {
    let backing = Backing::one().await;
    three_instances_send_one_backlog_stale_alert(&backing.line()).await;
    drop(backing);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_instances_send_one_backlog_stale_alert_on_a_cluster() {
    let backing = Backing::cluster().await;
    three_instances_send_one_backlog_stale_alert(&backing.line()).await;
    drop(backing);
}
