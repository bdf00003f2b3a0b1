//! Crash and restart, in one place: SIGKILL under concurrent load (claims,
//! applies, and RESP SETs), `kill -9` and graceful SIGTERM / SIGINT of the
//! real binary, what survives a restart, pending deliveries after one, and
//! a stop that waits for a delivery in flight.
//!
//! Small enough for CI by default; `benches/crash_drill.sh` runs the same
//! drill at scale through the environment: `DEDUPD_CRASH_ROUNDS` (kills,
//! default 4), `DEDUPD_CRASH_WORKERS` (concurrent workers, default 16),
//! `DEDUPD_CRASH_CLAIMS` (new claims acknowledged before each kill,
//! default 300) and `DEDUPD_CRASH_DIR` (where the data directory goes,
//! default the system's temp dir).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;
use serde_json::json;
use tempfile::TempDir;

use crate::resp::Raw;
use crate::support::app::spawn_app;
use crate::support::gateway::body;
use crate::support::gateway::gateway_app;
use crate::support::gateway::ids;
use crate::support::process::dedupd;
use crate::support::process::serve;
use crate::support::process::signal;
use crate::support::process::sigterm;
use crate::support::process::spawn_serving_on;
use crate::support::process::stop;
use crate::support::process::wait;
use crate::support::receiver::Behaviour;
use crate::support::receiver::Receiver;
/// Claims `n` keys `{prefix}{i}` and returns their fences.
async fn claim_many(base: &str, prefix: &str, n: usize) -> Vec<u64> {
    let client = crate::support::http::client();
    let mut fences = Vec::new();
    for i in 0..n {
        let res = client
            .post(format!("{base}/v1/claims/{prefix}{i}"))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 201);
        let v: Value = res.json().await.unwrap();
        fences.push(v["fence"].as_u64().unwrap());
    }
    fences
}

/// Asserts that keys `{prefix}{i}` hold `fences`.
async fn assert_fences(base: &str, prefix: &str, fences: &[u64]) {
    let client = crate::support::http::client();
    for (i, fence) in fences.iter().enumerate() {
        let v: Value = client
            .get(format!("{base}/v1/claims/{prefix}{i}"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(v["fence"].as_u64(), Some(*fence), "{prefix}{i}");
    }
}

/// A test that fails (here, a panic where an assertion would fail) leaves
/// no `dedupd serve` behind: a process left running would keep its port
/// and its data file after the test binary exits.
#[test]
fn a_failed_test_leaves_no_dedupd_running() {
    let dir = TempDir::new().unwrap();
    let pid = Mutex::new(None);
    let failed = std::panic::catch_unwind(|| {
        let (child, _port, _drain) = serve(&dir);
        *pid.lock().unwrap() = Some(child.id());
        panic!("a failed assertion while dedupd serves");
    });
    assert!(failed.is_err());
    let pid = pid.lock().unwrap().expect("dedupd served");
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "dedupd (pid {pid}) still runs after its test failed"
    );
}

#[tokio::test]
async fn sigint_stops_gracefully_too() {
    let dir = TempDir::new().unwrap();
    let (child, port, drain) = serve(&dir);
    let base = format!("http://127.0.0.1:{port}");
    let fences = claim_many(&base, "i", 5).await;
    let status = stop(child, "-INT", drain).await;
    assert!(status.success(), "exit status {status}");
    let (child, port, drain) = serve(&dir);
    assert_fences(&format!("http://127.0.0.1:{port}"), "i", &fences).await;
    assert!(stop(child, "-TERM", drain).await.success());
}

#[tokio::test]
async fn every_acknowledged_claim_survives_a_kill_9() {
    let dir = TempDir::new().unwrap();
    let (child, port, drain) = serve(&dir);
    let base = format!("http://127.0.0.1:{port}");
    let fences = claim_many(&base, "k9-", 30).await;
    let status = stop(child, "-KILL", drain).await;
    assert!(!status.success(), "killed, not exited");
    let (child, port, drain) = serve(&dir);
    assert_fences(&format!("http://127.0.0.1:{port}"), "k9-", &fences).await;
    assert!(stop(child, "-TERM", drain).await.success());
}

#[tokio::test]
async fn sigterm_exits_0_and_everything_acknowledged_survives() {
    let dir = TempDir::new().unwrap();
    let (mut child, port, drain) = serve(&dir);
    let client = crate::support::http::client();
    let base = format!("http://127.0.0.1:{port}");
    let mut fences = Vec::new();
    for i in 0..20 {
        let res = client
            .post(format!("{base}/v1/claims/k{i}"))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 201);
        let v: Value = res.json().await.unwrap();
        fences.push(v["fence"].as_u64().unwrap());
    }
    sigterm(&child);
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "exit status {status}");
    drain.join().unwrap();
    assert!(
        dir.path().join("dedupd.redb").exists(),
        "default data file is in the working directory"
    );

    let (mut child, port, drain) = serve(&dir);
    let base = format!("http://127.0.0.1:{port}");
    for (i, fence) in fences.iter().enumerate() {
        let v: Value = client
            .get(format!("{base}/v1/claims/k{i}"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(v["fence"].as_u64(), Some(*fence));
    }
    sigterm(&child);
    let status = tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(s) = child.try_wait().unwrap() {
                return s;
            }
            assert!(std::time::Instant::now() < deadline, "dedupd did not stop");
            std::thread::sleep(Duration::from_millis(20));
        }
    })
    .await
    .unwrap();
    assert!(status.success());
    drain.join().unwrap();
}

/// SIGKILLs `child` while `workers` load it, waits for them to see it go,
/// and checks it died of the kill.
pub(crate) async fn kill_under_load(
    child: crate::support::process::Running,
    workers: Vec<tokio::task::JoinHandle<()>>,
    drain: crate::support::process::Drain,
) {
    signal(&child, "-KILL");
    for w in workers {
        w.await.unwrap();
    }
    let status = tokio::task::spawn_blocking(move || wait(child))
        .await
        .unwrap();
    assert!(!status.success(), "killed, not exited");
    drain.join().unwrap();
}

/// What the server acknowledged, by key.
#[derive(Debug, Default, Clone)]
struct Acked {
    /// Claimed keys and their fences.
    claims: HashMap<String, u64>,
    /// Keys acknowledged as done, with the result each kept (`null`: none).
    done: Vec<(String, Value)>,
    /// Applied (stream, event id, created_at minute).
    applies: Vec<(String, String, u32)>,
    /// Highest fence acknowledged so far.
    max_fence: u64,
}

/// One worker: claim, done, apply, over and over, recording what the server
/// acknowledged, until a request fails (the server was killed).
async fn work(base: String, worker: usize, round: usize, acked: Arc<Mutex<Acked>>) {
    let client = crate::support::http::client();
    for i in 0.. {
        let key = format!("r{round}-w{worker}-k{i}");
        // A day: the last claim before a kill is never marked done, and a
        // later round checks it, however long the rounds take.
        let claim = client
            .post(format!("{base}/v1/claims/{key}"))
            .json(&json!({ "ttl_ms": 86_400_000 }));
        let Ok(res) = claim.send().await else {
            return;
        };
        let Ok(v) = res.json::<Value>().await else {
            return;
        };
        let (Some(token), Some(fence)) = (v["token"].as_str(), v["fence"].as_u64()) else {
            return;
        };
        {
            let mut a = acked.lock().unwrap();
            a.claims.insert(key.clone(), fence);
            a.max_fence = a.max_fence.max(fence);
        }
        // Every other done keeps a result.
        let result = if i % 2 == 0 {
            json!({ "key": key, "fence": fence, "note": "kept with the done" })
        } else {
            Value::Null
        };
        let Ok(res) = client
            .post(format!("{base}/v1/claims/{key}/done"))
            .json(&json!({ "token": token, "ttl_ms": 86_400_000, "result": result }))
            .send()
            .await
        else {
            return;
        };
        if res.status() != 200 {
            return;
        }
        acked.lock().unwrap().done.push((key.clone(), result));
        let stream = format!("s{worker}");
        let minute = u32::try_from(i % 50).unwrap();
        let event = format!("{key}-ev");
        let Ok(res) = client
            .post(format!("{base}/v1/streams/{stream}/apply"))
            .json(&json!({
                "event_id": event,
                // Later in every round: an hour each, from 2026-12-01.
                "created_at": format!(
                    "2026-12-{:02}T{:02}:{:02}:00Z",
                    1 + round / 24,
                    round % 24,
                    minute
                ),
            }))
            .send()
            .await
        else {
            return;
        };
        if res.status() != 200 {
            return;
        }
        acked.lock().unwrap().applies.push((stream, event, minute));
    }
}

/// Sends `req` and reads its JSON answer.
async fn answer(req: reqwest::RequestBuilder) -> Value {
    req.send().await.unwrap().json().await.unwrap()
}

/// Checks that everything acknowledged so far is in the restarted server,
/// with [`CHECKERS`] clients at once (at the drill's scale there are many).
async fn check(base: &str, acked: &Acked) {
    let acked = Arc::new(acked.clone());
    let mut checkers = tokio::task::JoinSet::new();
    for part in 0..CHECKERS {
        let (base, acked) = (base.to_owned(), acked.clone());
        checkers.spawn(async move { check_part(&base, &acked, part).await });
    }
    while let Some(done) = checkers.join_next().await {
        // A failed check panics in its task: fail the test with it.
        done.unwrap();
    }
}

/// How many clients [`check`] reads back with.
const CHECKERS: usize = 8;

/// [`check`] for every [`CHECKERS`]th record, from `part`.
async fn check_part(base: &str, acked: &Acked, part: usize) {
    let mine = |i: &usize| i % CHECKERS == part;
    let client = crate::support::http::client();
    let claim = |key: &str| answer(client.get(format!("{base}/v1/claims/{key}")));
    for (_, (key, fence)) in acked.claims.iter().enumerate().filter(|(i, _)| mine(i)) {
        let v = claim(key).await;
        assert_eq!(v["fence"].as_u64(), Some(*fence), "claim {key}: {v}");
    }
    for (_, (key, result)) in acked.done.iter().enumerate().filter(|(i, _)| mine(i)) {
        let v = claim(key).await;
        assert_eq!(v["state"], "done", "done {key}: {v}");
        // `null` when none was kept: the answer has no `result` then.
        assert_eq!(&v["result"], result, "done {key}: its result: {v}");
    }
    for (_, (stream, event, _)) in acked.applies.iter().enumerate().filter(|(i, _)| mine(i)) {
        let again = json!({ "event_id": event, "created_at": "2026-11-29T00:00:00Z" });
        let v = answer(
            client
                .post(format!("{base}/v1/streams/{stream}/apply"))
                .json(&again),
        )
        .await;
        assert_eq!(v["outcome"], "duplicate", "apply {event} on {stream}: {v}");
    }
}

/// A drill size from the environment, or `default`.
fn knob(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Err(_) => default,
        Ok(v) => v
            .parse()
            .ok()
            .filter(|n| *n > 0)
            .unwrap_or_else(|| panic!("{name} must be a positive number, not {v:?}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_under_concurrent_load_loses_nothing_acknowledged_and_fences_only_grow() {
    let (rounds, workers, per_round) = (
        knob("DEDUPD_CRASH_ROUNDS", 4),
        knob("DEDUPD_CRASH_WORKERS", 16),
        knob("DEDUPD_CRASH_CLAIMS", 300),
    );
    // Each round's applies are an hour later than the last's, in December.
    assert!(rounds <= 24 * 31, "DEDUPD_CRASH_ROUNDS: at most 744");
    let dir = match std::env::var_os("DEDUPD_CRASH_DIR") {
        Some(parent) => TempDir::new_in(parent).unwrap(),
        None => TempDir::new().unwrap(),
    };
    let acked = Arc::new(Mutex::new(Acked::default()));
    for round in 0..rounds {
        let (child, port, drain) = serve(&dir);
        let base = format!("http://127.0.0.1:{port}");
        if round > 0 {
            let seen = acked.lock().unwrap().clone();
            check(&base, &seen).await;
        }
        let before = acked.lock().unwrap().claims.len();
        let workers: Vec<_> = (0..workers)
            .map(|w| tokio::spawn(work(base.clone(), w, round, acked.clone())))
            .collect();
        // Kill mid-load, once a few hundred new claims were acknowledged.
        loop {
            if acked.lock().unwrap().claims.len() >= before + per_round {
                break;
            }
            assert!(
                !workers.iter().all(|w| w.is_finished()),
                "every worker stopped before the kill: a request failed while the server was up"
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let fence_before_kill = acked.lock().unwrap().max_fence;
        kill_under_load(child, workers, drain).await;

        // After the restart, a new claim's fence is above every fence seen.
        let (child, port, drain) = serve(&dir);
        let base = format!("http://127.0.0.1:{port}");
        let seen = acked.lock().unwrap().clone();
        check(&base, &seen).await;
        let v = answer(
            crate::support::http::client().post(format!("{base}/v1/claims/fence-probe-{round}")),
        )
        .await;
        let probe = v["fence"].as_u64().unwrap();
        assert!(
            probe > acked.lock().unwrap().max_fence.max(fence_before_kill),
            "fence went backwards: {probe}"
        );
        assert!(stop(child, "-TERM", drain).await.success());
    }
    let a = acked.lock().unwrap();
    assert!(a.claims.len() >= rounds * per_round && !a.done.is_empty() && !a.applies.is_empty());
    eprintln!(
        "crash drill: {rounds} SIGKILLs under {workers} workers; after each restart all of {} claims, {} dones and {} applies acknowledged so far were there, and fences only grew",
        a.claims.len(),
        a.done.len(),
        a.applies.len()
    );
}

#[tokio::test]
async fn pending_events_are_delivered_after_a_restart() {
    let receiver = Receiver::start(Behaviour::Always(503)).await;
    let port: u16 = receiver
        .url
        .split(':')
        .nth(2)
        .unwrap()
        .trim_end_matches("/hooks")
        .parse()
        .unwrap();
    let app = gateway_app(&receiver.url, |s| s.max_attempts = 1000).await;
    for i in 0..5 {
        app.ingest_ok(&body(
            &format!("p{i}"),
            &format!("run_{i}"),
            "2026-11-29T10:00:00Z",
        ))
        .await;
    }
    app.retrying_until("every event was tried", || async {
        receiver.received().len() >= 5
    })
    .await;
    // The application goes down while dedupd restarts.
    receiver.stop().await;
    let app = app.restart().await;
    assert_eq!(
        app.event_ids("pending").await.len(),
        5,
        "nothing acknowledged was lost"
    );
    let receiver = Receiver::start_on(port, Behaviour::Accept).await;
    app.retrying_until("all delivered after the restart", || async {
        app.event_ids("delivered").await.len() == 5
    })
    .await;
    let mut got = ids(&receiver.received());
    got.sort();
    assert_eq!(got, ["p0", "p1", "p2", "p3", "p4"]);
}

#[tokio::test]
async fn stopping_waits_for_a_delivery_in_flight_to_finish() {
    let receiver = Receiver::start(Behaviour::Delay(500)).await;
    let app = gateway_app(&receiver.url, |_| {}).await;
    app.ingest_ok(&body("slow", "run_1", "2026-11-29T10:00:00Z"))
        .await;
    app.retrying_until("the delivery started", || async {
        !receiver.received().is_empty()
    })
    .await;
    // Stop while the application is still answering; the delivery completes
    // and is recorded before the store closes.
    let app = app.restart().await;
    assert_eq!(app.event_ids("delivered").await, ["slow"]);
    assert_eq!(receiver.received().len(), 1);
}

/// SIGKILL under concurrent RESP SETs, again and again: after every restart
/// each acknowledged SET is there, with its value and its expiry.
mod resp_sets {
    use super::*;

    /// Starts `dedupd serve` in `dir` with the RESP listener; returns it with
    /// its RESP port (from its JSON log) and the thread draining that log.
    fn serve(
        dir: &TempDir,
    ) -> (
        crate::support::process::Running,
        u16,
        crate::support::process::Drain,
    ) {
        let mut cmd = dedupd();
        cmd.arg("serve")
            .current_dir(dir.path())
            .env("DEDUPD_LISTEN", "127.0.0.1:0")
            .env("DEDUPD_RESP__LISTEN", "127.0.0.1:0");
        spawn_serving_on(cmd, "resp_port")
    }

    /// Acknowledged SETs: key → (value, with an expiry).
    type Acked = Arc<Mutex<HashMap<String, (String, bool)>>>;

    /// One worker: pipelines of 8 SETs (every other with EX), recording each
    /// `+OK` read, until the connection fails (the server was killed).
    async fn work(addr: String, worker: usize, round: usize, acked: Acked) {
        let mut c = Raw::connect(&addr).await;
        for batch in 0.. {
            let mut sent = Vec::new();
            let mut bytes = Vec::new();
            for j in 0..8 {
                let key = format!("r{round}-w{worker}-b{batch}-{j}");
                let value = format!("v{batch}.{j}");
                let timed = j % 2 == 0;
                let mut args = vec![
                    b"SET".to_vec(),
                    key.clone().into_bytes(),
                    value.clone().into_bytes(),
                ];
                if timed {
                    args.extend([b"EX".to_vec(), b"86400".to_vec()]);
                }
                bytes.extend(Raw::encode(&args));
                sent.push((key, value, timed));
            }
            c.send_raw(&bytes).await;
            for (key, value, timed) in sent {
                match c.reply().await {
                    Some(r) if r == b"+OK\r\n" => {
                        acked.lock().unwrap().insert(key, (value, timed));
                    }
                    _ => return,
                }
            }
        }
    }

    /// Checks every acknowledged SET on the server at `addr`.
    async fn check(addr: &str, acked: &HashMap<String, (String, bool)>) {
        let mut c = Raw::connect(addr).await;
        for (key, (value, timed)) in acked {
            let got = c.cmd(&format!("GET {key}")).await;
            let want = format!("${}\r\n{value}\r\n", value.len());
            assert_eq!(
                crate::resp::show(&got),
                crate::resp::show(want.as_bytes()),
                "GET {key}"
            );
            let ttl = c.cmd(&format!("TTL {key}")).await;
            if *timed {
                assert!(
                    ttl.starts_with(b":8"),
                    "TTL {key}: {}",
                    crate::resp::show(&ttl)
                );
            } else {
                assert_eq!(ttl, b":-1\r\n", "TTL {key}");
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn sigkill_under_concurrent_sets_loses_no_acknowledged_set() {
        let dir = TempDir::new().unwrap();
        let acked: Acked = Arc::default();
        for round in 0..3 {
            let (child, port, drain) = serve(&dir);
            let addr = format!("127.0.0.1:{port}");
            let before = acked.lock().unwrap().len();
            let workers: Vec<_> = (0..16)
                .map(|w| tokio::spawn(work(addr.clone(), w, round, acked.clone())))
                .collect();
            // Kill mid-load, once some hundreds of new SETs were acknowledged.
            while acked.lock().unwrap().len() < before + 600 {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            kill_under_load(child, workers, drain).await;

            let (child, port, drain) = serve(&dir);
            let seen = acked.lock().unwrap().clone();
            check(&format!("127.0.0.1:{port}"), &seen).await;
            assert!(stop(child, "-TERM", drain).await.success());
        }
        assert!(acked.lock().unwrap().len() >= 1800);
    }
}

#[tokio::test]
async fn claims_and_done_records_survive_a_restart() {
    let app = spawn_app().await;
    let (token, fence, expires) = app.claim_ok("held", json!({})).await;
    let (t2, _, _) = app.claim_ok("finished", json!({})).await;
    assert_eq!(
        app.done("finished", json!({ "token": t2 })).await.status(),
        StatusCode::OK
    );

    let app = app.restart().await;

    let v: Value = app.get("held").await.json().await.unwrap();
    assert_eq!(
        v,
        json!({ "key": "held", "state": "processing", "fence": fence, "expires_at_ms": expires })
    );
    let v: Value = app.get("finished").await.json().await.unwrap();
    assert_eq!(v["state"], "done");
    // The token still owns the claim after the restart.
    assert_eq!(
        app.done("held", json!({ "token": token })).await.status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn fences_strictly_increase_across_restarts() {
    let mut app = spawn_app().await;
    let mut last = 0;
    for round in 0..3 {
        for i in 0..5 {
            let (_, fence, _) = app.claim_ok(&format!("r{round}-{i}"), json!({})).await;
            assert!(fence > last, "fence {fence} after {last}");
            last = fence;
        }
        app = app.restart().await;
    }
    // Expired claims do not reset the counter either.
    app.clock.advance(Duration::from_secs(3600));
    let (_, fence, _) = app.claim_ok("r0-0", json!({})).await;
    assert!(fence > last);
}

/// A fresh checkout that holds a stray `dedupd.redb.wal` (one was once
/// committed to this repository): `serve` refuses to replay it into a new
/// data file, says what to do, and touches neither file.
#[tokio::test]
async fn serve_refuses_a_log_whose_data_file_is_missing_and_leaves_it() {
    use crate::support::process::{dedupd, serve, stop};
    // A real log with claims in it: served, killed, its data file removed.
    let first = tempfile::TempDir::new().unwrap();
    let (child, port, drain) = serve(&first);
    let client = crate::support::http::client();
    for k in ["one", "two"] {
        let res = client
            .post(format!("http://127.0.0.1:{port}/v1/claims/{k}"))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::CREATED);
    }
    let _ = stop(child, "-KILL", drain).await;
    let log = std::fs::read(first.path().join("dedupd.redb.wal")).unwrap();

    let fresh = tempfile::TempDir::new().unwrap();
    std::fs::write(fresh.path().join("dedupd.redb.wal"), &log).unwrap();
    let out = dedupd()
        .arg("serve")
        .current_dir(fresh.path())
        .env("DEDUPD_LISTEN", "127.0.0.1:0")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("dedupd.redb.wal exists but its data file dedupd.redb does not"),
        "{stderr}"
    );
    assert!(stderr.contains("move dedupd.redb.wal away"), "{stderr}");
    assert_eq!(
        std::fs::read(fresh.path().join("dedupd.redb.wal")).unwrap(),
        log,
        "the log is left as it was"
    );
    assert!(!fresh.path().join("dedupd.redb").exists());
}
