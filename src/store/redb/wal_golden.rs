//! The encoding of every logged request, pinned.
//!
//! A write-ahead log record is the postcard encoding of a [`Batch`] of
//! [`Request`]s, and postcard writes no field names and no type tags: a
//! reordered field, a changed type, or a variant moved or added changes
//! what the bytes mean without changing the log's header. A log written by
//! the build before such a change would then be misread, or refused, after
//! an upgrade. So one sample of every request shape is encoded here exactly
//! as the log encodes it and compared with `tests/golden/requests-format-N.hex`
//! (N = [`FORMAT`]), which is written once per format and never edited.
//!
//! The samples are exhaustive, and stay so:
//! - [`shape`] destructures every request, field by field (no `..`), with an
//!   exhaustive `match` on every enum in it: a new variant or field does not
//!   compile until it is handled there;
//! - the test counts each enum's variants from its decoder (postcard
//!   refuses a variant index past the last) and fails until the samples
//!   cover every one, and every optional field both set and unset.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::record::{InboxRequest, Lent, Request, SealedRow};
use super::wal::{self, DECODES, FORMAT};
use crate::clock::Millis;
use crate::domain::{ClaimResult, CreatedAt, Fingerprint, Key, Namespace, ScopedKey, Token, Ttl};
use crate::store::inbox::{Attempt, NewEvent, Retention, Settle};
use crate::store::keyspace::{ExpireCondition, KvRequest, SetCondition, SetExpiry};

/// Every sample is logged as batch `SEQ` at clock reading `NOW`.
const SEQ: u64 = 1;
const NOW: Millis = 1_800_000_000_123;
/// Set to write the golden file of a format that has none yet.
const WRITE_ENV: &str = "DEDUPD_WRITE_GOLDEN";

fn api(k: &str) -> ScopedKey {
    ScopedKey::api(&Key::parse(k, "key").expect("a valid key"))
}

fn gateway(source: &str, k: &str) -> ScopedKey {
    ScopedKey::new(
        &Namespace::Gateway(source.to_owned()),
        &Key::parse(k, "key").expect("a valid key"),
    )
}

fn token(b: u8) -> Token {
    Token::from_bytes([b; 16])
}

fn retention() -> Retention {
    Retention {
        delivered_ms: 604_800_000,
        dead_ms: 2_592_000_000,
    }
}

fn settle(settle: Settle) -> InboxRequest {
    InboxRequest::Settle {
        source: "sume".into(),
        event_id: "evt_1".into(),
        lease: 3,
        settle,
        retention: retention(),
    }
}

fn settle_attempt(settle: Settle, status: Option<u16>, error: Option<&str>) -> InboxRequest {
    InboxRequest::SettleAttempt {
        source: "sume".into(),
        event_id: "evt_1".into(),
        lease: 4,
        settle,
        attempt: Attempt {
            attempt: 2,
            at_ms: 1_800_000_001_500,
            status,
            latency_us: 12_345,
            error: error.map(str::to_owned),
        },
        retention: retention(),
    }
}

fn expire(condition: ExpireCondition) -> Request {
    Request::Kv(KvRequest::Expire {
        key: b"k".to_vec(),
        at: 1_800_000_060_000,
        condition,
    })
}

/// One sample of each request shape. Values are arbitrary but fixed, and
/// not all zero, so a change of integer width or signedness shows.
fn samples() -> Vec<Request> {
    let created_at = CreatedAt::from_unix_nanos(1_799_999_000_123_456_789);
    vec![
        Request::Claim {
            key: api("order-1"),
            ttl: Ttl::from_ms_unchecked(300_000),
            fingerprint: Some(Fingerprint::parse("sha256:abc123").expect("a fingerprint")),
            token: token(0xA1),
        },
        Request::Claim {
            key: api("order-2"),
            ttl: Ttl::from_ms_unchecked(300_000),
            fingerprint: None,
            token: token(0xA2),
        },
        Request::Done {
            key: api("order-1"),
            token: token(0xA1),
            ttl: Ttl::from_ms_unchecked(86_400_000),
        },
        Request::DoneResult {
            key: api("order-3"),
            token: token(0xA3),
            ttl: Ttl::from_ms_unchecked(86_400_000),
            result: ClaimResult::from_stored(r#"{"charge":"ch_1","amount":1250}"#)
                .expect("a result"),
        },
        Request::Release {
            key: api("order-2"),
            token: token(0xA2),
        },
        Request::Extend {
            key: api("order-1"),
            token: token(0xA1),
            ttl: Ttl::from_ms_unchecked(600_000),
        },
        Request::Apply {
            stream: api("run-9"),
            event_id: api("evt-7"),
            created_at,
            retention_ms: 2_592_000_000,
        },
        Request::Purge { limit: 1000 },
        Request::PurgeExpired {
            limit: 100,
            dedupe_window_ms: 2_592_000_000,
        },
        Request::Inbox(InboxRequest::Insert(NewEvent {
            source: "sume".into(),
            event_id: "evt_1".into(),
            stream: Some("run_9".into()),
            created_at,
            received_at_ms: 1_800_000_000_000,
            headers: vec![("content-type".into(), "application/json".into())],
            body: br#"{"request_id":"evt_1"}"#.to_vec(),
        })),
        Request::Inbox(InboxRequest::Insert(NewEvent {
            source: "gh".into(),
            event_id: "evt_2".into(),
            stream: None,
            created_at: CreatedAt::from_unix_nanos(-1),
            received_at_ms: 1_800_000_000_001,
            headers: Vec::new(),
            body: vec![0, 0xFF, b'\n'],
        })),
        Request::Inbox(InboxRequest::InsertRouted {
            event: Box::new(NewEvent {
                source: "sume".into(),
                event_id: "evt_3".into(),
                stream: Some("run_9".into()),
                created_at,
                received_at_ms: 1_800_000_000_002,
                headers: vec![("content-type".into(), "application/json".into())],
                body: br#"{"request_id":"evt_3","type":"run.updated"}"#.to_vec(),
            }),
            lanes: vec!["sume.runs".into(), "sume".into()],
            known_in: vec!["sume".into(), "sume.runs".into(), "sume.billing".into()],
            filtered_ms: 604_800_000,
        }),
        Request::Inbox(InboxRequest::InsertRouted {
            event: Box::new(NewEvent {
                source: "sume".into(),
                event_id: "evt_4".into(),
                stream: None,
                created_at,
                received_at_ms: 1_800_000_000_003,
                headers: Vec::new(),
                body: br#"{"request_id":"evt_4","type":"user.created"}"#.to_vec(),
            }),
            lanes: Vec::new(),
            known_in: vec!["sume.runs".into()],
            filtered_ms: 604_800_000,
        }),
        Request::Inbox(InboxRequest::InsertSealed {
            event: Box::new(NewEvent {
                source: "sume".into(),
                event_id: "evt_5".into(),
                stream: Some("run_9".into()),
                created_at,
                received_at_ms: 1_800_000_000_004,
                headers: Vec::new(),
                body: Vec::new(),
            }),
            body_bytes: 43,
            rows: vec![
                SealedRow {
                    lane: "sume.runs".into(),
                    slot: 7,
                    seal: b"DDSEAL1\0 a seal of evt_5 for sume.runs".to_vec(),
                },
                SealedRow {
                    lane: "sume.billing".into(),
                    slot: 1_000_001,
                    seal: b"DDSEAL1\0 a seal of evt_5 for sume.billing".to_vec(),
                },
            ],
            known_in: vec!["sume".into(), "sume.runs".into()],
            filtered_ms: None,
            lent: Lent::default(),
        }),
        Request::Inbox(InboxRequest::InsertSealed {
            event: Box::new(NewEvent {
                source: "gh".into(),
                event_id: "evt_6".into(),
                stream: None,
                created_at: CreatedAt::from_unix_nanos(-2),
                received_at_ms: 1_800_000_000_005,
                headers: Vec::new(),
                body: Vec::new(),
            }),
            body_bytes: 3,
            rows: vec![SealedRow {
                lane: "gh".into(),
                slot: 0,
                seal: b"DDSEAL1\0 a seal of evt_6".to_vec(),
            }],
            known_in: Vec::new(),
            filtered_ms: Some(604_800_000),
            lent: Lent::default(),
        }),
        Request::Inbox(InboxRequest::Lease {
            events: vec![
                ("sume".into(), "evt_1".into(), 1_800_000_030_000),
                ("gh".into(), "evt_2".into(), 1_800_000_030_001),
            ],
            stale_check: Some(retention()),
        }),
        Request::Inbox(InboxRequest::Lease {
            events: Vec::new(),
            stale_check: None,
        }),
        Request::Inbox(settle(Settle::Delivered { attempted: true })),
        Request::Inbox(settle(Settle::Delivered { attempted: false })),
        Request::Inbox(settle(Settle::Stale)),
        Request::Inbox(settle(Settle::Retry {
            retry_at: 1_800_000_002_000,
            error: "HTTP 503".into(),
            attempted: true,
        })),
        Request::Inbox(settle(Settle::Retry {
            retry_at: 1_800_000_002_001,
            error: "source paused".into(),
            attempted: false,
        })),
        Request::Inbox(settle(Settle::Dead {
            error: "HTTP 410".into(),
        })),
        Request::Inbox(InboxRequest::Redeliver {
            source: "sume".into(),
            event_id: "evt_1".into(),
        }),
        Request::Delivered {
            apply: Some((
                gateway("sume", "run_9"),
                gateway("sume", "evt_1"),
                created_at,
                604_800_000,
            )),
            settle: Box::new(settle(Settle::Delivered { attempted: true })),
        },
        Request::Delivered {
            apply: None,
            settle: Box::new(settle(Settle::Delivered { attempted: true })),
        },
        Request::Inbox(settle_attempt(
            Settle::Retry {
                retry_at: 1_800_000_003_000,
                error: "HTTP 503".into(),
                attempted: true,
            },
            Some(503),
            Some("HTTP 503"),
        )),
        Request::Inbox(settle_attempt(
            Settle::Dead {
                error: "no answer within 10s".into(),
            },
            None,
            Some("no answer within 10s"),
        )),
        Request::Delivered {
            apply: Some((
                gateway("sume", "run_9"),
                gateway("sume", "evt_1"),
                created_at,
                604_800_000,
            )),
            settle: Box::new(settle_attempt(
                Settle::Delivered { attempted: true },
                Some(204),
                None,
            )),
        },
        Request::PurgePending {
            sources: vec!["old".into(), "older".into()],
            before: 1_799_000_000_000,
            limit: 500,
        },
        Request::Kv(KvRequest::Set {
            key: b"k".to_vec(),
            value: b"v\x00\xff".to_vec(),
            condition: SetCondition::Always,
            expiry: SetExpiry::Clear,
            get: false,
        }),
        Request::Kv(KvRequest::Set {
            key: b"k".to_vec(),
            value: b"v2".to_vec(),
            condition: SetCondition::IfAbsent,
            expiry: SetExpiry::At(1_800_000_060_000),
            get: true,
        }),
        Request::Kv(KvRequest::Set {
            key: b"k".to_vec(),
            value: Vec::new(),
            condition: SetCondition::IfPresent,
            expiry: SetExpiry::Keep,
            get: false,
        }),
        Request::Kv(KvRequest::Delete {
            keys: vec![b"a".to_vec(), b"b".to_vec()],
        }),
        expire(ExpireCondition::Always),
        expire(ExpireCondition::IfNone),
        expire(ExpireCondition::IfSome),
        expire(ExpireCondition::Later),
        expire(ExpireCondition::Earlier),
        expire(ExpireCondition::SomeAndEarlier),
        Request::Kv(KvRequest::Persist { key: b"k".to_vec() }),
        Request::Inbox(InboxRequest::Replay {
            source: "sume".into(),
            event_id: "evt_1".into(),
            job: "job_00c0ffee00c0ffee".into(),
        }),
        Request::Inbox(InboxRequest::Erase {
            source: "sume".into(),
            event_id: "evt_1".into(),
            retention_ms: 2_592_000_000,
        }),
        Request::Inbox(InboxRequest::PutJob {
            id: "job_00c0ffee00c0ffee".into(),
            record: b"{\"kind\":\"redeliver\"}".to_vec(),
            lent: Default::default(),
        }),
        Request::Inbox(InboxRequest::CancelJob {
            id: "job_00c0ffee00c0ffee".into(),
        }),
        Request::Inbox(InboxRequest::DeleteJob {
            id: "job_00c0ffee00c0ffee".into(),
        }),
    ]
}

/// What the samples cover: per enum, the variant indexes seen; per
/// optional (or boolean) field, the states seen.
#[derive(Debug, Default)]
struct Coverage {
    variants: BTreeMap<&'static str, BTreeSet<u8>>,
    states: BTreeMap<&'static str, BTreeSet<bool>>,
}

impl Coverage {
    /// Records `value`'s variant of enum `name` (its index as postcard
    /// writes it: the first byte, for an enum of fewer than 128 variants).
    fn variant<T: Serialize>(&mut self, name: &'static str, value: &T) -> u8 {
        let index = postcard::to_stdvec(value).expect("encodes")[0];
        assert!(index < 0x80, "{name}: more than 127 variants");
        self.variants.entry(name).or_default().insert(index);
        index
    }

    /// Records whether `field` is set (or true) in a sample.
    fn state(&mut self, field: &'static str, set: bool) -> &'static str {
        self.states.entry(field).or_default().insert(set);
        if set { "+" } else { "-" }
    }
}

/// A sample's name (its path through the enums, and its optional fields'
/// states), recording what it covers. Exhaustive on purpose: see the
/// module doc.
fn shape(req: &Request, cov: &mut Coverage) -> String {
    cov.variant("Request", req);
    match req {
        Request::Claim {
            key: _,
            ttl: _,
            fingerprint,
            token: _,
        } => format!(
            "claim{}fingerprint",
            cov.state("Claim.fingerprint", fingerprint.is_some())
        ),
        Request::Done {
            key: _,
            token: _,
            ttl: _,
        } => "done".into(),
        Request::DoneResult {
            key: _,
            token: _,
            ttl: _,
            result: _,
        } => "done_result".into(),
        Request::Release { key: _, token: _ } => "release".into(),
        Request::Extend {
            key: _,
            token: _,
            ttl: _,
        } => "extend".into(),
        Request::Apply {
            stream: _,
            event_id: _,
            created_at: _,
            retention_ms: _,
        } => "apply".into(),
        Request::Purge { limit: _ } => "purge".into(),
        Request::PurgeExpired {
            limit: _,
            dedupe_window_ms: _,
        } => "purge_expired".into(),
        Request::Inbox(inbox) => format!("inbox.{}", inbox_shape(inbox, cov)),
        Request::Delivered { apply, settle } => format!(
            "delivered{}apply.{}",
            cov.state("Delivered.apply", apply.is_some()),
            inbox_shape(settle, cov)
        ),
        Request::PurgePending {
            sources: _,
            before: _,
            limit: _,
        } => "purge_pending".into(),
        Request::Kv(kv) => format!("kv.{}", kv_shape(kv, cov)),
    }
}

fn inbox_shape(req: &InboxRequest, cov: &mut Coverage) -> String {
    cov.variant("InboxRequest", req);
    match req {
        InboxRequest::Insert(NewEvent {
            source: _,
            event_id: _,
            stream,
            created_at: _,
            received_at_ms: _,
            headers,
            body: _,
        }) => format!(
            "insert{}stream{}headers",
            cov.state("NewEvent.stream", stream.is_some()),
            cov.state("NewEvent.headers", !headers.is_empty())
        ),
        InboxRequest::Lease {
            events,
            stale_check,
        } => {
            cov.state("Lease.events", !events.is_empty());
            format!(
                "lease{}stale_check",
                cov.state("Lease.stale_check", stale_check.is_some())
            )
        }
        InboxRequest::Settle {
            source: _,
            event_id: _,
            lease: _,
            settle,
            retention:
                Retention {
                    delivered_ms: _,
                    dead_ms: _,
                },
        } => format!("settle.{}", settle_shape(settle, cov)),
        InboxRequest::SettleAttempt {
            source: _,
            event_id: _,
            lease: _,
            settle,
            attempt:
                Attempt {
                    attempt: _,
                    at_ms: _,
                    status,
                    latency_us: _,
                    error,
                },
            retention:
                Retention {
                    delivered_ms: _,
                    dead_ms: _,
                },
        } => format!(
            "settle_attempt.{}{}status{}error",
            settle_shape(settle, cov),
            cov.state("Attempt.status", status.is_some()),
            cov.state("Attempt.error", error.is_some())
        ),
        InboxRequest::Redeliver {
            source: _,
            event_id: _,
        } => "redeliver".into(),
        InboxRequest::Replay {
            source: _,
            event_id: _,
            job: _,
        } => "replay".into(),
        InboxRequest::Erase {
            source: _,
            event_id: _,
            retention_ms: _,
        } => "erase".into(),
        InboxRequest::PutJob {
            id: _,
            record: _,
            lent: _,
        } => "put_job".into(),
        InboxRequest::CancelJob { id: _ } => "cancel_job".into(),
        InboxRequest::DeleteJob { id: _ } => "delete_job".into(),
        InboxRequest::InsertRouted {
            event,
            lanes,
            known_in: _,
            filtered_ms: _,
        } => {
            let NewEvent {
                source: _,
                event_id: _,
                stream,
                created_at: _,
                received_at_ms: _,
                headers: _,
                body: _,
            } = &**event;
            format!(
                "insert_routed{}stream{}lanes",
                cov.state("InsertRouted.event.stream", stream.is_some()),
                cov.state("InsertRouted.lanes", !lanes.is_empty())
            )
        }
        InboxRequest::InsertSealed {
            event,
            body_bytes: _,
            rows,
            known_in: _,
            filtered_ms,
            lent: _,
        } => {
            let NewEvent {
                source: _,
                event_id: _,
                stream,
                created_at: _,
                received_at_ms: _,
                headers: _,
                body: _,
            } = &**event;
            for SealedRow {
                lane: _,
                slot: _,
                seal: _,
            } in rows
            {}
            format!(
                "insert_sealed{}stream{}filtered_{}rows",
                cov.state("InsertSealed.event.stream", stream.is_some()),
                cov.state("InsertSealed.filtered_ms", filtered_ms.is_some()),
                rows.len()
            )
        }
    }
}

fn settle_shape(settle: &Settle, cov: &mut Coverage) -> String {
    cov.variant("Settle", settle);
    match settle {
        Settle::Delivered { attempted } => format!(
            "delivered{}attempted",
            cov.state("Settle::Delivered.attempted", *attempted)
        ),
        Settle::Stale => "stale".into(),
        Settle::Retry {
            retry_at: _,
            error: _,
            attempted,
        } => format!(
            "retry{}attempted",
            cov.state("Settle::Retry.attempted", *attempted)
        ),
        Settle::Dead { error: _ } => "dead".into(),
    }
}

fn kv_shape(req: &KvRequest, cov: &mut Coverage) -> String {
    cov.variant("KvRequest", req);
    match req {
        KvRequest::Set {
            key: _,
            value: _,
            condition,
            expiry,
            get,
        } => {
            cov.variant("SetCondition", condition);
            cov.variant("SetExpiry", expiry);
            let condition = match condition {
                SetCondition::Always => "always",
                SetCondition::IfAbsent => "nx",
                SetCondition::IfPresent => "xx",
            };
            let expiry = match expiry {
                SetExpiry::Clear => "clear",
                SetExpiry::Keep => "keepttl",
                SetExpiry::At(_) => "at",
            };
            format!("set.{condition}.{expiry}{}get", cov.state("Set.get", *get))
        }
        KvRequest::Delete { keys: _ } => "delete".into(),
        KvRequest::Expire {
            key: _,
            at: _,
            condition,
        } => {
            cov.variant("ExpireCondition", condition);
            let condition = match condition {
                ExpireCondition::Always => "always",
                ExpireCondition::IfNone => "nx",
                ExpireCondition::IfSome => "xx",
                ExpireCondition::Later => "gt",
                ExpireCondition::Earlier => "lt",
                ExpireCondition::SomeAndEarlier => "xx_lt",
            };
            format!("expire.{condition}")
        }
        KvRequest::Persist { key: _ } => "persist".into(),
    }
}

/// How many variants `T`'s decoder knows: the first index it refuses.
/// (Given only a variant index, a known variant decodes, or runs out of
/// input for its fields; an unknown one is refused as such.)
fn variant_count<T: DeserializeOwned>() -> u8 {
    (0..0x80u8)
        .find(|&i| match postcard::from_bytes::<T>(&[i]) {
            Ok(_) | Err(postcard::Error::DeserializeUnexpectedEnd) => false,
            Err(_) => true,
        })
        .expect("fewer than 128 variants")
}

fn golden_path(format: u32) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(format!("tests/golden/requests-format-{format}.hex"))
}

/// Reads a golden file: (sample name, encoded batch) per line.
fn read_golden(text: &str) -> Vec<(String, Vec<u8>)> {
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (name, hex) = l.split_once(' ').expect("`name hex` lines");
            (name.to_owned(), hex::decode(hex).expect("hex"))
        })
        .collect()
}

/// Every sample, named and encoded as the log encodes it.
fn encoded() -> Vec<(String, Vec<u8>)> {
    let mut cov = Coverage::default();
    samples()
        .iter()
        .map(|req| {
            let bytes = wal::encode(SEQ, &[(NOW, req)]).expect("encodes");
            (shape(req, &mut cov), bytes)
        })
        .collect()
}

const CHANGED: &str = "the encoding of logged requests changed: a log written by the \
     previous build would be misread or refused after an upgrade. Bump wal::FORMAT, keep \
     wal::DECODES honest (list an older format only if its records still decode: this test \
     decodes each older format's golden samples), and add golden files for the new format \
     (this file, written with DEDUPD_WRITE_GOLDEN=1, and a log under tests/golden/: see its \
     README)";

#[test]
fn the_samples_cover_every_variant_and_every_optional_field() {
    let mut cov = Coverage::default();
    let mut names = BTreeSet::new();
    for req in samples() {
        let name = shape(&req, &mut cov);
        assert!(names.insert(name.clone()), "two samples of shape {name}");
    }
    let counts = [
        ("Request", variant_count::<Request>()),
        ("InboxRequest", variant_count::<InboxRequest>()),
        ("Settle", variant_count::<Settle>()),
        ("KvRequest", variant_count::<KvRequest>()),
        ("SetCondition", variant_count::<SetCondition>()),
        ("SetExpiry", variant_count::<SetExpiry>()),
        ("ExpireCondition", variant_count::<ExpireCondition>()),
    ];
    for (name, count) in counts {
        let seen = cov.variants.get(name).cloned().unwrap_or_default();
        let all: BTreeSet<u8> = (0..count).collect();
        assert_eq!(
            seen, all,
            "{name} has {count} variants: add a sample of each variant not covered"
        );
    }
    assert_eq!(
        cov.variants.len(),
        counts.len(),
        "an enum is recorded but its variants are not counted here"
    );
    for (field, states) in &cov.states {
        assert_eq!(
            states.len(),
            2,
            "{field}: add a sample with it set and one with it unset"
        );
    }
}

#[test]
fn the_encoding_of_every_logged_request_is_the_golden_one_of_its_format() {
    let path = golden_path(FORMAT);
    let now = encoded();
    let Ok(text) = std::fs::read_to_string(&path) else {
        if std::env::var_os(WRITE_ENV).is_some() {
            let mut out = format!(
                "# Write-ahead log format {FORMAT}: one logged batch (seq {SEQ}, clock {NOW}) per \
                 sample request,\n# as src/store/redb/wal_golden.rs encodes them. Written once \
                 for this format; never edit it.\n"
            );
            for (name, bytes) in &now {
                out.push_str(&format!("{name} {}\n", hex::encode(bytes)));
            }
            std::fs::write(&path, out).expect("write the golden file");
            return;
        }
        panic!(
            "{} is missing: the golden encoding of log format {FORMAT}. Once FORMAT names a \
             new format, write it with {WRITE_ENV}=1 cargo test --lib wal_golden, and commit it",
            path.display()
        );
    };
    let golden = read_golden(&text);
    let golden_map: BTreeMap<&str, &[u8]> = golden
        .iter()
        .map(|(n, b)| (n.as_str(), b.as_slice()))
        .collect();
    let mut diffs = Vec::new();
    for (name, bytes) in &now {
        match golden_map.get(name.as_str()) {
            Some(g) if g == bytes => {}
            Some(g) => diffs.push(format!(
                "  {name}: golden {} now {}",
                hex::encode(g),
                hex::encode(bytes)
            )),
            None => diffs.push(format!(
                "  {name}: a new request shape, not in the golden file"
            )),
        }
    }
    let now_names: BTreeSet<&str> = now.iter().map(|(n, _)| n.as_str()).collect();
    for (name, _) in &golden {
        if !now_names.contains(name.as_str()) {
            diffs.push(format!("  {name}: in the golden file, no longer sampled"));
        }
    }
    assert!(
        diffs.is_empty(),
        "{CHANGED}.\n{} (format {FORMAT}):\n{}",
        path.display(),
        diffs.join("\n")
    );
    // And they decode back to what was encoded.
    for (name, bytes) in &golden {
        let batch = wal::decode(bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        let ops: Vec<(Millis, &Request)> = batch.ops.iter().map(|(t, r)| (*t, r)).collect();
        assert_eq!(
            &wal::encode(batch.seq, &ops).expect("encodes"),
            bytes,
            "{name}: decoding and encoding again changed it"
        );
    }
}

#[test]
fn every_format_this_build_decodes_has_a_golden_log_or_samples_that_decode() {
    for &format in DECODES {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
        let log = dir.join(format!("log-format-{format}/dedupd.redb.wal.b64"));
        let samples = golden_path(format);
        assert!(
            log.exists() || samples.exists(),
            "wal::DECODES lists format {format}, but tests/golden/ has neither a log of it \
             (replayed by tests/store/golden.rs) nor its golden samples"
        );
        if let Ok(text) = std::fs::read_to_string(&samples) {
            for (name, bytes) in read_golden(&text) {
                if let Err(e) = wal::decode(&bytes) {
                    panic!(
                        "wal::DECODES lists format {format}, but its golden sample {name} no \
                         longer decodes ({e}): a log of that format would be refused. Make \
                         it decode, or take {format} out of DECODES"
                    );
                }
            }
        }
    }
}
