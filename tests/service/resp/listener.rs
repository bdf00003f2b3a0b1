//! The listener: expiry by the clock and the reaper, pipelining, limits,
//! idle connections, protocol errors, sizes, restarts, settings.

use std::time::Duration;

use super::Raw;
use super::resp_addr;
use super::spawn_resp_app;
use super::spawn_resp_app_at;
use crate::support::app::T0;
#[tokio::test]
async fn a_key_reads_as_absent_from_its_expiry_on_and_the_reaper_then_removes_it() {
    let app = spawn_resp_app().await;
    let mut c = Raw::connect(&resp_addr(&app)).await;
    assert_eq!(
        c.cmd("SET sume:wh:req_1 processing NX EX 300").await,
        b"+OK\r\n"
    );
    assert_eq!(c.cmd("SET forever v").await, b"+OK\r\n");
    app.clock.advance(Duration::from_millis(299_999));
    assert_eq!(c.cmd("PTTL sume:wh:req_1").await, b":1\r\n");
    assert_eq!(
        c.cmd("SET sume:wh:req_1 processing NX EX 300").await,
        b"$-1\r\n"
    );
    // Nothing has reaped it yet: it is absent by the clock alone.
    app.clock.advance(Duration::from_millis(1));
    assert_eq!(c.cmd("GET sume:wh:req_1").await, b"$-1\r\n");
    assert_eq!(c.cmd("EXISTS sume:wh:req_1").await, b":0\r\n");
    assert_eq!(c.cmd("TTL sume:wh:req_1").await, b":-2\r\n");
    assert_eq!(c.cmd("EXPIRE sume:wh:req_1 10").await, b":0\r\n");
    assert_eq!(c.cmd("PERSIST sume:wh:req_1").await, b":0\r\n");
    assert_eq!(c.cmd("DEL sume:wh:req_1").await, b":0\r\n");
    assert_eq!(c.cmd("SET sume:wh:req_2 v PX 10").await, b"+OK\r\n");
    app.clock.advance(Duration::from_millis(10));

    let now = T0 + 300_010;
    // The DEL above removed req_1's expired row already (answering 0, as
    // Redis does): req_2 is left for the reaper.
    let report = app.store.purge_expired(now, 100).await.unwrap();
    assert_eq!(report.kv, 1, "{report:?}");
    assert_eq!(app.store.next_expiry().await.unwrap(), None);
    assert_eq!(app.store.purge_expired(now, 100).await.unwrap().kv, 0);
    assert_eq!(c.cmd("GET forever").await, b"$1\r\nv\r\n");
    // A claim after the reap starts afresh.
    assert_eq!(
        c.cmd("SET sume:wh:req_1 processing NX EX 300").await,
        b"+OK\r\n"
    );
}

#[tokio::test]
async fn the_reaper_removes_keys_in_bounded_batches_and_only_expired_ones() {
    let app = spawn_resp_app().await;
    let mut c = Raw::connect(&resp_addr(&app)).await;
    for i in 0..25 {
        c.cmd(&format!("SET k{i} v PX {}", 1000 + i)).await;
    }
    c.cmd("SET k-late v EX 3600").await;
    // k0 was set again later: its first expiry must not remove it.
    c.cmd("PEXPIRE k0 7200000").await;
    let now = T0 + 2000;
    let first = app.store.purge_expired(now, 10).await.unwrap();
    assert_eq!((first.kv, first.more), (10, true));
    let second = app.store.purge_expired(now, 100).await.unwrap();
    assert_eq!((second.kv, second.more), (14, false));
    assert_eq!(c.cmd("EXISTS k0 k-late k1 k24").await, b":2\r\n");
    assert_eq!(app.store.next_expiry().await.unwrap(), Some(T0 + 3_600_000));
}

#[tokio::test]
async fn pipelined_commands_are_answered_in_order_and_see_the_writes_before_them() {
    let app = spawn_resp_app().await;
    let mut c = Raw::connect(&resp_addr(&app)).await;
    let mut batch = Vec::new();
    let mut expected: Vec<Vec<u8>> = Vec::new();
    for i in 0..50 {
        let words = |line: String| -> Vec<Vec<u8>> {
            line.split(' ').map(|w| w.as_bytes().to_vec()).collect()
        };
        batch.extend(Raw::encode(&words(format!("SET p{i} v{i} NX EX 300"))));
        expected.push(b"+OK\r\n".to_vec());
        batch.extend(Raw::encode(&words(format!("SET p{i} again NX"))));
        expected.push(b"$-1\r\n".to_vec());
        batch.extend(Raw::encode(&words(format!("GET p{i}"))));
        expected.push(format!("${}\r\nv{i}\r\n", format!("v{i}").len()).into_bytes());
        batch.extend(Raw::encode(&words(format!("DEL p{i} p{i}"))));
        expected.push(b":1\r\n".to_vec());
        batch.extend(Raw::encode(&words("NOPE".into())));
        expected.push(b"-ERR unknown command 'NOPE', with args beginning with: \r\n".to_vec());
        batch.extend(Raw::encode(&words(format!("EXISTS p{i}"))));
        expected.push(b":0\r\n".to_vec());
    }
    c.send_raw(&batch).await;
    for (i, want) in expected.iter().enumerate() {
        let got = c.reply().await.expect("reply");
        assert_eq!(
            super::show(&got),
            super::show(want),
            "reply {i} of the pipeline"
        );
    }
}

#[tokio::test]
async fn connections_over_the_limit_get_redis_error_and_a_freed_slot_serves_again() {
    let app = spawn_resp_app_at(T0, |l| l.settings.resp.max_connections = 2).await;
    let addr = resp_addr(&app);
    let mut a = Raw::connect(&addr).await;
    let mut b = Raw::connect(&addr).await;
    assert_eq!(a.cmd("PING").await, b"+PONG\r\n");
    assert_eq!(b.cmd("PING").await, b"+PONG\r\n");
    let mut over = Raw::connect(&addr).await;
    assert_eq!(
        over.reply().await.as_deref(),
        Some(&b"-ERR max number of clients reached\r\n"[..])
    );
    assert_eq!(over.reply().await, None, "closed after the error");
    assert_eq!(a.cmd("QUIT").await, b"+OK\r\n");
    assert_eq!(a.reply().await, None);
    // The slot frees once the server has closed its side.
    let mut served = false;
    for _ in 0..200 {
        let mut c = Raw::connect(&addr).await;
        c.send(&[b"PING".to_vec()]).await;
        if c.reply().await.as_deref() == Some(&b"+PONG\r\n"[..]) {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(served, "a connection after one closed is served");
}

#[tokio::test]
async fn an_idle_connection_is_closed() {
    let app = spawn_resp_app_at(T0, |l| {
        l.settings.resp.idle_timeout = Duration::from_millis(300);
    })
    .await;
    let mut idle = Raw::connect(&resp_addr(&app)).await;
    assert_eq!(idle.cmd("PING").await, b"+PONG\r\n");
    // The server closes it: the read ends (Raw gives up after 30 s).
    assert_eq!(idle.reply().await, None);
}

#[tokio::test]
async fn a_request_that_is_not_resp_gets_a_protocol_error_and_the_connection_closes() {
    let app = spawn_resp_app().await;
    let addr = resp_addr(&app);
    for bad in [&b"*1\r\n:5\r\n"[..], b"+PING\r\n", b"*1\r\n$x\r\n"] {
        let mut c = Raw::connect(&addr).await;
        assert_eq!(c.cmd("SET before v").await, b"+OK\r\n");
        c.send_raw(bad).await;
        let reply = c.reply().await.expect("an error first");
        assert!(
            reply.starts_with(b"-ERR Protocol error"),
            "{}",
            super::show(&reply)
        );
        assert_eq!(c.reply().await, None, "then closed");
    }
    let mut c = Raw::connect(&addr).await;
    assert_eq!(c.cmd("GET before").await, b"$1\r\nv\r\n");
}

#[tokio::test]
async fn keys_and_values_over_the_limits_are_refused_and_change_nothing() {
    let app = spawn_resp_app().await;
    let mut c = Raw::connect(&resp_addr(&app)).await;
    let key = vec![b'k'; 4096];
    let value = vec![b'v'; 1024 * 1024];
    let set = |k: &[u8], v: &[u8]| vec![b"SET".to_vec(), k.to_vec(), v.to_vec()];
    assert_eq!(c.call(&set(&key, &value)).await.unwrap(), b"+OK\r\n");
    let got = c.call(&[b"GET".to_vec(), key.clone()]).await.unwrap();
    assert_eq!(got.len(), "$1048576\r\n".len() + value.len() + 2);

    let long_key = vec![b'k'; 4097];
    let reply = c.call(&set(&long_key, b"v")).await.unwrap();
    assert_eq!(
        super::show(&reply),
        "-ERR key is too long: dedupd stores keys of at most 4096 bytes\\r\\n"
    );
    let big = vec![b'v'; 1024 * 1024 + 1];
    let reply = c.call(&set(b"big", &big)).await.unwrap();
    assert_eq!(
        super::show(&reply),
        "-ERR value is too large: dedupd stores values of at most 1048576 bytes\\r\\n"
    );
    assert_eq!(c.cmd("EXISTS big").await, b":0\r\n");
    let mut exists = vec![b"EXISTS".to_vec(), long_key];
    exists.push(key);
    assert_eq!(c.call(&exists).await.unwrap(), b":1\r\n");
}

#[tokio::test]
async fn a_request_larger_than_any_command_closes_the_connection() {
    let app = spawn_resp_app().await;
    let mut c = Raw::connect(&resp_addr(&app)).await;
    let mut request = b"*3\r\n$3\r\nSET\r\n$4\r\nhuge\r\n$8000000\r\n".to_vec();
    request.extend(vec![b'v'; 2 * 1024 * 1024]);
    c.send_raw(&request).await;
    let reply = c.reply().await.expect("an error");
    assert!(
        String::from_utf8_lossy(&reply).starts_with("-ERR Protocol error: a request of more than"),
        "{}",
        super::show(&reply)
    );
    assert_eq!(c.reply().await, None);
}

#[tokio::test]
async fn keys_and_their_expiries_survive_a_restart() {
    let app = spawn_resp_app().await;
    let mut c = Raw::connect(&resp_addr(&app)).await;
    c.cmd("SET sume:wh:a done EX 86400").await;
    c.cmd("SET plain v").await;
    c.cmd("SET gone v").await;
    c.cmd("DEL gone").await;
    drop(c);
    let app = app.restart().await;
    let mut c = Raw::connect(&resp_addr(&app)).await;
    assert_eq!(c.cmd("GET sume:wh:a").await, b"$4\r\ndone\r\n");
    assert_eq!(c.cmd("TTL sume:wh:a").await, b":86400\r\n");
    assert_eq!(c.cmd("TTL plain").await, b":-1\r\n");
    assert_eq!(c.cmd("EXISTS gone").await, b":0\r\n");
}

#[tokio::test]
async fn without_the_setting_there_is_no_listener() {
    let app = crate::support::app::spawn_app().await;
    assert_eq!(app.resp_port, None);
}

#[test]
fn check_config_refuses_resp_with_the_redis_backend_and_beyond_loopback_without_tokens() {
    let out = crate::support::process::dedupd()
        .arg("check-config")
        .env("DEDUPD_RESP__LISTEN", "127.0.0.1:6380")
        .env("DEDUPD_STORAGE__BACKEND", "redis")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("resp.listen"), "{stderr}");
    assert!(
        stderr.contains("point your Redis clients at it directly"),
        "{stderr}"
    );
    assert!(stderr.contains("DEDUPD_RESP__LISTEN"), "{stderr}");

    let out = crate::support::process::dedupd()
        .arg("check-config")
        .env("DEDUPD_RESP__LISTEN", "0.0.0.0:6380")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("resp.listen"), "{stderr}");
    assert!(stderr.contains("without API tokens"), "{stderr}");

    let out = crate::support::process::dedupd()
        .arg("check-config")
        .env("DEDUPD_RESP__LISTEN", "0.0.0.0:6380")
        .env("DEDUPD_API__TOKENS", "[\"resp-token-0123456789\"]")
        .env("DEDUPD_RESP__IDLE_TIMEOUT", "90s")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("[resp]"), "{stdout}");
    assert!(stdout.contains("listen = \"0.0.0.0:6380\""), "{stdout}");
    assert!(stdout.contains("idle_timeout = \"1m 30s\""), "{stdout}");

    let out = crate::support::process::dedupd()
        .arg("check-config")
        .env("DEDUPD_RESP__MAX_CONNECTIONS", "0")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("resp.max_connections"));
}
