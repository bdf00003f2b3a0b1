//! Backup and restore of a running instance (issue 51): `dedupd backup`
//! through the API while claims, applies and webhooks keep coming, then
//! `dedupd restore` and a fresh instance on what it put in place. Every
//! write acknowledged before the backup began is there; every one after
//! is absent or whole; claims keep their fences and tokens, fences go on
//! above every fence either instance handed out, the inbox and its dedupe
//! hold, stream heads stand where they stood. And the CLI's refusals, and
//! a stop that does not wait for a backup whose client reads nothing.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dedupd::gateway::delivery::Coordination;
use dedupd::store::keyspace::{KvRequest, SetCondition, SetExpiry};
use dedupd::store::redb::backup::verify::verify_backup;
use dedupd::store::redb::{Keyspace, RedbOptions, RedbStore};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::support::app::{
    TestApp, assert_problem, spawn_over_file, start, test_settings, with_read_tokens, with_tokens,
};
use crate::support::gateway::{body, settings};
use crate::support::process::{dedupd, serve, serve_config, sigterm};
use crate::support::receiver::{Behaviour, Receiver};

const FULL: &str = "backup-full-token-0123456789";
const READ: &str = "backup-read-token-0123456789";

/// One write and when it was acknowledged.
#[derive(Debug, Clone)]
struct Acked {
    /// Its answer came before the backup was asked for.
    before: bool,
    what: Write,
}

#[derive(Debug, Clone)]
enum Write {
    Claim {
        key: String,
        token: String,
        fence: u64,
    },
    Done {
        key: String,
    },
    Ingest {
        id: String,
        body: Vec<u8>,
    },
    Apply {
        stream: String,
        event: String,
        created_at: String,
    },
}

/// Where the load writes what it got.
#[derive(Debug, Default)]
struct Log {
    acked: Mutex<Vec<Acked>>,
    /// Set just before the backup is asked for.
    began: AtomicBool,
    stop: AtomicBool,
    count: AtomicUsize,
}

impl Log {
    fn push(&self, what: Write) {
        // Read after the answer came: `before` only if it came before the
        // backup was asked for.
        let before = !self.began.load(Ordering::SeqCst);
        self.acked.lock().unwrap().push(Acked { before, what });
        self.count.fetch_add(1, Ordering::SeqCst);
    }
}

async fn claims_load(app: Arc<TestApp>, log: Arc<Log>, worker: usize) {
    let mut i = 0;
    while !log.stop.load(Ordering::SeqCst) {
        let key = format!("c{worker}-{i}");
        i += 1;
        let res = app.claim(&key, json!({ "ttl_ms": 3_600_000 })).await;
        assert_eq!(res.status(), StatusCode::CREATED, "{key}");
        let v: Value = res.json().await.unwrap();
        let token = v["token"].as_str().unwrap().to_owned();
        log.push(Write::Claim {
            key: key.clone(),
            token: token.clone(),
            fence: v["fence"].as_u64().unwrap(),
        });
        if i % 2 == 0 {
            let res = app.done(&key, json!({ "token": token })).await;
            assert_eq!(res.status(), StatusCode::OK, "{key}");
            log.push(Write::Done { key });
        }
    }
}

async fn ingest_load(app: Arc<TestApp>, log: Arc<Log>, worker: usize) {
    let mut i = 0;
    while !log.stop.load(Ordering::SeqCst) {
        let id = format!("d{worker}-{i}");
        let created = format!("2026-11-29T10:{:02}:{:02}Z", (i / 60) % 60, i % 60);
        i += 1;
        let b = body(&id, &format!("run-{worker}"), &created);
        let v = app.ingest_ok(&b).await;
        assert_eq!(v["status"], "accepted", "{id}: {v}");
        log.push(Write::Ingest { id, body: b });
    }
}

async fn apply_load(app: Arc<TestApp>, log: Arc<Log>, worker: usize) {
    let mut i = 0u32;
    while !log.stop.load(Ordering::SeqCst) {
        let stream = format!("s{worker}");
        let event = format!("a{worker}-{i}");
        let created_at = format!("2026-11-29T10:00:00.{i:09}Z");
        i += 1;
        let v = app.apply_ok(&stream, &event, &created_at).await;
        assert_eq!(v["outcome"], "applied", "{event}: {v}");
        log.push(Write::Apply {
            stream,
            event,
            created_at,
        });
    }
}

/// The settings of the test instances: the source `sume` delivering to
/// `url`, a full and a read-only token, the data file in `dir`.
fn instance(dir: &TempDir, url: &str) -> dedupd::config::Loaded {
    let mut loaded = test_settings(dir);
    with_tokens(&mut loaded, &[FULL]);
    with_read_tokens(&mut loaded, &[READ]);
    loaded.settings.sources.insert("sume".into(), settings(url));
    loaded
}

/// `dedupd ARGS`, to completion: its status, stdout and stderr.
async fn run(args: Vec<String>) -> (bool, String, String) {
    let out = tokio::task::spawn_blocking(move || dedupd().args(&args).output().unwrap())
        .await
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `dedupd backup` of `app` to `to`.
async fn backup(app: &TestApp, to: &Path) -> (bool, String, String) {
    run(vec![
        "backup".into(),
        "--url".into(),
        app.address.clone(),
        "--token".into(),
        FULL.into(),
        "--to".into(),
        to.display().to_string(),
    ])
    .await
}

/// A config file in `dir` whose data file is `dir/dedupd.redb`.
fn config_in(dir: &Path) -> PathBuf {
    let path = dir.join("restore.toml");
    std::fs::write(
        &path,
        format!(
            "data_path = {:?}\n",
            dir.join("dedupd.redb").display().to_string()
        ),
    )
    .unwrap();
    path
}

async fn restore(file: &Path, dir: &Path, extra: &[&str]) -> (bool, String, String) {
    let mut args = vec![
        "restore".to_owned(),
        file.display().to_string(),
        "--config".into(),
        config_in(dir).display().to_string(),
    ];
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    run(args).await
}

async fn get_json(app: &TestApp, path: &str) -> (StatusCode, Value) {
    let res = app.request(Method::GET, path).send().await.unwrap();
    let status = res.status();
    (status, res.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_drill_a_backup_under_load_restores_every_acknowledged_write_and_fences_go_on() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let old_dir = Arc::new(TempDir::new().unwrap());
    let clock = dedupd::clock::ManualClock::new(crate::support::app::T0);
    let mut settings = instance(&old_dir, &receiver.url);
    // Writes answered from the log stay uncommitted until a read (the
    // dispatcher's, a duplicate check) or the backup commits them.
    settings.settings.storage.commit_hold = Duration::from_secs(3600);
    let app = Arc::new(start(settings, old_dir.clone(), clock.clone()).await);
    let log = Arc::new(Log::default());
    let mut load = Vec::new();
    for w in 0..3 {
        load.push(tokio::spawn(claims_load(app.clone(), log.clone(), w)));
    }
    for w in 0..2 {
        load.push(tokio::spawn(ingest_load(app.clone(), log.clone(), w)));
        load.push(tokio::spawn(apply_load(app.clone(), log.clone(), w)));
    }
    let until = |n: usize| {
        let log = log.clone();
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            while log.count.load(Ordering::SeqCst) < n {
                assert!(tokio::time::Instant::now() < deadline, "the load stalled");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    until(300).await;
    log.began.store(true, Ordering::SeqCst);
    let before = log.count.load(Ordering::SeqCst);
    let scratch = TempDir::new().unwrap();
    let file = scratch.path().join("drill.backup");
    let (ok, out, err) = backup(&app, &file).await;
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("wrote"), "{out}");
    // Writes go on after it: none of them may be in it but whole.
    until(log.count.load(Ordering::SeqCst) + 100).await;
    log.stop.store(true, Ordering::SeqCst);
    for l in load {
        l.await.unwrap();
    }
    let acked = log.acked.lock().unwrap().clone();
    assert!(
        acked.iter().filter(|a| !a.before).count() >= 100,
        "writes went on during and after the backup ({before} before)"
    );
    let highest = acked
        .iter()
        .filter_map(|a| match &a.what {
            Write::Claim { fence, .. } => Some(*fence),
            _ => None,
        })
        .max()
        .unwrap();
    let Ok(app) = Arc::try_unwrap(app) else {
        panic!("the load still holds the app")
    };
    app.stop().await;

    // Restored into a fresh directory, checked, and served by a fresh
    // instance.
    let new_dir = Arc::new(TempDir::new().unwrap());
    let (ok, out, err) = restore(&file, new_dir.path(), &[]).await;
    assert!(ok, "{out}\n{err}");
    let data = new_dir.path().join("dedupd.redb");
    let (ok, out, err) = run(vec!["verify".into(), data.display().to_string()]).await;
    assert!(ok && out.contains("closed cleanly"), "{out}\n{err}");
    let app = start(instance(&new_dir, &receiver.url), new_dir.clone(), clock).await;

    let done_before: Vec<&str> = acked
        .iter()
        .filter_map(|a| match &a.what {
            Write::Done { key } if a.before => Some(key.as_str()),
            _ => None,
        })
        .collect();
    let done_ever: Vec<&str> = acked
        .iter()
        .filter_map(|a| match &a.what {
            Write::Done { key } => Some(key.as_str()),
            _ => None,
        })
        .collect();
    let mut finished_with_old_token = 0;
    for a in &acked {
        match &a.what {
            Write::Claim { key, token, fence } => {
                let (status, v) = get_json(&app, &format!("/v1/claims/{key}")).await;
                if status == StatusCode::NOT_FOUND {
                    assert!(
                        !a.before,
                        "{key}: acknowledged before the backup, and missing"
                    );
                    continue;
                }
                assert_eq!(status, StatusCode::OK, "{key}: {v}");
                assert_eq!(v["fence"].as_u64(), Some(*fence), "{key}: whole");
                let state = v["state"].as_str().unwrap();
                if done_before.contains(&key.as_str()) {
                    assert_eq!(state, "done", "{key}: done before the backup");
                } else if state == "done" {
                    assert!(done_ever.contains(&key.as_str()), "{key}");
                } else if finished_with_old_token < 5 {
                    // Its owner, holding the token the old instance gave,
                    // finishes it on the restored one.
                    let res = app.done(key, json!({ "token": token })).await;
                    assert_eq!(res.status(), StatusCode::OK, "{key}");
                    finished_with_old_token += 1;
                }
            }
            Write::Ingest { id, body: b } => {
                let (status, v) = get_json(&app, &format!("/v1/sources/sume/events/{id}")).await;
                if status == StatusCode::NOT_FOUND {
                    assert!(
                        !a.before,
                        "{id}: acknowledged before the backup, and missing"
                    );
                    continue;
                }
                assert_eq!(status, StatusCode::OK, "{id}: {v}");
                assert_eq!(v["body"].as_str().unwrap().as_bytes(), b.as_slice(), "{id}");
                if a.before {
                    let again = app.ingest(b).await.json::<Value>().await.unwrap();
                    assert_eq!(again["status"], "duplicate", "{id}: {again}");
                }
            }
            Write::Apply {
                stream,
                event,
                created_at,
            } if a.before => {
                let (status, v) = get_json(&app, &format!("/v1/streams/{stream}")).await;
                assert_eq!(status, StatusCode::OK, "{stream}: {v}");
                // Events of a stream are applied in the order of their
                // number: the head is this one or a later one.
                let n = |e: &str| e.rsplit('-').next().unwrap().parse::<u32>().unwrap();
                let head = v["head"]["event_id"].as_str().unwrap();
                assert!(n(head) >= n(event), "{stream}: head {head}, before {event}");
                let again = app.apply_ok(stream, event, created_at).await;
                assert_eq!(again["outcome"], "duplicate", "{event}: {again}");
            }
            Write::Apply { .. } | Write::Done { .. } => {}
        }
    }
    assert!(
        finished_with_old_token > 0,
        "some claim was still held at the backup"
    );
    // Fences never go backwards: above every fence the old instance handed
    // out, before the backup and after it.
    let (_, fence, _) = app.claim_ok("after-restore", json!({})).await;
    assert!(fence > highest, "{fence} > {highest}");
    app.stop().await;
}

#[tokio::test]
async fn a_backup_through_the_api_takes_a_full_token_and_is_one_whole_file() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let dir = Arc::new(TempDir::new().unwrap());
    let clock = dedupd::clock::ManualClock::new(crate::support::app::T0);
    let app = start(instance(&dir, &receiver.url), dir.clone(), clock).await;
    app.claim_ok("k", json!({})).await;
    let post = |token: Option<&str>| {
        let req = app.client.post(app.url("/v1/backup"));
        match token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    };
    assert_problem(
        post(None).send().await.unwrap(),
        StatusCode::UNAUTHORIZED,
        "unauthorized",
    )
    .await;
    assert_problem(
        post(Some(READ)).send().await.unwrap(),
        StatusCode::FORBIDDEN,
        "read_only_token",
    )
    .await;
    let res = post(Some(FULL)).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        res.headers()["content-type"],
        "application/vnd.dedupd.backup"
    );
    assert!(res.headers().contains_key("x-dedupd-backup-batch"));
    let bytes = res.bytes().await.unwrap();
    let scratch = TempDir::new().unwrap();
    let path = scratch.path().join("b");
    std::fs::write(&path, &bytes).unwrap();
    let report = verify_backup(&path).unwrap();
    assert_eq!(report.rows("claim_rows"), 1);
    // A read-only token cannot take one through the CLI either.
    let (ok, _, err) = run(vec![
        "backup".into(),
        "--url".into(),
        app.address.clone(),
        "--token".into(),
        READ.into(),
        "--to".into(),
        scratch.path().join("c").display().to_string(),
    ])
    .await;
    assert!(!ok && err.contains("read_only_token"), "{err}");
    assert!(!scratch.path().join("c").exists() && !scratch.path().join("c.partial").exists());

    // A link planted where the partial file goes (another user, in a
    // shared directory, waiting for root's backup) is replaced, never
    // written through.
    let victim = scratch.path().join("victim");
    std::fs::write(&victim, "keep me\n").unwrap();
    let d = scratch.path().join("d");
    std::os::unix::fs::symlink(&victim, scratch.path().join("d.partial")).unwrap();
    let (ok, out, err) = backup(&app, &d).await;
    assert!(ok, "{out}\n{err}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me\n");
    assert_eq!(verify_backup(&d).unwrap().rows("claim_rows"), 1);
    assert!(std::fs::symlink_metadata(scratch.path().join("d.partial")).is_err());
    app.stop().await;
}

#[tokio::test]
async fn the_cli_refuses_a_damaged_backup_and_a_running_target_and_replaces_only_when_told() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let a_dir = Arc::new(TempDir::new().unwrap());
    let clock = dedupd::clock::ManualClock::new(crate::support::app::T0);
    let a = start(
        instance(&a_dir, &receiver.url),
        a_dir.clone(),
        clock.clone(),
    )
    .await;
    a.claim_ok("from-a", json!({})).await;
    let scratch = TempDir::new().unwrap();
    let file = scratch.path().join("a.backup");
    let (ok, out, err) = backup(&a, &file).await;
    assert!(ok, "{out}\n{err}");
    a.stop().await;
    // Another instance, running, with its own data.
    let b_dir = Arc::new(TempDir::new().unwrap());
    let b = start(
        instance(&b_dir, &receiver.url),
        b_dir.clone(),
        clock.clone(),
    )
    .await;
    b.claim_ok("from-b", json!({})).await;
    let (ok, _, err) = restore(&file, b_dir.path(), &["--replace"]).await;
    assert!(!ok && err.contains("running dedupd"), "{err}");
    let b_clock = b.clock.clone();
    b.stop().await;
    let files = |dir: &Path| -> Vec<(String, Vec<u8>)> {
        let mut v: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("dedupd.redb"))
            .map(|e| {
                (
                    e.file_name().to_string_lossy().into_owned(),
                    std::fs::read(e.path()).unwrap(),
                )
            })
            .collect();
        v.sort();
        v
    };
    let there = files(b_dir.path());
    // Damaged or cut short: verify and restore refuse it, nothing changes.
    let good = std::fs::read(&file).unwrap();
    let bad = scratch.path().join("bad.backup");
    for (what, bytes) in [
        ("cut short", good[..good.len() - 10].to_vec()),
        ("a byte changed", {
            let mut b = good.clone();
            let mid = b.len() / 2;
            b[mid] ^= 1;
            b
        }),
    ] {
        std::fs::write(&bad, &bytes).unwrap();
        let (ok, _, err) = run(vec!["verify".into(), bad.display().to_string()]).await;
        assert!(!ok && err.contains("does not verify"), "{what}: {err}");
        let (ok, _, err) = restore(&bad, b_dir.path(), &["--replace"]).await;
        assert!(!ok && err.contains("nothing was restored"), "{what}: {err}");
        // Its cause said once, not again after the message that names it.
        assert_eq!(err.matches("nothing was restored").count(), 1, "{err}");
        let cause = err
            .rsplit("; nothing was restored")
            .next()
            .unwrap_or_default();
        assert!(cause.trim().is_empty(), "{what}: {err}");
        assert_eq!(files(b_dir.path()), there, "{what}");
    }
    // Files there: refused unless told to replace them.
    let (ok, _, err) = restore(&file, b_dir.path(), &[]).await;
    assert!(!ok && err.contains("--replace"), "{err}");
    assert_eq!(files(b_dir.path()), there);
    // Another instance's backup restored over it: a restore like any other.
    // A restore killed before left its build directory: named, not removed
    // (it could be another restore's, running).
    let killed = b_dir.path().join(".dedupd-restore-00000000000000aa");
    std::fs::create_dir(&killed).unwrap();
    let (ok, out, err) = restore(&file, b_dir.path(), &["--replace"]).await;
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("before-restore"), "{out}");
    assert!(
        err.contains(".dedupd-restore-00000000000000aa") && err.contains("did not finish"),
        "{err}"
    );
    assert!(killed.is_dir());
    std::fs::remove_dir(&killed).unwrap();
    let b = start(instance(&b_dir, &receiver.url), b_dir.clone(), b_clock).await;
    assert_eq!(b.get("from-a").await.status(), StatusCode::OK);
    assert_eq!(b.get("from-b").await.status(), StatusCode::NOT_FOUND);
    b.stop().await;
}

/// A tmpfs of `size` (`1m`) mounted on a new temp dir (root only),
/// unmounted on drop.
struct Tmpfs(TempDir);

impl Tmpfs {
    fn mount(size: &str) -> Self {
        let dir = TempDir::new().unwrap();
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("mount");
        assert!(status.success(), "mounting a tmpfs needs root");
        Self(dir)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // The kernel releases a killed server's files a moment later.
        for _ in 0..50 {
            if std::process::Command::new("umount")
                .arg(self.0.path())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[tokio::test]
#[ignore = "needs root to mount a tmpfs: .ci/run runs it"]
async fn a_backup_onto_a_disk_too_small_fails_leaves_nothing_and_the_next_one_is_whole() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let dir = Arc::new(TempDir::new().unwrap());
    let clock = dedupd::clock::ManualClock::new(crate::support::app::T0);
    let app = start(instance(&dir, &receiver.url), dir.clone(), clock).await;
    // About 1.5 MiB of bodies: more than the disk under the backup holds.
    let pad = "x".repeat(3500);
    for i in 0..450 {
        let b = serde_json::to_vec(&json!({
            "request_id": format!("big-{i}"), "run_id": format!("run-{i}"),
            "created_at": "2026-11-29T10:00:00Z", "pad": pad,
        }))
        .unwrap();
        app.ingest_ok(&b).await;
    }
    let small = Tmpfs::mount("1m");
    let to = small.0.path().join("b.backup");
    let (ok, out, err) = backup(&app, &to).await;
    assert!(!ok, "{out}");
    assert!(
        err.contains("No space left on device") && err.contains("no backup was written"),
        "{err}"
    );
    let left: Vec<_> = std::fs::read_dir(small.0.path())
        .unwrap()
        .flatten()
        .collect();
    assert!(left.is_empty(), "{left:?}");
    // The server is fine, and the next backup, where there is room, whole.
    app.claim_ok("after", json!({})).await;
    let roomy = TempDir::new().unwrap();
    let to = roomy.path().join("b.backup");
    let (ok, out, err) = backup(&app, &to).await;
    assert!(ok, "{out}\n{err}");
    let report = verify_backup(&to).unwrap();
    assert_eq!(report.rows("inbox_events"), 450);
    assert!(report.bytes > 1 << 20);
    app.stop().await;
}

/// Once: `dedupd restore` of a backup of 22 KB onto a disk of 24 MiB
/// refused, saying "its highest key slot is 29, so it takes 960 bytes, and
/// /proc/self/fd/9 has 25067520 free": it kept 64 MiB free for the log,
/// said so nowhere, and named its build directory by a descriptor. The
/// server needs no such room (its log starts empty and grows by what is
/// free above `storage.min_free_bytes`), and a backup with no sealed event
/// panicked there instead (its highest slot, 0 - 1). A restore now keeps
/// the watermark free and goes ahead when it can: the restored instance
/// serves and takes writes. When it cannot, it says where, what is needed
/// (the key file and the watermark) and what is free, and nothing there
/// changed.
#[tokio::test]
#[ignore = "needs root to mount a tmpfs: .ci/run runs it"]
async fn a_restore_onto_a_small_disk_leaves_the_watermark_free_or_says_what_it_needs() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let dir = Arc::new(TempDir::new().unwrap());
    let clock = dedupd::clock::ManualClock::new(crate::support::app::T0);
    let app = start(instance(&dir, &receiver.url), dir.clone(), clock).await;
    let scratch = TempDir::new().unwrap();
    app.claim_ok("kept", json!({})).await;
    let unsealed = scratch.path().join("unsealed.backup");
    let (ok, out, err) = backup(&app, &unsealed).await;
    assert!(ok, "{out}\n{err}");
    app.ingest_ok(&body("e1", "run-1", "2026-11-29T10:00:00Z"))
        .await;
    let sealed = scratch.path().join("sealed.backup");
    let (ok, out, err) = backup(&app, &sealed).await;
    assert!(ok, "{out}\n{err}");
    assert_eq!(verify_backup(&sealed).unwrap().sealed, 1);
    app.stop().await;

    let disk = Tmpfs::mount("24m");
    let data = disk.0.path().join("dedupd.redb");
    let config = |extra: &str| {
        let path = scratch.path().join("on-tmpfs.toml");
        std::fs::write(
            &path,
            format!(
                "listen = \"127.0.0.1:0\"\ndata_path = {:?}\n[sources.sume]\n{}\n{extra}",
                data.display().to_string(),
                crate::support::gateway::settings_toml(
                    &receiver.url,
                    &[crate::support::gateway::SECRET]
                ),
            ),
        )
        .unwrap();
        path
    };
    let restore_with = |file: &Path, config: PathBuf| {
        run(vec![
            "restore".into(),
            file.display().to_string(),
            "--config".into(),
            config.display().to_string(),
        ])
    };
    // A watermark of 32 MiB on a disk of 24: refused, both backups.
    let watermark = config("[storage]\nmin_free_bytes = 33554432\n");
    for (file, slot) in [(&unsealed, false), (&sealed, true)] {
        let (ok, out, err) = restore_with(file, watermark.clone()).await;
        assert!(!ok, "{out}");
        let said = |what: &str| err.contains(what);
        assert!(
            said(&format!("{} has ", disk.0.path().display()))
                && said("bytes free once the restored data file is built")
                && said("storage.min_free_bytes (33554432)")
                && said("nothing was restored")
                && said("its highest key slot is") == slot
                && !said("/proc/self")
                && !said("panicked"),
            "{}: {err}",
            file.display()
        );
        let left: Vec<_> = std::fs::read_dir(disk.0.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
    // The default watermark (8 MiB) stays free: restored, and the instance
    // serves what was there and takes writes.
    let roomy = config("");
    let (ok, out, err) = restore_with(&sealed, roomy.clone()).await;
    assert!(ok, "{out}\n{err}");
    let (child, port, _drain) = serve_config(&roomy);
    let base = format!("http://127.0.0.1:{port}");
    let client = crate::support::http::client();
    let res = client
        .get(format!("{base}/v1/claims/kept"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let res = client
        .post(format!("{base}/v1/claims/new"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    sigterm(&child);
    assert!(crate::support::process::wait(child).success());
}

/// A server that hands out `bytes` as a backup to one request, in two
/// halves: the first at once, the second once told to (`go`). Says when
/// the request came and when the first half went (`sent`).
fn slow_backup_server(
    bytes: Vec<u8>,
) -> (
    u16,
    std::sync::mpsc::Receiver<()>,
    std::sync::mpsc::Sender<()>,
    std::thread::JoinHandle<()>,
) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (sent_tx, sent) = std::sync::mpsc::channel();
    let (go, go_rx) = std::sync::mpsc::channel::<()>();
    let thread = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        conn.set_read_timeout(Some(crate::support::process::PATIENCE))
            .unwrap();
        let head = read_head(&mut conn);
        assert!(head.starts_with("POST /v1/backup "), "{head}");
        let half = bytes.len() / 2;
        write!(
            conn,
            "HTTP/1.1 200 OK\r\nContent-Type: application/vnd.dedupd.backup\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            bytes.len()
        )
        .unwrap();
        conn.write_all(&bytes[..half]).unwrap();
        conn.flush().unwrap();
        sent_tx.send(()).unwrap();
        // Told to go on, or the test ended.
        if go_rx.recv().is_ok() {
            conn.write_all(&bytes[half..]).unwrap();
        }
    });
    (port, sent, go, thread)
}

/// Once: a second `dedupd backup --to FILE` while one was writing FILE
/// got 409 `backup_running` from the server, and its failure removed
/// FILE.partial, the first run's: the first, healthy backup then failed
/// too ("does not verify: … No such file or directory"). (Had the server
/// taken it, it would have replaced the first's FILE.partial with its
/// own.) The first run holds FILE.partial locked: the second is refused
/// before it asks for anything, and the first ends whole.
#[tokio::test]
async fn a_second_backup_to_the_same_file_is_refused_and_the_first_ends_whole() {
    use std::os::unix::fs::MetadataExt as _;
    let receiver = Receiver::start(Behaviour::Accept).await;
    let dir = Arc::new(TempDir::new().unwrap());
    let clock = dedupd::clock::ManualClock::new(crate::support::app::T0);
    let app = start(instance(&dir, &receiver.url), dir.clone(), clock).await;
    app.claim_ok("k", json!({})).await;
    let whole = app
        .client
        .post(app.url("/v1/backup"))
        .bearer_auth(FULL)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap()
        .to_vec();
    // The first run, from a server that stops halfway until told.
    let (port, sent, go, server) = slow_backup_server(whole);
    let scratch = TempDir::new().unwrap();
    let to = scratch.path().join("b.backup");
    let partial = scratch.path().join("b.backup.partial");
    let first = crate::support::process::Running::from(
        dedupd()
            .args(["backup", "--url", &format!("http://127.0.0.1:{port}")])
            .args(["--token", FULL, "--to"])
            .arg(&to)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let sent =
        tokio::task::spawn_blocking(move || sent.recv_timeout(crate::support::process::PATIENCE))
            .await
            .unwrap();
    assert!(sent.is_ok(), "the first backup never asked");
    // Written from the first bytes on (before, in the runs that removed it).
    let deadline = Instant::now() + crate::support::process::PATIENCE;
    while !partial.exists() {
        assert!(Instant::now() < deadline, "no {}", partial.display());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let inode = std::fs::metadata(&partial).unwrap().ino();
    // A second, to the same file, through the real server: one the server
    // would refuse (a read-only token: a failure, as the 409 was), and one
    // it would take.
    for token in [READ, FULL] {
        let (ok, out, err) = run(vec![
            "backup".into(),
            "--url".into(),
            app.address.clone(),
            "--token".into(),
            token.into(),
            "--to".into(),
            to.display().to_string(),
        ])
        .await;
        assert!(!ok, "{token}: {out}");
        assert!(
            err.contains("is being written by another `dedupd backup")
                && err.contains("changed nothing"),
            "{token}: {err}"
        );
        assert_eq!(std::fs::metadata(&partial).unwrap().ino(), inode, "{token}");
        assert!(!to.exists(), "{token}");
    }
    // The first goes on, and ends whole.
    go.send(()).unwrap();
    let first = tokio::task::spawn_blocking(move || {
        let mut first = first;
        let mut stderr = first.stderr.take().unwrap();
        let status = crate::support::process::wait(first);
        let mut err = String::new();
        stderr.read_to_string(&mut err).unwrap();
        (status, err)
    })
    .await
    .unwrap();
    assert!(first.0.success(), "{}", first.1);
    server.join().unwrap();
    assert_eq!(verify_backup(&to).unwrap().rows("claim_rows"), 1);
    assert!(!partial.exists());
    app.stop().await;
}

/// `backup --to` replaces only a backup (or an empty file): never the
/// serving instance's data file, its log or key file, nor any other file
/// that is not one. Renamed over, such a file would be gone while the
/// server went on acknowledging writes into it, and every write after the
/// backup would be lost at its next start. A directory, or one that is not
/// there, is refused before the backup is taken.
#[tokio::test]
async fn a_backup_replaces_only_a_backup_never_the_instances_own_files() {
    use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
    let receiver = Receiver::start(Behaviour::Accept).await;
    let dir = Arc::new(TempDir::new().unwrap());
    let clock = dedupd::clock::ManualClock::new(crate::support::app::T0);
    let app = start(instance(&dir, &receiver.url), dir.clone(), clock).await;
    app.claim_ok("before", json!({})).await;
    for own in ["dedupd.redb", "dedupd.redb.keys", "dedupd.redb.wal"] {
        let path = dir.path().join(own);
        let inode = std::fs::metadata(&path).unwrap().ino();
        let (ok, out, err) = backup(&app, &path).await;
        assert!(!ok, "{own}: {out}");
        assert!(err.contains("is not a dedupd backup"), "{own}: {err}");
        assert_eq!(std::fs::metadata(&path).unwrap().ino(), inode, "{own}");
    }
    let scratch = TempDir::new().unwrap();
    let other = scratch.path().join("notes.txt");
    std::fs::write(&other, "not a backup").unwrap();
    let (ok, _, err) = backup(&app, &other).await;
    assert!(!ok && err.contains("is not a dedupd backup"), "{err}");
    assert_eq!(std::fs::read(&other).unwrap(), b"not a backup");
    let (ok, _, err) = backup(&app, scratch.path()).await;
    assert!(!ok && err.contains("is a directory"), "{err}");
    // A pipe (or a device, or another program's socket): never replaced.
    let fifo = scratch.path().join("pipe");
    crate::support::process::mkfifo(&fifo);
    let (ok, _, err) = backup(&app, &fifo).await;
    assert!(!ok && err.contains("not a regular file"), "{err}");
    assert!(
        std::fs::symlink_metadata(&fifo)
            .unwrap()
            .file_type()
            .is_fifo()
    );
    // The bytes go to FILE.partial first: one that is not a backup's stays.
    let partial = scratch.path().join("c.backup.partial");
    std::fs::write(&partial, "someone's notes").unwrap();
    let (ok, _, err) = backup(&app, &scratch.path().join("c.backup")).await;
    assert!(!ok && err.contains("is not a dedupd backup"), "{err}");
    assert_eq!(std::fs::read(&partial).unwrap(), b"someone's notes");
    let (ok, _, err) = backup(&app, &scratch.path().join("nowhere/b.backup")).await;
    assert!(!ok && err.contains("is not a directory"), "{err}");
    // An empty file (mktemp's), then the backup written there, are replaced.
    let file = scratch.path().join("b.backup");
    std::fs::write(&file, b"").unwrap();
    for _ in 0..2 {
        let (ok, out, err) = backup(&app, &file).await;
        assert!(
            ok,
            "{out}
{err}"
        );
        verify_backup(&file).unwrap();
    }
    // --offline is for a stopped instance: this one serves.
    let (ok, _, err) = run(vec![
        "backup".into(),
        "--offline".into(),
        "--config".into(),
        config_in(dir.path()).display().to_string(),
        "--to".into(),
        scratch.path().join("offline.backup").display().to_string(),
    ])
    .await;
    assert!(!ok && err.contains("leave out --offline"), "{err}");
    // The instance's own files were never touched: it goes on, and keeps
    // what it acknowledged through a restart.
    app.claim_ok("after", json!({})).await;
    let clock = app.clock.clone();
    app.stop().await;
    let app = start(instance(&dir, &receiver.url), dir.clone(), clock).await;
    for key in ["before", "after"] {
        let (status, _) = get_json(&app, &format!("/v1/claims/{key}")).await;
        assert_eq!(status, StatusCode::OK, "{key}");
    }
    app.stop().await;
}

/// A new release's `backup --offline` of a file an older one wrote would
/// migrate it as it opened it, and the backup "before the upgrade" would be
/// of the new schema too: the old release could read neither. It refuses,
/// changing nothing.
#[tokio::test]
async fn an_offline_backup_of_an_older_schemas_file_refuses_and_changes_nothing() {
    let dir = TempDir::new().unwrap();
    let golden = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/schema-11");
    let unpacked = std::process::Command::new("python3")
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/unpack.py"))
        .arg(&golden)
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(unpacked.success());
    let files = || -> Vec<(String, Vec<u8>)> {
        let mut v: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| {
                (
                    e.file_name().to_string_lossy().into_owned(),
                    std::fs::read(e.path()).unwrap(),
                )
            })
            .collect();
        v.sort();
        v
    };
    assert!(files().iter().any(|(n, _)| n == "dedupd.redb"));
    let config = config_in(dir.path());
    let before = files();
    let to = dir.path().join("pre-upgrade.backup");
    let (ok, out, err) = run(vec![
        "backup".into(),
        "--offline".into(),
        "--config".into(),
        config.display().to_string(),
        "--to".into(),
        to.display().to_string(),
    ])
    .await;
    assert!(!ok, "{out}");
    assert!(
        err.contains("schema 11") && err.contains("older release"),
        "{err}"
    );
    assert_eq!(files(), before, "nothing migrated, no backup left");
}

/// Under the packaged unit a source's secrets files name the service's
/// staged copies, the service user's alone and gone while it is stopped,
/// which is when a restore runs. `backup`, `restore` and the operator
/// commands read the settings for the address, the token and the data
/// file only: such a file does not stop them, while `check-config` (and
/// `serve`) still refuse it, and any other mistake still stops them.
#[tokio::test]
async fn backup_restore_and_the_operator_commands_need_no_source_secrets() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let dir = Arc::new(TempDir::new().unwrap());
    let clock = dedupd::clock::ManualClock::new(crate::support::app::T0);
    let app = start(instance(&dir, &receiver.url), dir.clone(), clock).await;
    app.claim_ok("kept", json!({})).await;
    let target = TempDir::new().unwrap();
    let gone = target.path().join("staged");
    let settings = |listen: &str| {
        format!(
            "listen = {listen:?}\ndata_path = {:?}\n[api]\ntokens = [\"{FULL}\"]\n\
             [sources.sume]\nscheme = \"sume\"\nsecrets_file = {:?}\n\
             destination_secret_file = {:?}\nevent_id = \"body:/request_id\"\n\
             created_at = \"body:/created_at\"\nstream = \"body:/run_id\"\n\
             forward_to = \"http://127.0.0.1:9/nobody\"\n",
            target.path().join("dedupd.redb").display().to_string(),
            gone.join("sume-secrets").display().to_string(),
            gone.join("sume-destination").display().to_string(),
        )
    };
    let config = target.path().join("dedupd.toml");
    let listen = app.address.trim_start_matches("http://").to_owned();
    std::fs::write(&config, settings(&listen)).unwrap();
    let config_arg = config.display().to_string();

    let file = target.path().join("b.backup");
    let (ok, out, err) = run(vec![
        "backup".into(),
        "--config".into(),
        config_arg.clone(),
        "--to".into(),
        file.display().to_string(),
    ])
    .await;
    assert!(ok, "{out}\n{err}");
    let (ok, out, err) = run(vec![
        "claims".into(),
        "get".into(),
        "kept".into(),
        "--config".into(),
        config_arg.clone(),
    ])
    .await;
    assert!(ok && out.contains("processing"), "{out}\n{err}");
    app.stop().await;

    let (ok, out, err) = run(vec![
        "check-config".into(),
        "--config".into(),
        config_arg.clone(),
    ])
    .await;
    assert!(!ok && err.contains("sume-secrets"), "{out}\n{err}");
    let (ok, out, err) = run(vec![
        "restore".into(),
        file.display().to_string(),
        "--config".into(),
        config_arg.clone(),
    ])
    .await;
    assert!(ok, "{out}\n{err}");
    assert!(target.path().join("dedupd.redb").exists());

    // Another mistake still stops it, the secrets aside.
    std::fs::write(&config, settings("not an address")).unwrap();
    std::fs::remove_file(target.path().join("dedupd.redb")).unwrap();
    let (ok, _, err) = run(vec![
        "restore".into(),
        file.display().to_string(),
        "--config".into(),
        config_arg,
    ])
    .await;
    assert!(!ok && err.contains("listen"), "{err}");
    assert!(!target.path().join("dedupd.redb").exists());

    // --offline with a data_path where there is no data file: refused,
    // rather than a backup of a new, empty instance made there.
    std::fs::write(&config, settings(&listen)).unwrap();
    let offline = target.path().join("offline.backup");
    let (ok, _, err) = run(vec![
        "backup".into(),
        "--offline".into(),
        "--config".into(),
        config.display().to_string(),
        "--to".into(),
        offline.display().to_string(),
    ])
    .await;
    assert!(!ok && err.contains("there is no data file at"), "{err}");
    assert!(!offline.exists() && !target.path().join("dedupd.redb").exists());
}

/// About 24 MB of values no compression shrinks in `keyspace`: a backup
/// larger than what a reader's queue, the sockets' buffers and a chunk
/// hold, so a copy whose client reads nothing waits on it.
async fn fill(keyspace: &Keyspace) {
    for i in 0..24u32 {
        let value: Vec<u8> = (0..1_000_000u32)
            .map(|j| (j.wrapping_mul(2_654_435_761) >> 13) as u8 ^ i as u8)
            .collect();
        let request = KvRequest::Set {
            key: format!("big-{i}").into_bytes(),
            value,
            condition: SetCondition::Always,
            expiry: SetExpiry::Clear,
            get: false,
        };
        keyspace
            .submit(request, crate::support::app::T0)
            .await
            .unwrap()
            .await
            .unwrap();
    }
}

/// Asks for a backup on a connection of its own (no token: none is
/// configured), reads its answer's head (a 200) and the first 16 KiB of
/// the file, then nothing more: a client that stalled, or one that means
/// to hold the server.
fn stalled_backup(port: u16) -> TcpStream {
    let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
    client
        .set_read_timeout(Some(crate::support::process::PATIENCE))
        .unwrap();
    write!(
        client,
        "POST /v1/backup HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\n\r\n"
    )
    .unwrap();
    let head = read_head(&mut client);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut first = vec![0u8; 16 * 1024];
    client.read_exact(&mut first).unwrap();
    client
}

/// An answer's head, read byte by byte (nothing after it is taken).
fn read_head(client: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8];
    while !head.ends_with(b"\r\n\r\n") {
        client.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// Reads what is left of a stalled backup's answer once the server closed
/// its connection, and asserts that it was cut short: the chunked body
/// never ends (`0\r\n\r\n`), so no client takes it for a whole file.
fn assert_cut_short(mut stalled: TcpStream) {
    let mut rest = Vec::new();
    match stalled.read_to_end(&mut rest) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("the backup's connection was left open: {e}"),
    }
    assert!(
        !rest.ends_with(b"\r\n0\r\n\r\n"),
        "the abandoned backup's answer ended as a whole one ({} bytes after the first)",
        rest.len()
    );
}

/// A client that asks for a backup and then reads nothing does not hold
/// a SIGTERM: the stop abandons the backup at once (the log says so) and,
/// once no other request is in flight, closes its connection, its answer
/// cut short. The server is gone in moments, not after
/// `http.shutdown_timeout` (30 s here, as in the package), which any local
/// process that can reach the port could otherwise impose on every stop.
#[tokio::test]
async fn a_sigterm_does_not_wait_for_a_backup_whose_client_reads_nothing() {
    let dir = TempDir::new().unwrap();
    {
        let store = RedbStore::open(&RedbOptions::new(dir.path().join("dedupd.redb"))).unwrap();
        fill(&store.keyspace()).await;
        store.close().await;
    }
    let (mut child, port, drain) = serve(&dir);
    let stalled = tokio::task::spawn_blocking(move || stalled_backup(port))
        .await
        .unwrap();
    let asked = Instant::now();
    sigterm(&child);
    let (took, child) = tokio::task::spawn_blocking(move || {
        // A failed assertion kills it (`Running`).
        let deadline = asked + Duration::from_secs(60);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return (asked.elapsed(), status);
            }
            assert!(
                Instant::now() < deadline,
                "dedupd did not stop within 60 s of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    })
    .await
    .unwrap();
    // Without the fix it takes the whole shutdown_timeout, 30 s.
    assert!(
        took < Duration::from_secs(10),
        "SIGTERM took {took:?} with a backup's client reading nothing"
    );
    assert!(child.success(), "{child:?}");
    let log = drain.join().unwrap();
    let said = |what: &str| log.iter().any(|l| l.contains(what));
    assert!(
        said("backup stopped: the server is stopping"),
        "{}",
        log.join("\n")
    );
    assert!(!said("backup sent"), "{}", log.join("\n"));
    assert!(said("\"stopped\""), "{}", log.join("\n"));
    tokio::task::spawn_blocking(move || assert_cut_short(stalled))
        .await
        .unwrap();
}

/// A stop abandons a backup whose client reads nothing, but not the other
/// requests in flight: a claim whose body is still coming is answered,
/// and only then is the backup's connection closed and the app stopped,
/// long before `http.shutdown_timeout` (an hour here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_finishes_the_requests_in_flight_but_not_a_backup_whose_client_reads_nothing() {
    let mut keyspace = None;
    let app = spawn_over_file(
        |l| {
            l.settings.http.shutdown_timeout = Duration::from_secs(3600);
            l.settings.http.body_timeout = Duration::from_secs(3600);
        },
        None,
        |opened| {
            keyspace = Some(opened.keyspace.clone());
            (opened, Coordination::Inbox)
        },
    );
    fill(&keyspace.unwrap()).await;
    let port: u16 = app.address.rsplit(':').next().unwrap().parse().unwrap();
    let stalled = tokio::task::spawn_blocking(move || stalled_backup(port))
        .await
        .unwrap();
    // A claim in flight: its handler waits for the rest of its body.
    let mut busy = TcpStream::connect(("127.0.0.1", port)).unwrap();
    busy.set_read_timeout(Some(crate::support::process::PATIENCE))
        .unwrap();
    write!(
        busy,
        "POST /v1/claims/in-flight HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
         Content-Type: application/json\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n"
    )
    .unwrap();
    // Its handler has begun once it asks for the body.
    let (mut busy, go_on) = tokio::task::spawn_blocking(move || {
        let go_on = read_head(&mut busy);
        (busy, go_on)
    })
    .await
    .unwrap();
    assert!(go_on.starts_with("HTTP/1.1 100"), "{go_on}");
    busy.write_all(b"{").unwrap();

    let stopping = tokio::spawn(app.stop());
    // The stop has begun once the listener is closed.
    until_refused(port).await;
    busy.write_all(b"}").unwrap();
    let answer = tokio::task::spawn_blocking(move || read_head(&mut busy))
        .await
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    // The backup's connection is all that is left: closed, and the app
    // stops (its store closed, the backup's snapshot let go of).
    tokio::time::timeout(Duration::from_secs(60), stopping)
        .await
        .expect("the stop waited for the backup's client")
        .unwrap();
    tokio::task::spawn_blocking(move || assert_cut_short(stalled))
        .await
        .unwrap();
}

/// Waits until a connection to `port` is refused.
async fn until_refused(port: u16) {
    let deadline = tokio::time::Instant::now() + crate::support::process::PATIENCE;
    while TcpStream::connect(("127.0.0.1", port)).is_ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the listener stayed open"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
