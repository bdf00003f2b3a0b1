//! Each signature scheme's header parsing and verification, over headers in
//! hostile shapes: a scheme's own headers with entries repeated thousands of
//! times, timestamps out of range, tags of any length, and anything at all.

use std::time::Duration;

use dedupd::gateway::signature::{Scheme, Verifier, sign};
use proptest::prelude::*;

use crate::{bounded, config, hostile_bytes, hostile_text, serial};

const SCHEMES: [Scheme; 11] = dedupd::domain::ALL_SCHEMES;

/// The headers each scheme reads (lowercased, as a lookup compares them).
const HEADERS: &[&str] = &[
    "x-sume-timestamp",
    "x-sume-signature",
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "stripe-signature",
    "x-hub-signature-256",
    "x-slack-request-timestamp",
    "x-slack-signature",
    "x-shopify-hmac-sha256",
    "paddle-signature",
    "svix-id",
    "svix-timestamp",
    "svix-signature",
    "x-square-hmacsha256-signature",
    "x-zm-request-timestamp",
    "x-zm-signature",
    "linear-signature",
];

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn verifier(scheme: Scheme) -> Verifier {
    Verifier::new(scheme, &[SECRET.to_owned()], Duration::from_secs(300)).unwrap()
}

/// A value shaped like one of the schemes' headers, with its parts chosen
/// from hostile shapes.
fn header_value() -> impl Strategy<Value = String> {
    let number = prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        "[0-9]{1,40}",
        Just("+1700000000".to_owned()),
        Just("-1".to_owned()),
        Just("".to_owned()),
    ];
    // Entries short enough that thousands of them make a long header (a
    // few hundred KB), not a large allocation of the generator's own.
    let tag = prop_oneof!["[0-9a-f]{0,130}", "[A-Za-z0-9+/=]{0,90}", "[ -~]{0,8}"];
    let entry = (
        prop::sample::select(vec![
            "v1=", "v1,", "v0=", "t=", "sha256=", "v1a,", "ts=", "h1=", "", "=",
        ]),
        tag,
    )
        .prop_map(|(k, v)| format!("{k}{v}"));
    prop_oneof![
        2 => hostile_text(),
        1 => number,
        1 => (prop::collection::vec(entry.clone(), 1..4), hostile_text())
            .prop_map(|(entries, tail)| entries.join(",") + &tail),
        2 => (prop::collection::vec(entry, 0..4), prop::sample::select(vec![",", " ", ", ", ";", ""]), 1usize..3_000)
            .prop_map(|(entries, sep, times)| {
                let one = entries.join(sep);
                [one.as_str()].repeat(times).join(sep)
            }),
    ]
}

/// Headers: each scheme header present or not, with a hostile value, and
/// some other names.
fn headers() -> impl Strategy<Value = Vec<(String, String)>> {
    prop::collection::vec(
        (
            prop_oneof![
                4 => prop::sample::select(HEADERS.to_vec()).prop_map(str::to_owned),
                1 => hostile_text(),
            ],
            header_value(),
        ),
        0..10,
    )
}

fn lookup<'h>(headers: &'h [(String, String)]) -> impl Fn(&str) -> Option<&'h str> + 'h {
    move |name| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

fn now() -> impl Strategy<Value = i64> {
    prop_oneof![
        Just(1_700_000_000i64),
        Just(i64::MIN),
        Just(i64::MAX),
        any::<i64>()
    ]
}

/// Whatever the headers, both checks answer; what the header check refuses,
/// verification refuses too (it is the same parse and window, plus the MAC).
#[test]
fn hostile_headers_are_answered_never_accepted() {
    let _serial = serial();
    proptest!(config(), |(headers in headers(), body in hostile_bytes(), now in now())| {
        bounded(|| {
            let header = lookup(&headers);
            for scheme in SCHEMES {
                let v = verifier(scheme);
                let checked = v.check_headers(&header, now);
                let verified = v.verify(&header, &body, now);
                prop_assert!(verified.is_err(), "{scheme:?} accepted forged headers {headers:?}");
                if checked.is_err() {
                    prop_assert!(verified.is_err());
                }
            }
            Ok(())
        })?;
    });
}

/// A request signed as the provider signs it verifies, whatever its body
/// (any bytes, 100 KB of one byte) and timestamp, inside the window; and
/// fails once its body differs by one byte.
#[test]
fn genuine_signatures_verify_over_any_body() {
    let _serial = serial();
    proptest!(config(), |(
        body in hostile_bytes(),
        id in "[!-~]{1,64}",
        ts in 0i64..4_000_000_000,
        skew in -300i64..=300,
        flip in any::<prop::sample::Index>(),
    )| {
        bounded(|| {
            for scheme in SCHEMES {
                // Linear signs its timestamp inside the body: a JSON
                // envelope around the bytes.
                let body = if scheme == Scheme::Linear {
                    serde_json::to_vec(&serde_json::json!({
                        "webhookTimestamp": ts * 1000,
                        "data": String::from_utf8_lossy(&body),
                    }))
                    .unwrap()
                } else {
                    body.clone()
                };
                let signed: Vec<(String, String)> = sign(scheme, SECRET, ts, &id, &body)
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), v))
                    .collect();
                let v = verifier(scheme);
                let header = lookup(&signed);
                prop_assert_eq!(v.check_headers(&header, ts + skew), Ok(()), "{:?}", scheme);
                prop_assert_eq!(v.verify(&header, &body, ts + skew), Ok(()), "{:?}", scheme);
                if !body.is_empty() {
                    let mut other = body.clone();
                    other[flip.index(body.len())] ^= 1;
                    prop_assert!(v.verify(&header, &other, ts + skew).is_err(), "{:?}", scheme);
                }
            }
            Ok(())
        })?;
    });
}
