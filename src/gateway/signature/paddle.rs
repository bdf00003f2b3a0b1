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
