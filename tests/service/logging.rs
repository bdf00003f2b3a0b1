//! What `serve` logs at each level.

use crate::support::process::dedupd;
use crate::support::process::spawn_serving;
use crate::support::process::stop_logged;
use serde_json::Value;
use tempfile::TempDir;
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
    let res = crate::support::http::client()
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
