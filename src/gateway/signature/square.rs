//! Square: `x-square-hmacsha256-signature: <base64>`, HMAC-SHA256 over the
//! notification URL (exactly as registered at Square) followed by the raw
//! body, keyed with the subscription's signature key as text. No
//! timestamp is signed, so there is no replay window.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use super::{Claim, VerifyError, mac, required};

const SIGNATURE: &str = "x-square-hmacsha256-signature";

pub(super) fn parse<'a>(
    notification_url: &str,
    header: &dyn Fn(&str) -> Option<&'a str>,
) -> Result<Claim, VerifyError> {
    let tag = STANDARD
        .decode(required(header, SIGNATURE)?.trim())
        .map_err(|_| VerifyError::Malformed(format!("{SIGNATURE}: expected base64")))?;
    Ok(Claim {
        timestamp: None,
        prefix: notification_url.to_owned(),
        tags: vec![tag],
        body_timestamp_ms: None,
    })
}

pub(super) fn sign(key: &[u8], notification_url: &str, body: &[u8]) -> Vec<(&'static str, String)> {
    vec![(SIGNATURE, STANDARD.encode(mac(key, notification_url, body)))]
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::{Scheme, Verifier, lookup};
    use super::*;

    /// square/square-python-sdk, tests/integration/test_webhooks_helper.py:
    /// body (byte for byte), signature key, notification URL, signature.
    const VECTORS: [(&str, &str, &str, &str); 2] = [
        (
            r#"{"merchant_id":"MLEFBHHSJGVHD","type":"webhooks.test_notification","event_id":"ac3ac95b-f97d-458c-a6e6-18981597e05f","created_at":"2022-07-13T20:30:59.037339943Z","data":{"type":"webhooks","id":"bc368e64-01aa-407e-b46e-3231809b1129"}}"#,
            "Ibxx_5AKakO-3qeNVR61Dw",
            "https://webhook.site/679a4f3a-dcfa-49ee-bac5-9d0edad886b9",
            "GF4YkrJgGBDZ9NIYbNXBnMzqb2HoL4RW/S6vkZ9/2N4=",
        ),
        (
            r#"{"data":{"type":"webhooks","id":">id<"}}"#,
            "signature-key",
            "https://webhook.site/webhooks",
            "Cxt7+aTi4rKgcA0bC4g9EHdVtLSDWdqccmL5MvihU4U=",
        ),
    ];

    #[test]
    fn the_sdks_examples_verify_and_match_sign() {
        for (body, key, url, signature) in VECTORS {
            let v = Verifier::new(Scheme::Square, &[key.to_owned()], Duration::ZERO)
                .unwrap()
                .with_notification_url(url);
            let h = vec![(SIGNATURE, signature.to_owned())];
            assert_eq!(v.verify(&lookup(&h), body.as_bytes(), 0), Ok(()));
            assert_eq!(sign(key.as_bytes(), url, body.as_bytes()), h);
            // The URL is signed: the same request at another URL is not.
            let moved = v.with_notification_url("https://webhook.site/other");
            assert_eq!(
                moved.verify(&lookup(&h), body.as_bytes(), 0),
                Err(VerifyError::BadSignature)
            );
        }
    }
}
