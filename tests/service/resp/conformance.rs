//! The table of cases (`cases.rs`) against dedupd and, with the `redis`
//! feature, against a real redis-server: the same cases, the same expected
//! replies, compared byte for byte.

use dedupd::clock::ManualClock;
use redis_protocol::resp3::types::OwnedFrame;

use super::Raw;
use super::cases::Case;
use super::cases::Expect;
use super::cases::PASSWORD;
use super::cases::auth_cases;
use super::cases::cases;
use super::resp_addr;
use super::show;
use super::spawn_resp_app_at;
use super::system_now_ms;
use crate::support::app::with_tokens;
/// Expands the placeholders of one word (see `cases.rs`).
fn expand(word: &str, prefix: &str, now_ms: u64) -> Vec<u8> {
    let now_s = now_ms / 1000;
    match word {
        "{bin}" => [prefix.as_bytes(), b"k\x00\r\n \xff"].concat(),
        "{binval}" => (0..=255u8).collect(),
        "{empty}" => Vec::new(),
        "{long}" => vec![b'x'; 200],
        _ => word
            .replace("{k}", &format!("{prefix}k"))
            .replace("{k2}", &format!("{prefix}k2"))
            .replace("{k3}", &format!("{prefix}k3"))
            .replace("{past_s}", &(now_s - 100).to_string())
            .replace("{past_ms}", &(now_ms - 100_000).to_string())
            .replace("{future_s}", &(now_s + 1000).to_string())
            .replace("{future_ms}", &(now_ms + 1_000_000).to_string())
            .replace("{x128}", &"x".repeat(128))
            .into_bytes(),
    }
}

/// The integer of an integer reply.
fn int_of(reply: &[u8]) -> Option<i64> {
    std::str::from_utf8(reply.strip_prefix(b":")?.strip_suffix(b"\r\n")?)
        .ok()?
        .parse()
        .ok()
}

/// Checks HELLO's description: its keys, and `proto`.
fn is_hello(reply: &[u8], resp3: bool, proto: i64) -> bool {
    use redis_protocol::resp2::types::{OwnedFrame as F2, Resp2Frame};
    use redis_protocol::resp3::types::Resp3Frame;
    let keys = [
        "server", "version", "proto", "id", "mode", "role", "modules",
    ];
    let pairs: Vec<(String, Option<i64>)> = if resp3 {
        match redis_protocol::resp3::decode::complete::decode(reply) {
            Ok(Some((OwnedFrame::Map { data, .. }, _))) => data
                .into_iter()
                .map(|(k, v)| {
                    let n = match v {
                        OwnedFrame::Number { data, .. } => Some(data),
                        _ => None,
                    };
                    (k.as_str().unwrap_or_default().to_owned(), n)
                })
                .collect(),
            _ => return false,
        }
    } else {
        match redis_protocol::resp2::decode::decode(reply) {
            Ok(Some((F2::Array(items), _))) => items
                .chunks(2)
                .map(|kv| {
                    let n = match kv[1] {
                        F2::Integer(i) => Some(i),
                        _ => None,
                    };
                    (kv[0].as_str().unwrap_or_default().to_owned(), n)
                })
                .collect(),
            _ => return false,
        }
    };
    let mut names: Vec<&str> = pairs.iter().map(|(k, _)| k.as_str()).collect();
    let mut keys = keys.to_vec();
    names.sort_unstable();
    keys.sort_unstable();
    names == keys && pairs.contains(&("proto".to_owned(), Some(proto)))
}

/// Whether `reply` is what `expect` says, in the connection's protocol.
fn matches(expect: &Expect, reply: &[u8], resp3: bool, prefix: &str, now_ms: u64) -> bool {
    let bulk = |s: &[u8]| [format!("${}\r\n", s.len()).as_bytes(), s, b"\r\n"].concat();
    match expect {
        Expect::Ok => reply == b"+OK\r\n",
        Expect::Status(s) => reply == format!("+{s}\r\n").as_bytes(),
        Expect::Nil => {
            reply
                == if resp3 {
                    &b"_\r\n"[..]
                } else {
                    &b"$-1\r\n"[..]
                }
        }
        Expect::Int(n) => int_of(reply) == Some(*n),
        // The reference server's clock moves between a command and the TTL
        // read after it, by seconds on a loaded machine: the lower bound
        // gives 10 s (10,000 for ranges in milliseconds), still far from
        // any other TTL a case could confuse it with.
        Expect::IntIn(lo, hi) => {
            let slack = if *hi >= 10_000 { 10_000 } else { 10 };
            int_of(reply).is_some_and(|n| (lo - slack..=*hi).contains(&n))
        }
        Expect::AnyInt => int_of(reply).is_some(),
        Expect::Bulk(s) => reply == bulk(&expand(s, prefix, now_ms)),
        Expect::Err(s) => {
            let text = String::from_utf8(expand(s, prefix, now_ms)).unwrap();
            reply == format!("-{text}\r\n").as_bytes()
        }
        Expect::BulkContaining(s) => {
            (reply.starts_with(b"$") || reply.starts_with(b"="))
                && String::from_utf8_lossy(reply).contains(s)
        }
        Expect::Hello(proto) => is_hello(reply, resp3, *proto),
        Expect::MapOrArray => reply.starts_with(b"%") || reply.starts_with(b"*"),
        Expect::OkThenClosed => reply == b"+OK\r\n",
    }
}

/// Runs `cases` against the server at `addr`, each on its own connection
/// and keys; `clock` (dedupd's) is set to the system time before each
/// case, so times in commands mean the same to both servers. Cases newer
/// than `version` are skipped. Returns every mismatch.
pub async fn run(
    addr: &str,
    cases: &[Case],
    clock: Option<&ManualClock>,
    version: (u32, u32),
    password: Option<&str>,
) -> Vec<String> {
    let mut failures = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        if case.since > version || (clock.is_none() && case.dedupd_only) {
            continue;
        }
        let prefix = format!("c{i}:");
        let now_ms = system_now_ms();
        if let Some(c) = clock {
            c.set(now_ms);
        }
        let mut conn = Raw::connect(addr).await;
        for step in &case.steps {
            let args: Vec<Vec<u8>> = step
                .line
                .split(' ')
                .map(|w| expand(w, &prefix, now_ms))
                .collect();
            let line = step.line;
            let Some(reply) = conn.call(&args).await else {
                failures.push(format!("{}: `{line}`: connection closed", case.name));
                break;
            };
            if !matches(&step.expect, &reply, conn.resp3, &prefix, now_ms) {
                failures.push(format!(
                    "{}: `{line}`: expected {:?}, got {}",
                    case.name,
                    step.expect,
                    show(&reply)
                ));
            }
            if matches!(step.expect, Expect::OkThenClosed) && conn.reply().await.is_some() {
                failures.push(format!("{}: `{line}`: connection still open", case.name));
            }
        }
        // Cases share a server: the next starts from a clean keyspace.
        let mut cleanup = Raw::connect(addr).await;
        if let Some(p) = password {
            cleanup.cmd(&format!("AUTH {p}")).await;
        }
        let keys = ["{k}", "{k2}", "{k3}", "{bin}", "{empty}"];
        let mut del = vec![b"DEL".to_vec()];
        del.extend(keys.iter().map(|k| expand(k, &prefix, now_ms)));
        cleanup.call(&del).await;
    }
    failures
}

fn assert_none(failures: &[String], server: &str) {
    assert!(
        failures.is_empty(),
        "{} cell(s) differ from Redis on {server}:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[tokio::test]
async fn every_cell_answers_on_dedupd_as_redis_answers() {
    let app = spawn_resp_app_at(system_now_ms(), |_| {}).await;
    let failures = run(&resp_addr(&app), &cases(), Some(&app.clock), (99, 0), None).await;
    assert_none(&failures, "dedupd");
}

#[tokio::test]
async fn every_authentication_cell_answers_on_dedupd_as_redis_answers() {
    let app = spawn_resp_app_at(system_now_ms(), |l| with_tokens(l, &[PASSWORD])).await;
    let failures = run(
        &resp_addr(&app),
        &auth_cases(),
        Some(&app.clock),
        (99, 0),
        Some(PASSWORD),
    )
    .await;
    assert_none(&failures, "dedupd");
}

/// A real redis-server (one database, as dedupd has), its address and
/// version.
#[cfg(feature = "redis")]
async fn reference() -> (crate::support::redis::RedisServer, String, (u32, u32)) {
    let server = crate::support::redis::RedisServer::start_with(&["--databases", "1"]);
    let addr = format!("unix:{}", server.socket.display());
    let info = Raw::connect(&addr).await.cmd("INFO server").await;
    let info = String::from_utf8_lossy(&info).into_owned();
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .and_then(|v| {
            let mut n = v.trim().split('.').map(|p| p.parse::<u32>().ok());
            Some((n.next()??, n.next()??))
        })
        .expect("redis_version in INFO");
    (server, addr, version)
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn every_cell_answers_on_a_real_redis_server_as_the_table_says() {
    let (_server, addr, version) = reference().await;
    let failures = run(&addr, &cases(), None, version, None).await;
    assert_none(&failures, &format!("redis-server {version:?}"));
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn every_authentication_cell_answers_on_a_real_redis_server_as_the_table_says() {
    let (_server, addr, version) = reference().await;
    let set = Raw::connect(&addr)
        .await
        .cmd(&format!("CONFIG SET requirepass {PASSWORD}"))
        .await;
    assert_eq!(set, b"+OK\r\n");
    let failures = run(&addr, &auth_cases(), None, version, Some(PASSWORD)).await;
    assert_none(&failures, &format!("redis-server {version:?}"));
}
