//! `systemctl reload`: the configuration read again while serving. In
//! process, through the call SIGHUP makes (`Reloader::reload`, from a file
//! the test writes); and once with a real `dedupd serve` sent SIGHUP by
//! `dedupd reload --pid`, as the unit's `ExecReload=` does.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use reqwest::Method;
use reqwest::StatusCode;
use serde_json::Value;
use serde_json::json;

use crate::metrics::count;
use crate::support::app::TestApp;
use crate::support::app::spawn_app_with;
use crate::support::app::with_tokens;
use crate::support::gateway::SECRET;
use crate::support::gateway::body;
use crate::support::gateway::gateway_app;
use crate::support::gateway::settings_toml;
use crate::support::receiver::Behaviour;
use crate::support::receiver::Receiver;
use crate::support::receiver::eventually;

/// The secret a provider signs with before a rotation.
const OLD: &str = "sume_old_secret";
/// The secret it signs with after.
const NEW: &str = "sume_new_secret";

/// A `[sources.NAME]` table: the test source delivering to `url`, taking
/// `secrets`.
fn source(name: &str, url: &str, secrets: &[&str]) -> String {
    format!("[sources.{name}]\n{}\n", settings_toml(url, secrets))
}

impl TestApp {
    /// Posts events `{prefix}0`… (one stream each) signed with `secret`,
    /// counting each answer in `answered`; the statuses, in order.
    async fn provider(
        &self,
        prefix: &str,
        secret: &str,
        n: usize,
        answered: &AtomicUsize,
    ) -> Vec<StatusCode> {
        let mut statuses = Vec::new();
        for i in 0..n {
            let event = body(
                &format!("{prefix}{i}"),
                &format!("run_{prefix}{i}"),
                "2026-11-29T10:00:00Z",
            );
            let res = self
                .post_signed_at("sume", &event, self.now_s(), secret)
                .await;
            statuses.push(res.status());
            answered.fetch_add(1, Ordering::SeqCst);
        }
        statuses
    }

    /// Reloads from `rest` once `answered` reached `after`, while the
    /// provider goes on posting.
    async fn reload_after(&self, answered: &AtomicUsize, after: usize, rest: &str) {
        eventually("the provider's first posts answered", || async {
            answered.load(Ordering::SeqCst) >= after
        })
        .await;
        let reloaded = self.reload(rest).await.unwrap();
        assert!(reloaded.restart_only.is_empty(), "{reloaded:?}");
    }
}

/// A rotation as a provider does it: dedupd takes both secrets, the
/// provider moves to the new one, dedupd drops the old. Each reload lands
/// while the provider posts; none of its posts is refused, and every event
/// is delivered.
#[tokio::test]
async fn an_inbound_secret_rotated_by_reload_refuses_no_post_signed_with_either_meanwhile() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let app = gateway_app(&receiver.url, |s| {
        s.secrets = vec![dedupd::config::Secret::new(OLD)];
    })
    .await;

    let answered = AtomicUsize::new(0);
    let both = source("sume", &receiver.url, &[OLD, NEW]);
    let (statuses, ()) = tokio::join!(
        app.provider("old", OLD, 20, &answered),
        app.reload_after(&answered, 5, &both),
    );
    assert!(
        statuses.iter().all(|s| *s == StatusCode::OK),
        "{statuses:?}"
    );

    let answered = AtomicUsize::new(0);
    let new_only = source("sume", &receiver.url, &[NEW]);
    let (statuses, ()) = tokio::join!(
        app.provider("new", NEW, 20, &answered),
        app.reload_after(&answered, 5, &new_only),
    );
    assert!(
        statuses.iter().all(|s| *s == StatusCode::OK),
        "{statuses:?}"
    );

    // The rotation is over: the old secret no longer signs anything.
    let late = body("late", "run_late", "2026-11-29T10:00:00Z");
    let res = app.post_signed_at("sume", &late, app.now_s(), OLD).await;
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    eventually("all 40 events delivered", || async {
        app.ids_of("sume", "delivered").await.len() == 40
    })
    .await;
}

/// A source added by a reload takes posts at once and delivers them, with
/// its own series in the metrics; the sources that were there go on.
#[tokio::test]
async fn a_source_added_by_reload_ingests_and_delivers() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let other = Receiver::start(Behaviour::Accept).await;
    let app = gateway_app(&receiver.url, |_| {}).await;
    let first = body("o1", "run_o1", "2026-11-29T10:00:00Z");
    let res = app
        .post_signed_at("other", &first, app.now_s(), SECRET)
        .await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND, "not configured yet");

    let reloaded = app
        .reload(&format!(
            "{}{}",
            source("sume", &receiver.url, &[SECRET]),
            source("other", &other.url, &[SECRET])
        ))
        .await
        .unwrap();
    assert_eq!(reloaded.added, ["other"]);
    assert!(reloaded.removed.is_empty() && reloaded.restart_only.is_empty());

    app.post_to("other", &first).await;
    app.post_to("sume", &body("s1", "run_s1", "2026-11-29T10:00:00Z"))
        .await;
    eventually("both delivered", || async {
        app.ids_of("other", "delivered").await == ["o1"]
            && app.ids_of("sume", "delivered").await == ["s1"]
    })
    .await;
    assert_eq!(other.received().len(), 1);
    assert_eq!(other.received()[0].header("webhook-id"), "o1");
    let scrape = app.scrape().await;
    for (outcome, n) in [("accepted", 1.0), ("duplicate", 0.0)] {
        let labels = [("source", "other"), ("outcome", outcome)];
        assert_eq!(count(&scrape, "dedupd_ingest_total", &labels), n);
    }
    let delivered = [("source", "other"), ("outcome", "delivered")];
    assert_eq!(count(&scrape, "dedupd_deliveries_total", &delivered), 1.0);
}

/// A file that does not parse, and one that parses with a setting wrong,
/// are refused whole: what ran goes on running.
#[tokio::test]
async fn a_broken_file_is_refused_and_the_running_settings_stay_in_force() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let app = gateway_app(&receiver.url, |_| {}).await;

    let unparsable = app.reload("[sources.sume\nscheme = \"sume\"\n").await;
    let errors = unparsable.unwrap_err().to_string();
    assert!(errors.contains("dedupd.toml"), "{errors}");

    // The old secret dropped and a source added, but a source without
    // its signing secret and a bad URL: nothing of it applies.
    let wrong = format!(
        "{}[sources.other]\nscheme = \"sume\"\nevent_id = \"body:/request_id\"\n\
         forward_to = \"not a url\"\n",
        source("sume", &receiver.url, &["another_secret"]),
    );
    let errors = app.reload(&wrong).await.unwrap_err();
    let keys: Vec<&str> = errors.0.iter().map(|e| e.key.as_str()).collect();
    assert!(keys.contains(&"sources.other.secrets"), "{errors}");
    assert!(keys.contains(&"sources.other.forward_to"), "{errors}");

    app.post_to("sume", &body("e1", "run_1", "2026-11-29T10:00:00Z"))
        .await;
    let res = app
        .post_signed_at(
            "other",
            &body("o1", "r", "2026-11-29T10:00:00Z"),
            app.now_s(),
            SECRET,
        )
        .await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    eventually("delivered under the running settings", || async {
        app.ids_of("sume", "delivered").await == ["e1"]
    })
    .await;
}

/// Tokens changed by a reload: the old one is refused from then on, the
/// new one accepted, on HTTP and on the Redis protocol; a Redis connection
/// that had authenticated stays so (authentication is per connection).
#[tokio::test]
async fn api_tokens_changed_by_reload_refuse_the_old_token_and_accept_the_new() {
    const OLD_TOKEN: &str = "old-token-0123456789";
    const NEW_TOKEN: &str = "new-token-0123456789";
    let app = spawn_app_with(|l| {
        with_tokens(l, &[OLD_TOKEN]);
        l.settings.resp.listen = Some("127.0.0.1:0".parse().unwrap());
    })
    .await;
    let resp = format!("127.0.0.1:{}", app.resp_port.unwrap());
    let claim = |token: &'static str, key: &'static str| {
        app.client
            .post(app.url(&format!("/v1/claims/{key}")))
            .bearer_auth(token)
            .json(&json!({}))
            .send()
    };
    assert_eq!(claim(OLD_TOKEN, "a").await.unwrap().status(), 201);
    let before = redis::Client::open(format!("redis://:{OLD_TOKEN}@{resp}/")).unwrap();
    let mut before = before.get_multiplexed_async_connection().await.unwrap();

    let reloaded = app
        .reload(&format!(
            "[api]\ntokens = [{NEW_TOKEN:?}]\n\n[resp]\nlisten = \"127.0.0.1:0\"\n"
        ))
        .await
        .unwrap();
    assert_eq!(reloaded.changed, ["api.tokens"]);
    assert!(reloaded.restart_only.is_empty(), "{reloaded:?}");

    assert_eq!(claim(OLD_TOKEN, "b").await.unwrap().status(), 401);
    assert_eq!(claim(NEW_TOKEN, "c").await.unwrap().status(), 201);
    let refused = redis::Client::open(format!("redis://:{OLD_TOKEN}@{resp}/"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap_err();
    assert!(
        refused.kind() == redis::ErrorKind::AuthenticationFailed
            || refused.to_string().contains("WRONGPASS"),
        "{refused}"
    );
    let mut after = redis::Client::open(format!("redis://:{NEW_TOKEN}@{resp}/"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let ok: String = redis::cmd("SET")
        .arg("k")
        .arg("v")
        .query_async(&mut after)
        .await
        .unwrap();
    assert_eq!(ok, "OK");
    let got: Option<String> = redis::cmd("GET")
        .arg("k")
        .query_async(&mut before)
        .await
        .unwrap();
    assert_eq!(got.as_deref(), Some("v"));
}

/// A setting that needs a restart is named and keeps its running value;
/// and what a file may change is checked against the values that keep
/// running: a file valid on its own is refused when its sources would be
/// unsafe with them.
#[tokio::test]
async fn restart_only_settings_are_named_and_checked_at_their_running_values() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let app = spawn_app_with(|l| {
        l.settings.gateway.dedupe_window = Duration::from_secs(20 * 60);
        l.settings.sources.insert(
            "sume".into(),
            crate::support::gateway::settings(&receiver.url),
        );
    })
    .await;
    let sume = source("sume", &receiver.url, &[SECRET]);

    let reloaded = app
        .reload(&format!(
            "[gateway]\ndedupe_window = \"20m\"\nmax_in_flight = 9\n\n[reaper]\n\
             interval = \"7s\"\n\n{sume}"
        ))
        .await
        .unwrap();
    assert_eq!(
        reloaded.restart_only,
        ["gateway.max_in_flight", "reaper.interval"]
    );
    assert!(reloaded.changed.is_empty(), "{reloaded:?}");

    // A 15m tolerance needs a window of 31m: the file's 1h would do, but
    // the window is kept in the data file and runs at 20m until a restart.
    let longer = format!("[gateway]\ndedupe_window = \"1h\"\n\n{sume}tolerance = \"15m\"\n");
    let errors = app.reload(&longer).await.unwrap_err();
    let window = errors
        .0
        .iter()
        .find(|e| e.key == "gateway.dedupe_window")
        .unwrap_or_else(|| panic!("{errors}"));
    assert!(window.message.contains("20m"), "{window}");
    assert_eq!(
        window.origin,
        "the running settings: it needs a restart to change"
    );
    // And nothing of that file applies: the old tolerance holds.
    let ts = app.now_s() - 10 * 60;
    let res = app
        .post_signed_at(
            "sume",
            &body("e1", "r1", "2026-11-29T10:00:00Z"),
            ts,
            SECRET,
        )
        .await;
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
}

/// A source a reload removes is as one a restart left out: its events
/// stay listed and its pending ones are not delivered; put back, they are.
#[tokio::test]
async fn a_source_removed_by_reload_keeps_its_events_listed_and_delivers_them_once_back() {
    let kept = Receiver::start(Behaviour::Accept).await;
    let gone = Receiver::start(Behaviour::FailTimes(1)).await;
    let both = format!(
        "{}{}",
        source("sume", &kept.url, &[SECRET]),
        source("gone", &gone.url, &[SECRET])
    );
    let app = spawn_app_with(|l| {
        for (name, url) in [("sume", &kept.url), ("gone", &gone.url)] {
            l.settings
                .sources
                .insert(name.into(), crate::support::gateway::settings(url));
        }
    })
    .await;
    app.post_to("gone", &body("g1", "run_g1", "2026-11-29T10:00:00Z"))
        .await;
    // Its first attempt failed: pending, due again within its backoff.
    eventually("the first attempt", || async {
        app.source_state("gone").await["delivery"]["consecutive_failures"] == 1
    })
    .await;

    let reloaded = app
        .reload(&source("sume", &kept.url, &[SECRET]))
        .await
        .unwrap();
    assert_eq!(reloaded.removed, ["gone"]);
    let state = app.source_state("gone").await;
    assert_eq!(state["configured"], false, "{state}");
    // Past its backoff, and past a pass that delivered another source's
    // event: the dispatcher looked, and left it.
    app.clock.advance(Duration::from_secs(1));
    app.post_to("sume", &body("s1", "run_s1", "2026-11-29T10:00:00Z"))
        .await;
    eventually("the kept source delivers", || async {
        app.ids_of("sume", "delivered").await == ["s1"]
    })
    .await;
    assert_eq!(app.ids_of("gone", "pending").await, ["g1"]);
    assert_eq!(gone.received().len(), 1);

    app.reload(&both).await.unwrap();
    app.retrying_until("delivered once its source is back", || async {
        app.ids_of("gone", "delivered").await == ["g1"]
    })
    .await;
    assert_eq!(gone.received().len(), 2);
}

/// A delivery in flight when its source changes finishes with the settings
/// it started with and is recorded once; the breaker of a source whose
/// destination stays keeps its state, and a new destination starts closed.
#[tokio::test]
async fn a_delivery_in_flight_and_a_paused_breaker_survive_a_reload() {
    let receiver = Receiver::start(Behaviour::Hold(None)).await;
    let app = gateway_app(&receiver.url, |s| s.pause_after = 1).await;
    app.post_to("sume", &body("e1", "run_1", "2026-11-29T10:00:00Z"))
        .await;
    eventually("the delivery out", || async { receiver.held() == 1 }).await;

    let changed = format!(
        "{}max_in_flight = 4\npause_after = 1\n",
        source("sume", &receiver.url, &[SECRET, NEW])
    );
    let reloaded = app.reload(&changed).await.unwrap();
    assert_eq!(
        reloaded.changed,
        ["sources.sume.max_in_flight", "sources.sume.secrets"]
    );
    receiver.release_to(Behaviour::Always(500));
    eventually("delivered once", || async {
        app.ids_of("sume", "delivered").await == ["e1"]
    })
    .await;
    assert_eq!(receiver.received().len(), 1);
    let event: Value = app
        .request(Method::GET, "/v1/sources/sume/events/e1")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(event["attempts"], 1, "{event}");

    // One failure pauses it (pause_after = 1); a reload that keeps its
    // destination keeps the pause.
    app.post_to("sume", &body("e2", "run_2", "2026-11-29T10:00:00Z"))
        .await;
    eventually("paused", || async {
        app.source_state("sume").await["delivery"]["state"] == "paused"
    })
    .await;
    app.reload(&format!("{changed}delivered_retention = \"2d\"\n"))
        .await
        .unwrap();
    let state = app.source_state("sume").await;
    assert_eq!(state["delivery"]["state"], "paused", "{state}");
    assert_eq!(state["delivery"]["max_in_flight"], 4, "{state}");

    let elsewhere = receiver.url.replace("/hooks", "/elsewhere");
    app.reload(&format!(
        "{}max_in_flight = 4\npause_after = 1\n",
        source("sume", &elsewhere, &[NEW])
    ))
    .await
    .unwrap();
    let state = app.source_state("sume").await;
    assert_eq!(state["delivery"]["state"], "running", "{state}");
}

/// The real thing: `dedupd serve --config FILE`, the file rewritten, and
/// `dedupd reload --pid` (what the unit's `ExecReload=` runs) sending
/// SIGHUP. The new token and log level take effect; a broken file is
/// refused by `dedupd reload` before any signal, and by the server when
/// signalled anyway, with a log line that names what is wrong.
#[tokio::test]
async fn sighup_reloads_a_served_dedupds_tokens_and_log_level_and_refuses_a_broken_file() {
    use crate::support::process::{dedupd, signal, spawn_serving_live, stop};
    const OLD_TOKEN: &str = "old-token-0123456789";
    const NEW_TOKEN: &str = "new-token-0123456789";
    let dir = tempfile::TempDir::new().unwrap();
    let config = dir.path().join("dedupd.toml");
    let write = |api: &str, level: &str| {
        let text =
            format!("listen = \"127.0.0.1:0\"\n\n[log]\nlevel = \"{level}\"\n\n[api]\n{api}\n");
        std::fs::write(&config, text).unwrap();
    };
    write(&format!("tokens = [{OLD_TOKEN:?}]"), "info");
    let mut cmd = dedupd();
    cmd.args(["serve", "--config"])
        .arg(&config)
        .current_dir(dir.path());
    let (child, port, log, drain) = spawn_serving_live(cmd);
    let client = crate::support::http::client();
    let claim = |token: &'static str, key: &'static str| {
        client
            .post(format!("http://127.0.0.1:{port}/v1/claims/{key}"))
            .bearer_auth(token)
            .send()
    };
    assert_eq!(claim(OLD_TOKEN, "a").await.unwrap().status(), 201);
    let reload = || {
        dedupd()
            .args(["reload", "--config"])
            .arg(&config)
            .args(["--pid", &child.id().to_string()])
            .output()
            .unwrap()
    };
    let logged = |message: &'static str| {
        let log = log.clone();
        move || {
            let log = log.clone();
            async move {
                log.json().iter().any(|v| {
                    v["message"]
                        .as_str()
                        .is_some_and(|m| m.starts_with(message))
                })
            }
        }
    };

    write(&format!("tokens = [{NEW_TOKEN:?}]"), "debug");
    let out = reload();
    assert!(out.status.success(), "{out:?}");
    eventually("the reload logged", logged("configuration reloaded")).await;
    assert_eq!(claim(OLD_TOKEN, "b").await.unwrap().status(), 401);
    assert_eq!(claim(NEW_TOKEN, "c").await.unwrap().status(), 201);
    // At debug each request is logged; at info (before) none was.
    eventually("a request logged at debug", logged("request done")).await;
    let lines = log.json();
    let reloaded_at = lines
        .iter()
        .position(|v| v["message"] == "configuration reloaded")
        .unwrap();
    assert!(
        !lines[..reloaded_at]
            .iter()
            .any(|v| v["message"] == "request done"),
        "{lines:?}"
    );
    assert_eq!(lines[reloaded_at]["log_level"], "debug", "{lines:?}");

    // Too short a token: `dedupd reload` says so and signals nothing.
    write("tokens = [\"short\"]", "debug");
    let out = reload();
    assert!(!out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("api.tokens"), "{stderr}");
    assert!(stderr.contains("not reloaded"), "{stderr}");
    // Signalled anyway, the server refuses it with a line naming the key.
    signal(&child, "-HUP");
    eventually("the refusal logged", logged("reload refused")).await;
    let refusal = log
        .json()
        .into_iter()
        .find(|v| {
            v["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("reload refused"))
        })
        .unwrap();
    assert_eq!(refusal["level"], "ERROR", "{refusal}");
    assert!(
        refusal["errors"].as_str().unwrap().contains("api.tokens"),
        "{refusal}"
    );
    assert_eq!(claim(NEW_TOKEN, "d").await.unwrap().status(), 201);
    assert!(stop(child, "-TERM", drain).await.success());
}

/// `dedupd reload` waits for the server's answer when the server keeps a
/// reload status (`$RUNTIME_DIRECTORY`, as systemd sets it): a file that
/// passes alone but that the server refuses against its running settings
/// (every token removed while it listens on all interfaces, which needs a
/// restart to change) fails the command, naming the error, where it used
/// to say it was sent and exit 0; a good file succeeds once in force.
#[tokio::test]
async fn dedupd_reload_fails_when_the_server_refuses_the_file() {
    use crate::support::process::{dedupd, spawn_serving, stop};
    const TOKEN: &str = "token-0123456789abcdef";
    let dir = tempfile::TempDir::new().unwrap();
    let run = dir.path().join("run");
    std::fs::create_dir(&run).unwrap();
    let config = dir.path().join("dedupd.toml");
    std::fs::write(
        &config,
        format!("listen = \"0.0.0.0:0\"\n[api]\ntokens = [{TOKEN:?}]\n"),
    )
    .unwrap();
    let mut cmd = dedupd();
    cmd.args(["serve", "--config"])
        .arg(&config)
        .current_dir(dir.path())
        .env("RUNTIME_DIRECTORY", &run);
    let (child, port, drain) = spawn_serving(cmd);
    let reload = || {
        dedupd()
            .args(["reload", "--config"])
            .arg(&config)
            .args(["--pid", &child.id().to_string()])
            .env("RUNTIME_DIRECTORY", &run)
            .output()
            .unwrap()
    };
    // Alone, loopback without tokens is a good file.
    std::fs::write(&config, "listen = \"127.0.0.1:0\"\n").unwrap();
    let out = reload();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the refused reload succeeded: {out:?}"
    );
    assert!(
        stderr.contains("reload refused by the server") && stderr.contains("api"),
        "{stderr}"
    );
    let client = crate::support::http::client();
    let claim = |key: &'static str| {
        client
            .post(format!("http://127.0.0.1:{port}/v1/claims/{key}"))
            .bearer_auth(TOKEN)
            .send()
    };
    assert_eq!(claim("a").await.unwrap().status(), 201);

    // A good one: it returns once the server has put it in force.
    std::fs::write(
        &config,
        "listen = \"0.0.0.0:0\"\n[api]\ntokens = [\"token-abcdef0123456789\"]\n",
    )
    .unwrap();
    let out = reload();
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("reloaded:"),
        "{out:?}"
    );
    assert_eq!(claim("b").await.unwrap().status(), 401);

    // One that also moves `listen`: in force but for it, and the command
    // says so (not only the server's log).
    std::fs::write(
        &config,
        "listen = \"127.0.0.1:0\"\n[api]\ntokens = [\"token-fedcba9876543210\"]\n",
    )
    .unwrap();
    let out = reload();
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("need a restart") && stdout.contains("listen"),
        "{stdout}"
    );
    assert!(!stdout.contains("api"), "{stdout}");

    // A wait past what a deadline holds is refused before any signal: it
    // parsed, then panicked once the reload was under way.
    std::fs::write(
        &config,
        "listen = \"127.0.0.1:0\"\n[api]\ntokens = [\"token-1111111111111111\"]\n",
    )
    .unwrap();
    let out = dedupd()
        .args(["reload", "--config"])
        .arg(&config)
        .args(["--pid", &child.id().to_string(), "--wait", "300000000000y"])
        .env("RUNTIME_DIRECTORY", &run)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("longer than the most a command waits"),
        "{stderr}"
    );
    let still = client
        .post(format!("http://127.0.0.1:{port}/v1/claims/c"))
        .bearer_auth("token-fedcba9876543210")
        .send()
        .await
        .unwrap();
    assert_eq!(still.status(), 201, "nothing was reloaded");
    assert!(stop(child, "-TERM", drain).await.success());
}

/// A reload that removes the source of a running erase job does not cut
/// it short: every event its filter matches is erased. Cut short, the rest
/// would stay readable, and be delivered again once the source is back.
/// (Each pass of the job reads a few events, so the reload lands while it
/// runs; wherever it lands, every match ends erased.)
#[tokio::test]
async fn an_erase_job_goes_on_when_a_reload_removes_its_source() {
    const SCAN: &str = "[gateway]\nscan_bytes = 64\n";
    let receiver = Receiver::start(Behaviour::Accept).await;
    let app = spawn_app_with(|l| {
        for name in ["sume", "other"] {
            l.settings.sources.insert(
                name.into(),
                crate::support::gateway::settings(&receiver.url),
            );
        }
        l.settings.gateway.scan_bytes = 64;
    })
    .await;
    // What stays: a reload may not remove every source at once.
    let other = source("other", &receiver.url, &[SECRET]);
    for i in 0..80 {
        let run = if i % 2 == 0 { "run_x" } else { "run_y" };
        app.ingest_ok(&body(&format!("e{i}"), run, "2026-11-29T10:00:00Z"))
            .await;
    }
    eventually("every event delivered", || async {
        app.event_ids("delivered").await.len() == 80
    })
    .await;
    let res = app
        .request(Method::POST, "/v1/sources/sume/jobs")
        .json(&json!({ "kind": "erase",
            "filter": { "status": "delivered", "field": "/run_id", "value": "run_x" } }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let id = res.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let reloaded = app.reload(&format!("{SCAN}{other}")).await.unwrap();
    assert_eq!(reloaded.removed, ["sume"]);
    let job = || async {
        app.request(Method::GET, &format!("/v1/jobs/{id}"))
            .send()
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap()
    };
    eventually("the job to end", || async {
        job().await["state"] != "running"
    })
    .await;
    let done = job().await;
    assert_eq!(
        (&done["state"], &done["matched"], &done["erased"]),
        (&json!("done"), &json!(40), &json!(40)),
        "{done}"
    );
    assert!(done["error"].is_null(), "{done}");
    // The source back: the erased events stay erased, the others delivered.
    let back = format!("{SCAN}{other}{}", source("sume", &receiver.url, &[SECRET]));
    app.reload(&back).await.unwrap();
    assert_eq!(app.event_ids("erased").await.len(), 40);
    assert_eq!(app.event_ids("delivered").await.len(), 40);
}

/// `dedupd reload --pid` signals only a `dedupd serve`: a stale pid, now
/// another program's, is refused, and that program (which SIGHUP would
/// end) goes on.
#[test]
fn reload_refuses_a_pid_that_is_not_a_dedupd_serve() {
    use crate::support::process::dedupd;
    let dir = tempfile::TempDir::new().unwrap();
    let config = dir.path().join("dedupd.toml");
    std::fs::write(&config, "listen = \"127.0.0.1:0\"\n").unwrap();
    let mut other = std::process::Command::new("sleep")
        .arg("300")
        .spawn()
        .unwrap();
    let out = dedupd()
        .args(["reload", "--config"])
        .arg(&config)
        .args(["--pid", &other.id().to_string()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        err.contains("is not a `dedupd serve`") && err.contains("sleep"),
        "{err}"
    );
    assert!(
        other.try_wait().unwrap().is_none(),
        "the other program goes on"
    );
    other.kill().unwrap();
    other.wait().unwrap();
}

/// A reload may not open the API or drop everything by mistake: a file
/// emptied (a tool writing in place, a `>` by mistake) is refused whole,
/// and so is one that removes every source (a file cut short before them)
/// or every API token (the API would answer without one). None changes
/// anything: the old token and source still work.
#[tokio::test]
async fn a_reload_refuses_an_emptied_file_and_one_that_removes_every_source_or_token() {
    const TOKEN: &str = "a-token-0123456789abcdef";
    let receiver = Receiver::start(Behaviour::Accept).await;
    let app = spawn_app_with(|l| {
        l.settings.sources.insert(
            "sume".into(),
            crate::support::gateway::settings(&receiver.url),
        );
        with_tokens(l, &[TOKEN]);
    })
    .await;
    let empty = app.dir.path().join("emptied.toml");
    for text in ["", "\n  \n# only a comment\n"] {
        std::fs::write(&empty, text).unwrap();
        let reloader = app.reloader.clone();
        let path = empty.clone();
        let errors = tokio::task::spawn_blocking(move || reloader.reload(Some(&path)))
            .await
            .unwrap()
            .unwrap_err();
        assert!(errors.to_string().contains("the file is empty"), "{errors}");
    }
    // Tokens kept, every source removed (a file cut short before them).
    let errors = app
        .reload(&format!("[api]\ntokens = [{TOKEN:?}]\n"))
        .await
        .unwrap_err();
    assert_eq!(errors.0[0].key, "sources", "{errors}");
    assert!(errors.to_string().contains("may not remove every source"));
    // Sources kept, tokens removed.
    let errors = app
        .reload(&source("sume", &receiver.url, &[SECRET]))
        .await
        .unwrap_err();
    assert_eq!(errors.0[0].key, "api.tokens", "{errors}");
    assert!(
        errors
            .to_string()
            .contains("may not remove every API token")
    );
    // Nothing changed: the token is still needed, the source still ingests.
    let anonymous = crate::support::http::client()
        .get(app.url("/v1/sources"))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    app.ingest_ok(&body("e1", "run_1", "2026-11-29T10:00:00Z"))
        .await;
    // Another token in its place is a reload like any other.
    let replaced = app
        .reload(&format!(
            "[api]\ntokens = [\"another-token-0123456789\"]\n{}",
            source("sume", &receiver.url, &[SECRET])
        ))
        .await;
    assert!(replaced.is_ok(), "{:?}", replaced.err());
}
