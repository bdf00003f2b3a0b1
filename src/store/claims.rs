//! The claim state table as pure transitions, shared by every backend that
//! evaluates it in Rust.
//!
//! `current` is always the *live* record: the caller passes `None` for a
//! record that is absent or expired.

use serde::Serialize;

use crate::clock::Millis;
use crate::domain::{ClaimResult, Fingerprint, Token, Ttl};

/// The two stored states; absent is the absence of a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ClaimState {
    /// A worker holds the key and is doing the work.
    Processing,
    /// The work finished; repeats are refused until the record expires.
    Done,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRecord {
    /// Processing or done.
    pub state: ClaimState,
    /// The owner's token; only its holder may release, extend or complete.
    pub token: Token,
    /// The fence handed out when the record was created.
    pub fence: u64,
    /// When the record stops existing, Unix milliseconds (exclusive).
    pub expires_at_ms: Millis,
    /// Digest of the payload the claim was made for, if the claimer gave one.
    pub fingerprint: Option<Fingerprint>,
    /// What the work returned, kept by `done` (done records only).
    pub result: Option<ClaimResult>,
}

impl ClaimRecord {
    /// The public view: everything but the token and fingerprint.
    pub fn view(&self) -> ClaimView {
        ClaimView {
            state: self.state,
            fence: self.fence,
            expires_at_ms: self.expires_at_ms,
            result: self.result.clone(),
        }
    }

    /// True when the record no longer exists at `now`.
    pub fn is_expired(&self, now: Millis) -> bool {
        self.expires_at_ms <= now
    }
}

/// What `GET /v1/claims/{key}` shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimView {
    /// Processing or done.
    pub state: ClaimState,
    pub fence: u64,
    /// Expiry, Unix milliseconds.
    pub expires_at_ms: Millis,
    /// The result `done` kept, if any.
    pub result: Option<ClaimResult>,
}

/// Answer to a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The caller now holds the key.
    Claimed {
        /// Owner token, for done / release / extend.
        token: Token,
        /// Fence, larger than every fence handed out before: for this key
        /// in a Redis Cluster (a counter per slot), for any key elsewhere.
        fence: u64,
        /// Expiry of the claim.
        expires_at_ms: Millis,
    },
    /// Someone else is processing the key.
    Busy {
        /// When their claim expires unless extended.
        expires_at_ms: Millis,
    },
    /// The work was done already.
    Done {
        /// When the done record expires.
        expires_at_ms: Millis,
        /// The result `done` kept, if any.
        result: Option<ClaimResult>,
    },
    /// The key is held or done with a different fingerprint.
    FingerprintMismatch {
        /// State of the existing record.
        state: ClaimState,
        expires_at_ms: Millis,
    },
}

/// Answer to done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DoneOutcome {
    /// The key is done until `expires_at_ms`.
    Done {
        /// Expiry of the done record.
        expires_at_ms: Millis,
    },
    /// Another token holds or completed the key.
    NotOwner {
        /// State of the existing record.
        state: ClaimState,
        expires_at_ms: Millis,
    },
}

/// Answer to release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// The claim was removed.
    Released,
    /// Nothing was held: absent or expired.
    NotHeld,
    /// Another token holds the key.
    NotOwner {
        /// Expiry of the other claim.
        expires_at_ms: Millis,
    },
    /// The work is done; a done record cannot be released.
    Done {
        /// Expiry of the done record.
        expires_at_ms: Millis,
    },
}

/// Answer to extend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExtendOutcome {
    /// The claim now expires at `expires_at_ms`.
    Extended { expires_at_ms: Millis },
    /// The claim expired or never existed: the caller lost it.
    Lost,
    /// Another token holds the key.
    NotOwner {
        /// Expiry of the other claim.
        expires_at_ms: Millis,
    },
    /// The work is done.
    Done {
        /// Expiry of the done record.
        expires_at_ms: Millis,
    },
}

/// What a transition does to the stored record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Leave storage as it is.
    Keep,
    /// Store this record (replacing any, expired or not).
    Put(ClaimRecord),
    /// Remove the record.
    Delete,
}

/// claim(ttl, fingerprint): absent → processing; otherwise refused.
/// `next_fence` is called only when a claim succeeds.
pub fn claim(
    current: Option<&ClaimRecord>,
    ttl: Ttl,
    fingerprint: Option<Fingerprint>,
    now: Millis,
    token: Token,
    next_fence: impl FnOnce() -> u64,
) -> (ClaimOutcome, Change) {
    match current {
        None => {
            let record = ClaimRecord {
                state: ClaimState::Processing,
                token,
                fence: next_fence(),
                expires_at_ms: ttl.expires_at(now),
                fingerprint,
                result: None,
            };
            let outcome = ClaimOutcome::Claimed {
                token: record.token,
                fence: record.fence,
                expires_at_ms: record.expires_at_ms,
            };
            (outcome, Change::Put(record))
        }
        Some(rec) => {
            let mismatch = matches!(
                (&rec.fingerprint, &fingerprint),
                (Some(stored), Some(given)) if stored != given
            );
            let outcome = if mismatch {
                ClaimOutcome::FingerprintMismatch {
                    state: rec.state,
                    expires_at_ms: rec.expires_at_ms,
                }
            } else if rec.state == ClaimState::Processing {
                ClaimOutcome::Busy {
                    expires_at_ms: rec.expires_at_ms,
                }
            } else {
                ClaimOutcome::Done {
                    expires_at_ms: rec.expires_at_ms,
                    result: rec.result.clone(),
                }
            };
            (outcome, Change::Keep)
        }
    }
}

/// done(token, ttl, result): absent → done (record the finished work);
/// processing with the token → done; done with the same token → ok,
/// unchanged (the first done's expiry and result stay).
/// A done record written from absent takes a fresh fence, so every record's
/// fence is unique (per slot in a Redis Cluster, so per key).
pub fn done(
    current: Option<&ClaimRecord>,
    token: Token,
    ttl: Ttl,
    result: Option<ClaimResult>,
    now: Millis,
    next_fence: impl FnOnce() -> u64,
) -> (DoneOutcome, Change) {
    match current {
        None => {
            let record = ClaimRecord {
                state: ClaimState::Done,
                token,
                fence: next_fence(),
                expires_at_ms: ttl.expires_at(now),
                fingerprint: None,
                result,
            };
            let outcome = DoneOutcome::Done {
                expires_at_ms: record.expires_at_ms,
            };
            (outcome, Change::Put(record))
        }
        Some(rec) if !rec.token.matches(&token) => (
            DoneOutcome::NotOwner {
                state: rec.state,
                expires_at_ms: rec.expires_at_ms,
            },
            Change::Keep,
        ),
        Some(rec) => match rec.state {
            ClaimState::Processing => {
                let record = ClaimRecord {
                    state: ClaimState::Done,
                    expires_at_ms: ttl.expires_at(now),
                    result,
                    ..rec.clone()
                };
                let outcome = DoneOutcome::Done {
                    expires_at_ms: record.expires_at_ms,
                };
                (outcome, Change::Put(record))
            }
            // Idempotent: a repeated done neither moves the expiry nor fails.
            ClaimState::Done => (
                DoneOutcome::Done {
                    expires_at_ms: rec.expires_at_ms,
                },
                Change::Keep,
            ),
        },
    }
}

/// release(token): processing with the token → absent.
pub fn release(current: Option<&ClaimRecord>, token: Token) -> (ReleaseOutcome, Change) {
    match current {
        None => (ReleaseOutcome::NotHeld, Change::Keep),
        Some(rec) if rec.state == ClaimState::Done => (
            ReleaseOutcome::Done {
                expires_at_ms: rec.expires_at_ms,
            },
            Change::Keep,
        ),
        Some(rec) if rec.token.matches(&token) => (ReleaseOutcome::Released, Change::Delete),
        Some(rec) => (
            ReleaseOutcome::NotOwner {
                expires_at_ms: rec.expires_at_ms,
            },
            Change::Keep,
        ),
    }
}

/// extend(token, ttl): processing with the token → expiry `now + ttl`.
pub fn extend(
    current: Option<&ClaimRecord>,
    token: Token,
    ttl: Ttl,
    now: Millis,
) -> (ExtendOutcome, Change) {
    match current {
        None => (ExtendOutcome::Lost, Change::Keep),
        Some(rec) if rec.state == ClaimState::Done => (
            ExtendOutcome::Done {
                expires_at_ms: rec.expires_at_ms,
            },
            Change::Keep,
        ),
        Some(rec) if rec.token.matches(&token) => {
            let record = ClaimRecord {
                expires_at_ms: ttl.expires_at(now),
                ..rec.clone()
            };
            (
                ExtendOutcome::Extended {
                    expires_at_ms: record.expires_at_ms,
                },
                Change::Put(record),
            )
        }
        Some(rec) => (
            ExtendOutcome::NotOwner {
                expires_at_ms: rec.expires_at_ms,
            },
            Change::Keep,
        ),
    }
}
