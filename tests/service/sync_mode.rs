//! What the process does by the CPUs it may use (its affinity, a 1-vCPU
//! VM, a cgroup's quota), each measured best that way (docs/performance.md,
//! "Claims on any VM"): with two or more the writer syncs the log and the
//! scheduling policy is left alone; with one the log is synced on a thread
//! of its own, and the process runs as `SCHED_BATCH` unless it was given
//! another policy or `cpu_scheduling = "as-started"`.

use std::process::Command;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::support::process::{dedupd, spawn_serving};

/// `SCHED_OTHER`, `SCHED_BATCH` and `SCHED_IDLE`, as `/proc` shows them.
const OTHER: u32 = 0;
const BATCH: u32 = 3;
const IDLE: u32 = 5;

/// A thread of the process: its name, its scheduling policy and its nice
/// value.
#[derive(Debug)]
struct Thread {
    name: String,
    policy: u32,
    nice: i32,
}

/// A thread from its `/proc` directory.
fn thread(dir: &std::path::Path) -> Option<Thread> {
    let name = std::fs::read_to_string(dir.join("comm")).ok()?;
    let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
    // After the name in brackets: field 3 (the state) onwards; the nice
    // value is field 19, the policy field 41.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some(Thread {
        name: name.trim().to_owned(),
        nice: fields[19 - 3].parse().ok()?,
        policy: fields[41 - 3].parse().ok()?,
    })
}

/// The process's threads.
fn threads(pid: u32) -> Vec<Thread> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| thread(&t.ok()?.path()))
        .collect()
}

/// This test's own thread: what a server it starts inherits.
fn own() -> Thread {
    thread(std::path::Path::new("/proc/thread-self")).unwrap()
}

fn has(threads: &[Thread], name: &str) -> bool {
    threads.iter().any(|t| t.name == name)
}

/// Serves from a fresh directory, on CPU 0 alone when `one_cpu` (after
/// the command `pre`, if any), until `/readyz` answers 200 (the watchdog's
/// ping has then gone through the writer and, if there is one, the
/// syncer); its threads.
async fn threads_when_ready(one_cpu: bool, pre: &[&str]) -> Vec<Thread> {
    threads_when_ready_with(one_cpu, pre, &[]).await
}

/// [`threads_when_ready`], with `env` set for the server.
async fn threads_when_ready_with(one_cpu: bool, pre: &[&str], env: &[(&str, &str)]) -> Vec<Thread> {
    let dir = TempDir::new().unwrap();
    let mut cmd = if one_cpu {
        let (program, args) = pre.split_first().unwrap_or((&"taskset", &[]));
        let mut cmd = Command::new(program);
        cmd.args(args);
        if !pre.is_empty() {
            cmd.arg("taskset");
        }
        cmd.args(["-c", "0", env!("CARGO_BIN_EXE_dedupd")]);
        for (k, _) in std::env::vars() {
            if k.starts_with("DEDUPD_") || k == "RUST_LOG" {
                cmd.env_remove(k);
            }
        }
        cmd
    } else {
        dedupd()
    };
    cmd.arg("serve")
        .current_dir(dir.path())
        .env("DEDUPD_LISTEN", "127.0.0.1:0")
        .envs(env.iter().copied());
    let (child, port, _drain) = spawn_serving(cmd);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ready = crate::support::http::client()
            .get(format!("http://127.0.0.1:{port}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status() == 200);
        if ready {
            break;
        }
        assert!(Instant::now() < deadline, "not ready within 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    threads(child.id())
}

#[tokio::test]
async fn with_one_cpu_the_log_is_synced_on_its_own_thread_and_with_more_by_the_writer() {
    let one = threads_when_ready(true, &[]).await;
    assert!(has(&one, "dedupd-writer"), "{one:?}");
    assert!(has(&one, "dedupd-syncer"), "one CPU: {one:?}");
    if std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2 {
        let more = threads_when_ready(false, &[]).await;
        assert!(has(&more, "dedupd-writer"), "{more:?}");
        assert!(!has(&more, "dedupd-syncer"), "two CPUs or more: {more:?}");
    }
}

/// With one CPU, the threads that hand requests to each other (HTTP and
/// Redis-protocol workers, the writer, the syncer) run as `SCHED_BATCH`,
/// at the nice value they had; with more, as they were started.
#[tokio::test]
async fn with_one_cpu_the_process_is_scheduled_as_batch_at_its_nice_value() {
    let own = own();
    if own.policy != OTHER {
        eprintln!(
            "skipped: the tests run under policy {}, not SCHED_OTHER",
            own.policy
        );
        return;
    }
    let one = threads_when_ready(true, &["nice", "-n", "3"]).await;
    // (`comm` keeps 15 bytes of a name.)
    for name in ["dedupd-writer", "dedupd-syncer", "actix-server wo"] {
        assert!(has(&one, name), "no {name} in {one:?}");
    }
    // `nice -n 3` adds 3 to the tests' own nice value.
    let nice = (own.nice + 3).min(19);
    assert!(
        one.iter().all(|t| (t.policy, t.nice) == (BATCH, nice)),
        "one CPU, nice {nice}: {one:?}"
    );
    if std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2 {
        let more = threads_when_ready(false, &[]).await;
        assert!(has(&more, "dedupd-writer"), "{more:?}");
        assert!(
            more.iter().all(|t| t.policy == OTHER && t.nice == own.nice),
            "two CPUs or more: {more:?}"
        );
    }
}

/// A policy the process was started with (systemd's
/// `CPUSchedulingPolicy=`, `chrt`) is kept, with one CPU too.
#[tokio::test]
async fn a_scheduling_policy_given_to_the_process_is_kept() {
    let one = threads_when_ready(true, &["chrt", "--idle", "0"]).await;
    assert!(has(&one, "dedupd-syncer"), "one CPU: {one:?}");
    assert!(one.iter().all(|t| t.policy == IDLE), "{one:?}");
}

/// `cpu_scheduling = "as-started"` keeps the default policy with one CPU.
#[tokio::test]
async fn as_started_keeps_the_default_policy_with_one_cpu() {
    if own().policy != OTHER {
        eprintln!("skipped: the tests do not run under SCHED_OTHER");
        return;
    }
    let one = threads_when_ready_with(true, &[], &[("DEDUPD_CPU_SCHEDULING", "as-started")]).await;
    assert!(has(&one, "dedupd-syncer"), "one CPU: {one:?}");
    assert!(one.iter().all(|t| t.policy == OTHER), "{one:?}");
}
