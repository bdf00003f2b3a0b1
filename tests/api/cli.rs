//! The `dedupd` binary: check-config, and serve with a graceful SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use tempfile::TempDir;

/// `dedupd check-config --config FILE`, run to completion.
pub(crate) fn check_config(file: &std::path::Path) -> std::process::Output {
    dedupd()
        .args(["check-config", "--config"])
        .arg(file)
        .output()
        .unwrap()
}

pub(crate) fn dedupd() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dedupd"));
    // The tests' own environment must not leak settings in.
    for (k, _) in std::env::vars() {
        if k.starts_with("DEDUPD_") || k == "RUST_LOG" {
            cmd.env_remove(k);
        }
    }
    cmd
}

#[test]
fn check_config_prints_effective_settings_with_secrets_redacted() {
    let dir = TempDir::new().unwrap();
    let file = dir.path().join("dedupd.toml");
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "# rotated weekly\nfile-token-abcdefghijkl\n\n").unwrap();
    std::fs::write(
        &file,
        format!(
            "listen = \"0.0.0.0:9000\"\n[api]\ntokens = [\"inline-secret-0123456789\"]\ntokens_file = {:?}\n[claims]\nmax_ttl = \"7d\"\n",
            tokens.display().to_string()
        ),
    )
    .unwrap();
    let out = dedupd()
        .args(["check-config", "--config"])
        .arg(&file)
        .env("DEDUPD_CLAIMS__DEFAULT_TTL", "90s")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("listen = \"0.0.0.0:9000\""), "{stdout}");
    assert!(stdout.contains("max_ttl = \"7days\""), "{stdout}");
    assert!(
        stdout.contains("default_ttl = \"1m 30s\""),
        "env overrides file: {stdout}"
    );
    assert!(stdout.contains("<redacted>"));
    assert!(!stdout.contains("inline-secret"), "{stdout}");
    assert!(!stdout.contains("file-token"), "{stdout}");
    assert!(stdout.contains("2 API token(s)"), "{stdout}");
}

#[test]
fn check_config_names_the_bad_key_and_the_file_it_came_from() {
    let dir = TempDir::new().unwrap();
    let file = dir.path().join("bad.toml");
    std::fs::write(&file, "[claims]\ndefault_ttl = \"forever\"\n").unwrap();
    let out = check_config(&file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("claims.default_ttl"), "{stderr}");
    assert!(stderr.contains("bad.toml"), "{stderr}");
}

#[test]
fn check_config_names_the_environment_variable_of_a_bad_value() {
    let out = dedupd()
        .arg("check-config")
        .env("DEDUPD_HTTP__WORKERS", "lots")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("http.workers"), "{stderr}");
    assert!(stderr.contains("DEDUPD_HTTP__WORKERS"), "{stderr}");
}

/// figment parses a variable's brackets (and nests its name's `__` parts)
/// recursively: 50 000 of them overflowed the stack and aborted. Now each
/// is refused with the variable's name, before anything is parsed.
#[test]
fn a_deeply_nested_environment_variable_is_refused_by_name() {
    let deep_value = dedupd()
        .arg("check-config")
        .env("DEDUPD_LISTEN", "[".repeat(50_000))
        .output()
        .unwrap();
    let deep_name = dedupd()
        .arg("check-config")
        .env(format!("DEDUPD_{}B", "A__".repeat(40_000)), "1")
        .output()
        .unwrap();
    for (out, named) in [
        (deep_value, "(from environment variable DEDUPD_LISTEN)"),
        (deep_name, "DEDUPD_A__A__A__"),
    ] {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("levels deep"), "{stderr}");
        assert!(stderr.contains(named), "{stderr}");
        assert!(stderr.len() < 1000, "the name is cut short: {stderr}");
    }
}

#[test]
fn check_config_refuses_a_ttl_default_above_the_maximum() {
    let out = dedupd()
        .arg("check-config")
        .env("DEDUPD_CLAIMS__MAX_TTL", "1m")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("claims.default_ttl"), "{stderr}");
    assert!(stderr.contains("exceeds claims.max_ttl"), "{stderr}");
    assert!(stderr.contains("defaults"), "{stderr}");
}

#[test]
fn unknown_keys_and_missing_files_are_errors() {
    let dir = TempDir::new().unwrap();
    let file = dir.path().join("typo.toml");
    std::fs::write(&file, "[claims]\nmax_tll = \"1d\"\n").unwrap();
    let out = check_config(&file);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("max_tll"));

    let out = dedupd()
        .arg("check-config")
        .env("DEDUPD_CONFIG", dir.path().join("absent.toml"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("absent.toml"));
}

#[test]
fn serve_refuses_a_non_loopback_address_without_tokens_and_says_why() {
    let dir = TempDir::new().unwrap();
    let out = dedupd()
        .arg("serve")
        .current_dir(dir.path())
        .env("DEDUPD_LISTEN", "0.0.0.0:0")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("without API tokens"), "{stderr}");
    assert!(stderr.contains("DEDUPD_LISTEN"), "{stderr}");
    assert!(
        !dir.path().join("dedupd.redb").exists(),
        "nothing was opened"
    );
}

/// Starts `dedupd serve` in `dir` and returns it with its port, read from
/// its JSON log.
pub(crate) fn serve(dir: &TempDir) -> (std::process::Child, u16, crate::cli::Drain) {
    let mut cmd = dedupd();
    cmd.arg("serve")
        .current_dir(dir.path())
        .env("DEDUPD_LISTEN", "127.0.0.1:0");
    spawn_serving(cmd)
}

/// Starts `dedupd serve --config FILE`; returns it with its port.
fn serve_config(file: &std::path::Path) -> (std::process::Child, u16, crate::cli::Drain) {
    let mut cmd = dedupd();
    cmd.args(["serve", "--config"]).arg(file);
    spawn_serving(cmd)
}

/// Runs `cmd` (a `serve`) with JSON logs until it says which port it
/// serves on; the log is then drained so the child never blocks on a full
/// pipe.
pub(crate) fn spawn_serving(cmd: Command) -> (std::process::Child, u16, crate::cli::Drain) {
    spawn_serving_on(cmd, "port")
}

/// [`spawn_serving`], returning the port its log names in `field` (the
/// startup line carries `port` and, with a RESP listener, `resp_port`).
pub(crate) fn spawn_serving_on(
    cmd: Command,
    field: &str,
) -> (std::process::Child, u16, crate::cli::Drain) {
    let (child, port, _, drain) = spawn_serving_logged(cmd, field);
    (child, port, drain)
}

/// [`spawn_serving_on`], also giving the log's lines up to the one that
/// names the port (start-up warnings among them).
pub(crate) fn spawn_serving_logged(
    mut cmd: Command,
    field: &str,
) -> (std::process::Child, u16, Vec<String>, crate::cli::Drain) {
    let mut child = cmd
        .env("DEDUPD_LOG__FORMAT", "json")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut start = Vec::new();
    let port = loop {
        let line = lines.next().expect("dedupd exited before serving").unwrap();
        if let Ok(v) = serde_json::from_str::<Value>(&line)
            && let Some(p) = v[field].as_u64()
        {
            break u16::try_from(p).unwrap();
        }
        start.push(line);
    };
    let echo = std::env::var_os("DEDUPD_TEST_ECHO").is_some();
    let drain = std::thread::spawn(move || {
        let mut rest = Vec::new();
        for line in lines.map_while(Result::ok) {
            if echo {
                eprintln!("{line}");
            }
            rest.push(line);
        }
        rest
    });
    (child, port, start, drain)
}

/// The thread reading a served dedupd's log after the line that named its
/// port: joined once the process exits, it gives the rest of the log.
pub(crate) type Drain = std::thread::JoinHandle<Vec<String>>;

pub(crate) fn signal(child: &std::process::Child, sig: &str) {
    let status = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// Sends `sig` to a served dedupd and waits (off the async threads) for it
/// to exit and for its log to drain; its exit status.
pub(crate) async fn stop(
    child: std::process::Child,
    sig: &str,
    drain: Drain,
) -> std::process::ExitStatus {
    stop_logged(child, sig, drain).await.0
}

/// [`stop`], also giving the log's lines after the one naming the port.
pub(crate) async fn stop_logged(
    child: std::process::Child,
    sig: &str,
    drain: Drain,
) -> (std::process::ExitStatus, Vec<String>) {
    signal(&child, sig);
    let status = tokio::task::spawn_blocking(move || wait(child))
        .await
        .unwrap();
    (status, drain.join().unwrap())
}

pub(crate) fn sigterm(child: &std::process::Child) {
    signal(child, "-TERM");
}

/// Claims `n` keys `{prefix}{i}` and returns their fences.
async fn claim_many(base: &str, prefix: &str, n: usize) -> Vec<u64> {
    let client = reqwest::Client::new();
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
    let client = reqwest::Client::new();
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

pub(crate) fn wait(mut child: std::process::Child) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(std::time::Instant::now() < deadline, "dedupd did not stop");
        std::thread::sleep(Duration::from_millis(20));
    }
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
    let client = reqwest::Client::new();
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

#[test]
fn check_config_names_the_source_and_key_of_each_gateway_mistake() {
    let dir = TempDir::new().unwrap();
    let file = dir.path().join("sources.toml");
    std::fs::write(
        &file,
        r#"
[sources.sume]
scheme = "sume"
event_id = "body:request_id"
stream = "body:/run~2id"
forward_to = "not a url"

[sources.stripe]
scheme = "stripe"
secrets = ["whsec_abc"]
event_id = "header:Stripe Event"
forward_to = "ftp://example.com/x"
destination_secret = "not base64!"
"#,
    )
    .unwrap();
    let out = check_config(&file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    for key in [
        "sources.sume.secrets",
        "sources.sume.event_id",
        "sources.sume.stream",
        "sources.sume.forward_to",
        "sources.sume.destination_secret",
        "sources.stripe.event_id",
        "sources.stripe.forward_to",
        "sources.stripe.destination_secret",
    ] {
        assert!(stderr.contains(key), "{key} missing in:\n{stderr}");
    }
    assert!(stderr.contains("sources.toml"), "{stderr}");
    assert!(
        !stderr.contains("whsec_abc"),
        "secrets never appear in errors"
    );

    std::fs::write(&file, "[sources.x]\nscheme = \"smoke-signals\"\nevent_id = \"body:/id\"\nforward_to = \"http://127.0.0.1:1/\"\n").unwrap();
    let out = check_config(&file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("sources.x.scheme") && stderr.contains("smoke-signals"),
        "{stderr}"
    );
}

#[test]
fn a_valid_source_with_secrets_from_files_passes_check_config_redacted() {
    let dir = TempDir::new().unwrap();
    let secrets = dir.path().join("sume-keys");
    std::fs::write(&secrets, "old-sume-secret\nnew-sume-secret\n").unwrap();
    let dest = dir.path().join("dest");
    std::fs::write(&dest, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n").unwrap();
    let file = dir.path().join("ok.toml");
    std::fs::write(
        &file,
        format!(
            "[sources.sume]\nscheme = \"sume\"\nsecrets_file = {:?}\ndestination_secret_file = {:?}\nevent_id = \"body:/request_id\"\ncreated_at = \"body:/created_at\"\nstream = \"body:/run_id\"\nforward_to = \"http://127.0.0.1:3000/hooks/sume\"\n",
            secrets.display().to_string(),
            dest.display().to_string()
        ),
    )
    .unwrap();
    let out = check_config(&file);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("[sources.sume]"), "{stdout}");
    assert!(
        stdout.contains("max_attempts = 12"),
        "defaults are shown: {stdout}"
    );
    assert!(
        !stdout.contains("sume-secret") && !stdout.contains("MfKQ9"),
        "{stdout}"
    );
}

#[test]
fn check_config_says_what_replaced_gateway_workers() {
    let dir = TempDir::new().unwrap();
    let file = dir.path().join("old.toml");
    std::fs::write(&file, "[gateway]\nworkers = 4\nmax_in_flight = 0\n").unwrap();
    let out = check_config(&file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("gateway.workers")
            && stderr.contains("gateway.max_in_flight")
            && stderr.contains("sources.NAME.max_in_flight"),
        "{stderr}"
    );
    assert!(stderr.contains("must be 1 to 4096"), "{stderr}");
}

#[tokio::test]
async fn check_config_names_removed_sources_that_still_have_pending_events() {
    use crate::gateway::{body, gateway_app};
    use crate::receiver::{Behaviour, Receiver, eventually};

    let receiver = Receiver::start(Behaviour::Always(503)).await;
    let app = gateway_app(&receiver.url, |s| s.max_attempts = 100).await;
    for id in ["a", "b"] {
        app.ingest_ok(&body(id, id, "2026-11-29T10:00:00Z")).await;
    }
    eventually("both tried", || async { receiver.received().len() >= 2 }).await;
    let (loaded, dir, _, _) = app.stop().await;
    let file = dir.path().join("no-sources.toml");
    std::fs::write(
        &file,
        format!(
            "data_path = {:?}\n",
            loaded.settings.data_path.display().to_string()
        ),
    )
    .unwrap();
    let out = check_config(&file);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("removed source sume: 2 pending event(s)"),
        "{stdout}"
    );
}

#[test]
fn check_config_refuses_settings_that_open_holes_and_says_why() {
    let dir = TempDir::new().unwrap();
    let file = dir.path().join("holes.toml");
    std::fs::write(
        &file,
        r#"
[claims]
max_ttl = "4000d"

[storage]
checkpoint_idle = "5ms"
commit_hold = "1s"

[sources.sume]
scheme = "sume"
secrets = ["sume-secret"]
tolerance = "500ms"
event_id = "header:X-Sume-Event-Id"
stream = "header:X-Run"
forward_to = "http://127.0.0.1:3000/hooks"
destination_secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

[sources.sw]
scheme = "standard-webhooks"
secrets = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]
tolerance = "2h"
event_id = "header:webhook-id"
forward_to = "http://127.0.0.1:3000/hooks"
destination_secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
"#,
    )
    .unwrap();
    let out = check_config(&file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    for (key, why) in [
        ("claims.max_ttl", "3650 days"),
        ("sources.sume.event_id", "not covered by the sume signature"),
        ("sources.sume.stream", "not covered by the sume signature"),
        ("sources.sume.tolerance", "must be 1s to 1h"),
        ("sources.sw.tolerance", "must be 1s to 1h"),
        ("storage.checkpoint_idle", "must be 10ms to 1h"),
        ("storage.commit_hold", "must be 0s to 100ms"),
    ] {
        assert!(
            stderr.lines().any(|l| l.contains(key) && l.contains(why)),
            "{key}: {why} missing in:\n{stderr}"
        );
    }
    assert!(
        !stderr.contains("sources.sw.event_id"),
        "webhook-id is signed by standard-webhooks: {stderr}"
    );
}

/// A source table for the bounds below, with `extra` lines.
fn bounded_source(extra: &str) -> String {
    format!(
        "[sources.s]\nscheme = \"sume\"\nsecrets = [\"sume-secret-0123\"]\n\
         event_id = \"body:/id\"\nforward_to = \"http://127.0.0.1:3000/hooks\"\n\
         destination_secret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n{extra}\n"
    )
}

/// Every number check-config accepts, serve runs with. Each bound below
/// was a value that passed check-config and then made serve panic (a
/// writer batch of i64::MAX: `capacity overflow`, the process left
/// answering 503), abort (a queue or batch allocated up front), refuse to
/// start (a dedupe window past what the file stores in ms), let one client
/// make it buffer any body, or write expiries Redis cannot take. Each is
/// refused with its key and its range, and its largest value is accepted.
#[test]
fn check_config_bounds_every_number_that_serve_could_not_run_with() {
    let dir = TempDir::new().unwrap();
    // (the setting's TOML past its bound, the key, the range named, the
    // TOML at its bound)
    let cases: [(String, &str, &str, String); 14] = [
        (
            "[storage]\nmax_batch = 9223372036854775807".into(),
            "storage.max_batch",
            "must be 1 to 65536",
            "[storage]\nmax_batch = 65536".into(),
        ),
        (
            "[storage]\nmax_batch = 65537".into(),
            "storage.max_batch",
            "must be 1 to 65536",
            "[storage]\nmax_batch = 1".into(),
        ),
        (
            "[storage]\nqueue_capacity = 2305843009213693952".into(),
            "storage.queue_capacity",
            "must be 1 to 1000000",
            "[storage]\nqueue_capacity = 1000000".into(),
        ),
        (
            "[http]\nmax_body_bytes = 16777217".into(),
            "http.max_body_bytes",
            "must be 1024 to 16777216",
            "[http]\nmax_body_bytes = 16777216".into(),
        ),
        (
            "[ordering]\nretention = \"3651d\"".into(),
            "ordering.retention",
            "must be 1ms to 3650d",
            "[ordering]\nretention = \"3650d\"".into(),
        ),
        (
            "[gateway]\ndelivered_retention = \"3651d\"".into(),
            "gateway.delivered_retention",
            "must be 1ms to 3650d",
            "[gateway]\ndelivered_retention = \"3650d\"".into(),
        ),
        (
            "[gateway]\ndead_retention = \"500000000000y\"".into(),
            "gateway.dead_retention",
            "must be 1ms to 3650d",
            "[gateway]\ndead_retention = \"3650d\"".into(),
        ),
        (
            "[gateway]\ndedupe_window = \"500000000000y\"".into(),
            "gateway.dedupe_window",
            "must be at most 3650d",
            "[gateway]\ndedupe_window = \"3650d\"".into(),
        ),
        (
            "[reaper]\nbatch_size = 9223372036854775807".into(),
            "reaper.batch_size",
            "must be 1 to 100000",
            "[reaper]\nbatch_size = 100000".into(),
        ),
        (
            "[storage.redis]\nexpiry_slack = \"2d\"".into(),
            "storage.redis.expiry_slack",
            "must be at most 1d",
            "[storage.redis]\nexpiry_slack = \"1d\"".into(),
        ),
        (
            "[storage.redis]\nconnect_timeout = \"500000000000y\"".into(),
            "storage.redis.connect_timeout",
            "must be more than 0 and at most 1h",
            "[storage.redis]\nconnect_timeout = \"1h\"".into(),
        ),
        (
            "[storage.redis]\nresponse_timeout = \"2h\"".into(),
            "storage.redis.response_timeout",
            "must be more than 0 and at most 1h",
            "[storage.redis]\nresponse_timeout = \"1h\"".into(),
        ),
        (
            "[storage.redis]\nresponse_timeout = \"0s\"".into(),
            "storage.redis.response_timeout",
            "must be more than 0 and at most 1h",
            "[storage.redis]\nresponse_timeout = \"1ms\"".into(),
        ),
        (
            bounded_source("forward_timeout = \"500000000000y\""),
            "sources.s.forward_timeout",
            "must be more than 0 and at most 1h",
            bounded_source("forward_timeout = \"1h\""),
        ),
    ];
    for (i, (past, key, range, at)) in cases.iter().enumerate() {
        let file = dir.path().join(format!("past{i}.toml"));
        std::fs::write(&file, past).unwrap();
        let out = check_config(&file);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{past}: {stderr}");
        assert!(
            stderr.lines().any(|l| l.contains(key) && l.contains(range)),
            "{past}: {key}: {range} missing in:\n{stderr}"
        );
        let file = dir.path().join(format!("at{i}.toml"));
        std::fs::write(&file, at).unwrap();
        let out = check_config(&file);
        assert!(
            out.status.success(),
            "{at}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The report's cases through `serve` itself: a clear error and exit 1, not
/// a writer thread that panics while `/healthz` says 200, nor an abort; and
/// a dedupe window with a fraction of a millisecond (the file keeps whole
/// ms) serves, where it once refused to start.
#[tokio::test]
async fn serve_refuses_what_it_could_not_run_with_and_runs_what_check_config_accepts() {
    let dir = TempDir::new().unwrap();
    for (setting, key) in [
        (
            "[storage]\nmax_batch = 9223372036854775807",
            "storage.max_batch",
        ),
        (
            "[storage]\nmax_batch = 100000000000000",
            "storage.max_batch",
        ),
        (
            "[storage]\nqueue_capacity = 2305843009213693952",
            "storage.queue_capacity",
        ),
    ] {
        let file = dir.path().join("serve.toml");
        std::fs::write(&file, format!("listen = \"127.0.0.1:0\"\n{setting}\n")).unwrap();
        let mut child = dedupd()
            .args(["serve", "--config"])
            .arg(&file)
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // It used to keep running (a writer that panicked, every write
        // answered 503): waited for, up to a generous deadline.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("serve with {setting} was still running after 30 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{setting}: {stderr}");
        assert!(stderr.contains(key), "{setting}: {stderr}");
        assert!(!stderr.contains("panicked"), "{setting}: {stderr}");
        assert!(!dir.path().join("dedupd.redb").exists(), "nothing opened");
    }
    let file = dir.path().join("window.toml");
    std::fs::write(
        &file,
        format!(
            "data_path = {:?}\n[gateway]\ndedupe_window = \"30d 1ms 500us\"\n",
            dir.path().join("w.redb").display().to_string()
        ),
    )
    .unwrap();
    assert!(check_config(&file).status.success());
    let (child, port, drain) = serve_config(&file);
    let res = reqwest::get(format!("http://127.0.0.1:{port}/readyz"))
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert!(stop(child, "-TERM", drain).await.success());
}

/// A dedupe window that a replay within a source's `tolerance` could
/// outlive is refused, naming the key, the source and both values; for a
/// source without a signed timestamp (github) only the minute counts.
#[test]
fn check_config_refuses_a_dedupe_window_shorter_than_twice_a_tolerance() {
    let dir = TempDir::new().unwrap();
    let file = dir.path().join("window.toml");
    let config = |window: &str| {
        format!(
            r#"
[gateway]
dedupe_window = "{window}"

[sources.sw]
scheme = "standard-webhooks"
secrets = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]
tolerance = "1h"
event_id = "header:webhook-id"
forward_to = "http://127.0.0.1:3000/hooks"
destination_secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

[sources.gh]
scheme = "github"
secrets = ["github-secret"]
tolerance = "1h"
event_id = "body:/id"
forward_to = "http://127.0.0.1:3000/hooks"
destination_secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
"#
        )
    };
    std::fs::write(&file, config("2h")).unwrap();
    let out = check_config(&file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.contains("gateway.dedupe_window"))
        .unwrap_or_else(|| panic!("gateway.dedupe_window missing in:\n{stderr}"));
    for part in ["window.toml", "2h", "sources.sw.tolerance", "1h", "2h 1m"] {
        assert!(line.contains(part), "{part} missing in: {line}");
    }
    assert!(
        !stderr.contains("sources.gh"),
        "github signs no timestamp: {stderr}"
    );

    std::fs::write(&file, config("2h 1m")).unwrap();
    let out = check_config(&file);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("dedupe_window = \"2h 1m\""),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    std::fs::write(&file, "[gateway]\ndedupe_window = \"59s\"\n").unwrap();
    let out = check_config(&file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("gateway.dedupe_window") && l.contains("at least 1m")),
        "{stderr}"
    );
}

/// Mounts a 24 MiB tmpfs on a new temp dir (root only); on drop, the
/// servers it was told of are killed (a failed assertion leaves them
/// running) and it is unmounted.
struct Tmpfs(TempDir, std::cell::RefCell<Vec<u32>>);

impl Tmpfs {
    fn mount() -> Self {
        let dir = TempDir::new().unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=24m", "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("mount");
        assert!(status.success(), "mounting a tmpfs needs root");
        Self(dir, Default::default())
    }

    /// Kills `child` on drop unless it has exited by then.
    fn holds(&self, child: &std::process::Child) {
        self.1.borrow_mut().push(child.id());
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        for pid in self.1.borrow().iter() {
            // Only if that pid is still a dedupd (not a reused one).
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if !String::from_utf8_lossy(&cmdline).contains("dedupd") {
                continue;
            }
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
        // The kernel releases a killed process's files a moment later.
        for _ in 0..50 {
            if Command::new("umount")
                .arg(self.0.path())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The drill of issue 29, on a real disk: the data on a 24 MiB tmpfs that
/// already holds 6 MiB of other files; 60 KB events ingested until the
/// answer is a 5xx, to a receiver that answers 503 (backoff an hour), with
/// the default settings otherwise. At the watermark writes are refused
/// (507) and everything else works: readiness says why, the listing and
/// `/metrics` answer. Once the other files go, writes resume by themselves;
/// a restart at the watermark opens and serves reads; nothing acknowledged
/// is lost. (Before the watermark, the log took the last bytes and nothing
/// could be checkpointed: after the space was freed writes stayed refused,
/// and a restart failed with "No space left on device".)
#[tokio::test]
#[ignore = "needs root to mount a tmpfs: .ci/run runs it"]
async fn a_real_disk_at_the_watermark_refuses_writes_serves_reads_and_recovers_by_itself() {
    use dedupd::gateway::signature::{Scheme, sign};

    use crate::receiver::{Behaviour, Receiver};

    let disk = Tmpfs::mount();
    let ballast = disk.0.path().join("ballast");
    std::fs::write(&ballast, vec![7u8; 6 * 1024 * 1024]).unwrap();
    let receiver = Receiver::start(Behaviour::Always(503)).await;
    let conf = TempDir::new().unwrap();
    let file = conf.path().join("drill.toml");
    std::fs::write(
        &file,
        format!(
            r#"
listen = "127.0.0.1:0"
data_path = "{}"
[sources.drill]
scheme = "sume"
secrets = ["drill-secret"]
event_id = "body:/request_id"
forward_to = "{}"
backoff_min = "1h"
backoff_max = "1h"
destination_secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
"#,
            disk.0.path().join("dedupd.redb").display(),
            receiver.url,
        ),
    )
    .unwrap();
    let client = reqwest::Client::new();
    let post = |base: String, id: String| {
        let client = client.clone();
        async move {
            let body = serde_json::to_vec(&serde_json::json!({
                "request_id": id, "pad": "x".repeat(60 * 1024),
            }))
            .unwrap();
            let ts = i64::try_from(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_secs(),
            )
            .unwrap();
            let mut req = client
                .post(format!("{base}/ingest/drill"))
                .body(body.clone());
            for (k, v) in sign(Scheme::Sume, "drill-secret", ts, "", &body) {
                req = req.header(k, v);
            }
            let res = req.send().await.unwrap();
            (
                res.status().as_u16(),
                res.headers().get("retry-after").is_some(),
            )
        }
    };
    let get = |url: String| {
        let client = client.clone();
        async move {
            let res = client.get(url).send().await.unwrap();
            let status = res.status().as_u16();
            (status, res.text().await.unwrap())
        }
    };
    let listed = |base: String| async move {
        let mut ids = Vec::new();
        for status in ["pending", "dead"] {
            let (code, body) = get(format!(
                "{base}/v1/sources/drill/events?status={status}&limit=500"
            ))
            .await;
            assert_eq!(code, 200, "the listing is served: {body}");
            let v: Value = serde_json::from_str(&body).unwrap();
            for e in v["events"].as_array().unwrap() {
                ids.push(e["event_id"].as_str().unwrap().to_owned());
            }
        }
        ids
    };

    let (child, port, _drain) = serve_config(&file);
    disk.holds(&child);
    let base = format!("http://127.0.0.1:{port}");
    // Fill up to the watermark through the API.
    let mut acknowledged = Vec::new();
    let mut refused = None;
    for i in 0..1000 {
        match post(base.clone(), format!("ev{i}")).await {
            (200, _) => acknowledged.push(format!("ev{i}")),
            (status, retry_after) => {
                refused = Some((status, retry_after));
                break;
            }
        }
    }
    assert_eq!(
        refused,
        Some((507, true)),
        "refused with 507 and Retry-After"
    );
    let (status, body) = get(format!("{base}/readyz")).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("disk_low"), "readiness says why: {body}");
    let (status, metrics) = get(format!("{base}/metrics")).await;
    assert_eq!(status, 200);
    assert!(metrics.contains("dedupd_store_free_bytes"), "{metrics}");
    assert_eq!(listed(base.clone()).await.len(), acknowledged.len());

    // The other files go: writes resume by themselves.
    std::fs::remove_file(&ballast).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut n = 0;
    loop {
        let id = format!("after{n}");
        n += 1;
        match post(base.clone(), id.clone()).await {
            (200, _) => {
                acknowledged.push(id);
                break;
            }
            (507, _) => {}
            other => panic!("unexpected answer {other:?}"),
        }
        assert!(
            std::time::Instant::now() < deadline,
            "writes did not resume within 30 s of the space freeing"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(get(format!("{base}/readyz")).await.0, 200);

    // Up to the watermark again, then a restart there: it opens and serves
    // reads, with every acknowledged event.
    for i in 0..1000 {
        match post(base.clone(), format!("more{i}")).await {
            (200, _) => acknowledged.push(format!("more{i}")),
            (507, _) => break,
            other => panic!("unexpected answer {other:?}"),
        }
    }
    sigterm(&child);
    assert!(wait(child).success());
    let (child, port, _drain) = serve_config(&file);
    disk.holds(&child);
    let base = format!("http://127.0.0.1:{port}");
    let stored = listed(base.clone()).await;
    for id in &acknowledged {
        assert!(stored.contains(id), "{id} was acknowledged and is gone");
    }
    sigterm(&child);
    assert!(wait(child).success());
}

/// The JSON log of `dedupd serve` at `level` after the line naming its
/// port, through one answered claim and a SIGTERM, line by line.
async fn log_around_a_claim(level: &str) -> Vec<Value> {
    let dir = TempDir::new().unwrap();
    let mut cmd = dedupd();
    cmd.arg("serve")
        .current_dir(dir.path())
        .env("DEDUPD_LISTEN", "127.0.0.1:0")
        .env("DEDUPD_LOG__LEVEL", level);
    let (child, port, drain) = spawn_serving(cmd);
    let res = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/v1/claims/log-probe"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), reqwest::StatusCode::CREATED);
    let (status, log) = stop_logged(child, "-TERM", drain).await;
    assert!(status.success());
    log.iter()
        .map(|l| serde_json::from_str(l).unwrap_or(Value::Null))
        .collect()
}

fn request_lines(log: &[Value]) -> Vec<&Value> {
    log.iter()
        .filter(|v| v["message"] == "request done")
        .collect()
}

#[tokio::test]
async fn the_default_log_level_writes_no_line_per_request_and_debug_does() {
    let info = log_around_a_claim("info").await;
    assert!(
        info.iter().any(|v| v["signal"] == "SIGTERM"),
        "the log was read: {info:?}"
    );
    assert!(request_lines(&info).is_empty(), "{info:?}");

    let debug = log_around_a_claim("debug").await;
    let lines = request_lines(&debug);
    assert!(
        lines
            .iter()
            .any(|v| v["path"] == "/v1/claims/log-probe" && v["status"] == 201),
        "{debug:?}"
    );
}
