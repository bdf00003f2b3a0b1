//! Several destinations per source, with filters: each event goes to the
//! destinations whose filters it matches, each with its own delivery
//! state, order and limits; a destination that hangs holds back only its
//! own deliveries; an event no destination takes is kept as `filtered`.
//! Real receivers, the app's clock moved by the test.

use dedupd::config::sources::SourceSettings;
use reqwest::Method;
use serde_json::{Value, json};

use crate::support::app::{TestApp, spawn_app_with};
use crate::support::gateway::{DESTINATION, SECRET, ids};
use crate::support::receiver::{Behaviour, Receiver};

fn settings(runs: &str, billing: &str, audit: &str) -> SourceSettings {
    toml::from_str(&format!(
        r#"
        scheme = "sume"
        secrets = ["{SECRET}"]
        event_id = "body:/request_id"
        created_at = "body:/created_at"
        stream = "body:/run_id"
        destination_secret = "{DESTINATION}"
        backoff_min = "10ms"
        backoff_max = "40ms"
        max_attempts = 3

        [[destinations]]
        name = "runs"
        forward_to = "{runs}"
        filter = {{ "body:/type" = ["run.updated", "run.completed"] }}

        [[destinations]]
        name = "billing"
        forward_to = "{billing}"
        filter = {{ "body:/type" = "invoice.*" }}
        max_in_flight = 2

        [[destinations]]
        name = "audit"
        forward_to = "{audit}"
        filter = {{ "body:/type" = ["run.*", "invoice.*"] }}
        "#
    ))
    .unwrap()
}

fn event(id: &str, kind: &str, run: &str, minute: u32) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "request_id": id, "type": kind, "run_id": run,
        "created_at": format!("2026-11-29T10:{minute:02}:00Z"),
    }))
    .unwrap()
}

#[tokio::test]
async fn each_destination_gets_what_its_filter_takes_and_a_hanging_one_holds_back_only_itself() {
    fan_out(None).await;
}

/// The same on the shared inbox in a real Redis: each destination's lane
/// in its source's buckets, an event written into every lane it matched
/// by one script.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_shared_inbox_each_destination_gets_what_its_filter_takes() {
    let server = tokio::task::spawn_blocking(crate::support::redis::RedisServer::start)
        .await
        .unwrap();
    fan_out(Some(server.url())).await;
}

async fn fan_out(redis: Option<String>) {
    let runs = Receiver::start(Behaviour::Accept).await;
    let billing = Receiver::start(Behaviour::Hold(None)).await;
    let audit = Receiver::start(Behaviour::Accept).await;
    let s = settings(&runs.url, &billing.url, &audit.url);
    let app = spawn_app_with(move |l| {
        if let Some(url) = redis {
            l.settings.storage.backend = dedupd::config::Backend::Redis;
            l.settings.storage.redis.url = dedupd::config::Secret::new(url);
            l.settings.gateway.inbox = dedupd::config::sources::InboxPlace::Shared;
            l.settings.gateway.inbox_buckets = 4;
        }
        l.settings.sources.insert("sume".into(), s);
    })
    .await;
    let posted = [
        ("r1", "run.updated", "run_1", 1),
        ("i1", "invoice.paid", "run_1", 2),
        ("r2", "run.completed", "run_1", 3),
        ("i2", "invoice.voided", "run_2", 4),
        ("x1", "user.created", "run_3", 5),
    ];
    for (id, kind, run, minute) in posted {
        let res = app
            .post_signed_at("sume", &event(id, kind, run, minute), app.now_s(), SECRET)
            .await;
        assert_eq!(res.status(), 200);
        let v: Value = res.json().await.unwrap();
        // No destination takes user.created.
        let answer = if id == "x1" { "filtered" } else { "accepted" };
        assert_eq!(v["status"], answer, "{id}: {v}");
    }
    // A provider's retry is a duplicate, whichever destinations took it.
    for (id, kind, run, minute) in [posted[1], posted[4]] {
        let v: Value = app
            .post_signed_at("sume", &event(id, kind, run, minute), app.now_s(), SECRET)
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(v["status"], "duplicate", "{id}: {v}");
    }
    // runs and audit deliver while billing hangs on both its requests.
    app.retrying_until("runs and audit delivered", || async {
        runs.received().len() == 2 && audit.received().len() == 4
    })
    .await;
    app.retrying_until("billing holds two", || async { billing.held() == 2 })
        .await;
    assert_eq!(ids(&runs.received()), ["r1", "r2"]);
    let audited = ids(&audit.received());
    // Per stream in created_at order: run_1's three, in order.
    let run_1: Vec<&String> = audited.iter().filter(|i| *i != "i2").collect();
    assert_eq!(run_1, ["r1", "i1", "r2"], "{audited:?}");
    assert!(audited.contains(&"i2".to_owned()));
    // Each forward says which destination it is for.
    for got in runs.received() {
        assert_eq!(
            (
                got.header("dedupd-source"),
                got.header("dedupd-destination")
            ),
            ("sume", "runs")
        );
    }
    // Each destination's deliveries are listed in its own lane; the one
    // no destination took is filtered, kept, never sent.
    // (A delivery is listed once its settle is written, just after the
    // receiver answered.)
    app.retrying_until("runs and audit settled", || async {
        app.ids_of("sume.runs", "delivered").await.len() == 2
            && app.ids_of("sume.audit", "delivered").await.len() == 4
    })
    .await;
    assert_eq!(app.ids_of("sume.runs", "delivered").await, ["r1", "r2"]);
    assert_eq!(app.ids_of("sume.billing", "pending").await, ["i1", "i2"]);
    assert_eq!(app.ids_of("sume", "filtered").await, ["x1"]);
    assert!(
        runs.received()
            .iter()
            .chain(&audit.received())
            .all(|r| r.header("webhook-id") != "x1")
    );

    // The source names its destinations and where each is listed; a lane
    // says whose it is, with its own delivery state (billing's two held).
    let sume = app.source_state("sume").await;
    assert_eq!(
        (&sume["configured"], &sume["delivery"], &sume["destination"]),
        (&json!(true), &Value::Null, &Value::Null),
        "{sume}"
    );
    assert_eq!(
        sume["destinations"],
        json!([
            {"name": "runs", "lane": "sume.runs"},
            {"name": "billing", "lane": "sume.billing"},
            {"name": "audit", "lane": "sume.audit"},
        ])
    );
    let lane = app.source_state("sume.billing").await;
    assert_eq!(
        (
            &lane["destination"],
            &lane["lane_of"],
            &lane["delivery"]["in_flight"],
            &lane["delivery"]["max_in_flight"]
        ),
        (&json!("billing"), &json!("sume"), &json!(2), &json!(2)),
        "{lane}"
    );
    // billing comes back: its two are delivered, nothing else again.
    billing.release();
    app.retrying_until("billing delivered", || async {
        app.ids_of("sume.billing", "delivered").await.len() == 2
    })
    .await;
    assert_eq!(ids(&runs.received()), ["r1", "r2"]);
    assert_eq!(audit.received().len(), 4);
    // Erasing an event erases every destination's copy of it.
    let res = app
        .request(Method::DELETE, "/v1/sources/sume/events/i1")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(app.ids_of("sume.billing", "erased").await, ["i1"]);
    assert_eq!(app.ids_of("sume.audit", "erased").await, ["i1"]);
    assert_eq!(
        app.ids_of("sume.runs", "erased").await,
        Vec::<String>::new()
    );
    // The CLI names a destination with --destination.
    let address = app.address.clone();
    let out = tokio::task::spawn_blocking(move || {
        crate::support::process::dedupd()
            .args([
                "events",
                "list",
                "--source",
                "sume",
                "--destination",
                "billing",
                "--status",
                "delivered",
                "--json",
                "--url",
            ])
            .arg(&address)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let got: Vec<&str> = v["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event_id"].as_str().unwrap())
        .collect();
    // (i1 was erased just now.)
    assert_eq!(got, ["i2"]);
    // Filtered events hold bodies too: an erase job takes them.
    let job: Value = app
        .request(Method::POST, "/v1/sources/sume/jobs")
        .json(&json!({ "kind": "erase", "filter": { "status": "filtered" } }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = job["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{job}"))
        .to_owned();
    app.retrying_until("the erase job done", || async {
        let j: Value = app
            .request(Method::GET, &format!("/v1/jobs/{id}"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        j["state"] == "done" && j["erased"] == 1
    })
    .await;
    assert_eq!(app.ids_of("sume", "filtered").await, Vec::<String>::new());
    assert!(
        app.ids_of("sume", "erased")
            .await
            .contains(&"x1".to_owned())
    );
    // A lane takes no posts: only the source does.
    let res = app
        .post_signed_at(
            "sume.runs",
            &event("z", "run.updated", "run_9", 9),
            app.now_s(),
            SECRET,
        )
        .await;
    assert_eq!(res.status(), 404);
}

#[test]
fn check_config_names_each_destination_mistake() {
    let dir = tempfile::TempDir::new().unwrap();
    let file = dir.path().join("routes.toml");
    std::fs::write(
        &file,
        format!(
            r#"
[sources.sume]
scheme = "sume"
secrets = ["s"]
event_id = "body:/request_id"
forward_to = "http://127.0.0.1:3000/"
destination_secret = "{DESTINATION}"

[[sources.sume.destinations]]
name = "runs"
forward_to = "ftp://runs/"
filter = {{ "body:type" = "run.*" }}

[[sources.sume.destinations]]
name = "runs"
forward_to = "http://127.0.0.1:3001/"

[[sources.sume.destinations]]
name = "bad name"
forward_to = "http://127.0.0.1:3002/"

[[sources.sume.destinations]]
name = "hdr"
forward_to = "http://127.0.0.1:3003/"
filter = {{ "header:x-kind" = "a" }}
max_in_flight = 0
"#
        ),
    )
    .unwrap();
    let out = crate::support::process::check_config(&file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    for (key, says) in [
        ("sources.sume.forward_to", "not with destinations"),
        ("sources.sume.destinations.0.filter", "not a JSON pointer"),
        ("sources.sume.destinations.1.name", "named twice"),
        ("sources.sume.destinations.2.name", "1 to 64 of"),
        (
            "sources.sume.destinations.3.filter",
            "not covered by the sume signature",
        ),
        ("sources.sume.destinations.3.max_in_flight", "must be 1 to"),
    ] {
        assert!(
            stderr.lines().any(|l| l.contains(key) && l.contains(says)),
            "{key}: {says}\n{stderr}"
        );
    }
}

/// check-config names a source's lane of a destination still configured
/// as nothing removed; once the destination is gone from the file, its
/// pending events are named as those of a removed source.
#[tokio::test]
async fn check_config_does_not_call_a_configured_destinations_lane_removed() {
    let runs = Receiver::start(Behaviour::Accept).await;
    let billing = Receiver::start(Behaviour::Always(503)).await;
    let audit = Receiver::start(Behaviour::Accept).await;
    let s = settings(&runs.url, &billing.url, &audit.url);
    let app = spawn_app_with(move |l| {
        l.settings.sources.insert("sume".into(), s);
    })
    .await;
    let res = app
        .post_signed_at(
            "sume",
            &event("i1", "invoice.paid", "run_1", 1),
            app.now_s(),
            SECRET,
        )
        .await;
    assert_eq!(res.status(), 200);
    assert_eq!(app.ids_of("sume.billing", "pending").await, ["i1"]);
    let (loaded, dir, _) = app.stop().await;
    let config = |billing: &str| {
        format!(
            r#"
data_path = {:?}

[sources.sume]
scheme = "sume"
secrets = ["{SECRET}"]
event_id = "body:/request_id"
destination_secret = "{DESTINATION}"

[[sources.sume.destinations]]
name = "audit"
forward_to = "{}"
{billing}
"#,
            loaded.settings.data_path.display().to_string(),
            audit.url
        )
    };
    let file = dir.path().join("routes.toml");
    let kept = format!(
        "\n[[sources.sume.destinations]]\nname = \"billing\"\nforward_to = \"{}\"\n",
        billing.url
    );
    std::fs::write(&file, config(&kept)).unwrap();
    let out = crate::support::process::check_config(&file);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(!stdout.contains("removed source"), "{stdout}");
    std::fs::write(&file, config("")).unwrap();
    let out = crate::support::process::check_config(&file);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("removed source sume.billing: 1 pending event(s)"),
        "{stdout}"
    );
}

/// Destinations that each sign with a secret of their own need none of
/// the source's: check-config takes such a file (it used to fail it
/// without a word).
#[test]
fn destinations_with_their_own_secrets_need_no_source_secret() {
    let dir = tempfile::TempDir::new().unwrap();
    let file = dir.path().join("own.toml");
    std::fs::write(
        &file,
        format!(
            r#"
[sources.sume]
scheme = "sume"
secrets = ["s"]
event_id = "body:/request_id"

[[sources.sume.destinations]]
name = "runs"
forward_to = "http://127.0.0.1:3001/"
destination_secret = "{DESTINATION}"

[[sources.sume.destinations]]
name = "billing"
forward_to = "http://127.0.0.1:3002/"
destination_secret = "whsec_eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHg="
"#
        ),
    )
    .unwrap();
    let out = crate::support::process::check_config(&file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    // A lane is no URL to post to: only its source is.
    assert!(
        stdout.contains(
            "# destination billing of source sume: listed as sume.billing -> http://127.0.0.1:3002/"
        ),
        "{stdout}"
    );
    assert!(!stdout.contains("/ingest/sume.billing"), "{stdout}");
    assert!(
        stdout.contains("# source sume: Sume signatures, /ingest/sume -> its destinations"),
        "{stdout}"
    );
}

/// A source that moves from `forward_to` to destinations none of which is
/// `default` no longer delivers its own lane: its events pending from
/// before are then as a removed source's (not delivered, listable, reaped
/// after `gateway.dead_retention`), not pending for ever.
#[tokio::test]
async fn pending_events_of_a_source_that_no_longer_delivers_are_reaped_as_a_removed_sources() {
    use crate::support::gateway::{body, gateway_app};
    use crate::support::receiver::eventually;
    use std::time::Duration;

    let down = Receiver::start(Behaviour::Always(503)).await;
    let app = gateway_app(&down.url, |s| s.max_attempts = 100).await;
    app.ingest_ok(&body("old", "run_1", "2026-11-29T10:00:00Z"))
        .await;
    eventually("old was tried", || async { !down.received().is_empty() }).await;
    let (mut loaded, dir, clock) = app.stop().await;
    let runs = Receiver::start(Behaviour::Accept).await;
    let source = loaded.settings.sources.get_mut("sume").unwrap();
    source.forward_to = None;
    source.destinations =
        vec![toml::from_str(&format!("name = \"runs\"\nforward_to = \"{}\"\n", runs.url)).unwrap()];
    loaded.settings.reaper.interval = Duration::from_millis(20);
    loaded.settings.gateway.dead_retention = Duration::from_secs(3600);
    // check-config says so.
    let file = dir.path().join("moved.toml");
    std::fs::write(
        &file,
        format!(
            "data_path = {:?}\n\n[sources.sume]\nscheme = \"sume\"\nsecrets = [\"{SECRET}\"]\n\
             event_id = \"body:/request_id\"\ndestination_secret = \"{DESTINATION}\"\n\n\
             [[sources.sume.destinations]]\nname = \"runs\"\nforward_to = \"{}\"\n",
            loaded.settings.data_path.display().to_string(),
            runs.url
        ),
    )
    .unwrap();
    let out = crate::support::process::check_config(&file);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("# source sume: 1 pending event(s)")
            && stdout.contains("none of which is named default"),
        "{stdout}"
    );
    let app = crate::support::app::start_again(loaded, dir, clock).await;
    assert_eq!(app.ids_of("sume", "pending").await, ["old"]);
    app.clock.advance(Duration::from_secs(3601));
    eventually("the old pending event is reaped", || async {
        app.ids_of("sume", "pending").await.is_empty()
    })
    .await;
    assert!(runs.received().is_empty());
}

/// A destination's `rate_burst` without a `rate_limit` of its own is its
/// source's rate with that burst, or, with no rate at all, a mistake
/// check-config names (it used to be dropped without a word).
#[test]
fn a_destinations_rate_burst_is_not_dropped() {
    let dir = tempfile::TempDir::new().unwrap();
    let file = dir.path().join("burst.toml");
    std::fs::write(
        &file,
        format!(
            r#"
[sources.sume]
scheme = "sume"
secrets = ["s"]
event_id = "body:/request_id"
destination_secret = "{DESTINATION}"

[[sources.sume.destinations]]
name = "runs"
forward_to = "http://127.0.0.1:3001/"
rate_burst = 5
"#
        ),
    )
    .unwrap();
    let out = crate::support::process::check_config(&file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("sources.sume.destinations.0.rate_burst")
                && l.contains("needs rate_limit")),
        "{stderr}"
    );
}

/// A destination renamed (or removed) keeps its copies in its old lane
/// until they are reaped: a provider's retry of an event only that
/// destination took is still a duplicate after the restart (not
/// delivered again to the destination that took over its filter), and
/// erasing the event reaches the old lane's copy. A redelivery into a
/// source that delivers only through its destinations is refused, naming
/// them.
#[tokio::test]
async fn a_renamed_destination_keeps_its_retries_duplicates_and_its_copies_erasable() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let config = |names: [&str; 2]| two_destinations(names, [&receiver.url; 2], X_THEN_Y, "");
    let first = config(["old", "keep"]);
    let app = spawn_app_with(move |l| {
        l.settings.sources.insert("sume".into(), first);
    })
    .await;
    let e1 = event("e1", "x.created", "run_1", 1);
    assert_eq!(post(&app, e1.clone()).await, "accepted");
    app.retrying_until("e1 delivered by old", || async {
        app.ids_of("sume.old", "delivered").await == ["e1"]
    })
    .await;
    let res = app
        .request(Method::POST, "/v1/sources/sume/events/e1/redeliver")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 409);
    let v: Value = res.json().await.unwrap();
    assert_eq!(v["code"], "delivers_through_destinations", "{v}");
    assert!(
        v["detail"]
            .as_str()
            .unwrap()
            .contains("/v1/sources/sume.old"),
        "{v}"
    );

    // Renamed: `old` is now `fresh`, with the same filter.
    let app = restart_with(app, config(["fresh", "keep"])).await;
    assert_eq!(post(&app, e1).await, "duplicate");
    assert_eq!(
        app.ids_of("sume.fresh", "pending").await,
        Vec::<String>::new()
    );
    // Erasing e1 reaches the copy in the old lane.
    let res = app
        .request(Method::DELETE, "/v1/sources/sume/events/e1")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(app.ids_of("sume.old", "erased").await, ["e1"]);
    assert_eq!(ids(&receiver.received()), ["e1"]);
}

/// Posts `body` to the source `sume`, signed; its answer's status.
/// An event no destination takes is answered `filtered`, still with 200
/// (the provider must not retry it), so a provider's test delivery shows
/// what became of it; its retry is a duplicate, and each is counted under
/// its own outcome.
#[tokio::test]
async fn an_event_no_destination_takes_is_answered_filtered_and_its_retry_a_duplicate() {
    let x = Receiver::start(Behaviour::Accept).await;
    let y = Receiver::start(Behaviour::Accept).await;
    let s = two_destinations(["x", "y"], [&x.url, &y.url], X_THEN_Y, "");
    let app = spawn_app_with(move |l| {
        l.settings.sources.insert("sume".into(), s);
    })
    .await;
    let res = app
        .post_signed_at(
            "sume",
            &event("z1", "z.created", "run_1", 1),
            app.now_s(),
            SECRET,
        )
        .await;
    assert_eq!(res.status(), 200);
    let v: Value = res.json().await.unwrap();
    assert_eq!(v, json!({ "status": "filtered", "event_id": "z1" }));
    assert_eq!(
        post(&app, event("z1", "z.created", "run_1", 1)).await,
        "duplicate"
    );
    assert_eq!(
        post(&app, event("x1", "x.created", "run_1", 2)).await,
        "accepted"
    );
    assert_eq!(app.ids_of("sume", "filtered").await, ["z1"]);
    let scrape = app.scrape().await;
    let ingested = |outcome| {
        crate::metrics::count(
            &scrape,
            "dedupd_ingest_total",
            &[("source", "sume"), ("outcome", outcome)],
        )
    };
    assert_eq!(
        (
            ingested("filtered"),
            ingested("duplicate"),
            ingested("accepted")
        ),
        (1.0, 1.0, 1.0)
    );
}

async fn post(app: &TestApp, body: Vec<u8>) -> String {
    let v: Value = app
        .post_signed_at("sume", &body, app.now_s(), SECRET)
        .await
        .json()
        .await
        .unwrap();
    v["status"].as_str().unwrap().to_owned()
}

/// Two instances on one shared inbox during a rolling change of the
/// destinations: the one still on the old configuration (`old`, `keep`)
/// looked at the inbox's lanes before the new instance (`fresh`, `keep`)
/// wrote its first event into `sume.fresh`. A provider's retry of that
/// event, posted to the old instance, is still a duplicate: not stored
/// again in `sume.old` and delivered a second time; and erasing it there
/// reaches the copy in `sume.fresh`.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_shared_inbox_a_retry_to_an_instance_on_the_old_destinations_is_a_duplicate() {
    use dedupd::clock::ManualClock;

    use crate::support::app::{T0, spawn_app_at};

    let server = tokio::task::spawn_blocking(crate::support::redis::RedisServer::start)
        .await
        .unwrap();
    let receiver = Receiver::start(Behaviour::Accept).await;
    let config = |names: [&str; 2]| two_destinations(names, [&receiver.url; 2], X_THEN_Y, "");
    let clock = ManualClock::new(T0);
    let on = |names: [&str; 2]| {
        let (s, url) = (config(names), server.url());
        move |l: &mut dedupd::config::Loaded| {
            l.settings.storage.backend = dedupd::config::Backend::Redis;
            l.settings.storage.redis.url = dedupd::config::Secret::new(url);
            l.settings.gateway.inbox = dedupd::config::sources::InboxPlace::Shared;
            l.settings.gateway.inbox_buckets = 4;
            l.settings.sources.insert("sume".into(), s);
        }
    };
    let old = spawn_app_at(clock.clone(), on(["old", "keep"])).await;
    // The old instance's first event: it looks at the inbox's lanes then.
    assert_eq!(
        post(&old, event("e0", "y.created", "run_1", 1)).await,
        "accepted"
    );
    // The new instance starts and takes e1 into its new lane.
    let new = spawn_app_at(clock.clone(), on(["fresh", "keep"])).await;
    let e1 = event("e1", "x.created", "run_1", 2);
    assert_eq!(post(&new, e1.clone()).await, "accepted");
    // The provider's retry reaches the old instance.
    assert_eq!(post(&old, e1).await, "duplicate");
    new.retrying_until("e0 and e1 delivered", || async {
        new.ids_of("sume.fresh", "delivered").await == ["e1"]
            && new.ids_of("sume.keep", "delivered").await == ["e0"]
    })
    .await;
    assert_eq!(
        old.ids_of("sume.old", "pending").await,
        Vec::<String>::new()
    );
    assert_eq!(
        receiver.received().len(),
        2,
        "{:?}",
        ids(&receiver.received())
    );
    // Erasing e1 on the old instance reaches the new lane's copy.
    let res = old
        .request(Method::DELETE, "/v1/sources/sume/events/e1")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(new.ids_of("sume.fresh", "erased").await, ["e1"]);
}

/// Erasing an event through the lane of a destination since removed
/// (`sume.old`, still listable) reaches every copy of it: the one in the
/// lane of the destination still configured (`sume.keep`) too.
#[tokio::test]
async fn erasing_through_a_removed_destinations_lane_reaches_every_copy() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let config = |names: [&str; 2]| two_destinations(names, [&receiver.url; 2], X_THEN_BOTH, "");
    let first = config(["old", "keep"]);
    let app = spawn_app_with(move |l| {
        l.settings.sources.insert("sume".into(), first);
    })
    .await;
    assert_eq!(
        post(&app, event("e1", "x.created", "run_1", 1)).await,
        "accepted"
    );
    app.retrying_until("e1 delivered by both", || async {
        app.ids_of("sume.old", "delivered").await == ["e1"]
            && app.ids_of("sume.keep", "delivered").await == ["e1"]
    })
    .await;
    let app = restart_with(app, config(["fresh", "keep"])).await;
    let res = app
        .request(Method::DELETE, "/v1/sources/sume.old/events/e1")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(app.ids_of("sume.old", "erased").await, ["e1"]);
    assert_eq!(app.ids_of("sume.keep", "erased").await, ["e1"]);
}

/// `dedupd inbox migrate` from a local inbox holding lanes: a lane's
/// pending event moves into its lane in the shared inbox, and a provider's
/// retry of any event — pending in one lane, delivered in another, only
/// delivered, or filtered — is a duplicate there; nothing is sent twice.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_migration_of_lanes_keeps_every_retry_a_duplicate() {
    use crate::support::app::start_again;
    use dedupd::clock::Clock;
    use dedupd::config::sources::InboxPlace;

    let server = tokio::task::spawn_blocking(crate::support::redis::RedisServer::start)
        .await
        .unwrap();
    let runs = Receiver::start(Behaviour::Always(503)).await;
    let audit = Receiver::start(Behaviour::Accept).await;
    let s = two_destinations(
        ["runs", "audit"],
        [&runs.url, &audit.url],
        X_THEN_BOTH,
        "max_attempts = 100",
    );
    let url = server.url();
    let app = spawn_app_with(move |l| {
        l.settings.storage.backend = dedupd::config::Backend::Redis;
        l.settings.storage.redis.url = dedupd::config::Secret::new(url);
        l.settings.gateway.inbox = InboxPlace::Local;
        l.settings.gateway.inbox_buckets = 4;
        l.settings.sources.insert("sume".into(), s);
    })
    .await;
    let posted = [
        event("e1", "x.created", "run_1", 1),
        event("e2", "y.created", "run_1", 2),
        event("e3", "z.created", "run_1", 3),
    ];
    // No destination takes z.created.
    for (body, answer) in posted.iter().zip(["accepted", "accepted", "filtered"]) {
        assert_eq!(post(&app, body.clone()).await, answer);
    }
    app.retrying_until("audit delivered e1 and e2", || async {
        app.ids_of("sume.audit", "delivered").await.len() == 2
    })
    .await;
    let (mut loaded, dir, clock) = app.stop().await;
    loaded.settings.gateway.inbox = InboxPlace::Shared;
    let moved = dedupd::store::move_inbox::move_to_shared(&loaded.settings, false, clock.now_ms())
        .await
        .unwrap();
    let pending: u64 = moved.iter().map(|m| m.pending).sum();
    assert_eq!(pending, 1, "{moved:?}");
    runs.set(Behaviour::Accept);
    let app = start_again(loaded, dir, clock).await;
    for body in &posted {
        assert_eq!(post(&app, body.clone()).await, "duplicate");
    }
    app.retrying_until("runs delivered e1", || async {
        app.ids_of("sume.runs", "delivered").await == ["e1"]
    })
    .await;
    // (No stream: audit sent them in either order.)
    let mut audited = ids(&audit.received());
    audited.sort();
    assert_eq!(audited, ["e1", "e2"]);
}

/// A Sume source with two destinations named `names`, forwarding to
/// `urls`, taking what `filters` (TOML values for `body:/type`) take;
/// `extra` adds source settings.
fn two_destinations(
    names: [&str; 2],
    urls: [&str; 2],
    filters: [&str; 2],
    extra: &str,
) -> SourceSettings {
    toml::from_str(&format!(
        r#"
        scheme = "sume"
        secrets = ["{SECRET}"]
        event_id = "body:/request_id"
        destination_secret = "{DESTINATION}"
        {extra}
        [[destinations]]
        name = "{}"
        forward_to = "{}"
        filter = {{ "body:/type" = {} }}
        [[destinations]]
        name = "{}"
        forward_to = "{}"
        filter = {{ "body:/type" = {} }}
        "#,
        names[0], urls[0], filters[0], names[1], urls[1], filters[1],
    ))
    .unwrap()
}

/// Stops `app` and starts it again on the same data with `source` as
/// `sume`: a restart after a change of destinations.
async fn restart_with(app: TestApp, source: SourceSettings) -> TestApp {
    let (mut loaded, dir, clock) = app.stop().await;
    loaded.settings.sources.insert("sume".into(), source);
    crate::support::app::start_again(loaded, dir, clock).await
}

/// `x.*` to the first destination, `y.*` to the second.
const X_THEN_Y: [&str; 2] = [r#""x.*""#, r#""y.*""#];
/// `x.*` to the first destination, both kinds to the second.
const X_THEN_BOTH: [&str; 2] = [r#""x.*""#, r#"["x.*", "y.*"]"#];
