//! A fleet of dedupd instances on one Redis, measured with real processes:
//! the release binary (built with the `redis` feature), `redis-server`
//! with `appendonly yes` and `appendfsync always`, and nginx as the
//! application. Issue 32's questions: what do a second and a third
//! instance add, what does the shared inbox cost against the local one, and
//! what do claims gain from a three-master Redis Cluster.
//!
//! Run: `cargo bench --features redis --bench fleet`. Nothing is asserted:
//! it prints a table of medians over `RUNS` runs, each figure also as a
//! ratio to one instance on its local inbox. The runs take turns (run 1 of
//! every scenario, then run 2, …), so a slow minute of this VM's disk lands
//! on all of them rather than on one.
//!
//! - **Delivery**, for `gateway.inbox` in {local, shared} × 1, 2, 3
//!   instances: a fresh redis-server, N `dedupd serve` with
//!   `storage.backend = "redis"` and `durability = "fsync"` (so an instance
//!   refuses to run unless Redis syncs each write: the bench cannot measure
//!   a Redis that does not), all forwarding to one nginx (`return 204;`,
//!   deliveries counted from its access log, as `benches/delivery.rs`). A
//!   poster sends unique Sume-signed events (`run_id` = i % `STREAMS`,
//!   `created_at` increasing) with `CONCURRENCY` keep-alive connections for
//!   `DURATION_S`, connection c to instance c % N, as a balancer hands out
//!   connections: a stream's events reach every instance. Ingest is
//!   accepted events ÷ posting time; end to end is events delivered ÷
//!   (first post → last delivery). Then every accepted event is accounted
//!   for: delivered (once, or how many more times), settled stale or dead
//!   (the instances' `/v1/sources` counts; with local inboxes, summed), or
//!   lost.
//! - **Claims**: one instance against one redis-server, and against a
//!   three-master Redis Cluster (each node AOF always): `benches/loadgen.rs`'s
//!   closed loop of `POST /v1/claims/<unique key>` with `CLAIM_CONNS`
//!   connections for `DURATION_S` after a 1 s warm-up, in this process
//!   (`cargo bench --bench loadgen -- http-claim ADDR 64 SECONDS` is the
//!   same loop).
//!
//! Everything shares this machine's cores: the figures are ratios between
//! scenarios on the same cores, not what separate machines would do
//! (docs/performance.md, "Fleet: instances on one Redis").
//!
//! Settings by environment variable (defaults): `DURATION_S` (5),
//! `CONCURRENCY` (64), `STREAMS` (1000), `RUNS` (3), `WAIT_S` (120: longest
//! wait for the inbox to drain after posting), `INSTANCES` (`1,2,3`),
//! `INBOXES` (`local,shared`), `SPREAD` (`connection`: as above; `stream`:
//! each stream's events to one instance, stream % N, as a balancer that
//! hashed on the stream would), `CLAIMS` (1; 0 skips them), `CLAIM_CONNS`
//! (64); issue 54's `GATE_COST` (1), `RATES` (`50,500`), `RATE_SECONDS`
//! (10), `FAILOVER_RUNS` (5) (see `fleet/wide.rs`). `PIN=1` starts every
//! dedupd and redis-server on CPU 0 (`taskset -c 0`): run the bench itself
//! on CPU 1 (`PIN=1 taskset -c 1 cargo bench …`), so the poster and nginx
//! (its child) have the other core. Quick: `DURATION_S=1 RUNS=1 cargo
//! bench --features redis --bench fleet`.
//!
//! Written in Rust rather than on `benches/lib.sh` because the poster, the
//! access-log count and the claims loop already exist here: nginx and its
//! tally come from `benches/delivery.rs`, the claims loop from
//! `benches/loadgen.rs` (both included as modules). Under `cargo test
//! --all-targets` (no `--bench` argument) it does nothing.

#![allow(clippy::expect_used)]

#[allow(dead_code)]
#[path = "delivery.rs"]
mod delivery;
#[allow(dead_code)]
#[path = "loadgen.rs"]
mod loadgen;
#[path = "fleet/wide.rs"]
mod wide;

use std::fmt::Write as _;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use tempfile::TempDir;

use delivery::{
    ChildGuard, DESTINATION_SECRET, ORIGIN, Posted, Receiver, ReceiverKind, SECRET, env_or,
    free_port, now_s, on_path, read, sign, truncate,
};

/// `PIN=1`: the servers (dedupd, redis-server) on CPU 0.
static PIN: LazyLock<bool> = LazyLock::new(|| std::env::var("PIN").is_ok_and(|v| v == "1"));

/// After the inbox drained, how long to keep counting repeats.
const DUPLICATE_GRACE: Duration = Duration::from_secs(1);
/// How often the drain wait asks the instances for their counts.
const POLL: Duration = Duration::from_millis(50);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Inbox {
    Local,
    Shared,
}

impl Inbox {
    fn name(self) -> &'static str {
        match self {
            Inbox::Local => "local",
            Inbox::Shared => "shared",
        }
    }
}

/// Which instance an event is posted to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spread {
    /// Connection c posts to instance c % N: a stream's events reach every
    /// instance.
    Connection,
    /// An event of stream s goes to instance s % N.
    Stream,
}

#[derive(Debug, Clone)]
struct Params {
    duration: Duration,
    concurrency: usize,
    streams: u64,
    runs: usize,
    wait: Duration,
    instances: Vec<usize>,
    inboxes: Vec<Inbox>,
    spread: Spread,
    claims: bool,
    claim_conns: usize,
    /// Also shared inbox × 3 with a fleet-wide rate limit too high to bind.
    gate_cost: bool,
    /// Rate limits whose accuracy three instances are measured at.
    rates: Vec<u64>,
    /// Seconds of deliveries each rate's run posts.
    rate_seconds: u64,
    /// SIGKILL failover runs.
    failover_runs: usize,
}

fn list(name: &str, default: &str) -> anyhow::Result<Vec<String>> {
    Ok(env_or(name, default.to_owned())?
        .split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect())
}

impl Params {
    fn from_env() -> anyhow::Result<Self> {
        let instances = list("INSTANCES", "1,2,3")?
            .iter()
            .map(|s| match s.parse::<usize>() {
                Ok(n @ 1..=16) => Ok(n),
                _ => bail!("INSTANCES: {s:?} is not a number from 1 to 16"),
            })
            .collect::<anyhow::Result<_>>()?;
        let inboxes = list("INBOXES", "local,shared")?
            .iter()
            .map(|s| match s.as_str() {
                "local" => Ok(Inbox::Local),
                "shared" => Ok(Inbox::Shared),
                other => bail!("INBOXES: {other:?} is neither local nor shared"),
            })
            .collect::<anyhow::Result<_>>()?;
        let p = Self {
            duration: Duration::from_secs_f64(env_or("DURATION_S", 5.0)?),
            concurrency: env_or("CONCURRENCY", 64)?,
            streams: env_or("STREAMS", 1000)?,
            runs: env_or("RUNS", 3)?,
            wait: Duration::from_secs_f64(env_or("WAIT_S", 120.0)?),
            instances,
            inboxes,
            spread: match env_or("SPREAD", "connection".to_owned())?.as_str() {
                "connection" => Spread::Connection,
                "stream" => Spread::Stream,
                other => bail!("SPREAD: {other:?} is neither connection nor stream"),
            },
            claims: env_or("CLAIMS", 1u8)? != 0,
            claim_conns: env_or("CLAIM_CONNS", 64)?,
            gate_cost: env_or("GATE_COST", 1u8)? != 0,
            rates: list("RATES", "50,500")?
                .iter()
                .map(|s| match s.parse::<u64>() {
                    Ok(n @ 1..=100_000) => Ok(n),
                    _ => bail!("RATES: {s:?} is not a rate from 1 to 100000 per second"),
                })
                .collect::<anyhow::Result<_>>()?,
            rate_seconds: env_or("RATE_SECONDS", 10)?,
            failover_runs: env_or("FAILOVER_RUNS", 5)?,
        };
        if p.concurrency == 0 || p.streams == 0 || p.runs == 0 || p.claim_conns == 0 {
            bail!("CONCURRENCY, STREAMS, RUNS and CLAIM_CONNS must be at least 1");
        }
        Ok(p)
    }
}

fn main() -> anyhow::Result<()> {
    if !std::env::args().any(|a| a == "--bench") {
        println!("fleet: a benchmark; run it with `cargo bench --features redis --bench fleet`");
        return Ok(());
    }
    let params = Params::from_env()?;
    for tool in ["redis-server", "redis-cli", "nginx"] {
        if !on_path(tool) {
            bail!("`{tool}` is not on PATH (Debian: redis-server, redis-tools, nginx)");
        }
    }
    LazyLock::force(&ORIGIN);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(run(params))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scenario {
    Delivery {
        inbox: Inbox,
        instances: usize,
        /// A `rate_limit` per second on the source.
        rate: Option<u64>,
    },
    Claims {
        cluster: bool,
    },
}

impl Scenario {
    fn label(self) -> String {
        match self {
            Scenario::Delivery {
                inbox,
                instances,
                rate: None,
            } => format!("{} inbox × {instances}", inbox.name()),
            Scenario::Delivery {
                inbox,
                instances,
                rate: Some(r),
            } => format!("{} inbox × {instances}, rate_limit {r}/s", inbox.name()),
            Scenario::Claims { cluster: false } => "claims, one redis-server".to_owned(),
            Scenario::Claims { cluster: true } => "claims, 3-master cluster".to_owned(),
        }
    }
}

/// What one run of a scenario measured.
#[derive(Debug, Clone)]
enum Outcome {
    Delivery(DeliveryRun),
    Claims(ClaimRun),
}

#[derive(Debug, Clone, Default)]
struct DeliveryRun {
    /// Accepted events per second of posting.
    ingest: f64,
    /// Distinct events delivered per second, first post → last delivery.
    end_to_end: f64,
    /// First post → last delivery, over the posting time.
    over_posting: f64,
    accepted: u64,
    /// Posts answered other than 2xx `accepted`/`duplicate`.
    failed: u64,
    first_error: Option<String>,
    /// Distinct webhook-ids at nginx.
    delivered: u64,
    /// Ids delivered more than once, and the extra requests.
    repeated: u64,
    extra: u64,
    stale: u64,
    dead: u64,
    /// Still pending when the wait ended.
    pending: u64,
    /// Accepted, but neither delivered nor settled stale or dead.
    lost: u64,
    /// CPU per accepted event, first post → drained, in microseconds:
    /// every redis-server, every instance.
    redis_us: f64,
    dedupd_us: f64,
    /// Context switches per accepted event, as the CPU.
    redis_sw: f64,
    dedupd_sw: f64,
    /// Lines at warn or above in the instances' logs.
    warnings: usize,
    last_warning: Option<String>,
}

#[derive(Debug, Clone, Default)]
struct ClaimRun {
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: u64,
    /// CPU per claim over the measured time, in microseconds.
    redis_us: f64,
    dedupd_us: f64,
}

async fn run(p: Params) -> anyhow::Result<()> {
    let mut scenarios = Vec::new();
    for &inbox in &p.inboxes {
        for &instances in &p.instances {
            scenarios.push(Scenario::Delivery {
                inbox,
                instances,
                rate: None,
            });
        }
    }
    // What the fleet's lane gate costs: a rate limit that never binds
    // still asks the gate each pass.
    if p.gate_cost && p.inboxes.contains(&Inbox::Shared) && p.instances.contains(&3) {
        scenarios.push(Scenario::Delivery {
            inbox: Inbox::Shared,
            instances: 3,
            rate: Some(1_000_000),
        });
    }
    if p.claims {
        scenarios.push(Scenario::Claims { cluster: false });
        scenarios.push(Scenario::Claims { cluster: true });
    }
    println!(
        "fleet bench: dedupd {} | {} run(s) of {} s each; delivery: {} connections, {} streams, \
         spread by {}; claims: {} connections | {}",
        env!("CARGO_BIN_EXE_dedupd"),
        p.runs,
        p.duration.as_secs_f64(),
        p.concurrency,
        p.streams,
        match p.spread {
            Spread::Connection => "connection",
            Spread::Stream => "stream",
        },
        p.claim_conns,
        machine(),
    );
    let mut results: Vec<(Scenario, Vec<Outcome>)> =
        scenarios.iter().map(|s| (*s, Vec::new())).collect();
    for round in 1..=p.runs {
        for (scenario, outcomes) in &mut results {
            let label = scenario.label();
            let outcome = match *scenario {
                Scenario::Delivery {
                    inbox,
                    instances,
                    rate,
                } => delivery_run(&p, inbox, instances, rate)
                    .await
                    .map(Outcome::Delivery),
                Scenario::Claims { cluster } => claims_run(&p, cluster).await.map(Outcome::Claims),
            };
            match outcome {
                Ok(o) => {
                    println!("run {round} | {label:<26} | {}", describe(&o));
                    outcomes.push(o);
                }
                Err(e) => println!("run {round} | {label:<26} | FAILED: {e:#}"),
            }
        }
    }
    println!();
    print_table(&p, &results);
    wide::run(&p).await;
    println!("\nload average at the end: {}", load_average());
    Ok(())
}

fn describe(o: &Outcome) -> String {
    match o {
        Outcome::Delivery(d) => {
            let mut s = format!(
                "ingest {:.0}/s, end to end {:.0}/s ({:.2}x posting time) | accepted {}, delivered {}, \
                 stale {}, dead {}, pending {}, lost {}, repeated {} (+{}), failed posts {} | CPU per event: \
                 Redis {:.1} µs, dedupd {:.1} µs | switches per event: Redis {:.2}, dedupd {:.2}",
                d.ingest,
                d.end_to_end,
                d.over_posting,
                d.accepted,
                d.delivered,
                d.stale,
                d.dead,
                d.pending,
                d.lost,
                d.repeated,
                d.extra,
                d.failed,
                d.redis_us,
                d.dedupd_us,
                d.redis_sw,
                d.dedupd_sw,
            );
            if let Some(e) = &d.first_error {
                let _ = write!(s, " (first: {})", truncate(e, 160));
            }
            if d.warnings > 0 {
                let _ = write!(
                    s,
                    " | {} log line(s) at warn+, last: {}",
                    d.warnings,
                    truncate(d.last_warning.as_deref().unwrap_or(""), 240)
                );
            }
            s
        }
        Outcome::Claims(c) => format!(
            "{:.0} claims/s, p50 {:.2} ms, p99 {:.2} ms, errors {} | CPU per claim: Redis {:.1} µs, dedupd {:.1} µs",
            c.rps, c.p50_ms, c.p99_ms, c.errors, c.redis_us, c.dedupd_us
        ),
    }
}

// ---------------------------------------------------------------- delivery

async fn delivery_run(
    p: &Params,
    inbox: Inbox,
    n: usize,
    rate: Option<u64>,
) -> anyhow::Result<DeliveryRun> {
    let redis = Redis::single()?;
    let receiver = Receiver::start(ReceiverKind::Nginx).await?;
    let mut fleet = Vec::with_capacity(n);
    // One after the other: the first shared-inbox instance records the
    // bucket layout the others then read.
    let source = rate.map_or_else(String::new, |r| format!("rate_limit = \"{r}/s\"\n"));
    for _ in 0..n {
        fleet.push(
            Instance::start(&redis.storage_toml(), Some((inbox, &receiver.url)), &source).await?,
        );
    }
    let bases: Vec<String> = fleet.iter().map(|i| i.base.clone()).collect();
    let client = dedupd::http_client::builder()
        .no_proxy()
        .pool_max_idle_per_host(p.concurrency)
        .tcp_nodelay(true)
        .timeout(Duration::from_secs(30))
        .build()?;

    let pids: Vec<u32> = fleet.iter().map(|i| i.child.child.id()).collect();
    let cpu0 = (cpu_ns(&redis.pids), cpu_ns(&pids));
    let sw0 = (switches(&redis.pids), switches(&pids));
    let posted = post_spread(&client, &bases, p, None).await;

    // Wait until nothing is pending anywhere, bounded. The shared inbox
    // counts the whole fleet at every instance; local inboxes each their own.
    let asked = match inbox {
        Inbox::Shared => &bases[..1],
        Inbox::Local => &bases[..],
    };
    let deadline = Instant::now() + p.wait;
    let mut next_note = Instant::now() + Duration::from_secs(10);
    let counts = loop {
        let counts = fleet_counts(&client, asked).await;
        if let Ok(c) = &counts
            && c.pending == 0
            && c.settled() >= posted.accepted
        {
            break counts;
        }
        if Instant::now() >= deadline {
            break counts;
        }
        if Instant::now() >= next_note {
            println!(
                "  ... {:.0} s after posting ended: {}",
                now_s() - posted.end,
                match &counts {
                    Ok(c) => format!(
                        "{} of {} accepted events pending",
                        c.pending, posted.accepted
                    ),
                    Err(e) => format!("counts unavailable: {e:#}"),
                }
            );
            next_note += Duration::from_secs(10);
        }
        tokio::time::sleep(POLL).await;
    };
    let cpu1 = (cpu_ns(&redis.pids), cpu_ns(&pids));
    let sw1 = (switches(&redis.pids), switches(&pids));
    tokio::time::sleep(DUPLICATE_GRACE).await;
    let counts = counts.unwrap_or_default();
    let tracker = receiver.tracker().clone();
    let mut warnings = 0;
    let mut last_warning = None;
    for instance in fleet {
        let log = instance.stop();
        for line in log.lines().filter(|l| !l.trim().is_empty()) {
            warnings += 1;
            last_warning = Some(line.to_owned());
        }
    }
    receiver.stop().await;
    drop(redis);

    let post_time = (posted.end - posted.start).max(1e-9);
    let delivered = tracker.distinct() as u64;
    let e2e_time = tracker.last_new.map_or(f64::NAN, |l| l - posted.start);
    #[allow(clippy::cast_precision_loss)]
    Ok(DeliveryRun {
        ingest: posted.accepted as f64 / post_time,
        end_to_end: delivered as f64 / e2e_time,
        over_posting: e2e_time / post_time,
        accepted: posted.accepted,
        failed: posted.failed,
        first_error: posted.first_error,
        delivered,
        repeated: tracker.seen.values().filter(|&&c| c > 1).count() as u64,
        extra: tracker
            .seen
            .values()
            .map(|&c| u64::from(c.saturating_sub(1)))
            .sum(),
        stale: counts.stale,
        dead: counts.dead,
        pending: counts.pending,
        lost: posted
            .accepted
            .saturating_sub(delivered + counts.stale + counts.dead + counts.pending),
        redis_us: us_per(cpu0.0, cpu1.0, posted.accepted),
        dedupd_us: us_per(cpu0.1, cpu1.1, posted.accepted),
        redis_sw: per(sw0.0, sw1.0, posted.accepted),
        dedupd_sw: per(sw0.1, sw1.1, posted.accepted),
        warnings,
        last_warning,
    })
}

/// Events of source `bench` by status, summed over the instances asked.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    pending: u64,
    delivered: u64,
    stale: u64,
    dead: u64,
}

impl Counts {
    fn settled(self) -> u64 {
        self.delivered + self.stale + self.dead
    }
}

async fn fleet_counts(client: &reqwest::Client, bases: &[String]) -> anyhow::Result<Counts> {
    let mut sum = Counts::default();
    for base in bases {
        let v: serde_json::Value = client
            .get(format!("{base}/v1/sources"))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        let bench = v["sources"]
            .as_array()
            .and_then(|a| a.iter().find(|s| s["source"] == "bench"))
            .context("no source bench in /v1/sources")?;
        let n = |k: &str| bench[k].as_u64().unwrap_or(0);
        sum.pending += n("pending");
        sum.delivered += n("delivered");
        sum.stale += n("stale");
        sum.dead += n("dead");
    }
    Ok(sum)
}

/// Posts unique signed events over the instances for `p.duration` with
/// `p.concurrency` connections (see [`Spread`]); with `limit`, no more than
/// that many.
async fn post_spread(
    client: &reqwest::Client,
    bases: &[String],
    p: &Params,
    limit: Option<u64>,
) -> Posted {
    let urls: Arc<Vec<String>> =
        Arc::new(bases.iter().map(|b| format!("{b}/ingest/bench")).collect());
    let next = Arc::new(AtomicU64::new(0));
    let accepted = Arc::new(AtomicU64::new(0));
    let duplicate = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let first_error = Arc::new(Mutex::new(None::<String>));
    // created_at: one microsecond apart, in the order of the event numbers.
    let base_us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros() as u64;
    let start = now_s();
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(p.concurrency);
    for c in 0..p.concurrency {
        let (client, urls, next) = (client.clone(), urls.clone(), next.clone());
        let (accepted, duplicate, failed) = (accepted.clone(), duplicate.clone(), failed.clone());
        let first_error = first_error.clone();
        let (streams, spread, duration) = (p.streams, p.spread, p.duration);
        tasks.push(tokio::spawn(async move {
            while started.elapsed() < duration {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if limit.is_some_and(|l| i >= l) {
                    break;
                }
                let stream = i % streams;
                let url = match spread {
                    Spread::Connection => &urls[c % urls.len()],
                    Spread::Stream => &urls[(stream % urls.len() as u64) as usize],
                };
                let created = UNIX_EPOCH + Duration::from_micros(base_us + i);
                let body = format!(
                    r#"{{"request_id":"req_{i}","run_id":"run_{stream}","created_at":"{}","type":"run.step","data":{{"step":{i},"note":"fleet bench"}}}}"#,
                    humantime::format_rfc3339_micros(created),
                );
                let ts = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_secs();
                let res = client
                    .post(url)
                    .header("content-type", "application/json")
                    .header("X-Sume-Timestamp", ts.to_string())
                    .header("X-Sume-Signature", sign(ts, body.as_bytes()))
                    .body(body)
                    .send()
                    .await;
                let outcome = match res {
                    Ok(r) if r.status().is_success() => match r.json::<serde_json::Value>().await {
                        Ok(v) if v["status"] == "accepted" => Ok(true),
                        Ok(v) if v["status"] == "duplicate" => Ok(false),
                        Ok(v) => Err(format!("unexpected answer {v}")),
                        Err(e) => Err(format!("unreadable answer: {e}")),
                    },
                    Ok(r) => {
                        let status = r.status();
                        Err(format!("HTTP {status}: {}", r.text().await.unwrap_or_default()))
                    }
                    Err(e) => Err(format!("request failed: {e}")),
                };
                match outcome {
                    Ok(true) => accepted.fetch_add(1, Ordering::Relaxed),
                    Ok(false) => duplicate.fetch_add(1, Ordering::Relaxed),
                    Err(e) => {
                        first_error.lock().expect("first error").get_or_insert(e);
                        failed.fetch_add(1, Ordering::Relaxed)
                    }
                };
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let end = now_s();
    let (accepted, duplicate, failed) = (
        accepted.load(Ordering::Relaxed),
        duplicate.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
    );
    let first_error = first_error.lock().expect("first error").take();
    Posted {
        posted: accepted + duplicate + failed,
        accepted,
        duplicate,
        failed,
        first_error,
        start,
        end,
        latencies_us: Vec::new(),
    }
}

// ---------------------------------------------------------------- claims

async fn claims_run(p: &Params, cluster: bool) -> anyhow::Result<ClaimRun> {
    let redis = if cluster {
        Redis::cluster()?
    } else {
        Redis::single()?
    };
    let instance = Instance::start(&redis.storage_toml(), None, "").await?;
    let seconds = p.duration.as_secs_f64();
    let warmup = Duration::from_secs(1);
    let pids = [instance.child.child.id()];
    let load = tokio::spawn(loadgen::closed_loop(
        loadgen::Kind::HttpClaim,
        instance.addr,
        p.claim_conns,
        seconds,
        warmup.as_secs_f64(),
    ));
    // CPU over the measured time only, as the claims counted.
    tokio::time::sleep(warmup).await;
    let cpu0 = (cpu_ns(&redis.pids), cpu_ns(&pids));
    let (latencies, errors) = load.await?.map_err(|e| anyhow::anyhow!("loadgen: {e}"))?;
    let cpu1 = (cpu_ns(&redis.pids), cpu_ns(&pids));
    let log = instance.stop();
    drop(redis);
    if let Some(line) = log.lines().rfind(|l| !l.trim().is_empty()) {
        println!("  dedupd logged at warn+: {}", truncate(line, 240));
    }
    #[allow(clippy::cast_precision_loss)]
    Ok(ClaimRun {
        rps: latencies.len() as f64 / seconds,
        p50_ms: loadgen::percentile(&latencies, 50.0),
        p99_ms: loadgen::percentile(&latencies, 99.0),
        errors,
        redis_us: us_per(cpu0.0, cpu1.0, latencies.len() as u64),
        dedupd_us: us_per(cpu0.1, cpu1.1, latencies.len() as u64),
    })
}

// ---------------------------------------------------------------- redis

/// redis-server processes with `appendonly yes`, `appendfsync always`, in
/// a temp dir on disk (the bench's temp dirs are under `/tmp`, which must
/// not be a tmpfs, or every fsync would be free).
struct Redis {
    _children: Vec<ChildGuard>,
    ports: Vec<u16>,
    /// The redis-server processes (the children are their watchdogs).
    pids: Vec<u32>,
    _dir: TempDir,
}

impl Redis {
    fn single() -> anyhow::Result<Self> {
        let dir = TempDir::new()?;
        let port = free_port()?;
        let child = spawn_redis(dir.path(), port, false)?;
        wait_for(&format!("redis-server on port {port}"), || {
            redis_cli(port, &["ping"]).is_some_and(|o| o.trim() == "PONG")
        })?;
        Ok(Self {
            _children: vec![child],
            pids: vec![redis_pid(port)?],
            ports: vec![port],
            _dir: dir,
        })
    }

    /// Three masters joined by `redis-cli --cluster create`, as
    /// `tests/support/redis.rs` does.
    fn cluster() -> anyhow::Result<Self> {
        let dir = TempDir::new()?;
        let mut ports: Vec<u16> = Vec::new();
        while ports.len() < 3 {
            let port = free_port()?;
            // The cluster bus listens on port + 10000.
            if port > 55_000
                || ports.contains(&port)
                || TcpListener::bind(("127.0.0.1", port + 10_000)).is_err()
            {
                continue;
            }
            ports.push(port);
        }
        let mut children = Vec::new();
        for &port in &ports {
            children.push(spawn_redis(dir.path(), port, true)?);
        }
        for &port in &ports {
            wait_for(&format!("cluster node on port {port}"), || {
                redis_cli(port, &["ping"]).is_some_and(|o| o.trim() == "PONG")
            })?;
        }
        let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let mut create = vec!["--cluster", "create"];
        create.extend(addrs.iter().map(String::as_str));
        create.extend(["--cluster-replicas", "0", "--cluster-yes"]);
        let out = Command::new("redis-cli")
            .args(&create)
            .stdin(Stdio::null())
            .output()
            .context("redis-cli --cluster create")?;
        if !out.status.success() {
            bail!(
                "redis-cli --cluster create failed: {}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        for &port in &ports {
            wait_for("cluster_state:ok", || {
                redis_cli(port, &["cluster", "info"])
                    .is_some_and(|o| o.contains("cluster_state:ok"))
            })?;
        }
        Ok(Self {
            _children: children,
            pids: ports
                .iter()
                .map(|&p| redis_pid(p))
                .collect::<anyhow::Result<_>>()?,
            ports,
            _dir: dir,
        })
    }

    /// The `[storage.redis]` lines that reach it.
    fn storage_toml(&self) -> String {
        if let [port] = self.ports[..] {
            format!("url = \"redis://127.0.0.1:{port}\"\n")
        } else {
            let nodes: Vec<String> = self
                .ports
                .iter()
                .map(|p| format!("\"redis://127.0.0.1:{p}\""))
                .collect();
            format!("cluster_nodes = [{}]\n", nodes.join(", "))
        }
    }
}

/// Starts redis-server under a small shell watchdog (as
/// `tests/support/redis.rs`): SIGTERM to the returned child kills the
/// server at once, and the server also goes when this process exits
/// without dropping it.
fn spawn_redis(dir: &Path, port: u16, cluster: bool) -> anyhow::Result<ChildGuard> {
    // A directory each: nodes in one would share its `appendonlydir`.
    let dir = &dir.join(port.to_string());
    std::fs::create_dir(dir)?;
    let mut args = format!(
        "--port {port} --bind 127.0.0.1 --dir '{}' --appendonly yes --appendfsync always \
         --save '' --auto-aof-rewrite-percentage 0 --logfile redis-{port}.log",
        dir.display()
    );
    if cluster {
        let _ = write!(
            args,
            " --cluster-enabled yes --cluster-config-file nodes-{port}.conf"
        );
    }
    let script = format!(
        "{pin}redis-server {args} & pid=$!; trap 'kill -9 $pid; wait $pid; exit 0' TERM; \
         while kill -0 {parent} 2>/dev/null && kill -0 $pid 2>/dev/null; do sleep 0.2; done; \
         kill -9 $pid 2>/dev/null; wait $pid; exit 0",
        parent = std::process::id(),
        pin = if *PIN { "taskset -c 0 " } else { "" },
    );
    let child = Command::new("sh")
        .args(["-c", &script])
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting sh for redis-server")?;
    Ok(ChildGuard {
        child,
        terminate: true,
    })
}

fn redis_pid(port: u16) -> anyhow::Result<u32> {
    redis_cli(port, &["info", "server"])
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("process_id:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .with_context(|| format!("no process_id from redis-server on port {port}"))
}

/// Nanoseconds the threads of each of `pids` have spent on a CPU, summed:
/// the scheduler's accounting (`/proc/PID/task/TID/schedstat`), which
/// `benches/lib.sh` found far closer to the truth on this VM than the
/// user + system ticks of `stat`.
fn cpu_ns(pids: &[u32]) -> u64 {
    let mut sum = 0;
    for pid in pids {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            sum += std::fs::read_to_string(task.path().join("schedstat"))
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    sum
}

/// Times the threads of each of `pids` were switched onto a CPU, summed
/// (`schedstat`'s third field): context switches, voluntary or not.
fn switches(pids: &[u32]) -> u64 {
    let mut sum = 0;
    for pid in pids {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            sum += std::fs::read_to_string(task.path().join("schedstat"))
                .ok()
                .and_then(|s| s.split_whitespace().nth(2)?.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    sum
}

/// Events per operation between two counter readings.
#[allow(clippy::cast_precision_loss)]
fn per(before: u64, after: u64, ops: u64) -> f64 {
    if ops == 0 {
        return f64::NAN;
    }
    after.saturating_sub(before) as f64 / ops as f64
}

/// Microseconds of CPU per operation between two [`cpu_ns`] readings.
#[allow(clippy::cast_precision_loss)]
fn us_per(before: u64, after: u64, ops: u64) -> f64 {
    if ops == 0 {
        return f64::NAN;
    }
    after.saturating_sub(before) as f64 / 1000.0 / ops as f64
}

fn redis_cli(port: u16, args: &[&str]) -> Option<String> {
    let out = Command::new("redis-cli")
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn wait_for(what: &str, mut ready: impl FnMut() -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ready() {
        if Instant::now() >= deadline {
            bail!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

// ---------------------------------------------------------------- dedupd

/// A running `dedupd serve` on the Redis backend, killed when dropped.
struct Instance {
    child: ChildGuard,
    addr: SocketAddr,
    base: String,
    log: PathBuf,
    _dir: TempDir,
}

impl Instance {
    /// With `gateway`, a source `bench` forwarding to its URL, on that
    /// inbox, with `source` (TOML lines) added to its table.
    async fn start(
        redis: &str,
        gateway: Option<(Inbox, &str)>,
        source: &str,
    ) -> anyhow::Result<Self> {
        let dir = TempDir::new()?;
        let port = free_port()?;
        let config = dir.path().join("dedupd.toml");
        let mut toml = format!(
            "listen = \"127.0.0.1:{port}\"\n\
             data_path = {data:?}\n\
             [log]\n\
             level = \"warn\"\n\
             [storage]\n\
             backend = \"redis\"\n\
             [storage.redis]\n\
             {redis}\
             durability = \"fsync\"\n",
            data = dir.path().join("dedupd.redb").display().to_string(),
        );
        if let Some((inbox, forward_to)) = gateway {
            let _ = write!(
                toml,
                "[gateway]\n\
                 inbox = \"{inbox}\"\n\
                 [sources.bench]\n\
                 scheme = \"sume\"\n\
                 secrets = [\"{SECRET}\"]\n\
                 event_id = \"body:/request_id\"\n\
                 created_at = \"body:/created_at\"\n\
                 stream = \"body:/run_id\"\n\
                 forward_to = \"{forward_to}\"\n\
                 destination_secret = \"{DESTINATION_SECRET}\"\n\
                 {source}",
                inbox = inbox.name(),
            );
        }
        std::fs::write(&config, toml)?;
        // It holds secrets: dedupd warns about a file others may read.
        std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o600))?;
        let log = dir.path().join("dedupd.log");
        let out = std::fs::File::create(&log)?;
        let mut cmd = if *PIN {
            let mut c = Command::new("taskset");
            c.args(["-c", "0", env!("CARGO_BIN_EXE_dedupd")]);
            c
        } else {
            Command::new(env!("CARGO_BIN_EXE_dedupd"))
        };
        for (k, _) in std::env::vars() {
            if k.starts_with("DEDUPD_")
                || k == "RUST_LOG"
                || k.to_ascii_lowercase().ends_with("_proxy")
            {
                cmd.env_remove(&k);
            }
        }
        let child = cmd
            .arg("serve")
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .context("starting dedupd")?;
        let mut instance = Self {
            child: ChildGuard {
                child,
                terminate: false,
            },
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            base: format!("http://127.0.0.1:{port}"),
            log,
            _dir: dir,
        };
        instance.wait_ready().await?;
        Ok(instance)
    }

    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        delivery::wait_ready(&mut self.child, &self.base, &self.log).await
    }

    /// Kills the server; returns what it logged (warn and above).
    fn stop(self) -> String {
        let Self { child, log, .. } = self;
        drop(child);
        read(&log)
    }
}

// ---------------------------------------------------------------- report

fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        f64::midpoint(v[n / 2 - 1], v[n / 2])
    }
}

fn range(v: &[f64]) -> String {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if v.len() < 2 {
        String::new()
    } else {
        format!(" ({:.1}–{:.1})", lo / 1000.0, hi / 1000.0)
    }
}

fn ratio(x: f64, base: f64) -> String {
    if x.is_finite() && base.is_finite() && base > 0.0 {
        format!("{:.2}×", x / base)
    } else {
        "—".to_owned()
    }
}

fn print_table(p: &Params, results: &[(Scenario, Vec<Outcome>)]) {
    let deliveries = |s: &Scenario| -> Vec<DeliveryRun> {
        results
            .iter()
            .filter(|(x, _)| x == s)
            .flat_map(|(_, o)| o.iter())
            .filter_map(|o| match o {
                Outcome::Delivery(d) => Some(d.clone()),
                Outcome::Claims(_) => None,
            })
            .collect()
    };
    let base = deliveries(&Scenario::Delivery {
        inbox: Inbox::Local,
        instances: 1,
        rate: None,
    });
    let base_ingest = median(base.iter().map(|d| d.ingest).collect());
    let base_e2e = median(base.iter().map(|d| d.end_to_end).collect());
    println!(
        "Delivery: medians of {} run(s), {} s of posting each, k events/s (range); ratios to local inbox × 1 \
         (every instance, Redis, nginx and the poster share this machine's {} cores)",
        p.runs,
        p.duration.as_secs_f64(),
        std::thread::available_parallelism().map_or(0, usize::from),
    );
    println!(
        "| scenario | ingest k/s | × | end to end k/s | × | last delivery / posting time | CPU µs/event: Redis · dedupd | switches/event: Redis · dedupd | accepted | delivered | stale | dead | lost | repeated | failed posts |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (s, _) in results {
        let Scenario::Delivery { .. } = s else {
            continue;
        };
        let runs = deliveries(s);
        if runs.is_empty() {
            println!("| {} | failed | | | | | | | | | | | | | |", s.label());
            continue;
        }
        let ingest: Vec<f64> = runs.iter().map(|d| d.ingest).collect();
        let e2e: Vec<f64> = runs.iter().map(|d| d.end_to_end).collect();
        let (mi, me) = (median(ingest.clone()), median(e2e.clone()));
        let sum = |f: fn(&DeliveryRun) -> u64| runs.iter().map(f).sum::<u64>();
        println!(
            "| {} | {:.1}{} | {} | {:.1}{} | {} | {:.2}× | {:.0} · {:.0} | {:.2} · {:.2} | {} | {} | {} | {} | {} | {} | {} |",
            s.label(),
            mi / 1000.0,
            range(&ingest),
            ratio(mi, base_ingest),
            me / 1000.0,
            range(&e2e),
            ratio(me, base_e2e),
            median(runs.iter().map(|d| d.over_posting).collect()),
            median(runs.iter().map(|d| d.redis_us).collect()),
            median(runs.iter().map(|d| d.dedupd_us).collect()),
            median(runs.iter().map(|d| d.redis_sw).collect()),
            median(runs.iter().map(|d| d.dedupd_sw).collect()),
            sum(|d| d.accepted),
            sum(|d| d.delivered),
            sum(|d| d.stale),
            sum(|d| d.dead),
            sum(|d| d.lost + d.pending),
            sum(|d| d.repeated),
            sum(|d| d.failed),
        );
    }
    println!(
        "(accepted … failed posts: sums over the runs; lost counts what was accepted and is neither delivered \
         nor settled stale or dead, still pending included; repeated: ids nginx saw more than once)"
    );
    let claims = |cluster: bool| -> Vec<ClaimRun> {
        results
            .iter()
            .filter(|(x, _)| *x == Scenario::Claims { cluster })
            .flat_map(|(_, o)| o.iter())
            .filter_map(|o| match o {
                Outcome::Claims(c) => Some(c.clone()),
                Outcome::Delivery(_) => None,
            })
            .collect()
    };
    if !p.claims {
        return;
    }
    let one = claims(false);
    let base_claims = median(one.iter().map(|c| c.rps).collect());
    println!(
        "\nClaims: one instance, loadgen http-claim, {} connections, {} s after a 1 s warm-up; medians of {} run(s)",
        p.claim_conns,
        p.duration.as_secs_f64(),
        p.runs
    );
    println!(
        "| Redis | claims k/s | × one server | p50 ms | p99 ms | CPU µs/claim: Redis · dedupd | errors |"
    );
    println!("|---|---|---|---|---|---|---|");
    for cluster in [false, true] {
        let runs = claims(cluster);
        let rps: Vec<f64> = runs.iter().map(|c| c.rps).collect();
        let m = median(rps.clone());
        println!(
            "| {} | {:.1}{} | {} | {:.2} | {:.2} | {:.1} · {:.1} | {} |",
            if cluster {
                "3-master cluster, each AOF always"
            } else {
                "one redis-server, AOF always"
            },
            m / 1000.0,
            range(&rps),
            ratio(m, base_claims),
            median(runs.iter().map(|c| c.p50_ms).collect()),
            median(runs.iter().map(|c| c.p99_ms).collect()),
            median(runs.iter().map(|c| c.redis_us).collect()),
            median(runs.iter().map(|c| c.dedupd_us).collect()),
            runs.iter().map(|c| c.errors).sum::<u64>(),
        );
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".to_owned())
}

fn machine() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "?".to_owned());
    format!(
        "{} CPUs ({model}), load average {}",
        std::thread::available_parallelism().map_or(0, usize::from),
        load_average()
    )
}
