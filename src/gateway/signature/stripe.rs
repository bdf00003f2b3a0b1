//! Stripe: `Stripe-Signature: t=<ts>,v1=<hex>[,v1=<hex>][,v0=<hex>]`,
//! HMAC-SHA256 over `"{t}.{body}"`.
//!
//! Only `v1` entries count: `v0` is a test-mode signature under another key,
//! and other schemes may be added by Stripe later. Several `v1` entries appear
//! while an endpoint secret is being rolled.

use super::{Claim, VerifyError, hex_tag, mac, required, timestamp};

const SIGNATURE: &str = "Stripe-Signature";

pub(super) fn parse<'a>(header: &dyn Fn(&str) -> Option<&'a str>) -> Result<Claim, VerifyError> {
    let malformed = |what: &str| VerifyError::Malformed(format!("{SIGNATURE}: {what}"));
    let mut raw_ts = None;
    let mut tags = Vec::new();
    for item in required(header, SIGNATURE)?.split(',').map(str::trim) {
        let (key, value) = item
            .split_once('=')
            .ok_or_else(|| malformed("expected comma-separated key=value items"))?;
        match key {
            // Two timestamps would leave it unclear which one the sender meant.
            "t" if raw_ts.is_some() => return Err(malformed("more than one t=")),
            "t" => raw_ts = Some(value),
            "v1" => tags.push(hex_tag(SIGNATURE, value)?),
            _ => {}
        }
    }
    let raw_ts = raw_ts.ok_or_else(|| malformed("expected t=<unix seconds>"))?;
    if tags.is_empty() {
        return Err(malformed("expected at least one v1=<hex>"));
    }
    Ok(Claim {
        timestamp: Some(timestamp(SIGNATURE, raw_ts)?),
        prefix: format!("{raw_ts}."),
        tags,
        body_timestamp_ms: None,
    })
}

pub(super) fn sign(key: &[u8], ts: i64, body: &[u8]) -> Vec<(&'static str, String)> {
    let tag = mac(key, &format!("{ts}."), body);
    vec![(SIGNATURE, format!("t={ts},v1={}", hex::encode(tag)))]
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::{Scheme, Verifier, lookup};
    use super::*;

    // arlyon/async-stripe, src/resources/webhook_events.rs, test
    // `test_webhook_construct_event`: secret, timestamp, payload (byte for
    // byte, including the final newline) and header.
    const SECRET: &str = "webhook_secret";
    const TS: i64 = 1_533_204_620;
    const PAYLOAD: &str = r#"{
  "id": "evt_123",
  "object": "event",
  "account": "acct_123",
  "api_version": "2017-05-25",
  "created": 1533204620,
  "data": {
    "object": {
      "id": "ii_123",
      "object": "invoiceitem",
      "amount": 1000,
      "currency": "usd",
      "customer": "cus_123",
      "date": 1533204620,
      "description": "Test Invoice Item",
      "discountable": false,
      "invoice": "in_123",
      "livemode": false,
      "metadata": {},
      "period": {
        "start": 1533204620,
        "end": 1533204620
      },
      "plan": null,
      "proration": false,
      "quantity": null,
      "subscription": null
    }
  },
  "livemode": false,
  "pending_webhooks": 1,
  "request": {
    "id": "req_123",
    "idempotency_key": "idempotency-key-123"
  },
  "type": "invoiceitem.created"
}
"#;
    const V1: &str = "f0bdba6d4eacbd8ad8a3bbadd7248e633ec1477f7899c124c51b39405fa36613";
    const V0: &str = "63f3a72374a733066c4be69ed7f8e5ac85c22c9f0a6a612ab9a025a9e4ee7eef";

    fn verifier() -> Verifier {
        Verifier::new(
            Scheme::Stripe,
            &[SECRET.to_owned()],
            Duration::from_secs(300),
        )
        .expect("valid secret")
    }

    fn verify(header: String) -> Result<(), VerifyError> {
        let h = vec![("stripe-signature", header)];
        verifier().verify(&lookup(&h), PAYLOAD.as_bytes(), TS)
    }

    #[test]
    fn known_answer_verifies() {
        assert_eq!(verify(format!("t={TS},v1={V1},v0={V0}")), Ok(()));
    }

    #[test]
    fn known_answer_matches_sign() {
        let signed = sign(SECRET.as_bytes(), TS, PAYLOAD.as_bytes());
        assert_eq!(signed, vec![(SIGNATURE, format!("t={TS},v1={V1}"))]);
    }

    #[test]
    fn any_v1_entry_may_match() {
        let decoy = "00".repeat(32);
        assert_eq!(verify(format!("t={TS},v1={decoy},v1={V1}")), Ok(()));
        assert_eq!(verify(format!("v1={V1}, t={TS}")), Ok(()));
    }

    #[test]
    fn v0_does_not_count() {
        let decoy = "00".repeat(32);
        let result = verify(format!("t={TS},v1={decoy},v0={V1}"));
        assert_eq!(result, Err(VerifyError::BadSignature));
        let result = verify(format!("t={TS},v0={V1}"));
        assert!(
            matches!(result, Err(VerifyError::Malformed(_))),
            "{result:?}"
        );
    }

    #[test]
    fn missing_or_repeated_t_is_malformed() {
        for header in [format!("v1={V1}"), format!("t={TS},t={TS},v1={V1}")] {
            let result = verify(header);
            assert!(
                matches!(result, Err(VerifyError::Malformed(_))),
                "{result:?}"
            );
        }
    }
}
