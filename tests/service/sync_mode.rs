//! Where the log is synced: by the writer with two CPUs or more, on a
//! syncer thread of its own when the process may use only one (its
//! affinity, a 1-vCPU VM, a cgroup's quota): measured best each way
//! (docs/performance.md, "Claims on any VM").

use std::process::Command;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::support::process::{dedupd, spawn_serving};

/// The names of the process's threads.
fn threads(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|c| c.trim().to_owned())
        .collect()
}

/// Serves from a fresh directory, on CPU 0 alone when `one_cpu`, until
/// `/readyz` answers 200 (the watchdog's ping has then gone through the
/// writer and, if there is one, the syncer); its threads' names.
async fn threads_when_ready(one_cpu: bool) -> Vec<String> {
    let dir = TempDir::new().unwrap();
    let mut cmd = if one_cpu {
        let mut cmd = Command::new("taskset");
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
        .env("DEDUPD_LISTEN", "127.0.0.1:0");
    let (child, port, _drain) = spawn_serving(cmd);
    let child = Killed(child);
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
    threads(child.0.id())
}

/// A child stopped when the test ends, a failed one too.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn with_one_cpu_the_log_is_synced_on_its_own_thread_and_with_more_by_the_writer() {
    let one = threads_when_ready(true).await;
    assert!(one.iter().any(|t| t == "dedupd-writer"), "{one:?}");
    assert!(one.iter().any(|t| t == "dedupd-syncer"), "one CPU: {one:?}");
    if std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2 {
        let more = threads_when_ready(false).await;
        assert!(more.iter().any(|t| t == "dedupd-writer"), "{more:?}");
        assert!(
            !more.iter().any(|t| t == "dedupd-syncer"),
            "two CPUs or more: {more:?}"
        );
    }
}
