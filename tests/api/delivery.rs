//! The delivery engine under stress: destinations that hang or fail,
//! sources that compete, a store that fails the head update, sources that
//! leave the configuration. Every app runs on a manual clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dedupd::clock::Millis;
use dedupd::config::sources::SourceSettings;
use dedupd::domain::{CreatedAt, Fingerprint, ScopedKey, Token, Ttl};
use dedupd::store::{
    ApplyResult, ClaimOutcome, ClaimView, DoneOutcome, ExtendOutcome, Head, PurgeReport,
    ReleaseOutcome, Store, StoreError, WriteStats,
};
use reqwest::{Method, StatusCode};
use serde_json::Value;

use crate::gateway::{SECRET, body, gateway_app, ids, settings};
use crate::helpers::{TestApp, assert_problem, spawn_app_with, spawn_shared_app_with};
use crate::receiver::{Behaviour, Receiver, eventually};

/// Changes a test source's settings.
type Tweak = Box<dyn FnOnce(&mut SourceSettings)>;

/// An app with one source per `(name, receiver url, tweak)`.
async fn app_with_sources(sources: Vec<(&str, String, Tweak)>) -> TestApp {
    let built: Vec<(String, SourceSettings)> = sources
        .into_iter()
        .map(|(name, url, tweak)| {
            let mut s = settings(&url);
            tweak(&mut s);
            (name.to_owned(), s)
        })
        .collect();
    spawn_app_with(move |l| {
        for (name, s) in built {
            l.settings.sources.insert(name, s);
        }
    })
    .await
}

impl TestApp {
    async fn post_to(&self, source: &str, body: &[u8]) {
        let res = self
            .post_signed_at(source, body, self.now_s(), SECRET)
            .await;
        assert_eq!(res.status(), StatusCode::OK);
    }

    async fn ids_of(&self, source: &str, status: &str) -> Vec<String> {
        let v: Value = self
            .request(
                Method::GET,
                &format!("/v1/sources/{source}/events?status={status}&limit=500"),
            )
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        v["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["event_id"].as_str().unwrap().to_owned())
            .collect()
    }

    /// `GET /v1/sources/{source}`.
    async fn source_state(&self, source: &str) -> Value {
        let res = self
            .request(Method::GET, &format!("/v1/sources/{source}"))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        res.json().await.unwrap()
    }
}

#[tokio::test]
async fn a_hanging_receiver_holds_only_its_own_sources_slots() {
    let slow = Receiver::start(Behaviour::Hold(None)).await;
    let fast = Receiver::start(Behaviour::Accept).await;
    let app = app_with_sources(vec![
        ("slow", slow.url.clone(), Box::new(|s| s.max_in_flight = 4)),
        ("fast", fast.url.clone(), Box::new(|_| {})),
    ])
    .await;
    for i in 0..10 {
        app.post_to(
            "slow",
            &body(
                &format!("s{i}"),
                &format!("run_{i}"),
                "2026-11-29T10:00:00Z",
            ),
        )
        .await;
    }
    eventually("the slow source's slots are all held", || async {
        slow.held() == 4
    })
    .await;
    app.post_to("fast", &body("f", "run_f", "2026-11-29T10:00:00Z"))
        .await;
    eventually("the other source's event is delivered", || async {
        app.ids_of("fast", "delivered").await == ["f"]
    })
    .await;
    assert_eq!(slow.held(), 4, "the slow source is still hanging");
    assert_eq!(slow.received().len(), 4, "never more than its own limit");
    let state = app.source_state("slow").await;
    assert_eq!(state["delivery"]["in_flight"], 4, "{state}");
    assert_eq!(state["delivery"]["max_in_flight"], 4, "{state}");
    slow.release();
    eventually("the slow source catches up", || async {
        app.ids_of("slow", "delivered").await.len() == 10
    })
    .await;
}

#[tokio::test]
async fn one_hanging_stream_does_not_block_the_other_streams_of_its_source() {
    let receiver = Receiver::start(Behaviour::Hold(Some("run_hang"))).await;
    let app = gateway_app(&receiver.url, |_| {}).await;
    app.ingest_ok(&body("h1", "run_hang", "2026-11-29T10:01:00Z"))
        .await;
    app.ingest_ok(&body("h2", "run_hang", "2026-11-29T10:02:00Z"))
        .await;
    for i in 0..5 {
        app.ingest_ok(&body(
            &format!("o{i}"),
            &format!("run_{i}"),
            "2026-11-29T10:00:00Z",
        ))
        .await;
    }
    eventually("the other streams are delivered", || async {
        app.event_ids("delivered").await.len() == 5
    })
    .await;
    assert_eq!(
        receiver.held(),
        1,
        "only the hanging stream's first event is out"
    );
    let mut pending = app.event_ids("pending").await;
    pending.sort();
    assert_eq!(pending, ["h1", "h2"]);
    receiver.release();
    eventually("the hanging stream finishes in order", || async {
        app.event_ids("delivered").await.len() == 7
    })
    .await;
    let hang: Vec<String> = ids(&receiver.received())
        .into_iter()
        .filter(|id| id.starts_with('h'))
        .collect();
    assert_eq!(hang, ["h1", "h2"]);
}

#[tokio::test]
async fn a_failing_destination_pauses_its_source_and_one_probe_tests_recovery() {
    let receiver = Receiver::start(Behaviour::Always(503)).await;
    let app = gateway_app(&receiver.url, |s| {
        s.pause_after = 3;
        s.max_in_flight = 1;
        s.max_attempts = 100;
    })
    .await;
    for i in 0..6 {
        app.ingest_ok(&body(
            &format!("e{i}"),
            &format!("run_{i}"),
            "2026-11-29T10:00:00Z",
        ))
        .await;
    }
    // The clock stands still: after three failures the source pauses, and
    // nothing else is tried while it is paused.
    eventually("paused after three failures", || async {
        app.source_state("sume").await["delivery"]["state"] == "paused"
    })
    .await;
    assert_eq!(receiver.received().len(), 3);
    let state = app.source_state("sume").await;
    assert_eq!(state["delivery"]["consecutive_failures"], 3, "{state}");
    let attempts: u64 = app
        .events("pending")
        .await
        .iter()
        .map(|e| e["attempts"].as_u64().unwrap())
        .sum();
    assert_eq!(attempts, 3, "the waiting events kept their attempts");

    // The pause (backoff_min, 10 ms) ends: one probe, which fails, and the
    // source pauses again.
    app.clock.advance(Duration::from_millis(10));
    eventually("one probe was sent", || async {
        receiver.received().len() == 4
    })
    .await;
    eventually("paused again", || async {
        app.source_state("sume").await["delivery"]["state"] == "paused"
    })
    .await;
    assert_eq!(receiver.received().len(), 4, "a single probe");

    // The destination recovers: the next probe succeeds and everything goes.
    receiver.set(Behaviour::Accept);
    app.retrying_until("all delivered", || async {
        app.event_ids("delivered").await.len() == 6
    })
    .await;
    assert_eq!(
        app.source_state("sume").await["delivery"]["state"],
        "running"
    );
    let delivered = app.events("delivered").await;
    let untried = delivered.iter().filter(|e| e["attempts"] == 1).count();
    assert!(
        untried >= 2,
        "events never tried while paused needed one attempt: {delivered:?}"
    );
}

/// A store that refuses stream-head updates while `failing` is set.
#[derive(Debug)]
struct FailingApply {
    inner: Arc<dyn Store>,
    failing: Arc<AtomicBool>,
}

#[async_trait]
impl Store for FailingApply {
    async fn claim(
        &self,
        key: &ScopedKey,
        ttl: Ttl,
        fp: Option<Fingerprint>,
        now: Millis,
    ) -> Result<ClaimOutcome, StoreError> {
        self.inner.claim(key, ttl, fp, now).await
    }
    async fn done(
        &self,
        key: &ScopedKey,
        token: Token,
        ttl: Ttl,
        now: Millis,
    ) -> Result<DoneOutcome, StoreError> {
        self.inner.done(key, token, ttl, now).await
    }
    async fn release(
        &self,
        key: &ScopedKey,
        token: Token,
        now: Millis,
    ) -> Result<ReleaseOutcome, StoreError> {
        self.inner.release(key, token, now).await
    }
    async fn extend(
        &self,
        key: &ScopedKey,
        token: Token,
        ttl: Ttl,
        now: Millis,
    ) -> Result<ExtendOutcome, StoreError> {
        self.inner.extend(key, token, ttl, now).await
    }
    async fn get(&self, key: &ScopedKey, now: Millis) -> Result<Option<ClaimView>, StoreError> {
        self.inner.get(key, now).await
    }
    async fn apply(
        &self,
        stream: &ScopedKey,
        event_id: &ScopedKey,
        created_at: CreatedAt,
        retention_ms: u64,
        now: Millis,
    ) -> Result<ApplyResult, StoreError> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(StoreError::unavailable("injected: head update refused"));
        }
        self.inner
            .apply(stream, event_id, created_at, retention_ms, now)
            .await
    }
    async fn head(&self, stream: &ScopedKey, now: Millis) -> Result<Option<Head>, StoreError> {
        self.inner.head(stream, now).await
    }
    async fn purge_expired(&self, now: Millis, limit: u64) -> Result<PurgeReport, StoreError> {
        self.inner.purge_expired(now, limit).await
    }
    async fn next_expiry(&self) -> Result<Option<Millis>, StoreError> {
        self.inner.next_expiry().await
    }
    async fn ready(&self) -> Result<(), StoreError> {
        self.inner.ready().await
    }
    fn write_stats(&self) -> WriteStats {
        self.inner.write_stats()
    }
    async fn close(&self) {
        self.inner.close().await;
    }
}

#[tokio::test]
async fn an_event_is_settled_delivered_only_after_its_stream_head_moved() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let failing = Arc::new(AtomicBool::new(true));
    let flag = failing.clone();
    let url = receiver.url.clone();
    let s = settings(&url);
    let app = spawn_shared_app_with(
        move |l| {
            l.settings.sources.insert("sume".into(), s);
        },
        move |file| {
            Arc::new(FailingApply {
                inner: file,
                failing: flag,
            })
        },
    )
    .await;
    app.ingest_ok(&body("new", "run_1", "2026-11-29T10:05:00Z"))
        .await;
    eventually("the application got the event", || async {
        !receiver.received().is_empty()
    })
    .await;
    // The head cannot move: the event is not settled as delivered, and an
    // older event of its stream that arrives now must wait behind it.
    app.ingest_ok(&body("old", "run_1", "2026-11-29T10:00:00Z"))
        .await;
    let pending = app.event_ids("pending").await;
    assert!(pending.contains(&"new".to_owned()), "{pending:?}");
    assert!(app.event_ids("delivered").await.is_empty());
    // The store recovers: the head moves, then the event settles; the
    // older event is found stale and never sent.
    failing.store(false, Ordering::SeqCst);
    app.retrying_until("new delivered, old stale", || async {
        app.event_ids("delivered").await == ["new"] && app.event_ids("stale").await == ["old"]
    })
    .await;
    assert_eq!(
        ids(&receiver.received()),
        ["new"],
        "sent once, and nothing older after it"
    );
}

#[tokio::test]
async fn events_of_a_removed_source_stay_listable_and_go_after_their_retention() {
    let receiver = Receiver::start(Behaviour::Always(503)).await;
    let app = gateway_app(&receiver.url, |s| s.max_attempts = 2).await;
    app.ingest_ok(&body("dead1", "run_1", "2026-11-29T10:00:00Z"))
        .await;
    app.retrying_until("dead", || async {
        app.event_ids("dead").await == ["dead1"]
    })
    .await;
    // One failed attempt, and the clock stands still: it stays pending.
    app.ingest_ok(&body("pend1", "run_2", "2026-11-29T10:00:00Z"))
        .await;
    eventually("pend1 was tried", || async {
        app.events("pending")
            .await
            .first()
            .is_some_and(|e| e["attempts"] == 1)
    })
    .await;
    let (mut loaded, dir, clock, real_time) = app.stop().await;
    loaded.settings.sources.clear();
    loaded.settings.reaper.interval = Duration::from_millis(20);
    loaded.settings.gateway.dead_retention = Duration::from_secs(3600);
    let tried = receiver.received().len();
    let app = crate::helpers::start_again(loaded, dir, clock, real_time).await;

    // Without the source: listable, not delivered, redeliverable by name.
    assert_eq!(app.event_ids("pending").await, ["pend1"]);
    assert_eq!(app.event_ids("dead").await, ["dead1"]);
    let state = app.source_state("sume").await;
    assert_eq!(state["configured"], false, "{state}");
    let res = app
        .request(Method::POST, "/v1/sources/sume/events/dead1/redeliver")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::ACCEPTED);
    let res = app
        .post_signed_at(
            "sume",
            &body("x", "run_9", "2026-11-29T10:00:00Z"),
            app.now_s(),
            SECRET,
        )
        .await;
    assert_problem(res, StatusCode::NOT_FOUND, "unknown_source").await;
    app.clock.advance(Duration::from_secs(60));
    let mut pending = app.event_ids("pending").await;
    pending.sort();
    assert_eq!(pending, ["dead1", "pend1"]);

    // After the dead-event retention the reaper removes them, and then the
    // source is unknown.
    app.clock.advance(Duration::from_secs(3600));
    eventually("the removed source's events are reaped", || async {
        app.request(Method::GET, "/v1/sources/sume/events?status=pending")
            .send()
            .await
            .unwrap()
            .status()
            == StatusCode::NOT_FOUND
    })
    .await;
    assert_eq!(receiver.received().len(), tried, "nothing was delivered");
}
