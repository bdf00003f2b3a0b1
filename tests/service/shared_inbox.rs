//! The shared inbox (`gateway.inbox = "shared"`) with instances in this
//! process, on one clock: any instance ingests, any delivers, each stream
//! in order and one at a time, and every instance shows the whole inbox.

use std::collections::BTreeMap;
use std::time::Duration;

use dedupd::clock::ManualClock;
use dedupd::config::sources::InboxPlace;
use dedupd::config::{Backend, Secret};
use reqwest::Method;
use serde_json::Value;

use crate::support::app::{T0, TestApp, spawn_app_at};
use crate::support::gateway::{body, ids, settings};
use crate::support::receiver::{Behaviour, Receiver};
use crate::support::redis::RedisServer;

async fn shared_app(clock: &ManualClock, redis_url: &str, forward_to: &str) -> TestApp {
    let s = settings(forward_to);
    let url = redis_url.to_owned();
    spawn_app_at(clock.clone(), move |l| {
        l.settings.storage.backend = Backend::Redis;
        l.settings.storage.redis.url = Secret::new(url);
        l.settings.storage.redis.response_timeout = Duration::from_secs(5);
        l.settings.storage.redis.connect_timeout = Duration::from_secs(5);
        l.settings.gateway.inbox = InboxPlace::Shared;
        l.settings.gateway.inbox_buckets = 4;
        l.settings.sources.insert("sume".into(), s);
    })
    .await
}

async fn sources(app: &TestApp) -> Value {
    let res = app
        .request(Method::GET, "/v1/sources")
        .send()
        .await
        .unwrap();
    assert!(res.status().is_success());
    res.json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn any_instance_delivers_what_another_received_in_stream_order_once() {
    let receiver = Receiver::start(Behaviour::Delay(5)).await;
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let clock = ManualClock::new(T0);
    let a = shared_app(&clock, &server.url(), &receiver.url).await;
    let b = shared_app(&clock, &server.url(), &receiver.url).await;
    // Three streams, five events each, posted to either instance, newest
    // first in one stream; each one posted again to the other instance.
    let mut posted = Vec::new();
    for i in 0..5 {
        for run in ["run_a", "run_b", "run_c"] {
            let minute = if run == "run_c" { 4 - i } else { i };
            posted.push((format!("{run}-{minute}"), run, minute));
        }
    }
    for (n, (id, run, minute)) in posted.iter().enumerate() {
        let b_ = body(id, run, &format!("2026-11-29T10:0{minute}:00Z"));
        let (first, second) = if n % 2 == 0 { (&a, &b) } else { (&b, &a) };
        assert_eq!(first.ingest_ok(&b_).await["status"], "accepted", "{id}");
        assert_eq!(second.ingest_ok(&b_).await["status"], "duplicate", "{id}");
    }
    a.retrying_until("every event delivered", || async {
        b.event_ids("delivered").await.len() + b.event_ids("stale").await.len() == posted.len()
    })
    .await;
    // Each event reached the application once at most; per stream, in
    // created_at order (run_c's older events arrived after newer ones and
    // are stale if a newer one went first).
    let got = ids(&receiver.received());
    let mut seen = std::collections::HashSet::new();
    assert!(
        got.iter().all(|id| seen.insert(id.clone())),
        "twice: {got:?}"
    );
    let mut by_stream: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    for id in &got {
        let (run, minute) = id.split_once('-').unwrap();
        by_stream
            .entry(run)
            .or_default()
            .push(minute.parse().unwrap());
    }
    for (run, minutes) in &by_stream {
        assert!(
            minutes.windows(2).all(|w| w[0] < w[1]),
            "{run}: {minutes:?}"
        );
    }
    assert_eq!(by_stream["run_a"], [0, 1, 2, 3, 4]);
    assert_eq!(by_stream["run_b"], [0, 1, 2, 3, 4]);
    // Every instance shows the whole inbox.
    assert_eq!(sources(&a).await, sources(&b).await);
    assert_eq!(
        a.event_ids("delivered").await,
        b.event_ids("delivered").await
    );
    let delivered = a.event_ids("delivered").await.len();
    assert_eq!(delivered, got.len());
    drop(server);
}

/// Moving to the shared inbox keeps each stream's order: the heads the
/// local mode kept go with the events, so an event older than one
/// delivered before the move is stale after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_migration_carries_stream_heads_so_an_older_event_stays_stale() {
    use crate::support::app::start_again;
    use dedupd::clock::Clock;

    let receiver = Receiver::start(Behaviour::Delay(1)).await;
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let clock = ManualClock::new(T0);
    let local = shared_app(&clock, &server.url(), &receiver.url).await;
    let (mut loaded, dir, clock) = local.stop().await;
    // The same instance, first on its local inbox (the Redis backend's
    // claims, as a fleet before the move runs).
    loaded.settings.gateway.inbox = InboxPlace::Local;
    let local = start_again(loaded, dir, clock).await;
    local
        .ingest_ok(&body("new", "run_a", "2026-11-29T10:05:00Z"))
        .await;
    local
        .retrying_until("new delivered", || async {
            local.event_ids("delivered").await == ["new"]
        })
        .await;
    // The application goes down: this one stays pending.
    receiver.set(Behaviour::Always(503));
    local
        .ingest_ok(&body("pending", "run_b", "2026-11-29T10:00:00Z"))
        .await;
    local
        .retrying_until("pending tried", || async { receiver.received().len() >= 2 })
        .await;
    let (mut loaded, dir, clock) = local.stop().await;
    loaded.settings.gateway.inbox = InboxPlace::Shared;
    let moved = dedupd::store::move_inbox::move_to_shared(&loaded.settings, false, clock.now_ms())
        .await
        .unwrap();
    assert_eq!(moved.len(), 1);
    assert_eq!((moved[0].pending, moved[0].heads), (1, 1), "{moved:?}");
    receiver.set(Behaviour::Accept);
    let shared = start_again(loaded, dir, clock).await;
    shared
        .ingest_ok(&body("old", "run_a", "2026-11-29T10:01:00Z"))
        .await;
    shared
        .retrying_until("old settled and pending delivered", || async {
            shared.event_ids("stale").await == ["old"]
                && shared.event_ids("delivered").await == ["pending"]
        })
        .await;
    let got = ids(&receiver.received());
    assert_eq!(got.first().map(String::as_str), Some("new"));
    assert!(!got.contains(&"old".to_owned()), "{got:?}");
    assert_eq!(got.last().map(String::as_str), Some("pending"));
    // A provider's retry of the event delivered before the move is still
    // a duplicate: its dedupe record moved too.
    assert_eq!(
        shared
            .ingest_ok(&body("new", "run_a", "2026-11-29T10:05:00Z"))
            .await["status"],
        "duplicate"
    );
}

/// A bulk job on the shared inbox: every instance shows it, one runs it,
/// and when that one stops another takes it over and finishes it, each
/// event replayed once; an erasure made on one instance shows on the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bulk_job_is_run_by_one_instance_and_taken_over_by_another() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let clock = ManualClock::new(T0);
    let a = shared_app(&clock, &server.url(), &receiver.url).await;
    let b = shared_app(&clock, &server.url(), &receiver.url).await;
    for i in 0..6 {
        let b_ = body(
            &format!("ev-{i}"),
            &format!("run_{}", i % 3),
            &format!("2026-11-29T10:0{i}:00Z"),
        );
        assert_eq!(a.ingest_ok(&b_).await["status"], "accepted");
    }
    a.retrying_until("every event delivered", || async {
        b.event_ids("delivered").await.len() == 6
    })
    .await;
    // Erased on b, shown erased on a, and no longer matched by the job.
    let res = b
        .request(Method::DELETE, "/v1/sources/sume/events/ev-5")
        .send()
        .await
        .unwrap();
    assert!(res.status().is_success());
    assert_eq!(a.event_ids("erased").await, ["ev-5"]);

    // The destination fails for now: the replays wait.
    receiver.set(Behaviour::Always(503));
    let res = a
        .request(Method::POST, "/v1/sources/sume/jobs")
        .json(&serde_json::json!({ "kind": "redeliver", "filter": { "status": "delivered" } }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 201);
    let job: Value = res.json().await.unwrap();
    let id = job["id"].as_str().unwrap().to_owned();
    let show = |app: &TestApp| {
        let req = app.request(Method::GET, &format!("/v1/jobs/{id}"));
        async move { req.send().await.unwrap().json::<Value>().await.unwrap() }
    };
    crate::support::receiver::eventually("a replay tried", || async {
        receiver
            .received()
            .iter()
            .any(|r| r.header("dedupd-replay") == id)
    })
    .await;
    assert_eq!(show(&b).await["state"], "running");
    // a stops (its claim on the job goes with it); b finishes the job.
    let _ = a.stop().await;
    receiver.set(Behaviour::Accept);
    b.retrying_until("the job done", || async {
        show(&b).await["state"] == "done"
    })
    .await;
    let done = show(&b).await;
    assert_eq!(
        (&done["matched"], &done["delivered"], &done["failed"]),
        (&Value::from(5), &Value::from(5), &Value::from(0)),
        "{done}"
    );
    let mut acked: BTreeMap<String, usize> = BTreeMap::new();
    for r in receiver.received() {
        if r.header("dedupd-replay") == id {
            *acked.entry(r.header("webhook-id").to_owned()).or_default() += 1;
        }
    }
    assert_eq!(acked.len(), 5, "{acked:?}");
    assert!(!acked.contains_key("ev-5"), "{acked:?}");
}

/// An event this instance holds leased ahead (its body in memory, waiting
/// for the next token) and that another instance erases meanwhile is
/// never sent: before sending what it held, an instance on the shared
/// inbox checks that its lease still holds. (One instance's own erase
/// reaches its dispatcher directly: `lease_ahead.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_held_ahead_then_erased_by_another_instance_is_never_sent() {
    use dedupd::clock::Clock;
    use dedupd::store::inbox::{EraseOutcome, Inbox};
    use dedupd::store::redis::{RedisInbox, RedisOptions, SharedInboxOptions};

    let receiver = Receiver::start(Behaviour::Accept).await;
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let clock = ManualClock::new(T0);
    let mut s = settings(&receiver.url);
    s.rate_limit = Some("1/s".parse().unwrap());
    s.rate_burst = Some(1);
    let url = server.url();
    let a = spawn_app_at(clock.clone(), move |l| {
        l.settings.storage.backend = Backend::Redis;
        l.settings.storage.redis.url = Secret::new(url);
        l.settings.gateway.inbox = InboxPlace::Shared;
        l.settings.gateway.inbox_buckets = 4;
        l.settings.sources.insert("sume".into(), s);
    })
    .await;
    a.ingest_ok(&body("a_filler", "run_f", "2026-11-29T10:00:00Z"))
        .await;
    a.ingest_ok(&body("b_erased", "run_s", "2026-11-29T10:00:10Z"))
        .await;
    clock.advance(Duration::from_secs(1));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let now = loop {
        // The filler went with the first token; b_erased waits for the
        // next, leased ahead: pending, due at its lease's end.
        let now = a.clock.now_ms();
        let held =
            a.events("pending").await.iter().any(|e| {
                e["event_id"] == "b_erased" && e["due_at_ms"].as_u64().unwrap() > now + 1000
            });
        if held && a.event_ids("delivered").await == ["a_filler"] {
            break now;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "b_erased never held ahead"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };

    // Another instance erases it: written to Redis; this one is not told.
    let other = RedisInbox::connect(
        RedisOptions {
            url: server.url(),
            cluster_nodes: Vec::new(),
            prefix: "dedupd".into(),
            expiry_slack: Duration::from_secs(600),
            connect_timeout: Duration::from_secs(10),
            response_timeout: Duration::from_secs(10),
            durability: dedupd::domain::Durability::Server,
            replicas_timeout: Duration::from_secs(1),
            sentinels: Vec::new(),
            sentinel_master: String::new(),
        },
        SharedInboxOptions {
            buckets: 4,
            dedupe_window: Duration::from_secs(30 * 86_400),
            lease_grace: Duration::from_secs(10),
        },
    )
    .unwrap();
    assert_eq!(
        other
            .erase("sume", "b_erased", 3_600_000, now)
            .await
            .unwrap(),
        EraseOutcome::Erased
    );

    a.ingest_ok(&body("c_next", "run_c", "2026-11-29T10:00:20Z"))
        .await;
    a.retrying_until("c_next delivered", || async {
        a.event_ids("delivered")
            .await
            .contains(&"c_next".to_owned())
    })
    .await;
    assert_eq!(ids(&receiver.received()), ["a_filler", "c_next"]);
    assert_eq!(a.event_ids("erased").await, ["b_erased"]);
}
