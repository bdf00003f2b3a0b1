//! Shopify: `X-Shopify-Hmac-Sha256: <base64>`, HMAC-SHA256 over the raw
//! body keyed with the app's client secret as text. No timestamp is
//! signed, so there is no replay window; and the webhook's ids
//! (`X-Shopify-Webhook-Id`, `X-Shopify-Event-Id`) sit in unsigned headers.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use super::{Claim, VerifyError, mac, required};

const SIGNATURE: &str = "X-Shopify-Hmac-Sha256";

pub(super) fn parse<'a>(header: &dyn Fn(&str) -> Option<&'a str>) -> Result<Claim, VerifyError> {
    let tag = STANDARD
        .decode(required(header, SIGNATURE)?.trim())
        .map_err(|_| VerifyError::Malformed(format!("{SIGNATURE}: expected base64")))?;
    Ok(Claim {
        timestamp: None,
        prefix: String::new(),
        tags: vec![tag],
        body_timestamp_ms: None,
    })
}

pub(super) fn sign(key: &[u8], body: &[u8]) -> Vec<(&'static str, String)> {
    vec![(SIGNATURE, STANDARD.encode(mac(key, "", body)))]
}
