//! SIGKILL under concurrent SETs, again and again: after every restart each
//! acknowledged SET is there, with its value and its expiry.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tempfile::TempDir;

use super::Raw;
use crate::cli::{dedupd, spawn_serving_on, stop};
use crate::crash::kill_under_load;

/// Starts `dedupd serve` in `dir` with the RESP listener; returns it with
/// its RESP port (from its JSON log) and the thread draining that log.
fn serve(dir: &TempDir) -> (std::process::Child, u16, crate::cli::Drain) {
    let mut cmd = dedupd();
    cmd.arg("serve")
        .current_dir(dir.path())
        .env("DEDUPD_LISTEN", "127.0.0.1:0")
        .env("DEDUPD_RESP__LISTEN", "127.0.0.1:0");
    spawn_serving_on(cmd, "resp_port")
}

/// Acknowledged SETs: key → (value, with an expiry).
type Acked = Arc<Mutex<HashMap<String, (String, bool)>>>;

/// One worker: pipelines of 8 SETs (every other with EX), recording each
/// `+OK` read, until the connection fails (the server was killed).
async fn work(addr: String, worker: usize, round: usize, acked: Acked) {
    let mut c = Raw::connect(&addr).await;
    for batch in 0.. {
        let mut sent = Vec::new();
        let mut bytes = Vec::new();
        for j in 0..8 {
            let key = format!("r{round}-w{worker}-b{batch}-{j}");
            let value = format!("v{batch}.{j}");
            let timed = j % 2 == 0;
            let mut args = vec![
                b"SET".to_vec(),
                key.clone().into_bytes(),
                value.clone().into_bytes(),
            ];
            if timed {
                args.extend([b"EX".to_vec(), b"86400".to_vec()]);
            }
            bytes.extend(Raw::encode(&args));
            sent.push((key, value, timed));
        }
        c.send_raw(&bytes).await;
        for (key, value, timed) in sent {
            match c.reply().await {
                Some(r) if r == b"+OK\r\n" => {
                    acked.lock().unwrap().insert(key, (value, timed));
                }
                _ => return,
            }
        }
    }
}

/// Checks every acknowledged SET on the server at `addr`.
async fn check(addr: &str, acked: &HashMap<String, (String, bool)>) {
    let mut c = Raw::connect(addr).await;
    for (key, (value, timed)) in acked {
        let got = c.cmd(&format!("GET {key}")).await;
        let want = format!("${}\r\n{value}\r\n", value.len());
        assert_eq!(super::show(&got), super::show(want.as_bytes()), "GET {key}");
        let ttl = c.cmd(&format!("TTL {key}")).await;
        if *timed {
            assert!(ttl.starts_with(b":8"), "TTL {key}: {}", super::show(&ttl));
        } else {
            assert_eq!(ttl, b":-1\r\n", "TTL {key}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_under_concurrent_sets_loses_no_acknowledged_set() {
    let dir = TempDir::new().unwrap();
    let acked: Acked = Arc::default();
    for round in 0..3 {
        let (child, port, drain) = serve(&dir);
        let addr = format!("127.0.0.1:{port}");
        let before = acked.lock().unwrap().len();
        let workers: Vec<_> = (0..16)
            .map(|w| tokio::spawn(work(addr.clone(), w, round, acked.clone())))
            .collect();
        // Kill mid-load, once some hundreds of new SETs were acknowledged.
        while acked.lock().unwrap().len() < before + 600 {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        kill_under_load(child, workers, drain).await;

        let (child, port, drain) = serve(&dir);
        let seen = acked.lock().unwrap().clone();
        check(&format!("127.0.0.1:{port}"), &seen).await;
        assert!(stop(child, "-TERM", drain).await.success());
    }
    assert!(acked.lock().unwrap().len() >= 1800);
}
