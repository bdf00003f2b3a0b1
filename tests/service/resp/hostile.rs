//! The listener under attack, against the real binary with API tokens set:
//! what a client that has not authenticated, or one that never reads, can
//! do to the process and its slots.

use std::time::Duration;

use tempfile::TempDir;
use tokio::io::AsyncReadExt;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::Raw;
use crate::support::process::dedupd;
use crate::support::process::spawn_serving_on;
use crate::support::process::stop;
const TOKEN: &str = "hostile-test-token-0123456789";

/// `dedupd serve` with tokens and the RESP listener, plus `env`; returns
/// it with the RESP port.
fn serve_resp(
    dir: &TempDir,
    env: &[(&str, &str)],
) -> (
    crate::support::process::Running,
    u16,
    crate::support::process::Drain,
) {
    let mut cmd = dedupd();
    cmd.arg("serve")
        .current_dir(dir.path())
        .env("DEDUPD_LISTEN", "127.0.0.1:0")
        .env("DEDUPD_RESP__LISTEN", "127.0.0.1:0")
        .env("DEDUPD_API__TOKENS", format!("[\"{TOKEN}\"]"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    spawn_serving_on(cmd, "resp_port")
}

/// An authenticated connection still works: the process is up and serving.
async fn still_serving(addr: &str) {
    let mut c = Raw::connect(addr).await;
    assert_eq!(c.cmd(&format!("AUTH {TOKEN}")).await, b"+OK\r\n");
    assert_eq!(c.cmd("SET alive yes").await, b"+OK\r\n");
    assert_eq!(c.cmd("GET alive").await, b"$3\r\nyes\r\n");
}

/// Reads until the server closes the connection (30 s at most), returning
/// what it sent.
async fn read_until_closed(socket: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(30), socket.read(&mut buf))
            .await
            .expect("the server should close the connection")
            .unwrap_or(0);
        if n == 0 {
            return got;
        }
        got.extend_from_slice(&buf[..n]);
    }
}

#[tokio::test]
async fn eighty_kb_of_nested_arrays_before_auth_get_a_protocol_error_and_the_process_lives() {
    let dir = TempDir::new().unwrap();
    let (mut child, port, drain) = serve_resp(&dir, &[]);
    let addr = format!("127.0.0.1:{port}");
    // The packet: `*1\r\n` 20,000 times, then a bulk string.
    for _ in 0..3 {
        let mut s = TcpStream::connect(&addr).await.unwrap();
        let mut packet = b"*1\r\n".repeat(20_000);
        packet.extend(b"$1\r\nx\r\n");
        let _ = s.write_all(&packet).await;
        let reply = read_until_closed(&mut s).await;
        assert!(
            reply.starts_with(b"-ERR Protocol error"),
            "{}",
            String::from_utf8_lossy(&reply)
        );
    }
    assert!(
        child.try_wait().unwrap().is_none(),
        "dedupd is still running"
    );
    still_serving(&addr).await;
    assert!(stop(child, "-TERM", drain).await.success());
}

#[tokio::test]
async fn strangers_sending_megabyte_values_are_refused_at_their_headers() {
    let dir = TempDir::new().unwrap();
    let (child, port, drain) = serve_resp(&dir, &[]);
    let addr = format!("127.0.0.1:{port}");
    // 50 unauthenticated connections, each 1.1 MB into a bulk string: each
    // is refused once the length is declared, and closed, so none holds
    // the megabyte (on the old listener each stayed open, buffering).
    let mut tasks = Vec::new();
    for i in 0..50 {
        let addr = addr.clone();
        tasks.push(tokio::spawn(async move {
            let mut s = TcpStream::connect(&addr).await.unwrap();
            let mut packet =
                format!("*3\r\n$3\r\nSET\r\n$2\r\nk{}\r\n$1100000\r\n", i % 10).into_bytes();
            packet.extend(vec![b'v'; 1_100_000 - 1]);
            let _ = s.write_all(&packet).await;
            read_until_closed(&mut s).await
        }));
    }
    // Each is refused for its size, or (all of them come from one
    // address) evicted by a newer stranger before its turn: closed either
    // way, holding nothing.
    for t in tasks {
        let reply = t.await.unwrap();
        assert!(
            reply.starts_with(b"-ERR Protocol error: a request of more than 4096 bytes")
                || reply.starts_with(b"-ERR too many connections are waiting to authenticate"),
            "{}",
            String::from_utf8_lossy(&reply)
        );
    }
    still_serving(&addr).await;
    let mut c = Raw::connect(&addr).await;
    assert_eq!(c.cmd(&format!("AUTH {TOKEN}")).await, b"+OK\r\n");
    assert_eq!(
        c.cmd("EXISTS k0 k1 k9").await,
        b":0\r\n",
        "nothing was written"
    );
    assert!(stop(child, "-TERM", drain).await.success());
}

#[tokio::test]
async fn a_client_that_never_reads_loses_its_slot_to_the_write_timeout() {
    let dir = TempDir::new().unwrap();
    let (child, port, drain) = serve_resp(
        &dir,
        &[
            ("DEDUPD_RESP__MAX_CONNECTIONS", "1"),
            ("DEDUPD_RESP__WRITE_TIMEOUT", "1s"),
        ],
    );
    let addr = format!("127.0.0.1:{port}");
    // Authenticated, it pipelines echoes of 64 KiB and never reads: the
    // replies fill the socket buffers and the server's write waits.
    let mut hog = TcpStream::connect(&addr).await.unwrap();
    hog.write_all(&Raw::encode(&[b"AUTH".to_vec(), TOKEN.as_bytes().to_vec()]))
        .await
        .unwrap();
    let echo = Raw::encode(&[b"ECHO".to_vec(), vec![b'v'; 64 * 1024]]);
    let writer = tokio::spawn(async move {
        for _ in 0..1024 {
            if hog.write_all(&echo).await.is_err() {
                return;
            }
        }
        // Everything sent; keep the connection open, unread.
        std::future::pending::<()>().await;
    });
    // The only slot frees once the write deadline passes: a new client is
    // then served (before, the hog held it until idle_timeout, 5 min).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let served = loop {
        let mut c = Raw::connect(&addr).await;
        let reply = c.cmd(&format!("AUTH {TOKEN}")).await;
        if reply == b"+OK\r\n" {
            break true;
        }
        assert_eq!(reply, b"-ERR max number of clients reached\r\n");
        if tokio::time::Instant::now() > deadline {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(served, "the slot was never freed");
    writer.abort();
    assert!(stop(child, "-TERM", drain).await.success());
}

#[tokio::test]
async fn a_byte_now_and_then_does_not_outlast_the_idle_timeout() {
    let dir = TempDir::new().unwrap();
    let (child, port, drain) = serve_resp(&dir, &[("DEDUPD_RESP__IDLE_TIMEOUT", "2s")]);
    let addr = format!("127.0.0.1:{port}");
    let mut c = TcpStream::connect(&addr).await.unwrap();
    c.write_all(&Raw::encode(&[b"AUTH".to_vec(), TOKEN.as_bytes().to_vec()]))
        .await
        .unwrap();
    let mut ok = [0u8; 5];
    c.read_exact(&mut ok).await.unwrap();
    assert_eq!(&ok, b"+OK\r\n");
    // A request that never ends, a byte every 200 ms: the server closes
    // the connection although bytes keep coming.
    let (mut read, mut write) = c.into_split();
    let trickle = tokio::spawn(async move {
        for b in b"*2\r\n$4\r\nECHO\r\n$1000000\r\n".iter().cycle() {
            if write.write_all(&[*b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let mut buf = [0u8; 64];
    let closed = tokio::time::timeout(Duration::from_secs(30), read.read(&mut buf))
        .await
        .expect("closed within 30 s of trickling")
        .unwrap_or(0);
    assert_eq!(closed, 0, "closed without a reply");
    trickle.abort();
    assert!(stop(child, "-TERM", drain).await.success());
}

#[tokio::test]
async fn strangers_holding_idle_sockets_are_evicted_by_newcomers_and_token_holders_get_in() {
    let dir = TempDir::new().unwrap();
    let (child, port, drain) = serve_resp(&dir, &[("DEDUPD_RESP__AUTH_TIMEOUT", "1h")]);
    let addr = format!("127.0.0.1:{port}");
    // 64 idle sockets from one address (the default cap of connections
    // waiting to authenticate): each newer one evicts an older one.
    let mut strangers = Vec::new();
    for _ in 0..64 {
        let mut c = Raw::connect(&addr).await;
        assert_eq!(c.cmd("PING").await, b"-NOAUTH Authentication required.\r\n");
        strangers.push(c);
    }
    // A token holder connecting now is served (it was refused before:
    // the strangers held every place).
    for _ in 0..5 {
        still_serving(&addr).await;
    }
    // The oldest strangers were told why and closed; the newest still waits.
    let evicted =
        b"-ERR too many connections are waiting to authenticate: authenticate promptly\r\n";
    assert_eq!(strangers[0].reply().await.as_deref(), Some(&evicted[..]));
    assert_eq!(strangers[0].reply().await, None);
    assert!(stop(child, "-TERM", drain).await.success());
}

/// The server's resident memory, bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

#[tokio::test]
async fn a_pipeline_of_megabyte_replies_never_read_holds_a_batch_not_the_pipeline() {
    let dir = TempDir::new().unwrap();
    let (child, port, drain) = serve_resp(&dir, &[("DEDUPD_RESP__WRITE_TIMEOUT", "3s")]);
    let pid = child.id();
    let addr = format!("127.0.0.1:{port}");
    let mut c = Raw::connect(&addr).await;
    assert_eq!(c.cmd(&format!("AUTH {TOKEN}")).await, b"+OK\r\n");
    let set = [b"SET".to_vec(), b"big".to_vec(), vec![b'v'; 1 << 20]];
    assert_eq!(c.call(&set).await.unwrap(), b"+OK\r\n");
    let before = rss(pid);

    // 1,024 `SET big x NX GET`: each changes nothing and answers the old
    // megabyte. 41 KB in, a gibibyte of replies out, never read. Before,
    // all of them were encoded into one buffer (RSS past 1 GB; a 4 GB
    // memory cap aborted the process).
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut hog = socket.connect(addr.parse().unwrap()).await.unwrap();
    let mut pipeline = Raw::encode(&[b"AUTH".to_vec(), TOKEN.as_bytes().to_vec()]);
    let nx_get = Raw::encode(&[
        b"SET".to_vec(),
        b"big".to_vec(),
        b"x".to_vec(),
        b"NX".to_vec(),
        b"GET".to_vec(),
    ]);
    for _ in 0..1024 {
        pipeline.extend_from_slice(&nx_get);
    }
    hog.write_all(&pipeline).await.unwrap();
    // Until the server gives up on it (write_timeout), its memory is
    // sampled: a write into a connection the server closed fails.
    let mut most = before;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        most = most.max(rss(pid));
        if hog.write_all(b"\r\n").await.is_err() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the server never closed the connection"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        most < before + 64 * 1024 * 1024,
        "RSS grew from {before} to {most} bytes"
    );
    still_serving(&addr).await;
    assert!(stop(child, "-TERM", drain).await.success());
}
