//! A key file that does not open the events' seals (damaged, or another
//! copy's with the same id and length, which the start cannot tell) is
//! said in the log, and nothing is lost: the right key file put back, the
//! events are delivered.

use std::path::Path;

use dedupd::gateway::signature::{Scheme, sign};
use tempfile::TempDir;

use crate::support::gateway::{DESTINATION, body};
use crate::support::process::{LiveLog, Running, dedupd, spawn_serving_live, stop};
use crate::support::receiver::{Behaviour, Receiver, eventually};

const SECRET: &str = "key-file-signing-secret-8e2a";

/// A configuration in `dir` forwarding to `forward_to`, each failed
/// attempt retried a second later, for as long as the test runs.
fn config(dir: &Path, forward_to: &str) -> std::path::PathBuf {
    let file = dir.join("dedupd.toml");
    let text = format!(
        r#"listen = "127.0.0.1:0"
data_path = "{data}"

[sources.sume]
scheme = "sume"
event_id = "body:/request_id"
created_at = "body:/created_at"
stream = "body:/run_id"
forward_to = "{forward_to}"
max_attempts = 1000
backoff_min = "1s"
backoff_max = "1s"
secrets = ["{SECRET}"]
destination_secret = "{DESTINATION}"
"#,
        data = dir.join("dedupd.redb").display(),
    );
    std::fs::write(&file, text).unwrap();
    file
}

fn serve(file: &Path) -> (Running, u16, LiveLog, crate::support::process::Drain) {
    let mut cmd = dedupd();
    cmd.args(["serve", "--config"]).arg(file);
    spawn_serving_live(cmd)
}

async fn post(port: u16, body: &[u8]) {
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mut req = crate::support::http::client()
        .post(format!("http://127.0.0.1:{port}/ingest/sume"))
        .header("content-type", "application/json")
        .body(body.to_vec());
    for (k, v) in sign(Scheme::Sume, SECRET, i64::try_from(ts).unwrap(), "", body) {
        req = req.header(k, v);
    }
    assert_eq!(req.send().await.unwrap().status(), 200);
}

/// Flips a byte of every key in the key file beside `data`, its header
/// (and so its id and length) kept: what a start accepts.
fn damage_keys(keys: &Path) -> Vec<u8> {
    let whole = std::fs::read(keys).unwrap();
    let mut damaged = whole.clone();
    for slot in 0..(damaged.len() - 32) / 32 {
        damaged[32 + 32 * slot + 5] ^= 0xff;
    }
    std::fs::write(keys, &damaged).unwrap();
    whole
}

#[tokio::test]
async fn a_key_file_that_opens_no_pending_seal_is_said_in_the_log_and_nothing_is_lost() {
    let dir = TempDir::new().unwrap();
    let receiver = Receiver::start(Behaviour::Always(500)).await;
    let file = config(dir.path(), &receiver.url);
    let (child, port, _, drain) = serve(&file);
    post(port, &body("e1", "run_1", "2026-11-29T10:00:00Z")).await;
    post(port, &body("e2", "run_1", "2026-11-29T10:00:01Z")).await;
    eventually("a first attempt", || async {
        !receiver.received().is_empty()
    })
    .await;
    assert!(stop(child, "-TERM", drain).await.success());

    let keys = dir.path().join("dedupd.redb.keys");
    let right = damage_keys(&keys);
    receiver.set(Behaviour::Accept);
    let (child, _, log, drain) = serve(&file);
    eventually("the log says the seal does not open", || {
        let log = log.clone();
        async move {
            log.json().iter().any(|v| {
                v["level"] == "ERROR"
                    && v["event_id"] == "e1"
                    && v["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("does not open with the key file"))
            })
        }
    })
    .await;
    let said = log
        .json()
        .into_iter()
        .filter(|v| v["event_id"] == "e1" && v["level"] == "ERROR")
        .count();
    assert_eq!(said, 1, "said once, not at every look: {:?}", log.json());
    let attempts = receiver.received().len();
    assert!(stop(child, "-TERM", drain).await.success());
    assert_eq!(receiver.received().len(), attempts, "nothing was sent");

    // The right key file back: both are delivered, in their order.
    std::fs::write(&keys, right).unwrap();
    let (child, _, _, drain) = serve(&file);
    eventually("both delivered", || async {
        let ids = crate::support::gateway::ids(&receiver.received());
        ids.ends_with(&["e1".to_owned(), "e2".to_owned()])
    })
    .await;
    assert!(stop(child, "-TERM", drain).await.success());
}
