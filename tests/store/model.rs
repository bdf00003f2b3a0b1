//! Random operations and clock moves against a plain in-memory model of
//! the state table and ordering rule of docs/claims.md; the store must give
//! the same answers. The model is written from the design, independently of the
//! store's own transition code.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;

use dedupd::domain::{ClaimResult, CreatedAt, Fingerprint, Key, ScopedKey, Token, Ttl};
use dedupd::store::{
    ApplyOutcome, ClaimOutcome, ClaimState, DoneOutcome, ExtendOutcome, ReleaseOutcome,
};
use proptest::prelude::*;

use crate::Backend;

type Open = dyn Fn() -> Pin<Box<dyn Future<Output = Box<dyn Backend>>>>;

#[derive(Debug, Clone)]
enum Tok {
    /// One of the tokens handed out so far (index modulo their number).
    Issued(usize),
    /// A token nobody was given.
    Stranger,
}

#[derive(Debug, Clone)]
enum Op {
    Claim {
        key: u8,
        ttl: u64,
        fp: Option<u8>,
    },
    /// `result`: none, or one of a few JSON values ([`result`]).
    Done {
        key: u8,
        tok: Tok,
        ttl: u64,
        result: Option<u8>,
    },
    Release {
        key: u8,
        tok: Tok,
    },
    Extend {
        key: u8,
        tok: Tok,
        ttl: u64,
    },
    Get {
        key: u8,
    },
    Apply {
        stream: u8,
        event: u8,
        minute: u8,
    },
    Head {
        stream: u8,
    },
    Advance(u64),
    Purge,
    Restart,
}

fn tok() -> impl Strategy<Value = Tok> {
    prop_oneof![4 => (0usize..8).prop_map(Tok::Issued), 1 => Just(Tok::Stranger)]
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0u8..4;
    let ttl = 1u64..2_000;
    prop_oneof![
        6 => (key.clone(), ttl.clone(), proptest::option::of(0u8..2))
            .prop_map(|(key, ttl, fp)| Op::Claim { key, ttl, fp }),
        3 => (key.clone(), tok(), ttl.clone(), proptest::option::of(0u8..3))
            .prop_map(|(key, tok, ttl, result)| Op::Done { key, tok, ttl, result }),
        3 => (key.clone(), tok()).prop_map(|(key, tok)| Op::Release { key, tok }),
        3 => (key.clone(), tok(), ttl).prop_map(|(key, tok, ttl)| Op::Extend { key, tok, ttl }),
        2 => key.prop_map(|key| Op::Get { key }),
        4 => (0u8..2, 0u8..6, 0u8..4).prop_map(|(stream, event, minute)| Op::Apply { stream, event, minute }),
        1 => (0u8..2).prop_map(|stream| Op::Head { stream }),
        4 => (0u64..1_500).prop_map(Op::Advance),
        1 => Just(Op::Purge),
        1 => Just(Op::Restart),
    ]
}

#[derive(Debug, Clone)]
struct MClaim {
    done: bool,
    token: Token,
    /// `None` for a done from absent while fences grow per key: the store
    /// does not say which it took (learned from the next get).
    fence: Option<u64>,
    expires: u64,
    fp: Option<u8>,
    /// The result a done kept.
    result: Option<u8>,
}

#[derive(Debug, Default)]
struct Model {
    now: u64,
    /// The store's one counter (when it has one).
    fence: u64,
    /// Fences grow per key only (a Redis Cluster): a key's new fence is
    /// above its last, but not predicted.
    per_key: bool,
    /// Each key's last fence known.
    last: HashMap<u8, u64>,
    claims: HashMap<u8, MClaim>,
    /// event → expiry
    events: HashMap<u8, u64>,
    /// stream → (minute, event, expiry)
    heads: HashMap<u8, (u8, u8, u64)>,
    tokens: Vec<Token>,
}

const RETENTION: u64 = 3_000;

impl Model {
    fn live(&self, key: u8) -> Option<&MClaim> {
        self.claims.get(&key).filter(|c| c.expires > self.now)
    }

    fn token(&self, t: &Tok) -> Token {
        match t {
            Tok::Issued(i) if !self.tokens.is_empty() => self.tokens[i % self.tokens.len()],
            _ => Token::from_bytes([0xEE; 16]),
        }
    }

    fn state(c: &MClaim) -> ClaimState {
        if c.done {
            ClaimState::Done
        } else {
            ClaimState::Processing
        }
    }
}

fn k(n: u8) -> ScopedKey {
    ScopedKey::api(&Key::parse(&format!("key-{n}"), "key").unwrap())
}

fn fingerprint(n: u8) -> Fingerprint {
    Fingerprint::parse(&format!("fp-{n}")).unwrap()
}

/// Results of a few shapes: a string, an object, a number that a float
/// would round.
fn result(n: u8) -> ClaimResult {
    let text = match n {
        0 => r#""ok""#,
        1 => r#"{"charge": "ch_1", "items": [1, 2, {"a": null}]}"#,
        _ => "123456789012345678901234567890",
    };
    ClaimResult::from_stored(text).unwrap()
}

fn minute(m: u8) -> CreatedAt {
    CreatedAt::parse(&format!("2026-11-29T10:{m:02}:00Z"), "created_at").unwrap()
}

async fn run(open: &Open, ops: Vec<Op>) {
    let mut backend = open().await;
    let mut m = Model {
        now: 1_800_000_000_000,
        per_key: backend.fences_per_key(),
        ..Model::default()
    };
    for (step, op) in ops.into_iter().enumerate() {
        let s = backend.store();
        let now = m.now;
        let ctx = format!("step {step}: {op:?}");
        match op {
            Op::Claim { key, ttl, fp } => {
                let got = s
                    .claim(
                        &k(key),
                        Ttl::from_ms_unchecked(ttl),
                        fp.map(fingerprint),
                        now,
                    )
                    .await
                    .unwrap();
                match m.live(key).cloned() {
                    None => {
                        let ClaimOutcome::Claimed {
                            token,
                            fence,
                            expires_at_ms,
                        } = got
                        else {
                            panic!("{ctx}: expected Claimed, got {got:?}")
                        };
                        if m.per_key {
                            let last = m.last.get(&key).copied().unwrap_or(0);
                            assert!(fence > last, "{ctx}: fence {fence} after {last}");
                            assert_eq!(expires_at_ms, now + ttl, "{ctx}");
                        } else {
                            m.fence += 1;
                            assert_eq!((fence, expires_at_ms), (m.fence, now + ttl), "{ctx}");
                        }
                        m.last.insert(key, fence);
                        m.tokens.push(token);
                        m.claims.insert(
                            key,
                            MClaim {
                                done: false,
                                token,
                                fence: Some(fence),
                                expires: now + ttl,
                                fp,
                                result: None,
                            },
                        );
                    }
                    Some(c) => {
                        let want = match (c.fp, fp) {
                            (Some(a), Some(b)) if a != b => ClaimOutcome::FingerprintMismatch {
                                state: Model::state(&c),
                                expires_at_ms: c.expires,
                            },
                            _ if c.done => ClaimOutcome::Done {
                                expires_at_ms: c.expires,
                                result: c.result.map(result),
                            },
                            _ => ClaimOutcome::Busy {
                                expires_at_ms: c.expires,
                            },
                        };
                        assert_eq!(got, want, "{ctx}");
                    }
                }
            }
            Op::Done {
                key,
                tok,
                ttl,
                result: kept,
            } => {
                let token = m.token(&tok);
                let got = s
                    .done_with(
                        &k(key),
                        token,
                        Ttl::from_ms_unchecked(ttl),
                        kept.map(result),
                        now,
                    )
                    .await
                    .unwrap();
                let want = match m.live(key).cloned() {
                    None => {
                        let fence = (!m.per_key).then(|| {
                            m.fence += 1;
                            m.fence
                        });
                        m.claims.insert(
                            key,
                            MClaim {
                                done: true,
                                token,
                                fence,
                                expires: now + ttl,
                                fp: None,
                                result: kept,
                            },
                        );
                        DoneOutcome::Done {
                            expires_at_ms: now + ttl,
                        }
                    }
                    Some(c) if c.token != token => DoneOutcome::NotOwner {
                        state: Model::state(&c),
                        expires_at_ms: c.expires,
                    },
                    Some(c) if c.done => DoneOutcome::Done {
                        expires_at_ms: c.expires,
                    },
                    Some(mut c) => {
                        c.done = true;
                        c.expires = now + ttl;
                        c.result = kept;
                        m.claims.insert(key, c);
                        DoneOutcome::Done {
                            expires_at_ms: now + ttl,
                        }
                    }
                };
                assert_eq!(got, want, "{ctx}");
            }
            Op::Release { key, tok } => {
                let token = m.token(&tok);
                let got = s.release(&k(key), token, now).await.unwrap();
                let want = match m.live(key).cloned() {
                    None => ReleaseOutcome::NotHeld,
                    Some(c) if c.done => ReleaseOutcome::Done {
                        expires_at_ms: c.expires,
                    },
                    Some(c) if c.token != token => ReleaseOutcome::NotOwner {
                        expires_at_ms: c.expires,
                    },
                    Some(_) => {
                        m.claims.remove(&key);
                        ReleaseOutcome::Released
                    }
                };
                assert_eq!(got, want, "{ctx}");
            }
            Op::Extend { key, tok, ttl } => {
                let token = m.token(&tok);
                let got = s
                    .extend(&k(key), token, Ttl::from_ms_unchecked(ttl), now)
                    .await
                    .unwrap();
                let want = match m.live(key).cloned() {
                    None => ExtendOutcome::Lost,
                    Some(c) if c.done => ExtendOutcome::Done {
                        expires_at_ms: c.expires,
                    },
                    Some(c) if c.token != token => ExtendOutcome::NotOwner {
                        expires_at_ms: c.expires,
                    },
                    Some(mut c) => {
                        c.expires = now + ttl;
                        m.claims.insert(key, c);
                        ExtendOutcome::Extended {
                            expires_at_ms: now + ttl,
                        }
                    }
                };
                assert_eq!(got, want, "{ctx}");
            }
            Op::Get { key } => {
                let got = s.get(&k(key), now).await.unwrap();
                // A fence taken by a done from absent, learned.
                if let (Some(v), Some(c)) = (&got, m.claims.get_mut(&key))
                    && c.expires > now
                    && c.fence.is_none()
                {
                    let last = m.last.get(&key).copied().unwrap_or(0);
                    assert!(v.fence > last, "{ctx}: fence {} after {last}", v.fence);
                    c.fence = Some(v.fence);
                    m.last.insert(key, v.fence);
                }
                let want = m
                    .live(key)
                    .map(|c| (Model::state(c), c.fence, c.expires, c.result.map(result)));
                assert_eq!(
                    got.map(|v| (v.state, Some(v.fence), v.expires_at_ms, v.result)),
                    want,
                    "{ctx}"
                );
            }
            Op::Apply {
                stream,
                event,
                minute: min,
            } => {
                let got = s
                    .apply(
                        &k(100 + stream),
                        &k(200 + event),
                        minute(min),
                        RETENTION,
                        now,
                    )
                    .await
                    .unwrap();
                let seen = m.events.get(&event).is_some_and(|exp| *exp > now);
                let head = m.heads.get(&stream).copied().filter(|h| h.2 > now);
                let want = if seen {
                    ApplyOutcome::Duplicate
                } else if head.is_some_and(|h| min < h.0) {
                    m.events.insert(event, now + RETENTION);
                    ApplyOutcome::Stale
                } else {
                    m.events.insert(event, now + RETENTION);
                    m.heads.insert(stream, (min, event, now + RETENTION));
                    ApplyOutcome::Applied
                };
                assert_eq!(got.outcome, want, "{ctx}");
                let want_head = m
                    .heads
                    .get(&stream)
                    .filter(|h| h.2 > now)
                    .map(|h| (minute(h.0), k(200 + h.1)));
                assert_eq!(
                    got.head.map(|h| (h.created_at, h.event_id)),
                    want_head,
                    "{ctx}"
                );
            }
            Op::Head { stream } => {
                let got = s.head(&k(100 + stream), now).await.unwrap();
                let want = m
                    .heads
                    .get(&stream)
                    .filter(|h| h.2 > now)
                    .map(|h| (minute(h.0), k(200 + h.1)));
                assert_eq!(got.map(|h| (h.created_at, h.event_id)), want, "{ctx}");
            }
            Op::Advance(ms) => m.now += ms,
            Op::Purge => {
                let got = s.purge_expired(now, 1_000).await.unwrap();
                let before = (m.claims.len(), m.events.len(), m.heads.len());
                m.claims.retain(|_, c| c.expires > now);
                m.events.retain(|_, exp| *exp > now);
                m.heads.retain(|_, h| h.2 > now);
                let removed = (
                    (before.0 - m.claims.len()) as u64,
                    (before.1 - m.events.len()) as u64,
                    (before.2 - m.heads.len()) as u64,
                );
                if backend.expires_by_itself() {
                    assert_eq!(got.total(), 0, "{ctx}");
                } else {
                    assert_eq!((got.claims, got.events, got.heads), removed, "{ctx}");
                }
            }
            Op::Restart => {
                drop(s);
                backend.restart().await;
            }
        }
    }
    backend.store().close().await;
}

/// Runs the property against backends made by `open`.
pub fn check<F>(open: F)
where
    F: Fn() -> Pin<Box<dyn Future<Output = Box<dyn Backend>>>> + 'static,
{
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let config = ProptestConfig {
        cases: 128,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(ops in proptest::collection::vec(op(), 1..60))| {
        rt.block_on(run(&open, ops));
    });
}
