//! What the real-process tests of a fleet on the shared inbox share: the
//! Redis they run on (one server or a three-master cluster), an instance's
//! settings and process, the events a provider posts to it, what they read
//! of each instance (`/metrics`, the operator API), and a wait with a
//! deadline.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use dedupd::gateway::signature::{Scheme, sign};

// Not every test crate that includes this module reads events.
#[allow(unused_imports)]
pub use super::http::{api, shown};
use super::process::{Drain, Running, serve_config, sigterm};
use super::redis::{RedisCluster, RedisServer};

/// The fleet's `sume` source's signing secret.
pub const SECRET: &str = "fleet-secret";
/// The secret alerts are signed with, in tests that send them.
pub const ALERT_SECRET: &str = "whsec_QWxlcnRzU2lnbmluZ1NlY3JldDEyMzQ1Ng==";

/// One instance's settings on the shared inbox: what every fleet test
/// sets (a Redis backend, `gateway.inbox = "shared"`, a `sume` source
/// ordered by `run_id` and `created_at`, sent to `forward_to`), and the
/// lines each test adds.
#[derive(Default)]
pub struct Instance<'a> {
    /// `[storage.redis]`'s lines: an address (`Backing::line`) and any
    /// other key (`response_timeout` is the default 2 s unless set here).
    pub redis: &'a str,
    /// More lines of `[gateway]`.
    pub gateway: &'a str,
    /// The source's `forward_to`.
    pub forward_to: &'a str,
    /// More lines of `[sources.sume]`.
    pub source: &'a str,
    /// More tables.
    pub rest: &'a str,
}

impl Instance<'_> {
    /// Writes the settings to `{name}.toml` in `dir`, with the instance's
    /// own redb file beside it; the file's path.
    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let file = dir.join(format!("{name}.toml"));
        std::fs::write(
            &file,
            format!(
                r#"
listen = "127.0.0.1:0"
data_path = "{data}"
[storage]
backend = "redis"
[storage.redis]
{redis}
connect_timeout = "1s"
[gateway]
inbox = "shared"
{gateway}
[sources.sume]
scheme = "sume"
secrets = ["{SECRET}"]
event_id = "body:/request_id"
created_at = "body:/created_at"
stream = "body:/run_id"
forward_to = "{forward_to}"
max_attempts = 1000
destination_secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
{source}
{rest}
"#,
                data = dir.join(format!("{name}.redb")).display(),
                redis = self.redis,
                gateway = self.gateway,
                forward_to = self.forward_to,
                source = self.source,
                rest = self.rest,
            ),
        )
        .unwrap();
        file
    }
}

/// A running instance.
pub struct Node {
    pub child: Running,
    pub port: u16,
    _drain: Drain,
}

/// Starts `dedupd serve` with settings `file`, and waits until it serves.
pub fn start_node(file: &Path) -> Node {
    let (child, port, drain) = serve_config(file);
    Node {
        child,
        port,
        _drain: drain,
    }
}

/// Stops each instance with SIGTERM; each must exit cleanly within 30 s.
pub fn stop_all(nodes: Vec<Node>) {
    for mut n in nodes {
        sigterm(&n.child.0);
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = n.child.0.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "an instance did not stop");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(
            status.success(),
            "an instance did not stop cleanly: {status}"
        );
    }
}

/// The event `k` of stream `run`: created `k` seconds after a fixed time.
pub fn event(run: &str, k: usize) -> (String, Vec<u8>) {
    let id = format!("{run}-{k:04}");
    let created = 1_800_000_000 + i64::try_from(k).unwrap();
    let created = time::OffsetDateTime::from_unix_timestamp(created)
        .unwrap()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    let body = serde_json::to_vec(&serde_json::json!({
        "request_id": id, "run_id": run, "created_at": created, "type": "run.updated",
    }))
    .unwrap();
    (id, body)
}

/// Posts `body` signed now to instance `port`; the status, or 0 when
/// nothing answered.
pub async fn post(client: &reqwest::Client, port: u16, body: &[u8]) -> u16 {
    let ts = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    )
    .unwrap();
    let mut req = client
        .post(format!("http://127.0.0.1:{port}/ingest/sume"))
        .timeout(Duration::from_secs(10))
        .body(body.to_vec());
    for (k, v) in sign(Scheme::Sume, SECRET, ts, "", body) {
        req = req.header(k, v);
    }
    match req.send().await {
        Ok(res) => res.status().as_u16(),
        Err(_) => 0,
    }
}

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
