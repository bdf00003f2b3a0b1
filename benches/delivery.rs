//! End-to-end delivery rate of the webhook gateway, measured against the
//! real release binary: how fast events posted to `/ingest/bench` reach the
//! application behind dedupd, and whether each arrives exactly once.
//!
//! Run: `cargo bench --bench delivery`. Nothing is asserted: each scenario
//! prints what it measured. Scenarios, each against a fresh `dedupd serve`
//! (its own temp dir and free loopback port) and a fresh receiver:
//!
//! - `a`: an in-process receiver (actix-web, one worker) answering 204 at
//!   once; events are posted for `DURATION_S` seconds.
//! - `nginx`: the same load with nginx (`return 204;`) as the receiver,
//!   counting deliveries from its access log; only when `nginx` is on PATH.
//! - `wrk`: the issue-31 measurement: nginx as the receiver, and a source
//!   of the `github` scheme fed by `wrk -c CONCURRENCY` for `DURATION_S`
//!   from a Lua script that posts pre-signed, unique events (GitHub's
//!   signature has no timestamp, so they can be signed before the run);
//!   only when `wrk` and `nginx` are on PATH.
//! - `b`: the in-process receiver answering after `DELAY_MS` (50 ms);
//!   `EVENTS` events are posted as fast as possible, and the delivery rate
//!   is measured from the first delivery to the last.
//!
//! Load: unique events (`request_id` unique, `run_id` = i % `STREAMS`,
//! `created_at` increasing) signed with the Sume scheme, posted with
//! `CONCURRENCY` keep-alive connections. Settings by environment variable
//! (defaults): `DURATION_S` (3), `CONCURRENCY` (64), `STREAMS` (1000),
//! `EVENTS` (10000), `DELAY_MS` (50), `MAX_IN_FLIGHT` (unset: dedupd's
//! defaults, as a new user runs it; a number sets it for the gateway and
//! the source), `WAIT_S` (120: longest wait for deliveries after
//! posting), `SCENARIOS` (`a,nginx,b`; `wrk` runs when named),
//! `BENCH_BIN` (this build's binary; another, to measure another build
//! the same way), `PIN` (`1`: the server on CPU 0; run the bench itself
//! on the other with `taskset -c 1`). Beside each scenario: the server's
//! CPU and context switches per accepted event. A quick run:
//! `DURATION_S=1 EVENTS=2000 STREAMS=100 cargo bench --bench delivery`.
//!
//! Under `cargo test --all-targets` (no `--bench` argument) it does nothing.

#![allow(clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use actix_web::dev::ServerHandle;
use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use anyhow::{Context, bail};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use tempfile::TempDir;

/// The source's signing secret (what "Sume" signs with).
pub(crate) const SECRET: &str = "sume_bench_secret_3f9a1c0d";
/// The secret dedupd signs forwarded requests with.
pub(crate) const DESTINATION_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
/// After the last expected delivery, how long to keep counting repeats.
const DUPLICATE_GRACE: Duration = Duration::from_secs(1);
/// How often the wait loop looks, and the sampler asks dedupd.
const POLL: Duration = Duration::from_millis(20);
const SAMPLE: Duration = Duration::from_millis(100);

/// The webhook-id of the request that checks nginx is up.
const PROBE_ID: &str = "bench-probe";

/// One origin for every time the bench records, in seconds since it:
/// in-process times come from the monotonic clock, nginx's access log gives
/// wall-clock times, converted with the wall-clock reading taken with it.
pub(crate) static ORIGIN: LazyLock<(Instant, SystemTime)> =
    LazyLock::new(|| (Instant::now(), SystemTime::now()));

pub(crate) fn now_s() -> f64 {
    ORIGIN.0.elapsed().as_secs_f64()
}

fn wall_to_s(unix_s: f64) -> f64 {
    let origin = ORIGIN
        .1
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    unix_s - origin
}

#[derive(Debug, Clone)]
pub(crate) struct Params {
    pub(crate) duration: Duration,
    pub(crate) concurrency: usize,
    pub(crate) streams: u64,
    pub(crate) events: u64,
    pub(crate) delay_ms: u64,
    /// `None`: dedupd's defaults (`max_in_flight` 16 per source).
    pub(crate) max_in_flight: Option<usize>,
    pub(crate) wait: Duration,
    pub(crate) scenarios: Vec<String>,
}

pub(crate) fn env_or<T: FromStr>(name: &str, default: T) -> anyhow::Result<T> {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .map_err(|_| anyhow::anyhow!("{name}={v:?} is not a valid value")),
        Err(_) => Ok(default),
    }
}

impl Params {
    fn from_env() -> anyhow::Result<Self> {
        let p =
            Self {
                duration: Duration::from_secs_f64(env_or("DURATION_S", 3.0)?),
                concurrency: env_or("CONCURRENCY", 64)?,
                streams: env_or("STREAMS", 1000)?,
                events: env_or("EVENTS", 10_000)?,
                delay_ms: env_or("DELAY_MS", 50)?,
                max_in_flight: match std::env::var("MAX_IN_FLIGHT") {
                    Ok(v) => Some(v.trim().parse().map_err(|_| {
                        anyhow::anyhow!("MAX_IN_FLIGHT={v:?} is not a valid value")
                    })?),
                    Err(_) => None,
                },
                wait: Duration::from_secs_f64(env_or("WAIT_S", 120.0)?),
                scenarios: env_or("SCENARIOS", "a,nginx,b".to_owned())?
                    .split(',')
                    .map(|s| s.trim().to_owned())
                    .filter(|s| !s.is_empty())
                    .collect(),
            };
        if p.concurrency == 0 || p.streams == 0 || p.events == 0 {
            bail!("CONCURRENCY, STREAMS and EVENTS must be at least 1");
        }
        Ok(p)
    }
}

fn main() -> anyhow::Result<()> {
    if !std::env::args().any(|a| a == "--bench") {
        println!("delivery: a benchmark; run it with `cargo bench --bench delivery`");
        return Ok(());
    }
    let params = Params::from_env()?;
    LazyLock::force(&ORIGIN);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(run(params))
}

async fn run(p: Params) -> anyhow::Result<()> {
    println!(
        "delivery bench: dedupd {} | concurrency {}, {} streams, max_in_flight {}, \
         {} s posting (a), {} events through a {} ms receiver (b), waits bounded at {} s",
        std::env::var("BENCH_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_dedupd").to_owned()),
        p.concurrency,
        p.streams,
        p.max_in_flight
            .map_or("default (16)".to_owned(), |n| n.to_string()),
        p.duration.as_secs_f64(),
        p.events,
        p.delay_ms,
        p.wait.as_secs_f64(),
    );
    for name in &p.scenarios {
        let scenario = match name.as_str() {
            "a" => Scenario {
                title: "(a) receiver answers 204 at once".into(),
                receiver: ReceiverKind::InProcess { delay: None },
                load: Load::For(p.duration),
            },
            "nginx" => {
                if !on_path("nginx") {
                    println!("\n(a') nginx: skipped, `nginx` is not on PATH");
                    continue;
                }
                Scenario {
                    title: "(a') nginx answers 204 at once".into(),
                    receiver: ReceiverKind::Nginx,
                    load: Load::For(p.duration),
                }
            }
            "wrk" => {
                if !on_path("nginx") || !on_path("wrk") {
                    println!("\n(w) wrk: skipped, `wrk` or `nginx` is not on PATH");
                    continue;
                }
                Scenario {
                    title: format!(
                        "(w) wrk -c{} posts GitHub-signed events, nginx answers 204 at once",
                        p.concurrency
                    ),
                    receiver: ReceiverKind::Nginx,
                    load: Load::Wrk(p.duration),
                }
            }
            "b" => Scenario {
                title: format!("(b) receiver answers 204 after {} ms", p.delay_ms),
                receiver: ReceiverKind::InProcess {
                    delay: Some(Duration::from_millis(p.delay_ms)),
                },
                load: Load::Count(p.events),
            },
            other => bail!("unknown scenario {other:?} in SCENARIOS (a, nginx, wrk, b)"),
        };
        println!("\n{}", scenario.title);
        if let Err(e) = run_scenario(&p, &scenario).await {
            println!("  FAILED: {e:#}");
        }
    }
    Ok(())
}

struct Scenario {
    title: String,
    receiver: ReceiverKind,
    load: Load,
}

#[derive(Clone, Copy)]
pub(crate) enum ReceiverKind {
    InProcess { delay: Option<Duration> },
    Nginx,
}

#[derive(Clone, Copy)]
pub(crate) enum Load {
    /// Post for this long.
    For(Duration),
    /// Post this many events.
    Count(u64),
    /// Post GitHub-signed events with `wrk` for this long.
    Wrk(Duration),
}

async fn run_scenario(p: &Params, s: &Scenario) -> anyhow::Result<()> {
    let receiver = Receiver::start(s.receiver).await?;
    let github = matches!(s.load, Load::Wrk(_));
    let server = Dedupd::start(p, &receiver.url, github).await?;
    let client = dedupd::http_client::builder()
        .no_proxy()
        .pool_max_idle_per_host(p.concurrency)
        .tcp_nodelay(true)
        .timeout(Duration::from_secs(30))
        .build()?;

    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = tokio::spawn(sample_lane(
        client.clone(),
        server.base.clone(),
        sampling.clone(),
    ));

    let posted = match s.load {
        Load::Wrk(d) => post_with_wrk(&client, &server.base, p, d).await?,
        load => post_load(&client, &server.base, p, load).await,
    };
    let accepted = posted.accepted;

    // Wait for every accepted event to arrive once, bounded.
    let deadline = Instant::now() + p.wait;
    let mut next_note = Instant::now() + Duration::from_secs(10);
    let mut last_distinct = 0;
    let mut last_change = Instant::now();
    let all_in = loop {
        let distinct = receiver.tracker().distinct();
        if distinct as u64 >= accepted {
            break true;
        }
        if distinct != last_distinct {
            last_distinct = distinct;
            last_change = Instant::now();
        } else if last_change.elapsed() >= Duration::from_secs(1) {
            // Nothing new for a second: if nothing is pending either, the
            // rest will never come (stale or dead), so stop waiting.
            if matches!(
                count_status(&client, &server.base, "pending", 1).await,
                Ok(0)
            ) {
                break false;
            }
            last_change = Instant::now();
        }
        if Instant::now() >= deadline {
            break false;
        }
        if Instant::now() >= next_note {
            println!(
                "  ... {:.0} s after posting ended: {distinct} of {accepted} delivered",
                now_s() - posted.end
            );
            next_note += Duration::from_secs(10);
        }
        tokio::time::sleep(POLL).await;
    };
    // Repeats of events already delivered would come after them.
    tokio::time::sleep(DUPLICATE_GRACE).await;
    sampling.store(false, Ordering::Relaxed);
    let lane = sampler.await.unwrap_or_default();
    let (cpu_ns, switches) = usage(server.pid());
    let statuses = count_statuses(&client, &server.base).await;
    let tracker = receiver.tracker().clone();
    let max_at_receiver = receiver.max_in_flight();
    let server_log = server.stop();
    receiver.stop().await;

    report(
        p,
        s,
        &posted,
        &tracker,
        all_in,
        &lane,
        max_at_receiver,
        &statuses,
    );
    if accepted > 0 {
        println!(
            "  server (its threads' schedstat, start to end): {:.1} µs CPU and {:.2} context switches per accepted event, its ingest and delivery",
            cpu_ns as f64 / 1000.0 / accepted as f64,
            switches as f64 / accepted as f64
        );
    }
    let log = server_log.trim();
    if !log.is_empty() {
        let lines: Vec<&str> = log.lines().collect();
        println!(
            "  dedupd wrote {} log line(s) at warn or above; the last ones:",
            lines.len()
        );
        for line in lines.iter().rev().take(5).rev() {
            println!("    {}", truncate(line, 300));
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments, clippy::cast_precision_loss)]
fn report(
    p: &Params,
    s: &Scenario,
    posted: &Posted,
    t: &Tracker,
    all_in: bool,
    lane: &LaneSamples,
    max_at_receiver: Option<usize>,
    statuses: &BTreeMap<&'static str, Result<u64, String>>,
) {
    let post_time = posted.end - posted.start;
    let distinct = t.distinct() as u64;
    println!(
        "  posted {} events in {:.2} s: {} accepted, {} duplicate, {} failed{} -> ingest {:.0} events/s{}",
        posted.posted,
        post_time,
        posted.accepted,
        posted.duplicate,
        posted.failed,
        posted
            .first_error
            .as_ref()
            .map(|e| format!(" (first: {})", truncate(e, 160)))
            .unwrap_or_default(),
        posted.accepted as f64 / post_time,
        posted.latency_text(),
    );
    if !all_in {
        let why = if now_s() - posted.end >= p.wait.as_secs_f64() {
            format!(
                "GAVE UP after waiting {:.0} s past the end of posting",
                p.wait.as_secs_f64()
            )
        } else {
            "stopped waiting: nothing new delivered for 1 s and nothing pending".to_owned()
        };
        println!(
            "  {why}: {} of {} accepted events delivered",
            distinct, posted.accepted
        );
    }
    let (Some(first), Some(last)) = (t.first, t.last_new) else {
        println!("  nothing was delivered");
        print_statuses(statuses);
        return;
    };
    let e2e = last - posted.start;
    println!(
        "  first delivery {:.3} s after the first post; last delivery {:.2} s after the first post \
         ({:.2} s after posting ended)",
        first - posted.start,
        e2e,
        last - posted.end,
    );
    let done_by_post_end = t.times.iter().filter(|&&x| x <= posted.end).count();
    println!(
        "  first post -> last delivery: {:.2} s = {:.2}x the posting time{}",
        e2e,
        e2e / post_time,
        match s.load {
            Load::For(_) | Load::Wrk(_) => " (goal: <= 1.2x)",
            Load::Count(_) => "",
        }
    );
    println!(
        "  end-to-end {:.0} delivered events/s; delivery rate from first to last delivery {:.0} events/s{}; \
         {} delivered while posting",
        distinct as f64 / e2e,
        distinct as f64 / (last - first).max(1e-9),
        match s.load {
            Load::Count(_) => " (target >= 2000)",
            Load::For(_) | Load::Wrk(_) => "",
        },
        done_by_post_end,
    );
    let repeated = t.seen.values().filter(|&&n| n > 1).count();
    let extra: u64 = t
        .seen
        .values()
        .map(|&n| u64::from(n.saturating_sub(1)))
        .sum();
    let missing = posted.accepted.saturating_sub(distinct);
    let exactly_once = repeated == 0 && missing == 0 && t.no_id == 0;
    println!(
        "  exactly once: {} ({} requests, {} distinct webhook-id, {} ids delivered more than once \
         ({} extra requests), {} accepted but not delivered{})",
        if exactly_once { "yes" } else { "NO" },
        t.requests,
        distinct,
        repeated,
        extra,
        missing,
        if t.no_id > 0 {
            format!(", {} requests without webhook-id", t.no_id)
        } else {
            String::new()
        }
    );
    if repeated > 0 {
        let mut examples: Vec<_> = t.seen.iter().filter(|(_, n)| **n > 1).collect();
        examples.sort();
        let shown: Vec<String> = examples
            .iter()
            .take(5)
            .map(|(id, n)| format!("{id} x{n}"))
            .collect();
        println!("    repeated: {}", shown.join(", "));
    }
    print_statuses(statuses);
    let mut lane_line = format!(
        "  in flight (sampled from /v1/sources/bench every {} ms): max {}, mean {:.0} over {} samples",
        SAMPLE.as_millis(),
        lane.max,
        lane.mean(),
        lane.samples
    );
    if let Some(m) = max_at_receiver {
        let _ = write!(lane_line, "; most requests at the receiver at once: {m}");
    }
    if lane.paused > 0 {
        let _ = write!(
            lane_line,
            "; circuit not running in {} samples",
            lane.paused
        );
    }
    println!("{lane_line}");
    println!(
        "  deliveries per second since the first post: {}",
        t.timeline(posted.start)
    );
}

fn print_statuses(statuses: &BTreeMap<&'static str, Result<u64, String>>) {
    let parts: Vec<String> = statuses
        .iter()
        .map(|(k, v)| match v {
            Ok(n) => format!("{k} {n}"),
            Err(e) => format!("{k} ? ({})", truncate(e, 80)),
        })
        .collect();
    println!("  inbox at the end: {}", parts.join(", "));
}

pub(crate) fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

pub(crate) fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

pub(crate) fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

// ---------------------------------------------------------------- receiver

/// What the receiver saw.
#[derive(Debug, Default, Clone)]
pub(crate) struct Tracker {
    /// Requests.
    requests: u64,
    /// Requests per webhook-id.
    pub(crate) seen: HashMap<String, u32>,
    /// Requests without a webhook-id.
    no_id: u64,
    /// When the first request was answered.
    first: Option<f64>,
    /// When the last new webhook-id was answered.
    pub(crate) last_new: Option<f64>,
    /// When each new webhook-id was answered.
    pub(crate) times: Vec<f64>,
}

impl Tracker {
    fn record(&mut self, id: Option<&str>, at: f64) {
        self.requests += 1;
        self.first = Some(self.first.map_or(at, |f| f.min(at)));
        let Some(id) = id.filter(|i| !i.is_empty()) else {
            self.no_id += 1;
            return;
        };
        let n = self.seen.entry(id.to_owned()).or_default();
        *n += 1;
        if *n == 1 {
            self.last_new = Some(self.last_new.map_or(at, |l| l.max(at)));
            self.times.push(at);
        }
    }

    pub(crate) fn distinct(&self) -> usize {
        self.seen.len()
    }

    /// New deliveries in each second since `start`.
    fn timeline(&self, start: f64) -> String {
        let mut buckets: Vec<u64> = Vec::new();
        for &t in &self.times {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let i = (t - start).max(0.0).floor() as usize;
            if buckets.len() <= i {
                buckets.resize(i + 1, 0);
            }
            buckets[i] += 1;
        }
        // A long stall is shown compressed: runs of empty seconds as one entry.
        let mut out = Vec::new();
        let mut zeros = 0;
        for b in buckets {
            if b == 0 {
                zeros += 1;
                continue;
            }
            if zeros > 3 {
                out.push(format!("[{zeros} s of 0]"));
            } else {
                out.extend(std::iter::repeat_n("0".to_owned(), zeros));
            }
            zeros = 0;
            out.push(b.to_string());
        }
        out.join(" ")
    }
}

/// The in-process receiver's shared state.
#[derive(Debug)]
struct ReceiverState {
    tracker: Mutex<Tracker>,
    delay: Option<Duration>,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
}

async fn hook(
    req: HttpRequest,
    _body: web::Bytes,
    state: web::Data<ReceiverState>,
) -> HttpResponse {
    let now = state.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
    state.max_in_flight.fetch_max(now, Ordering::Relaxed);
    if let Some(d) = state.delay {
        tokio::time::sleep(d).await;
    }
    let id = req
        .headers()
        .get("webhook-id")
        .and_then(|v| v.to_str().ok());
    state
        .tracker
        .lock()
        .expect("receiver tracker")
        .record(id, now_s());
    state.in_flight.fetch_sub(1, Ordering::Relaxed);
    HttpResponse::NoContent().finish()
}

enum ReceiverImpl {
    InProcess {
        state: Arc<ReceiverState>,
        handle: ServerHandle,
    },
    Nginx {
        child: ChildGuard,
        tracker: Arc<Mutex<Tracker>>,
        tail: tokio::task::JoinHandle<()>,
        tailing: Arc<AtomicBool>,
        _dir: TempDir,
    },
}

pub(crate) struct Receiver {
    pub(crate) url: String,
    inner: ReceiverImpl,
}

impl Receiver {
    pub(crate) async fn start(kind: ReceiverKind) -> anyhow::Result<Self> {
        match kind {
            ReceiverKind::InProcess { delay } => {
                let state = Arc::new(ReceiverState {
                    tracker: Mutex::new(Tracker::default()),
                    delay,
                    in_flight: AtomicUsize::new(0),
                    max_in_flight: AtomicUsize::new(0),
                });
                let data = web::Data::from(state.clone());
                let listener = TcpListener::bind("127.0.0.1:0")?;
                let port = listener.local_addr()?.port();
                let server = HttpServer::new(move || {
                    App::new()
                        .app_data(data.clone())
                        .default_service(web::to(hook))
                })
                .workers(1)
                .backlog(4096)
                .disable_signals()
                .listen(listener)?
                .run();
                let handle = server.handle();
                tokio::spawn(server);
                Ok(Self {
                    url: format!("http://127.0.0.1:{port}/hooks"),
                    inner: ReceiverImpl::InProcess { state, handle },
                })
            }
            ReceiverKind::Nginx => Self::start_nginx().await,
        }
    }

    async fn start_nginx() -> anyhow::Result<Self> {
        let dir = TempDir::new()?;
        let port = free_port()?;
        let log = dir.path().join("access.log");
        let conf = dir.path().join("nginx.conf");
        let p = |name: &str| dir.path().join(name).display().to_string();
        std::fs::write(
            &conf,
            format!(
                "worker_processes 1;\n\
                 pid {pid};\n\
                 error_log {err} warn;\n\
                 events {{ worker_connections 4096; }}\n\
                 http {{\n\
                   client_body_temp_path {body};\n\
                   proxy_temp_path {proxy};\n\
                   fastcgi_temp_path {fcgi};\n\
                   uwsgi_temp_path {uwsgi};\n\
                   scgi_temp_path {scgi};\n\
                   log_format bench '$msec $http_webhook_id';\n\
                   access_log {log} bench;\n\
                   keepalive_requests 1000000;\n\
                   keepalive_timeout 65s;\n\
                   server {{\n\
                     listen 127.0.0.1:{port};\n\
                     location / {{ return 204; }}\n\
                   }}\n\
                 }}\n",
                pid = p("nginx.pid"),
                err = p("error.log"),
                body = p("body"),
                proxy = p("proxy"),
                fcgi = p("fastcgi"),
                uwsgi = p("uwsgi"),
                scgi = p("scgi"),
                log = log.display(),
            ),
        )?;
        let child = Command::new("nginx")
            .arg("-p")
            .arg(dir.path())
            .arg("-e")
            .arg(dir.path().join("error.log"))
            .arg("-c")
            .arg(&conf)
            .args(["-g", "daemon off;"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting nginx")?;
        // nginx's workers outlive a killed master: stop it with SIGTERM.
        let mut child = ChildGuard {
            child,
            terminate: true,
        };
        let url = format!("http://127.0.0.1:{port}/hooks");
        let probe = dedupd::http_client::builder().no_proxy().build()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = child.child.try_wait()? {
                let err = std::fs::read_to_string(dir.path().join("error.log")).unwrap_or_default();
                bail!("nginx exited ({status}): {}", err.trim());
            }
            // The probe's id is left out of the counts.
            if probe
                .get(&url)
                .header("webhook-id", PROBE_ID)
                .send()
                .await
                .is_ok_and(|r| r.status().as_u16() == 204)
            {
                break;
            }
            if Instant::now() >= deadline {
                bail!("nginx did not answer within 10 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let tracker = Arc::new(Mutex::new(Tracker::default()));
        let tailing = Arc::new(AtomicBool::new(true));
        let tail = tokio::spawn(tail_access_log(log, tracker.clone(), tailing.clone()));
        Ok(Self {
            url,
            inner: ReceiverImpl::Nginx {
                child,
                tracker,
                tail,
                tailing,
                _dir: dir,
            },
        })
    }

    pub(crate) fn tracker(&self) -> std::sync::MutexGuard<'_, Tracker> {
        match &self.inner {
            ReceiverImpl::InProcess { state, .. } => state.tracker.lock(),
            ReceiverImpl::Nginx { tracker, .. } => tracker.lock(),
        }
        .expect("receiver tracker")
    }

    fn max_in_flight(&self) -> Option<usize> {
        match &self.inner {
            ReceiverImpl::InProcess { state, .. } => {
                Some(state.max_in_flight.load(Ordering::Relaxed))
            }
            ReceiverImpl::Nginx { .. } => None,
        }
    }

    pub(crate) async fn stop(self) {
        match self.inner {
            ReceiverImpl::InProcess { handle, .. } => handle.stop(false).await,
            ReceiverImpl::Nginx {
                child,
                tail,
                tailing,
                ..
            } => {
                tailing.store(false, Ordering::Relaxed);
                let _ = tail.await;
                drop(child);
            }
        }
    }
}

/// Feeds nginx's access log (`$msec $http_webhook_id` lines) into the
/// tracker until told to stop, then reads what is left.
async fn tail_access_log(path: PathBuf, tracker: Arc<Mutex<Tracker>>, tailing: Arc<AtomicBool>) {
    let mut offset = 0usize;
    loop {
        let still = tailing.load(Ordering::Relaxed);
        if let Ok(bytes) = tokio::fs::read(&path).await
            && bytes.len() > offset
        {
            // Only whole lines: a line being written is read next time.
            let end = bytes[offset..]
                .iter()
                .rposition(|&b| b == b'\n')
                .map_or(offset, |i| offset + i + 1);
            let text = String::from_utf8_lossy(&bytes[offset..end]);
            let mut t = tracker.lock().expect("nginx tracker");
            for line in text.lines() {
                let (ts, id) = line.split_once(' ').unwrap_or((line, ""));
                let Ok(ts) = ts.parse::<f64>() else { continue };
                if id == PROBE_ID {
                    continue;
                }
                // nginx logs an absent header as "-".
                t.record(Some(id).filter(|i| *i != "-"), wall_to_s(ts));
            }
            drop(t);
            offset = end;
        }
        if !still {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------- dedupd

/// A child process, stopped when dropped (also when the bench fails).
pub(crate) struct ChildGuard {
    pub(crate) child: Child,
    /// Ask it to stop with SIGTERM first (killed after 5 s regardless).
    pub(crate) terminate: bool,
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if self.terminate {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(self.child.id().to_string())
                .status();
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if !matches!(self.child.try_wait(), Ok(None)) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running `dedupd serve`, killed when dropped.
pub(crate) struct Dedupd {
    child: ChildGuard,
    pub(crate) base: String,
    log: PathBuf,
    _dir: TempDir,
}

impl Dedupd {
    /// With `github`, the source verifies GitHub's signature
    /// (`X-Hub-Signature-256`) instead of Sume's.
    pub(crate) async fn start(p: &Params, forward_to: &str, github: bool) -> anyhow::Result<Self> {
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
                 {gateway}\
                 [sources.bench]\n\
                 scheme = \"{scheme}\"\n\
                 secrets = [\"{SECRET}\"]\n\
                 event_id = \"body:/request_id\"\n\
                 created_at = \"body:/created_at\"\n\
                 stream = \"body:/run_id\"\n\
                 forward_to = \"{forward_to}\"\n\
                 destination_secret = \"{DESTINATION_SECRET}\"\n\
                 {source}",
                scheme = if github { "github" } else { "sume" },
                data = dir.path().join("dedupd.redb").display().to_string(),
                gateway = p.max_in_flight.map_or(String::new(), |n| format!(
                    "[gateway]\nmax_in_flight = {n}\n"
                )),
                source = p
                    .max_in_flight
                    .map_or(String::new(), |n| format!("max_in_flight = {n}\n")),
            ),
        )?;
        let log = dir.path().join("dedupd.log");
        let out = std::fs::File::create(&log)?;
        let child = server_command()
            .arg("serve")
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .context("starting dedupd")?;
        let mut server = Self {
            child: ChildGuard {
                child,
                terminate: false,
            },
            base: format!("http://127.0.0.1:{port}"),
            log,
            _dir: dir,
        };
        server.wait_ready().await?;
        Ok(server)
    }

    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        wait_ready(&mut self.child, &self.base, &self.log).await
    }

    /// The server's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.child.id()
    }

    /// Kills the server; returns what it logged.
    pub(crate) fn stop(self) -> String {
        let Self { child, log, .. } = self;
        drop(child);
        read(&log)
    }
}

/// The command that starts the server: `BENCH_BIN` (another build's
/// binary, measured the same way) or this build's; with `PIN=1`, on CPU 0
/// (run the bench on the other one: `PIN=1 taskset -c 1 cargo bench …`).
/// Without the caller's `DEDUPD_*` settings, log level and proxies.
pub(crate) fn server_command() -> Command {
    let bin =
        std::env::var("BENCH_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_dedupd").to_owned());
    let mut cmd = if std::env::var("PIN").is_ok_and(|v| v == "1") {
        let mut c = Command::new("taskset");
        c.args(["-c", "0"]).arg(bin);
        c
    } else {
        Command::new(bin)
    };
    for (k, _) in std::env::vars() {
        let lower = k.to_ascii_lowercase();
        if k.starts_with("DEDUPD_") || k == "RUST_LOG" || lower.ends_with("_proxy") {
            cmd.env_remove(&k);
        }
    }
    cmd
}

/// Waits until the `dedupd serve` in `child` answers `/readyz` at `base`
/// (30 s at most); its log at `log` says why when it does not.
pub(crate) async fn wait_ready(
    child: &mut ChildGuard,
    base: &str,
    log: &Path,
) -> anyhow::Result<()> {
    let client = dedupd::http_client::builder().no_proxy().build()?;
    let url = format!("{base}/readyz");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.child.try_wait()? {
            bail!("dedupd exited ({status}): {}", read(log).trim());
        }
        if client
            .get(&url)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "dedupd not ready within 30 s: {}",
                truncate(read(log).trim(), 500)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(crate) fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// What the delivery lane looked like, sampled during the run.
#[derive(Debug, Default)]
struct LaneSamples {
    samples: u64,
    sum: u64,
    max: u64,
    paused: u64,
}

impl LaneSamples {
    #[allow(clippy::cast_precision_loss)]
    fn mean(&self) -> f64 {
        if self.samples == 0 {
            0.0
        } else {
            self.sum as f64 / self.samples as f64
        }
    }
}

async fn sample_lane(client: reqwest::Client, base: String, on: Arc<AtomicBool>) -> LaneSamples {
    let url = format!("{base}/v1/sources/bench");
    let mut s = LaneSamples::default();
    while on.load(Ordering::Relaxed) {
        if let Ok(r) = client.get(&url).send().await
            && let Ok(v) = r.json::<serde_json::Value>().await
        {
            let d = &v["delivery"];
            if let Some(n) = d["in_flight"].as_u64() {
                s.samples += 1;
                s.sum += n;
                s.max = s.max.max(n);
                if d["state"].as_str() != Some("running") {
                    s.paused += 1;
                }
            }
        }
        tokio::time::sleep(SAMPLE).await;
    }
    s
}

/// Events of each status in the inbox, counted through the operator API.
async fn count_statuses(
    client: &reqwest::Client,
    base: &str,
) -> BTreeMap<&'static str, Result<u64, String>> {
    let mut out = BTreeMap::new();
    for status in ["delivered", "pending", "stale", "dead"] {
        out.insert(status, count_status(client, base, status, u64::MAX).await);
    }
    out
}

/// Events with `status`, counting up to at least `enough`.
async fn count_status(
    client: &reqwest::Client,
    base: &str,
    status: &str,
    enough: u64,
) -> Result<u64, String> {
    let mut n = 0u64;
    let mut after: Option<String> = None;
    let limit = enough.clamp(1, 500);
    for _ in 0..1000 {
        let mut url = format!("{base}/v1/sources/bench/events?status={status}&limit={limit}");
        if let Some(a) = &after {
            url.push_str("&after=");
            url.push_str(a);
        }
        let r = client.get(&url).send().await.map_err(|e| e.to_string())?;
        if !r.status().is_success() {
            return Err(format!("HTTP {}", r.status()));
        }
        let v: serde_json::Value = r.json().await.map_err(|e| e.to_string())?;
        n += v["events"].as_array().map_or(0, |a| a.len() as u64);
        match v["next"].as_str() {
            Some(next) if n < enough => after = Some(next.to_owned()),
            _ => return Ok(n),
        }
    }
    Err(format!("more than {n}, stopped counting"))
}

// ---------------------------------------------------------------- load

/// What posting did.
#[derive(Debug, Default)]
pub(crate) struct Posted {
    pub(crate) posted: u64,
    pub(crate) accepted: u64,
    pub(crate) duplicate: u64,
    pub(crate) failed: u64,
    pub(crate) first_error: Option<String>,
    /// When the first post was sent and the last answer came, seconds
    /// since [`ORIGIN`].
    pub(crate) start: f64,
    pub(crate) end: f64,
    /// Each answered post's latency, µs (empty when `wrk` posted).
    pub(crate) latencies_us: Vec<u32>,
}

impl Posted {
    /// "p50 … p99 … max … ms" of the posts' latencies, or nothing.
    pub(crate) fn latency_text(&self) -> String {
        if self.latencies_us.is_empty() {
            return String::new();
        }
        let mut l = self.latencies_us.clone();
        l.sort_unstable();
        let at = |q: f64| f64::from(l[((l.len() - 1) as f64 * q).round() as usize]) / 1000.0;
        format!(
            "; ingest latency p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms, max {:.2} ms",
            at(0.5),
            at(0.99),
            at(0.999),
            at(1.0)
        )
    }
}

pub(crate) async fn post_load(
    client: &reqwest::Client,
    base: &str,
    p: &Params,
    load: Load,
) -> Posted {
    let url = format!("{base}/ingest/bench");
    let next = Arc::new(AtomicU64::new(0));
    let accepted = Arc::new(AtomicU64::new(0));
    let duplicate = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let first_error = Arc::new(Mutex::new(None::<String>));
    // created_at: increasing by one microsecond per event from now.
    let base_us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros();
    let start = now_s();
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(p.concurrency);
    for _ in 0..p.concurrency {
        let client = client.clone();
        let url = url.clone();
        let next = next.clone();
        let accepted = accepted.clone();
        let duplicate = duplicate.clone();
        let failed = failed.clone();
        let first_error = first_error.clone();
        let streams = p.streams;
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let more = match load {
                    Load::For(d) | Load::Wrk(d) => started.elapsed() < d,
                    Load::Count(n) => i < n,
                };
                if !more {
                    return latencies;
                }
                let created = UNIX_EPOCH + Duration::from_micros(base_us as u64 + i);
                let body = format!(
                    r#"{{"request_id":"req_{i}","run_id":"run_{}","created_at":"{}","type":"run.step","data":{{"step":{i},"note":"delivery bench"}}}}"#,
                    i % streams,
                    humantime::format_rfc3339_micros(created),
                );
                let ts = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_secs();
                let signature = sign(ts, body.as_bytes());
                let sent = Instant::now();
                let res = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .header("X-Sume-Timestamp", ts.to_string())
                    .header("X-Sume-Signature", signature)
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
                latencies.push(u32::try_from(sent.elapsed().as_micros()).unwrap_or(u32::MAX));
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
    let mut latencies_us = Vec::new();
    for t in tasks {
        if let Ok(l) = t.await {
            latencies_us.extend(l);
        }
    }
    let end = now_s();
    let accepted = accepted.load(Ordering::Relaxed);
    let duplicate = duplicate.load(Ordering::Relaxed);
    let failed = failed.load(Ordering::Relaxed);
    let first_error = first_error.lock().expect("first error").take();
    Posted {
        posted: accepted + duplicate + failed,
        accepted,
        duplicate,
        failed,
        first_error,
        start,
        end,
        latencies_us,
    }
}

/// Posts for `duration` with `wrk`: `CONCURRENCY` connections, two
/// threads, each sending its share of events signed beforehand (more than
/// the run can post; a thread that runs out sends `GET /healthz`, which
/// stores nothing). What was accepted is what the inbox holds after.
async fn post_with_wrk(
    client: &reqwest::Client,
    base: &str,
    p: &Params,
    duration: Duration,
) -> anyhow::Result<Posted> {
    const THREADS: u64 = 2;
    let dir = TempDir::new()?;
    let events = (duration.as_secs_f64() * 40_000.0).ceil() as u64 + 1_000;
    let base_us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros() as u64;
    let mut lines = String::with_capacity(events as usize * 256);
    for i in 0..events {
        let created = UNIX_EPOCH + Duration::from_micros(base_us + i);
        let body = format!(
            r#"{{"request_id":"req_{i}","run_id":"run_{}","created_at":"{}","type":"run.step","data":{{"step":{i},"note":"delivery bench"}}}}"#,
            i % p.streams,
            humantime::format_rfc3339_micros(created),
        );
        let mut mac =
            Hmac::<Sha256>::new_from_slice(SECRET.as_bytes()).expect("HMAC takes any key length");
        mac.update(body.as_bytes());
        let _ = writeln!(
            lines,
            "{}\t{body}",
            hex::encode(mac.finalize().into_bytes())
        );
    }
    let data = dir.path().join("events.tsv");
    std::fs::write(&data, lines)?;
    let script = dir.path().join("post.lua");
    std::fs::write(
        &script,
        format!(
            r#"local threads = 0
function setup(thread)
  thread:set("tid", threads)
  threads = threads + 1
end
local mine = {{}}
local n = 0
function init(args)
  local i = 0
  for line in io.lines({data:?}) do
    if i % {THREADS} == tid then
      local tab = line:find("	", 1, true)
      mine[#mine + 1] = {{ line:sub(1, tab - 1), line:sub(tab + 1) }}
    end
    i = i + 1
  end
end
function request()
  n = n + 1
  local e = mine[n]
  if e == nil then
    return wrk.format("GET", "/healthz")
  end
  return wrk.format("POST", "/ingest/bench", {{
    ["Content-Type"] = "application/json",
    ["X-GitHub-Event"] = "workflow_run",
    ["X-Hub-Signature-256"] = "sha256=" .. e[1],
  }}, e[2])
end
"#
        ),
    )?;
    let mut cmd = Command::new("wrk");
    cmd.arg(format!("-t{THREADS}"))
        .arg(format!("-c{}", p.concurrency))
        .arg(format!("-d{}s", duration.as_secs_f64()))
        .arg("-s")
        .arg(&script)
        .arg(base)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit());
    let start = now_s();
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await?
        .context("running wrk")?;
    let end = now_s();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!("wrk failed: {text}");
    }
    // "  123456 requests in 3.00s, ..." and, if any, "Non-2xx or 3xx responses: N".
    let summary = text
        .lines()
        .find(|l| l.contains(" requests in "))
        .context("wrk printed no request count")?;
    let mut words = summary.split_whitespace();
    let requests: u64 = words
        .next()
        .and_then(|n| n.parse().ok())
        .context("wrk's request count")?;
    // Posting began when wrk's threads had read their events, its run
    // time before it ended.
    let ran: f64 = words
        .nth(2)
        .and_then(|t| t.trim_end_matches(',').strip_suffix('s'))
        .and_then(|t| t.parse().ok())
        .context("wrk's run time")?;
    let start = (end - ran).max(start);
    let failed: u64 = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Non-2xx or 3xx responses:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    if requests >= events {
        println!(
            "  note: wrk ran out of signed events ({events}); raise the factor in post_with_wrk"
        );
    }
    let accepted = inbox_total(client, base).await?;
    // wrk counts the answers it read: requests still out when it stopped
    // were posted (and may be stored) too.
    let posted = requests.min(events).max(accepted + failed);
    Ok(Posted {
        posted,
        accepted,
        duplicate: posted.saturating_sub(accepted + failed),
        failed,
        first_error: (failed > 0).then(|| format!("{failed} answers were not 2xx")),
        start,
        end,
        latencies_us: Vec::new(),
    })
}

/// Every event the inbox holds for the source, by its counts.
async fn inbox_total(client: &reqwest::Client, base: &str) -> anyhow::Result<u64> {
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
    Ok(["pending", "delivered", "stale", "dead"]
        .iter()
        .map(|k| bench[*k].as_u64().unwrap_or(0))
        .sum())
}

/// `v1=<hex HMAC-SHA256(secret, "{ts}.{body}")>`, as Sume signs.
pub(crate) fn sign(ts: u64, body: &[u8]) -> String {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(SECRET.as_bytes()).expect("HMAC takes any key length");
    mac.update(format!("{ts}.").as_bytes());
    mac.update(body);
    format!("v1={}", hex::encode(mac.finalize().into_bytes()))
}

/// A process's threads' time on a CPU (`schedstat`, ns) and context
/// switches (`voluntary` + `nonvoluntary`), summed over the threads alive
/// now (a thread that ended took its counts with it).
pub(crate) fn usage(pid: u32) -> (u64, u64) {
    let (mut cpu, mut switches) = (0u64, 0u64);
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return (0, 0);
    };
    for task in tasks.flatten() {
        if let Ok(s) = std::fs::read_to_string(task.path().join("schedstat")) {
            cpu += s
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
        if let Ok(s) = std::fs::read_to_string(task.path().join("status")) {
            for line in s.lines() {
                if let Some(n) = line
                    .strip_prefix("voluntary_ctxt_switches:")
                    .or_else(|| line.strip_prefix("nonvoluntary_ctxt_switches:"))
                {
                    switches += n.trim().parse::<u64>().unwrap_or(0);
                }
            }
        }
    }
    (cpu, switches)
}
