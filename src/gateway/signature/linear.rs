//! Linear: `Linear-Signature: <hex>`, HMAC-SHA256 over the raw body keyed
//! with the webhook's signing secret as text. The timestamp is in the
//! signed body, `webhookTimestamp` (Unix milliseconds), and is checked
//! against the tolerance once the signature holds.

use super::{Claim, VerifyError, hex_tag, mac, required};

const SIGNATURE: &str = "Linear-Signature";

/// Where the body carries its timestamp.
pub(super) const TIMESTAMP_POINTER: &str = "/webhookTimestamp";

pub(super) fn parse<'a>(header: &dyn Fn(&str) -> Option<&'a str>) -> Result<Claim, VerifyError> {
    Ok(Claim {
        timestamp: None,
        prefix: String::new(),
        tags: vec![hex_tag(SIGNATURE, required(header, SIGNATURE)?.trim())?],
        body_timestamp_ms: Some(TIMESTAMP_POINTER),
    })
}

pub(super) fn sign(key: &[u8], body: &[u8]) -> Vec<(&'static str, String)> {
    vec![(SIGNATURE, hex::encode(mac(key, "", body)))]
}
