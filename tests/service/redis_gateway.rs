//! The gateway on the Redis backend: ingest that does not need Redis, and
//! several instances delivering one stream in turn.

use std::time::Duration;

use dedupd::clock::Clock;
use dedupd::config::Backend;
use dedupd::config::Secret;

use crate::support::app::TestApp;
use crate::support::app::spawn_app_with;
use crate::support::gateway::body;
use crate::support::gateway::ids;
use crate::support::gateway::settings;
use crate::support::receiver::Behaviour;
use crate::support::receiver::Receiver;
use crate::support::receiver::eventually;
use crate::support::redis::RedisServer;
async fn redis_gateway_app(redis_url: String, forward_to: &str) -> TestApp {
    let s = settings(forward_to);
    spawn_app_with(move |l| {
        l.settings.storage.backend = Backend::Redis;
        l.settings.storage.redis.url = Secret::new(redis_url);
        l.settings.storage.redis.response_timeout = Duration::from_secs(5);
        l.settings.storage.redis.connect_timeout = Duration::from_secs(5);
        l.settings.sources.insert("sume".into(), s);
    })
    .await
}

#[tokio::test]
async fn with_redis_down_a_new_event_is_accepted_and_delivered_once_redis_returns() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let mut server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let app = redis_gateway_app(server.url(), &receiver.url).await;
    server = tokio::task::spawn_blocking(move || {
        server.stop();
        server
    })
    .await
    .unwrap();

    let b = body("while_down", "run_1", "2026-11-29T10:00:00Z");
    assert_eq!(app.ingest_ok(&b).await["status"], "accepted");
    assert_eq!(app.ingest_ok(&b).await["status"], "duplicate");
    // Delivery waits for Redis (no attempt is counted meanwhile).
    for _ in 0..5 {
        app.clock.advance(Duration::from_millis(50));
        tokio::task::yield_now().await;
    }
    eventually("tried against the store", || async {
        app.events("pending").await[0]["last_error"].is_string()
    })
    .await;
    assert!(receiver.received().is_empty());
    assert_eq!(app.events("pending").await[0]["attempts"], 0);

    server = tokio::task::spawn_blocking(move || {
        server.restart();
        server
    })
    .await
    .unwrap();
    app.retrying_until("delivered after Redis returns", || async {
        app.event_ids("delivered").await == ["while_down"]
    })
    .await;
    assert_eq!(ids(&receiver.received()), ["while_down"]);
    drop(server);
}

/// Moves both apps' clocks until `check` holds (30 s at most).
async fn both_until<F, Fut>(a: &TestApp, b: &TestApp, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !check().await {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        a.clock.advance(Duration::from_millis(50));
        b.clock.set(a.clock.now_ms());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_never_deliver_one_stream_concurrently_or_out_of_order() {
    let receiver = Receiver::start(Behaviour::Delay(30)).await;
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let a = redis_gateway_app(server.url(), &receiver.url).await;
    let b = redis_gateway_app(server.url(), &receiver.url).await;
    // The provider's retries reach both instances, in different orders:
    // each instance sees every event of two streams, some twice.
    let events: Vec<(String, String, String)> = (0..8)
        .flat_map(|i| {
            ["run_x", "run_y"].map(|run| {
                (
                    format!("{run}-{i}"),
                    run.to_owned(),
                    format!("2026-11-29T10:{:02}:00Z", i * 5),
                )
            })
        })
        .collect();
    for (n, ev) in events.iter().enumerate() {
        if n % 3 != 0 {
            a.ingest_ok(&body(&ev.0, &ev.1, &ev.2)).await;
        }
    }
    for ev in events.iter().rev() {
        b.ingest_ok(&body(&ev.0, &ev.1, &ev.2)).await;
    }
    for ev in events.iter().step_by(3) {
        a.ingest_ok(&body(&ev.0, &ev.1, &ev.2)).await;
    }
    both_until(&a, &b, "every event settled on both instances", || async {
        a.event_ids("pending").await.is_empty() && b.event_ids("pending").await.is_empty()
    })
    .await;

    let (per_run, _) = receiver.max_concurrency();
    assert_eq!(
        per_run, 1,
        "one delivery per stream at a time, across instances"
    );
    let got = ids(&receiver.received());
    for run in ["run_x", "run_y"] {
        let order: Vec<usize> = got
            .iter()
            .filter(|id| id.starts_with(run))
            .map(|id| id.rsplit('-').next().unwrap().parse().unwrap())
            .collect();
        assert!(
            order.windows(2).all(|w| w[0] < w[1]),
            "{run}: never an older event after a newer one, never twice: {order:?}"
        );
        assert_eq!(order.last(), Some(&7), "{run}: the newest event arrives");
    }
    drop(server);
}

#[tokio::test]
async fn a_redeliver_job_replays_an_event_whose_id_is_as_long_as_ids_may_be() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let app = redis_gateway_app(server.url(), &receiver.url).await;
    // 512 bytes, the longest id ingest takes: its replay's claim must
    // still be a valid key.
    let long = "L".repeat(512);
    for (id, run) in [(long.as_str(), "run_1"), ("short", "run_2")] {
        app.ingest_ok(&body(id, run, "2026-11-29T10:00:00Z")).await;
    }
    eventually("both delivered", || async {
        app.event_ids("delivered").await.len() == 2
    })
    .await;
    let res = app
        .request(reqwest::Method::POST, "/v1/sources/sume/jobs")
        .json(&serde_json::json!({ "kind": "redeliver", "filter": { "status": "delivered" } }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 201);
    let job: serde_json::Value = res.json().await.unwrap();
    let id = job["id"].as_str().unwrap().to_owned();
    let show = || async {
        app.request(reqwest::Method::GET, &format!("/v1/jobs/{id}"))
            .send()
            .await
            .unwrap()
            .json::<serde_json::Value>()
            .await
            .unwrap()
    };
    eventually("the job done", || async { show().await["state"] == "done" }).await;
    let done = show().await;
    assert_eq!(
        (&done["matched"], &done["delivered"], &done["failed"]),
        (
            &serde_json::Value::from(2),
            &serde_json::Value::from(2),
            &serde_json::Value::from(0)
        ),
        "{done}"
    );
    let mut replayed: Vec<String> = receiver
        .received()
        .iter()
        .filter(|r| r.header("dedupd-replay") == id)
        .map(|r| r.header("webhook-id").to_owned())
        .collect();
    replayed.sort();
    assert_eq!(replayed, [long, "short".to_owned()]);
    drop(server);
}
