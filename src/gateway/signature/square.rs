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
