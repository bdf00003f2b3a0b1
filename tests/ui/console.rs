//! The console's views, as an operator uses them.

use std::time::Duration;

use dedupd::clock::Clock;
use dedupd::config::sources::SourceSettings;
use dedupd::gateway::signature::{Scheme, sign};
use fantoccini::Locator;
use fantoccini::key::Key;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::browser::{Page, in_browser};
use crate::support::app::{TestApp, spawn_app_with, with_tokens};
use crate::support::receiver::{Behaviour, Receiver, eventually};

const SECRET: &str = "sume_test_secret";
const TOKEN: &str = "console-token-0123456789";

/// A Sume-signed source forwarding to `forward_to`.
fn source(forward_to: &str, max_attempts: u32) -> SourceSettings {
    toml::from_str(&format!(
        r#"
        scheme = "sume"
        event_id = "body:/request_id"
        created_at = "body:/created_at"
        stream = "body:/run_id"
        forward_to = "{forward_to}"
        max_attempts = {max_attempts}
        backoff_min = "10ms"
        backoff_max = "40ms"
        secrets = ["{SECRET}"]
        destination_secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
        "#
    ))
    .unwrap()
}

/// An event body; its `note` is markup, which the page must show as text.
fn body(id: &str, run: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "request_id": id, "run_id": run, "created_at": "2026-11-29T10:00:00Z",
        "type": "run.updated", "data": {"status": "succeeded", "cost_cents": 42},
        "note": "<img src=x id=injected>",
    }))
    .unwrap()
}

/// Posts a signed event to `/ingest/{source}`, asserting a 200.
async fn ingest(app: &TestApp, source: &str, id: &str, run: &str) {
    let b = body(id, run);
    let ts = i64::try_from(app.clock.now_ms() / 1000).unwrap();
    let mut req = app
        .client
        .post(app.url(&format!("/ingest/{source}")))
        .header("content-type", "application/json")
        .body(b.clone());
    for (name, value) in sign(Scheme::Sume, SECRET, ts, "", &b) {
        req = req.header(name, value);
    }
    assert_eq!(req.send().await.unwrap().status(), StatusCode::OK);
}

/// How many events `source` has with `status`, from the API.
async fn count(app: &TestApp, source: &str, status: &str) -> usize {
    let res = app
        .request(
            Method::GET,
            &format!("/v1/sources/{source}/events?status={status}"),
        )
        .send()
        .await
        .unwrap();
    let v: Value = res.json().await.unwrap();
    v["events"].as_array().map_or(0, Vec::len)
}

/// The overview cell of `source` for `status`.
fn cell(source: &str, status: &str) -> String {
    format!("tr[data-source=\"{source}\"] td[data-count=\"{status}\"]")
}

#[tokio::test]
async fn the_overview_shows_every_sources_counts_and_refreshes_itself() {
    let ok = Receiver::start(Behaviour::Accept).await;
    let down = Receiver::start(Behaviour::Always(503)).await;
    let held = Receiver::start(Behaviour::Hold(None)).await;
    let app = spawn_app_with(|l| {
        let s = &mut l.settings.sources;
        s.insert("sume".into(), source(&ok.url, 12));
        // Five failures in a row pause a source (pause_after = 5) for
        // backoff_min: long enough to still show after the clock moves.
        let mut billing = source(&down.url, 1);
        billing.backoff_min = Duration::from_secs(600);
        billing.backoff_max = Duration::from_secs(3600);
        s.insert("billing".into(), billing);
        s.insert("crm".into(), source(&held.url, 12));
    })
    .await;
    let url = app.url("/ui");
    in_browser(move |c| async move {
        c.goto(&url).await.unwrap();
        // Configured sources show before any event arrives.
        c.until_text(&cell("sume", "delivered"), "0", |t| t == "0")
            .await;
        assert!(
            !c.find(Locator::Id("login"))
                .await
                .unwrap()
                .is_displayed()
                .await
                .unwrap(),
            "no token configured: no prompt"
        );
        // The stylesheet applies under the Content-Security-Policy (the
        // script does too, or nothing above would show).
        let bar = c
            .execute(
                "return getComputedStyle(document.querySelector('.top')).backgroundColor;",
                vec![],
            )
            .await
            .unwrap();
        assert_eq!(bar, "rgb(15, 23, 42)");

        for i in 0..3 {
            ingest(&app, "sume", &format!("ord_{i}"), &format!("run_{i}")).await;
        }
        for i in 0..5 {
            ingest(&app, "billing", &format!("inv_{i}"), &format!("cust_{i}")).await;
        }
        // One stream: the first is held in flight, the second waits behind it.
        ingest(&app, "crm", "contact_1", "acct_1").await;
        ingest(&app, "crm", "contact_2", "acct_1").await;
        eventually("deliveries settle", || async {
            count(&app, "sume", "delivered").await == 3
                && count(&app, "billing", "dead").await == 5
                && held.held() == 1
        })
        .await;
        app.clock.advance(Duration::from_secs(95));

        // The page was not reloaded: it refreshes itself.
        c.until_text(&cell("sume", "delivered"), "3", |t| t == "3")
            .await;
        c.until_text(&cell("billing", "dead"), "5", |t| t == "5")
            .await;
        c.until_text(&cell("crm", "pending"), "2", |t| t == "2")
            .await;
        c.until_text("tr[data-source=\"crm\"] td[data-age]", "1 min", |t| {
            t == "1 min"
        })
        .await;
        for (source, pending, delivered, stale, dead) in [
            ("billing", "0", "0", "0", "5"),
            ("crm", "2", "0", "0", "0"),
            ("sume", "0", "3", "0", "0"),
        ] {
            for (status, want) in [
                ("pending", pending),
                ("delivered", delivered),
                ("stale", stale),
                ("dead", dead),
            ] {
                assert_eq!(
                    c.text_of(&cell(source, status)).await.as_deref(),
                    Some(want),
                    "{source} {status}"
                );
            }
        }
        let crm = c.text_of("tr[data-source=\"crm\"]").await.unwrap();
        assert!(crm.contains("running, 1/16 in flight"), "{crm}");
        let billing = c.text_of("tr[data-source=\"billing\"]").await.unwrap();
        assert!(
            billing.contains("paused until") && billing.contains("after 5 failures"),
            "{billing}"
        );
        let rows = c
            .find_all(Locator::Css("#overview tbody tr"))
            .await
            .unwrap();
        assert_eq!(rows.len(), 3);

        // The gateway guide's picture: the table without the empty page below it.
        c.set_window_size(1280, 540).await.unwrap();
        let png = c.screenshot().await.unwrap();
        save_screenshot(&png);

        // At a phone's width nothing but the table scrolls sideways.
        c.set_window_size(390, 844).await.unwrap();
        c.until_js(
            "document.documentElement.scrollWidth <= window.innerWidth",
            "no page-wide horizontal scroll at 390 px",
        )
        .await;
        held.release();
    })
    .await;
}

/// Keeps the overview's screenshot in the target dir; with
/// `DEDUPD_UPDATE_SCREENSHOT=1` also as `docs/console.png`, the gateway guide's picture.
/// What holds a source's deliveries back is on its row: a destination's
/// `Retry-After` until when, and a rate limit with no token left until
/// when (this instance's own, on the local inbox; the fleet's on the
/// shared one, marked so).
#[tokio::test]
async fn the_overview_shows_a_retry_after_hold_and_a_rate_limit_until_when() {
    let busy = Receiver::start(Behaviour::RetryAfter {
        status: 429,
        value: "600",
        times: 1,
    })
    .await;
    let ok = Receiver::start(Behaviour::Accept).await;
    let app = spawn_app_with(|l| {
        let s = &mut l.settings.sources;
        let mut held = source(&busy.url, 12);
        held.backoff_max = Duration::from_secs(3600);
        s.insert("held".into(), held);
        let mut slow = source(&ok.url, 12);
        slow.rate_limit = Some("1/m".parse().unwrap());
        slow.rate_burst = Some(1);
        s.insert("slow".into(), slow);
    })
    .await;
    ingest(&app, "held", "h_1", "run_h").await;
    // The bucket starts empty: the first token comes in a minute.
    ingest(&app, "slow", "s_1", "run_s").await;
    eventually("the 429 answered", || async { busy.received().len() == 1 }).await;
    let url = app.url("/ui");
    in_browser(move |c| async move {
        c.goto(&url).await.unwrap();
        c.until_text(
            "tr[data-source=\"held\"] [data-held-by]",
            "held by Retry-After",
            |t| t.starts_with("held by Retry-After until"),
        )
        .await;
        c.until_text(
            "tr[data-source=\"slow\"] [data-held-by]",
            "rate-limited",
            |t| t.starts_with("rate-limited until") && t.contains("0/16 in flight"),
        )
        .await;
        assert!(
            c.find(Locator::Id("store-state")).await.is_err(),
            "the store is ready"
        );
    })
    .await;
    let v: Value = app
        .request(Method::GET, "/v1/sources/held")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let d = &v["delivery"];
    assert_eq!(
        (d["scope"].as_str(), d["held_by"].as_str()),
        (Some("instance"), Some("retry_after"))
    );
    assert_eq!(d["held_until_ms"], d["retry_after_until_ms"]);
    let v: Value = app
        .request(Method::GET, "/v1/sources/slow")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["delivery"]["held_by"], "rate_limit");
    assert!(v["delivery"]["rate_limited_until_ms"].as_u64().unwrap() > app.clock.now_ms());
}

fn save_screenshot(png: &[u8]) {
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    let tmp = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("console.png");
    std::fs::write(&tmp, png).unwrap();
    if std::env::var_os("DEDUPD_UPDATE_SCREENSHOT").is_some() {
        let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs");
        std::fs::create_dir_all(&docs).unwrap();
        std::fs::write(docs.join("console.png"), png).unwrap();
    }
}

#[tokio::test]
async fn the_dead_list_shows_the_failing_event_and_redeliver_brings_it_through() {
    let down = Receiver::start(Behaviour::Always(503)).await;
    let app = spawn_app_with(|l| {
        l.settings
            .sources
            .insert("billing".into(), source(&down.url, 1));
    })
    .await;
    ingest(&app, "billing", "inv_1", "cust_1").await;
    eventually("inv_1 dead", || async {
        count(&app, "billing", "dead").await == 1
    })
    .await;
    let url = app.url("/ui");
    in_browser(move |c| async move {
        c.goto(&url).await.unwrap();
        // From the overview's dead count to the dead list.
        c.until_text(&cell("billing", "dead"), "1", |t| t == "1")
            .await;
        c.find(Locator::Css(&format!("{} a", cell("billing", "dead"))))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        let row = "tr[data-event=\"inv_1\"]";
        let text = c
            .until_text(row, "inv_1 and its error", |t| {
                t.contains("inv_1") && t.contains("HTTP 503")
            })
            .await;
        assert!(text.contains("cust_1"), "stream shown: {text}");
        c.find(Locator::Css(&format!("{row} a")))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();

        // The detail: status, error, headers, the body pretty-printed.
        c.until_text("#event-status", "dead", |t| t == "dead").await;
        let error = c.text_of("#event-error").await.unwrap();
        assert!(error.contains("HTTP 503"), "{error}");
        let headers = c.text_of("#headers").await.unwrap();
        assert!(headers.contains("content-type") && headers.contains("application/json"));
        // Its attempts: the one request, its status and its error.
        let timeline = c.text_of("#timeline tbody").await.unwrap();
        assert_eq!(timeline.lines().count(), 1, "{timeline}");
        assert!(
            timeline.contains("503") && timeline.contains("HTTP 503") && timeline.contains(" ms"),
            "{timeline}"
        );
        let body = c.text_of("#body").await.unwrap();
        assert!(
            body.contains("\"request_id\": \"inv_1\""),
            "pretty JSON: {body}"
        );
        assert!(body.contains("\n  \"data\": {\n"), "indented: {body}");
        // Untrusted bodies are text, never markup.
        assert!(body.contains("<img src=x id=injected>"), "{body}");
        assert!(
            c.find(Locator::Id("injected")).await.is_err(),
            "no element made from the body"
        );

        // Redeliver, confirmed from the keyboard; the receiver now holds the
        // request, so the event is seen pending, then delivered on release.
        down.set(Behaviour::Hold(None));
        c.find(Locator::Id("redeliver"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        let confirm = c.element("#redeliver-confirm").await;
        c.until_js(
            "document.activeElement && document.activeElement.id === 'redeliver-confirm'",
            "the confirmation has the focus",
        )
        .await;
        confirm.send_keys(&Key::Enter.to_string()).await.unwrap();
        c.until_text("#actions", "the new status", |t| {
            t.contains("Redelivered: the event is pending again.")
        })
        .await;
        c.until_text("#event-status", "pending", |t| t == "pending")
            .await;
        eventually("the redelivery reaches the receiver", || async {
            down.held() == 1
        })
        .await;
        assert_eq!(c.text_of("#event-status").await.as_deref(), Some("pending"));
        down.release();
        c.until_text("#event-status", "delivered", |t| t == "delivered")
            .await;
        // Newest first: the delivery, then the failure.
        let timeline = c.text_of("#timeline tbody").await.unwrap();
        let rows: Vec<&str> = timeline.lines().collect();
        assert_eq!(rows.len(), 2, "{timeline}");
        assert!(
            rows[0].contains("204") && !rows[0].contains("HTTP"),
            "{timeline}"
        );
        assert!(rows[1].contains("HTTP 503"), "{timeline}");
        assert!(
            c.find(Locator::Id("redeliver")).await.is_err(),
            "no button once delivered"
        );
        assert_eq!(count(&app, "billing", "delivered").await, 1);
        assert_eq!(down.received().len(), 2, "one failed attempt, one delivery");
    })
    .await;
}

#[tokio::test]
async fn with_tokens_the_page_shows_nothing_until_it_gets_one_and_says_when_one_is_refused() {
    let ok = Receiver::start(Behaviour::Accept).await;
    let app = spawn_app_with(|l| {
        with_tokens(l, &[TOKEN]);
        l.settings
            .sources
            .insert("secretsource".into(), source(&ok.url, 12));
    })
    .await;
    ingest(&app, "secretsource", "ev_1", "run_1").await;
    let url = app.url("/ui");
    in_browser(move |c| async move {
        c.goto(&url).await.unwrap();
        let login = c.element("#login").await;
        c.until_js(
            "!document.getElementById('login').hidden",
            "the token prompt",
        )
        .await;
        let page = c.text_of("body").await.unwrap();
        assert!(!page.contains("secretsource"), "nothing shown: {page}");
        assert_eq!(c.text_of("#view").await.as_deref(), Some(""));

        // A wrong token: refused, said so, still nothing shown.
        let input = c.find(Locator::Id("token")).await.unwrap();
        input.send_keys("not-the-right-token").await.unwrap();
        input.send_keys(&Key::Enter.to_string()).await.unwrap();
        c.until_text("#login-error", "a refusal", |t| t.contains("refused"))
            .await;
        assert!(login.is_displayed().await.unwrap());
        let page = c.text_of("body").await.unwrap();
        assert!(!page.contains("secretsource"), "nothing shown: {page}");

        // The right one: the overview, and the token kept for this tab.
        let input = c.find(Locator::Id("token")).await.unwrap();
        input.send_keys(TOKEN).await.unwrap();
        c.find(Locator::Css("#login-form button"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        c.until_text(&cell("secretsource", "delivered"), "1", |t| t == "1")
            .await;
        assert!(!login.is_displayed().await.unwrap());
        let kept = c
            .execute("return sessionStorage.getItem('dedupd.token');", vec![])
            .await
            .unwrap();
        assert_eq!(kept, TOKEN);
        // A reload keeps working without asking again.
        c.refresh().await.unwrap();
        c.until_text(&cell("secretsource", "delivered"), "1", |t| t == "1")
            .await;

        // Forgetting it hides everything again.
        c.find(Locator::Id("forget"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        c.until_js(
            "!document.getElementById('login').hidden",
            "the token prompt again",
        )
        .await;
        assert_eq!(c.text_of("#view").await.as_deref(), Some(""));
    })
    .await;
}

#[tokio::test]
async fn without_sources_the_overview_says_what_to_do_and_lookups_show_a_claim_and_a_head() {
    let app = spawn_app_with(|_| {}).await;
    let (_, fence, _) = app.claim_ok("order/42", json!({})).await;
    app.apply_ok("run-7", "evt_9", "2026-11-29T10:05:00Z").await;
    let overview = app.url("/ui");
    let url = app.url("/ui#/lookups");
    in_browser(move |c| async move {
        // No source configured: the overview says what to do.
        c.goto(&overview).await.unwrap();
        c.until_text(".empty", "the empty state", |t| {
            t.starts_with("No sources configured: add a [sources.NAME] table to dedupd.toml")
        })
        .await;
        c.goto(&url).await.unwrap();
        let key = c.element("#claim-key").await;
        key.send_keys("order/42").await.unwrap();
        key.send_keys(&Key::Enter.to_string()).await.unwrap();
        let claim = c
            .until_text("#claim-result", "the claim", |t| t.contains("processing"))
            .await;
        assert!(claim.contains(&fence.to_string()), "{claim}");
        let key = c.find(Locator::Id("claim-key")).await.unwrap();
        key.clear().await.unwrap();
        key.send_keys("nobody").await.unwrap();
        key.send_keys(&Key::Enter.to_string()).await.unwrap();
        c.until_text("#claim-result", "no claim", |t| {
            t.contains("No live claim for nobody")
        })
        .await;

        let stream = c.find(Locator::Id("stream-name")).await.unwrap();
        stream.send_keys("run-7").await.unwrap();
        stream.send_keys(&Key::Enter.to_string()).await.unwrap();
        c.until_text("#stream-result", "the head", |t| t.contains("evt_9"))
            .await;
        // Times carry their UTC value on hover.
        let title = c
            .find(Locator::Css("#stream-result time"))
            .await
            .unwrap()
            .attr("title")
            .await
            .unwrap();
        assert_eq!(title.as_deref(), Some("2026-11-29 10:05:00 UTC"));
    })
    .await;
}

/// `GET /v1/jobs`'s list.
async fn jobs(app: &TestApp) -> Vec<Value> {
    let v: Value = app
        .request(Method::GET, "/v1/jobs")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["jobs"].as_array().unwrap().clone()
}

/// The replays `receiver` got: (the body's `request_id`, `dedupd-replay`).
fn replays(receiver: &Receiver) -> Vec<(String, String)> {
    let mut got: Vec<(String, String)> = receiver
        .received()
        .iter()
        .filter(|r| !r.header("dedupd-replay").is_empty())
        .map(|r| {
            let b: Value = serde_json::from_slice(&r.body).unwrap();
            (
                b["request_id"].as_str().unwrap().to_owned(),
                r.header("dedupd-replay").to_owned(),
            )
        })
        .collect();
    got.sort();
    got
}

/// Sets a `datetime-local` input to the instant `rfc3339` (in the browser's
/// time zone, as an operator would pick it), as if typed.
async fn set_instant(c: &fantoccini::Client, css: &str, rfc3339: &str) {
    c.execute(
        "const el = document.querySelector(arguments[0]);
         const d = new Date(arguments[1]);
         el.value = new Date(d.getTime() - d.getTimezoneOffset() * 60000).toISOString().slice(0, 19);
         el.dispatchEvent(new Event('input', { bubbles: true }));",
        vec![json!(css), json!(rfc3339)],
    )
    .await
    .unwrap();
}

/// Clicks the element `css` (waiting for it).
async fn click(c: &fantoccini::Client, css: &str) {
    c.element(css).await.click().await.unwrap();
}

/// Types `text` into the input `css` after clearing it.
async fn fill(c: &fantoccini::Client, css: &str, text: &str) {
    let input = c.element(css).await;
    input.clear().await.unwrap();
    if !text.is_empty() {
        input.send_keys(text).await.unwrap();
    }
}

#[tokio::test]
async fn the_bulk_form_counts_then_a_confirmed_redeliver_runs_to_done_in_the_jobs_panel() {
    let ok = Receiver::start(Behaviour::Accept).await;
    let app = spawn_app_with(|l| {
        l.settings
            .sources
            .insert("sume".into(), source(&ok.url, 12));
    })
    .await;
    for (id, run) in [
        ("ord_1", "run_a"),
        ("ord_2", "run_b"),
        ("ord_3", "run_a"),
        ("ord_4", "run_b"),
    ] {
        ingest(&app, "sume", id, run).await;
    }
    eventually("every event delivered", || async {
        count(&app, "sume", "delivered").await == 4
    })
    .await;
    let url = app.url("/ui#/sources/sume/events?status=delivered");
    in_browser(move |c| async move {
        c.goto(&url).await.unwrap();
        c.until_text("tr[data-event=\"ord_4\"]", "the list", |t| {
            t.contains("ord_4")
        })
        .await;
        click(&c, "#bulk-link").await;
        // The list's status is the form's.
        let status = c.element("#bulk-status").await;
        assert_eq!(
            status.prop("value").await.unwrap().as_deref(),
            Some("delivered")
        );
        fill(&c, "#bulk-since", "1").await;
        fill(&c, "#bulk-stream", "run_a").await;
        fill(&c, "#bulk-field", "/type").await;
        fill(&c, "#bulk-value", "run.updated").await;
        // A created_at range that ends before the events: nothing to confirm.
        set_instant(&c, "#bulk-created-from", "2026-11-29T09:59:00Z").await;
        set_instant(&c, "#bulk-created-to", "2026-11-29T09:59:30Z").await;
        click(&c, "#bulk-count").await;
        c.until_text("#bulk-count-text", "no match", |t| t == "No events match.")
            .await;
        assert!(c.find(Locator::Id("bulk-confirm")).await.is_err());
        // One that holds them.
        set_instant(&c, "#bulk-created-to", "2026-11-29T10:01:00Z").await;
        assert!(
            c.text_of("#bulk-stale").await.is_some(),
            "a changed form asks for a new count"
        );
        click(&c, "#bulk-count").await;
        let said = c
            .until_text("#bulk-count-text", "the count", |t| {
                t.starts_with("2 events match")
            })
            .await;
        assert_eq!(said, "2 events match (first ids: ord_1, ord_3).");
        let filter = c.text_of("#bulk-filter").await.unwrap();
        assert!(
            filter.contains("status delivered")
                && filter.contains("stream run_a")
                && filter.contains("body /type = run.updated"),
            "{filter}"
        );
        // The count started nothing.
        assert!(jobs(&app).await.is_empty());
        assert!(replays(&ok).is_empty());

        let confirm = c.element("#bulk-confirm").await;
        assert_eq!(confirm.text().await.unwrap(), "Redeliver 2 events");
        confirm.click().await.unwrap();
        let started = c
            .until_text("#bulk-started", "the job started", |t| {
                t.starts_with("Started job_")
            })
            .await;
        // The source's jobs below the form: this one, live, until done.
        let row = c.element("#jobs tr[data-job]").await;
        let id = row.attr("data-job").await.unwrap().unwrap();
        assert!(started.contains(&id), "{started}");
        c.until_text("#jobs td[data-state]", "done", |t| t == "done")
            .await;
        let progress = c.text_of("#jobs td[data-progress]").await.unwrap();
        assert_eq!(
            progress,
            "2 matched: 2 delivered, 0 failed, 0 in flight, 0 skipped; 4 read"
        );
        // The receiver got the two replays, each naming the job.
        assert_eq!(
            replays(&ok),
            [
                ("ord_1".to_owned(), id.clone()),
                ("ord_3".to_owned(), id.clone())
            ]
        );
        // The job held the filter counted, its receive range pinned to the
        // count (the app's clock stands still); ended, it keeps the
        // filter's shape and times, not its texts.
        let listed = jobs(&app).await;
        assert_eq!(listed.len(), 1);
        let f = &listed[0]["filter"];
        let now = app.clock.now_ms();
        assert_eq!(f["status"], "delivered", "{f}");
        let dropped = json!("(dropped when the job ended)");
        assert_eq!(f["stream"], dropped, "{f}");
        assert_eq!(
            (&f["field"], &f["value"]),
            (&json!("/type"), &dropped),
            "{f}"
        );
        assert_eq!(f["received_from"], json!(now - 3_600_000), "{f}");
        assert_eq!(f["received_to"], json!(now + 1), "{f}");
        assert_eq!(f["created_from"], "2026-11-29T09:59:00Z", "{f}");

        // The Jobs page lists it too, with its source.
        c.find(Locator::Css("a[data-nav=\"jobs\"]"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        let listed = c
            .until_text(&format!("#jobs tr[data-job=\"{id}\"]"), "the job", |t| {
                t.contains("sume") && t.contains("done")
            })
            .await;
        assert!(listed.contains("redeliver"), "{listed}");
    })
    .await;
}

#[tokio::test]
async fn a_running_job_shows_its_progress_live_and_cancel_in_the_jobs_panel_stops_it() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let app = spawn_app_with(|l| {
        let mut s = source(&receiver.url, 12);
        s.max_in_flight = 4;
        l.settings.sources.insert("sume".into(), s);
    })
    .await;
    for i in 0..6 {
        ingest(&app, "sume", &format!("e{i}"), &format!("run_{i}")).await;
    }
    eventually("every event delivered", || async {
        count(&app, "sume", "delivered").await == 6
    })
    .await;
    // The destination hangs: the job's window (half of 4) stays in flight.
    receiver.set(Behaviour::Hold(None));
    let res = app
        .request(Method::POST, "/v1/sources/sume/jobs")
        .json(&json!({ "kind": "redeliver", "filter": { "status": "delivered" } }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let id = res.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    eventually("two replays held", || async { receiver.held() == 2 }).await;
    let url = app.url("/ui#/jobs");
    in_browser(move |c| async move {
        c.goto(&url).await.unwrap();
        let row = format!("#jobs tr[data-job=\"{id}\"]");
        c.until_text(&format!("{row} td[data-progress]"), "two in flight", |t| {
            t.starts_with("2 matched: 0 delivered, 0 failed, 2 in flight")
        })
        .await;
        assert_eq!(
            c.text_of(&format!("{row} td[data-state]")).await.as_deref(),
            Some("running")
        );
        click(&c, &format!("{row} button[data-cancel=\"{id}\"]")).await;
        // Cancelled: it queues nothing more, and ends once the two settle.
        c.until_text(&format!("{row} td[data-state]"), "cancelling", |t| {
            t == "cancelling"
        })
        .await;
        assert!(
            c.find(Locator::Css(&format!("{row} button[data-cancel]")))
                .await
                .is_err(),
            "no Cancel once cancelled"
        );
        let j = &jobs(&app).await[0];
        assert_eq!(
            (&j["state"], &j["cancelled"]),
            (&json!("running"), &json!(true))
        );
        receiver.release();
        // The page still polls: it sees the end without a reload.
        c.until_text(&format!("{row} td[data-state]"), "cancelled", |t| {
            t == "cancelled"
        })
        .await;
        let progress = c
            .text_of(&format!("{row} td[data-progress]"))
            .await
            .unwrap();
        assert!(
            progress.starts_with("2 matched: 2 delivered, 0 failed, 0 in flight"),
            "{progress}"
        );
        assert_eq!(
            replays(&receiver).len(),
            2,
            "nothing queued after the cancel"
        );
    })
    .await;
}

#[tokio::test]
async fn erase_on_an_events_view_asks_first_then_it_shows_and_lists_as_erased() {
    let ok = Receiver::start(Behaviour::Accept).await;
    let app = spawn_app_with(|l| {
        l.settings
            .sources
            .insert("sume".into(), source(&ok.url, 12));
    })
    .await;
    ingest(&app, "sume", "ev_1", "run_1").await;
    ingest(&app, "sume", "ev_2", "run_2").await;
    eventually("both delivered", || async {
        count(&app, "sume", "delivered").await == 2
    })
    .await;
    let url = app.url("/ui#/sources/sume/events/ev_1");
    let overview = app.url("/ui");
    in_browser(move |c| async move {
        c.goto(&url).await.unwrap();
        c.until_text("#event-status", "delivered", |t| t == "delivered")
            .await;
        // Asked first, with the safe answer focused; "Keep it" keeps it.
        click(&c, "#erase").await;
        let text = c.text_of("#erase-text").await.unwrap();
        assert!(text.contains("cannot be undone"), "{text}");
        c.until_js(
            "document.activeElement && document.activeElement.id === 'erase-cancel'",
            "Keep it has the focus",
        )
        .await;
        click(&c, "#erase-cancel").await;
        c.element("#erase").await;
        assert!(
            c.text_of("#body")
                .await
                .unwrap()
                .contains("\"request_id\": \"ev_1\"")
        );

        click(&c, "#erase").await;
        click(&c, "#erase-confirm").await;
        c.until_text("#erase-done", "erased", |t| t.starts_with("Erased"))
            .await;
        assert_eq!(c.text_of("#event-status").await.as_deref(), Some("erased"));
        assert!(c.find(Locator::Id("body")).await.is_err(), "no body shown");
        assert!(
            c.find(Locator::Id("headers")).await.is_err(),
            "no headers shown"
        );
        assert!(c.text_of("#body-erased").await.is_some());
        assert!(
            c.find(Locator::Id("erase")).await.is_err(),
            "nothing to erase again"
        );
        assert!(c.find(Locator::Id("redeliver")).await.is_err());
        let e: Value = app
            .request(Method::GET, "/v1/sources/sume/events/ev_1")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(
            (&e["status"], &e["body"]),
            (&json!("erased"), &json!("")),
            "{e}"
        );

        // Its source's erased list, from the crumbs.
        c.find(Locator::Css(".crumbs a[href*=\"status=erased\"]"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        c.until_text("tr[data-event=\"ev_1\"]", "ev_1 listed", |t| {
            t.contains("ev_1")
        })
        .await;
        assert_eq!(
            c.text_of(".tabs a[aria-current=\"page\"]").await.as_deref(),
            Some("erased")
        );
        assert!(
            c.find(Locator::Css("tr[data-event=\"ev_2\"]"))
                .await
                .is_err()
        );
        // The overview counts it.
        c.goto(&overview).await.unwrap();
        c.until_text(&cell("sume", "erased"), "1", |t| t == "1")
            .await;
        assert_eq!(
            c.text_of(&cell("sume", "delivered")).await.as_deref(),
            Some("1")
        );
    })
    .await;
}

/// A count stops at the server's scan budget (here one body per answer)
/// and hands back a cursor: the form follows it to the end, so the number
/// to type for an erasure is every match, not the first answer's.
#[tokio::test]
async fn the_bulk_form_adds_up_a_count_the_budget_cut_into_several_answers() {
    let down = Receiver::start(Behaviour::Always(503)).await;
    let app = spawn_app_with(|l| {
        l.settings.gateway.scan_bytes = 1;
        l.settings
            .sources
            .insert("billing".into(), source(&down.url, 1));
    })
    .await;
    for i in 1..=3 {
        ingest(&app, "billing", &format!("inv_{i}"), &format!("cust_{i}")).await;
    }
    eventually("three dead", || async {
        count(&app, "billing", "dead").await == 3
    })
    .await;
    let url = app.url("/ui#/sources/billing/bulk?status=dead");
    in_browser(move |c| async move {
        c.goto(&url).await.unwrap();
        c.element("#bulk-kind")
            .await
            .select_by_value("erase")
            .await
            .unwrap();
        fill(&c, "#bulk-field", "/request_id").await;
        fill(&c, "#bulk-value", "inv_2").await;
        click(&c, "#bulk-count").await;
        c.until_text("#bulk-count-text", "the count", |t| {
            t == "1 event matches (first ids: inv_2)."
        })
        .await;
        let filter = c.text_of("#bulk-filter").await.unwrap();
        assert!(filter.ends_with("3 dead events read."), "{filter}");
        assert!(jobs(&app).await.is_empty());
    })
    .await;
}

#[tokio::test]
async fn counting_starts_nothing_and_a_bulk_erase_waits_for_the_count_typed() {
    let down = Receiver::start(Behaviour::Always(503)).await;
    let app = spawn_app_with(|l| {
        l.settings
            .sources
            .insert("billing".into(), source(&down.url, 1));
    })
    .await;
    for i in 1..=3 {
        ingest(&app, "billing", &format!("inv_{i}"), &format!("cust_{i}")).await;
    }
    eventually("three dead", || async {
        count(&app, "billing", "dead").await == 3
    })
    .await;
    let url = app.url("/ui#/sources/billing/bulk?status=dead");
    in_browser(move |c| async move {
        c.goto(&url).await.unwrap();
        c.element("#bulk-kind")
            .await
            .select_by_value("erase")
            .await
            .unwrap();
        let status = c.find(Locator::Id("bulk-status")).await.unwrap();
        assert_eq!(status.prop("value").await.unwrap().as_deref(), Some("dead"));
        click(&c, "#bulk-count").await;
        c.until_text("#bulk-count-text", "the count", |t| {
            t == "3 events match (first ids: inv_1, inv_2, inv_3)."
        })
        .await;
        let warning = c.text_of("#bulk-erase-text").await.unwrap();
        assert!(warning.contains("cannot be undone"), "{warning}");
        // Counting changed nothing.
        assert!(jobs(&app).await.is_empty());
        assert_eq!(count(&app, "billing", "dead").await, 3);

        // The confirmation waits for the count, typed.
        let confirm = c.element("#bulk-confirm").await;
        assert_eq!(confirm.text().await.unwrap(), "Erase 3 events");
        assert!(!confirm.is_enabled().await.unwrap());
        c.until_js(
            "document.activeElement && document.activeElement.id === 'bulk-erase-check'",
            "the check has the focus",
        )
        .await;
        fill(&c, "#bulk-erase-check", "2").await;
        assert!(!confirm.is_enabled().await.unwrap());
        confirm.click().await.unwrap();
        // A changed filter takes the confirmation away.
        fill(&c, "#bulk-stream", "cust_2").await;
        c.element("#bulk-stale").await;
        assert!(c.find(Locator::Id("bulk-confirm")).await.is_err());
        click(&c, "#bulk-count").await;
        c.until_text("#bulk-count-text", "one", |t| {
            t == "1 event matches (first ids: inv_2)."
        })
        .await;
        assert!(jobs(&app).await.is_empty(), "still nothing started");
        assert_eq!(count(&app, "billing", "dead").await, 3);

        fill(&c, "#bulk-erase-check", "1").await;
        let confirm = c.find(Locator::Id("bulk-confirm")).await.unwrap();
        assert_eq!(confirm.text().await.unwrap(), "Erase 1 event");
        assert!(confirm.is_enabled().await.unwrap());
        confirm.click().await.unwrap();
        c.until_text("#jobs td[data-state]", "done", |t| t == "done")
            .await;
        assert_eq!(
            c.text_of("#jobs td[data-progress]").await.as_deref(),
            Some("1 matched: 1 erased, 0 skipped; 3 read")
        );
        assert_eq!(count(&app, "billing", "dead").await, 2);
        assert_eq!(count(&app, "billing", "erased").await, 1);
        let listed = jobs(&app).await;
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0]["kind"], "erase");

        // At a phone's width the form and the jobs fit (the table scrolls).
        c.set_window_size(390, 844).await.unwrap();
        c.until_js(
            "document.documentElement.scrollWidth <= window.innerWidth",
            "no page-wide horizontal scroll at 390 px",
        )
        .await;
    })
    .await;
}

/// With traces on, the event's page shows on each attempt the id of the
/// event's one trace (what to paste into the tracing backend). Traces are
/// turned on for this test binary here, exporting to a closed port: the
/// spans are dropped, the ids are what the page shows.
#[tokio::test]
async fn with_traces_on_each_attempt_shows_the_events_trace_id() {
    static TRACES: std::sync::Once = std::sync::Once::new();
    TRACES.call_once(|| {
        let export = dedupd::config::telemetry::TraceExport {
            endpoint: "http://127.0.0.1:9/v1/traces".into(),
            service_name: "dedupd-ui-test".into(),
            sample_ratio: 1.0,
            queue: 64,
            resource: Vec::new(),
        };
        dedupd::telemetry::traces::install(&export).unwrap();
    });
    assert!(
        dedupd::telemetry::traces::on(),
        "traces are on in this test binary"
    );
    let flaky = Receiver::start(Behaviour::FailTimes(1)).await;
    let app = spawn_app_with(|l| {
        l.settings
            .sources
            .insert("traced".into(), source(&flaky.url, 5));
    })
    .await;
    ingest(&app, "traced", "evt_traced", "run_t").await;
    eventually("evt_traced delivered on its second attempt", || async {
        // Its retry comes due on the app's clock.
        app.clock.advance(Duration::from_millis(100));
        count(&app, "traced", "delivered").await == 1
    })
    .await;
    let shown: Value = app
        .client
        .get(app.url("/v1/sources/traced/events/evt_traced"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let trace = shown["trace_id"].as_str().expect("a trace id").to_owned();
    assert_eq!(trace.len(), 32, "{shown}");
    let url = app.url("/ui#/sources/traced/events/evt_traced");
    in_browser(move |c| async move {
        c.goto(&url).await.unwrap();
        c.until_text("#event-status", "delivered", |t| t == "delivered")
            .await;
        let timeline = c.text_of("#timeline tbody").await.unwrap();
        let rows: Vec<&str> = timeline.lines().collect();
        assert_eq!(rows.len(), 2, "{timeline}");
        assert!(
            rows.iter().all(|r| r.contains(&trace)),
            "each attempt shows the trace {trace}: {timeline}"
        );
        let head = c.text_of("#timeline thead").await.unwrap();
        assert!(head.to_lowercase().contains("trace"), "{head}");
    })
    .await;
}
