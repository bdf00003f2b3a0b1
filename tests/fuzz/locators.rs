//! Field locators over arbitrary bodies, through ingest as a webhook meets
//! them (signature verified, body parsed as JSON, id, stream and
//! `created_at` read): nesting far past serde_json's recursion limit,
//! strings of 100 KB and of control characters, numbers out of range,
//! invalid UTF-8; and locators parsed from any text.

use dedupd::config::sources::SourceSettings;
use dedupd::domain::Key;
use dedupd::gateway::Source;
use dedupd::gateway::ingest::{IngestError, parse_event};
use dedupd::gateway::locate::{Found, Locator};
use dedupd::gateway::signature::{Scheme, sign};
use proptest::prelude::*;
use serde_json::Value;

use crate::{bounded, config, hostile_bytes, hostile_text, serial};

const SECRET: &str = "fuzz-signing-secret";
/// When every request is received and signed.
const NOW_MS: u64 = 1_800_000_000_000;

/// A Sume source reading the id, the stream and `created_at` from the body.
fn source() -> Source {
    let settings: SourceSettings = toml::from_str(
        "scheme = \"sume\"\n\
         event_id = \"body:/id\"\n\
         stream = \"body:/run\"\n\
         created_at = \"body:/at\"\n\
         forward_to = \"http://127.0.0.1:1/\"\n\
         destination_secret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n",
    )
    .unwrap();
    Source::build(
        "fuzz",
        &settings,
        &[SECRET.to_owned()],
        &["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_owned()],
    )
    .unwrap()
}

/// Ingests `body` signed as the provider would: Ok with the event, or the
/// error a client would get.
fn ingest(source: &Source, body: &[u8]) -> Result<dedupd::store::inbox::NewEvent, IngestError> {
    let ts = i64::try_from(NOW_MS / 1000).unwrap();
    let headers = sign(Scheme::Sume, SECRET, ts, "", body);
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    };
    parse_event(source, &header, body, NOW_MS)
}

/// JSON values of any shape, up to a few levels deep.
fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        hostile_text().prop_map(Value::String),
    ];
    leaf.prop_recursive(6, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof!["id", "run", "at", "[a-z]{0,3}", hostile_text()],
                inner,
                0..8
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Bodies: any JSON, JSON with the fields the source reads set to any
/// value, nesting of every depth, and bytes that are not JSON at all.
fn body() -> impl Strategy<Value = Vec<u8>> {
    let opener = prop::sample::select(vec!["[", "{\"id\":", "{\"a\":[", "[{\"run\":"]);
    prop_oneof![
        2 => json().prop_map(|v| v.to_string().into_bytes()),
        2 => (json(), json(), json()).prop_map(|(id, run, at)| {
            serde_json::json!({"id": id, "run": run, "at": at}).to_string().into_bytes()
        }),
        2 => (opener, 0usize..100_000, any::<bool>()).prop_map(|(open, depth, close)| {
            let mut body = open.repeat(depth);
            if close {
                body.push('1');
                let closer: String = open
                    .chars()
                    .rev()
                    .filter_map(|c| match c { '[' => Some(']'), '{' => Some('}'), _ => None })
                    .collect();
                body.push_str(&closer.repeat(depth));
            }
            body.into_bytes()
        }),
        1 => "[0-9]{1,20000}".prop_map(|n| format!("{{\"id\":\"x\",\"run\":{n}e{n}}}").into_bytes()),
        2 => hostile_bytes(),
    ]
}

/// Whatever the body, ingest answers: an event whose fields are what the
/// locators point at, or an error; never a panic, and nesting past
/// serde_json's limit (128) is a malformed body, not a deep recursion.
#[test]
fn ingest_answers_any_body() {
    let _serial = serial();
    let source = source();
    proptest!(config(), |(body in body())| {
        bounded(|| {
            let parsed: Option<Value> = serde_json::from_slice(&body).ok();
            match ingest(&source, &body) {
                Ok(event) => {
                    let v = parsed.as_ref().expect("accepted bodies are JSON");
                    prop_assert_eq!(Some(event.event_id.as_str()), v["id"].as_str());
                    prop_assert_eq!(&event.body, &body);
                }
                Err(IngestError::MalformedBody(_)) => prop_assert!(parsed.is_none()),
                Err(IngestError::Invalid(_)) => prop_assert!(parsed.is_some()),
                Err(IngestError::Signature(e)) => prop_assert!(false, "signed, yet {e}"),
            }
            Ok(())
        })?;
    });
}

/// An id is accepted exactly when it is a valid key: 1 to 512 bytes, no
/// control characters.
#[test]
fn an_event_id_is_taken_exactly_when_it_is_a_key() {
    let _serial = serial();
    let source = source();
    proptest!(config(), |(id in hostile_text())| {
        bounded(|| {
            let body = serde_json::json!({"id": id}).to_string();
            let result = ingest(&source, body.as_bytes());
            prop_assert_eq!(
                result.is_ok(),
                Key::parse(&id, "event_id").is_ok(),
                "{:?}",
                result.err()
            );
            Ok(())
        })?;
    });
}

/// Arrays nested this deep are past serde_json's recursion limit.
const JSON_DEPTH_LIMIT: usize = 128;

/// Nesting as deep as serde_json's recursion limit is refused as a
/// malformed body; nesting within it parses (and has no id where the
/// source reads one).
#[test]
fn nesting_is_bounded_by_the_json_parser() {
    let _serial = serial();
    let source = source();
    let depth = prop_oneof![
        Just(JSON_DEPTH_LIMIT - 1),
        Just(JSON_DEPTH_LIMIT),
        1usize..400
    ];
    proptest!(config(), |(depth in depth)| {
        bounded(|| {
            let body = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
            match ingest(&source, body.as_bytes()) {
                Err(IngestError::MalformedBody(e)) => {
                    prop_assert!(depth >= JSON_DEPTH_LIMIT, "{depth}: {e}");
                    prop_assert!(e.contains("recursion limit"), "{e}");
                }
                Err(IngestError::Invalid(e)) => {
                    prop_assert!(depth < JSON_DEPTH_LIMIT, "{depth}");
                    prop_assert_eq!(e.code, "missing_event_id");
                }
                other => prop_assert!(false, "{depth}: {:?}", other.map(|e| e.event_id)),
            }
            Ok(())
        })?;
    });
}

/// Locators parse from any text or say why not; one that parses prints as
/// text that parses to it again; and reading it from any body answers.
#[test]
fn locators_parse_from_any_text_and_read_any_body() {
    let _serial = serial();
    let raw = prop_oneof![
        hostile_text(),
        hostile_text().prop_map(|t| format!("body:{t}")),
        hostile_text().prop_map(|t| format!("header:{t}")),
        (
            prop::sample::select(vec!["/a", "/0", "/~0", "/~1", "/", "/-", "/id"]),
            0usize..20_000
        )
            .prop_map(|(seg, n)| format!("body:{}", seg.repeat(n))),
        // Joined fields: many, hostile, or joined with themselves.
        (
            prop::collection::vec(hostile_text(), 1..12),
            prop::sample::select(vec![" + ", "+", " +  "])
        )
            .prop_map(|(parts, sep)| parts
                .iter()
                .map(|p| format!("body:/{p}"))
                .collect::<Vec<_>>()
                .join(sep)),
    ];
    proptest!(config(), |(raw in raw, value in json())| {
        bounded(|| {
            if let Ok(locator) = Locator::parse(&raw) {
                prop_assert_eq!(Locator::parse(&locator.to_string()), Ok(locator.clone()));
                let header = |_: &str| Some("h");
                match locator.find(&header, Some(&value)) {
                    Found::Text(_) | Found::Other(_) | Found::Missing => {}
                    // A JSON array of the joined fields' texts.
                    Found::Joined(id) => {
                        let parts: Vec<String> = serde_json::from_str(&id).map_err(|e| {
                            TestCaseError::fail(format!("{id}: {e}"))
                        })?;
                        prop_assert!(matches!(&locator, Locator::Join(l) if l.len() == parts.len()));
                    }
                }
            }
            Ok(())
        })?;
    });
}
