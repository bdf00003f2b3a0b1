//! A data disk that fills up and frees again: with the real app and a
//! fault plan (503 with `Retry-After`, nothing changed, `/readyz` failing
//! meanwhile, recovery without a restart), and on a real tmpfs at the
//! free-space watermark.

use std::process::Command;
use std::process::Stdio;
use std::time::Duration;

use dedupd::store::redb::faults::FaultPlan;
use reqwest::StatusCode;
use serde_json::Value;
use serde_json::json;
use tempfile::TempDir;

use crate::resp::Raw;
use crate::resp::resp_addr;
use crate::resp::with_resp;
use crate::support::app::TestApp;
use crate::support::app::assert_problem;
use crate::support::app::spawn_faulty_app_with;
use crate::support::gateway::body;
use crate::support::gateway::ids;
use crate::support::gateway::settings;
use crate::support::process::serve_config;
use crate::support::process::sigterm;
use crate::support::process::wait;
use crate::support::receiver::Behaviour;
use crate::support::receiver::Receiver;
use crate::support::receiver::eventually;
/// Mounts a 24 MiB tmpfs on a new temp dir (root only); on drop, the
/// servers it was told of are killed (a failed assertion leaves them
/// running) and it is unmounted.
struct Tmpfs(TempDir, std::cell::RefCell<Vec<u32>>);

impl Tmpfs {
    fn mount() -> Self {
        let dir = TempDir::new().unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=24m", "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("mount");
        assert!(status.success(), "mounting a tmpfs needs root");
        Self(dir, Default::default())
    }

    /// Kills `child` on drop unless it has exited by then.
    fn holds(&self, child: &std::process::Child) {
        self.1.borrow_mut().push(child.id());
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        for pid in self.1.borrow().iter() {
            // Only if that pid is still a dedupd (not a reused one).
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if !String::from_utf8_lossy(&cmdline).contains("dedupd") {
                continue;
            }
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
        // The kernel releases a killed process's files a moment later.
        for _ in 0..50 {
            if Command::new("umount")
                .arg(self.0.path())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The drill of issue 29, on a real disk: the data on a 24 MiB tmpfs that
/// already holds 6 MiB of other files; 60 KB events ingested until the
/// answer is a 5xx, to a receiver that answers 503 (backoff an hour), with
/// the default settings otherwise. At the watermark writes are refused
/// (507) and everything else works: readiness says why, the listing and
/// `/metrics` answer. Once the other files go, writes resume by themselves;
/// a restart at the watermark opens and serves reads; nothing acknowledged
/// is lost. (Before the watermark, the log took the last bytes and nothing
/// could be checkpointed: after the space was freed writes stayed refused,
/// and a restart failed with "No space left on device".)
#[tokio::test]
#[ignore = "needs root to mount a tmpfs: .ci/run runs it"]
async fn a_real_disk_at_the_watermark_refuses_writes_serves_reads_and_recovers_by_itself() {
    use dedupd::gateway::signature::{Scheme, sign};

    use crate::support::receiver::{Behaviour, Receiver};

    let disk = Tmpfs::mount();
    let ballast = disk.0.path().join("ballast");
    std::fs::write(&ballast, vec![7u8; 6 * 1024 * 1024]).unwrap();
    let receiver = Receiver::start(Behaviour::Always(503)).await;
    let conf = TempDir::new().unwrap();
    let file = conf.path().join("drill.toml");
    std::fs::write(
        &file,
        format!(
            r#"
listen = "127.0.0.1:0"
data_path = "{}"
[sources.drill]
scheme = "sume"
secrets = ["drill-secret"]
event_id = "body:/request_id"
forward_to = "{}"
backoff_min = "1h"
backoff_max = "1h"
destination_secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
"#,
            disk.0.path().join("dedupd.redb").display(),
            receiver.url,
        ),
    )
    .unwrap();
    let client = crate::support::http::client();
    let post = |base: String, id: String| {
        let client = client.clone();
        async move {
            let body = serde_json::to_vec(&serde_json::json!({
                "request_id": id, "pad": "x".repeat(60 * 1024),
            }))
            .unwrap();
            let ts = i64::try_from(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_secs(),
            )
            .unwrap();
            let mut req = client
                .post(format!("{base}/ingest/drill"))
                .body(body.clone());
            for (k, v) in sign(Scheme::Sume, "drill-secret", ts, "", &body) {
                req = req.header(k, v);
            }
            let res = req.send().await.unwrap();
            (
                res.status().as_u16(),
                res.headers().get("retry-after").is_some(),
            )
        }
    };
    let get = |url: String| {
        let client = client.clone();
        async move {
            let res = client.get(url).send().await.unwrap();
            let status = res.status().as_u16();
            (status, res.text().await.unwrap())
        }
    };
    let listed = |base: String| async move {
        let mut ids = Vec::new();
        for status in ["pending", "dead"] {
            let (code, body) = get(format!(
                "{base}/v1/sources/drill/events?status={status}&limit=500"
            ))
            .await;
            assert_eq!(code, 200, "the listing is served: {body}");
            let v: Value = serde_json::from_str(&body).unwrap();
            for e in v["events"].as_array().unwrap() {
                ids.push(e["event_id"].as_str().unwrap().to_owned());
            }
        }
        ids
    };

    let (child, port, _drain) = serve_config(&file);
    disk.holds(&child);
    let base = format!("http://127.0.0.1:{port}");
    // Fill up to the watermark through the API.
    let mut acknowledged = Vec::new();
    let mut refused = None;
    for i in 0..1000 {
        match post(base.clone(), format!("ev{i}")).await {
            (200, _) => acknowledged.push(format!("ev{i}")),
            (status, retry_after) => {
                refused = Some((status, retry_after));
                break;
            }
        }
    }
    assert_eq!(
        refused,
        Some((507, true)),
        "refused with 507 and Retry-After"
    );
    let (status, body) = get(format!("{base}/readyz")).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("disk_low"), "readiness says why: {body}");
    let (status, metrics) = get(format!("{base}/metrics")).await;
    assert_eq!(status, 200);
    assert!(metrics.contains("dedupd_store_free_bytes"), "{metrics}");
    assert_eq!(listed(base.clone()).await.len(), acknowledged.len());

    // The other files go: writes resume by themselves.
    std::fs::remove_file(&ballast).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut n = 0;
    loop {
        let id = format!("after{n}");
        n += 1;
        match post(base.clone(), id.clone()).await {
            (200, _) => {
                acknowledged.push(id);
                break;
            }
            (507, _) => {}
            other => panic!("unexpected answer {other:?}"),
        }
        assert!(
            std::time::Instant::now() < deadline,
            "writes did not resume within 30 s of the space freeing"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(get(format!("{base}/readyz")).await.0, 200);

    // Up to the watermark again, then a restart there: it opens and serves
    // reads, with every acknowledged event.
    for i in 0..1000 {
        match post(base.clone(), format!("more{i}")).await {
            (200, _) => acknowledged.push(format!("more{i}")),
            (507, _) => break,
            other => panic!("unexpected answer {other:?}"),
        }
    }
    sigterm(&child);
    assert!(wait(child).success());
    let (child, port, _drain) = serve_config(&file);
    disk.holds(&child);
    let base = format!("http://127.0.0.1:{port}");
    let stored = listed(base.clone()).await;
    for id in &acknowledged {
        assert!(stored.contains(id), "{id} was acknowledged and is gone");
    }
    sigterm(&child);
    assert!(wait(child).success());
}

async fn ready(app: &TestApp) -> StatusCode {
    app.client
        .get(app.url("/readyz"))
        .send()
        .await
        .unwrap()
        .status()
}

#[tokio::test]
async fn a_full_disk_answers_503_with_retry_after_and_readyz_fails_until_it_frees() {
    let plan = FaultPlan::new();
    let app = spawn_faulty_app_with(|_| {}, plan.clone()).await;
    app.claim_ok("before", json!({ "ttl_ms": 86_400_000 }))
        .await;

    plan.set_full(true);
    let res = app.claim("during", json!({})).await;
    assert_eq!(
        res.headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap()),
        Some("1")
    );
    assert_problem(res, StatusCode::SERVICE_UNAVAILABLE, "store_unavailable").await;
    assert_eq!(ready(&app).await, StatusCode::SERVICE_UNAVAILABLE);

    plan.set_full(false);
    eventually("ready again without a restart", || async {
        ready(&app).await == StatusCode::OK
    })
    .await;
    // The refused claim changed nothing; the acknowledged one is there.
    assert_eq!(app.get("during").await.status(), StatusCode::NOT_FOUND);
    app.claim_ok("during", json!({})).await;
    let app = app.restart().await;
    assert_eq!(app.get("before").await.status(), StatusCode::OK);
    assert_eq!(app.get("during").await.status(), StatusCode::OK);
}

/// What a refused write tells each client: HTTP says only "retry later"
/// (the cause is logged), a Redis client reads the cause, in the words of
/// the releases before.
#[tokio::test]
async fn a_full_disk_refuses_http_without_its_cause_and_resp_with_it() {
    let plan = FaultPlan::new();
    let app = spawn_faulty_app_with(with_resp, plan.clone()).await;
    let mut c = Raw::connect(&resp_addr(&app)).await;
    assert_eq!(c.cmd("SET before v").await, b"+OK\r\n");

    plan.set_full(true);
    let res = app.claim("during", json!({})).await;
    let problem = assert_problem(res, StatusCode::SERVICE_UNAVAILABLE, "store_unavailable").await;
    assert_eq!(
        problem["detail"],
        "the store cannot be reached; retry later"
    );
    assert_eq!(
        crate::resp::show(&c.cmd("SET during v").await),
        "-ERR store unavailable: the data file cannot be written now (disk full or failing); \
         nothing was changed\\r\\n"
    );
}

#[tokio::test]
async fn a_delivery_acknowledged_while_the_disk_is_full_is_recorded_once_it_frees() {
    let plan = FaultPlan::new();
    let receiver = Receiver::start(Behaviour::Hold(None)).await;
    let s = settings(&receiver.url);
    let app = spawn_faulty_app_with(
        move |l| {
            l.settings.sources.insert("sume".into(), s);
        },
        plan.clone(),
    )
    .await;
    app.ingest_ok(&body("e1", "run_1", "2026-11-29T10:00:00Z"))
        .await;
    eventually("e1 is out", || async { receiver.held() == 1 }).await;

    // The disk fills while the application answers: the delivery cannot be
    // recorded, and new webhooks are refused with 503 (providers retry).
    plan.set_full(true);
    receiver.release();
    eventually("e1 answered", || async { receiver.held() == 0 }).await;
    let res = app
        .ingest(&body("e2", "run_1", "2026-11-29T10:05:00Z"))
        .await;
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(ready(&app).await, StatusCode::SERVICE_UNAVAILABLE);

    plan.set_full(false);
    eventually("e1 recorded as delivered", || async {
        ready(&app).await == StatusCode::OK && app.event_ids("delivered").await == ["e1"]
    })
    .await;
    app.ingest_ok(&body("e2", "run_1", "2026-11-29T10:05:00Z"))
        .await;
    app.retrying_until("e2 delivered", || async {
        app.event_ids("delivered").await.len() == 2
    })
    .await;
    assert_eq!(ids(&receiver.received()), ["e1", "e2"], "each sent once");
}
