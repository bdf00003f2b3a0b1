//! The fleet acting as one (issue 54), measured with real processes: three
//! `dedupd serve` on one redis-server (AOF always) and the shared inbox.
//!
//! - **Rate accuracy**: the source's `rate_limit` at each of `RATES` (per
//!   second; `rate_burst` its default, one second's worth), `RATE_SECONDS`
//!   seconds' worth of events posted at once over the three instances,
//!   delivered to nginx (`$msec` in its access log): the highest count of
//!   deliveries in any 1 s window (the bound is `rate_burst` + rate), and
//!   the overall rate, first to last delivery.
//! - **Failover**: instance 0 alone leases the first event of 8 streams
//!   and its requests hang at the receiver; instances 1 and 2 join; once
//!   instance 0 has renewed its leases twice, it is SIGKILLed at a random
//!   point of its heartbeat (0 to 2.5 s later: a quarter of the grace).
//!   The time until each of its streams is delivered by another instance,
//!   over `FAILOVER_RUNS` runs: median and maximum, at the default
//!   `gateway.lease_grace` (10 s) and `forward_timeout` (10 s), whose
//!   expected range is 7.5 to 10 s after the kill.
//!
//! The cost of the fleet's lane gate is the delivery table's extra row
//! (`shared inbox × 3, rate_limit 1000000/s`: a limit that never binds but
//! is asked every pass), beside `shared inbox × 3`.

use std::collections::HashMap;
use std::net::TcpListener;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};

use super::delivery::{Receiver, ReceiverKind, now_s};
use super::{
    Inbox, Instance, Params, Redis, Spread, cpu_ns, median, per, post_spread, switches, us_per,
};

/// Streams instance 0 holds when it is killed.
const FAILOVER_STREAMS: u64 = 8;

/// Runs what `p` asks for and prints its tables.
pub(crate) async fn run(p: &Params) {
    if !p.rates.is_empty() {
        let mut rows = Vec::new();
        for &rate in &p.rates {
            let mut runs = Vec::new();
            for round in 1..=p.runs {
                match rate_run(p, rate).await {
                    Ok(r) => {
                        println!(
                            "rate {rate}/s run {round} | {} delivered of {} accepted, highest 1 s window {}, \
                             overall {:.1}/s | CPU per event: Redis {:.1} µs, dedupd {:.1} µs | switches \
                             per event: Redis {:.2}, dedupd {:.2}",
                            r.delivered,
                            r.accepted,
                            r.max_window,
                            r.overall,
                            r.redis_us,
                            r.dedupd_us,
                            r.redis_sw,
                            r.dedupd_sw
                        );
                        runs.push(r);
                    }
                    Err(e) => println!("rate {rate}/s run {round} | FAILED: {e:#}"),
                }
            }
            rows.push((rate, runs));
        }
        println!(
            "\nRate accuracy: three instances, shared inbox, rate_limit per second with its default burst \
             (= the rate); {} s of events posted at once; medians of {} run(s)",
            p.rate_seconds, p.runs
        );
        println!(
            "| rate_limit | bound (burst + rate) | highest count in any 1 s window (max over runs) | overall rate /s | CPU µs/event: Redis · dedupd | switches/event: Redis · dedupd | delivered of accepted |"
        );
        println!("|---|---|---|---|---|---|---|");
        for (rate, runs) in rows {
            if runs.is_empty() {
                println!("| {rate}/s | | failed | | | | |");
                continue;
            }
            let f = |g: fn(&RateRun) -> f64| median(runs.iter().map(g).collect());
            println!(
                "| {rate}/s | {} | {} ({}) | {:.1} | {:.1} · {:.1} | {:.2} · {:.2} | {} of {} |",
                2 * rate,
                f(|r| r.max_window as f64),
                runs.iter().map(|r| r.max_window).max().unwrap_or(0),
                f(|r| r.overall),
                f(|r| r.redis_us),
                f(|r| r.dedupd_us),
                f(|r| r.redis_sw),
                f(|r| r.dedupd_sw),
                runs.iter().map(|r| r.delivered).sum::<u64>(),
                runs.iter().map(|r| r.accepted).sum::<u64>(),
            );
        }
    }
    if p.failover_runs > 0 {
        let mut all = Vec::new();
        for round in 1..=p.failover_runs {
            match failover_run(p).await {
                Ok(times) => {
                    println!(
                        "failover run {round} | each stream delivered again after {}",
                        times
                            .iter()
                            .map(|t| format!("{t:.2}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                    all.extend(times);
                }
                Err(e) => println!("failover run {round} | FAILED: {e:#}"),
            }
        }
        let max = all.iter().copied().fold(f64::NAN, f64::max);
        println!(
            "\nFailover: SIGKILL of an instance holding {FAILOVER_STREAMS} streams' requests in flight, \
             lease_grace 10 s (default), forward_timeout 10 s (default), two instances left; {} run(s), {} \
             streams in all: time until each stream is delivered by another instance, median {:.2} s, \
             maximum {max:.2} s",
            p.failover_runs,
            all.len(),
            median(all.clone()),
        );
    }
}

/// One run of the rate accuracy.
struct RateRun {
    accepted: u64,
    delivered: u64,
    max_window: u64,
    overall: f64,
    redis_us: f64,
    dedupd_us: f64,
    redis_sw: f64,
    dedupd_sw: f64,
}

async fn rate_run(p: &Params, rate: u64) -> anyhow::Result<RateRun> {
    let redis = Redis::single()?;
    let receiver = Receiver::start(ReceiverKind::Nginx).await?;
    let source = format!("rate_limit = \"{rate}/s\"\n");
    let mut fleet = Vec::new();
    for _ in 0..3 {
        fleet.push(
            Instance::start(
                &redis.storage_toml(),
                Some((Inbox::Shared, &receiver.url)),
                &source,
            )
            .await?,
        );
    }
    let bases: Vec<String> = fleet.iter().map(|i| i.base.clone()).collect();
    let client = dedupd::http_client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()?;
    let pids: Vec<u32> = fleet.iter().map(|i| i.child.child.id()).collect();
    let (cpu0, sw0) = (
        (cpu_ns(&redis.pids), cpu_ns(&pids)),
        (switches(&redis.pids), switches(&pids)),
    );
    let events = rate * p.rate_seconds;
    let post = Params {
        duration: Duration::from_secs(120),
        concurrency: 16,
        streams: events,
        spread: Spread::Connection,
        ..p.clone()
    };
    let posted = post_spread(&client, &bases, &post, Some(events)).await;
    let deadline = Instant::now() + Duration::from_secs(p.rate_seconds * 3 + 60);
    while (receiver.tracker().distinct() as u64) < posted.accepted && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (cpu1, sw1) = (
        (cpu_ns(&redis.pids), cpu_ns(&pids)),
        (switches(&redis.pids), switches(&pids)),
    );
    let mut times = receiver.tracker().times.clone();
    for instance in fleet {
        instance.stop();
    }
    receiver.stop().await;
    drop(redis);
    times.sort_by(f64::total_cmp);
    // The most deliveries in any window [t, t + 1 s) that starts at one.
    let mut max_window = 0;
    let mut end = 0;
    for (start, t) in times.iter().enumerate() {
        while end < times.len() && times[end] < t + 1.0 {
            end += 1;
        }
        max_window = max_window.max(end - start);
    }
    let span = match (times.first(), times.last()) {
        (Some(a), Some(b)) if b > a => b - a,
        _ => f64::NAN,
    };
    #[allow(clippy::cast_precision_loss)]
    Ok(RateRun {
        accepted: posted.accepted,
        delivered: times.len() as u64,
        max_window: max_window as u64,
        overall: (times.len().saturating_sub(1)) as f64 / span,
        redis_us: us_per(cpu0.0, cpu1.0, posted.accepted),
        dedupd_us: us_per(cpu0.1, cpu1.1, posted.accepted),
        redis_sw: per(sw0.0, sw1.0, posted.accepted),
        dedupd_sw: per(sw0.1, sw1.1, posted.accepted),
    })
}

/// What the hanging receiver got: per webhook-id, each request's query and
/// arrival (seconds since the bench's origin).
#[derive(Default)]
struct Got {
    requests: HashMap<String, Vec<(String, f64)>>,
    held: usize,
}

async fn hook(req: HttpRequest, got: web::Data<Mutex<Got>>) -> HttpResponse {
    let id = req
        .headers()
        .get("webhook-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let query = req.query_string().to_owned();
    let hold = query == "n=0";
    {
        let mut g = got.lock().expect("receiver state");
        g.requests.entry(id).or_default().push((query, now_s()));
        if hold {
            g.held += 1;
        }
    }
    if hold {
        // Instance 0's requests hang until it is killed (and after).
        std::future::pending::<()>().await;
    }
    HttpResponse::NoContent().finish()
}

/// One failover run: seconds from the SIGKILL until each of the killed
/// instance's streams was delivered by another.
async fn failover_run(p: &Params) -> anyhow::Result<Vec<f64>> {
    let redis = Redis::single()?;
    let got = web::Data::new(Mutex::new(Got::default()));
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    let data = got.clone();
    let server = HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            .default_service(web::to(hook))
    })
    .workers(1)
    .disable_signals()
    .shutdown_timeout(0)
    .listen(listener)?
    .run();
    let handle = server.handle();
    tokio::spawn(server);
    let url = |n: usize| format!("http://127.0.0.1:{port}/hooks?n={n}");

    let first = Instance::start(&redis.storage_toml(), Some((Inbox::Shared, &url(0))), "").await?;
    let client = dedupd::http_client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()?;
    let post = Params {
        duration: Duration::from_secs(30),
        concurrency: 1,
        streams: FAILOVER_STREAMS,
        spread: Spread::Connection,
        ..p.clone()
    };
    let posted = post_spread(
        &client,
        std::slice::from_ref(&first.base),
        &post,
        Some(FAILOVER_STREAMS),
    )
    .await;
    anyhow::ensure!(
        posted.accepted == FAILOVER_STREAMS,
        "posted {} of {FAILOVER_STREAMS}",
        posted.accepted
    );
    let held = |n: usize| got.lock().expect("receiver state").held >= n;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !held(FAILOVER_STREAMS as usize) {
        anyhow::ensure!(
            Instant::now() < deadline,
            "instance 0 never held every stream"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut others = Vec::new();
    for n in 1..3 {
        others.push(
            Instance::start(&redis.storage_toml(), Some((Inbox::Shared, &url(n))), "").await?,
        );
    }
    // Killed between two of its renewals, anywhere: after two of them.
    let renewed = || async {
        let text = client
            .get(format!("{}/metrics", first.base))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        text.lines()
            .find(|l| l.starts_with("dedupd_lease_renewals_total{outcome=\"renewed\"}"))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while renewed().await.unwrap_or(0.0) < 2.0 * FAILOVER_STREAMS as f64 {
        anyhow::ensure!(
            Instant::now() < deadline,
            "instance 0 never renewed its leases"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs_f64(rand::random::<f64>() * 2.5)).await;
    let killed_at = now_s();
    drop(first.child);
    let again = || -> Option<Vec<f64>> {
        let g = got.lock().expect("receiver state");
        let mut times = Vec::new();
        for requests in g.requests.values() {
            let t = requests
                .iter()
                .find(|(q, _)| q != "n=0")
                .map(|(_, at)| at - killed_at)?;
            times.push(t);
        }
        (times.len() == FAILOVER_STREAMS as usize).then_some(times)
    };
    let deadline = Instant::now() + Duration::from_secs(180);
    let times = loop {
        if let Some(t) = again() {
            break t;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "not every stream was delivered again within 180 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    for instance in others {
        instance.stop();
    }
    handle.stop(false).await;
    drop(redis);
    let mut times = times;
    times.sort_by(f64::total_cmp);
    Ok(times)
}
