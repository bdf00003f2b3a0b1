//! Webhook signature verification for the schemes the gateway accepts.
//!
//! Every scheme is HMAC-SHA256 over some header fields and the raw body. Each
//! scheme module turns its headers into a `Claim` (the signed timestamp, the
//! bytes that precede the body in the signed content, the candidate tags);
//! [`Verifier`] then does the part they share: MAC with every configured
//! secret, compare in constant time, check the timestamp window.

mod github;
mod linear;
mod paddle;
mod shopify;
mod square;
mod standard;
mod stripe;
mod sume;
mod v0;

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
    /// Square signs the URL it posts to: the notification URL as
    /// registered there (empty for other schemes).
    notification_url: String,
}

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verifier")
            .field("scheme", &self.scheme)
            .field("secrets", &format_args!("<{} redacted>", self.macs.len()))
            .field("tolerance_secs", &self.tolerance_secs)
            .field("notification_url", &self.notification_url)
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
                let key = if scheme.base64_secrets() {
                    parse_whsec(secret).map_err(|e| format!("secret #{}: {e}", i + 1))?
                } else {
                    secret.as_bytes().to_vec()
                };
                Ok(keyed(&key))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            scheme,
            macs,
            tolerance_secs: tolerance.as_secs(),
            notification_url: String::new(),
        })
    }

    /// The URL Square signs (with the body): the notification URL exactly
    /// as registered at Square. Only the square scheme reads it.
    #[must_use]
    pub fn with_notification_url(mut self, url: &str) -> Self {
        url.clone_into(&mut self.notification_url);
        self
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
        self.verify_which(header, body, now_unix_s).map(drop)
    }

    /// As [`Verifier::verify`], and says which secret signed (its
    /// position in the list), for a reply signed with the same one
    /// ([`Verifier::hex_mac`]).
    pub fn verify_which<'a>(
        &self,
        header: &dyn Fn(&str) -> Option<&'a str>,
        body: &[u8],
        now_unix_s: i64,
    ) -> Result<usize, VerifyError> {
        let claim = self.claim(header)?;
        let signer = self.macs.iter().position(|mac| {
            let mut mac = mac.clone();
            mac.update(claim.prefix.as_bytes());
            mac.update(body);
            let expected = mac.finalize().into_bytes();
            claim
                .tags
                .iter()
                .any(|tag| bool::from(expected.as_slice().ct_eq(tag)))
        });
        let Some(signer) = signer else {
            return Err(VerifyError::BadSignature);
        };
        // Checked after the MAC so that a late but genuine delivery (clock
        // skew, a replay) is told apart from a forgery in the logs.
        let timestamp = match claim.body_timestamp_ms {
            Some(pointer) => Some(body_timestamp(body, pointer)?),
            None => claim.timestamp,
        };
        self.check_timestamp(timestamp, now_unix_s)?;
        Ok(signer)
    }

    /// HMAC-SHA256 of `data` with secret number `signer` (as
    /// [`Verifier::verify_which`] answered), in hex: what Zoom's URL
    /// validation expects back.
    pub fn hex_mac(&self, signer: usize, data: &[u8]) -> Option<String> {
        let mut mac = self.macs.get(signer)?.clone();
        mac.update(data);
        Some(hex::encode(mac.finalize().into_bytes()))
    }

    fn claim<'a>(&self, header: &dyn Fn(&str) -> Option<&'a str>) -> Result<Claim, VerifyError> {
        match self.scheme {
            Scheme::Sume => sume::parse(header),
            Scheme::StandardWebhooks => standard::parse(&standard::STANDARD_NAMES, header),
            Scheme::Stripe => stripe::parse(header),
            Scheme::Github => github::parse(header),
            Scheme::Slack => v0::parse(&v0::SLACK, header),
            Scheme::Shopify => shopify::parse(header),
            Scheme::Paddle => paddle::parse(header),
            Scheme::Svix => standard::parse(&standard::SVIX_NAMES, header),
            Scheme::Square => square::parse(&self.notification_url, header),
            Scheme::Zoom => v0::parse(&v0::ZOOM, header),
            Scheme::Linear => linear::parse(header),
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

/// Returns the headers a sender of `scheme` sets for `body`; `id` is used by standard-webhooks and svix only.
///
/// A standard-webhooks `secret` that is not valid `whsec_<base64>` is used as
/// raw bytes, which no [`Verifier`] accepts (it refuses such secrets), so the
/// mistake surfaces as [`VerifyError::BadSignature`] rather than a panic.
/// Square signs a URL too: see [`sign_at`].
pub fn sign(
    scheme: Scheme,
    secret: &str,
    timestamp: i64,
    id: &str,
    body: &[u8],
) -> Vec<(&'static str, String)> {
    sign_at(scheme, secret, timestamp, id, "", body)
}

/// As [`sign`], with the notification URL Square signs.
pub fn sign_at(
    scheme: Scheme,
    secret: &str,
    timestamp: i64,
    id: &str,
    notification_url: &str,
    body: &[u8],
) -> Vec<(&'static str, String)> {
    let text = secret.as_bytes();
    match scheme {
        Scheme::Sume => sume::sign(text, timestamp, body),
        Scheme::StandardWebhooks | Scheme::Svix => {
            let key = parse_whsec(secret).unwrap_or_else(|_| text.to_vec());
            let names = if scheme == Scheme::Svix {
                &standard::SVIX_NAMES
            } else {
                &standard::STANDARD_NAMES
            };
            standard::sign(names, &key, id, timestamp, body)
        }
        Scheme::Stripe => stripe::sign(text, timestamp, body),
        Scheme::Github => github::sign(text, body),
        Scheme::Slack => v0::sign(&v0::SLACK, text, timestamp, body),
        Scheme::Shopify => shopify::sign(text, body),
        Scheme::Paddle => paddle::sign(text, timestamp, body),
        Scheme::Square => square::sign(text, notification_url, body),
        Scheme::Zoom => v0::sign(&v0::ZOOM, text, timestamp, body),
        Scheme::Linear => linear::sign(text, body),
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
    /// Where the signed body holds the timestamp, in Unix milliseconds,
    /// for a scheme that signs it there rather than in a header (Linear).
    body_timestamp_ms: Option<&'static str>,
}

/// The Unix seconds of the body's millisecond timestamp at `pointer`.
fn body_timestamp(body: &[u8], pointer: &str) -> Result<i64, VerifyError> {
    let field = &pointer[1..];
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|_| {
        VerifyError::Malformed(format!(
            "the body is not JSON, so it has no {field} to check"
        ))
    })?;
    value
        .pointer(pointer)
        .and_then(serde_json::Value::as_u64)
        .and_then(|ms| i64::try_from(ms / 1000).ok())
        .ok_or_else(|| {
            VerifyError::Malformed(format!(
                "the body's {field} must be Unix milliseconds (a whole number)"
            ))
        })
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
    // Linear reads its timestamp from the body: NOW, in milliseconds.
    const BODY: &[u8] =
        br#"{"request_id":"req_1","run_id":"run_1","webhookTimestamp":1700000000000}"#;

    fn secret(scheme: Scheme, n: u8) -> String {
        if scheme.base64_secrets() {
            // Any base64 will do; these are 24 bytes each.
            format!("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS{n}")
        } else {
            format!("secret-{n}")
        }
    }

    fn verifier(scheme: Scheme, secrets: &[String]) -> Verifier {
        Verifier::new(scheme, secrets, Duration::from_secs(300)).expect("valid secrets")
    }

    const ALL: [Scheme; 11] = crate::domain::ALL_SCHEMES;

    fn timed() -> impl Iterator<Item = Scheme> {
        ALL.into_iter().filter(|s| s.signs_timestamp())
    }

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
        for scheme in timed() {
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
    fn schemes_without_a_signed_timestamp_ignore_tolerance() {
        let untimed: Vec<Scheme> = ALL.into_iter().filter(|s| !s.signs_timestamp()).collect();
        assert_eq!(untimed, [Scheme::Github, Scheme::Shopify, Scheme::Square]);
        for scheme in untimed {
            let s = secret(scheme, 1);
            let headers = sign(scheme, &s, NOW, "", BODY);
            let v = verifier(scheme, &[s]);
            assert_eq!(v.verify(&lookup(&headers), BODY, i64::MAX), Ok(()));
        }
    }

    #[test]
    fn bad_mac_with_stale_timestamp_is_bad_signature() {
        for scheme in timed() {
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
                if matches!(*name, "webhook-id" | "svix-id") {
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
        // Every scheme is written as its name() in a config.
        for scheme in ALL {
            let quoted = format!("\"{}\"", scheme.name());
            assert_eq!(serde_json::to_string(&scheme).unwrap(), quoted);
        }
    }

    #[test]
    fn linear_checks_the_bodys_timestamp_once_the_signature_holds() {
        let s = secret(Scheme::Linear, 1);
        let v = verifier(Scheme::Linear, std::slice::from_ref(&s));
        let headers = sign(Scheme::Linear, &s, NOW, "", BODY);
        assert_eq!(
            v.verify(&lookup(&headers), BODY, NOW + 301),
            Err(VerifyError::TimestampOutOfTolerance {
                timestamp: NOW,
                now: NOW + 301,
                tolerance_secs: 300
            })
        );
        // No timestamp, or not milliseconds: refused as malformed.
        for body in [
            &br#"{"action":"create"}"#[..],
            br#"{"webhookTimestamp":"1700000000000"}"#,
            br#"{"webhookTimestamp":-5}"#,
            b"not json",
        ] {
            let headers = sign(Scheme::Linear, &s, NOW, "", body);
            let result = v.verify(&lookup(&headers), body, NOW);
            assert!(
                matches!(&result, Err(VerifyError::Malformed(m)) if m.contains("webhookTimestamp")),
                "{result:?}"
            );
        }
    }

    #[test]
    fn a_linear_body_nested_80_kb_deep_is_refused_not_a_stack_overflow() {
        let s = secret(Scheme::Linear, 1);
        let v = verifier(Scheme::Linear, std::slice::from_ref(&s));
        let mut body = "[".repeat(40_000).into_bytes();
        body.extend("]".repeat(40_000).bytes());
        let headers = sign(Scheme::Linear, &s, NOW, "", &body);
        let result = v.verify(&lookup(&headers), &body, NOW);
        assert!(
            matches!(&result, Err(VerifyError::Malformed(m)) if m.contains("not JSON")),
            "{result:?}"
        );
    }

    #[test]
    fn square_signs_the_notification_url() {
        let s = secret(Scheme::Square, 1);
        let url = "https://hooks.example.com/ingest/square";
        let v = verifier(Scheme::Square, std::slice::from_ref(&s)).with_notification_url(url);
        let headers = sign_at(Scheme::Square, &s, NOW, "", url, BODY);
        assert_eq!(v.verify(&lookup(&headers), BODY, NOW), Ok(()));
        // Signed for another URL (a copy of the request posted elsewhere).
        let elsewhere = sign_at(Scheme::Square, &s, NOW, "", "https://evil.example/", BODY);
        assert_eq!(
            v.verify(&lookup(&elsewhere), BODY, NOW),
            Err(VerifyError::BadSignature)
        );
    }

    #[test]
    fn verify_which_names_the_secret_and_hex_mac_signs_with_it() {
        let (a, b) = (secret(Scheme::Zoom, 1), secret(Scheme::Zoom, 2));
        let v = verifier(Scheme::Zoom, &[a, b.clone()]);
        let headers = sign(Scheme::Zoom, &b, NOW, "", BODY);
        assert_eq!(v.verify_which(&lookup(&headers), BODY, NOW), Ok(1));
        assert_eq!(
            v.hex_mac(1, b"token").as_deref(),
            Some(hex::encode(mac(b.as_bytes(), "", b"token")).as_str())
        );
        assert_eq!(v.hex_mac(2, b"token"), None);
    }
}
