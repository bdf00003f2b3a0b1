//! The providers people receive from, end to end: a source configured as
//! `dedupd init --scheme X` writes it, a request signed as the provider
//! signs it, delivered once to a real receiver; a provider's retry is a
//! duplicate, a forgery is refused. Then `body-sha256`, Unix-time
//! `created_at` ordering, the Slack and Zoom URL checks, check-config's
//! refusals, and (in CI, with their Python packages) requests signed by
//! slack_sdk and svix themselves.

use std::time::Duration;

use dedupd::config::sources::SourceSettings;
use dedupd::gateway::locate::body_sha256;
use dedupd::gateway::signature::{Scheme, sign_at};
use hmac::{KeyInit, Mac};
use reqwest::{Response, StatusCode};
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::support::app::{TestApp, spawn_app_with};
use crate::support::gateway::{DESTINATION, ids};
use crate::support::process::run_with_json;
use crate::support::receiver::{Behaviour, Receiver};

const SQUARE_URL: &str = "https://hooks.example.com/ingest/square";

/// A provider: its source's settings (as the init template has them) and
/// a body of the shape it sends, with the time fields at `now_s`.
struct Provider {
    scheme: Scheme,
    secret: &'static str,
    fields: &'static str,
    body: fn(now_s: i64, n: u32) -> Value,
}

const PROVIDERS: [Provider; 7] = [
    Provider {
        scheme: Scheme::Slack,
        secret: "8f742231b10e8888abcd99yyyzzz85a5",
        fields: r#"event_id = "body:/event_id"
created_at = "body:/event_time"
created_at_format = "unix-seconds"
stream = "body:/event/channel""#,
        body: |now, n| {
            json!({"type": "event_callback", "team_id": "T1", "event_id": format!("Ev0{n}"),
                   "event_time": now, "event": {"type": "message", "channel": "C1", "text": "hi"}})
        },
    },
    Provider {
        scheme: Scheme::Shopify,
        secret: "shpss_client_secret",
        fields: r#"event_id = "body-sha256"
created_at = "body:/updated_at"
stream = "body:/id""#,
        body: |_, n| {
            json!({"id": 820_982_911_946_154_500_u64 + u64::from(n), "email": "jon@example.com",
                   "updated_at": "2026-12-03T10:00:00-05:00"})
        },
    },
    Provider {
        scheme: Scheme::Paddle,
        secret: "pdl_ntfset_01hbpjmytsa32fhr36nqgc3kgb_WvRO0eL4Bj9rgYYIBZY6wZhG4EHy9jzh",
        fields: r#"event_id = "body:/event_id"
created_at = "body:/occurred_at"
stream = "body:/data/id""#,
        body: |_, n| {
            json!({"event_id": format!("evt_0{n}"), "event_type": "subscription.updated",
                   "occurred_at": "2026-12-03T10:00:00.390028Z", "notification_id": "ntf_1",
                   "data": {"id": "sub_1", "status": "active"}})
        },
    },
    Provider {
        scheme: Scheme::Svix,
        secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        fields: r#"event_id = "header:svix-id"
created_at = "body:/timestamp"
stream = "body:/data/id""#,
        // Clerk's envelope: `timestamp` in milliseconds, read as such.
        body: |now, _| {
            json!({"object": "event", "type": "user.updated", "timestamp": now * 1000,
                   "data": {"id": "user_29w83sxmDNGwOuEthce5gg56FcC"}})
        },
    },
    Provider {
        scheme: Scheme::Square,
        secret: "Ibxx_5AKakO-3qeNVR61Dw",
        fields: r#"notification_url = "https://hooks.example.com/ingest/square"
event_id = "body:/event_id"
created_at = "body:/created_at"
stream = "body:/data/id""#,
        body: |_, n| {
            json!({"merchant_id": "MLEFBHHSJGVHD", "type": "payment.updated",
                   "event_id": format!("ac3ac95b-f97d-458c-a6e6-18981597e0{n:02}"),
                   "created_at": "2026-12-03T10:00:59.037339943Z",
                   "data": {"type": "payment", "id": "pay_1"}})
        },
    },
    Provider {
        scheme: Scheme::Zoom,
        secret: "zoom_secret_token",
        fields: r#"event_id = "body-sha256"
created_at = "body:/event_ts"
created_at_format = "unix-millis"
stream = "body:/payload/object/id""#,
        body: |now, n| {
            json!({"event": "meeting.started", "event_ts": now * 1000 + i64::from(n),
                   "payload": {"account_id": "acc", "object": {"id": "85746065432"}}})
        },
    },
    Provider {
        scheme: Scheme::Linear,
        secret: "lin_wh_secret",
        fields: r#"event_id = "body:/action + body:/data/id + body:/createdAt"
created_at = "body:/createdAt"
stream = "body:/data/id""#,
        body: |now, n| {
            json!({"action": "update", "type": "Issue", "createdAt": format!("2026-12-03T10:00:0{n}.084Z"),
                   "data": {"id": "iss_1"}, "webhookTimestamp": now * 1000})
        },
    },
];

fn settings(p: &Provider, forward_to: &str) -> SourceSettings {
    toml::from_str(&format!(
        "scheme = \"{}\"\nsecrets = [\"{}\"]\n{}\nforward_to = \"{forward_to}\"\n\
         destination_secret = \"{DESTINATION}\"\nbackoff_min = \"10ms\"\nbackoff_max = \"40ms\"\n",
        p.scheme.name(),
        p.secret,
        p.fields,
    ))
    .unwrap_or_else(|e| panic!("{:?}: {e}", p.scheme))
}

/// Posts `body` to `/ingest/{source}` with `headers`.
async fn post(app: &TestApp, source: &str, body: &[u8], headers: &[(&str, String)]) -> Response {
    let mut req = app
        .client
        .post(app.url(&format!("/ingest/{source}")))
        .header("content-type", "application/json")
        .body(body.to_vec());
    for (name, value) in headers {
        req = req.header(*name, value);
    }
    req.send().await.unwrap()
}

/// Posts `body` signed with `secret` as the provider of `scheme` signs.
async fn post_signed(
    app: &TestApp,
    source: &str,
    scheme: Scheme,
    secret: &str,
    id: &str,
    body: &[u8],
) -> Response {
    let headers = sign_at(scheme, secret, app.now_s(), id, SQUARE_URL, body);
    post(app, source, body, &headers).await
}

async fn answer(res: Response) -> (StatusCode, Value) {
    let status = res.status();
    (status, res.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn each_provider_signed_as_it_signs_is_delivered_once_its_retry_a_duplicate_a_forgery_refused()
 {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let built: Vec<(String, SourceSettings)> = PROVIDERS
        .iter()
        .map(|p| (p.scheme.name().to_owned(), settings(p, &receiver.url)))
        .collect();
    let app = spawn_app_with(move |l| l.settings.sources.extend(built)).await;
    // When the providers whose created_at is Unix time posted.
    let mut posted_at: Vec<(&str, i64)> = Vec::new();
    for p in &PROVIDERS {
        let name = p.scheme.name();
        if matches!(p.scheme, Scheme::Slack | Scheme::Svix | Scheme::Zoom) {
            posted_at.push((name, app.now_s()));
        }
        let body = serde_json::to_vec(&(p.body)(app.now_s(), 1)).unwrap();
        let (status, first) =
            answer(post_signed(&app, name, p.scheme, p.secret, "msg_1", &body).await).await;
        assert_eq!(
            (status, &first["status"]),
            (StatusCode::OK, &json!("accepted")),
            "{name}: {first}"
        );

        // The provider's retry, signed afresh a little later. Linear's
        // carries a new webhookTimestamp, so other bytes: its id is what
        // the event is, not the body's hash.
        app.clock.advance(Duration::from_secs(30));
        let retry_body = if p.scheme == Scheme::Linear {
            serde_json::to_vec(&(p.body)(app.now_s(), 1)).unwrap()
        } else {
            body.clone()
        };
        assert_ne!(
            (p.scheme == Scheme::Linear),
            (retry_body == body),
            "{name}: Linear's retry differs, the others' are the same bytes"
        );
        let (status, retry) =
            answer(post_signed(&app, name, p.scheme, p.secret, "msg_1", &retry_body).await).await;
        assert_eq!(
            (status, &retry["status"], &retry["event_id"]),
            (StatusCode::OK, &json!("duplicate"), &first["event_id"]),
            "{name}: {retry}"
        );

        // Signed with another secret: refused, nothing stored.
        let other = serde_json::to_vec(&(p.body)(app.now_s(), 2)).unwrap();
        let wrong = if p.scheme == Scheme::Svix {
            "whsec_c2VjcmV0LW90aGVy"
        } else {
            "not-the-secret"
        };
        let (status, refused) =
            answer(post_signed(&app, name, p.scheme, wrong, "msg_2", &other).await).await;
        assert_eq!(
            (status, &refused["code"]),
            (StatusCode::UNAUTHORIZED, &json!("bad_signature")),
            "{name}: {refused}"
        );
        // Without the provider's headers at all: refused by name.
        let (status, bare) = answer(post(&app, name, &other, &[]).await).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{name}: {bare}");
        assert!(
            bare["detail"]
                .as_str()
                .unwrap()
                .starts_with("missing header"),
            "{name}: {bare}"
        );
    }
    app.retrying_until("one delivery per provider", || async {
        receiver.received().len() >= PROVIDERS.len()
    })
    .await;
    app.clock.advance(Duration::from_secs(5));
    let got = receiver.received();
    assert_eq!(got.len(), PROVIDERS.len(), "{:?}", ids(&got));
    let delivered_of = |name: &'static str| {
        let app = &app;
        async move {
            app.request(
                reqwest::Method::GET,
                &format!("/v1/sources/{name}/events?status=delivered"),
            )
            .send()
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap()["events"]
                .as_array()
                .unwrap()
                .clone()
        }
    };
    // The receiver answered each; the dispatcher marks each delivered once
    // it has read that answer.
    app.retrying_until("every event marked delivered", || async {
        for p in &PROVIDERS {
            if delivered_of(p.scheme.name()).await.is_empty() {
                return false;
            }
        }
        true
    })
    .await;
    for p in &PROVIDERS {
        let name = p.scheme.name();
        let delivered: Vec<Value> = delivered_of(name).await;
        assert_eq!(delivered.len(), 1, "{name}: {delivered:?}");
        // Time fields read as instants: Slack's Unix seconds, Clerk's and
        // Zoom's milliseconds, the others' RFC 3339.
        let created = delivered[0]["created_at"].as_str().unwrap();
        assert!(created.starts_with("20"), "{name}: {created}");
        if let Some(at) = posted_at.iter().find(|(n, _)| *n == name).map(|(_, t)| *t) {
            let ms = if p.scheme == Scheme::Zoom { 1 } else { 0 };
            let expected = time::OffsetDateTime::from_unix_timestamp(at).unwrap()
                + time::Duration::milliseconds(ms);
            let expected = expected
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap();
            assert_eq!(
                created, expected,
                "{name}: created_at is the body's instant"
            );
        }
    }
}

#[tokio::test]
async fn body_sha256_dedupes_a_github_redelivery_whatever_its_unsigned_headers_say() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let s: SourceSettings = toml::from_str(&format!(
        "scheme = \"github\"\nsecrets = [\"gh-secret\"]\nevent_id = \"body-sha256\"\n\
         forward_to = \"{}\"\ndestination_secret = \"{DESTINATION}\"\n",
        receiver.url
    ))
    .unwrap();
    let app = spawn_app_with(move |l| {
        l.settings.sources.insert("github".into(), s);
    })
    .await;
    let body = br#"{"action":"opened","issue":{"number":7},"repository":{"full_name":"o/r"}}"#;
    let signed = sign_at(Scheme::Github, "gh-secret", 0, "", "", body);
    let with_delivery = |guid: &str| {
        let mut h = signed.clone();
        h.push(("X-GitHub-Delivery", guid.to_owned()));
        h
    };
    let (status, first) = answer(post(&app, "github", body, &with_delivery("guid-1")).await).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(first["status"], "accepted");
    assert_eq!(first["event_id"], body_sha256(body));
    // A redelivery, or a captured request with a changed header: the same
    // signed bytes, so the same id.
    let (_, again) = answer(post(&app, "github", body, &with_delivery("guid-forged")).await).await;
    assert_eq!(
        (&again["status"], &again["event_id"]),
        (&json!("duplicate"), &first["event_id"])
    );
    // Another event is other bytes.
    let other = br#"{"action":"closed","issue":{"number":7},"repository":{"full_name":"o/r"}}"#;
    let (_, second) = answer(
        post(
            &app,
            "github",
            other,
            &sign_at(Scheme::Github, "gh-secret", 0, "", "", other),
        )
        .await,
    )
    .await;
    assert_eq!(second["status"], "accepted");
    assert_eq!(second["event_id"], body_sha256(other));
    app.retrying_until("both delivered", || async {
        receiver.received().len() >= 2
    })
    .await;
    let got = receiver.received();
    assert_eq!(
        ids(&got),
        [body_sha256(body), body_sha256(other)],
        "the forward's webhook-id is the hash"
    );
}

#[tokio::test]
async fn stripe_events_are_ordered_per_object_by_their_unix_seconds_created() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    // The stripe template's fields.
    let s: SourceSettings = toml::from_str(&format!(
        "scheme = \"stripe\"\nsecrets = [\"whsec_stripe\"]\nevent_id = \"body:/id\"\n\
         created_at = \"body:/created\"\ncreated_at_format = \"unix-seconds\"\n\
         stream = \"body:/data/object/id\"\nforward_to = \"{}\"\n\
         destination_secret = \"{DESTINATION}\"\n",
        receiver.url
    ))
    .unwrap();
    let app = spawn_app_with(move |l| {
        l.settings.sources.insert("stripe".into(), s);
    })
    .await;
    let event = |id: &str, created: i64, object: &str| {
        serde_json::to_vec(
            &json!({"id": id, "object": "event", "type": "invoice.updated",
            "created": created, "data": {"object": {"id": object, "object": "invoice"}}}),
        )
        .unwrap()
    };
    let post_event = |body: Vec<u8>| {
        let app = &app;
        async move {
            let res = post_signed(app, "stripe", Scheme::Stripe, "whsec_stripe", "", &body).await;
            answer(res).await
        }
    };
    let (status, newer) = post_event(event("evt_new", 1_764_410_410, "in_1")).await;
    assert_eq!(
        (status, &newer["status"]),
        (StatusCode::OK, &json!("accepted"))
    );
    app.retrying_until("the newer event delivered", || async {
        receiver.received().len() == 1
    })
    .await;
    // An older event of the same invoice, retried late by Stripe: stale,
    // never sent. One of another invoice is delivered.
    post_event(event("evt_old", 1_764_410_400, "in_1")).await;
    post_event(event("evt_other", 1_764_410_400, "in_2")).await;
    let stale_listed = || async {
        let v: Value = app
            .request(
                reqwest::Method::GET,
                "/v1/sources/stripe/events?status=stale",
            )
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        v["events"].as_array().unwrap().len() == 1
    };
    app.retrying_until("the older one is stale", stale_listed)
        .await;
    app.retrying_until("the other invoice's delivered", || async {
        receiver.received().len() == 2
    })
    .await;
    assert_eq!(ids(&receiver.received()), ["evt_new", "evt_other"]);

    // A created that is not Unix seconds is refused with the reason.
    let (status, bad) = post_event(event("evt_bad", -5, "in_1")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
    assert_eq!(bad["code"], "invalid_created_at");
    assert!(
        bad["detail"].as_str().unwrap().contains("Unix seconds"),
        "{bad}"
    );
}

#[tokio::test]
async fn slacks_and_zooms_signed_url_checks_are_answered_and_nothing_is_stored() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let slack = &PROVIDERS[0];
    let zoom = &PROVIDERS[5];
    let (a, b) = (
        settings(slack, &receiver.url),
        settings(zoom, &receiver.url),
    );
    let app = spawn_app_with(move |l| {
        l.settings.sources.insert("slack".into(), a);
        l.settings.sources.insert("zoom".into(), b);
    })
    .await;
    // Slack's url_verification, as its docs show it.
    let check = br#"{"token":"Jhj5dZrVaK7ZwHHjRyZWjbDl","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}"#;
    let (status, reply) =
        answer(post_signed(&app, "slack", Scheme::Slack, slack.secret, "", check).await).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        reply,
        json!({"challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"})
    );
    // Unsigned, or signed with another secret: refused like any request.
    let (status, _) =
        answer(post_signed(&app, "slack", Scheme::Slack, "other", "", check).await).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // Zoom's endpoint.url_validation, as its docs show it.
    let validation = br#"{"payload":{"plainToken":"qgg8vlvZRS6UYooatFL8Aw"},"event_ts":1654503849680,"event":"endpoint.url_validation"}"#;
    let (status, reply) =
        answer(post_signed(&app, "zoom", Scheme::Zoom, zoom.secret, "", validation).await).await;
    assert_eq!(status, StatusCode::OK);
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(zoom.secret.as_bytes()).unwrap();
    mac.update(b"qgg8vlvZRS6UYooatFL8Aw");
    assert_eq!(
        reply,
        json!({"plainToken": "qgg8vlvZRS6UYooatFL8Aw",
               "encryptedToken": hex::encode(mac.finalize().into_bytes())})
    );
    let (status, _) = answer(post(&app, "zoom", validation, &[]).await).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // 80 KB of nesting around the marker: refused as a body that is not
    // JSON (serde_json's depth limit), the process unharmed.
    let deep = format!(
        "{}\"url_verification\"{}",
        "[".repeat(40_000),
        "]".repeat(40_000)
    );
    let (status, v) = answer(
        post_signed(
            &app,
            "slack",
            Scheme::Slack,
            slack.secret,
            "",
            deep.as_bytes(),
        )
        .await,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    // Neither check is an event: nothing listed, nothing delivered.
    for source in ["slack", "zoom"] {
        for status in ["pending", "delivered", "dead"] {
            let v: Value = app
                .request(
                    reqwest::Method::GET,
                    &format!("/v1/sources/{source}/events?status={status}"),
                )
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            assert_eq!(v["events"], json!([]), "{source} {status}");
        }
    }
    app.clock.advance(Duration::from_secs(1));
    assert!(receiver.received().is_empty());
}

#[test]
fn check_config_names_what_a_provider_source_lacks_or_misreads() {
    let dir = TempDir::new().unwrap();
    let file = dir.path().join("providers.toml");
    std::fs::write(
        &file,
        format!(
            r#"
[sources.square]
scheme = "square"
secrets = ["key"]
event_id = "body:/event_id"
forward_to = "http://127.0.0.1:3000/"
destination_secret = "{DESTINATION}"

[sources.slack]
scheme = "slack"
secrets = ["s"]
notification_url = "https://example.com/"
event_id = "body:/event_id"
created_at = "body-sha256"
stream = "body:/a + header:x-slack-retry-num"
created_at_format = "unix-hours"
forward_to = "http://127.0.0.1:3000/"
destination_secret = "{DESTINATION}"

[sources.shopify]
scheme = "shopify"
secrets = ["s"]
event_id = "header:X-Shopify-Event-Id"
forward_to = "http://127.0.0.1:3000/"
destination_secret = "{DESTINATION}"
"#
        ),
    )
    .unwrap();
    let out = crate::support::process::dedupd()
        .args(["check-config", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("created_at_format"), "{stderr}");
    // The unknown format stops the parse; without it, the rest is named.
    let text = std::fs::read_to_string(&file)
        .unwrap()
        .replace("created_at_format = \"unix-hours\"\n", "");
    std::fs::write(&file, text).unwrap();
    let out = crate::support::process::dedupd()
        .args(["check-config", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    for (key, says) in [
        (
            "sources.square.notification_url",
            "Square signs the URL it posts to",
        ),
        (
            "sources.slack.notification_url",
            "only the square scheme signs a URL",
        ),
        (
            "sources.slack.created_at",
            "body-sha256 is only an event id",
        ),
        (
            "sources.slack.stream",
            "\"x-slack-retry-num\" is not covered by the slack signature",
        ),
        ("sources.shopify.event_id", "event_id = \"body-sha256\""),
    ] {
        let line = stderr.lines().find(|l| l.contains(key) && l.contains(says));
        assert!(line.is_some(), "{key}: {says}\n{stderr}");
    }
}

/// Requests signed by the providers' own libraries: slack_sdk's
/// `SignatureVerifier.generate_signature` and svix's `Webhook.sign`, at
/// the machine's clock. Needs `DEDUPD_TEST_PYTHON` with both packages;
/// `.ci/run` installs them.
#[tokio::test]
#[ignore = "needs DEDUPD_TEST_PYTHON (a python with slack_sdk and svix); .ci/run runs it"]
async fn requests_signed_by_slack_sdk_and_svix_are_accepted() {
    let python = std::env::var("DEDUPD_TEST_PYTHON")
        .expect("DEDUPD_TEST_PYTHON names a python that has slack_sdk and svix (see .ci/run)");
    let receiver = Receiver::start(Behaviour::Accept).await;
    let (slack, svix) = (&PROVIDERS[0], &PROVIDERS[3]);
    let (a, b) = (
        settings(slack, &receiver.url),
        settings(svix, &receiver.url),
    );
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let app = crate::support::app::spawn_app_at(
        dedupd::clock::ManualClock::new(u64::try_from(now_ms).unwrap()),
        move |l| {
            l.settings.sources.insert("slack".into(), a);
            l.settings.sources.insert("svix".into(), b);
        },
    )
    .await;
    let slack_body = serde_json::to_string(&(slack.body)(app.now_s(), 1)).unwrap();
    let svix_body = serde_json::to_string(&(svix.body)(app.now_s(), 1)).unwrap();
    let case = json!({
        "now": app.now_s(),
        "slack": [slack.secret, slack_body],
        "svix": [svix.secret, "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", svix_body],
    });
    const SCRIPT: &str = r#"
import json, sys
from datetime import datetime, timezone
from slack_sdk.signature import SignatureVerifier
from svix.webhooks import Webhook
case = json.load(sys.stdin)
secret, body = case["slack"]
ts = str(case["now"])
print(json.dumps({
    "slack": {"X-Slack-Request-Timestamp": ts,
              "X-Slack-Signature": SignatureVerifier(secret).generate_signature(timestamp=ts, body=body)},
    "svix": {"svix-id": case["svix"][1], "svix-timestamp": ts,
             "svix-signature": Webhook(case["svix"][0]).sign(
                 msg_id=case["svix"][1],
                 timestamp=datetime.fromtimestamp(case["now"], tz=timezone.utc),
                 data=case["svix"][2])},
}))
"#;
    let out = run_with_json(python, vec!["-c".into(), SCRIPT.into()], case).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let signed: Value = serde_json::from_slice(&out.stdout).unwrap();
    for (source, body) in [("slack", &slack_body), ("svix", &svix_body)] {
        let headers: Vec<(&str, String)> = signed[source]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str().unwrap().to_owned()))
            .collect();
        let (status, v) = answer(post(&app, source, body.as_bytes(), &headers).await).await;
        assert_eq!(
            (status, &v["status"]),
            (StatusCode::OK, &json!("accepted")),
            "{source}: {v}"
        );
        let (_, again) = answer(post(&app, source, body.as_bytes(), &headers).await).await;
        assert_eq!(again["status"], "duplicate", "{source}");
        // One byte changed: the library's signature no longer holds.
        let tampered = body.replacen("\"type\"", "\"typ\"", 1);
        let (status, _) = answer(post(&app, source, tampered.as_bytes(), &headers).await).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{source}");
    }
    app.retrying_until("both delivered", || async {
        receiver.received().len() >= 2
    })
    .await;
}

/// What dedupd signs as Square, Paddle and Linear (as `dedupd trigger`
/// and these tests do) is what the providers' own verifiers accept:
/// squareup's `verify_signature`, paddle-python-sdk's `PaddleSignature`
/// and @linear/sdk's `LinearWebhookClient` (none of them signs, and none
/// of the three publishes a worked example past Square's, which
/// `square.rs` checks). dedupd accepts the same requests. Needs
/// `DEDUPD_TEST_PYTHON` (with squareup and paddle-python-sdk) and
/// `DEDUPD_TEST_NODE_MODULES` (a node_modules with @linear/sdk); `.ci/run`
/// installs them.
#[tokio::test]
#[ignore = "needs DEDUPD_TEST_PYTHON and DEDUPD_TEST_NODE_MODULES; .ci/run runs it"]
async fn the_providers_own_verifiers_accept_what_dedupd_signs_as_them() {
    let python = std::env::var("DEDUPD_TEST_PYTHON")
        .expect("DEDUPD_TEST_PYTHON names a python with squareup and paddle-python-sdk");
    let modules = std::env::var("DEDUPD_TEST_NODE_MODULES")
        .expect("DEDUPD_TEST_NODE_MODULES names a node_modules holding @linear/sdk");
    let receiver = Receiver::start(Behaviour::Accept).await;
    let picked = [&PROVIDERS[2], &PROVIDERS[4], &PROVIDERS[6]];
    let built: Vec<(String, SourceSettings)> = picked
        .iter()
        .chain([&&PROVIDERS[1]])
        .map(|p| (p.scheme.name().to_owned(), settings(p, &receiver.url)))
        .collect();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let app = crate::support::app::spawn_app_at(
        dedupd::clock::ManualClock::new(u64::try_from(now_ms).unwrap()),
        move |l| l.settings.sources.extend(built),
    )
    .await;
    let mut signed = Vec::new();
    for p in picked {
        let body = serde_json::to_string(&(p.body)(app.now_s(), 1)).unwrap();
        let headers = sign_at(
            p.scheme,
            p.secret,
            app.now_s(),
            "",
            SQUARE_URL,
            body.as_bytes(),
        );
        signed.push((p, body, headers));
    }
    let header = |i: usize| signed[i].2[0].1.clone();
    const PYTHON: &str = r#"
import json, sys
from square.utils.webhooks_helper import verify_signature
from paddle_billing.Notifications import PaddleSignature, Secret
c = json.load(sys.stdin)
print("paddle", PaddleSignature().verify(c["paddle"][1], c["paddle"][0], Secret(c["paddle"][2])))
print("square", verify_signature(request_body=c["square"][0], signature_header=c["square"][1],
                                 signature_key=c["square"][2], notification_url=c["square"][3]))
"#;
    let out = run_with_json(
        python,
        vec!["-c".into(), PYTHON.into()],
        json!({
            "paddle": [signed[0].1, header(0), PROVIDERS[2].secret],
            "square": [signed[1].1, header(1), PROVIDERS[4].secret, SQUARE_URL],
        }),
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .collect::<Vec<_>>(),
        ["paddle True", "square True"]
    );
    let node = format!(
        "import {{ LinearWebhookClient }} from '{modules}/@linear/sdk/dist/webhooks/index.mjs';\n\
         let c = '';\n\
         for await (const chunk of process.stdin) c += chunk;\n\
         c = JSON.parse(c);\n\
         const client = new LinearWebhookClient(c.secret);\n\
         console.log('linear', client.verify(Buffer.from(c.body), c.signature));\n\
         try {{ client.verify(Buffer.from(c.body + ' '), c.signature); console.log('tampered accepted'); }}\n\
         catch (e) {{ console.log('tampered refused'); }}\n\
         const {{ getHmac }} = await import('{modules}/@shopify/shopify-api/dist/esm/test-helpers/get-hmac.mjs');\n\
         console.log(getHmac(c.shopify[0], c.shopify[1]));\n"
    );
    let shopify = serde_json::to_string(&(PROVIDERS[1].body)(app.now_s(), 1)).unwrap();
    let out = run_with_json(
        "node".into(),
        vec!["--input-type=module".into(), "-e".into(), node],
        json!({
            "secret": PROVIDERS[6].secret, "body": signed[2].1, "signature": header(2),
            "shopify": [shopify, PROVIDERS[1].secret],
        }),
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[..2], ["linear true", "tampered refused"], "{stdout}");
    let shopify_hmac = lines[2].to_owned();
    assert_eq!(
        sign_at(
            Scheme::Shopify,
            PROVIDERS[1].secret,
            0,
            "",
            "",
            shopify.as_bytes()
        ),
        [("X-Shopify-Hmac-Sha256", shopify_hmac.clone())],
        "dedupd signs as Shopify's SDK does"
    );
    signed.push((
        &PROVIDERS[1],
        shopify,
        vec![("X-Shopify-Hmac-Sha256", shopify_hmac)],
    ));
    // And dedupd takes each.
    for (p, body, headers) in &signed {
        let (status, v) = answer(post(&app, p.scheme.name(), body.as_bytes(), headers).await).await;
        assert_eq!(
            (status, &v["status"]),
            (StatusCode::OK, &json!("accepted")),
            "{:?}: {v}",
            p.scheme
        );
    }
}
