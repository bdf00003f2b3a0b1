//! Bearer tokens on `/v1/*` and `/metrics`: full and read-only ones, and
//! the limit on failed attempts per address.

use std::time::Duration;

use reqwest::Method;
use reqwest::StatusCode;
use serde_json::json;

use crate::metrics::count;
use crate::support::app::T0;
use crate::support::app::assert_problem;
use crate::support::app::claim_path;
use crate::support::app::spawn_app_with;
use crate::support::app::with_read_tokens;
use crate::support::app::with_tokens;
use crate::support::gateway::body;
use crate::support::gateway::settings;
use crate::support::receiver::Behaviour;
use crate::support::receiver::Receiver;
const TOKEN: &str = "test-token-0123456789";
const ROTATED: &str = "next-token-9876543210";

#[tokio::test]
async fn with_tokens_configured_v1_requires_a_valid_bearer_token() {
    let app = spawn_app_with(|l| with_tokens(l, &[TOKEN, ROTATED])).await;
    let url = app.url(&claim_path("k"));

    let res = app.client.post(&url).send().await.unwrap();
    assert_eq!(res.headers()["www-authenticate"], "Bearer");
    assert_problem(res, StatusCode::UNAUTHORIZED, "unauthorized").await;

    let res = app
        .client
        .post(&url)
        .bearer_auth("wrong-token-0123456789")
        .send()
        .await
        .unwrap();
    assert_problem(res, StatusCode::UNAUTHORIZED, "unauthorized").await;
    let res = app
        .client
        .post(&url)
        .header("authorization", TOKEN)
        .send()
        .await
        .unwrap();
    assert_problem(res, StatusCode::UNAUTHORIZED, "unauthorized").await;

    // Refused requests changed nothing.
    let res = app
        .client
        .get(&url)
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NOT_FOUND);

    let res = app
        .client
        .post(&url)
        .bearer_auth(TOKEN)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let res = app
        .client
        .get(&url)
        .bearer_auth(ROTATED)
        .send()
        .await
        .unwrap();
    assert_eq!(
        res.status(),
        StatusCode::OK,
        "every configured token is accepted"
    );
}

#[tokio::test]
async fn a_v1_path_spelled_with_escapes_needs_the_token_its_route_needs() {
    let app = spawn_app_with(|l| with_tokens(l, &[TOKEN])).await;
    // The router decodes `%76%31` to `v1`: this path is `/v1/sources`.
    let sources = app.url("/%76%31/sources");
    let res = app.client.get(&sources).send().await.unwrap();
    assert_problem(res, StatusCode::UNAUTHORIZED, "unauthorized").await;
    let res = app
        .client
        .get(&sources)
        .bearer_auth(TOKEN)
        .header("origin", "http://evil.example")
        .send()
        .await
        .unwrap();
    assert_problem(res, StatusCode::FORBIDDEN, "cross_origin").await;
    let res = app
        .client
        .get(&sources)
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK, "served as /v1/sources");

    let escaped = format!("/%76%31{}", &claim_path("k")["/v1".len()..]);
    let res = app
        .client
        .post(app.url(&escaped))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_problem(res, StatusCode::UNAUTHORIZED, "unauthorized").await;
    for path in ["/v1", "/v1/", "/v1/no-such-route"] {
        let res = app.client.get(app.url(path)).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "{path}");
    }
    let res = app
        .client
        .get(app.url(&claim_path("k")))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NOT_FOUND, "nothing was claimed");
}

#[tokio::test]
async fn health_endpoints_need_no_token() {
    let app = spawn_app_with(|l| with_tokens(l, &[TOKEN])).await;
    for path in ["/healthz", "/readyz"] {
        let res = app.client.get(app.url(path)).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{path}");
    }
}

const READER: &str = "reader-token-0123456789";

#[tokio::test]
async fn a_read_only_token_reads_everything_and_writes_nothing() {
    let app = spawn_app_with(|l| {
        with_tokens(l, &[TOKEN]);
        with_read_tokens(l, &[READER]);
    })
    .await;
    let as_reader = |method: Method, path: &str| {
        app.client
            .request(method, app.url(path))
            .bearer_auth(READER)
    };
    for path in ["/v1/sources", "/metrics"] {
        let res = as_reader(Method::GET, path).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{path}");
    }
    let res = as_reader(Method::GET, &claim_path("k"))
        .send()
        .await
        .unwrap();
    assert_problem(res, StatusCode::NOT_FOUND, "not_found").await;

    let writes = [
        (Method::POST, claim_path("k"), json!({})),
        (
            Method::POST,
            format!("{}/done", claim_path("k")),
            json!({ "token": "0".repeat(32) }),
        ),
        (
            Method::DELETE,
            claim_path("k"),
            json!({ "token": "0".repeat(32) }),
        ),
        (
            Method::POST,
            "/v1/streams/run-1/apply".into(),
            json!({ "event_id": "e1", "created_at": "2026-11-29T10:00:00Z" }),
        ),
        (
            Method::POST,
            "/v1/sources/s/events/e/redeliver".into(),
            json!({}),
        ),
    ];
    for (method, path, body) in writes {
        let res = as_reader(method.clone(), &path)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_problem(res, StatusCode::FORBIDDEN, "read_only_token").await;
    }
    // Nothing was written; a full token writes.
    assert_eq!(app.get("k").await.status(), StatusCode::NOT_FOUND);
    assert_eq!(app.head("run-1").await.status(), StatusCode::NOT_FOUND);
    app.claim_ok("k", json!({})).await;
    // Refusing a write is no failed authentication.
    let s = app.scrape().await;
    assert_eq!(
        count(&s, "dedupd_auth_failures_total", &[("port", "http")]),
        0.0
    );
}

/// `HEAD` on every route that answers `GET` (a read-only token's other
/// method, docs/security.md): `GET`'s status and headers without the body,
/// under `GET`'s token rules.
#[tokio::test]
async fn head_answers_every_read_as_get_does_and_needs_the_same_token() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let url = receiver.url.clone();
    let app = spawn_app_with(move |l| {
        with_tokens(l, &[TOKEN]);
        with_read_tokens(l, &[READER]);
        l.settings.sources.insert("sume".into(), settings(&url));
    })
    .await;
    app.ingest_ok(&body("e1", "run_1", "2026-11-29T10:00:00Z"))
        .await;
    app.claim_ok("k1", json!({})).await;
    app.apply_ok("s1", "e1", "2026-11-29T10:00:00Z").await;
    let reads: Vec<String> = dedupd::routes::endpoints()
        .iter()
        .filter(|e| e.method.as_str() == "GET")
        .map(|e| {
            e.path
                .replace("{key}", "k1")
                .replace("{stream}", "s1")
                .replace("{source}", "sume")
                .replace("{event_id}", "e1")
                .replace("{job}", "nosuch")
                .replace("{file}", "app.js")
        })
        .collect();
    assert!(reads.iter().filter(|p| p.starts_with("/v1/")).count() >= 7);
    let send = |method: Method, path: &str, token: Option<&str>| {
        let rb = app.client.request(method, app.url(path));
        match token {
            Some(t) => rb.bearer_auth(t),
            None => rb,
        }
        .send()
    };
    for path in &reads {
        for token in [Some(READER), None] {
            let get = send(Method::GET, path, token).await.unwrap();
            let head = send(Method::HEAD, path, token).await.unwrap();
            assert_eq!(head.status(), get.status(), "HEAD {path} ({token:?})");
            let headers = |res: &reqwest::Response| {
                let mut h: Vec<(String, String)> = res
                    .headers()
                    .iter()
                    // The scrape counts itself: its length grows.
                    .filter(|(n, _)| {
                        *n != "date" && !(path == "/metrics" && *n == "content-length")
                    })
                    .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned()))
                    .collect();
                h.sort();
                h
            };
            assert_eq!(headers(&head), headers(&get), "HEAD {path} ({token:?})");
            assert!(
                head.bytes().await.unwrap().is_empty(),
                "HEAD {path} has no body"
            );
        }
    }
    // Behind the tokens, a HEAD without one is refused as a GET is.
    let res = send(Method::HEAD, "/v1/sources", None).await.unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    let res = send(Method::HEAD, &claim_path("k1"), Some(READER))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(res.headers()["content-length"].to_str().unwrap() != "0");
}

#[tokio::test]
async fn a_read_only_token_is_no_redis_password() {
    let app = crate::resp::spawn_resp_app_at(T0, |l| {
        with_tokens(l, &[TOKEN]);
        with_read_tokens(l, &[READER]);
    })
    .await;
    let addr = crate::resp::resp_addr(&app);
    let wrongpass = b"-WRONGPASS invalid username-password pair or user is disabled.\r\n";
    let mut c = crate::resp::Raw::connect(&addr).await;
    assert_eq!(c.cmd(&format!("AUTH {READER}")).await, wrongpass);
    assert_eq!(c.cmd(&format!("AUTH default {READER}")).await, wrongpass);
    assert_eq!(
        c.cmd(&format!("HELLO 3 AUTH default {READER}")).await,
        wrongpass
    );
    assert!(c.cmd("GET k").await.starts_with(b"-NOAUTH"));
    assert_eq!(c.cmd(&format!("AUTH {TOKEN}")).await, b"+OK\r\n");
}

/// Ten wrong tokens from one address within a minute: its next attempts
/// get 429 without the token being looked at (the right one included,
/// or guessing could go on), until the minute has passed.
#[tokio::test]
async fn an_address_that_keeps_failing_waits_for_the_window_right_token_or_not() {
    let app = spawn_app_with(|l| with_tokens(l, &[TOKEN, ROTATED])).await;
    let url = app.url("/v1/sources");
    let with = |token: &str| app.client.get(&url).bearer_auth(token).send();

    // No credential at all guesses nothing, and is not counted.
    for _ in 0..20 {
        let res = app.client.get(&url).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    }
    // Nine failures, a success (which does not wipe them: a read-only
    // token's holder could otherwise guess the full ones between
    // successes), then the tenth failure.
    for i in 0..9 {
        let res = with(&format!("wrong-token-{i:010}")).await.unwrap();
        assert_problem(res, StatusCode::UNAUTHORIZED, "unauthorized").await;
    }
    assert_eq!(with(TOKEN).await.unwrap().status(), StatusCode::OK);
    let res = with("wrong-token-last-one").await.unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);

    for token in [TOKEN, "wrong-token-again-1", ROTATED] {
        let res = with(token).await.unwrap();
        assert_eq!(res.headers()["retry-after"], "60", "{token}");
        assert_problem(res, StatusCode::TOO_MANY_REQUESTS, "auth_throttled").await;
    }
    let res = app
        .client
        .get(app.url("/metrics"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS, "/metrics too");
    // The probes and ingest take no token: untouched.
    let res = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);

    app.clock.advance(Duration::from_secs(45));
    let res = with(TOKEN).await.unwrap();
    assert_eq!(res.headers()["retry-after"], "15");
    app.clock.advance(Duration::from_secs(15));
    assert_eq!(with(TOKEN).await.unwrap().status(), StatusCode::OK);

    let s = app.scrape().await;
    let auth = |name, port| count(&s, name, &[("port", port)]);
    assert_eq!(auth("dedupd_auth_failures_total", "http"), 10.0);
    assert_eq!(auth("dedupd_auth_throttled_total", "http"), 5.0);
    assert_eq!(auth("dedupd_auth_failures_total", "resp"), 0.0);
    assert_eq!(auth("dedupd_auth_throttled_total", "resp"), 0.0);
}

#[tokio::test]
async fn failed_redis_auths_share_the_limit_with_the_http_api() {
    use crate::resp::{Raw, resp_addr, with_resp};
    let app = spawn_app_with(|l| {
        with_tokens(l, &[TOKEN]);
        with_resp(l);
    })
    .await;
    let addr = resp_addr(&app);
    let mut c = Raw::connect(&addr).await;
    // Ten wrong passwords over AUTH and HELLO: each WRONGPASS counts.
    for i in 0..10 {
        let reply = if i % 2 == 0 {
            c.cmd(&format!("AUTH wrong-password-{i:06}")).await
        } else {
            c.cmd(&format!("HELLO 2 AUTH default wrong-password-{i:06}"))
                .await
        };
        assert!(
            reply.starts_with(b"-WRONGPASS"),
            "{}",
            String::from_utf8_lossy(&reply)
        );
    }
    // The address now waits out the window, right password or not, on
    // either port; its password is not even looked at.
    let refused = c.cmd(&format!("AUTH {TOKEN}")).await;
    assert_eq!(
        String::from_utf8_lossy(&refused),
        "-ERR too many failed authentications from this address: try again in 60 s\r\n"
    );
    assert_eq!(
        c.cmd("GET k").await,
        b"-NOAUTH Authentication required.\r\n"
    );
    let res = app
        .client
        .get(app.url("/v1/sources"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);

    app.clock.advance(Duration::from_secs(60));
    assert_eq!(c.cmd(&format!("AUTH {TOKEN}")).await, b"+OK\r\n");
    let s = app.scrape().await;
    let auth = |name, port| count(&s, name, &[("port", port)]);
    assert_eq!(auth("dedupd_auth_failures_total", "resp"), 10.0);
    assert_eq!(auth("dedupd_auth_throttled_total", "resp"), 1.0);
    assert_eq!(auth("dedupd_auth_throttled_total", "http"), 1.0);
}
