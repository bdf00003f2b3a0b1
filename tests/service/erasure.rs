//! Erasure erases from the files, not only from the index (issue 50): once
//! `DELETE /v1/sources/S/events/ID` answers, nobody reading the files under
//! the data directory can get the event's body or stored headers back, by
//! searching them for the bytes, or by opening every seal found in them
//! with every key in the key file. At once, after a clean stop, and after
//! a restart. On a source with destinations, for every destination's copy.
//! Nor from a backup taken after the erasure (one taken before holds it).
//! With the shared inbox in a real Redis (`appendonly yes`), from its AOF
//! and snapshot too, once the rewrite dedupd asks for is done.

use std::path::Path;

use reqwest::{Method, StatusCode};
use serde_json::Value;

use crate::support::app::{TestApp, spawn_app_with, start_again};
use crate::support::gateway::{fan_out, invoice as event, post_with_customer as post};
use crate::support::receiver::{Behaviour, Receiver, eventually};
use crate::support::recover::recoverable;

/// What the erased event's body carries (a personal datum).
const BODY_MARKER: &str = "alice.body.7f3c9e@example.com";
/// What one of its stored headers carries.
const HEADER_MARKER: &str = "alice-header-51d2ab";
/// What an event that is not erased carries: still readable.
const KEPT_MARKER: &str = "bob.kept.0c8d41@example.com";

async fn erase(app: &TestApp, source: &str, id: &str) {
    let res = app
        .request(Method::DELETE, &format!("/v1/sources/{source}/events/{id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
}

/// The app with the source `sw` of two destinations (see
/// [`fan_out`]), on the data file, or with `redis` the shared inbox in
/// that Redis; and the destinations' receivers (billing, audit).
async fn fan_out_app(redis: Option<String>) -> (TestApp, Receiver, Receiver) {
    let billing = Receiver::start(Behaviour::Accept).await;
    let audit = Receiver::start(Behaviour::Accept).await;
    let s = fan_out(&billing.url, &audit.url);
    let app = spawn_app_with(move |l| {
        if let Some(url) = redis {
            l.settings.storage.backend = dedupd::config::Backend::Redis;
            l.settings.storage.redis.url = dedupd::config::Secret::new(url);
            l.settings.gateway.inbox = dedupd::config::sources::InboxPlace::Shared;
            l.settings.gateway.inbox_buckets = 2;
        }
        l.settings.sources.insert("sw".into(), s);
    })
    .await;
    (app, billing, audit)
}

/// Posts each (id, body marker, customer) to `sw` and waits until both
/// destinations have them all.
async fn post_delivered(
    app: &TestApp,
    billing: &Receiver,
    audit: &Receiver,
    events: &[(&str, &str, &str)],
) {
    for (id, marker, customer) in events {
        post(app, &event(id, marker), customer).await;
    }
    eventually("every event delivered to both", || async {
        billing.received().len() == events.len() && audit.received().len() == events.len()
    })
    .await;
}

/// Starts an erase job on `sw` of the events whose `/email` is `value`;
/// its id.
async fn erase_job(app: &TestApp, value: &str) -> String {
    let filter = serde_json::json!({ "status": "delivered", "field": "/email", "value": value });
    let res = app
        .request(Method::POST, "/v1/sources/sw/jobs")
        .json(&serde_json::json!({ "kind": "erase", "filter": filter }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    res.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// The job `id` as `GET /v1/jobs/ID` shows it.
async fn job(app: &TestApp, id: &str) -> Value {
    app.get_json(&format!("/v1/jobs/{id}")).await
}

/// The job `id` once it is no longer running.
async fn ended(app: &TestApp, id: &str) -> Value {
    eventually("the job to end", || async {
        job(app, id).await["state"] != "running"
    })
    .await;
    job(app, id).await
}

/// Waits until `marker` is out of every file under `dir` (Redis rewrites
/// its files in its own time); fails after `seconds`, saying `what` and
/// where it still is.
async fn out_of_files(dir: &Path, marker: &str, seconds: u64, what: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(seconds);
    loop {
        let found = recoverable(dir, marker);
        if found.is_empty() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: {marker} still readable after {seconds} s: {found:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// A real Redis keeping an append-only file synced at every write, with
/// `extra` arguments.
#[cfg(feature = "redis")]
async fn redis_with_aof(extra: &'static [&'static str]) -> crate::support::redis::RedisServer {
    tokio::task::spawn_blocking(move || {
        let mut args = vec!["--appendonly", "yes", "--appendfsync", "always"];
        args.extend_from_slice(extra);
        crate::support::redis::RedisServer::start_with(&args)
    })
    .await
    .unwrap()
}

/// A backup of `app` (`POST /v1/backup`) in the new directory `dir`.
async fn backup_to(app: &TestApp, dir: &Path) {
    let res = app
        .request(Method::POST, "/v1/backup")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    std::fs::create_dir(dir).unwrap();
    std::fs::write(dir.join("dedupd.backup"), res.bytes().await.unwrap()).unwrap();
}

async fn event_json(app: &TestApp, lane: &str, id: &str) -> Value {
    app.get_json(&format!("/v1/sources/{lane}/events/{id}"))
        .await
}

/// Neither marker of the erased event can be read back from `dir`.
fn assert_gone(dir: &Path, when: &str) {
    for marker in [BODY_MARKER, HEADER_MARKER] {
        let found = recoverable(dir, marker);
        assert!(found.is_empty(), "{when}: {marker} is readable: {found:?}");
    }
}

#[tokio::test]
async fn an_erased_event_cannot_be_read_back_from_any_file_of_the_data_file() {
    let (app, billing, audit) = fan_out_app(None).await;
    let dir = app.dir.path().to_owned();
    let events = [
        ("inv-1", BODY_MARKER, HEADER_MARKER),
        ("inv-2", KEPT_MARKER, "bob"),
    ];
    post_delivered(&app, &billing, &audit, &events).await;
    // A stop checkpoints them into the data file (before, they are in
    // the log): the erasure below must reach both.
    let (loaded, kept_dir, clock) = app.stop().await;
    let app = start_again(loaded, kept_dir, clock).await;
    // Stored and readable through the API, and through the files with
    // the key file (so the search below finds what is there).
    for lane in ["sw.billing", "sw.audit"] {
        let e = event_json(&app, lane, "inv-1").await;
        assert!(e["body"].as_str().unwrap().contains(BODY_MARKER), "{e}");
        assert!(e["headers"].to_string().contains(HEADER_MARKER), "{e}");
    }
    for marker in [BODY_MARKER, HEADER_MARKER] {
        assert!(!recoverable(&dir, marker).is_empty(), "{marker} is stored");
    }
    let backups = tempfile::TempDir::new().unwrap();
    let before = backups.path().join("before");
    backup_to(&app, &before).await;

    erase(&app, "sw", "inv-1").await;
    assert_gone(&dir, "at once");
    // A backup taken after the erasure holds neither the event nor its
    // key; one taken before holds both, for as long as it is kept (the
    // operations guide says so).
    let after = backups.path().join("after");
    backup_to(&app, &after).await;
    assert_gone(&after, "in a backup taken after it");
    assert!(!recoverable(&after, KEPT_MARKER).is_empty());
    for marker in [BODY_MARKER, HEADER_MARKER] {
        assert!(!recoverable(&before, marker).is_empty(), "{marker}");
    }
    for lane in ["sw.billing", "sw.audit"] {
        let e = event_json(&app, lane, "inv-1").await;
        assert_eq!(e["status"], "erased", "{e}");
        let kept = event_json(&app, lane, "inv-2").await;
        assert!(
            kept["body"].as_str().unwrap().contains(KEPT_MARKER),
            "{kept}"
        );
    }
    assert!(
        !recoverable(&dir, KEPT_MARKER).is_empty(),
        "the event not erased stays readable with its key"
    );

    let (loaded, kept_dir, clock) = app.stop().await;
    assert_gone(&dir, "after a clean stop");
    let app = start_again(loaded, kept_dir, clock).await;
    assert_gone(&dir, "after a restart");
    for lane in ["sw.billing", "sw.audit"] {
        let kept = event_json(&app, lane, "inv-2").await;
        assert!(
            kept["body"].as_str().unwrap().contains(KEPT_MARKER),
            "{kept}"
        );
        assert_eq!(event_json(&app, lane, "inv-1").await["status"], "erased");
    }
}

/// What an erase job's filter names: the person it erases.
const JOB_MARKER: &str = "carol.job.3e8a5d@example.com";

/// An erase job's filter names the person it erases. While the job runs,
/// its record holds the filter (it resumes after a restart); once it
/// ended, no file under the data directory gives the name back: not the
/// record, not an earlier version of it in the data file's free pages or
/// the log's old records, not a seal any key there opens. At once, after
/// a clean stop and after a restart, and the job is still listed.
#[tokio::test]
async fn an_erase_jobs_filter_cannot_be_read_back_from_any_file_once_it_ended() {
    let (app, billing, audit) = fan_out_app(None).await;
    let dir = app.dir.path().to_owned();
    let events = [
        ("inv-1", JOB_MARKER, "carol"),
        ("inv-2", KEPT_MARKER, "bob"),
    ];
    post_delivered(&app, &billing, &audit, &events).await;
    let id = erase_job(&app, JOB_MARKER).await;
    let done = ended(&app, &id).await;
    assert_eq!(
        (&done["state"], &done["erased"]),
        (&serde_json::json!("done"), &serde_json::json!(1)),
        "{done}"
    );
    let gone = |when: &str| {
        let found = recoverable(&dir, JOB_MARKER);
        assert!(
            found.is_empty(),
            "{when}: {JOB_MARKER} is readable: {found:?}"
        );
    };
    // The record says done once stored; the keys of the versions before
    // are shredded right after, before the runner takes the job for ended.
    out_of_files(&dir, JOB_MARKER, 30, "the versions before the last").await;
    gone("once the job ended");
    assert!(
        !recoverable(&dir, KEPT_MARKER).is_empty(),
        "the event not erased stays readable with its key"
    );
    let (loaded, kept_dir, clock) = app.stop().await;
    gone("after a clean stop");
    let app = start_again(loaded, kept_dir, clock).await;
    gone("after a restart");
    let listed = job(&app, &id).await;
    assert_eq!(listed["state"], "done", "{listed}");
    assert_eq!(listed["erased"], 1, "{listed}");
}

/// The same on the shared inbox in a real Redis that keeps an append-only
/// file (synced at every write) and snapshots: the erasure takes the body
/// out of Redis at once, and out of its files once the AOF rewrite and the
/// snapshot dedupd asks for are done (within `rewrite::EVERY` of the
/// erasure, plus the rewrite's own time: the test waits for them).
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_shared_inbox_an_erased_event_leaves_redis_and_its_files() {
    let mut server = redis_with_aof(&["--save", "3600 1"]).await;
    let (app, billing, audit) = fan_out_app(Some(server.url())).await;
    let events = [
        ("inv-1", BODY_MARKER, HEADER_MARKER),
        ("inv-2", KEPT_MARKER, "bob"),
    ];
    post_delivered(&app, &billing, &audit, &events).await;
    let redis_dir = server.dir().to_owned();
    // A snapshot taken before the erasure holds it too.
    let saved = std::process::Command::new("redis-cli")
        .args(["-s", server.socket.to_str().unwrap(), "save"])
        .output()
        .unwrap();
    assert!(saved.status.success());
    for marker in [BODY_MARKER, HEADER_MARKER] {
        assert!(
            !recoverable(&redis_dir, marker).is_empty(),
            "{marker} is in Redis's files"
        );
    }

    erase(&app, "sw", "inv-1").await;
    for lane in ["sw.billing", "sw.audit"] {
        let e = event_json(&app, lane, "inv-1").await;
        assert_eq!(e["status"], "erased", "{e}");
    }
    // dedupd's own data file never held it (the inbox is Redis's).
    assert_gone(app.dir.path(), "dedupd's data directory");
    // Redis rewrites its files in its own time: waited for.
    for marker in [BODY_MARKER, HEADER_MARKER] {
        out_of_files(&redis_dir, marker, 60, "Redis's files after the erasure").await;
    }
    assert_gone(&redis_dir, "once Redis rewrote its files");
    assert!(
        !recoverable(&redis_dir, KEPT_MARKER).is_empty(),
        "the event not erased is still in Redis's files"
    );

    let _server = tokio::task::spawn_blocking(move || {
        server.shutdown();
        assert_gone(&redis_dir, "after Redis's clean stop");
        server.start_again();
        assert_gone(&redis_dir, "after Redis's restart");
        server
    })
    .await
    .unwrap();
    // Redis loaded the event not erased back from its files.
    app.retrying_until("dedupd reads Redis again", || async {
        let e = event_json(&app, "sw.billing", "inv-2").await;
        e["body"].as_str().is_some_and(|b| b.contains(KEPT_MARKER))
    })
    .await;
    assert_eq!(
        event_json(&app, "sw.audit", "inv-1").await["status"],
        "erased"
    );
}

/// On the shared inbox, an erase job's filter (here one that matches
/// nothing, so no erasure asks Redis to rewrite) leaves Redis's files once
/// the job ended: its ending asks for the rewrite an erasure does.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_shared_inbox_an_erase_jobs_filter_leaves_redis_files_once_it_ended() {
    let server = redis_with_aof(&[]).await;
    let (app, billing, audit) = fan_out_app(Some(server.url())).await;
    post_delivered(&app, &billing, &audit, &[("inv-2", KEPT_MARKER, "bob")]).await;
    let id = erase_job(&app, JOB_MARKER).await;
    // Its record reached the AOF (synced at every write); without the
    // rewrite its end asks for, it stays there (`appendonly.aof.1.incr.aof`
    // holds it in plain: checked). Not asserted here: the job may have
    // ended, and Redis rewritten, before a look.
    let redis_dir = server.dir().to_owned();
    let done = ended(&app, &id).await;
    out_of_files(
        &redis_dir,
        JOB_MARKER,
        60,
        "Redis's files after the job ended",
    )
    .await;
    assert!(
        !recoverable(&redis_dir, KEPT_MARKER).is_empty(),
        "the event not erased is still in Redis's files"
    );
    assert_eq!(
        (&done["state"], &done["matched"]),
        (&serde_json::json!("done"), &serde_json::json!(0)),
        "{done}"
    );
}

/// On the shared inbox, a rewrite of Redis's files that an erasure asked
/// for, folded behind the one before (at most one round every 10 s), and
/// not made when dedupd stopped, is made by the next start: the request
/// is kept in Redis, not only in the process that erased.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_shared_inbox_a_rewrite_owed_when_dedupd_stopped_is_made_at_its_next_start() {
    let server = redis_with_aof(&[]).await;
    let (app, billing, audit) = fan_out_app(Some(server.url())).await;
    let events = [
        ("inv-1", BODY_MARKER, "carol"),
        ("inv-2", JOB_MARKER, "dave"),
    ];
    post_delivered(&app, &billing, &audit, &events).await;
    let redis_dir = server.dir().to_owned();
    // The first erasure's round, at once.
    erase(&app, "sw", "inv-1").await;
    out_of_files(&redis_dir, BODY_MARKER, 60, "the first erasure's rewrite").await;
    // The second waits for the next round (10 s after the first), and
    // dedupd stops before it.
    erase(&app, "sw", "inv-2").await;
    let (loaded, dir, clock) = app.stop().await;
    assert!(
        !recoverable(&redis_dir, JOB_MARKER).is_empty(),
        "the round owed was not made before the stop"
    );
    let _app = start_again(loaded, dir, clock).await;
    out_of_files(
        &redis_dir,
        JOB_MARKER,
        30,
        "Redis's files after the next start",
    )
    .await;
}

/// The counter of rewrites owed is dedupd's key, but anything may write
/// it: a value that is not a count neither stops the rewrite an erasure
/// asks for nor stays.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_shared_inbox_a_counter_that_is_not_a_number_stops_no_rewrite() {
    let server = redis_with_aof(&[]).await;
    let redis = |args: &[&str]| {
        let out = std::process::Command::new("redis-cli")
            .args(["-s", server.socket.to_str().unwrap()])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    redis(&["SET", "dedupd:{i}:rewrite_wanted", "not a number"]);
    let (app, billing, audit) = fan_out_app(Some(server.url())).await;
    let events = [
        ("inv-1", BODY_MARKER, "carol"),
        ("inv-2", KEPT_MARKER, "bob"),
    ];
    post_delivered(&app, &billing, &audit, &events).await;
    erase(&app, "sw", "inv-1").await;
    out_of_files(
        server.dir(),
        BODY_MARKER,
        60,
        "Redis's files after the erasure",
    )
    .await;
    eventually("the counter taken away once the round was made", || async {
        redis(&["EXISTS", "dedupd:{i}:rewrite_wanted"]) == "0"
    })
    .await;
}
