//! What the real-process tests of a fleet on the shared inbox share: the
//! Redis they run on (one server or a three-master cluster), and what they
//! read of each instance (`/metrics`, the operator API), and a wait with a
//! deadline.

use std::time::{Duration, Instant};

use super::redis::{RedisCluster, RedisServer};

/// The Redis a fleet runs on, as its `[storage.redis]` address line.
pub enum Backing {
    One(RedisServer),
    Cluster(RedisCluster),
}

impl Backing {
    /// One `redis-server`, with an AOF fsynced always.
    pub async fn one() -> Self {
        Self::One(
            tokio::task::spawn_blocking(|| {
                RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"])
            })
            .await
            .unwrap(),
        )
    }

    /// A three-master Redis Cluster.
    pub async fn cluster() -> Self {
        Self::Cluster(
            tokio::task::spawn_blocking(RedisCluster::start)
                .await
                .unwrap(),
        )
    }

    /// The `[storage.redis]` line that names it.
    pub fn line(&self) -> String {
        match self {
            Self::One(r) => format!("url = \"{}\"", r.url()),
            Self::Cluster(c) => format!(
                "cluster_nodes = [{}]",
                c.nodes
                    .iter()
                    .map(|n| format!("\"{n}\""))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

/// `GET path` of instance `port`, as JSON.
pub async fn api(port: u16, path: &str) -> serde_json::Value {
    super::http::client()
        .get(format!("http://127.0.0.1:{port}{path}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// An event of source `sume` as instance `port`'s API shows it.
pub async fn shown(port: u16, id: &str) -> serde_json::Value {
    api(port, &format!("/v1/sources/sume/events/{id}")).await
}

/// The sum of metric `name`'s series whose labels contain `label` on
/// instance `port`.
pub async fn metric(port: u16, name: &str, label: &str) -> f64 {
    let text = super::http::client()
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Waits until `check` holds, up to `within`; panics with `what`.
pub async fn within<F, Fut>(what: &str, within: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
