//! systemd integration: the real binary talks to a real notify socket, and
//! the watchdog's liveness check notices a writer stuck in a sync.
//! Also the example config shipped beside the unit, and what `serve` sets
//! for its own process at start (open files, huge pages).

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

use dedupd::store::redb::faults::FaultPlan;
use serde_json::json;
use tempfile::TempDir;

use crate::support::app::spawn_faulty_app_with;
use crate::support::process::dedupd;
use crate::support::process::sigterm;
use crate::support::process::spawn_serving;
#[test]
fn the_example_systemd_config_is_valid() {
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/systemd/dedupd.toml");
    let dir = TempDir::new().unwrap();
    let tokens = dir.path().join("api-tokens");
    std::fs::write(&tokens, "credential-token-0123456789\n").unwrap();
    let out = dedupd()
        .args(["check-config", "--config", file])
        .env("DEDUPD_API__TOKENS_FILE", &tokens)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("data_path = \"/var/lib/dedupd/dedupd.redb\""),
        "{stdout}"
    );
    assert!(stdout.contains("1 API token(s)"), "{stdout}");
}

/// The next datagram on `socket`, as text; fails the test after 10 s.
fn next_message(socket: &UnixDatagram) -> String {
    let mut buf = [0u8; 4096];
    let n = socket.recv(&mut buf).expect("a notify message within 10 s");
    String::from_utf8(buf[..n].to_vec()).unwrap()
}

/// `GET /healthz` over a plain socket: the status line and the rest.
fn healthz(port: u16) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn serve_says_ready_pings_the_watchdog_and_says_stopping_on_sigterm() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut cmd = dedupd();
    cmd.arg("serve")
        .current_dir(dir.path())
        .env("DEDUPD_LISTEN", "127.0.0.1:0")
        .env("NOTIFY_SOCKET", &path)
        // Pings every 2 s, each after the writer and the dispatcher
        // answered within 1 s: at 200 ms (answers within 50 ms) one ping
        // failed in CI while the whole suite loaded the disk and cores.
        .env("WATCHDOG_USEC", "4000000");
    let (mut child, port, drain) = spawn_serving(cmd);

    // First, while the data file opens, more time asked for the start
    // (a long log replay or migration is not killed by TimeoutStartSec).
    let starting = next_message(&socket);
    assert!(
        starting
            .lines()
            .any(|l| l == "EXTEND_TIMEOUT_USEC=60000000")
            && starting.lines().any(|l| l.starts_with("STATUS=starting")),
        "{starting:?}"
    );
    // READY comes once the store is open and the port bound (it answers).
    let ready = next_message(&socket);
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready:?}");
    assert!(
        ready
            .lines()
            .any(|l| l == format!("STATUS=serving on 127.0.0.1:{port}")),
        "{ready:?}"
    );
    assert!(healthz(port).starts_with("HTTP/1.1 200"));

    // Then watchdog pings, again and again.
    for _ in 0..3 {
        assert_eq!(next_message(&socket), "WATCHDOG=1\n");
    }

    sigterm(&child);
    let stopping = loop {
        let m = next_message(&socket);
        if m != "WATCHDOG=1\n" {
            break m;
        }
    };
    assert!(stopping.lines().any(|l| l == "STOPPING=1"), "{stopping:?}");
    assert!(
        stopping.lines().any(|l| l.starts_with("STATUS=stopping")),
        "{stopping:?}"
    );
    assert!(child.wait().unwrap().success());
    drain.join().unwrap();
}

#[test]
fn without_a_notify_socket_serve_runs_as_before() {
    let dir = TempDir::new().unwrap();
    let mut cmd = dedupd();
    cmd.arg("serve")
        .current_dir(dir.path())
        .env("DEDUPD_LISTEN", "127.0.0.1:0")
        .env_remove("NOTIFY_SOCKET")
        .env("WATCHDOG_USEC", "200000");
    let (mut child, port, drain) = spawn_serving(cmd);
    assert!(healthz(port).starts_with("HTTP/1.1 200"));
    sigterm(&child);
    assert!(child.wait().unwrap().success());
    drain.join().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_stuck_in_a_sync_fails_the_liveness_check_until_it_returns() {
    let plan = FaultPlan::new();
    let app = spawn_faulty_app_with(|_| {}, plan.clone()).await;
    let liveness = app.liveness.clone();
    // Generous windows: a free writer answers in microseconds, a hung one
    // never, and a loaded machine must not look like a hung writer.
    let ok_within = Duration::from_secs(10);
    let within = Duration::from_secs(1);
    assert_eq!(liveness.check(ok_within).await, Ok(()));

    // A claim whose sync never returns: the writer is stuck in it.
    plan.set_hung(true);
    let claim = tokio::spawn({
        let req = app.request(reqwest::Method::POST, "/v1/claims/stuck");
        async move { req.json(&json!({})).send().await.unwrap().status() }
    });
    // The claim reaches the writer when the machine gets to it: look until
    // the check fails (each look costs microseconds while the writer is
    // free), for at most 20 s.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while liveness.check(within).await.is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "the check kept passing while the writer hung"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        liveness.check(within).await,
        Err("the store's writer does not respond")
    );

    // The sync returns: the writer answers again, and the claim succeeds.
    plan.set_hung(false);
    assert_eq!(claim.await.unwrap(), 201);
    assert_eq!(liveness.check(ok_within).await, Ok(()));
}

/// `Max open files` (soft, hard) of process `pid`, from /proc.
fn open_files_limits(pid: u32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let mut fields = line["Max open files".len()..].split_whitespace();
    (
        fields.next().unwrap().to_owned(),
        fields.next().unwrap().to_owned(),
    )
}

/// Started with a soft limit of 256 open files (the defaults allow 1024
/// HTTP connections and 256 deliveries), `serve` raises its soft limit to
/// the hard one before it serves.
#[tokio::test]
async fn serve_raises_a_short_open_files_soft_limit_to_the_hard_one() {
    let dir = TempDir::new().unwrap();
    let mut cmd = std::process::Command::new("/bin/sh");
    for (k, _) in std::env::vars() {
        if k.starts_with("DEDUPD_") || k == "RUST_LOG" {
            cmd.env_remove(k);
        }
    }
    cmd.args(["-c", "ulimit -S -n 256 && exec \"$0\" serve"])
        .arg(env!("CARGO_BIN_EXE_dedupd"))
        .current_dir(dir.path())
        .env("DEDUPD_LISTEN", "127.0.0.1:0");
    let (child, _port, drain) = spawn_serving(cmd);
    let (soft, hard) = open_files_limits(child.id());
    assert!(
        crate::support::process::stop(child, "-TERM", drain)
            .await
            .success()
    );
    assert_ne!(hard, "256", "this test needs a hard limit above 256");
    assert_eq!(soft, hard, "the soft limit was raised to the hard one");
}

/// `THP_enabled` of process `pid` from /proc, if the kernel reports it.
fn thp_enabled(pid: &str) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("THP_enabled:"))?;
    line.split_whitespace().nth(1).map(str::to_owned)
}

/// `THP_enabled` of a `serve` started with `env`, read while it serves.
async fn serve_thp_enabled(env: &[(&str, &str)]) -> Option<String> {
    let dir = TempDir::new().unwrap();
    let mut cmd = dedupd();
    cmd.arg("serve")
        .current_dir(dir.path())
        .env("DEDUPD_LISTEN", "127.0.0.1:0")
        .env_remove("MIMALLOC_ALLOW_THP")
        .envs(env.iter().copied());
    let (child, _port, drain) = spawn_serving(cmd);
    let enabled = thp_enabled(&child.id().to_string());
    assert!(
        crate::support::process::stop(child, "-TERM", drain)
            .await
            .success()
    );
    enabled
}

/// `serve` runs with transparent huge pages off (`THP_enabled: 0` in
/// /proc): with them, memory grew in 2 MiB pages zeroed inside the writer's
/// page faults, which held every write behind it for milliseconds several
/// times a second under sustained claims. `MIMALLOC_ALLOW_THP=1` keeps them.
#[tokio::test]
async fn serve_turns_transparent_huge_pages_off_unless_told_to_keep_them() {
    // Where this process has them off already (inherited) or the kernel
    // does not say, a child's 0 would prove nothing.
    if thp_enabled("self").as_deref() != Some("1") {
        eprintln!("skipped: this test process's THP_enabled is not 1");
        return;
    }
    assert_eq!(serve_thp_enabled(&[]).await.as_deref(), Some("0"));
    assert_eq!(
        serve_thp_enabled(&[("MIMALLOC_ALLOW_THP", "1")])
            .await
            .as_deref(),
        Some("1")
    );
}
