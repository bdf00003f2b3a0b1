//! Sume: `X-Sume-Timestamp: <unix s>` and `X-Sume-Signature: v1=<hex>`,
//! HMAC-SHA256 over `"{timestamp}.{body}"`.
//!
//! Sume publishes no reference library, so this follows our design contract.
//! During a secret rotation the signature header may carry several `v1=`
//! entries separated by spaces or commas; entries of other versions are
//! skipped so that a future `v2=` does not break verification.

use super::{Claim, VerifyError, hex_tag, mac, required, timestamp};

const TIMESTAMP: &str = "X-Sume-Timestamp";
const SIGNATURE: &str = "X-Sume-Signature";

pub(super) fn parse<'a>(header: &dyn Fn(&str) -> Option<&'a str>) -> Result<Claim, VerifyError> {
    let raw_ts = required(header, TIMESTAMP)?;
    let ts = timestamp(TIMESTAMP, raw_ts)?;
    let mut tags = Vec::new();
    for entry in required(header, SIGNATURE)?
        .split([' ', ','])
        .filter(|e| !e.is_empty())
    {
        let (version, tag) = entry.split_once('=').ok_or_else(|| {
            VerifyError::Malformed(format!("{SIGNATURE}: expected v1=<hex> entries"))
        })?;
        if version == "v1" {
            tags.push(hex_tag(SIGNATURE, tag)?);
        }
    }
    if tags.is_empty() {
        return Err(VerifyError::Malformed(format!(
            "{SIGNATURE}: expected at least one v1=<hex> entry"
        )));
    }
    Ok(Claim {
        timestamp: Some(ts),
        prefix: format!("{raw_ts}."),
        tags,
        body_timestamp_ms: None,
    })
}

pub(super) fn sign(key: &[u8], ts: i64, body: &[u8]) -> Vec<(&'static str, String)> {
    let tag = mac(key, &format!("{ts}."), body);
    vec![
        (TIMESTAMP, ts.to_string()),
        (SIGNATURE, format!("v1={}", hex::encode(tag))),
    ]
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::{Scheme, Verifier, VerifyError, lookup};
    use super::*;

    const SECRET: &str = "sume_test_secret";
    const TS: i64 = 1_700_000_000;
    const BODY: &[u8] = br#"{"request_id":"req_123","run_id":"run_9"}"#;
    // No public vector exists for Sume; computed independently of this code,
    // and both tools agree:
    //   python3 -c 'import hmac,hashlib; print(hmac.new(b"sume_test_secret",
    //     b"1700000000.{\"request_id\":\"req_123\",\"run_id\":\"run_9\"}",
    //     hashlib.sha256).hexdigest())'
    //   printf '%s' '1700000000.{"request_id":"req_123","run_id":"run_9"}' \
    //     | openssl dgst -sha256 -hmac sume_test_secret
    const EXPECTED: &str = "4c743fc6b4f5d9ee31795de0f5404004f46c32f5c7cf18211370d33699be2bc7";

    fn verifier() -> Verifier {
        Verifier::new(Scheme::Sume, &[SECRET.to_owned()], Duration::from_secs(300))
            .expect("valid secret")
    }

    fn headers(signature: &str) -> Vec<(&'static str, String)> {
        vec![
            ("x-sume-timestamp", TS.to_string()),
            ("x-sume-signature", signature.to_owned()),
        ]
    }

    #[test]
    fn known_answer_verifies() {
        let h = headers(&format!("v1={EXPECTED}"));
        assert_eq!(verifier().verify(&lookup(&h), BODY, TS), Ok(()));
    }

    #[test]
    fn known_answer_matches_sign() {
        let signed = sign(SECRET.as_bytes(), TS, BODY);
        assert_eq!(signed[1], (SIGNATURE, format!("v1={EXPECTED}")));
    }

    #[test]
    fn any_of_several_entries_may_match() {
        let other = "00".repeat(32);
        for sep in [" ", ",", ", "] {
            let h = headers(&format!("v1={other}{sep}v2=abc{sep}v1={EXPECTED}"));
            assert_eq!(verifier().verify(&lookup(&h), BODY, TS), Ok(()), "{sep:?}");
        }
    }

    #[test]
    fn only_other_versions_is_malformed() {
        let h = headers(&format!("v2={EXPECTED}"));
        let result = verifier().verify(&lookup(&h), BODY, TS);
        assert!(
            matches!(result, Err(VerifyError::Malformed(_))),
            "{result:?}"
        );
    }

    #[test]
    fn signed_timestamp_text_must_be_plain_digits() {
        let mut h = headers(&format!("v1={EXPECTED}"));
        h[0].1 = format!("+{TS}");
        let result = verifier().verify(&lookup(&h), BODY, TS);
        assert!(
            matches!(result, Err(VerifyError::Malformed(_))),
            "{result:?}"
        );
    }
}
