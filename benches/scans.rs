//! Counts beside live ingest (issue 50): what worst-case counts from a
//! read-only token do to the latency of a provider's posts. Measured with
//! the real release binary.
//!
//! Run: `cargo bench --bench scans`. Nothing is asserted; it prints what
//! it measured. One `dedupd serve` with dedupd's defaults (the scan
//! budget, one scan at a time) and an in-process receiver answering 204.
//!
//! 1. **Fill**: `EVENTS` events of `BODY_KB` KB each (a JSON body with a
//!    `type` and a padding field), delivered.
//! 2. **Ingest alone**: small events posted one at a time on one
//!    keep-alive connection at `RATE` per second for `SECONDS`; latency =
//!    post sent → 200.
//! 3. **Ingest beside counts**: the same, while `COUNTERS` clients each
//!    count in a loop with a filter on a body field that matches nothing
//!    (every body is read and parsed), following each count's cursor to
//!    its end, then starting again.
//!
//! Beside each phase: the server's CPU (its threads' `schedstat`) and
//! context switches (`voluntary` + `nonvoluntary`, every thread) per
//! ingest, and in phase 3 per count answer too.
//!
//! `PIN=1` starts the server pinned to CPU 0 (`taskset -c 0`); run the
//! bench itself on the other one: `PIN=1 taskset -c 1 cargo bench --bench
//! scans`. Settings (defaults): `EVENTS` (1000), `BODY_KB` (60), `RATE`
//! (100), `SECONDS` (10), `COUNTERS` (16), `SETTLE_S` (5: the pause after
//! the fill, so its checkpoint is not in the first phase), `BENCH_BIN`
//! (this build's binary; another, to measure another build the same way).
//! Under `cargo test --all-targets` (no `--bench` argument) it does
//! nothing.

#![allow(clippy::expect_used)]

#[allow(dead_code)]
#[path = "delivery.rs"]
mod delivery;

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use serde_json::{Value, json};
use tempfile::TempDir;

use delivery::{
    ChildGuard, DESTINATION_SECRET, Receiver, ReceiverKind, SECRET, env_or, free_port,
    server_command, sign, usage, wait_ready,
};

struct Params {
    events: u64,
    body_kb: usize,
    rate: u64,
    seconds: u64,
    counters: usize,
    pin: bool,
    settle_s: u64,
    bin: String,
}

fn main() -> anyhow::Result<()> {
    if !std::env::args().any(|a| a == "--bench") {
        return Ok(());
    }
    let p = Params {
        events: env_or("EVENTS", 1000)?,
        body_kb: env_or("BODY_KB", 60)?,
        rate: env_or("RATE", 100)?,
        seconds: env_or("SECONDS", 10)?,
        counters: env_or("COUNTERS", 16)?,
        pin: env_or("PIN", 0u8)? == 1,
        settle_s: env_or("SETTLE_S", 5)?,
        bin: env_or("BENCH_BIN", env!("CARGO_BIN_EXE_dedupd").to_owned())?,
    };
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(run(p))
}

async fn run(p: Params) -> anyhow::Result<()> {
    let receiver = Receiver::start(ReceiverKind::InProcess { delay: None }).await?;
    let dir = TempDir::new()?;
    let port = free_port()?;
    let config = dir.path().join("dedupd.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{port}\"\n\
             data_path = {data:?}\n\
             [log]\n\
             level = \"warn\"\n\
             [sources.bench]\n\
             scheme = \"sume\"\n\
             secrets = [\"{SECRET}\"]\n\
             event_id = \"body:/request_id\"\n\
             forward_to = \"{url}\"\n\
             destination_secret = \"{DESTINATION_SECRET}\"\n\
             max_body_bytes = {max}\n",
            data = dir.path().join("dedupd.redb").display().to_string(),
            url = receiver.url,
            max = (p.body_kb + 4) * 1024,
        ),
    )?;
    let log = dir.path().join("dedupd.log");
    let out = std::fs::File::create(&log)?;
    let mut cmd = server_command();
    let child = cmd
        .args(["serve", "--config"])
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .context("starting dedupd")?;
    let mut child = ChildGuard {
        child,
        terminate: true,
    };
    let base = format!("http://127.0.0.1:{port}");
    wait_ready(&mut child, &base, &log).await?;
    // taskset execs dedupd: the pid is the server's.
    let pid = child.child.id();
    let client = dedupd::http_client::builder().no_proxy().build()?;

    println!(
        "== scans beside ingest ({}): {} events of {} KB, {} counters, ingest at {}/s for {} s{}",
        p.bin,
        p.events,
        p.body_kb,
        p.counters,
        p.rate,
        p.seconds,
        if p.pin {
            " (server pinned to CPU 0)"
        } else {
            ""
        }
    );
    fill(&client, &base, &p).await?;
    tokio::time::sleep(Duration::from_secs(p.settle_s)).await;

    let idle = Phase::start(pid);
    let alone = ingest(&client, &base, &p, "alone").await?;
    let idle = idle.end(pid);

    let stop = Arc::new(AtomicBool::new(false));
    let answers = Arc::new(AtomicU64::new(0));
    let rows = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let mut counters = Vec::new();
    for _ in 0..p.counters {
        counters.push(tokio::spawn(count_loop(
            client.clone(),
            base.clone(),
            stop.clone(),
            answers.clone(),
            rows.clone(),
            refused.clone(),
        )));
    }
    // Let every counter be in flight first.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let loaded = Phase::start(pid);
    let answers_before = answers.load(Ordering::Relaxed);
    let rows_before = rows.load(Ordering::Relaxed);
    let beside = ingest(&client, &base, &p, "beside").await?;
    let loaded = loaded.end(pid);
    let counted = answers.load(Ordering::Relaxed) - answers_before;
    let read = rows.load(Ordering::Relaxed) - rows_before;
    stop.store(true, Ordering::Relaxed);
    for c in counters {
        let _ = c.await;
    }

    let n_alone = alone.len() as f64;
    let n_beside = beside.len() as f64;
    println!(
        "ingest alone:        p50 {:7.2} ms  p99 {:7.2} ms  max {:7.2} ms  ({} posts; server {:.1} µs CPU, {:.2} context switches per post)",
        pct(&alone, 50.0),
        pct(&alone, 99.0),
        pct(&alone, 100.0),
        alone.len(),
        idle.cpu_us() / n_alone,
        idle.switches() / n_alone
    );
    println!(
        "ingest beside counts: p50 {:7.2} ms  p99 {:7.2} ms  max {:7.2} ms  ({} posts; server {:.1} µs CPU, {:.2} context switches per post, counts included)",
        pct(&beside, 50.0),
        pct(&beside, 99.0),
        pct(&beside, 100.0),
        beside.len(),
        loaded.cpu_us() / n_beside,
        loaded.switches() / n_beside
    );
    println!(
        "counts: {counted} answers ({:.1}/s), {read} rows read, {} refused as busy; the server's CPU in that phase: {:.2} cores",
        counted as f64 / loaded.seconds,
        refused.load(Ordering::Relaxed),
        loaded.cpu_us() / 1e6 / loaded.seconds
    );
    println!(
        "p99 beside counts / p99 alone: {:.2}x (goal: at most 2x)",
        pct(&beside, 99.0) / pct(&alone, 99.0)
    );
    drop(child);
    Ok(())
}

/// Posts `EVENTS` big events and waits until all are delivered.
async fn fill(client: &reqwest::Client, base: &str, p: &Params) -> anyhow::Result<()> {
    let started = Instant::now();
    let pad = "x".repeat(p.body_kb * 1024);
    let mut posts = Vec::new();
    for i in 0..p.events {
        let body = serde_json::to_vec(&json!({
            "request_id": format!("fill_{i}"), "type": "invoice.paid", "pad": pad,
        }))?;
        posts.push(post(client.clone(), base.to_owned(), body));
        if posts.len() == 32 {
            for r in futures_util::future::join_all(posts.drain(..)).await {
                r?;
            }
        }
    }
    for r in futures_util::future::join_all(posts).await {
        r?;
    }
    let url = format!("{base}/v1/sources/bench/count?status=delivered");
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let v: Value = client.get(&url).send().await?.json().await?;
        if v["matched"].as_u64() == Some(p.events) {
            break;
        }
        if Instant::now() > deadline {
            bail!("not all delivered: {v}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "fill: {} events delivered in {:.1} s",
        p.events,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Posts small events one at a time at `RATE` per second for `SECONDS`:
/// each one's latency, ms.
async fn ingest(
    client: &reqwest::Client,
    base: &str,
    p: &Params,
    tag: &str,
) -> anyhow::Result<Vec<f64>> {
    let mut out = Vec::new();
    let every = Duration::from_secs_f64(1.0 / p.rate.max(1) as f64);
    let end = Instant::now() + Duration::from_secs(p.seconds);
    let mut next = Instant::now();
    let mut i = 0u64;
    while Instant::now() < end {
        let body = serde_json::to_vec(&json!({
            "request_id": format!("{tag}_{i}"), "type": "run.updated",
        }))?;
        i += 1;
        let sent = Instant::now();
        post(client.clone(), base.to_owned(), body).await?;
        out.push(sent.elapsed().as_secs_f64() * 1000.0);
        next += every;
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            tokio::time::sleep(wait).await;
        }
    }
    Ok(out)
}

async fn post(client: reqwest::Client, base: String, body: Vec<u8>) -> anyhow::Result<()> {
    let ts = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let res = client
        .post(format!("{base}/ingest/bench"))
        .header("content-type", "application/json")
        .header("x-sume-timestamp", ts.to_string())
        .header("x-sume-signature", sign(ts, &body))
        .body(body)
        .send()
        .await?;
    if !res.status().is_success() {
        bail!("ingest answered {}", res.status());
    }
    Ok(())
}

/// Counts with a body filter that matches nothing, following each count's
/// cursor to its end, until `stop`.
async fn count_loop(
    client: reqwest::Client,
    base: String,
    stop: Arc<AtomicBool>,
    answers: Arc<AtomicU64>,
    rows: Arc<AtomicU64>,
    refused: Arc<AtomicU64>,
) {
    let first = format!("{base}/v1/sources/bench/count?status=delivered&field=/type&value=nomatch");
    let mut url = first.clone();
    while !stop.load(Ordering::Relaxed) {
        let Ok(res) = client.get(&url).send().await else {
            continue;
        };
        if res.status() == reqwest::StatusCode::TOO_MANY_REQUESTS {
            refused.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        let Ok(v) = res.json::<Value>().await else {
            continue;
        };
        answers.fetch_add(1, Ordering::Relaxed);
        rows.fetch_add(v["scanned"].as_u64().unwrap_or(0), Ordering::Relaxed);
        url = match v["next"].as_str() {
            Some(next) => format!("{first}&after={next}"),
            None => first.clone(),
        };
    }
}

/// The `p`th percentile of `ms`.
fn pct(ms: &[f64], p: f64) -> f64 {
    let mut v = ms.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return 0.0;
    }
    let i = ((p / 100.0) * (v.len() - 1) as f64).round() as usize;
    v[i.min(v.len() - 1)]
}

/// The server's CPU time and context switches over a phase.
struct Phase {
    at: Instant,
    cpu_ns: u64,
    switches: u64,
    seconds: f64,
}

impl Phase {
    fn start(pid: u32) -> Self {
        let (cpu_ns, switches) = usage(pid);
        Self {
            at: Instant::now(),
            cpu_ns,
            switches,
            seconds: 0.0,
        }
    }

    fn end(self, pid: u32) -> Self {
        let (cpu_ns, switches) = usage(pid);
        Self {
            at: self.at,
            cpu_ns: cpu_ns.saturating_sub(self.cpu_ns),
            switches: switches.saturating_sub(self.switches),
            seconds: self.at.elapsed().as_secs_f64(),
        }
    }

    fn cpu_us(&self) -> f64 {
        self.cpu_ns as f64 / 1000.0
    }

    fn switches(&self) -> f64 {
        self.switches as f64
    }
}
