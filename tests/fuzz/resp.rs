//! RESP requests: the frame parser over arbitrary and hostile bytes, cut
//! into arbitrary reads, and whole pipelines through a real connection.
//!
//! Never panics; never holds more of a request than its limits; every
//! request is either taken whole, refused, or waits for more bytes without
//! consuming any.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use dedupd::auth::ApiTokens;
use dedupd::clock::ManualClock;
use dedupd::config::Secret;
use dedupd::resp::Context;
use dedupd::resp::connection::{Ended, PREAUTH_LIMITS, REQUEST_LIMITS, RespOptions, serve};
use dedupd::resp::frame::{Limits, Parsed, parse};
use dedupd::store::redb::{RedbOptions, RedbStore};
use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{bounded, cases, config, config_with, serial};

/// One well-formed request of `words`.
fn encode(words: &[Vec<u8>]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", words.len()).into_bytes();
    for w in words {
        out.extend(format!("${}\r\n", w.len()).as_bytes());
        out.extend(w);
        out.extend(b"\r\n");
    }
    out
}

/// Bytes shaped like what an attacker sends: valid requests, requests with
/// one byte changed, deep nesting, huge declared counts and lengths, every
/// RESP3 type marker, and noise.
fn hostile() -> impl Strategy<Value = Vec<u8>> {
    let word = prop::collection::vec(any::<u8>(), 0..40);
    let request = prop::collection::vec(word, 0..6).prop_map(|w| encode(&w));
    let count = prop_oneof![
        Just(-1i64),
        0i64..10,
        Just(i64::from(u32::MAX)),
        Just(i64::MAX),
        any::<i64>(),
    ];
    prop_oneof![
        2 => prop::collection::vec(request.clone(), 1..6).prop_map(|r| r.concat()),
        2 => (request.clone(), any::<prop::sample::Index>(), any::<u8>()).prop_map(|(mut r, at, b)| {
            let i = at.index(r.len());
            r[i] = b;
            r
        }),
        1 => (1usize..30_000).prop_map(|depth| {
            let mut r = b"*1\r\n".repeat(depth);
            r.extend(b"$1\r\nx\r\n");
            r
        }),
        1 => (count.clone(), count).prop_map(|(n, len)| format!("*{n}\r\n${len}\r\nabc").into_bytes()),
        1 => (prop::sample::select(b"*$+-:_,#!=(%~|>".to_vec()), any::<u32>())
            .prop_map(|(marker, n)| format!("{}{n}\r\n", marker as char).into_bytes()),
        1 => prop::collection::vec(any::<u8>(), 0..512),
        1 => (1usize..200).prop_map(|n| vec![b'*'; n]),
    ]
}

/// Feeds `input` to the parser in reads of the sizes in `cuts` (cycled),
/// as a connection does, checking the parser's promises at every step.
fn feed(input: &[u8], cuts: &[usize], limits: Limits) -> Result<(), TestCaseError> {
    let mut buf = BytesMut::new();
    let mut at = 0;
    let mut cut = cuts.iter().cycle();
    loop {
        match parse(&mut buf, limits) {
            Ok(Parsed::Command(words)) => {
                prop_assert!(words.len() <= limits.max_args);
                let bytes: usize = words.iter().map(|w| w.len()).sum();
                prop_assert!(bytes <= limits.max_bytes);
            }
            Ok(Parsed::Incomplete { need }) => {
                prop_assert!(need >= 1);
                // What the connection holds of an unfinished request stays
                // within the request limit (plus one count line).
                prop_assert!(buf.len() <= limits.max_bytes + 64, "holds {}", buf.len());
                if at == input.len() {
                    return Ok(());
                }
                let n = (*cut.next().unwrap_or(&1)).clamp(1, input.len() - at);
                buf.extend_from_slice(&input[at..at + n]);
                at += n;
            }
            Err(e) => {
                prop_assert!(e.to_string().starts_with("Protocol error: "));
                return Ok(());
            }
        }
    }
}

#[test]
fn the_frame_parser_never_panics_and_holds_at_most_its_limit() {
    let _serial = serial();
    proptest!(config(), |(
        input in hostile(),
        cuts in prop::collection::vec(1usize..4096, 1..8),
        preauth in any::<bool>(),
    )| {
        let limits = if preauth { PREAUTH_LIMITS } else { Limits { max_args: 64, max_bytes: 2048 } };
        bounded(|| feed(&input, &cuts, limits))?;
    });
}

#[test]
fn a_request_cut_anywhere_parses_as_the_whole() {
    let _serial = serial();
    proptest!(config(), |(
        words in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..300), 1..8),
        cuts in prop::collection::vec(1usize..64, 1..8),
    )| {
        let request = encode(&words);
        let mut buf = BytesMut::new();
        let mut got = None;
        let mut at = 0;
        for n in cuts.iter().cycle() {
            match parse(&mut buf, REQUEST_LIMITS).map_err(|e| TestCaseError::fail(e.to_string()))? {
                Parsed::Command(w) => { got = Some(w); break; }
                Parsed::Incomplete { .. } => {
                    prop_assert!(at < request.len(), "incomplete with everything sent");
                    let n = (*n).min(request.len() - at);
                    buf.extend_from_slice(&request[at..at + n]);
                    at += n;
                }
            }
        }
        let got: Vec<Vec<u8>> = got.unwrap().iter().map(|w| w.to_vec()).collect();
        prop_assert_eq!(got, words);
        prop_assert!(buf.is_empty());
    });
}

/// A command of the listener's table with arguments that are sometimes
/// right and often not.
fn command() -> impl Strategy<Value = Vec<Vec<u8>>> {
    let name = prop::sample::select(vec![
        "GET", "SET", "DEL", "UNLINK", "EXISTS", "EXPIRE", "PEXPIRE", "PERSIST", "TTL", "PTTL",
        "PING", "ECHO", "HELLO", "AUTH", "SELECT", "CLIENT", "RESET", "COMMAND", "INFO", "NOPE",
    ]);
    let arg = prop_oneof![
        prop::sample::select(vec![
            "NX",
            "XX",
            "EX",
            "PX",
            "EXAT",
            "PXAT",
            "KEEPTTL",
            "GET",
            "0",
            "-1",
            "1",
            "9223372036854775807",
            "-9223372036854775808",
            "99999999999999999999",
            "3",
            "2",
            "AUTH",
            "default",
            "SETNAME",
            "ID",
            "GETNAME",
            "INFO",
            "DOCS",
            "COUNT",
            "k",
            "",
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
        prop::collection::vec(any::<u8>(), 0..24),
    ];
    (name, prop::collection::vec(arg, 0..6)).prop_map(|(name, mut args)| {
        args.insert(0, name.as_bytes().to_vec());
        args
    })
}

#[test]
fn pipelines_of_any_commands_are_answered_or_refused_never_a_panic() {
    // A store per case: a quarter of the cases.
    let _serial = serial();
    proptest!(config_with((cases() / 4).max(16)), |(
        pipeline in prop::collection::vec(command(), 1..24),
        tokens in any::<bool>(),
    )| {
        let dir = tempfile::tempdir().unwrap();
        let store = RedbStore::open(&RedbOptions::new(dir.path().join("f.redb"))).unwrap();
        let options = RespOptions {
            max_connections: 4,
            max_unauthenticated: 4,
            idle_timeout: Duration::from_secs(60),
            auth_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(10),
        };
        let tokens = if tokens {
            ApiTokens::new(&[Secret::new("fuzz-token-0123456789")])
        } else {
            ApiTokens::new(&[])
        };
        let ctx = Arc::new(Context::new(
            store.keyspace(),
            Arc::new(ManualClock::new(1_800_000_000_000)),
            tokens,
            6380,
            &options,
        ));
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap();
        let ended = rt.block_on(async {
            let (mut client, server) = tokio::io::duplex(1 << 20);
            let _slot = ctx.admit().unwrap();
            let (_stop_tx, stop) = tokio::sync::watch::channel(false);
            let task = tokio::spawn(serve(ctx.clone(), server, None, options, stop));
            let mut bytes: Vec<u8> = pipeline.iter().flat_map(|c| encode(c)).collect();
            bytes.extend(encode(&[b"QUIT".to_vec()]));
            client.write_all(&bytes).await.unwrap();
            let mut replies = Vec::new();
            let _ = client.read_to_end(&mut replies).await;
            tokio::time::timeout(Duration::from_secs(3600), task).await
        });
        let ended = ended.expect("the connection ends").expect("no panic");
        prop_assert!(
            matches!(ended, Ended::Closed | Ended::Protocol),
            "{:?}", ended
        );
        rt.block_on(store.close());
    });
}
