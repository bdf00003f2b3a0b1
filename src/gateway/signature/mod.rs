//! Webhook signature verification for the schemes the gateway accepts.
//!
//! Every scheme is HMAC-SHA256 over some header fields and the raw body. Each
//! scheme module turns its headers into a `Claim` (the signed timestamp, the
//! bytes that precede the body in the signed content, the candidate tags);
//! [`Verifier`] then does the part they share: MAC with every configured
//! secret, compare in constant time, check the timestamp window.

mod github;
mod standard;
mod stripe;
mod sume;

use std::fmt;
use std::time::Duration;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

pub use crate::domain::Scheme;
pub use standard::{parse_whsec, sign_standard_webhooks, signature_header};

type HmacSha256 = Hmac<Sha256>;

/// Why a request's signature was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// A header the scheme requires is absent; carries the header's name.
    #[error("missing header {0}")]
    MissingHeader(&'static str),
    /// A header is present but unparseable; says what was expected.
    #[error("malformed header: {0}")]
    Malformed(String),
    /// The signature is genuine but its timestamp lies outside the replay window.
    #[error("timestamp {timestamp} is more than {tolerance_secs}s away from now ({now})")]
    TimestampOutOfTolerance {
        /// The signed timestamp, in Unix seconds.
        timestamp: i64,
        /// The verifier's current time, in Unix seconds.
        now: i64,
        /// The allowed distance between the two, in seconds.
        tolerance_secs: u64,
    },
    /// No configured secret produced a matching signature.
    #[error("no configured secret matches the signature")]
    BadSignature,
}

/// Checks requests of one scheme against a source's secrets.
#[derive(Clone)]
pub struct Verifier {
    scheme: Scheme,
    // Keyed once here so that each request only hashes its own content.
    macs: Vec<HmacSha256>,
    tolerance_secs: u64,
}

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verifier")
            .field("scheme", &self.scheme)
            .field("secrets", &format_args!("<{} redacted>", self.macs.len()))
            .field("tolerance_secs", &self.tolerance_secs)
            .finish()
    }
}

impl Verifier {
    /// Builds a verifier; standard-webhooks secrets must be `whsec_<base64>`, others are used as UTF-8 bytes.
    ///
    /// At least one secret is required and none may be empty. Errors name the
    /// secret by position, never by value.
    pub fn new(scheme: Scheme, secrets: &[String], tolerance: Duration) -> Result<Self, String> {
        if secrets.is_empty() {
            return Err("at least one secret is required".to_owned());
        }
        let macs = secrets
            .iter()
            .enumerate()
            .map(|(i, secret)| {
                if secret.is_empty() {
                    return Err(format!("secret #{} is empty", i + 1));
                }
                let key = match scheme {
                    Scheme::StandardWebhooks => {
                        parse_whsec(secret).map_err(|e| format!("secret #{}: {e}", i + 1))?
                    }
                    Scheme::Sume | Scheme::Stripe | Scheme::Github => secret.as_bytes().to_vec(),
                };
                Ok(keyed(&key))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            scheme,
            macs,
            tolerance_secs: tolerance.as_secs(),
        })
    }

    /// What can be checked before the body is read: the scheme's headers
    /// are present and well-formed and, where the scheme signs a timestamp,
    /// it lies within the tolerance. A request refused here never has its
    /// body read.
    pub fn check_headers<'a>(
        &self,
        header: &dyn Fn(&str) -> Option<&'a str>,
        now_unix_s: i64,
    ) -> Result<(), VerifyError> {
        let claim = self.claim(header)?;
        self.check_timestamp(claim.timestamp, now_unix_s)
    }

    /// Accepts the request if any configured secret signed it within the tolerance; `header` looks names up case-insensitively.
    pub fn verify<'a>(
        &self,
        header: &dyn Fn(&str) -> Option<&'a str>,
        body: &[u8],
        now_unix_s: i64,
    ) -> Result<(), VerifyError> {
        let claim = self.claim(header)?;
        let authentic = self.macs.iter().any(|mac| {
            let mut mac = mac.clone();
            mac.update(claim.prefix.as_bytes());
            mac.update(body);
            let expected = mac.finalize().into_bytes();
            claim
                .tags
                .iter()
                .any(|tag| bool::from(expected.as_slice().ct_eq(tag)))
        });
        if !authentic {
            return Err(VerifyError::BadSignature);
        }
        // Checked after the MAC so that a late but genuine delivery (clock
        // skew, a replay) is told apart from a forgery in the logs.
        self.check_timestamp(claim.timestamp, now_unix_s)
    }

    fn claim<'a>(&self, header: &dyn Fn(&str) -> Option<&'a str>) -> Result<Claim, VerifyError> {
        match self.scheme {
            Scheme::Sume => sume::parse(header),
            Scheme::StandardWebhooks => standard::parse(header),
            Scheme::Stripe => stripe::parse(header),
            Scheme::Github => github::parse(header),
        }
    }

    fn check_timestamp(&self, timestamp: Option<i64>, now_unix_s: i64) -> Result<(), VerifyError> {
        if let Some(timestamp) = timestamp
            && now_unix_s.abs_diff(timestamp) > self.tolerance_secs
        {
            return Err(VerifyError::TimestampOutOfTolerance {
                timestamp,
                now: now_unix_s,
                tolerance_secs: self.tolerance_secs,
            });
        }
        Ok(())
    }
}

/// Returns the headers a sender of `scheme` sets for `body`; `id` is used by standard-webhooks only.
///
/// A standard-webhooks `secret` that is not valid `whsec_<base64>` is used as
/// raw bytes, which no [`Verifier`] accepts (it refuses such secrets), so the
/// mistake surfaces as [`VerifyError::BadSignature`] rather than a panic.
pub fn sign(
    scheme: Scheme,
    secret: &str,
    timestamp: i64,
    id: &str,
    body: &[u8],
) -> Vec<(&'static str, String)> {
    match scheme {
        Scheme::Sume => sume::sign(secret.as_bytes(), timestamp, body),
        Scheme::StandardWebhooks => {
            let key = parse_whsec(secret).unwrap_or_else(|_| secret.as_bytes().to_vec());
            standard::sign(&key, id, timestamp, body)
        }
        Scheme::Stripe => stripe::sign(secret.as_bytes(), timestamp, body),
        Scheme::Github => github::sign(secret.as_bytes(), body),
    }
}

/// What a request's headers assert, before any secret is involved.
struct Claim {
    /// The signed timestamp, for schemes that have one.
    timestamp: Option<i64>,
    /// The signed content that precedes the raw body, e.g. `"{timestamp}."`.
    prefix: String,
    /// Candidate tags of the scheme's current version; one match suffices.
    tags: Vec<Vec<u8>>,
}

fn keyed(key: &[u8]) -> HmacSha256 {
    // HMAC hashes or pads any key to the block size, so this never fails.
    HmacSha256::new_from_slice(key).expect("HMAC accepts keys of any length")
}

fn mac(key: &[u8], prefix: &str, body: &[u8]) -> Vec<u8> {
    let mut mac = keyed(key);
    mac.update(prefix.as_bytes());
    mac.update(body);
    mac.finalize().into_bytes().to_vec()
}

fn required<'a>(
    header: &dyn Fn(&str) -> Option<&'a str>,
    name: &'static str,
) -> Result<&'a str, VerifyError> {
    match header(name) {
        None => Err(VerifyError::MissingHeader(name)),
        Some("") => Err(VerifyError::Malformed(format!("{name} is empty"))),
        Some(value) => Ok(value),
    }
}

/// Parses Unix seconds as plain digits: `i64::from_str` alone would also take
/// `+17` and `-17`, which no sender emits.
fn timestamp(name: &str, raw: &str) -> Result<i64, VerifyError> {
    raw.bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| raw.parse::<i64>().ok())
        .flatten()
        .ok_or_else(|| VerifyError::Malformed(format!("{name}: expected Unix seconds")))
}

fn hex_tag(name: &str, raw: &str) -> Result<Vec<u8>, VerifyError> {
    hex::decode(raw).map_err(|_| VerifyError::Malformed(format!("{name}: expected a hex digest")))
}

/// Case-insensitive lookup over `(name, value)` pairs, as the gateway's caller provides.
#[cfg(test)]
fn lookup<'h>(headers: &'h [(&'static str, String)]) -> impl Fn(&str) -> Option<&'h str> {
    move |name| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_700_000_000;
    const BODY: &[u8] = br#"{"request_id":"req_1","run_id":"run_1"}"#;

    fn secret(scheme: Scheme, n: u8) -> String {
        match scheme {
            // Any base64 will do; these are 24 bytes each.
            Scheme::StandardWebhooks => format!("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS{n}"),
            _ => format!("secret-{n}"),
        }
    }

    fn verifier(scheme: Scheme, secrets: &[String]) -> Verifier {
        Verifier::new(scheme, secrets, Duration::from_secs(300)).expect("valid secrets")
    }

    const ALL: [Scheme; 4] = [
        Scheme::Sume,
        Scheme::StandardWebhooks,
        Scheme::Stripe,
        Scheme::Github,
    ];

    #[test]
    fn every_scheme_round_trips_through_sign() {
        for scheme in ALL {
            let s = secret(scheme, 1);
            let headers = sign(scheme, &s, NOW, "msg_1", BODY);
            let result = verifier(scheme, &[s]).verify(&lookup(&headers), BODY, NOW);
            assert_eq!(result, Ok(()), "{scheme:?}");
        }
    }

    #[test]
    fn wrong_secret_is_bad_signature() {
        for scheme in ALL {
            let headers = sign(scheme, &secret(scheme, 1), NOW, "msg_1", BODY);
            let result =
                verifier(scheme, &[secret(scheme, 2)]).verify(&lookup(&headers), BODY, NOW);
            assert_eq!(result, Err(VerifyError::BadSignature), "{scheme:?}");
        }
    }

    #[test]
    fn second_of_two_secrets_matches() {
        for scheme in ALL {
            let headers = sign(scheme, &secret(scheme, 2), NOW, "msg_1", BODY);
            let v = verifier(scheme, &[secret(scheme, 1), secret(scheme, 2)]);
            assert_eq!(v.verify(&lookup(&headers), BODY, NOW), Ok(()), "{scheme:?}");
        }
    }

    #[test]
    fn tampered_body_is_bad_signature() {
        for scheme in ALL {
            let s = secret(scheme, 1);
            let headers = sign(scheme, &s, NOW, "msg_1", BODY);
            let tampered = br#"{"request_id":"req_2","run_id":"run_1"}"#;
            let result = verifier(scheme, &[s]).verify(&lookup(&headers), tampered, NOW);
            assert_eq!(result, Err(VerifyError::BadSignature), "{scheme:?}");
        }
    }

    #[test]
    fn timestamps_outside_tolerance_are_refused_inside_accepted() {
        for scheme in [Scheme::Sume, Scheme::StandardWebhooks, Scheme::Stripe] {
            let s = secret(scheme, 1);
            let v = verifier(scheme, std::slice::from_ref(&s));
            let headers = sign(scheme, &s, NOW, "msg_1", BODY);
            let out = |now| VerifyError::TimestampOutOfTolerance {
                timestamp: NOW,
                now,
                tolerance_secs: 300,
            };
            // Too old, then too far in the future.
            let late = NOW + 301;
            let early = NOW - 301;
            assert_eq!(v.verify(&lookup(&headers), BODY, late), Err(out(late)));
            assert_eq!(v.verify(&lookup(&headers), BODY, early), Err(out(early)));
            // The window is inclusive.
            assert_eq!(v.verify(&lookup(&headers), BODY, NOW + 300), Ok(()));
            assert_eq!(v.verify(&lookup(&headers), BODY, NOW - 300), Ok(()));
        }
    }

    #[test]
    fn github_ignores_tolerance() {
        let s = secret(Scheme::Github, 1);
        let headers = sign(Scheme::Github, &s, NOW, "", BODY);
        let v = verifier(Scheme::Github, &[s]);
        assert_eq!(v.verify(&lookup(&headers), BODY, i64::MAX), Ok(()));
    }

    #[test]
    fn bad_mac_with_stale_timestamp_is_bad_signature() {
        for scheme in [Scheme::Sume, Scheme::StandardWebhooks, Scheme::Stripe] {
            let headers = sign(scheme, &secret(scheme, 1), NOW, "msg_1", BODY);
            let v = verifier(scheme, &[secret(scheme, 2)]);
            let result = v.verify(&lookup(&headers), BODY, NOW + 10_000);
            assert_eq!(result, Err(VerifyError::BadSignature), "{scheme:?}");
        }
    }

    #[test]
    fn every_missing_header_is_named() {
        for scheme in ALL {
            let s = secret(scheme, 1);
            let v = verifier(scheme, std::slice::from_ref(&s));
            let headers = sign(scheme, &s, NOW, "msg_1", BODY);
            for (name, _) in &headers {
                let rest: Vec<_> = headers.iter().filter(|(k, _)| k != name).cloned().collect();
                let result = v.verify(&lookup(&rest), BODY, NOW);
                assert_eq!(result, Err(VerifyError::MissingHeader(name)), "{scheme:?}");
            }
        }
    }

    #[test]
    fn garbage_in_any_header_is_malformed() {
        for scheme in ALL {
            let s = secret(scheme, 1);
            let v = verifier(scheme, std::slice::from_ref(&s));
            let headers = sign(scheme, &s, NOW, "msg_1", BODY);
            for (name, _) in &headers {
                if *name == "webhook-id" {
                    continue; // any non-empty string is a valid id
                }
                for garbage in ["", "garbage", "v1=zz v1,zz t=x sha256=zz"] {
                    let mut bad = headers.clone();
                    for (k, v) in &mut bad {
                        if k == name {
                            *v = garbage.to_owned();
                        }
                    }
                    let result = v.verify(&lookup(&bad), BODY, NOW);
                    assert!(
                        matches!(result, Err(VerifyError::Malformed(_))),
                        "{scheme:?} {name}={garbage:?}: {result:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn new_refuses_no_secrets_and_empty_secrets() {
        for scheme in ALL {
            let none = Verifier::new(scheme, &[], Duration::from_secs(300));
            assert!(none.is_err(), "{scheme:?}");
            let empty = Verifier::new(scheme, &[secret(scheme, 1), String::new()], Duration::ZERO);
            assert_eq!(empty.map(drop), Err("secret #2 is empty".to_owned()));
        }
    }

    #[test]
    fn new_refuses_standard_webhooks_secret_that_is_not_base64() {
        for bad in [
            "whsec_not base64!",
            "whsec_",
            "plain-text-secret",
            "whsec_@@@@",
        ] {
            let result = Verifier::new(
                Scheme::StandardWebhooks,
                &[bad.to_owned()],
                Duration::from_secs(300),
            );
            let err = result.expect_err("not base64");
            assert!(err.starts_with("secret #1: "), "{err}");
            let payload = bad.trim_start_matches("whsec_");
            assert!(
                payload.is_empty() || !err.contains(payload),
                "the error must not echo the secret: {err}"
            );
        }
    }

    #[test]
    fn debug_does_not_print_secrets() {
        let v = verifier(Scheme::Github, &["hunter2-very-secret".to_owned()]);
        let shown = format!("{v:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("1 redacted"), "{shown}");
    }

    #[test]
    fn verifier_is_clone_send_sync() {
        fn check<T: Clone + Send + Sync + 'static>() {}
        check::<Verifier>();
    }

    #[test]
    fn scheme_serde_names() {
        for (scheme, name) in [
            (Scheme::Sume, "\"sume\""),
            (Scheme::StandardWebhooks, "\"standard-webhooks\""),
            (Scheme::Stripe, "\"stripe\""),
            (Scheme::Github, "\"github\""),
        ] {
            assert_eq!(serde_json::to_string(&scheme).ok().as_deref(), Some(name));
            assert_eq!(serde_json::from_str::<Scheme>(name).ok(), Some(scheme));
        }
    }
}
