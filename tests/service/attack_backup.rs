//! Attacks on `POST /v1/backup` of a running `dedupd serve` (the real
//! binary): a client that asks for a backup and never reads it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use dedupd::store::keyspace::{KvRequest, SetCondition, SetExpiry};
use dedupd::store::redb::{RedbOptions, RedbStore};
use tempfile::TempDir;

use crate::support::process::{Running, serve, sigterm};

/// Finding: a backup whose client stops reading holds a SIGTERM for the
/// whole `http.shutdown_timeout` (30 s by default and in the package;
/// systemd's TimeoutStopSec= is 45 s). The copy's thread is blocked
/// handing a chunk to the response (it waits up to `backup::STALL`, 60 s)
/// and only looks at `closing` between frames, and the store is closed
/// only after the HTTP server has finished its in-flight requests: the
/// backup, which cannot finish, is what it waits for. A stop (or a
/// restart on upgrade) takes 30 s instead of well under a second, and any
/// local process that can reach the port (no token is needed when none
/// is configured) can make every stop take that long.
#[tokio::test]
async fn a_backup_whose_reader_stalls_does_not_hold_a_sigterm() {
    let dir = TempDir::new().unwrap();
    // A data file of about 24 MB: more than the channel, the socket's
    // buffers and a chunk hold.
    {
        let store = RedbStore::open(&RedbOptions::new(dir.path().join("dedupd.redb"))).unwrap();
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
            store
                .keyspace()
                .submit(request, 1_800_000_000_000)
                .await
                .unwrap()
                .await
                .unwrap();
        }
        store.close().await;
    }
    let (child, port, _drain) = serve(&dir);
    let child = Running(child);
    let mut stalled = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stalled
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    write!(
        stalled,
        "POST /v1/backup HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\n\r\n"
    )
    .unwrap();
    // The answer's head, then nothing more is read.
    let mut first = [0u8; 64];
    let n = stalled.read(&mut first).unwrap();
    assert!(
        first[..n].starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&first[..n])
    );
    std::thread::sleep(Duration::from_secs(2));
    let asked = Instant::now();
    sigterm(&child.0);
    let mut child = child;
    let stopped = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if child.0.try_wait().unwrap().is_some() {
                return Some(asked.elapsed());
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    })
    .await
    .unwrap();
    drop(stalled);
    let took = stopped.expect("dedupd did not stop within 60 s of SIGTERM");
    assert!(
        took < Duration::from_secs(10),
        "SIGTERM took {took:?} with a backup's reader stalled"
    );
}
