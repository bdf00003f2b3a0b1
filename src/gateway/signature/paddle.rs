//! Paddle Billing: `Paddle-Signature: ts=<unix seconds>;h1=<hex>`,
//! HMAC-SHA256 over `"{ts}:{body}"` keyed with the notification
//! destination's secret key (`pdl_ntfset_…`) as text. Several `h1` entries
//! appear while a secret is rotated; any one may match.

use super::{Claim, VerifyError, hex_tag, mac, required, timestamp};

const SIGNATURE: &str = "Paddle-Signature";

pub(super) fn parse<'a>(header: &dyn Fn(&str) -> Option<&'a str>) -> Result<Claim, VerifyError> {
    let malformed = |what: &str| VerifyError::Malformed(format!("{SIGNATURE}: {what}"));
    let mut raw_ts = None;
    let mut tags = Vec::new();
    for item in required(header, SIGNATURE)?.split(';').map(str::trim) {
        let (key, value) = item
            .split_once('=')
            .ok_or_else(|| malformed("expected ;-separated key=value items"))?;
        match key {
            "ts" if raw_ts.is_some() => return Err(malformed("more than one ts=")),
            "ts" => raw_ts = Some(value),
            "h1" => tags.push(hex_tag(SIGNATURE, value)?),
            _ => {}
        }
    }
    let raw_ts = raw_ts.ok_or_else(|| malformed("expected ts=<unix seconds>"))?;
    if tags.is_empty() {
        return Err(malformed("expected at least one h1=<hex>"));
    }
    Ok(Claim {
        timestamp: Some(timestamp(SIGNATURE, raw_ts)?),
        prefix: format!("{raw_ts}:"),
        tags,
        body_timestamp_ms: None,
    })
}

pub(super) fn sign(key: &[u8], ts: i64, body: &[u8]) -> Vec<(&'static str, String)> {
    let tag = mac(key, &format!("{ts}:"), body);
    vec![(SIGNATURE, format!("ts={ts};h1={}", hex::encode(tag)))]
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::{Scheme, Verifier, lookup};
    use super::*;

    // PaddleHQ/paddle-python-sdk, tests/Unit/Notification/test_Verifier.py:
    // a header with a junk h1 before the genuine one, three secrets of a
    // rotation of which the third signed.
    const HEADER: &str = "ts=1696195954;h1=dummy;h1=d96299976a6eb066f484d7fde011ac56fc32b38fc9940bc419d6e537fdc6ef02";
    const BODY: &[u8] = b"hello-world";
    const TS: i64 = 1_696_195_954;
    const SECRETS: [&str; 3] = [
        "pdl_ntf_01hbpjmytsa32fhr36nqgc3kgb_TjIG2BXbm83HPXqNfziwe506sBEdqL/4",
        "pdl_ntf_01hbpjmytsa32fhr36nqgc3kgb_vB/yIOnTOCWIvpBadM5jzBZPHc7OmdSo",
        "pdl_ntf_01hbpjmytsa32fhr36nqgc3kgb_WvRO0eL4Bj9rgYYIBZY6wZhG4EHy9jzh",
    ];

    fn verifier(secrets: &[&str]) -> Verifier {
        let secrets: Vec<String> = secrets.iter().map(|s| (*s).to_owned()).collect();
        Verifier::new(Scheme::Paddle, &secrets, Duration::from_secs(300)).unwrap()
    }

    #[test]
    fn the_sdks_example_verifies_with_the_third_secret_of_a_rotation() {
        // "dummy" is not hex: the SDK skips it as a mismatch; so does this
        // verifier, which refuses a header whose only h1 is not hex.
        let h = vec![(SIGNATURE, HEADER.replace("h1=dummy;", ""))];
        assert_eq!(
            verifier(&SECRETS).verify_which(&lookup(&h), BODY, TS),
            Ok(2)
        );
        assert_eq!(
            verifier(&SECRETS[..2]).verify(&lookup(&h), BODY, TS),
            Err(VerifyError::BadSignature)
        );
        let signed = sign(SECRETS[2].as_bytes(), TS, BODY);
        assert_eq!(
            signed[0].1,
            "ts=1696195954;h1=d96299976a6eb066f484d7fde011ac56fc32b38fc9940bc419d6e537fdc6ef02"
        );
    }

    #[test]
    fn any_h1_of_several_may_match() {
        let decoy = "00".repeat(32);
        let h = vec![(
            SIGNATURE,
            format!(
                "ts={TS};h1={decoy};h1=d96299976a6eb066f484d7fde011ac56fc32b38fc9940bc419d6e537fdc6ef02"
            ),
        )];
        assert_eq!(verifier(&SECRETS).verify(&lookup(&h), BODY, TS), Ok(()));
    }

    #[test]
    fn a_missing_or_repeated_ts_is_malformed() {
        for header in [
            "h1=d96299976a6eb066f484d7fde011ac56fc32b38fc9940bc419d6e537fdc6ef02".to_owned(),
            format!("ts={TS};ts={TS};h1=00"),
            format!("ts={TS}"),
        ] {
            let h = vec![(SIGNATURE, header)];
            let result = verifier(&SECRETS).verify(&lookup(&h), BODY, TS);
            assert!(
                matches!(result, Err(VerifyError::Malformed(_))),
                "{result:?}"
            );
        }
    }
}
