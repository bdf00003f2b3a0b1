//! The gateway fixture: a source's settings, an app with one or several
//! sources behind a real receiver, signed posts, and waits on delivery.

use std::future::Future;
use std::time::Duration;

use dedupd::clock::Clock;
use dedupd::config::sources::SourceSettings;
use dedupd::gateway::signature::Scheme;
use dedupd::gateway::signature::sign;
use reqwest::Method;
use reqwest::Response;
use reqwest::StatusCode;
use serde_json::Value;
use serde_json::json;

use crate::support::app::TestApp;
use crate::support::app::spawn_app_with;
use crate::support::receiver::Receiver;
/// Changes a test source's settings.
pub(crate) type Tweak = Box<dyn FnOnce(&mut SourceSettings)>;

/// An app with one source per `(name, receiver url, tweak)`.
pub(crate) async fn app_with_sources(sources: Vec<(&str, String, Tweak)>) -> TestApp {
    let built: Vec<(String, SourceSettings)> = sources
        .into_iter()
        .map(|(name, url, tweak)| {
            let mut s = settings(&url);
            tweak(&mut s);
            (name.to_owned(), s)
        })
        .collect();
    spawn_app_with(move |l| {
        for (name, s) in built {
            l.settings.sources.insert(name, s);
        }
    })
    .await
}

impl TestApp {
    pub(crate) async fn post_to(&self, source: &str, body: &[u8]) {
        let res = self
            .post_signed_at(source, body, self.now_s(), SECRET)
            .await;
        assert_eq!(res.status(), StatusCode::OK);
    }

    pub(crate) async fn ids_of(&self, source: &str, status: &str) -> Vec<String> {
        let v: Value = self
            .request(
                Method::GET,
                &format!("/v1/sources/{source}/events?status={status}&limit=500"),
            )
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        v["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["event_id"].as_str().unwrap().to_owned())
            .collect()
    }

    /// `GET /v1/sources/{source}`.
    pub(crate) async fn source_state(&self, source: &str) -> Value {
        let res = self
            .request(Method::GET, &format!("/v1/sources/{source}"))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        res.json().await.unwrap()
    }
}

pub(crate) const SECRET: &str = "sume_test_secret";
pub(crate) const DESTINATION: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

pub(crate) fn settings(forward_to: &str) -> SourceSettings {
    toml::from_str(&settings_toml(forward_to, &[SECRET])).unwrap()
}

/// [`settings`] as the lines of a `[sources.NAME]` table, signed with
/// `secrets`: for a configuration file (a reload reads one).
pub(crate) fn settings_toml(forward_to: &str, secrets: &[&str]) -> String {
    let secrets = secrets
        .iter()
        .map(|s| format!("{s:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        r#"
        scheme = "sume"
        event_id = "body:/request_id"
        created_at = "body:/created_at"
        stream = "body:/run_id"
        forward_to = "{forward_to}"
        max_attempts = 4
        backoff_min = "10ms"
        backoff_max = "40ms"
        forward_timeout = "30s"
        max_body_bytes = 4096
        secrets = [{secrets}]
        destination_secret = "{DESTINATION}"
        "#
    )
}

pub(crate) async fn gateway_app(
    forward_to: &str,
    tweak: impl FnOnce(&mut SourceSettings),
) -> TestApp {
    let mut s = settings(forward_to);
    tweak(&mut s);
    spawn_app_with(move |l| {
        l.settings.sources.insert("sume".into(), s);
    })
    .await
}

pub(crate) fn body(id: &str, run: &str, created_at: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "request_id": id, "run_id": run, "created_at": created_at, "type": "run.updated",
    }))
    .unwrap()
}

impl TestApp {
    /// Posts events `e{from}` … on streams `run_{from}` …, one stream each,
    /// all created at the same instant.
    pub(crate) async fn post_events(&self, from: usize, n: usize) {
        for i in from..from + n {
            self.ingest_ok(&body(
                &format!("e{i}"),
                &format!("run_{i}"),
                "2026-11-29T10:00:00Z",
            ))
            .await;
        }
    }

    /// The app's clock, in Unix seconds: what signatures are checked against.
    pub(crate) fn now_s(&self) -> i64 {
        i64::try_from(self.clock.now_ms() / 1000).unwrap()
    }

    /// Waits until `check` holds, moving the app's clock on by 50 ms (past
    /// the test sources' longest backoff) between looks, so retries and
    /// pauses come due without anyone sleeping through them.
    pub(crate) async fn retrying_until<F, Fut>(&self, what: &str, mut check: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !check().await {
            assert!(
                std::time::Instant::now() < deadline,
                "timed out waiting for: {what}"
            );
            self.clock.advance(Duration::from_millis(50));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Posts `body` to `/ingest/{source}` signed the way Sume signs, at `ts`.
    pub(crate) async fn post_signed_at(
        &self,
        source: &str,
        body: &[u8],
        ts: i64,
        secret: &str,
    ) -> Response {
        let mut req = self
            .client
            .post(self.url(&format!("/ingest/{source}")))
            .header("content-type", "application/json")
            .body(body.to_vec());
        for (name, value) in sign(Scheme::Sume, secret, ts, "", body) {
            req = req.header(name, value);
        }
        req.send().await.unwrap()
    }

    pub(crate) async fn ingest(&self, body: &[u8]) -> Response {
        self.post_signed_at("sume", body, self.now_s(), SECRET)
            .await
    }

    pub(crate) async fn ingest_ok(&self, body: &[u8]) -> Value {
        let res = self.ingest(body).await;
        assert_eq!(res.status(), StatusCode::OK);
        res.json().await.unwrap()
    }

    /// The source's events with `status`, from the operator API.
    pub(crate) async fn events(&self, status: &str) -> Vec<Value> {
        let res = self
            .request(
                Method::GET,
                &format!("/v1/sources/sume/events?status={status}"),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        let v: Value = res.json().await.unwrap();
        v["events"].as_array().unwrap().clone()
    }

    pub(crate) async fn event_ids(&self, status: &str) -> Vec<String> {
        self.events(status)
            .await
            .iter()
            .map(|e| e["event_id"].as_str().unwrap().to_owned())
            .collect()
    }
}

pub(crate) fn ids(received: &[crate::support::receiver::Received]) -> Vec<String> {
    received
        .iter()
        .map(|r| r.header("webhook-id").to_owned())
        .collect()
}

/// The ids of the receiver's successful deliveries, in order (each event's
/// last request is its successful one).
pub(crate) fn delivered_order(receiver: &Receiver) -> Vec<String> {
    let got = receiver.received();
    let mut order = Vec::new();
    for (i, r) in got.iter().enumerate() {
        let id = r.header("webhook-id").to_owned();
        if !got[i + 1..]
            .iter()
            .any(|later| later.header("webhook-id") == id)
        {
            order.push(id);
        }
    }
    order
}

/// A source `sw` with two destinations, `billing` and `audit`, that both
/// take every event (each keeps its copies in a lane of its own), and
/// forward the header `x-customer`.
pub(crate) fn fan_out(billing: &str, audit: &str) -> SourceSettings {
    toml::from_str(&format!(
        r#"
        scheme = "sume"
        secrets = ["{SECRET}"]
        event_id = "body:/request_id"
        created_at = "body:/created_at"
        destination_secret = "{DESTINATION}"
        forward_headers = ["content-type", "x-customer"]
        backoff_min = "10ms"
        backoff_max = "40ms"

        [[destinations]]
        name = "billing"
        forward_to = "{billing}"

        [[destinations]]
        name = "audit"
        forward_to = "{audit}"
        "#
    ))
    .unwrap()
}

/// An invoice event `id` for the customer `email`.
pub(crate) fn invoice(id: &str, email: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "request_id": id, "type": "invoice.paid", "email": email,
        "created_at": "2026-11-29T10:00:00Z",
    }))
    .unwrap()
}

/// Posts `body` to the source `sw`, signed, with `x-customer: customer`.
pub(crate) async fn post_with_customer(app: &TestApp, body: &[u8], customer: &str) {
    let ts = app.now_s();
    let mut req = app
        .client
        .post(app.url("/ingest/sw"))
        .header("content-type", "application/json")
        .header("x-customer", customer)
        .body(body.to_vec());
    for (name, value) in sign(Scheme::Sume, SECRET, ts, "", body) {
        req = req.header(name, value);
    }
    let res = req.send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
}
