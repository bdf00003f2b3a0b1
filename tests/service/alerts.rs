//! Alerts (`[alerts]`): dedupd's operational events, delivered as the
//! internal source `dedupd-alerts` to a real receiver, signed with the
//! alerts' destination secret and rate-limited per kind and source.

use std::time::Duration;

use dedupd::config::alerts::AlertSettings;
use dedupd::config::sources::SourceSettings;
use dedupd::gateway::signature::Scheme;
use dedupd::gateway::signature::Verifier;
use dedupd::store::redb::faults::FaultPlan;
use reqwest::StatusCode;
use serde_json::Value;
use serde_json::json;

use crate::support::app::TestApp;
use crate::support::app::assert_problem;
use crate::support::app::spawn_app_with;
use crate::support::app::spawn_faulty_app_with;
use crate::support::gateway::SECRET;
use crate::support::gateway::body;
use crate::support::gateway::settings;
use crate::support::receiver::Behaviour;
use crate::support::receiver::Receiver;
use crate::support::receiver::eventually;

/// The alerts' destination secret (not the source's).
const ALERT_SECRET: &str = "whsec_QWxlcnRzU2lnbmluZ1NlY3JldDEyMzQ1Ng==";

/// `alerts.every` in these tests.
const EVERY: Duration = Duration::from_secs(300);

/// An app with source `sume` delivering to `forward_to` (tweaked) and
/// alerts going to `alerts_to`.
async fn alert_app(
    forward_to: &str,
    alerts_to: &str,
    tweak: impl FnOnce(&mut SourceSettings),
) -> TestApp {
    let mut s = settings(forward_to);
    tweak(&mut s);
    let alerts = alert_settings(alerts_to);
    spawn_app_with(move |l| {
        l.settings.sources.insert("sume".into(), s);
        l.settings.alerts = Some(alerts);
    })
    .await
}

/// `[alerts]` sending to `alerts_to`, retrying as fast as the test
/// sources do.
fn alert_settings(alerts_to: &str) -> AlertSettings {
    toml::from_str(&format!(
        r#"
        forward_to = "{alerts_to}"
        destination_secret = "{ALERT_SECRET}"
        every = "{}"
        backoff_min = "10ms"
        backoff_max = "40ms"
        "#,
        humantime::format_duration(EVERY)
    ))
    .unwrap()
}

/// The alerts of `kind` the receiver got, in order, each checked to carry
/// a signature the alerts' destination secret verifies.
fn alerts_of(receiver: &Receiver, app: &TestApp, kind: &str) -> Vec<Value> {
    let verifier = Verifier::new(
        Scheme::StandardWebhooks,
        &[ALERT_SECRET.to_owned()],
        Duration::from_secs(300),
    )
    .unwrap();
    receiver
        .received()
        .into_iter()
        .filter_map(|got| {
            let lookup = |name: &str| got.headers.get(name).map(String::as_str);
            verifier
                .verify(&lookup, &got.body, app.now_s())
                .unwrap_or_else(|e| panic!("an alert that does not verify ({e}): {got:?}"));
            assert_eq!(got.header("dedupd-source"), "dedupd-alerts");
            let v: Value = serde_json::from_slice(&got.body).unwrap();
            (v["type"] == kind).then_some(v)
        })
        .collect()
}

#[tokio::test]
async fn a_source_whose_breaker_opens_and_closes_sends_signed_paused_and_resumed_alerts() {
    let alerts = Receiver::start(Behaviour::Accept).await;
    let dest = Receiver::start(Behaviour::Always(503)).await;
    let app = alert_app(&dest.url, &alerts.url, |s| {
        s.pause_after = 2;
        s.max_in_flight = 1;
        s.max_attempts = 100;
    })
    .await;
    for i in 0..3 {
        app.ingest_ok(&body(
            &format!("e{i}"),
            &format!("run_{i}"),
            "2026-11-29T10:00:00Z",
        ))
        .await;
    }
    eventually("a source.paused alert", || async {
        !alerts_of(&alerts, &app, "source.paused").is_empty()
    })
    .await;
    let paused = &alerts_of(&alerts, &app, "source.paused")[0];
    assert_eq!(paused["source"], "sume", "{paused}");
    assert_eq!(paused["suppressed"], 0, "{paused}");
    assert_eq!(paused["detail"]["consecutive_failures"], 2, "{paused}");
    assert!(
        paused["at"].as_str().unwrap().starts_with("2027-"),
        "{paused}"
    );

    dest.set(Behaviour::Accept);
    app.retrying_until("a source.resumed alert", || async {
        !alerts_of(&alerts, &app, "source.resumed").is_empty()
    })
    .await;
    assert_eq!(
        alerts_of(&alerts, &app, "source.resumed")[0]["source"],
        "sume"
    );
    // The operator API lists the alerts as any source's events.
    app.retrying_until("alerts listed as delivered", || async {
        app.ids_of("dedupd-alerts", "delivered").await.len() == 2
    })
    .await;
}

#[tokio::test]
async fn an_event_going_dead_sends_an_event_dead_alert_naming_it() {
    let alerts = Receiver::start(Behaviour::Accept).await;
    let dest = Receiver::start(Behaviour::Always(503)).await;
    let app = alert_app(&dest.url, &alerts.url, |s| {
        s.max_attempts = 2;
        s.pause_after = 0;
    })
    .await;
    app.ingest_ok(&body("doomed", "run_1", "2026-11-29T10:00:00Z"))
        .await;
    app.retrying_until("an event.dead alert", || async {
        !alerts_of(&alerts, &app, "event.dead").is_empty()
    })
    .await;
    let dead = &alerts_of(&alerts, &app, "event.dead")[0];
    assert_eq!(dead["source"], "sume", "{dead}");
    assert_eq!(dead["detail"]["event_id"], "doomed", "{dead}");
    assert_eq!(dead["detail"]["stream"], "run_1", "{dead}");
    assert_eq!(dead["detail"]["attempts"], 2, "{dead}");
    assert!(
        dead["detail"]["error"].as_str().unwrap().contains("503"),
        "{dead}"
    );
}

#[tokio::test]
async fn a_flapping_breaker_sends_one_alert_per_interval_and_then_one_counting_the_rest() {
    let alerts = Receiver::start(Behaviour::Accept).await;
    let dest = Receiver::start(Behaviour::Always(503)).await;
    let app = alert_app(&dest.url, &alerts.url, |s| {
        s.pause_after = 1;
        s.max_in_flight = 1;
        s.max_attempts = 100;
    })
    .await;
    let state = || async { app.source_state("sume").await["delivery"]["state"].clone() };
    app.ingest_ok(&body("f0", "run_0", "2026-11-29T10:00:00Z"))
        .await;
    eventually("paused", || async { state().await == "paused" }).await;
    // Three more flaps: resumed, then paused again by a new failing event.
    for i in 1..=3 {
        dest.set(Behaviour::Accept);
        app.retrying_until("resumed", || async { state().await == "running" })
            .await;
        dest.set(Behaviour::Always(503));
        app.ingest_ok(&body(
            &format!("f{i}"),
            &format!("run_{i}"),
            "2026-11-29T10:00:00Z",
        ))
        .await;
        eventually("paused again", || async { state().await == "paused" }).await;
    }
    eventually("the first of each kind", || async {
        alerts_of(&alerts, &app, "source.paused").len() == 1
            && alerts_of(&alerts, &app, "source.resumed").len() == 1
    })
    .await;
    assert_eq!(alerts.received().len(), 2, "the flaps were folded");

    // The interval ends: the last pause goes out, counting the two before
    // it; the last resume, counting one.
    app.clock.advance(EVERY);
    eventually("the folded alerts", || async {
        alerts_of(&alerts, &app, "source.paused").len() == 2
            && alerts_of(&alerts, &app, "source.resumed").len() == 2
    })
    .await;
    let paused = &alerts_of(&alerts, &app, "source.paused")[1];
    assert_eq!(paused["suppressed"], 2, "{paused}");
    let resumed = &alerts_of(&alerts, &app, "source.resumed")[1];
    assert_eq!(resumed["suppressed"], 1, "{resumed}");
    // Counted by what became of each: on the local inbox, folded by this
    // instance alone.
    let text = app
        .request(reqwest::Method::GET, "/metrics")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for (kind, outcome, n) in [
        ("source.paused", "sent", 2),
        ("source.paused", "folded", 3),
        ("source.resumed", "sent", 2),
        ("source.resumed", "folded", 2),
        ("source.paused", "gone", 0),
    ] {
        let line = format!("dedupd_alerts_total{{kind=\"{kind}\",outcome=\"{outcome}\"}} {n}");
        assert!(text.contains(&line), "{line} in:\n{text}");
    }
}

#[tokio::test]
async fn a_failing_or_hanging_alert_endpoint_does_not_delay_the_sources_deliveries() {
    for endpoint in [Behaviour::Always(503), Behaviour::Hold(None)] {
        let alerts = Receiver::start(endpoint).await;
        let dest = Receiver::start(Behaviour::FailTimes(1)).await;
        let app = alert_app(&dest.url, &alerts.url, |s| {
            s.pause_after = 1;
            s.max_in_flight = 1;
            s.max_attempts = 100;
        })
        .await;
        for i in 0..5 {
            app.ingest_ok(&body(
                &format!("e{i}"),
                &format!("run_{i}"),
                "2026-11-29T10:00:00Z",
            ))
            .await;
        }
        app.retrying_until("every event delivered", || async {
            app.event_ids("delivered").await.len() == 5
        })
        .await;
        assert!(
            !alerts.received().is_empty(),
            "{endpoint:?}: the alert was tried"
        );
        assert!(
            app.ids_of("dedupd-alerts", "delivered").await.is_empty(),
            "{endpoint:?}: no alert got through"
        );
        alerts.release();
    }
}

#[tokio::test]
async fn the_alerts_source_cannot_be_posted_to() {
    let alerts = Receiver::start(Behaviour::Accept).await;
    let app = alert_app(&alerts.url, &alerts.url, |_| {}).await;
    let res = app
        .post_signed_at(
            "dedupd-alerts",
            &body("x", "run_1", "2026-11-29T10:00:00Z"),
            app.now_s(),
            SECRET,
        )
        .await;
    assert_problem(res, StatusCode::NOT_FOUND, "unknown_source").await;
}

#[tokio::test]
async fn a_backlog_older_than_backlog_after_sends_one_backlog_stale_alert() {
    let alerts = Receiver::start(Behaviour::Accept).await;
    let dest = Receiver::start(Behaviour::Always(503)).await;
    let app = alert_app(&dest.url, &alerts.url, |s| {
        s.pause_after = 0;
        s.max_attempts = 1000;
        s.backoff_min = Duration::from_secs(3600);
        s.backoff_max = Duration::from_secs(3600);
    })
    .await;
    app.ingest_ok(&body("old", "run_1", "2026-11-29T10:00:00Z"))
        .await;
    // The default alerts.backlog_after is 15 minutes.
    app.clock.advance(Duration::from_secs(14 * 60));
    app.ingest_ok(&body("new", "run_2", "2026-11-29T10:00:00Z"))
        .await;
    app.clock.advance(Duration::from_secs(2 * 60));
    eventually("a backlog.stale alert", || async {
        !alerts_of(&alerts, &app, "backlog.stale").is_empty()
    })
    .await;
    let stale = &alerts_of(&alerts, &app, "backlog.stale")[0];
    assert_eq!(stale["source"], "sume", "{stale}");
    assert_eq!(stale["detail"]["pending"], 2, "{stale}");
    assert_eq!(
        stale["detail"]["oldest_pending_age_ms"],
        16 * 60_000,
        "{stale}"
    );
}

#[tokio::test]
async fn a_full_disk_sends_store_degraded_kept_in_memory_until_it_frees_then_store_recovered() {
    let alerts = Receiver::start(Behaviour::Accept).await;
    let plan = FaultPlan::new();
    let to = alerts.url.clone();
    let app = spawn_faulty_app_with(
        move |l| l.settings.alerts = Some(alert_settings(&to)),
        plan.clone(),
    )
    .await;
    plan.set_full(true);
    let res = app.claim("during", json!({})).await;
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    // /readyz sees the turn (so does the alerts' own look, once a
    // second); the alert cannot be stored while the disk is full.
    eventually("not ready", || async {
        app.client
            .get(app.url("/readyz"))
            .send()
            .await
            .unwrap()
            .status()
            == StatusCode::SERVICE_UNAVAILABLE
    })
    .await;
    plan.set_full(false);
    eventually("store.degraded, then store.recovered", || async {
        alerts_of(&alerts, &app, "store.degraded").len() == 1
            && alerts_of(&alerts, &app, "store.recovered").len() == 1
    })
    .await;
    let bodies: Vec<Value> = alerts
        .received()
        .iter()
        .map(|r| serde_json::from_slice(&r.body).unwrap())
        .collect();
    assert_eq!(bodies[0]["type"], "store.degraded", "{bodies:?}");
    assert_eq!(bodies[1]["type"], "store.recovered", "{bodies:?}");
    assert!(bodies[0].get("source").is_none(), "{bodies:?}");
    // Each instance tells of the store as it reaches it: they name it.
    let instance = format!(":{}", std::process::id());
    for b in &bodies {
        assert!(
            b["detail"]["instance"]
                .as_str()
                .is_some_and(|i| i.ends_with(&instance) && i.len() > instance.len()),
            "{bodies:?}"
        );
    }
}
