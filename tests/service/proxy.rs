//! A real nginx in front of a dedupd without API tokens. nginx's default
//! `proxy_pass` sends `Host: 127.0.0.1:PORT` over loopback, without an
//! `Origin`: before dedupd looked for a proxy's marks, every client of the
//! proxy was served the operator API, the console and the metrics as if it
//! were on the machine. Needs nginx (Debian: `apt-get install nginx-light`,
//! which `.ci/run` installs).

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Child;
use std::process::Command;
use std::process::Stdio;
use std::time::Duration;
use std::time::Instant;

use dedupd::gateway::signature::Scheme;
use dedupd::gateway::signature::sign;
use reqwest::Method;
use reqwest::StatusCode;
use serde_json::json;
use tempfile::TempDir;

use crate::support::app::TestApp;
use crate::support::app::assert_problem;
use crate::support::gateway::SECRET;
use crate::support::gateway::body;
use crate::support::gateway::gateway_app;
use crate::support::ports::free_port;
use crate::support::receiver::Behaviour;
use crate::support::receiver::Receiver;
const MISSING: &str = "nginx was not found (on the PATH or at /usr/sbin/nginx): this test \
    puts a real nginx in front of dedupd. Install it (Debian/Ubuntu: `apt-get install \
    nginx-light`; .ci/run does).";

/// The nginx binary.
fn nginx_binary() -> PathBuf {
    let on_path = Command::new("nginx")
        .arg("-v")
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if on_path {
        return PathBuf::from("nginx");
    }
    let sbin = PathBuf::from("/usr/sbin/nginx");
    assert!(sbin.exists(), "{MISSING}");
    sbin
}

/// One nginx process in the foreground, its config and logs in a temp
/// dir, under a shell watchdog: it goes when this test process exits,
/// even one that never runs `Drop`.
struct Nginx {
    child: Child,
    /// The port it listens on (127.0.0.1).
    port: u16,
    _dir: TempDir,
}

impl Nginx {
    /// Starts nginx on a free port with `locations` (nginx `location`
    /// blocks) in its one server, and waits until it accepts connections.
    fn start(locations: &str) -> Self {
        let binary = nginx_binary();
        let dir = TempDir::new().unwrap();
        let d = dir.path().display();
        for attempt in 0.. {
            let port = free_port();
            let conf = format!(
                "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\n\
                 error_log {d}/error.log;\nevents {{ worker_connections 64; }}\n\
                 http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  \
                 proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fastcgi;\n  \
                 uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n  \
                 server {{\n    listen 127.0.0.1:{port};\n{locations}\n  }}\n}}\n"
            );
            std::fs::write(dir.path().join("nginx.conf"), conf).unwrap();
            let script = format!(
                "'{nginx}' -p '{d}' -e '{d}/error.log' -c '{d}/nginx.conf' & pid=$!; \
                 trap 'kill -9 $pid; wait $pid; exit 0' TERM; \
                 while kill -0 {parent} 2>/dev/null && kill -0 $pid 2>/dev/null; do sleep 0.2; done; \
                 kill -9 $pid 2>/dev/null; wait $pid; exit 0",
                nginx = binary.display(),
                parent = std::process::id()
            );
            let mut child = Command::new("sh")
                .args(["-c", &script])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start sh for nginx: {e}"));
            if wait_for_port(port, &mut child) {
                return Self {
                    child,
                    port,
                    _dir: dir,
                };
            }
            let log = std::fs::read_to_string(dir.path().join("error.log")).unwrap_or_default();
            // Another process may have taken the free port in between.
            assert!(attempt < 3, "nginx did not start: {log}");
        }
        unreachable!()
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

/// Whether something accepts connections on `port` within 20 s, while
/// `child` (the watchdog, which ends when nginx does) still runs.
fn wait_for_port(port: u16, child: &mut Child) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        if child.try_wait().unwrap().is_some() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// nginx as docs/operations.md's deployment would put it in front of `app`:
/// `/plain/` with nginx's defaults (HTTP/1.0 upstream, no forwarding
/// headers) and `/usual/` as most configurations have it (HTTP/1.1, the
/// client's `Host`, `X-Forwarded-For` and `-Proto`).
fn nginx_in_front_of(app: &TestApp) -> Nginx {
    let upstream = &app.address;
    Nginx::start(&format!(
        "    location /plain/ {{ proxy_pass {upstream}/; }}\n\
         \x20   location /usual/ {{\n      proxy_http_version 1.1;\n      \
         proxy_set_header Host $http_host;\n      \
         proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;\n      \
         proxy_set_header X-Forwarded-Proto $scheme;\n      proxy_pass {upstream}/;\n    }}"
    ))
}

/// A client on the internet, as nginx sees it: any `Host` it likes.
async fn send(method: Method, url: &str, body: Option<serde_json::Value>) -> reqwest::Response {
    let mut rb = crate::support::http::client()
        .request(method, url)
        .header("host", "dedupd.example");
    if let Some(b) = body {
        rb = rb.json(&b);
    }
    rb.send().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tokens_nginx_in_front_serves_ingest_and_refuses_everything_else() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let app = gateway_app(&receiver.url, |_| {}).await;
    let nginx = nginx_in_front_of(&app);
    for prefix in ["/plain", "/usual"] {
        let url = |path: &str| nginx.url(&format!("{prefix}{path}"));
        let key = format!("from-the-internet{}", prefix.replace('/', "-"));
        let res = send(
            Method::POST,
            &url(&format!("/v1/claims/{key}")),
            Some(json!({})),
        )
        .await;
        let p = assert_problem(res, StatusCode::MISDIRECTED_REQUEST, "proxy_needs_tokens").await;
        assert!(
            p["detail"]
                .as_str()
                .unwrap()
                .contains("a request through a proxy needs api.tokens"),
            "{p}"
        );
        let far = json!({ "event_id": "poison", "created_at": "9999-12-31T23:59:59Z" });
        let res = send(Method::POST, &url("/v1/streams/orders/apply"), Some(far)).await;
        assert_problem(res, StatusCode::MISDIRECTED_REQUEST, "proxy_needs_tokens").await;
        for path in [
            "/v1/sources",
            "/ui",
            "/ui/app.js",
            "/metrics",
            "/openapi.json",
            "/",
        ] {
            let res = send(Method::GET, &url(path), None).await;
            assert_eq!(
                res.status(),
                StatusCode::MISDIRECTED_REQUEST,
                "GET {prefix}{path} through nginx"
            );
        }
        // Nothing was written: asked directly, on the machine itself.
        assert_eq!(app.get(&key).await.status(), StatusCode::NOT_FOUND);
        assert_eq!(app.head("orders").await.status(), StatusCode::NOT_FOUND);

        // What a provider posts still gets in, and the probes answer.
        let id = format!("req{}", prefix.replace('/', "_"));
        let event = body(&id, "run_1", "2026-11-29T10:00:00Z");
        let mut req = crate::support::http::client()
            .post(url("/ingest/sume"))
            .header("host", "dedupd.example")
            .header("content-type", "application/json")
            .body(event.clone());
        for (name, value) in sign(Scheme::Sume, SECRET, app.now_s(), "", &event) {
            req = req.header(name, value);
        }
        let res = req.send().await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{prefix}/ingest/sume");
        let v: serde_json::Value = res.json().await.unwrap();
        assert_eq!(v["status"], "accepted", "{v}");
        for probe in ["/healthz", "/readyz"] {
            let res = send(Method::GET, &url(probe), None).await;
            assert_eq!(res.status(), StatusCode::OK, "{prefix}{probe}");
        }
    }
    let known = app.event_ids("pending").await.len() + app.event_ids("delivered").await.len();
    assert_eq!(known, 2, "both posts through nginx were taken in");
    // On the machine itself, the API still answers without a token.
    assert_eq!(
        app.request(Method::GET, "/v1/sources")
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    drop(nginx);
    receiver.stop().await;
}
