//! The `dedupd` binary as a real process: `check-config`, `serve` with its
//! log drained, signals, `init`, and a `receive` that records what it got.

use std::io::BufRead;
use std::io::BufReader;
use std::path::Path;
use std::process::Child;
use std::process::Command;
use std::process::Output;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tempfile::TempDir;

/// How long a test waits for a line before it fails.
pub(crate) const PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);
/// What `f` returns, run on a thread of its own, for a call that must not
/// block (a read of a FIFO, say): one that does fails the test after
/// [`PATIENCE`] instead of hanging it. The deadline only turns a hang into
/// a failure.
pub(crate) fn unblocked<T: Send + 'static>(
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(PATIENCE)
        .unwrap_or_else(|_| panic!("{what} did not answer within {PATIENCE:?}: it blocks"))
}

/// `dedupd check-config --config FILE`, run to completion.
pub(crate) fn check_config(file: &std::path::Path) -> std::process::Output {
    dedupd()
        .args(["check-config", "--config"])
        .arg(file)
        .output()
        .unwrap()
}

/// Makes a FIFO at `path` (a pipe nobody writes: a file that must not be
/// read or replaced as if it were a plain one).
pub(crate) fn mkfifo(path: &std::path::Path) {
    let made = Command::new("mkfifo").arg(path).status().expect("mkfifo");
    assert!(made.success(), "mkfifo {}", path.display());
}

pub(crate) fn dedupd() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dedupd"));
    // The tests' own environment must not leak settings in.
    for (k, _) in std::env::vars() {
        if k.starts_with("DEDUPD_") || k.starts_with("OTEL_") || k == "RUST_LOG" {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// Starts `dedupd serve` in `dir` and returns it with its port, read from
/// its JSON log.
pub(crate) fn serve(dir: &TempDir) -> (Running, u16, crate::support::process::Drain) {
    let mut cmd = dedupd();
    cmd.arg("serve")
        .current_dir(dir.path())
        .env("DEDUPD_LISTEN", "127.0.0.1:0");
    spawn_serving(cmd)
}

/// Starts `dedupd serve --config FILE`; returns it with its port.
pub(crate) fn serve_config(
    file: &std::path::Path,
) -> (Running, u16, crate::support::process::Drain) {
    let mut cmd = dedupd();
    cmd.args(["serve", "--config"]).arg(file);
    spawn_serving(cmd)
}

/// Runs `cmd` (a `serve`) with JSON logs until it says which port it
/// serves on; the log is then drained so the child never blocks on a full
/// pipe.
pub(crate) fn spawn_serving(cmd: Command) -> (Running, u16, crate::support::process::Drain) {
    spawn_serving_on(cmd, "port")
}

/// [`spawn_serving`], returning the port its log names in `field` (the
/// startup line carries `port` and, with a RESP listener, `resp_port`).
pub(crate) fn spawn_serving_on(
    cmd: Command,
    field: &str,
) -> (Running, u16, crate::support::process::Drain) {
    let (child, port, _, drain) = spawn_serving_logged(cmd, field);
    (child, port, drain)
}

/// [`spawn_serving_on`], also giving the log's lines up to the one that
/// names the port (start-up warnings among them).
pub(crate) fn spawn_serving_logged(
    cmd: Command,
    field: &str,
) -> (Running, u16, Vec<String>, crate::support::process::Drain) {
    spawn_serving_into(cmd, field, None)
}

/// A served dedupd's log after the line naming its port, as it comes:
/// for a test that waits on what the process logs while it runs.
#[derive(Debug, Clone, Default)]
pub(crate) struct LiveLog(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl LiveLog {
    /// The lines so far, each parsed as JSON (`Null` if it is not).
    pub(crate) fn json(&self) -> Vec<Value> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|l| serde_json::from_str(l).unwrap_or(Value::Null))
            .collect()
    }
}

/// [`spawn_serving`], the log also kept in a [`LiveLog`] as it comes.
pub(crate) fn spawn_serving_live(
    cmd: Command,
) -> (Running, u16, LiveLog, crate::support::process::Drain) {
    let live = LiveLog::default();
    let (child, port, _, drain) = spawn_serving_into(cmd, "port", Some(live.clone()));
    (child, port, live, drain)
}

fn spawn_serving_into(
    mut cmd: Command,
    field: &str,
    live: Option<LiveLog>,
) -> (Running, u16, Vec<String>, crate::support::process::Drain) {
    let mut child = Running(
        cmd.env("DEDUPD_LOG__FORMAT", "json")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
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
            if let Some(live) = &live {
                live.0.lock().unwrap().push(line.clone());
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
    child: impl Into<Running>,
    sig: &str,
    drain: Drain,
) -> std::process::ExitStatus {
    stop_logged(child, sig, drain).await.0
}

/// [`stop`], also giving the log's lines after the one naming the port.
pub(crate) async fn stop_logged(
    child: impl Into<Running>,
    sig: &str,
    drain: Drain,
) -> (std::process::ExitStatus, Vec<String>) {
    let child = child.into();
    signal(&child, sig);
    let status = tokio::task::spawn_blocking(move || wait(child))
        .await
        .unwrap();
    (status, drain.join().unwrap())
}

pub(crate) fn sigterm(child: &std::process::Child) {
    signal(child, "-TERM");
}

pub(crate) fn wait(child: impl Into<Running>) -> std::process::ExitStatus {
    let mut child = child.into();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(std::time::Instant::now() < deadline, "dedupd did not stop");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A child process, killed when the test ends however it ends: a failed
/// assertion too, which would otherwise leave a served dedupd holding its
/// port and files after the test binary exits.
pub(crate) struct Running(pub(crate) Child);

impl From<Child> for Running {
    fn from(child: Child) -> Self {
        Self(child)
    }
}

impl std::ops::Deref for Running {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Running {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `dedupd init --config FILE ARGS…`, run to completion.
pub(crate) fn init(config: &Path, args: &[&str]) -> Output {
    dedupd()
        .args(["init", "--config"])
        .arg(config)
        .args(args)
        .output()
        .unwrap()
}

/// A server that is not dedupd: records the head of every request (its
/// request line and headers, lowercased) and answers each with one status
/// and JSON body, closing the connection.
pub(crate) struct Recorder {
    pub(crate) port: u16,
    heads: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Recorder {
    /// Answers `200` with `body`.
    pub(crate) fn start(body: &'static str) -> Self {
        Self::answering(200, body.to_owned())
    }

    /// Answers `status` with `body`.
    pub(crate) fn answering(status: u16, body: String) -> Self {
        Self::answering_each(vec![(status, body)])
    }

    /// Answers the first request with the first of `answers`, the second
    /// with the second, …, and every later one with the last.
    pub(crate) fn answering_each(answers: Vec<(u16, String)>) -> Self {
        use std::io::{Read, Write};
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let heads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (h, st) = (heads.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut served = 0usize;
            while !st.load(Ordering::Relaxed) {
                let mut conn = match listener.accept() {
                    Ok((c, _)) => c,
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    }
                };
                conn.set_nonblocking(false).unwrap();
                conn.set_read_timeout(Some(PATIENCE)).unwrap();
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                let head_end = loop {
                    if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                        break i;
                    }
                    match conn.read(&mut buf) {
                        Ok(0) | Err(_) => break got.len(),
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                };
                let head = String::from_utf8_lossy(&got[..head_end]).to_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                let mut have = got.len().saturating_sub(head_end + 4);
                while have < length {
                    match conn.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => have += n,
                    }
                }
                h.lock().unwrap().push(head);
                let (status, body) = &answers[served.min(answers.len() - 1)];
                served += 1;
                let _ = conn.write_all(
                    format!(
                        "HTTP/1.1 {status} Answer\r\ncontent-type: application/json\r\n\
                         content-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    )
                    .as_bytes(),
                );
            }
        });
        Self {
            port,
            heads,
            stop,
            thread: Some(thread),
        }
    }

    pub(crate) fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Runs `program` with `args`, `input` as JSON on its stdin, off the
/// async executor; its output once it exits (a provider's SDK in Python
/// or Node, say).
pub(crate) async fn run_with_json(
    program: String,
    args: Vec<String>,
    input: serde_json::Value,
) -> std::process::Output {
    tokio::task::spawn_blocking(move || {
        let mut child = Command::new(program)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        serde_json::to_writer(child.stdin.take().unwrap(), &input).unwrap();
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap()
}
