//! The public edge against hostile clients, over real sockets: refusals
//! from the headers alone, bodies that never finish, many slow uploads.
//! Also the per-address connection cap and a flood of readiness probes.

use std::time::Duration;

use dedupd::gateway::signature::Scheme;
use dedupd::gateway::signature::sign;
use reqwest::StatusCode;
use tokio::io::AsyncReadExt;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::support::app::TestApp;
use crate::support::gateway::SECRET;
use crate::support::gateway::body;
use crate::support::receiver::Behaviour;
use crate::support::receiver::Receiver;
/// Opens a connection and sends a POST's headers announcing `length`
/// bytes, then only `sent` of them.
async fn start_upload(
    app: &TestApp,
    path: &str,
    headers: &[(&str, String)],
    length: usize,
    sent: &[u8],
) -> TcpStream {
    let (mut s, head) = post_head(app, path, &format!("Content-Length: {length}"), headers).await;
    s.write_all(&head).await.unwrap();
    s.write_all(sent).await.unwrap();
    s
}

/// A connection to `app`, and the head of a JSON `POST` to `path` with its
/// body's `framing` header and `headers`, not yet sent.
async fn post_head(
    app: &TestApp,
    path: &str,
    framing: &str,
    headers: &[(&str, String)],
) -> (TcpStream, Vec<u8>) {
    let addr = app.address.trim_start_matches("http://");
    let s = TcpStream::connect(addr).await.unwrap();
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n{framing}\r\n"
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    (s, head.into_bytes())
}

/// Reads until the server closes the connection (30 s at most); returns the
/// status of the answer, if one came.
async fn answer_then_close(mut s: TcpStream) -> Option<u16> {
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "the server kept the connection open");
    let text = String::from_utf8_lossy(&got);
    text.split(' ').nth(1).and_then(|c| c.parse().ok())
}

fn sume_headers(app: &TestApp, body: &[u8], secret: &str) -> Vec<(&'static str, String)> {
    sign(Scheme::Sume, secret, app.now_s(), "", body)
}

async fn edge_app(body_timeout: Duration) -> (TestApp, Receiver) {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let app = gateway_app_with_timeout(&receiver.url, body_timeout).await;
    (app, receiver)
}

async fn gateway_app_with_timeout(url: &str, body_timeout: Duration) -> TestApp {
    let s = crate::support::gateway::settings(url);
    crate::support::app::spawn_app_with(move |l| {
        l.settings.http.body_timeout = body_timeout;
        // These tests are one address opening many connections, to see the
        // listener's own limits: no per-address cap.
        l.settings.http.max_connections_per_address = 0;
        l.settings.sources.insert("sume".into(), s);
    })
    .await
}

#[tokio::test]
async fn refusals_from_the_headers_come_before_the_body_and_close_the_connection() {
    let (app, _receiver) = edge_app(Duration::from_secs(60)).await;
    // No signature headers: 401 at once, though the body never comes.
    let s = start_upload(&app, "/ingest/sume", &[], 262_144, b"{").await;
    assert_eq!(answer_then_close(s).await, Some(401));
    // Unknown source: 404 at once.
    let s = start_upload(&app, "/ingest/nosuch", &[], 262_144, b"{").await;
    assert_eq!(answer_then_close(s).await, Some(404));
    // A signed timestamp outside the tolerance: 401 before the body.
    let stale = sign(Scheme::Sume, SECRET, app.now_s() - 3600, "", b"{}");
    let s = start_upload(&app, "/ingest/sume", &stale, 262_144, b"{").await;
    assert_eq!(answer_then_close(s).await, Some(401));
    // A declared length over the source's limit: 413 before the body.
    let h = sume_headers(&app, b"{}", SECRET);
    let s = start_upload(&app, "/ingest/sume", &h, 1_000_000, b"{").await;
    assert_eq!(answer_then_close(s).await, Some(413));
    // The server is fine, and a proper post still works.
    assert_eq!(
        app.ingest(&body("ok", "run_1", "2026-11-29T10:00:00Z"))
            .await
            .status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn a_body_that_does_not_arrive_in_time_gets_408_and_the_connection_closes() {
    let (app, _receiver) = edge_app(Duration::from_millis(300)).await;
    let b = body("slow", "run_1", "2026-11-29T10:00:00Z");
    let h = sume_headers(&app, &b, SECRET);
    let s = start_upload(&app, "/ingest/sume", &h, b.len(), &b[..5]).await;
    assert_eq!(answer_then_close(s).await, Some(408));
    assert!(app.events("pending").await.is_empty(), "nothing stored");
}

/// Sends a chunked request's head and `chunks` (each its own chunk, and
/// the last one too when `end`), leaving the connection open.
async fn start_chunked(
    app: &TestApp,
    path: &str,
    headers: &[(&str, String)],
    chunks: &[&[u8]],
    end: bool,
) -> TcpStream {
    let (mut s, mut sent) = post_head(app, path, "Transfer-Encoding: chunked", headers).await;
    for chunk in chunks {
        sent.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        sent.extend_from_slice(chunk);
        sent.extend_from_slice(b"\r\n");
    }
    if end {
        sent.extend_from_slice(b"0\r\n\r\n");
    }
    s.write_all(&sent).await.unwrap();
    s
}

/// A chunked body whose end never comes gets its 408 and its connection
/// closed, as one with a length does; so does one refused before it is
/// read. actix read on to discard such a body, for ever: five addresses
/// sending only the headers took every connection (an attack run). One
/// that ends is taken, and its connection kept.
#[tokio::test]
async fn a_chunked_body_that_never_ends_gets_408_and_the_connection_closes() {
    let (app, _receiver) = edge_app(Duration::from_millis(300)).await;
    let b = body("chunked", "run_1", "2026-11-29T10:00:00Z");
    let h = sume_headers(&app, &b, SECRET);
    let s = start_chunked(&app, "/ingest/sume", &h, &[], false).await;
    assert_eq!(answer_then_close(s).await, Some(408));
    let s = start_chunked(&app, "/ingest/sume", &h, &[&b[..5]], false).await;
    assert_eq!(answer_then_close(s).await, Some(408));
    // Refused before the body: by the route, and by the gate.
    let s = start_chunked(&app, "/ingest/nosuch", &[], &[b"{"], false).await;
    assert_eq!(answer_then_close(s).await, Some(404));
    let s = start_chunked(
        &app,
        "/v1/claims/k",
        &[("Origin", "http://evil.example".into())],
        &[b"{"],
        false,
    )
    .await;
    assert_eq!(answer_then_close(s).await, Some(403));
    assert!(app.events("pending").await.is_empty(), "nothing stored");

    // A chunked body that ends is taken, and the connection stays open
    // for the next request.
    let mut s = start_chunked(&app, "/ingest/sume", &h, &[&b[..5], &b[5..]], true).await;
    let mut answer = vec![0; 4096];
    let n = s.read(&mut answer).await.unwrap();
    let text = String::from_utf8_lossy(&answer[..n]);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(
        !text.to_ascii_lowercase().contains("connection: close"),
        "{text}"
    );
    let addr = app.address.trim_start_matches("http://");
    s.write_all(format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let n = s.read(&mut answer).await.unwrap();
    assert!(String::from_utf8_lossy(&answer[..n]).starts_with("HTTP/1.1 200"));
    // Taken once: delivered (listed as pending, then as delivered, it
    // could be seen in both while it moves).
    crate::support::receiver::eventually("the chunked event delivered", || async {
        app.events("delivered").await.len() == 1
    })
    .await;
}

/// Resident memory of this process (where the app runs), in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_slow_uploads_leave_the_api_answering_and_memory_bounded() {
    let (app, _receiver) = edge_app(Duration::from_secs(2)).await;
    let before = rss();
    let forged = body("forged", "run_1", "2026-11-29T10:00:00Z");
    let mut uploads = Vec::new();
    for i in 0..1000 {
        let headers = if i % 2 == 0 {
            Vec::new()
        } else {
            // Well-formed headers with a fresh timestamp and a wrong key:
            // only the body could show the forgery, and it never comes.
            sume_headers(&app, &forged, "not-the-secret")
        };
        // Under the test source's 4 KiB limit, so only the deadline ends it.
        uploads
            .push(start_upload(&app, "/ingest/sume", &headers, 4_000, b"{\"request_id\":").await);
    }
    // While they hang, the API answers.
    let res = app.client.get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        app.ingest(&body("real", "run_2", "2026-11-29T10:00:00Z"))
            .await
            .status(),
        StatusCode::OK
    );
    let grown = rss().saturating_sub(before);
    assert!(grown < 150 * 1024 * 1024, "RSS grew by {} MiB", grown >> 20);
    // Every one of them ends: refused at once, or cut off at the deadline.
    let answers = futures_util::future::join_all(uploads.into_iter().map(answer_then_close)).await;
    let unsigned = answers
        .iter()
        .step_by(2)
        .filter(|a| **a == Some(401))
        .count();
    let timed_out = answers
        .iter()
        .skip(1)
        .step_by(2)
        .filter(|a| **a == Some(408))
        .count();
    let other: Vec<_> = answers
        .iter()
        .skip(1)
        .step_by(2)
        .filter(|a| **a != Some(408))
        .take(5)
        .collect();
    assert_eq!((unsigned, timed_out), (500, 500), "{other:?}");
    assert_eq!(
        app.event_ids("pending").await.len() + app.event_ids("delivered").await.len(),
        1
    );
}

/// `/v1` bodies have the same deadline as ingest's: a client that sends
/// the headers and part of a claim's body is answered 408 and cut off.
#[tokio::test]
async fn a_v1_body_that_does_not_arrive_in_time_gets_408_and_the_connection_closes() {
    let app = crate::support::app::spawn_app_with(|l| {
        l.settings.http.body_timeout = Duration::from_millis(300);
    })
    .await;
    for path in ["/v1/claims/slow", "/v1/streams/run-1/apply"] {
        let s = start_upload(&app, path, &[], 100, b"{\"ttl_ms\":").await;
        assert_eq!(answer_then_close(s).await, Some(408), "{path}");
    }
    assert_eq!(app.get("slow").await.status(), StatusCode::NOT_FOUND);
    assert_eq!(app.head("run-1").await.status(), StatusCode::NOT_FOUND);
}

/// `/readyz` needs no token, so anyone may send a flood of it: it must not
/// make the writer commit what it holds (`storage.commit_hold`). The hold
/// is an hour here, so only a read of acknowledged writes (or a
/// checkpoint, an hour away too) commits.
#[tokio::test]
async fn a_flood_of_readiness_probes_does_not_defeat_group_commit() {
    let app = crate::support::app::spawn_app_with(|l| {
        let s = &mut l.settings.storage;
        s.commit_hold = Duration::from_secs(3600);
        s.checkpoint_interval = Duration::from_secs(3600);
        s.checkpoint_idle = Duration::from_secs(3600);
    })
    .await;
    let commits = || app.store.write_stats().commits;
    // Past the start's own commits (the app's first writes and reads).
    for k in ["warm-1", "warm-2"] {
        app.claim_ok(k, serde_json::json!({})).await;
        assert_eq!(app.get(k).await.status(), StatusCode::OK);
    }
    let before = commits();
    // Claims amid the probes: each probe could commit the claim before it.
    for i in 0..20 {
        app.claim_ok(&format!("k{i}"), serde_json::json!({})).await;
        for _ in 0..5 {
            let res = app.client.get(app.url("/readyz")).send().await.unwrap();
            assert_eq!(res.status(), StatusCode::OK);
        }
    }
    assert_eq!(commits(), before, "the probes committed the held writes");
    // A claim is read from the index in memory: no commit for it.
    assert_eq!(app.get("k19").await.status(), StatusCode::OK);
    assert_eq!(commits(), before);
    // The count moves: a read of a table (a stream's head) commits them,
    // once.
    assert_eq!(app.head("run-1").await.status(), StatusCode::NOT_FOUND);
    assert_eq!(app.head("run-1").await.status(), StatusCode::NOT_FOUND);
    assert_eq!(commits(), before + 1);
}

/// A connection from `local` (an address on the loopback interface) to
/// the app.
async fn connect_from(app: &TestApp, local: &str) -> TcpStream {
    let addr: std::net::SocketAddr = app.address.trim_start_matches("http://").parse().unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{local}:0").parse().unwrap()).unwrap();
    socket.connect(addr).await.unwrap()
}

/// Sends `GET /healthz` on `s` and returns the status of the answer, or
/// `None` when the connection ends without one (within 30 s).
async fn healthz_on(mut s: TcpStream) -> Option<u16> {
    // A write to a connection the server shut down may fail: no answer.
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await
        .ok()?;
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut got))
        .await
        .expect("the server answered or closed the connection within 30 s");
    if read.is_err() {
        return None;
    }
    let text = String::from_utf8_lossy(&got);
    text.split(' ').nth(1).and_then(|c| c.parse().ok())
}

/// One address that holds `http.max_connections_per_address` idle
/// connections gets every further one closed at once (counted in
/// `dedupd_http_connections_refused_total`), while other addresses are
/// served and its own open connections still work; closing one frees its
/// place. The report's attack: about 1,100–2,000 idle sockets from one
/// address made a fifth to half of other clients' requests fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_hold_more_than_its_share_of_connections() {
    let app = crate::support::app::spawn_app_with(|l| {
        l.settings.http.max_connections_per_address = 4;
        // Idle connections stay open for the test's length.
        l.settings.http.header_timeout = Duration::from_secs(300);
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(connect_from(&app, "127.0.0.2").await);
    }
    // The fifth from that address: shut down before a byte is read.
    let mut fifth = connect_from(&app, "127.0.0.2").await;
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(30), fifth.read(&mut buf))
        .await
        .expect("the connection over the cap was closed within 30 s");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    assert_eq!(
        healthz_on(connect_from(&app, "127.0.0.2").await).await,
        None
    );

    // Another address is served, and so is a held connection.
    assert_eq!(
        healthz_on(connect_from(&app, "127.0.0.1").await).await,
        Some(200)
    );
    assert_eq!(healthz_on(held.pop().unwrap()).await, Some(200));

    // That one is closed now: its place is free again, once the server
    // has seen it end.
    crate::support::receiver::eventually("a place freed for 127.0.0.2", || async {
        healthz_on(connect_from(&app, "127.0.0.2").await).await == Some(200)
    })
    .await;
    let s = app.scrape().await;
    let refused: f64 = s
        .lines()
        .find_map(|l| l.strip_prefix("dedupd_http_connections_refused_total "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_default();
    assert!(refused >= 2.0, "{s}");
    drop(held);
}

/// A client that pipelines requests and never reads the answers loses
/// its connections once they have waited `http.write_timeout` unread: the
/// kernel closes them (`TCP_USER_TIMEOUT`). actix has no write timeout:
/// they were held for ever, and ten addresses doing it took every
/// connection (an attack run). Seen through the per-address cap: the
/// address is served again once its unread connections are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_its_answers_loses_its_connections() {
    let app = crate::support::app::spawn_app_with(|l| {
        l.settings.http.max_connections_per_address = 2;
        // Long enough that the test sees the address at its cap first
        // (it polls every 20 ms), under load too.
        l.settings.http.write_timeout = Duration::from_secs(3);
        l.settings.http.header_timeout = Duration::from_secs(300);
    })
    .await;
    let addr: std::net::SocketAddr = app.address.trim_start_matches("http://").parse().unwrap();
    let mut writers = Vec::new();
    for _ in 0..2 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(2048).unwrap();
        socket.bind("127.0.0.3:0".parse().unwrap()).unwrap();
        let mut s = socket.connect(addr).await.unwrap();
        // Far more answer than the kernel's buffers hold; the writes
        // themselves block once the server stops reading.
        let requests = "GET /openapi.json HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".repeat(512);
        writers.push(tokio::spawn(async move {
            let _ = s.write_all(requests.as_bytes()).await;
            // Held, never read, until the test ends.
            std::future::pending::<()>().await;
            drop(s);
        }));
    }
    crate::support::receiver::eventually("127.0.0.3 at its cap", || async {
        healthz_on(connect_from(&app, "127.0.0.3").await)
            .await
            .is_none()
    })
    .await;
    crate::support::receiver::eventually("127.0.0.3 served again", || async {
        healthz_on(connect_from(&app, "127.0.0.3").await).await == Some(200)
    })
    .await;
    for w in writers {
        w.abort();
    }
}
