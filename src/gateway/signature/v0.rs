//! Slack and Zoom sign alike: a timestamp header (Unix seconds) and a
//! signature header `v0=<hex>`, HMAC-SHA256 over `"v0:{timestamp}:{body}"`
//! keyed with the secret as text.
//!
//! - Slack: `X-Slack-Request-Timestamp`, `X-Slack-Signature`, the app's
//!   signing secret.
//! - Zoom: `x-zm-request-timestamp`, `x-zm-signature`, the app's secret
//!   token.

use super::{Claim, VerifyError, hex_tag, mac, required, timestamp};

/// The two header names a sender uses.
pub(super) struct Names {
    timestamp: &'static str,
    signature: &'static str,
}

/// Slack's names.
pub(super) const SLACK: Names = Names {
    timestamp: "X-Slack-Request-Timestamp",
    signature: "X-Slack-Signature",
};

/// Zoom's names.
pub(super) const ZOOM: Names = Names {
    timestamp: "x-zm-request-timestamp",
    signature: "x-zm-signature",
};

pub(super) fn parse<'a>(
    names: &Names,
    header: &dyn Fn(&str) -> Option<&'a str>,
) -> Result<Claim, VerifyError> {
    let raw_ts = required(header, names.timestamp)?;
    let ts = timestamp(names.timestamp, raw_ts)?;
    let signature = names.signature;
    let hex = required(header, signature)?
        .strip_prefix("v0=")
        .ok_or_else(|| VerifyError::Malformed(format!("{signature}: expected v0=<hex>")))?;
    Ok(Claim {
        timestamp: Some(ts),
        prefix: format!("v0:{raw_ts}:"),
        tags: vec![hex_tag(signature, hex)?],
        body_timestamp_ms: None,
    })
}

pub(super) fn sign(names: &Names, key: &[u8], ts: i64, body: &[u8]) -> Vec<(&'static str, String)> {
    let tag = mac(key, &format!("v0:{ts}:"), body);
    vec![
        (names.timestamp, ts.to_string()),
        (names.signature, format!("v0={}", hex::encode(tag))),
    ]
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::{Scheme, Verifier, lookup};
    use super::*;

    // Slack's "Verifying requests from Slack", as slack_sdk's
    // tests/slack_sdk/signature/test_signature_verifier.py copies it:
    // signing secret, timestamp, body (byte for byte), signature.
    const SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";
    const TS: i64 = 1_531_420_618;
    const BODY: &str = "token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
    const SIGNATURE: &str = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503";

    fn verifier(scheme: Scheme) -> Verifier {
        Verifier::new(scheme, &[SECRET.to_owned()], Duration::from_secs(300)).unwrap()
    }

    #[test]
    fn slacks_worked_example_verifies_and_matches_sign() {
        let h = vec![
            ("X-Slack-Request-Timestamp", TS.to_string()),
            ("X-Slack-Signature", SIGNATURE.to_owned()),
        ];
        assert_eq!(
            verifier(Scheme::Slack).verify(&lookup(&h), BODY.as_bytes(), TS),
            Ok(())
        );
        assert_eq!(sign(&SLACK, SECRET.as_bytes(), TS, BODY.as_bytes()), h);
    }

    #[test]
    fn zoom_signs_as_slack_does_under_its_own_headers() {
        let h = vec![
            ("x-zm-request-timestamp", TS.to_string()),
            ("x-zm-signature", SIGNATURE.to_owned()),
        ];
        assert_eq!(
            verifier(Scheme::Zoom).verify(&lookup(&h), BODY.as_bytes(), TS),
            Ok(())
        );
        // Slack's headers mean nothing to a Zoom source.
        let slack = sign(&SLACK, SECRET.as_bytes(), TS, BODY.as_bytes());
        assert_eq!(
            verifier(Scheme::Zoom).verify(&lookup(&slack), BODY.as_bytes(), TS),
            Err(VerifyError::MissingHeader("x-zm-request-timestamp"))
        );
    }

    #[test]
    fn zooms_url_validation_token_is_the_hmac_of_the_plain_token() {
        // elastic/beats, x-pack/filebeat/input/http_endpoint tests: secret
        // token and plainToken (the plainToken of Zoom's own example) and
        // the encryptedToken expected back.
        let v = Verifier::new(
            Scheme::Zoom,
            &["secretValueTest".to_owned()],
            Duration::from_secs(300),
        )
        .unwrap();
        assert_eq!(
            v.hex_mac(0, b"qgg8vlvZRS6UYooatFL8Aw").as_deref(),
            Some("70c1f2e2e6ca2d39297490d1f9142c7d701415ea8e6151f6562a08fa657a40ff")
        );
    }

    #[test]
    fn a_signature_without_v0_is_malformed() {
        let h = vec![
            ("X-Slack-Request-Timestamp", TS.to_string()),
            (
                "X-Slack-Signature",
                SIGNATURE.trim_start_matches("v0=").to_owned(),
            ),
        ];
        let result = verifier(Scheme::Slack).verify(&lookup(&h), BODY.as_bytes(), TS);
        assert!(
            matches!(result, Err(VerifyError::Malformed(_))),
            "{result:?}"
        );
    }
}
