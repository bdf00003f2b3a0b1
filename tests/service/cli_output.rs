//! Every subcommand that prints, with its standard output a pipe nobody
//! reads any more (`dedupd events list | head -1`): it ends quietly, with
//! success (or killed by `SIGPIPE`, as the shell's tools are), never with
//! a panic and a backtrace.

use std::io::BufRead;
use std::io::BufReader;
use std::io::Read;
use std::io::Write;
use std::net::TcpStream;
use std::os::unix::process::ExitStatusExt;
use std::process::Command;
use std::process::Stdio;
use std::time::Duration;
use std::time::Instant;

use serde_json::json;
use tempfile::TempDir;

use crate::support::gateway::gateway_app;
use crate::support::process::PATIENCE;
use crate::support::process::Running;
use crate::support::process::dedupd;
use crate::support::process::init;
use crate::support::receiver::Behaviour;
use crate::support::receiver::Receiver;

/// Runs `cmd` with its standard output a pipe whose read end is closed
/// before it starts, so its first write fails; whether it ended quietly.
fn ends_quietly_into_a_closed_pipe(mut cmd: Command, what: &str) -> Result<(), String> {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let child = cmd
        .stdout(writer)
        .stderr(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let (status, stderr) = ended(child, what)?;
    quiet(status, &stderr, what)
}

/// Waits for `child` to exit (killing it after [`PATIENCE`]); its status
/// and what it wrote to stderr.
fn ended(
    mut child: std::process::Child,
    what: &str,
) -> Result<(std::process::ExitStatus, String), String> {
    let mut stderr = child.stderr.take().unwrap();
    let reading = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let mut child = Running(child);
    let deadline = Instant::now() + PATIENCE;
    let status = loop {
        if let Some(s) = child.0.try_wait().unwrap() {
            break s;
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "{what}: still running although nobody reads its output"
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Ok((status, reading.join().unwrap()))
}

/// Success or `SIGPIPE`, and nothing about it on stderr.
fn quiet(status: std::process::ExitStatus, stderr: &str, what: &str) -> Result<(), String> {
    if stderr.contains("panicked") || stderr.contains("Broken pipe") {
        return Err(format!("{what}: {stderr}"));
    }
    if !(status.success() || status.signal() == Some(13)) {
        return Err(format!("{what}: {status}; {stderr}"));
    }
    Ok(())
}

#[tokio::test]
async fn every_subcommand_ends_quietly_when_its_reader_has_gone() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let app = gateway_app(&receiver.url, |_| {}).await;
    app.claim_ok("k", json!({})).await;
    app.apply_ok("s", "e1", "2026-11-29T10:00:00Z").await;
    let url = app.address.clone();
    tokio::task::spawn_blocking(move || {
        let dir = TempDir::new().unwrap();
        let config = dir.path().join("dedupd.toml");
        let out = init(&config, &["--source", "sume"]);
        assert!(out.status.success());
        let config = config.to_str().unwrap();
        let written = dir.path().join("written.toml");
        let backup = dir.path().join("b.backup");
        let backup = backup.to_str().unwrap();
        let restore_config = dir.path().join("restore.toml");
        std::fs::write(
            &restore_config,
            format!(
                "data_path = {:?}\n",
                dir.path().join("restored").join("dedupd.redb")
            ),
        )
        .unwrap();
        let restore_config = restore_config.to_str().unwrap();
        let commands: Vec<Vec<&str>> = vec![
            vec!["check-config", "--config", config],
            vec!["init", "--config", written.to_str().unwrap()],
            vec!["trigger", "sume", "--config", config, "--url", &url],
            vec!["receive", "--config", config, "--listen", "127.0.0.1:0"],
            vec!["events", "list", "--source", "sume", "--url", &url],
            vec!["events", "count", "--source", "sume", "--url", &url],
            vec!["events", "show", "nosuch", "--source", "sume", "--json"],
            vec!["claims", "get", "k", "--url", &url],
            vec!["streams", "get", "s", "--url", &url],
            vec!["jobs", "list", "--url", &url],
            vec!["jobs", "list", "--url", &url, "--json"],
            vec!["backup", "--url", &url, "--to", backup],
            vec!["verify", backup],
            vec!["restore", backup, "--config", restore_config],
            vec!["--help"],
            vec!["--version"],
        ];
        let failed: Vec<String> = commands
            .iter()
            .filter_map(|args| {
                let mut cmd = dedupd();
                cmd.args(args).env("DEDUPD_URL", &url);
                ends_quietly_into_a_closed_pipe(cmd, &args.join(" ")).err()
            })
            .collect();
        assert!(failed.is_empty(), "{}", failed.join("\n"));
    })
    .await
    .unwrap();
}

/// `dedupd receive | head -1`: once its reader has gone, the next delivery
/// it cannot print ends it.
#[test]
fn receive_ends_when_its_reader_goes_away() {
    let mut child = dedupd()
        .args(["receive", "--listen", "127.0.0.1:0", "--secret"])
        .arg("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let port = first
        .strip_prefix("listening on http://127.0.0.1:")
        .and_then(|rest| rest.split(':').next())
        .unwrap_or_else(|| panic!("not a listening line: {first}"))
        .to_owned();
    drop(lines);
    // Unsigned: answered 401, and printed as NOT VERIFIED, into the pipe.
    let mut conn = TcpStream::connect(format!("127.0.0.1:{port}")).unwrap();
    conn.write_all(
        b"POST /hooks HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n\
          content-length: 2\r\nconnection: close\r\n\r\n{}",
    )
    .unwrap();
    let mut answer = String::new();
    let _ = conn.read_to_string(&mut answer);
    let ended =
        ended(child, "receive").and_then(|(status, stderr)| quiet(status, &stderr, "receive"));
    assert_eq!(ended, Ok(()));
}
