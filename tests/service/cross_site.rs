//! A web page the operator visits must not drive the API: cross-origin
//! "simple" requests, DNS rebinding (another name pointed at 127.0.0.1),
//! bodies a page may send without asking first. Each attack is followed by
//! a check that it changed nothing.

use std::time::Duration;

use reqwest::Method;
use reqwest::StatusCode;
use serde_json::json;
use tokio::io::AsyncReadExt;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::support::app::TestApp;
use crate::support::app::assert_problem;
use crate::support::app::claim_path;
use crate::support::app::spawn_app;
use crate::support::app::spawn_app_with;
use crate::support::app::with_tokens;
const TOKEN: &str = "test-token-0123456789";
const EVIL: &str = "http://evil.example";

impl TestApp {
    /// `host:port` the app listens on, as a browser on this machine sends
    /// it in `Host`.
    fn authority(&self) -> &str {
        self.address.trim_start_matches("http://")
    }

    /// A request to `path` sent as a browser page would: with `origin`
    /// and a body of `content_type` (none if `None`).
    async fn sent_by_page(
        &self,
        method: Method,
        path: &str,
        origin: Option<&str>,
        content_type: Option<&str>,
        body: &str,
    ) -> reqwest::Response {
        let mut rb = self.request(method, path);
        if let Some(o) = origin {
            rb = rb.header("origin", o);
        }
        if let Some(ct) = content_type {
            rb = rb.header("content-type", ct);
        }
        if !body.is_empty() {
            rb = rb.body(body.to_owned());
        }
        rb.send().await.unwrap()
    }

    /// The status of `GET path` with `Host: host`.
    async fn status_with_host(&self, path: &str, host: &str) -> StatusCode {
        self.request(Method::GET, path)
            .header("host", host)
            .send()
            .await
            .unwrap()
            .status()
    }
}

/// Sends `head` (a request without its final empty line, `{addr}` replaced
/// by the app's address) on a new connection; the status of the answer.
async fn raw_status(app: &TestApp, head: &str) -> u16 {
    let addr = app.authority();
    let mut s = TcpStream::connect(addr).await.unwrap();
    let head = head.replace("{addr}", addr);
    s.write_all(format!("{head}Connection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut got))
        .await
        .expect("an answer, then the connection closed")
        .unwrap();
    let text = String::from_utf8_lossy(&got);
    text.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {text:?}"))
}

/// The router decodes `%76%31` to `v1`, so a page may spell a path that
/// way: it is checked as the `/v1` route it reaches.
#[tokio::test]
async fn a_v1_path_spelled_with_escapes_is_checked_as_v1() {
    let app = spawn_app().await;
    let res = app
        .sent_by_page(Method::GET, "/%76%31/sources", None, None, "")
        .await;
    assert_eq!(res.status(), StatusCode::OK, "served as /v1/sources");
    let res = app
        .sent_by_page(
            Method::POST,
            "/%76%31/backup",
            None,
            Some("text/plain"),
            "{}",
        )
        .await;
    assert_problem(
        res,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
    )
    .await;
    let res = app
        .sent_by_page(
            Method::POST,
            "/%76%31/backup",
            Some(EVIL),
            Some("application/json"),
            "{}",
        )
        .await;
    assert_problem(res, StatusCode::FORBIDDEN, "cross_origin").await;
    let res = app
        .request(Method::POST, "/%76%31/backup")
        .header("sec-fetch-site", "cross-site")
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_problem(res, StatusCode::FORBIDDEN, "cross_origin").await;
}

/// The curl: `-X POST -H 'Origin: http://evil.example' -H
/// 'Content-Type: text/plain'`, no body.
#[tokio::test]
async fn a_cross_origin_simple_post_creates_no_claim() {
    let app = spawn_app().await;
    let res = app
        .sent_by_page(
            Method::POST,
            "/v1/claims/order-124",
            Some(EVIL),
            Some("text/plain"),
            "",
        )
        .await;
    assert_problem(res, StatusCode::FORBIDDEN, "cross_origin").await;
    assert_eq!(
        app.get("order-124").await.status(),
        StatusCode::NOT_FOUND,
        "no claim was made"
    );
}

#[tokio::test]
async fn a_cross_origin_page_can_neither_mark_done_nor_apply() {
    let app = spawn_app().await;
    let (token, _, _) = app.claim_ok("order-125", json!({})).await;
    let done = json!({ "token": token }).to_string();
    for ct in [Some("text/plain"), Some("application/json"), None] {
        let res = app
            .sent_by_page(
                Method::POST,
                "/v1/claims/order-125/done",
                Some(EVIL),
                ct,
                &done,
            )
            .await;
        assert_problem(res, StatusCode::FORBIDDEN, "cross_origin").await;
    }
    let v: serde_json::Value = app.get("order-125").await.json().await.unwrap();
    assert_eq!(v["state"], "processing", "still held, not done: {v}");

    // An apply from the year 9999 would make every later event stale.
    let far = json!({ "event_id": "e1", "created_at": "9999-12-31T00:00:00Z" }).to_string();
    let res = app
        .sent_by_page(
            Method::POST,
            "/v1/streams/run-1/apply",
            Some(EVIL),
            Some("text/plain"),
            &far,
        )
        .await;
    assert_problem(res, StatusCode::FORBIDDEN, "cross_origin").await;
    assert_eq!(app.head("run-1").await.status(), StatusCode::NOT_FOUND);
}

/// Every `Origin` that is not exactly this server's is refused, and so is
/// a request a browser marks as sent by another site.
#[tokio::test]
async fn only_the_servers_own_origin_passes() {
    let app = spawn_app().await;
    let port = app.authority().rsplit(':').next().unwrap().to_owned();
    let other_port = format!("http://127.0.0.1:{}", port.parse::<u32>().unwrap() + 1);
    let refused = [
        "null",
        other_port.as_str(),
        "http://127.0.0.1",
        "http://localhost.:{port}",
        "http://[::1]:{port}",
        "http://localhost:{port}",
        "http://127.0.0.1:{port}.evil.example",
        "http://user@127.0.0.1:{port}",
        "file://",
        "http://127.0.0.1:{port}/",
    ];
    for (i, origin) in refused.iter().enumerate() {
        let origin = origin.replace("{port}", &port);
        let res = app
            .sent_by_page(
                Method::POST,
                &claim_path(&format!("o{i}")),
                Some(&origin),
                Some("application/json"),
                "{}",
            )
            .await;
        assert_eq!(res.status(), StatusCode::FORBIDDEN, "Origin: {origin}");
        assert_eq!(
            app.get(&format!("o{i}")).await.status(),
            StatusCode::NOT_FOUND,
            "Origin {origin} made a claim"
        );
    }
    for site in ["cross-site", "same-site"] {
        let res = app
            .request(Method::GET, "/v1/sources")
            .header("sec-fetch-site", site)
            .send()
            .await
            .unwrap();
        assert_problem(res, StatusCode::FORBIDDEN, "cross_origin").await;
    }

    // The console's own requests: same origin, upper case or not.
    let own = format!("http://{}", app.authority());
    let res = app
        .sent_by_page(
            Method::POST,
            &claim_path("mine"),
            Some(&own),
            Some("application/json"),
            "{}",
        )
        .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let res = app
        .request(Method::GET, "/v1/sources")
        .header("origin", own.to_uppercase().replace("HTTP://", "http://"))
        .header("sec-fetch-site", "same-origin")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
}

/// A body must be JSON: a page may send text, a form or a multipart body
/// (or a typeless blob) cross-origin without asking first.
#[tokio::test]
async fn a_body_that_is_not_json_is_refused_and_changes_nothing() {
    let app = spawn_app().await;
    let body = json!({ "ttl_ms": 60000 }).to_string();
    for ct in [
        Some("text/plain"),
        Some("text/plain; charset=utf-8"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
        Some("application/json; charset=utf-16"),
        None,
    ] {
        let res = app
            .sent_by_page(Method::POST, &claim_path("k1"), None, ct, &body)
            .await;
        assert_problem(
            res,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
        )
        .await;
        assert_eq!(
            app.get("k1").await.status(),
            StatusCode::NOT_FOUND,
            "{ct:?}"
        );
    }
    let form = "--x\r\nContent-Disposition: form-data; name=\"ttl_ms\"\r\n\r\n1\r\n--x--\r\n";
    let res = app
        .sent_by_page(
            Method::POST,
            &claim_path("k1"),
            None,
            Some("multipart/form-data; boundary=x"),
            form,
        )
        .await;
    assert_eq!(res.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    // A chunked body without a type counts as a body.
    let status = raw_status(
        &app,
        "POST /v1/claims/k1 HTTP/1.1\r\nHost: {addr}\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n",
    )
    .await;
    assert_eq!(status, 415);
    assert_eq!(app.get("k1").await.status(), StatusCode::NOT_FOUND);

    // What clients send: JSON, with or without a charset, or no body at all
    // (`curl -X POST`, as the README's claims section shows).
    for (key, ct, body) in [
        ("j1", Some("application/json"), "{}"),
        ("j2", Some("application/json; charset=utf-8"), "{}"),
        ("j3", Some("application/merge-patch+json"), "{}"),
        ("j4", None, ""),
    ] {
        let res = app
            .sent_by_page(Method::POST, &claim_path(key), None, ct, body)
            .await;
        assert_eq!(res.status(), StatusCode::CREATED, "{ct:?}");
    }
    let res = app
        .request(Method::POST, &claim_path("j5"))
        .header("content-length", "0")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
}

/// DNS rebinding: a page's own name resolved to 127.0.0.1. Without
/// tokens, only loopback names are served (ingest and the probes excepted).
#[tokio::test]
async fn without_tokens_only_loopback_names_are_served() {
    let app = spawn_app().await;
    let res = app
        .request(Method::GET, "/v1/sources")
        .header("host", "attacker.example")
        .send()
        .await
        .unwrap();
    assert_problem(res, StatusCode::MISDIRECTED_REQUEST, "host_not_allowed").await;
    let port = app.authority().rsplit(':').next().unwrap().to_owned();
    for host in [
        "attacker.example".to_owned(),
        format!("attacker.example:{port}"),
        format!("localhost.:{port}"),
        format!("127.0.0.1.attacker.example:{port}"),
        format!("user@127.0.0.1:{port}"),
        format!("[::ffff:127.0.0.1]:{port}"),
    ] {
        for path in [
            "/v1/sources",
            "/v1/claims/k",
            "/metrics",
            "/openapi.json",
            "/ui",
            "/ui/app.js",
            "/",
        ] {
            assert_eq!(
                app.status_with_host(path, &host).await,
                StatusCode::MISDIRECTED_REQUEST,
                "GET {path} with Host {host}"
            );
        }
        let res = app
            .request(Method::POST, &claim_path("rebound"))
            .header("host", &host)
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::MISDIRECTED_REQUEST);
        // The probes and ingest answer whatever the name.
        assert_eq!(
            app.status_with_host("/healthz", &host).await,
            StatusCode::OK
        );
        assert_eq!(app.status_with_host("/readyz", &host).await, StatusCode::OK);
        let res = app
            .request(Method::POST, "/ingest/nosuch")
            .header("host", &host)
            .send()
            .await
            .unwrap();
        assert_problem(res, StatusCode::NOT_FOUND, "unknown_source").await;
    }
    assert_eq!(app.get("rebound").await.status(), StatusCode::NOT_FOUND);

    // Two Host headers, or an absolute-form target naming another host.
    // (actix refuses two Host headers itself, with 400.)
    let two = "GET /v1/sources HTTP/1.1\r\nHost: {addr}\r\nHost: attacker.example\r\n";
    let status = raw_status(&app, two).await;
    assert!(matches!(status, 400 | 421), "{status}");
    let absolute = "GET http://attacker.example/v1/sources HTTP/1.1\r\nHost: {addr}\r\n";
    assert_eq!(raw_status(&app, absolute).await, 421);
    let plain = "GET /v1/sources HTTP/1.1\r\nHost: {addr}\r\n";
    assert_eq!(raw_status(&app, plain).await, 200);

    // The refusals are answers like any other in the request histogram.
    let s = app.scrape().await;
    let refused: f64 = s
        .lines()
        .filter(|l| {
            l.starts_with("dedupd_http_request_duration_seconds_count{")
                && l.contains("status=\"421\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(refused >= 40.0, "{s}");

    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("LOCALHOST:{port}"),
        format!("[::1]:{port}"),
        "127.0.0.1".to_owned(),
        "localhost".to_owned(),
    ] {
        assert_eq!(
            app.status_with_host("/v1/sources", &host).await,
            StatusCode::OK,
            "Host {host}"
        );
    }
}

/// With tokens, the token is the defence and any name is served (behind
/// a proxy that passes the public one); the Origin check stays.
#[tokio::test]
async fn with_tokens_any_name_is_served_and_the_origin_is_still_checked() {
    let app = spawn_app_with(|l| with_tokens(l, &[TOKEN])).await;
    assert_eq!(
        app.status_with_host("/v1/sources", "dedupd.example").await,
        StatusCode::OK
    );
    let res = app
        .request(Method::GET, "/v1/sources")
        .header("host", "dedupd.example")
        .header("origin", "https://dedupd.example")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK, "the console behind TLS");
    let res = app
        .sent_by_page(
            Method::POST,
            &claim_path("k"),
            Some(EVIL),
            Some("application/json"),
            "{}",
        )
        .await;
    assert_problem(res, StatusCode::FORBIDDEN, "cross_origin").await;
    assert_eq!(app.get("k").await.status(), StatusCode::NOT_FOUND);
    app.claim_ok("k", json!({})).await;
}

/// Without tokens, a request that came through a reverse proxy is refused
/// everywhere but ingest and the probes, whichever mark shows the proxy: a
/// forwarding header, or HTTP/1.0 (nginx's default to its upstream). With
/// tokens, the token is the defence and the same requests are served.
#[tokio::test]
async fn without_tokens_a_request_through_a_proxy_is_refused_with_tokens_served() {
    let app = spawn_app().await;
    let marks = [
        ("Forwarded", "for=192.0.2.60;proto=https"),
        ("Via", "1.1 proxy.example"),
        ("X-Forwarded-For", "192.0.2.60"),
        ("X-Forwarded-Host", "dedupd.example"),
        ("X-Forwarded-Proto", "https"),
        ("X-Real-IP", "192.0.2.60"),
    ];
    for (name, value) in marks {
        for path in ["/v1/sources", "/metrics", "/openapi.json", "/ui", "/"] {
            let res = app
                .request(Method::GET, path)
                .header(name, value)
                .send()
                .await
                .unwrap();
            let p =
                assert_problem(res, StatusCode::MISDIRECTED_REQUEST, "proxy_needs_tokens").await;
            assert!(
                p["detail"]
                    .as_str()
                    .unwrap()
                    .contains(if name.starts_with("X-Forwarded") {
                        "X-Forwarded-*"
                    } else {
                        name
                    }),
                "{name}: {p}"
            );
        }
        let res = app
            .request(Method::POST, &claim_path("proxied"))
            .header(name, value)
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        assert_problem(res, StatusCode::MISDIRECTED_REQUEST, "proxy_needs_tokens").await;
        for probe in ["/healthz", "/readyz"] {
            let res = app
                .request(Method::GET, probe)
                .header(name, value)
                .send()
                .await
                .unwrap();
            assert_eq!(res.status(), StatusCode::OK, "{name} on {probe}");
        }
        let res = app
            .request(Method::POST, "/ingest/nosuch")
            .header(name, value)
            .send()
            .await
            .unwrap();
        assert_problem(res, StatusCode::NOT_FOUND, "unknown_source").await;
    }
    assert_eq!(app.get("proxied").await.status(), StatusCode::NOT_FOUND);
    let http10 = "POST /v1/claims/proxied HTTP/1.0\r\nHost: {addr}\r\nContent-Length: 0\r\n";
    assert_eq!(raw_status(&app, http10).await, 421);
    let http10 = "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n";
    assert_eq!(raw_status(&app, http10).await, 421);
    let http10 = "GET /healthz HTTP/1.0\r\nHost: {addr}\r\n";
    assert_eq!(raw_status(&app, http10).await, 200);
    assert_eq!(app.get("proxied").await.status(), StatusCode::NOT_FOUND);
    // The same request in HTTP/1.1, as curl and browsers send it.
    let http11 = "POST /v1/claims/proxied HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\n";
    assert_eq!(raw_status(&app, http11).await, 201);

    let app = spawn_app_with(|l| with_tokens(l, &[TOKEN])).await;
    for (name, value) in marks {
        let res = app
            .request(Method::POST, &claim_path(&format!("via-{name}")))
            .header(name, value)
            .header("host", "dedupd.example")
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::CREATED, "{name} with a token");
    }
    let http10 = format!(
        "POST /v1/claims/old HTTP/1.0\r\nHost: {{addr}}\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Length: 0\r\n"
    );
    assert_eq!(raw_status(&app, &http10).await, 201);
}
