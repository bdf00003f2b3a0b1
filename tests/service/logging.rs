//! What `serve` logs at each level.

use crate::support::process::dedupd;
use crate::support::process::spawn_serving;
use crate::support::process::stop_logged;
use serde_json::Value;
use tempfile::TempDir;
/// The log of `dedupd serve` at `level`, after the line naming its port,
/// while `client` runs against that port, through a SIGTERM.
async fn log_while<F: Future<Output = ()>>(
    level: &str,
    client: impl FnOnce(u16) -> F,
) -> Vec<String> {
    let dir = TempDir::new().unwrap();
    let mut cmd = dedupd();
    cmd.arg("serve")
        .current_dir(dir.path())
        .env("DEDUPD_LISTEN", "127.0.0.1:0")
        .env("DEDUPD_LOG__LEVEL", level);
    let (child, port, drain) = spawn_serving(cmd);
    client(port).await;
    let (status, log) = stop_logged(child, "-TERM", drain).await;
    assert!(status.success());
    log
}

/// The JSON log of `dedupd serve` at `level` after the line naming its
/// port, through one answered claim and a SIGTERM, line by line.
async fn log_around_a_claim(level: &str) -> Vec<Value> {
    let log = log_while(level, |port| async move {
        let res = crate::support::http::client()
            .post(format!("http://127.0.0.1:{port}/v1/claims/log-probe"))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), reqwest::StatusCode::CREATED);
    })
    .await;
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

/// At `info`, each stored event is logged as what it became: `event
/// accepted` when a destination takes it, `event filtered` when none does
/// (the provider's answer says the same).
#[tokio::test]
async fn an_event_no_destination_takes_is_logged_as_filtered() {
    use dedupd::gateway::signature::{Scheme, sign};
    let dir = TempDir::new().unwrap();
    let config = dir.path().join("dedupd.toml");
    std::fs::write(
        &config,
        r#"
[sources.sume]
scheme = "sume"
secrets = ["sume-test-secret"]
event_id = "body:/request_id"
destination_secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
[[sources.sume.destinations]]
name = "x"
forward_to = "http://127.0.0.1:9/x"
filter = { "body:/type" = "x.*" }
"#,
    )
    .unwrap();
    let mut cmd = dedupd();
    cmd.args(["serve", "--config"])
        .arg(&config)
        .current_dir(dir.path())
        .env("DEDUPD_LISTEN", "127.0.0.1:0")
        .env("DEDUPD_LOG__LEVEL", "info");
    let (child, port, drain) = spawn_serving(cmd);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    for (id, kind) in [("z1", "z.created"), ("x1", "x.created")] {
        let body = format!(r#"{{"request_id":"{id}","type":"{kind}"}}"#);
        let mut req = crate::support::http::client()
            .post(format!("http://127.0.0.1:{port}/ingest/sume"))
            .header("content-type", "application/json")
            .body(body.clone());
        for (name, value) in sign(
            Scheme::Sume,
            "sume-test-secret",
            i64::try_from(now).unwrap(),
            "",
            body.as_bytes(),
        ) {
            req = req.header(name, value);
        }
        assert_eq!(req.send().await.unwrap().status(), reqwest::StatusCode::OK);
    }
    let (status, log) = stop_logged(child, "-TERM", drain).await;
    assert!(status.success());
    let said = |id: &str| -> Vec<String> {
        log.iter()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["event_id"] == id && v["target"] == "dedupd::routes::ingest")
            .map(|v| v["message"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    assert_eq!(said("z1"), ["event filtered"], "{log:?}");
    assert_eq!(said("x1"), ["event accepted"], "{log:?}");
}

/// `dedupd serve` with `env` set, on a port already taken, so the bind
/// fails and says so: the port and what it wrote to stderr.
fn serve_on_a_taken_port(env: (&str, &str)) -> (std::net::SocketAddr, String) {
    let dir = TempDir::new().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let out = dedupd()
        .arg("serve")
        .current_dir(dir.path())
        .env(env.0, env.1)
        .env("DEDUPD_LISTEN", addr.to_string())
        .output()
        .unwrap();
    assert!(!out.status.success());
    (addr, String::from_utf8(out.stderr).unwrap())
}

/// Text lines written to a file or the journal (not a terminal) carry no
/// colour codes, and a value with spaces is quoted, so each field reads
/// apart.
#[test]
fn text_lines_off_a_terminal_have_no_colour_codes_and_quote_what_has_spaces() {
    let (addr, log) = serve_on_a_taken_port(("DEDUPD_LOG__FORMAT", "text"));
    let failed = log
        .lines()
        .find(|l| l.contains("ERROR") && l.contains("dedupd failed"))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(!failed.contains('\u{1b}'), "{failed:?}");
    assert!(
        failed.contains(&format!("dedupd failed error=\"cannot listen on {addr}: ")),
        "{failed}"
    );
}

/// `RUST_LOG=warning` (a word that is not a level) would name a target and
/// silence every line: it is set aside, said, and the settings' level used.
#[test]
fn a_rust_log_that_is_no_level_is_set_aside_with_a_word_and_lines_go_on() {
    let (_, log) = serve_on_a_taken_port(("RUST_LOG", "warning"));
    assert!(
        log.contains("RUST_LOG=\"warning\" is ignored") && log.contains("not a level"),
        "{log}"
    );
    assert!(
        log.contains("dedupd failed"),
        "the error line is logged: {log}"
    );
}

/// The lines of `dedupd serve` at `level` while a client sends 30
/// requests that do not parse (an HTTP/1.0 POST without a length), each
/// on a connection of its own, that say the request did not parse.
async fn parse_error_lines(level: &str) -> usize {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let log = log_while(level, |port| async move {
        for _ in 0..30 {
            let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .unwrap();
            conn.write_all(b"POST /v1/claims/k HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
                .await
                .unwrap();
            let mut answer = Vec::new();
            conn.read_to_end(&mut answer).await.unwrap();
            assert!(answer.starts_with(b"HTTP/1.1 400"), "{answer:?}");
        }
    })
    .await;
    log.iter()
        .filter(|l| l.contains("request parse error"))
        .count()
}

/// Any client could write a line of the HTTP library's a request (an
/// ERROR line each: thousands a second, burying dedupd's own lines and
/// tripping the journal's rate limit for the service). One a minute is
/// written, and every one when the level names the library.
#[tokio::test]
async fn a_client_writes_at_most_one_line_a_minute_of_requests_that_do_not_parse() {
    assert_eq!(parse_error_lines("info").await, 1);
    assert_eq!(parse_error_lines("info,actix_http=error").await, 30);
}
