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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::{Scheme, Verifier, lookup};
    use super::*;

    // Shopify publishes no worked example. This one is computed as
    // Shopify's "Verify webhooks" page does it (Python:
    // base64.b64encode(hmac.new(secret.encode(), body, hashlib.sha256).digest())).
    const SECRET: &str = "hush";
    const BODY: &[u8] = br#"{"id":820982911946154508,"email":"jon@example.com","updated_at":"2021-12-31T19:00:00-05:00"}"#;
    const HMAC: &str = "Udt0/lOw7YcSqy1llp+EBT7eUqUbqYItCexUsSuQ9Ps=";

    #[test]
    fn a_body_signed_as_shopify_documents_verifies() {
        let v = Verifier::new(Scheme::Shopify, &[SECRET.to_owned()], Duration::ZERO).unwrap();
        let h = vec![("X-Shopify-Hmac-SHA256", HMAC.to_owned())];
        assert_eq!(v.verify(&lookup(&h), BODY, 0), Ok(()));
        assert_eq!(
            sign(SECRET.as_bytes(), BODY),
            vec![(SIGNATURE, HMAC.to_owned())]
        );
        let mut changed = BODY.to_vec();
        changed[10] = b'9';
        assert_eq!(
            v.verify(&lookup(&h), &changed, 0),
            Err(VerifyError::BadSignature)
        );
    }
}
