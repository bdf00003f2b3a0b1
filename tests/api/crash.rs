//! Crash consistency of the real binary: SIGKILL under concurrent load, again
//! and again, and after every restart each acknowledged claim, done and apply
//! is there, and fences never go backwards.
//!
//! Small enough for CI by default; `benches/crash_drill.sh` runs the same
//! drill at scale through the environment: `DEDUPD_CRASH_ROUNDS` (kills,
//! default 4), `DEDUPD_CRASH_WORKERS` (concurrent workers, default 16),
//! `DEDUPD_CRASH_CLAIMS` (new claims acknowledged before each kill,
//! default 300) and `DEDUPD_CRASH_DIR` (where the data directory goes,
//! default the system's temp dir).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tempfile::TempDir;

use crate::cli::{serve, signal, stop, wait};

/// SIGKILLs `child` while `workers` load it, waits for them to see it go,
/// and checks it died of the kill.
pub(crate) async fn kill_under_load(
    child: std::process::Child,
    workers: Vec<tokio::task::JoinHandle<()>>,
    drain: crate::cli::Drain,
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
    /// Keys acknowledged as done.
    done: Vec<String>,
    /// Applied (stream, event id, created_at minute).
    applies: Vec<(String, String, u32)>,
    /// Highest fence acknowledged so far.
    max_fence: u64,
}

/// One worker: claim, done, apply, over and over, recording what the server
/// acknowledged, until a request fails (the server was killed).
async fn work(base: String, worker: usize, round: usize, acked: Arc<Mutex<Acked>>) {
    let client = reqwest::Client::new();
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
        let Ok(res) = client
            .post(format!("{base}/v1/claims/{key}/done"))
            .json(&json!({ "token": token, "ttl_ms": 86_400_000 }))
            .send()
            .await
        else {
            return;
        };
        if res.status() != 200 {
            return;
        }
        acked.lock().unwrap().done.push(key.clone());
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
    let client = reqwest::Client::new();
    let claim = |key: &str| answer(client.get(format!("{base}/v1/claims/{key}")));
    for (_, (key, fence)) in acked.claims.iter().enumerate().filter(|(i, _)| mine(i)) {
        let v = claim(key).await;
        assert_eq!(v["fence"].as_u64(), Some(*fence), "claim {key}: {v}");
    }
    for (_, key) in acked.done.iter().enumerate().filter(|(i, _)| mine(i)) {
        let v = claim(key).await;
        assert_eq!(v["state"], "done", "done {key}: {v}");
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
        let v =
            answer(reqwest::Client::new().post(format!("{base}/v1/claims/fence-probe-{round}")))
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
