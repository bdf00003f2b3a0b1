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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::{Scheme, Verifier, lookup};
    use super::*;

    // Linear publishes no worked example. This one is computed as its SDK
    // verifies (crypto.createHmac("sha256", secret).update(rawBody)
    // .digest("hex"), compared with Linear-Signature).
    const SECRET: &str = "lin_wh_secret";
    const BODY: &[u8] = br#"{"action":"update","type":"Issue","createdAt":"2026-12-03T10:00:00.000Z","data":{"id":"iss_1"},"webhookTimestamp":1796292000000}"#;
    const SIGNATURE_HEX: &str = "13991be866930d0bc18f6e7d3e2021003492755aab086dc20064b2938cf765fc";

    #[test]
    fn a_body_signed_as_linear_documents_verifies_within_its_timestamp() {
        let v = Verifier::new(
            Scheme::Linear,
            &[SECRET.to_owned()],
            Duration::from_secs(60),
        )
        .unwrap();
        let h = vec![(SIGNATURE, SIGNATURE_HEX.to_owned())];
        let at = 1_796_292_000;
        assert_eq!(v.verify(&lookup(&h), BODY, at), Ok(()));
        assert_eq!(sign(SECRET.as_bytes(), BODY), h);
        assert!(matches!(
            v.verify(&lookup(&h), BODY, at + 61),
            Err(VerifyError::TimestampOutOfTolerance { .. })
        ));
    }
}
