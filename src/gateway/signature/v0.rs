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
