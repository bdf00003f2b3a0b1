//! A bulk replay of a million delivered events, measured with the real
//! release binary (issue 33): how fast the job goes, and what it does to
//! the latency of live traffic arriving meanwhile.
//!
//! Run: `cargo bench --bench replay`. Nothing is asserted; it prints what
//! it measured. One `dedupd serve` with dedupd's defaults (a source's
//! `max_in_flight` 16, so a job's window is 8) and an in-process receiver
//! answering 204 at once (actix-web, one worker), which tells replays
//! (`dedupd-replay` header) from live events and times each live event's
//! arrival.
//!
//! 1. **Fill**: `EVENTS` unique Sume-signed events (`run_id` = i %
//!    `STREAMS`, `created_at` increasing) posted with `CONCURRENCY`
//!    connections, then waited for until all are delivered.
//! 2. **Live alone**: live events posted at `LIVE_RATE` per second for
//!    `LIVE_S` seconds, one at a time on their own connection, each in one
//!    of the same streams; latency = post sent → the receiver has it.
//! 3. **Live beside the job**: a redeliver job of every delivered event
//!    starts, and the same live load runs for as long as the job does; the
//!    job's rate is its matched events ÷ (start → done).
//!
//! Settings by environment variable (defaults): `EVENTS` (1000000),
//! `STREAMS` (1000), `CONCURRENCY` (64), `LIVE_RATE` (50), `LIVE_S` (20),
//! `WAIT_S` (1800). Quick: `EVENTS=20000 cargo bench --bench replay`.
//! Under `cargo test --all-targets` (no `--bench` argument) it does
//! nothing.

#![allow(clippy::expect_used)]

#[allow(dead_code)]
#[path = "delivery.rs"]
mod delivery;

use std::collections::HashMap;
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use anyhow::{Context, bail};
use serde_json::{Value, json};

use delivery::{Dedupd, Load, Params, env_or, post_load, sign};

/// What the receiver saw.
#[derive(Default)]
struct Seen {
    /// Requests with a `dedupd-replay` header.
    replays: AtomicU64,
    /// Other requests.
    first: AtomicU64,
    /// When each live event arrived.
    live: Mutex<HashMap<String, Instant>>,
}

async fn hook(req: HttpRequest, seen: web::Data<Seen>) -> HttpResponse {
    let header = |n: &str| {
        req.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    };
    let id = header("webhook-id");
    if !header("dedupd-replay").is_empty() {
        seen.replays.fetch_add(1, Ordering::Relaxed);
    } else {
        seen.first.fetch_add(1, Ordering::Relaxed);
        if id.starts_with("live_") {
            seen.live
                .lock()
                .expect("live")
                .entry(id.to_owned())
                .or_insert_with(Instant::now);
        }
    }
    HttpResponse::NoContent().finish()
}

fn main() -> anyhow::Result<()> {
    if !std::env::args().any(|a| a == "--bench") {
        return Ok(());
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run())
}

struct Live {
    /// Latencies of live events, ms, sorted.
    latencies: Vec<f64>,
    /// Live events posted and never seen within the wait.
    missing: usize,
}

impl Live {
    fn pct(&self, q: f64) -> f64 {
        if self.latencies.is_empty() {
            return f64::NAN;
        }
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let i = ((self.latencies.len() as f64 - 1.0) * q).round() as usize;
        self.latencies[i]
    }

    fn describe(&self) -> String {
        format!(
            "{} live events: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms{}",
            self.latencies.len(),
            self.pct(0.5),
            self.pct(0.99),
            self.latencies.last().copied().unwrap_or(f64::NAN),
            if self.missing > 0 {
                format!(", {} not delivered", self.missing)
            } else {
                String::new()
            }
        )
    }
}

async fn run() -> anyhow::Result<()> {
    let events: u64 = env_or("EVENTS", 1_000_000)?;
    let streams: u64 = env_or("STREAMS", 1000)?;
    let live_rate: f64 = env_or("LIVE_RATE", 50.0)?;
    let live_s: f64 = env_or("LIVE_S", 20.0)?;
    let wait = Duration::from_secs_f64(env_or("WAIT_S", 1800.0)?);
    let p = Params {
        duration: Duration::ZERO,
        concurrency: env_or("CONCURRENCY", 64)?,
        streams,
        events,
        delay_ms: 0,
        max_in_flight: None,
        wait,
        scenarios: Vec::new(),
    };

    let seen = web::Data::new(Seen::default());
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    let data = seen.clone();
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
    tokio::spawn(server);

    let dedupd = Dedupd::start(&p, &format!("http://127.0.0.1:{port}/hook"), false).await?;
    let client = dedupd::http_client::builder()
        .no_proxy()
        .pool_max_idle_per_host(p.concurrency)
        .build()?;
    let base = dedupd.base.clone();

    // 1. Fill.
    let started = Instant::now();
    let posted = post_load(&client, &base, &p, Load::Count(events)).await;
    if posted.accepted != events {
        bail!(
            "fill: {} of {events} accepted ({:?})",
            posted.accepted,
            posted.first_error
        );
    }
    let ingest_s = posted.end - posted.start;
    until(wait, "every event delivered", || async {
        delivered(&client, &base).await.unwrap_or(0) >= events
    })
    .await?;
    println!(
        "fill: {events} events in {ingest_s:.0} s ({:.0}/s), all delivered after {:.0} s",
        events as f64 / ingest_s,
        started.elapsed().as_secs_f64()
    );

    // 2. Live alone.
    let alone = live_load(
        &client,
        &base,
        &seen,
        live_rate,
        Some(live_s),
        None,
        streams,
    )
    .await;
    println!("live alone: {}", alone.describe());

    // 3. Live beside the job.
    let res = client
        .post(format!("{base}/v1/sources/bench/jobs"))
        .json(&json!({ "kind": "redeliver", "filter": { "status": "delivered" } }))
        .send()
        .await?;
    if res.status().as_u16() != 201 {
        bail!("job refused: {} {}", res.status(), res.text().await?);
    }
    let job: Value = res.json().await?;
    let id = job["id"].as_str().context("job id")?.to_owned();
    let job_started = Instant::now();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (client, base, id, done) = (client.clone(), base.clone(), id.clone(), done.clone());
        tokio::spawn(async move {
            let deadline = Instant::now() + wait;
            let mut last = Value::Null;
            let mut printed = Instant::now();
            while Instant::now() < deadline {
                if let Ok(r) = client.get(format!("{base}/v1/jobs/{id}")).send().await
                    && let Ok(v) = r.json::<Value>().await
                {
                    last = v;
                    if last["state"] != "running" {
                        break;
                    }
                }
                if printed.elapsed() > Duration::from_secs(30) {
                    println!(
                        "  job at {:.0} s: {} delivered",
                        job_started.elapsed().as_secs_f64(),
                        last["delivered"]
                    );
                    printed = Instant::now();
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            done.store(true, Ordering::Relaxed);
            (last, job_started.elapsed())
        })
    };
    let beside = live_load(&client, &base, &seen, live_rate, None, Some(done), streams).await;
    let (last, took) = watcher.await?;
    let matched = last["matched"].as_u64().unwrap_or(0);
    println!(
        "job: {} — {matched} matched, {} delivered, {} failed, {} skipped in {:.0} s: {:.0} replays/s",
        last["state"],
        last["delivered"],
        last["failed"],
        last["skipped"],
        took.as_secs_f64(),
        matched as f64 / took.as_secs_f64()
    );
    println!("live beside the job: {}", beside.describe());
    println!(
        "receiver: {} first deliveries, {} replays",
        seen.first.load(Ordering::Relaxed),
        seen.replays.load(Ordering::Relaxed)
    );
    let log = dedupd.stop();
    let errors: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("ERROR"))
        .take(5)
        .collect();
    if !errors.is_empty() {
        println!("dedupd logged errors: {errors:?}");
    }
    Ok(())
}

/// Events the inbox holds as delivered.
async fn delivered(client: &reqwest::Client, base: &str) -> anyhow::Result<u64> {
    let v: Value = client
        .get(format!("{base}/v1/sources"))
        .send()
        .await?
        .json()
        .await?;
    Ok(v["sources"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["source"] == "bench"))
        .and_then(|s| s["delivered"].as_u64())
        .unwrap_or(0))
}

async fn until<F, Fut>(wait: Duration, what: &str, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + wait;
    while !check().await {
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

/// Posts live events at `rate` per second, for `secs` or until `stop`;
/// then waits (10 s at most) for them and measures their latency.
async fn live_load(
    client: &reqwest::Client,
    base: &str,
    seen: &Seen,
    rate: f64,
    secs: Option<f64>,
    stop: Option<Arc<std::sync::atomic::AtomicBool>>,
    streams: u64,
) -> Live {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut sent: Vec<(String, Instant)> = Vec::new();
    let start = Instant::now();
    let every = Duration::from_secs_f64(1.0 / rate);
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        if secs.is_some_and(|s| start.elapsed().as_secs_f64() >= s)
            || stop.as_ref().is_some_and(|s| s.load(Ordering::Relaxed))
        {
            break;
        }
        let k = NEXT.fetch_add(1, Ordering::Relaxed);
        let id = format!("live_{k}");
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let body = format!(
            r#"{{"request_id":"{id}","run_id":"run_{}","created_at":"{}","type":"run.step"}}"#,
            k % streams,
            humantime::format_rfc3339_micros(UNIX_EPOCH + now),
        );
        let ts = now.as_secs();
        let at = Instant::now();
        let (client, url) = (client.clone(), format!("{base}/ingest/bench"));
        let signature = sign(ts, body.as_bytes());
        tokio::spawn(async move {
            let _ = client
                .post(url)
                .header("content-type", "application/json")
                .header("X-Sume-Timestamp", ts.to_string())
                .header("X-Sume-Signature", signature)
                .body(body)
                .send()
                .await;
        });
        sent.push((id, at));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let arrived = {
            let live = seen.live.lock().expect("live");
            sent.iter().filter(|(id, _)| live.contains_key(id)).count()
        };
        if arrived == sent.len() || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let live = seen.live.lock().expect("live");
    let mut latencies: Vec<f64> = sent
        .iter()
        .filter_map(|(id, at)| {
            live.get(id)
                .map(|got| got.saturating_duration_since(*at).as_secs_f64() * 1000.0)
        })
        .collect();
    latencies.sort_by(f64::total_cmp);
    Live {
        missing: sent.len() - latencies.len(),
        latencies,
    }
}
