//! Standard Webhooks (<https://www.standardwebhooks.com/>): `webhook-id`,
//! `webhook-timestamp`, and `webhook-signature: v1,<base64> v1,<base64> ...`,
//! HMAC-SHA256 over `"{id}.{timestamp}.{body}"` keyed with the base64 part of
//! a `whsec_<base64>` secret.
//!
//! Entries of other versions (`v1a` is the asymmetric Ed25519 variant) are
//! skipped, as the spec asks.
//!
//! Svix, the spec's origin, signs the same way under its own header names
//! (`svix-id`, `svix-timestamp`, `svix-signature`): Clerk, Resend and the
//! other providers that send through Svix.

use base64::Engine;
use base64::alphabet::STANDARD;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};

use super::{Claim, VerifyError, mac, required, timestamp};

/// The three header names a sender uses.
pub(super) struct Names {
    id: &'static str,
    timestamp: &'static str,
    signature: &'static str,
}

/// Standard Webhooks' names.
pub(super) const STANDARD_NAMES: Names = Names {
    id: "webhook-id",
    timestamp: "webhook-timestamp",
    signature: "webhook-signature",
};

/// Svix's names.
pub(super) const SVIX_NAMES: Names = Names {
    id: "svix-id",
    timestamp: "svix-timestamp",
    signature: "svix-signature",
};

#[cfg(test)]
const ID: &str = STANDARD_NAMES.id;
#[cfg(test)]
const TIMESTAMP: &str = STANDARD_NAMES.timestamp;
#[cfg(test)]
const SIGNATURE: &str = STANDARD_NAMES.signature;
const SECRET_PREFIX: &str = "whsec_";

// Senders differ on whether they pad; the padding carries no information.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Parses a `whsec_<base64>` secret into key bytes (also accepts bare base64 without the prefix).
pub fn parse_whsec(secret: &str) -> Result<Vec<u8>, String> {
    let encoded = secret.strip_prefix(SECRET_PREFIX).unwrap_or(secret);
    // The decoder's message would quote the offending byte of the secret.
    match BASE64.decode(encoded) {
        Ok(key) if !key.is_empty() => Ok(key),
        _ => Err("expected whsec_<base64> with a non-empty key".to_owned()),
    }
}

/// Signs for forwarding with the Standard Webhooks scheme: returns the `webhook-signature` header value `v1,<base64 of HMAC-SHA256(key, "{id}.{timestamp}.{body}")>`.
pub fn sign_standard_webhooks(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    let tag = mac(key, &format!("{id}.{timestamp}."), body);
    format!("v1,{}", BASE64.encode(tag))
}

/// The `webhook-signature` header value for a forward signed with each of
/// `keys`: their `v1,<base64>` entries in order, separated by spaces. A
/// verifier holding any one of the keys finds its entry (the spec lets a
/// sender list several, for rotating secrets).
pub fn signature_header(keys: &[Vec<u8>], id: &str, timestamp: i64, body: &[u8]) -> String {
    let signed = format!("{id}.{timestamp}.");
    keys.iter()
        .map(|key| format!("v1,{}", BASE64.encode(mac(key, &signed, body))))
        .collect::<Vec<_>>()
        .join(" ")
}

pub(super) fn parse<'a>(
    names: &Names,
    header: &dyn Fn(&str) -> Option<&'a str>,
) -> Result<Claim, VerifyError> {
    let signature = names.signature;
    let id = required(header, names.id)?;
    let raw_ts = required(header, names.timestamp)?;
    let ts = timestamp(names.timestamp, raw_ts)?;
    let mut tags = Vec::new();
    for entry in required(header, signature)?
        .split(' ')
        .filter(|e| !e.is_empty())
    {
        let (version, tag) = entry.split_once(',').ok_or_else(|| {
            VerifyError::Malformed(format!("{signature}: expected v1,<base64> entries"))
        })?;
        if version == "v1" {
            tags.push(BASE64.decode(tag).map_err(|_| {
                VerifyError::Malformed(format!("{signature}: expected base64 after v1,"))
            })?);
        }
    }
    if tags.is_empty() {
        return Err(VerifyError::Malformed(format!(
            "{signature}: expected at least one v1,<base64> entry"
        )));
    }
    Ok(Claim {
        timestamp: Some(ts),
        prefix: format!("{id}.{raw_ts}."),
        tags,
        body_timestamp_ms: None,
    })
}

pub(super) fn sign(
    names: &Names,
    key: &[u8],
    id: &str,
    ts: i64,
    body: &[u8],
) -> Vec<(&'static str, String)> {
    vec![
        (names.id, id.to_owned()),
        (names.timestamp, ts.to_string()),
        (names.signature, sign_standard_webhooks(key, id, ts, body)),
    ]
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::{Scheme, Verifier, lookup};
    use super::*;

    /// One known answer: secret, id, timestamp, body, `webhook-signature`.
    struct Vector {
        secret: &'static str,
        id: &'static str,
        ts: i64,
        body: &'static [u8],
        signature: &'static str,
    }

    const VECTORS: [Vector; 2] = [
        // standard-webhooks/standard-webhooks,
        // libraries/javascript/src/webhook.test.ts, test "sign function works".
        Vector {
            secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            id: "msg_p5jXN8AQM9LWM0D4loKWxJek",
            ts: 1_614_265_330,
            body: br#"{"test": 2432232314}"#,
            signature: "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
        },
        // standard-webhooks/standard-webhooks, libraries/rust/src/lib.rs,
        // test `test_sign`.
        Vector {
            secret: "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD",
            id: "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk",
            ts: 1_649_367_553,
            body: br#"{"email":"test@example.com","username":"test_user"}"#,
            signature: "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=",
        },
    ];

    fn verifier(secret: &str) -> Verifier {
        Verifier::new(
            Scheme::StandardWebhooks,
            &[secret.to_owned()],
            Duration::from_secs(300),
        )
        .expect("valid secret")
    }

    fn headers(v: &Vector, signature: &str) -> Vec<(&'static str, String)> {
        vec![
            (ID, v.id.to_owned()),
            (TIMESTAMP, v.ts.to_string()),
            (SIGNATURE, signature.to_owned()),
        ]
    }

    #[test]
    fn known_answers_verify() {
        for v in &VECTORS {
            let h = headers(v, v.signature);
            assert_eq!(verifier(v.secret).verify(&lookup(&h), v.body, v.ts), Ok(()));
        }
    }

    #[test]
    fn known_answers_match_sign_standard_webhooks() {
        for v in &VECTORS {
            let key = parse_whsec(v.secret).expect("valid secret");
            assert_eq!(
                sign_standard_webhooks(&key, v.id, v.ts, v.body),
                v.signature
            );
        }
    }

    #[test]
    fn known_answer_among_other_signatures_verifies() {
        // standard-webhooks/standard-webhooks, libraries/rust/src/lib.rs,
        // test `test_verify_with_multiple_signatures`: the decoys around the
        // valid entry come from there; the `v1a` entry from the example headers
        // in spec/standard-webhooks.md of the same repository.
        let v = &VECTORS[1];
        let multi = format!(
            "v1,tFtCZ5RDCPxzWQRWXWPgrCgE2frDBe9gjpbWQxnVfsQ= \
             v1,Mm7xgUVICxZfQ3bgf0h0Dof65L/IFx+PnZvnDWPCX6Q= \
             v1a,hnO3f9T8Ytu9HwrXslvumlUpqtNVqkhqw/enGzPCXe5BdqzCInXqYXFymVJaA7AZdpXwVLPo3mNl8EM+m7TBAg== \
             {} \
             v1,9DfC1c3eeOrXB6w/5dIDydLNQaEyww5KalE5jLBZucE=",
            v.signature
        );
        let h = headers(v, &multi);
        assert_eq!(verifier(v.secret).verify(&lookup(&h), v.body, v.ts), Ok(()));
    }

    #[test]
    fn a_header_signed_with_several_keys_verifies_with_each_key_alone() {
        let v = &VECTORS[0];
        let (new, old) = (VECTORS[1].secret, v.secret);
        let keys = [parse_whsec(new).unwrap(), parse_whsec(old).unwrap()];
        let header = signature_header(&keys, v.id, v.ts, v.body);
        let entries: Vec<&str> = header.split(' ').collect();
        assert_eq!(
            entries,
            [
                sign_standard_webhooks(&keys[0], v.id, v.ts, v.body),
                sign_standard_webhooks(&keys[1], v.id, v.ts, v.body),
            ],
            "one entry per key, in the listed order"
        );
        assert_eq!(entries[1], v.signature);
        let h = headers(v, &header);
        for secret in [new, old] {
            assert_eq!(verifier(secret).verify(&lookup(&h), v.body, v.ts), Ok(()));
            assert_eq!(
                verifier(secret).verify(&lookup(&h), b"{\"test\": 1}", v.ts),
                Err(VerifyError::BadSignature)
            );
        }
        assert_eq!(
            verifier("whsec_c2VjcmV0LW90aGVy").verify(&lookup(&h), v.body, v.ts),
            Err(VerifyError::BadSignature)
        );
    }

    #[test]
    fn decoys_alone_are_bad_signature() {
        let v = &VECTORS[1];
        let h = headers(v, "v1,tFtCZ5RDCPxzWQRWXWPgrCgE2frDBe9gjpbWQxnVfsQ=");
        let result = verifier(v.secret).verify(&lookup(&h), v.body, v.ts);
        assert_eq!(result, Err(VerifyError::BadSignature));
    }

    #[test]
    fn only_other_versions_is_malformed() {
        let v = &VECTORS[0];
        let h = headers(v, &v.signature.replacen("v1,", "v1a,", 1));
        let result = verifier(v.secret).verify(&lookup(&h), v.body, v.ts);
        assert!(
            matches!(result, Err(VerifyError::Malformed(_))),
            "{result:?}"
        );
    }

    #[test]
    fn whsec_prefix_is_optional() {
        // The JavaScript reference accepts both forms ("verification works
        // with and without signature prefix").
        assert_eq!(
            parse_whsec("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
            parse_whsec("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
        );
        assert_eq!(parse_whsec("whsec_AAECAw=="), Ok(vec![0, 1, 2, 3]));
        assert_eq!(parse_whsec("whsec_AAECAw"), Ok(vec![0, 1, 2, 3]));
    }
}

#[cfg(test)]
mod svix_tests {
    use std::time::Duration;

    use super::super::{Scheme, Verifier, lookup};
    use super::*;

    #[test]
    fn svixs_own_example_verifies_under_svix_headers() {
        // svix/svix-webhooks, python/tests/test_webhooks.py,
        // test_sign_function (Standard Webhooks' first vector too).
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let body = br#"{"test": 2432232314}"#;
        let h = vec![
            ("svix-id", "msg_p5jXN8AQM9LWM0D4loKWxJek".to_owned()),
            ("svix-timestamp", "1614265330".to_owned()),
            (
                "svix-signature",
                "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=".to_owned(),
            ),
        ];
        let v =
            Verifier::new(Scheme::Svix, &[secret.to_owned()], Duration::from_secs(300)).unwrap();
        assert_eq!(v.verify(&lookup(&h), body, 1_614_265_330), Ok(()));
        let key = parse_whsec(secret).unwrap();
        assert_eq!(
            sign(
                &SVIX_NAMES,
                &key,
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                1_614_265_330,
                body
            ),
            h
        );
        // Standard Webhooks' names mean nothing to a svix source.
        let standard = sign(&STANDARD_NAMES, &key, "msg_1", 1_614_265_330, body);
        assert_eq!(
            v.verify(&lookup(&standard), body, 1_614_265_330),
            Err(VerifyError::MissingHeader("svix-id"))
        );
    }
}
