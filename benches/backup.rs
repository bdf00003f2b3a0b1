//! A backup of a data file of about a gigabyte while writes go on (issue
//! 51): how long it takes, and how long any write waited during it.
//! Measured with the real release binary and the real CLI.
//!
//! Run: `cargo bench --bench backup`. Nothing is asserted; it prints what
//! it measured. One `dedupd serve` with dedupd's defaults and an
//! in-process receiver answering 204.
//!
//! 1. **Fill**: `EVENTS` events of `BODY_KB` KB each, delivered (16,000 of
//!    60 KB: a data file of about 1 GB).
//! 2. **Writes alone**: claims (`POST /v1/claims/KEY`) and small webhooks
//!    (`POST /ingest/bench`), each on a keep-alive connection of its own,
//!    one at a time, each at `RATE` per second, for `SECONDS`; latency =
//!    request sent → answer.
//! 3. **Writes during a backup**: the same writes while `dedupd backup
//!    --to FILE` (through the API, as an operator runs it) takes the
//!    backup; only writes sent between the CLI's start and its exit count.
//! 4. `dedupd verify` of the backup, `dedupd restore` of it into a new
//!    directory, and `dedupd verify` of the data file it put there.
//!
//! Beside each phase: the server's CPU and context switches (each thread's
//! `schedstat` and `status`, sampled every 50 ms so the backup's thread
//! is counted though it ends), and the CLI's (from `/usr/bin/time`).
//!
//! Settings (defaults): `EVENTS` (16000), `BODY_KB` (60), `RATE` (100),
//! `SECONDS` (10), `SETTLE_S` (5), `PIN=1` (the server on CPU 0: run the
//! bench itself with `taskset -c 1`), `BENCH_BIN` (another build's
//! binary, measured the same way). Under `cargo test --all-targets` (no
//! `--bench` argument) it does nothing.

#![allow(clippy::expect_used)]

#[allow(dead_code)]
#[path = "delivery.rs"]
mod delivery;

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::sync::Mutex;

use delivery::{
    ChildGuard, DESTINATION_SECRET, Receiver, ReceiverKind, SECRET, env_or, free_port,
    server_command, sign, wait_ready,
};

struct Params {
    events: u64,
    body_kb: usize,
    rate: u64,
    seconds: u64,
    settle_s: u64,
    bin: String,
}

fn main() -> anyhow::Result<()> {
    if !std::env::args().any(|a| a == "--bench") {
        return Ok(());
    }
    let p = Params {
        events: env_or("EVENTS", 16_000)?,
        body_kb: env_or("BODY_KB", 60)?,
        rate: env_or("RATE", 100)?,
        seconds: env_or("SECONDS", 10)?,
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
    let data = dir.path().join("dedupd.redb");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{port}\"\n\
             data_path = {data:?}\n\
             [log]\n\
             level = \"info\"\n\
             [sources.bench]\n\
             scheme = \"sume\"\n\
             secrets = [\"{SECRET}\"]\n\
             event_id = \"body:/request_id\"\n\
             forward_to = \"{url}\"\n\
             destination_secret = \"{DESTINATION_SECRET}\"\n\
             max_body_bytes = {max}\n",
            data = data.display().to_string(),
            url = receiver.url,
            max = (p.body_kb + 4) * 1024,
        ),
    )?;
    let log = dir.path().join("dedupd.log");
    let out = std::fs::File::create(&log)?;
    let child = server_command()
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
    let pid = child.child.id();
    let client = dedupd::http_client::builder().no_proxy().build()?;
    println!(
        "== backup beside writes ({}): {} events of {} KB, claims and webhooks each at {}/s",
        p.bin, p.events, p.body_kb, p.rate
    );
    fill(&client, &base, &p).await?;
    tokio::time::sleep(Duration::from_secs(p.settle_s)).await;
    println!(
        "data file: {:.0} MiB (key file {:.1} MiB)",
        mib(std::fs::metadata(&data)?.len()),
        mib(std::fs::metadata(dir.path().join("dedupd.redb.keys"))?.len())
    );

    // Writes alone.
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = Sampler::start(pid);
    let writes = Writes::start(&client, &base, &p, stop.clone(), "alone");
    tokio::time::sleep(Duration::from_secs(p.seconds)).await;
    stop.store(true, Ordering::SeqCst);
    let alone = writes.finish().await?;
    let alone_usage = sampler.finish().await;
    report("writes alone", &alone, &alone_usage, None);

    // Writes during a backup.
    let stop = Arc::new(AtomicBool::new(false));
    let writes = Writes::start(&client, &base, &p, stop.clone(), "during");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let file = dir.path().join("bench.backup");
    let sampler = Sampler::start(pid);
    let began = Instant::now();
    let cli = timed(
        &p.bin,
        &[
            "backup",
            "--url",
            &base,
            "--to",
            &file.display().to_string(),
        ],
    )
    .await?;
    let took = began.elapsed();
    let during_usage = sampler.finish().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::SeqCst);
    let during = writes.finish().await?.within(began, began + took);
    let size = std::fs::metadata(&file)?.len();
    println!(
        "backup: {:.0} MiB in {:.2} s ({:.0} MiB/s), `dedupd backup` {}",
        mib(size),
        took.as_secs_f64(),
        mib(size) / took.as_secs_f64(),
        cli
    );
    report(
        "writes during the backup",
        &during,
        &during_usage,
        Some(&alone),
    );
    let mut slow: Vec<(f64, f64, &str)> = during
        .claims
        .iter()
        .map(|(at, ms)| (at, ms, "claim"))
        .chain(during.webhooks.iter().map(|(at, ms)| (at, ms, "webhook")))
        .filter(|(_, ms, _)| **ms > 25.0)
        .map(|(at, ms, what)| ((*at - began).as_secs_f64() * 1000.0, *ms, what))
        .collect();
    slow.sort_by(|a, b| a.0.total_cmp(&b.0));
    for (at, ms, what) in slow {
        println!("  a {what} sent {at:.0} ms into the backup took {ms:.1} ms");
    }

    let verify = timed(&p.bin, &["verify", &file.display().to_string()]).await?;
    println!("`dedupd verify` of the backup: {verify}");
    let restored = TempDir::new()?;
    let restore_config = restored.path().join("restore.toml");
    std::fs::write(
        &restore_config,
        format!(
            "data_path = {:?}\n",
            restored.path().join("dedupd.redb").display().to_string()
        ),
    )?;
    let restore = timed(
        &p.bin,
        &[
            "restore",
            &file.display().to_string(),
            "--config",
            &restore_config.display().to_string(),
        ],
    )
    .await?;
    println!(
        "`dedupd restore`: {restore}; the restored data file: {:.0} MiB",
        mib(std::fs::metadata(restored.path().join("dedupd.redb"))?.len())
    );
    let check = timed(
        &p.bin,
        &[
            "verify",
            &restored.path().join("dedupd.redb").display().to_string(),
        ],
    )
    .await?;
    println!("`dedupd verify` of the restored data file: {check}");
    let checkpoints = std::fs::read_to_string(&log)?
        .lines()
        .filter(|l| l.contains("backup"))
        .map(str::to_owned)
        .collect::<Vec<_>>();
    for line in checkpoints {
        println!("server: {}", line.trim());
    }
    drop(child);
    Ok(())
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Runs `bin args` under `/usr/bin/time`: what it took, as it says.
async fn timed(bin: &str, args: &[&str]) -> anyhow::Result<String> {
    let mut cmd = Command::new("/usr/bin/time");
    cmd.args([
        "-f",
        "%e s, %U s user, %S s system, %w voluntary and %c involuntary context switches",
    ])
    .arg(bin)
    .args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("DEDUPD_") || k.to_ascii_lowercase().ends_with("_proxy") {
            cmd.env_remove(&k);
        }
    }
    let out = tokio::task::spawn_blocking(move || cmd.output()).await??;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        bail!(
            "{bin} {args:?} failed: {}{stderr}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    Ok(stderr.lines().last().unwrap_or_default().to_owned())
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
        posts.push(ingest(client.clone(), base.to_owned(), body));
        if posts.len() == 32 {
            for r in futures_util::future::join_all(posts.drain(..)).await {
                r?;
            }
        }
    }
    for r in futures_util::future::join_all(posts).await {
        r?;
    }
    let url = format!("{base}/v1/sources");
    let deadline = Instant::now() + Duration::from_secs(1200);
    loop {
        let v: Value = client.get(&url).send().await?.json().await?;
        let delivered = v["sources"]
            .as_array()
            .and_then(|a| a.iter().find(|s| s["source"] == "bench"))
            .and_then(|s| s["delivered"].as_u64());
        if delivered == Some(p.events) {
            break;
        }
        if Instant::now() > deadline {
            bail!("not all delivered: {v}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "fill: {} events delivered in {:.1} s",
        p.events,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

async fn ingest(client: reqwest::Client, base: String, body: Vec<u8>) -> anyhow::Result<()> {
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

/// Each write: when it was sent, and its latency in ms.
#[derive(Default)]
struct Latencies {
    claims: Vec<(Instant, f64)>,
    webhooks: Vec<(Instant, f64)>,
}

impl Latencies {
    /// Those sent between `from` and `to`.
    fn within(self, from: Instant, to: Instant) -> Self {
        let keep = |v: Vec<(Instant, f64)>| {
            v.into_iter()
                .filter(|(at, _)| *at >= from && *at <= to)
                .collect()
        };
        Self {
            claims: keep(self.claims),
            webhooks: keep(self.webhooks),
        }
    }

    fn all(&self) -> Vec<f64> {
        self.claims
            .iter()
            .chain(&self.webhooks)
            .map(|(_, ms)| *ms)
            .collect()
    }
}

/// The two write loops.
struct Writes {
    claims: tokio::task::JoinHandle<anyhow::Result<Vec<(Instant, f64)>>>,
    webhooks: tokio::task::JoinHandle<anyhow::Result<Vec<(Instant, f64)>>>,
}

impl Writes {
    fn start(
        client: &reqwest::Client,
        base: &str,
        p: &Params,
        stop: Arc<AtomicBool>,
        tag: &'static str,
    ) -> Self {
        let every = Duration::from_secs_f64(1.0 / p.rate.max(1) as f64);
        let (c, b, s) = (client.clone(), base.to_owned(), stop.clone());
        let claims = tokio::spawn(async move {
            paced(every, s, |i| {
                let req = c.post(format!("{b}/v1/claims/{tag}-{i}"));
                async move {
                    let res = req.send().await?;
                    if res.status() != reqwest::StatusCode::CREATED {
                        bail!("claim answered {}", res.status());
                    }
                    Ok(())
                }
            })
            .await
        });
        let (c, b) = (client.clone(), base.to_owned());
        let webhooks = tokio::spawn(async move {
            paced(every, stop, |i| {
                let body = serde_json::to_vec(&json!({
                    "request_id": format!("{tag}_{i}"), "type": "run.updated",
                }))
                .expect("json");
                ingest(c.clone(), b.clone(), body)
            })
            .await
        });
        Self { claims, webhooks }
    }

    async fn finish(self) -> anyhow::Result<Latencies> {
        Ok(Latencies {
            claims: self.claims.await??,
            webhooks: self.webhooks.await??,
        })
    }
}

/// Runs `write(i)` one at a time, every `every`, until `stop`: when each
/// was sent and how long it took, ms.
async fn paced<F, Fut>(
    every: Duration,
    stop: Arc<AtomicBool>,
    mut write: F,
) -> anyhow::Result<Vec<(Instant, f64)>>
where
    F: FnMut(u64) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let mut out = Vec::new();
    let mut next = Instant::now();
    let mut i = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let sent = Instant::now();
        write(i).await?;
        out.push((sent, sent.elapsed().as_secs_f64() * 1000.0));
        i += 1;
        next += every;
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            tokio::time::sleep(wait).await;
        }
    }
    Ok(out)
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

fn report(what: &str, l: &Latencies, u: &Usage, baseline: Option<&Latencies>) {
    let all = l.all();
    let row = |name: &str, v: &[(Instant, f64)]| {
        let ms: Vec<f64> = v.iter().map(|(_, m)| *m).collect();
        format!(
            "{name} {}: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            ms.len(),
            pct(&ms, 50.0),
            pct(&ms, 99.0),
            pct(&ms, 100.0)
        )
    };
    println!(
        "{what}: {}; {}; over 25 ms: {}",
        row("claims", &l.claims),
        row("webhooks", &l.webhooks),
        all.iter().filter(|ms| **ms > 25.0).count()
    );
    println!(
        "  server: {:.2} s CPU over {:.2} s ({:.2} cores), {} context switches; {}",
        u.cpu_ns as f64 / 1e9,
        u.seconds,
        u.cpu_ns as f64 / 1e9 / u.seconds.max(1e-9),
        u.switches,
        u.threads
            .iter()
            .map(|(name, (cpu, sw))| format!("{name} {:.2} s/{sw}", *cpu as f64 / 1e9))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if let Some(b) = baseline {
        let (a, b) = (pct(&all, 100.0), pct(&b.all(), 100.0));
        println!(
            "  longest write: {a:.2} ms during the backup, {b:.2} ms alone (goal: at most 25 ms)"
        );
    }
}

/// The server's threads' CPU and context switches over a phase.
struct Usage {
    cpu_ns: u64,
    switches: u64,
    seconds: f64,
    /// By thread name (threads of one name added up): CPU ns, switches.
    threads: Vec<(String, (u64, u64))>,
}

/// Samples every thread of a process every 50 ms, so a thread that ends
/// during the phase is counted up to its last sample.
struct Sampler {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Usage>,
}

impl Sampler {
    fn start(pid: u32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let task = tokio::spawn(async move {
            let at = Instant::now();
            let first = threads(pid);
            let last = Arc::new(Mutex::new(first.clone()));
            loop {
                let now = threads(pid);
                last.lock().await.extend(now);
                if s.load(Ordering::SeqCst) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let last = last.lock().await.clone();
            let mut by_name: HashMap<String, (u64, u64)> = HashMap::new();
            let (mut cpu, mut switches) = (0, 0);
            for (tid, (name, c, sw)) in &last {
                let (c0, sw0) = first.get(tid).map_or((0, 0), |(_, c, s)| (*c, *s));
                let (dc, ds) = (c.saturating_sub(c0), sw.saturating_sub(sw0));
                cpu += dc;
                switches += ds;
                let e = by_name.entry(name.clone()).or_default();
                e.0 += dc;
                e.1 += ds;
            }
            let mut threads: Vec<_> = by_name.into_iter().filter(|(_, (c, _))| *c > 0).collect();
            threads.sort_by_key(|t| std::cmp::Reverse(t.1.0));
            threads.truncate(6);
            Usage {
                cpu_ns: cpu,
                switches,
                seconds: at.elapsed().as_secs_f64(),
                threads,
            }
        });
        Self { stop, task }
    }

    async fn finish(self) -> Usage {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.expect("sampler")
    }
}

/// Each thread of `pid`: its name, CPU ns (`schedstat`) and context
/// switches (`voluntary` + `nonvoluntary`).
fn threads(pid: u32) -> HashMap<u32, (String, u64, u64)> {
    let mut out = HashMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in tasks.flatten() {
        let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
            continue;
        };
        let dir = task.path();
        let name = read_trim(&dir.join("comm"));
        let cpu = read_trim(&dir.join("schedstat"))
            .split_whitespace()
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let switches = read_trim(&dir.join("status"))
            .lines()
            .filter_map(|l| {
                l.strip_prefix("voluntary_ctxt_switches:")
                    .or_else(|| l.strip_prefix("nonvoluntary_ctxt_switches:"))
            })
            .filter_map(|n| n.trim().parse::<u64>().ok())
            .sum();
        out.insert(tid, (name, cpu, switches));
    }
    out
}

fn read_trim(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .trim()
        .to_owned()
}
