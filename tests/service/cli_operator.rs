//! The operator commands (`dedupd events`, `claims`, `streams`) against a
//! running server with API tokens: tables, `--json`, where the URL and
//! token come from, and the errors for a refused token or no server.

use std::path::PathBuf;
use std::process::Output;

use serde_json::Value;
use serde_json::json;
use tempfile::TempDir;

use crate::support::ports::free_port;
use crate::support::process::Running;
use crate::support::process::dedupd;
use crate::support::process::spawn_serving;
use crate::support::receiver::eventually;
const TOKEN: &str = "operator-token-0123456789";

/// A server with one token and a source whose destination never answers,
/// so each event is dead after its one attempt.
struct Server {
    config: PathBuf,
    url: String,
    client: reqwest::Client,
    _serve: Running,
    _drain: crate::support::process::Drain,
    _dir: TempDir,
}

impl Server {
    fn start() -> Self {
        let dir = TempDir::new().unwrap();
        let config = dir.path().join("dedupd.toml");
        std::fs::write(
            &config,
            format!(
                r#"
listen = "127.0.0.1:0"
[api]
tokens = ["{TOKEN}"]
[sources.sume]
scheme = "sume"
secrets = ["sume-test-secret"]
event_id = "body:/request_id"
created_at = "body:/created_at"
stream = "body:/run_id"
forward_to = "http://127.0.0.1:{}/nobody"
max_attempts = 1
destination_secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
"#,
                free_port()
            ),
        )
        .unwrap();
        let mut cmd = dedupd();
        cmd.args(["serve", "--config"])
            .arg(&config)
            .current_dir(dir.path());
        let (serve, port, drain) = spawn_serving(cmd);
        Self {
            config,
            url: format!("http://127.0.0.1:{port}"),
            client: crate::support::http::client(),
            _serve: serve,
            _drain: drain,
            _dir: dir,
        }
    }

    /// `dedupd ARGS… --url URL --token TOKEN`.
    fn run(&self, args: &[&str]) -> Output {
        dedupd()
            .args(args)
            .args(["--url", &self.url, "--token", TOKEN])
            .output()
            .unwrap()
    }

    /// As [`Server::run`], expecting success; returns stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// As [`Server::ok`] with `--json`, parsed.
    fn json(&self, args: &[&str]) -> Value {
        let mut args = args.to_vec();
        args.push("--json");
        serde_json::from_str(&self.ok(&args)).unwrap()
    }

    /// A `/v1` request with the token.
    async fn v1(&self, path: &str, body: Value) -> Value {
        let res = self
            .client
            .post(format!("{}{path}", self.url))
            .bearer_auth(TOKEN)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(res.status().is_success(), "{path}: {}", res.status());
        res.json().await.unwrap()
    }

    /// Posts a sample event with `dedupd trigger` and waits until it is dead.
    async fn dead_event(&self) -> String {
        let out = dedupd()
            .args(["trigger", "sume", "--config"])
            .arg(&self.config)
            .args(["--url", &self.url])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{stdout}");
        let id = stdout
            .split_whitespace()
            .find(|w| w.starts_with("req_"))
            .unwrap()
            .to_owned();
        eventually("the event to be dead", || async {
            let v = self.json(&["events", "list", "--source", "sume", "--status", "dead"]);
            v["events"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["event_id"] == id)
        })
        .await;
        id
    }
}

fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test]
async fn events_list_shows_dead_events_as_a_table_and_as_json() {
    let server = Server::start();
    let id = server.dead_event().await;

    let table = server.ok(&["events", "list", "--source", "sume", "--status", "dead"]);
    let mut lines = table.lines();
    let header = lines.next().unwrap();
    for column in [
        "EVENT ID",
        "STATUS",
        "STREAM",
        "CREATED AT",
        "ATTEMPTS",
        "LAST ERROR",
    ] {
        assert!(header.contains(column), "{table}");
    }
    let row = lines.next().unwrap();
    assert!(row.starts_with(&id), "{table}");
    assert!(row.contains("  dead  "), "{table}");
    assert!(row.contains("request failed"), "the last error: {table}");

    let v = server.json(&["events", "list", "--source", "sume", "--status", "dead"]);
    assert_eq!(v["status"], "dead");
    assert_eq!(v["events"][0]["event_id"], id.as_str());
    assert_eq!(v["events"][0]["attempts"], 1);

    let none = server.ok(&["events", "list", "--source", "sume", "--status", "stale"]);
    assert_eq!(none.trim(), "no stale events in source sume");
}

#[tokio::test]
async fn events_show_prints_an_event_and_its_attempts() {
    let server = Server::start();
    let id = server.dead_event().await;

    let out = server.ok(&["events", "show", "--source", "sume", &id]);
    let field = |name: &str| {
        out.lines()
            .find(|l| l.starts_with(&format!("{name}  ")))
            .unwrap_or_else(|| panic!("no {name} line: {out}"))
            .to_owned()
    };
    assert!(field("EVENT").ends_with(&id), "{out}");
    assert!(field("STATUS").ends_with("dead"), "{out}");
    assert!(field("ATTEMPTS").ends_with(" 1"), "{out}");
    assert!(field("LAST ERROR").contains("request failed"), "{out}");
    let header = out
        .lines()
        .find(|l| l.starts_with("ATTEMPT "))
        .unwrap_or_else(|| panic!("no timeline: {out}"));
    for column in ["SENT AT", "STATUS", "LATENCY", "ERROR"] {
        assert!(header.contains(column), "{out}");
    }
    let rows: Vec<&str> = out
        .lines()
        .skip_while(|l| !l.starts_with("ATTEMPT "))
        .skip(1)
        .collect();
    assert_eq!(rows.len(), 1, "{out}");
    // Nobody answered: no status, and the error says why.
    assert!(rows[0].starts_with("1  "), "{out}");
    assert!(rows[0].contains("  -  "), "no status: {out}");
    assert!(rows[0].contains(" ms "), "a latency: {out}");
    assert!(rows[0].ends_with("(os error 111)"), "the error: {out}");
    assert!(field("SOURCE").ends_with("sume"), "{out}");

    let v = server.json(&["events", "show", "--source", "sume", &id]);
    assert_eq!(v["timeline"][0]["attempt"], 1, "{v}");
    assert!(v["timeline"][0]["status"].is_null(), "{v}");

    // Redelivered, it is tried again: the timeline goes on, the attempt
    // number starts over.
    server.ok(&["events", "redeliver", "--source", "sume", &id]);
    eventually("a second attempt", || async {
        let v = server.json(&["events", "show", "--source", "sume", &id]);
        v["status"] == "dead" && v["timeline"].as_array().unwrap().len() == 2
    })
    .await;
    let v = server.json(&["events", "show", "--source", "sume", &id]);
    assert_eq!(v["timeline"][1]["attempt"], 1, "{v}");

    let out = server.run(&["events", "show", "--source", "sume", "req_unknown"]);
    assert!(!out.status.success());
    let stderr = stderr_of(&out);
    assert!(
        stderr.contains("req_unknown") && stderr.contains("404"),
        "{stderr}"
    );
}

#[tokio::test]
async fn events_redeliver_puts_a_dead_event_back_to_pending() {
    let server = Server::start();
    let id = server.dead_event().await;
    let dead = |v: Value| v["events"][0]["due_at_ms"].as_u64().unwrap();
    let settled = dead(server.json(&["events", "list", "--source", "sume", "--status", "dead"]));
    let out = server.ok(&["events", "redeliver", "--source", "sume", &id]);
    assert!(
        out.contains(&format!("{id} of source sume: pending again")),
        "{out}"
    );
    // It is attempted again and, its destination still down, settles as
    // dead a second time.
    eventually("a second settlement", || async {
        let v = server.json(&["events", "list", "--source", "sume", "--status", "dead"]);
        v["events"][0]["event_id"] == id.as_str() && dead(v) > settled
    })
    .await;

    let out = server.run(&["events", "redeliver", "--source", "sume", "req_unknown"]);
    assert!(!out.status.success());
    let stderr = stderr_of(&out);
    assert!(
        stderr.contains("event req_unknown of source sume"),
        "{stderr}"
    );
    assert!(stderr.contains("404"), "{stderr}");
}

#[tokio::test]
async fn claims_get_and_streams_get_show_state_as_a_table_and_as_json() {
    let server = Server::start();
    let claimed = server.v1("/v1/claims/run%2F7", json!({})).await;
    server
        .v1(
            "/v1/streams/orders/apply",
            json!({"event_id": "evt_1", "created_at": "2026-11-30T07:00:00Z"}),
        )
        .await;

    let table = server.ok(&["claims", "get", "run/7"]);
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].starts_with("KEY    STATE       FENCE  EXPIRES AT"),
        "{table}"
    );
    assert!(lines[1].starts_with("run/7  processing  "), "{table}");
    assert!(lines[1].contains(&claimed["fence"].to_string()), "{table}");
    assert!(lines[1].contains("(in 4m"), "{table}");
    let v = server.json(&["claims", "get", "run/7"]);
    assert_eq!(v["state"], "processing");
    assert_eq!(v["fence"], claimed["fence"]);
    assert!(v.get("token").is_none(), "the token is never shown again");

    let table = server.ok(&["streams", "get", "orders"]);
    assert_eq!(
        table,
        "STREAM  HEAD EVENT  HEAD CREATED AT\norders  evt_1       2026-11-30T07:00:00Z\n"
    );
    let v = server.json(&["streams", "get", "orders"]);
    assert_eq!(v["head"]["event_id"], "evt_1");

    let out = server.run(&["claims", "get", "absent"]);
    assert!(!out.status.success());
    assert!(
        stderr_of(&out).contains("claim absent: 404 Not Found"),
        "{}",
        stderr_of(&out)
    );
    let out = server.run(&["streams", "get", "absent", "--json"]);
    assert!(!out.status.success());
    let problem: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(problem["code"], "not_found");
}

#[tokio::test]
async fn the_token_comes_from_the_flag_the_environment_or_the_config() {
    let server = Server::start();
    let args = ["streams", "get", "nothing-applied"];
    // Each reaches the API: a 404, not a 401.
    let flag = server.run(&args);
    let env = dedupd()
        .args(args)
        .env("DEDUPD_URL", &server.url)
        .env("DEDUPD_TOKEN", TOKEN)
        .output()
        .unwrap();
    let config = dedupd()
        .args(args)
        .args(["--url", &server.url, "--config"])
        .arg(&server.config)
        .output()
        .unwrap();
    for out in [flag, env, config] {
        assert!(
            stderr_of(&out).contains("404 Not Found"),
            "{}",
            stderr_of(&out)
        );
    }
}

#[tokio::test]
async fn a_refused_or_missing_token_is_a_clear_error() {
    let server = Server::start();
    let out = dedupd()
        .args([
            "claims",
            "get",
            "k",
            "--url",
            &server.url,
            "--token",
            "wrong-token-0123456789",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = stderr_of(&out);
    assert!(stderr.contains("refused the API token"), "{stderr}");
    assert!(stderr.contains("--token or DEDUPD_TOKEN"), "{stderr}");

    let out = dedupd()
        .args(["claims", "get", "k", "--url", &server.url])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        stderr_of(&out).contains("requires an API token and none was given"),
        "{}",
        stderr_of(&out)
    );
}

#[test]
fn an_unreachable_server_is_a_clear_error() {
    let url = format!("http://127.0.0.1:{}", free_port());
    let out = dedupd()
        .args([
            "events", "list", "--source", "sume", "--url", &url, "--token", TOKEN,
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = stderr_of(&out);
    assert!(
        stderr.contains(&format!("cannot reach dedupd at {url}")),
        "{stderr}"
    );
    assert!(
        stderr.contains("Is `dedupd serve` running there?"),
        "{stderr}"
    );
}

#[test]
fn the_client_variables_are_not_server_settings() {
    let out = dedupd()
        .arg("check-config")
        .env("DEDUPD_URL", "http://127.0.0.1:1")
        .env("DEDUPD_TOKEN", TOKEN)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
}

/// What a terminal would act on: C0 and C1 controls (but the newlines
/// between lines), DEL, and the bidirectional overrides.
fn first_unprintable(text: &str) -> Option<char> {
    text.chars().find(|&c| {
        (c.is_control() && c != '\n')
            || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    })
}

/// A hostile server (or a man in the middle on plain http://) puts
/// terminal escapes (a title change, colours, C1 CSI, a right-to-left
/// override) in every string it answers: the tables, the `more:` cursor,
/// the errors, `--json` and trigger's echo of an answer print them
/// escaped, never as they are.
#[test]
fn nothing_a_server_answers_reaches_the_terminal_unescaped() {
    use crate::support::process::{Recorder, init};
    const E: &str = "\u{1b}]0;pwned\u{7}\u{1b}[31mRED\u{9b}2J\u{202e}evil'$(id)";
    let event = json!({
        "event_id": E, "status": E, "stream": E, "created_at": E, "received_at_ms": 1,
        "attempts": 1, "due_at_ms": 1, "last_error": E, "expires_at_ms": 1, "body_bytes": 1,
    });
    let listing = json!({ "source": E, "status": "dead", "events": [event], "next": E });
    let problem = json!({ "type": E, "title": E, "status": 409, "detail": E, "code": E });
    let lists = Recorder::answering(200, listing.to_string());
    let refuses = Recorder::answering(409, problem.to_string());
    let answers = Recorder::answering(200, json!({ "status": E }).to_string());
    let mut detail = event.clone();
    detail["timeline"] =
        json!([{ "attempt": E, "at_ms": 1, "status": E, "latency_ms": 1.5, "error": E }]);
    let shows = Recorder::answering(200, detail.to_string());
    let url = |r: &Recorder| format!("http://127.0.0.1:{}", r.port);
    let run = |args: &[&str]| {
        let out = dedupd()
            .args(args)
            .args(["--token", TOKEN])
            .output()
            .unwrap();
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr_of(&out),
        )
    };
    let list = ["events", "list", "--source", "s", "--url", &url(&lists)];
    let redeliver = [
        "events",
        "redeliver",
        "--source",
        "s",
        "e1",
        "--url",
        &url(&refuses),
    ];
    let escaped = "\\u{1b}]0;pwned\\u{7}\\u{1b}[31mRED\\u{9b}2J\\u{202e}evil";
    let (table, _) = run(&list);
    let more = table
        .lines()
        .find(|l| l.starts_with("more: "))
        .unwrap_or_default();
    // The cursor is escaped and quoted for a shell: pasting the line runs
    // nothing but dedupd.
    assert_eq!(
        more,
        format!("more: dedupd events list --source s --status dead --after '{escaped}'\\''$(id)'"),
        "{table}"
    );
    let (shown, _) = run(&[
        "events",
        "show",
        "--source",
        "s",
        "e1",
        "--url",
        &url(&shows),
    ]);
    assert!(shown.contains(escaped), "{shown}");
    let (refusal, refusal_err) = run(&redeliver);
    assert!(refusal_err.contains(escaped), "{refusal_err}");
    let (json_list, _) = run(&[&list[..], &["--json"]].concat());
    let (json_refusal, _) = run(&[&redeliver[..], &["--json"]].concat());
    // --json prints JSON that reads back as what the server sent.
    assert_eq!(serde_json::from_str::<Value>(&json_list).unwrap(), listing);
    assert_eq!(
        serde_json::from_str::<Value>(&json_refusal).unwrap(),
        problem
    );

    let dir = TempDir::new().unwrap();
    let config = dir.path().join("dedupd.toml");
    assert!(init(&config, &[]).status.success());
    let out = dedupd()
        .args(["trigger", "sume", "--config"])
        .arg(&config)
        .args(["--url", &url(&answers)])
        .output()
        .unwrap();
    // The answer as sent: serde_json wrote the C0 controls as JSON escapes
    // already, and the C1 and bidi ones as they are.
    let trigger = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(trigger.contains("RED\\u{9b}2J\\u{202e}evil"), "{trigger}");

    for (what, printed) in [
        ("the table", &table),
        ("events show", &shown),
        ("the refusal (stdout)", &refusal),
        ("the refusal", &refusal_err),
        ("--json", &json_list),
        ("--json of a refusal", &json_refusal),
        ("trigger", &trigger),
    ] {
        assert_eq!(first_unprintable(printed), None, "{what}: {printed:?}");
    }
}

/// An id is shown as one word a shell reads back as it: the sender's
/// `req_7 --url=http://…`, pasted from the table unquoted into
/// `events show`, sent the API token to that URL. One with a character
/// that shows as nothing (a zero-width space) shows it escaped: `req_b1`
/// and `req_b1\u{200b}` read the same.
#[test]
fn an_id_in_a_table_is_one_quoted_word_with_nothing_invisible() {
    use crate::support::process::Recorder;
    let event = |id: &str| {
        json!({
            "event_id": id, "status": "dead", "stream": "run 1", "created_at": "2026-12-07T18:01:00Z",
            "received_at_ms": 1, "attempts": 1, "due_at_ms": 1, "last_error": "HTTP 500",
            "expires_at_ms": 1, "body_bytes": 1,
        })
    };
    let listing = json!({
        "source": "s", "status": "dead", "next": null,
        "events": [event("req_7 --url=http://127.0.0.1:9/x"), event("req_b1\u{200b}"), event("req_b1")],
    });
    let lists = Recorder::answering(200, listing.to_string());
    let out = dedupd()
        .args(["events", "list", "--source", "s", "--token", TOKEN, "--url"])
        .arg(format!("http://127.0.0.1:{}", lists.port))
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{table} {}", stderr_of(&out));
    let ids: Vec<&str> = table
        .lines()
        .skip(1)
        .filter_map(|l| l.split("  ").next())
        .collect();
    assert_eq!(
        ids,
        [
            "'req_7 --url=http://127.0.0.1:9/x'",
            "'req_b1\\u{200b}'",
            "req_b1"
        ],
        "{table}"
    );
    assert!(table.contains("'run 1'"), "{table}");
    assert!(!table.contains('\u{200b}'), "{table}");
    // A count names its first ids, and the cursor to count on from, as
    // words too.
    let count = json!({
        "matched": 3, "complete": false, "scanned": 10,
        "first_ids": ["req_7 --url=http://127.0.0.1:9/x", "req_b1\u{200b}"],
        "next": "req_7 --url=http://127.0.0.1:9/x",
    });
    let counts = Recorder::answering(200, count.to_string());
    let out = dedupd()
        .args([
            "events", "count", "--source", "s", "--token", TOKEN, "--url",
        ])
        .arg(format!("http://127.0.0.1:{}", counts.port))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        said.contains(": 'req_7 --url=http://127.0.0.1:9/x', 'req_b1\\u{200b}', …"),
        "{said}"
    );
    assert!(
        said.contains("count on with --after 'req_7 --url=http://127.0.0.1:9/x' "),
        "{said}"
    );
}

/// A redirect is not followed (the token would go with it), and the
/// error says so: it printed "302 Answer: " and nothing after.
#[test]
fn a_redirect_is_an_error_that_says_so() {
    use crate::support::process::Recorder;
    let moved = Recorder::answering(302, String::new());
    let out = dedupd()
        .args(["events", "list", "--source", "s", "--token", TOKEN, "--url"])
        .arg(format!("http://127.0.0.1:{}", moved.port))
        .output()
        .unwrap();
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("a redirect, which is not followed"), "{err}");
    assert_eq!(moved.heads().len(), 1, "asked once");
}

/// A server (any `--url`) that sends an answer without end: it goes on
/// until the client hangs up. `framing` is the answer's length header.
fn endless_answer(framing: &'static str) -> (u16, std::thread::JoinHandle<u64>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let sender = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut head = [0u8; 4096];
        let _ = conn.read(&mut head);
        let chunked = framing.contains("chunked");
        let mut sent = 0u64;
        let mut write = |bytes: &[u8]| conn.write_all(bytes).is_ok();
        if !write(
            format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n{framing}\r\n\r\n")
                .as_bytes(),
        ) {
            return sent;
        }
        let block = vec![b'['; 1 << 20];
        let chunk = [
            format!("{:x}\r\n", block.len()).into_bytes(),
            block.clone(),
            b"\r\n".to_vec(),
        ]
        .concat();
        // Two GiB at most, whatever the client does.
        while sent < 2 << 30 && write(if chunked { &chunk } else { &block }) {
            sent += block.len() as u64;
        }
        sent
    });
    (port, sender)
}

/// An answer of 2 GiB (declared or sent without a length) is refused once
/// past 128 MiB, with an error that says so: the CLI read it whole into
/// memory (5.5 GB for `events list`, then a parser's error).
#[test]
fn an_answer_past_its_limit_is_refused_not_read_into_memory() {
    for framing in ["content-length: 2147483648", "transfer-encoding: chunked"] {
        let (port, sender) = endless_answer(framing);
        let out = dedupd()
            .args(["events", "list", "--source", "s", "--token", TOKEN, "--url"])
            .arg(format!("http://127.0.0.1:{port}"))
            .output()
            .unwrap();
        let err = stderr_of(&out);
        assert_eq!(out.status.code(), Some(1), "{framing}: {err}");
        assert!(
            err.contains(
                "answered more than 128 MiB: no answer of dedupd's is that large (is --url"
            ),
            "{framing}: {err}"
        );
        // It hung up: the server did not get to send its 2 GiB.
        let sent = sender.join().unwrap();
        assert!(sent < 1 << 30, "{framing}: {sent} bytes taken");
    }
}

#[tokio::test]
async fn events_count_counts_what_a_filter_matches_and_names_the_first() {
    let server = Server::start();
    let first = server.dead_event().await;
    let second = server.dead_event().await;
    let all = server.ok(&["events", "count", "--source", "sume", "--since", "1h"]);
    assert!(
        all.starts_with("2 dead events of source sume match (of 2 read): "),
        "{all}"
    );
    assert!(all.contains(&first) && all.contains(&second), "{all}");
    let one = server.json(&[
        "events",
        "count",
        "--source",
        "sume",
        "--field",
        &format!("/request_id={second}"),
    ]);
    assert_eq!(one["matched"], 1, "{one}");
    assert_eq!(one["first_ids"][0], second.as_str());
    let errors = server.json(&[
        "events",
        "count",
        "--source",
        "sume",
        "--error-contains",
        "request failed",
    ]);
    assert_eq!(errors["matched"], 2, "{errors}");
    let none = server.ok(&[
        "events",
        "count",
        "--source",
        "sume",
        "--status",
        "delivered",
    ]);
    assert_eq!(
        none.trim(),
        "0 delivered events of source sume match (of 0 read)"
    );
    let bad = server.run(&["events", "count", "--source", "sume", "--field", "type=x"]);
    assert!(!bad.status.success());
    assert!(
        stderr_of(&bad).contains("expected POINTER=VALUE with a JSON pointer"),
        "{}",
        stderr_of(&bad)
    );
}

#[tokio::test]
async fn events_redeliver_with_a_filter_counts_first_then_runs_a_job_to_its_end() {
    let server = Server::start();
    let first = server.dead_event().await;
    let second = server.dead_event().await;
    let dry = server.ok(&[
        "events",
        "redeliver",
        "--source",
        "sume",
        "--status",
        "dead",
        "--since",
        "2h",
        "--dry-run",
    ]);
    assert!(
        dry.starts_with("2 dead events of source sume match (of 2 read): "),
        "{dry}"
    );
    assert!(dry.contains("without --dry-run"), "{dry}");
    // The dry run changed nothing.
    let jobs = server.json(&["jobs", "list"]);
    assert_eq!(jobs["jobs"], json!([]), "{jobs}");

    // The destination is still down: each replay is dead again, and the
    // job counts both as failed; --wait exits non-zero and says so.
    let failed = server.run(&[
        "events",
        "redeliver",
        "--source",
        "sume",
        "--status",
        "dead",
        "--since",
        "2h",
        "--wait",
    ]);
    assert!(!failed.status.success(), "{failed:?}");
    assert!(
        stderr_of(&failed).contains(
            "ended with 2 failed redeliveries: see `dedupd events list --source sume --status dead`"
        ),
        "{}",
        stderr_of(&failed)
    );
    let out = String::from_utf8(failed.stdout).unwrap();
    assert!(out.starts_with("started job_"), "{out}");
    assert!(
        out.trim_end()
            .ends_with("done (2 matched, 0 queued, 0 delivered, 2 failed, 0 skipped, 2 read)"),
        "{out}"
    );
    let id = out.split_whitespace().nth(1).unwrap().trim_end_matches(':');
    let shown = server.json(&["jobs", "show", id]);
    assert_eq!(
        (&shown["state"], &shown["failed"]),
        (&json!("done"), &json!(2)),
        "{shown}"
    );
    let listed = server.ok(&["jobs", "list"]);
    assert!(
        listed.contains(id) && listed.contains("redeliver"),
        "{listed}"
    );
    // A finished job: cancel says so.
    let out = server.ok(&["jobs", "cancel", id]);
    assert!(out.contains("already done"), "{out}");

    // Erase one by id, then the other by a filter.
    let out = server.ok(&["events", "erase", "--source", "sume", &first]);
    assert!(
        out.contains(&format!("{first} of source sume: erased")),
        "{out}"
    );
    let out = server.ok(&[
        "events",
        "erase",
        "--source",
        "sume",
        "--status",
        "dead",
        "--field",
        &format!("/request_id={second}"),
        "--wait",
    ]);
    assert!(
        out.contains("done (1 matched, 1 erased, 0 skipped"),
        "{out}"
    );
    let erased = server.json(&["events", "list", "--source", "sume", "--status", "erased"]);
    assert_eq!(erased["events"].as_array().unwrap().len(), 2, "{erased}");

    // An id and a filter together are refused before anything is sent.
    let both = server.run(&[
        "events", "erase", "--source", "sume", &first, "--status", "dead",
    ]);
    assert!(!both.status.success());
    assert!(
        stderr_of(&both).contains("give an event id or filter flags"),
        "{}",
        stderr_of(&both)
    );
    // A status a job cannot take is the server's clear refusal.
    let bad = server.run(&[
        "events",
        "redeliver",
        "--source",
        "sume",
        "--status",
        "pending",
    ]);
    assert!(!bad.status.success());
    assert!(
        stderr_of(&bad).contains("a redeliver job takes delivered, dead or stale events"),
        "{}",
        stderr_of(&bad)
    );
}

#[tokio::test]
async fn events_erase_without_an_id_or_a_filter_erases_nothing() {
    let server = Server::start();
    let first = server.dead_event().await;
    // The id forgotten: not every dead event of the source, for good.
    for kind in ["erase", "redeliver"] {
        let out = server.run(&["events", kind, "--source", "sume"]);
        assert!(!out.status.success(), "{kind}: {out:?}");
        assert!(
            stderr_of(&out).contains("give an event id, or filter flags"),
            "{kind}: {}",
            stderr_of(&out)
        );
    }
    let jobs = server.json(&["jobs", "list"]);
    assert_eq!(jobs["jobs"], json!([]), "{jobs}");
    let dead = server.json(&["events", "list", "--source", "sume", "--status", "dead"]);
    assert_eq!(dead["events"][0]["event_id"], first.as_str(), "{dead}");
    // A dry run without flags counts, and a filter flag says it is meant.
    let dry = server.ok(&["events", "erase", "--source", "sume", "--dry-run"]);
    assert!(
        dry.starts_with("1 dead events of source sume match"),
        "{dry}"
    );
    let out = server.ok(&[
        "events", "erase", "--source", "sume", "--status", "dead", "--wait",
    ]);
    assert!(
        out.contains("done (1 matched, 1 erased, 0 skipped"),
        "{out}"
    );
}

/// A hostile server's job id, followed by `--wait`: its refusal of the
/// follow-up names the job escaped, as every other answer is.
#[test]
fn a_job_id_a_server_answers_reaches_the_terminal_escaped() {
    use crate::support::process::Recorder;
    const E: &str = "job_\u{1b}]0;pwned\u{7}\u{1b}[31mRED\u{9b}2J\u{202e}evil";
    let started = json!({ "id": E, "state": "running" });
    let problem = json!({ "status": 404, "detail": "gone", "code": "unknown_job" });
    let server =
        Recorder::answering_each(vec![(201, started.to_string()), (404, problem.to_string())]);
    let out = dedupd()
        .args([
            "events", "erase", "--source", "s", "--status", "dead", "--wait",
        ])
        .args(["--url", &format!("http://127.0.0.1:{}", server.port)])
        .args(["--token", TOKEN])
        .output()
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), stderr_of(&out));
    assert!(stderr.contains("unknown_job"), "{stderr}");
    for (what, printed) in [("stdout", &stdout.into_owned()), ("stderr", &stderr)] {
        assert_eq!(first_unprintable(printed), None, "{what}: {printed:?}");
    }
}
