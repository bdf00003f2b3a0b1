//! `dedupd init`, `receive` and `trigger`: the README's one-minute tour,
//! run as a new user runs it — the real binary in three processes. Every
//! wait is on something a process prints or answers.

use std::io::BufRead;
use std::io::BufReader;
use std::path::Path;
use std::path::PathBuf;
use std::process::Output;
use std::process::Stdio;
use std::sync::mpsc;

use serde_json::Value;
use tempfile::TempDir;

use crate::support::process::dedupd;
use crate::support::process::spawn_serving;
use crate::support::process::{PATIENCE, Recorder, Running, init};
use crate::support::receiver::Behaviour;
use crate::support::receiver::Receiver;

fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

/// A running `dedupd receive` and the lines it prints, as they come.
struct Receive {
    _child: Running,
    lines: mpsc::Receiver<String>,
    /// Every line read so far.
    seen: Vec<String>,
    port: u16,
}

impl Receive {
    /// Starts `dedupd receive --config FILE --listen 127.0.0.1:0 ARGS…` and
    /// waits for the line saying where it listens.
    fn start(config: &Path, args: &[&str]) -> Self {
        let mut child = dedupd()
            .args(["receive", "--listen", "127.0.0.1:0", "--config"])
            .arg(config)
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut receive = Self {
            _child: Running(child),
            lines,
            seen: Vec::new(),
            port: 0,
        };
        let first = receive.next_line();
        let addr = first
            .strip_prefix("listening on http://")
            .and_then(|rest| rest.split(':').nth(1))
            .unwrap_or_else(|| panic!("not a listening line: {first}"));
        receive.port = addr.parse().unwrap();
        receive
    }

    fn next_line(&mut self) -> String {
        let line = self
            .lines
            .recv_timeout(PATIENCE)
            .unwrap_or_else(|_| panic!("receive printed nothing more; so far: {:?}", self.seen));
        self.seen.push(line.clone());
        line
    }

    /// Reads lines until one that contains every part of `needles`.
    fn until(&mut self, needles: &[&str]) -> String {
        loop {
            let line = self.next_line();
            if needles.iter().all(|n| line.contains(n)) {
                return line;
            }
        }
    }

    /// Lines read so far that mention `id`.
    fn lines_of(&self, id: &str) -> Vec<&String> {
        self.seen.iter().filter(|l| l.contains(id)).collect()
    }
}

/// A config written by `dedupd init`, a server and a receiver running on it.
struct Tour {
    /// The source `init` wrote.
    source: String,
    config: PathBuf,
    _serve: Running,
    _drain: crate::support::process::Drain,
    port: u16,
    receive: Receive,
    /// Removed last, after the processes using it stopped.
    dir: TempDir,
}

impl Tour {
    /// `init`, then `receive` with `receive_args`, then `serve` delivering
    /// to it. Retries are fast: the test config's source backs off 10 ms.
    fn start(receive_args: &[&str]) -> Self {
        Self::start_with("sume", receive_args)
    }

    /// As [`Tour::start`], with `init --source SOURCE`.
    fn start_with(source: &str, receive_args: &[&str]) -> Self {
        Self::start_edited(source, receive_args, |config| config)
    }

    /// As [`Tour::start_with`], the config edited by `edit` once it
    /// delivers to the receiver.
    fn start_edited(source: &str, receive_args: &[&str], edit: impl Fn(String) -> String) -> Self {
        let dir = TempDir::new().unwrap();
        let config = dir.path().join("dedupd.toml");
        let out = init(&config, &["--source", source]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let receive = Receive::start(&config, receive_args);
        let written = std::fs::read_to_string(&config).unwrap();
        let edited = written
            .replace(
                "http://127.0.0.1:3000/hooks",
                &format!("http://127.0.0.1:{}/hooks", receive.port),
            )
            .replace("backoff_min = \"1s\"", "backoff_min = \"10ms\"")
            .replace("backoff_max = \"1h\"", "backoff_max = \"20ms\"");
        assert_ne!(written, edited);
        std::fs::write(&config, edit(edited)).unwrap();
        let mut cmd = dedupd();
        cmd.args(["serve", "--config"])
            .arg(&config)
            .current_dir(dir.path())
            .env("DEDUPD_LISTEN", "127.0.0.1:0");
        let (serve, port, drain) = spawn_serving(cmd);
        Self {
            source: source.to_owned(),
            config,
            _serve: serve,
            _drain: drain,
            port,
            receive,
            dir,
        }
    }

    /// `dedupd trigger SOURCE ARGS…` against this server, run to completion.
    /// The server listens on the port it picked, not the config's: the
    /// posts go to `--url`, and `--out-of-order` reads the operator API at
    /// the `listen` of the configuration, here from `DEDUPD_LISTEN`.
    fn trigger(&self, args: &[&str]) -> Output {
        let out = dedupd()
            .args(["trigger", &self.source, "--config"])
            .arg(&self.config)
            .args(["--url", &format!("http://127.0.0.1:{}", self.port)])
            .env("DEDUPD_LISTEN", format!("127.0.0.1:{}", self.port))
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "trigger failed:\n{}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        out
    }

    /// Triggers one event and returns its id and what trigger printed.
    fn trigger_one(&self, args: &[&str]) -> (String, String) {
        let stdout = text(&self.trigger(args).stdout);
        (
            event_id_after(&stdout, &format!("{} event ", self.source)),
            stdout,
        )
    }

    /// The source's events with `status`, read with `dedupd events list`.
    fn events(&self, status: &str) -> Vec<String> {
        let out = dedupd()
            .args([
                "events",
                "list",
                "--source",
                &self.source,
                "--status",
                status,
            ])
            .args(["--json", "--config"])
            .arg(&self.config)
            .args(["--url", &format!("http://127.0.0.1:{}", self.port)])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["event_id"].as_str().unwrap().to_owned())
            .collect()
    }
}

/// The event id printed after `prefix` in trigger's output.
fn event_id_after(stdout: &str, prefix: &str) -> String {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(prefix))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no {prefix:?} line in:\n{stdout}"))
        .to_owned()
}

#[test]
fn init_writes_a_config_that_check_config_accepts() {
    let dir = TempDir::new().unwrap();
    let config = dir.path().join("dedupd.toml");
    let out = init(
        &config,
        &[
            "--source",
            "billing",
            "--forward-to",
            "http://127.0.0.1:4000/in",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("dedupd serve --config"));
    let written = std::fs::read_to_string(&config).unwrap();
    assert!(written.contains("[sources.billing]"), "{written}");
    assert!(
        written.contains("scheme = \"standard-webhooks\""),
        "a name that is not a scheme gets the standard one: {written}"
    );
    assert!(
        written.contains("destination_secret = \"whsec_"),
        "{written}"
    );

    let check = dedupd()
        .args(["check-config", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let stdout = text(&check.stdout);
    assert!(check.status.success(), "{}", text(&check.stderr));
    assert!(
        stdout.contains("/ingest/billing -> http://127.0.0.1:4000/in"),
        "{stdout}"
    );
    assert!(stdout.contains("1 API token(s) in effect"), "{stdout}");
}

/// `tolerance` bounds a signed timestamp: `init` writes it, as a replay
/// window, only for the schemes that sign one, and for the others says
/// what catches a replay instead. Every template passes `check-config`
/// without a warning.
#[test]
fn init_promises_a_replay_window_only_where_a_timestamp_is_signed() {
    let untimed = ["github", "shopify", "square"];
    let dir = TempDir::new().unwrap();
    for scheme in dedupd::domain::ALL_SCHEMES.map(|s| s.name()) {
        let config = dir.path().join(format!("{scheme}.toml"));
        let out = init(&config, &["--scheme", scheme]);
        assert!(out.status.success(), "{scheme}: {}", text(&out.stderr));
        let written = std::fs::read_to_string(&config).unwrap();
        let window = written.lines().any(|l| {
            l.starts_with("tolerance = ") && l.contains("replay window on the signed timestamp")
        });
        if untimed.contains(&scheme) {
            assert!(
                !written.contains("signed timestamp")
                    && !written.lines().any(|l| l.starts_with("tolerance")),
                "{scheme} signs no timestamp:\n{written}"
            );
            for words in ["signs no timestamp", "duplicate", "gateway.dedupe_window"] {
                assert!(written.contains(words), "{scheme}: {words:?} in\n{written}");
            }
        } else {
            assert!(window, "{scheme} signs a timestamp:\n{written}");
        }
        let check = dedupd()
            .args(["check-config", "--config"])
            .arg(&config)
            .output()
            .unwrap();
        assert!(check.status.success(), "{scheme}: {}", text(&check.stderr));
        assert_eq!(text(&check.stderr), "", "{scheme}");
    }
}

#[test]
fn init_refuses_to_overwrite_a_file_and_says_so() {
    let dir = TempDir::new().unwrap();
    let config = dir.path().join("dedupd.toml");
    std::fs::write(&config, "# mine\n").unwrap();
    let out = init(&config, &[]);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("already exists"), "{stderr}");
    assert!(stderr.contains("not overwriting"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&config).unwrap(), "# mine\n");
}

#[test]
fn init_with_a_bad_url_writes_nothing_and_names_the_key() {
    let dir = TempDir::new().unwrap();
    let config = dir.path().join("dedupd.toml");
    let out = init(&config, &["--forward-to", "ftp://example.com/x"]);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("sources.sume.forward_to"), "{stderr}");
    assert!(!config.exists());
}

#[test]
fn a_triggered_event_is_received_once_verified() {
    let mut tour = Tour::start(&[]);
    let (id, stdout) = tour.trigger_one(&[]);
    assert!(stdout.contains("200 OK"), "{stdout}");
    assert!(stdout.contains("\"accepted\""), "{stdout}");
    let line = tour.receive.until(&[&id]);
    assert!(line.contains("attempt 1"), "{line}");
    assert!(line.contains("stream run_"), "{line}");
    assert!(line.contains("  verified  "), "{line}");
    assert!(line.ends_with("-> 204"), "{line}");
}

#[test]
fn a_standard_webhooks_source_is_triggered_and_verified_the_same_way() {
    let mut tour = Tour::start_with("hooks", &[]);
    let (id, stdout) = tour.trigger_one(&["--duplicate"]);
    assert!(id.starts_with("msg_"), "{stdout}");
    assert!(stdout.contains("\"duplicate\""), "{stdout}");
    let line = tour.receive.until(&[&id]);
    assert!(line.contains("  verified  "), "{line}");
    assert!(line.ends_with("-> 204"), "{line}");
}

#[test]
fn trigger_posts_a_file_as_it_is() {
    let mut tour = Tour::start(&[]);
    let file = tour.dir.path().join("event.json");
    let body = r#"{"request_id":"req_from_file","run_id":"run_f","created_at":"2026-11-30T07:00:00Z","type":"run.failed"}"#;
    std::fs::write(&file, body).unwrap();
    let (id, _) = tour.trigger_one(&["--body", file.to_str().unwrap()]);
    assert_eq!(id, "req_from_file");
    let line = tour.receive.until(&["req_from_file"]);
    assert!(line.contains("stream run_f"), "{line}");
    assert!(line.contains("  verified  "), "{line}");
}

#[test]
fn a_duplicate_is_answered_as_such_and_received_once() {
    let mut tour = Tour::start(&[]);
    let (id, stdout) = tour.trigger_one(&["--duplicate"]);
    let answers: Vec<&str> = stdout.lines().filter(|l| l.contains("-> ")).collect();
    assert_eq!(answers.len(), 2, "{stdout}");
    assert!(answers[0].contains("\"accepted\""), "{stdout}");
    assert!(answers[1].contains("\"duplicate\""), "{stdout}");
    tour.receive.until(&[&id, "-> 204"]);
    // A later event arrives after anything the duplicate could have caused.
    let (later, _) = tour.trigger_one(&[]);
    tour.receive.until(&[&later, "-> 204"]);
    assert_eq!(
        tour.receive.lines_of(&id).len(),
        1,
        "{:?}",
        tour.receive.seen
    );
    assert!(tour.events("pending").is_empty());
}

/// A source whose one destination is not `default` delivers from its
/// destination's lane (`sume.app`): `--out-of-order` follows the events
/// there (it once waited for them in `sume`, where they never are, and
/// said the newer was still pending though it had been received).
#[test]
fn trigger_out_of_order_follows_a_destinations_lane() {
    let mut tour = Tour::start_edited("sume", &[], |config| {
        let (before, after) = config.split_once("forward_to = \"").unwrap();
        let (url, rest) = after.split_once('"').unwrap();
        format!(
            "{before}{rest}\n[[sources.sume.destinations]]\nname = \"app\"\nforward_to = \"{url}\"\n"
        )
    });
    let out = tour.trigger(&["--out-of-order", "--wait", "20s"]);
    let stdout = text(&out.stdout);
    let newer = event_id_after(&stdout, "newer event ");
    assert!(stdout.contains("-> delivered"), "{stdout}");
    assert!(stdout.contains("-> stale"), "{stdout}");
    tour.receive.until(&[&newer, "-> 204"]);
}

#[test]
fn an_older_event_posted_after_a_newer_one_is_stale_and_never_received() {
    let mut tour = Tour::start(&[]);
    let out = tour.trigger(&["--out-of-order"]);
    let stdout = text(&out.stdout);
    let newer = event_id_after(&stdout, "newer event ");
    let older = event_id_after(&stdout, "older event ");
    assert!(stdout.contains("-> stale"), "{stdout}");
    tour.receive.until(&[&newer, "-> 204"]);
    // trigger returned once the older one was settled; a later event shows
    // that nothing of it reached the receiver meanwhile.
    let (later, _) = tour.trigger_one(&[]);
    tour.receive.until(&[&later, "-> 204"]);
    assert!(
        tour.receive.lines_of(&older).is_empty(),
        "{:?}",
        tour.receive.seen
    );
    assert_eq!(tour.events("stale"), vec![older]);
}

#[test]
fn a_failing_receiver_gets_the_event_again_and_takes_attempt_3() {
    let mut tour = Tour::start(&["--fail", "2"]);
    let (id, _) = tour.trigger_one(&[]);
    for (attempt, status) in [(1, 503), (2, 503), (3, 204)] {
        let line = tour.receive.until(&[&id]);
        assert!(line.contains(&format!("attempt {attempt} ")), "{line}");
        assert!(line.contains("  verified  "), "{line}");
        assert!(line.contains(&format!("-> {status}")), "{line}");
    }
    assert_eq!(tour.events("delivered"), vec![id]);
}

#[tokio::test]
async fn receive_answers_401_to_a_bad_signature_and_prints_it() {
    let dir = TempDir::new().unwrap();
    let config = dir.path().join("dedupd.toml");
    assert!(init(&config, &[]).status.success());
    let mut receive = Receive::start(&config, &[]);
    let body = br#"{"request_id":"req_forged"}"#.to_vec();
    let mut req = crate::support::http::client()
        .post(format!("http://127.0.0.1:{}/hooks", receive.port))
        .body(body.clone());
    // Signed, but with a secret that is not the source's.
    for (k, v) in dedupd::gateway::signature::sign(
        dedupd::gateway::signature::Scheme::StandardWebhooks,
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        i64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs(),
        )
        .unwrap(),
        "req_forged",
        &body,
    ) {
        req = req.header(k, v);
    }
    let res = req.send().await.unwrap();
    assert_eq!(res.status(), 401);
    let line = receive.until(&["req_forged"]);
    assert!(line.contains("NOT VERIFIED"), "{line}");
    assert!(line.contains("no configured secret matches"), "{line}");
    assert!(line.ends_with("-> 401"), "{line}");
}

/// During a rotation an application may still hold the old secret or
/// already the new one; `receive`, reading the source's list, stands in
/// for either: a request signed with any one of them verifies.
#[tokio::test]
async fn receive_verifies_with_any_destination_secret_of_a_rotating_source() {
    const NEW: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
    const OLD: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let dir = TempDir::new().unwrap();
    let config = dir.path().join("dedupd.toml");
    assert!(init(&config, &[]).status.success());
    let written = std::fs::read_to_string(&config).unwrap();
    let rotating: String = written
        .lines()
        .map(|l| {
            if l.starts_with("destination_secret = ") {
                format!("destination_secrets = [{NEW:?}, {OLD:?}]\n")
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    assert_ne!(written, rotating);
    std::fs::write(&config, rotating).unwrap();
    let mut receive = Receive::start(&config, &[]);
    assert!(
        receive.seen[0].contains("with any of the 2 destination secrets of source sume"),
        "{:?}",
        receive.seen
    );
    let now = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    )
    .unwrap();
    for (id, secret, status) in [
        ("req_new", NEW, 204),
        ("req_old", OLD, 204),
        ("req_other", "whsec_c2VjcmV0LW90aGVy", 401),
    ] {
        let body = format!(r#"{{"request_id":"{id}"}}"#).into_bytes();
        let mut req = crate::support::http::client()
            .post(format!("http://127.0.0.1:{}/hooks", receive.port))
            .body(body.clone());
        for (k, v) in dedupd::gateway::signature::sign(
            dedupd::gateway::signature::Scheme::StandardWebhooks,
            secret,
            now,
            id,
            &body,
        ) {
            req = req.header(k, v);
        }
        assert_eq!(req.send().await.unwrap().status(), status, "{id}");
        let line = receive.until(&[id]);
        let verdict = if status == 204 {
            "  verified  "
        } else {
            "NOT VERIFIED"
        };
        assert!(line.contains(verdict), "{line}");
    }
}

/// The API token is for `/v1`; ingest trusts the provider's signature only.
/// `trigger --url` may name any server, so its post carries the signature
/// and no token: a server that is not dedupd learns no token from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trigger_sends_the_signature_and_no_api_token() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let dir = TempDir::new().unwrap();
    let config = dir.path().join("dedupd.toml");
    assert!(init(&config, &[]).status.success());
    let written = std::fs::read_to_string(&config).unwrap();
    let token = written
        .lines()
        .find_map(|l| l.strip_prefix("tokens = [\""))
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .to_owned();
    let base = receiver.url.trim_end_matches("/hooks").to_owned();
    let out = tokio::task::spawn_blocking(move || {
        dedupd()
            .args(["trigger", "sume", "--config"])
            .arg(&config)
            .args(["--url", &base])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let got = receiver.received();
    assert_eq!(got.len(), 1, "one post to /ingest/sume");
    assert!(got[0].header("x-sume-signature").starts_with("v1="));
    assert_eq!(got[0].headers.get("authorization"), None);
    assert!(
        got[0].headers.values().all(|v| !v.contains(&token)),
        "{:?}",
        got[0].headers
    );
    receiver.stop().await;
}

/// `--out-of-order` follows its events through the operator API with the
/// config's token: at the config's own `listen`, never at `--url`, which
/// may name any server (it once polled `--url` with the token).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trigger_out_of_order_sends_the_api_token_only_to_the_configured_api() {
    let dir = TempDir::new().unwrap();
    let config = dir.path().join("dedupd.toml");
    assert!(init(&config, &[]).status.success());
    let written = std::fs::read_to_string(&config).unwrap();
    let token = written
        .lines()
        .find_map(|l| l.strip_prefix("tokens = [\""))
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .to_lowercase();
    let elsewhere = Recorder::start(r#"{"event_id":"x","status":"accepted"}"#);
    let api = Recorder::start(r#"{"events":[],"next":null}"#);
    let url = format!("http://127.0.0.1:{}", elsewhere.port);
    let listen = format!("127.0.0.1:{}", api.port);
    let out = tokio::task::spawn_blocking(move || {
        dedupd()
            .args([
                "trigger",
                "sume",
                "--out-of-order",
                "--wait",
                "1s",
                "--config",
            ])
            .arg(&config)
            .args(["--url", &url])
            .env("DEDUPD_LISTEN", listen)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let printed = format!("{}{}", text(&out.stdout), text(&out.stderr));
    // The API here never lists the event: it stays "pending".
    assert!(!out.status.success(), "{printed}");
    assert!(printed.contains("still pending"), "{printed}");
    let posted = elsewhere.heads();
    assert_eq!(
        posted.len(),
        1,
        "only the newer event's post: {:?}",
        &posted[..posted.len().min(2)]
    );
    assert!(posted[0].starts_with("post /ingest/sume "), "{posted:?}");
    assert!(
        posted
            .iter()
            .all(|h| !h.contains(&token) && !h.contains("authorization")),
        "the token went to --url: {posted:?}"
    );
    let polled = api.heads();
    assert!(!polled.is_empty(), "{printed}");
    for head in &polled {
        assert!(head.starts_with("get /v1/sources/sume/events?"), "{head}");
        assert!(
            head.contains(&format!("authorization: bearer {token}")),
            "{head}"
        );
    }
}

/// What `receive` prints of a request comes from whoever sent it, signed
/// or not: an ANSI escape or a carriage return in a body's stream is
/// printed escaped, never sent to the terminal as it is.
#[tokio::test]
async fn receive_prints_control_characters_from_a_request_escaped() {
    let dir = TempDir::new().unwrap();
    let config = dir.path().join("dedupd.toml");
    assert!(init(&config, &[]).status.success());
    let mut receive = Receive::start(&config, &[]);
    let body =
        r#"{"request_id":"req_esc","run_id":"\u001b[31mred\u001b]0;title\u0007\rover\u009b2J"}"#;
    let res = crate::support::http::client()
        .post(format!("http://127.0.0.1:{}/hooks", receive.port))
        .header("webhook-id", "req_esc")
        .header("dedupd-source", "sume")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 401, "not signed");
    let line = receive.until(&["req_esc"]);
    assert!(
        !line.chars().any(char::is_control),
        "a control character reached the terminal: {line:?}"
    );
    assert!(
        line.contains("stream \\u{1b}[31mred\\u{1b}]0;title\\u{7}\\u{d}over\\u{9b}2J"),
        "{line}"
    );
    assert!(line.contains("NOT VERIFIED"), "{line}");
}

/// `dedupd receive --source dedupd-alerts` plays the alert endpoint: an
/// event whose destination refuses its only attempt goes dead, and the
/// `event.dead` alert arrives verified with the alerts' secret.
#[test]
fn receive_verifies_the_alerts_of_the_configuration() {
    let dir = TempDir::new().unwrap();
    let config = dir.path().join("dedupd.toml");
    let out = init(&config, &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let written = std::fs::read_to_string(&config).unwrap();
    // Port 1: nothing listens, each attempt fails at once.
    let edited = written
        .replace("http://127.0.0.1:3000/hooks", "http://127.0.0.1:1/hooks")
        .replace("max_attempts = 12", "max_attempts = 1")
        + "\n[alerts]\nforward_to = \"http://127.0.0.1:3001/alerts\"\n\
           destination_secret = \"whsec_QWxlcnRzU2lnbmluZ1NlY3JldDEyMzQ1Ng==\"\n";
    std::fs::write(&config, &edited).unwrap();
    let mut receive = Receive::start(&config, &["--source", "dedupd-alerts"]);
    assert!(
        receive.seen[0].contains("source dedupd-alerts"),
        "{:?}",
        receive.seen
    );
    std::fs::write(
        &config,
        edited.replace(
            "http://127.0.0.1:3001/alerts",
            &format!("http://127.0.0.1:{}/alerts", receive.port),
        ),
    )
    .unwrap();
    let mut cmd = dedupd();
    cmd.args(["serve", "--config"])
        .arg(&config)
        .current_dir(dir.path())
        .env("DEDUPD_LISTEN", "127.0.0.1:0");
    let (serve, port, _drain) = spawn_serving(cmd);
    let _serve = serve;
    let out = dedupd()
        .args(["trigger", "sume", "--config"])
        .arg(&config)
        .args(["--url", &format!("http://127.0.0.1:{port}")])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let line = receive.until(&["alert_"]);
    assert!(line.contains("  verified  "), "{line}");
    assert!(line.ends_with("-> 204"), "{line}");
}
