//! GitHub: `X-Hub-Signature-256: sha256=<hex>`, HMAC-SHA256 over the raw
//! body. The signature carries no timestamp, so there is no replay window.

use super::{Claim, VerifyError, hex_tag, mac, required};

const SIGNATURE: &str = "X-Hub-Signature-256";

pub(super) fn parse<'a>(header: &dyn Fn(&str) -> Option<&'a str>) -> Result<Claim, VerifyError> {
    let hex = required(header, SIGNATURE)?
        .strip_prefix("sha256=")
        .ok_or_else(|| VerifyError::Malformed(format!("{SIGNATURE}: expected sha256=<hex>")))?;
    Ok(Claim {
        timestamp: None,
        prefix: String::new(),
        tags: vec![hex_tag(SIGNATURE, hex)?],
        body_timestamp_ms: None,
    })
}

pub(super) fn sign(key: &[u8], body: &[u8]) -> Vec<(&'static str, String)> {
    let tag = mac(key, "", body);
    vec![(SIGNATURE, format!("sha256={}", hex::encode(tag)))]
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::{Scheme, Verifier, lookup};
    use super::*;

    // GitHub Docs, "Validating webhook deliveries", section "Testing the
    // webhook payload validation" (github/docs,
    // content/webhooks/using-webhooks/validating-webhook-deliveries.md).
    const SECRET: &str = "It's a Secret to Everybody";
    const PAYLOAD: &[u8] = b"Hello, World!";
    const HEADER: &str = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";

    fn verifier() -> Verifier {
        Verifier::new(Scheme::Github, &[SECRET.to_owned()], Duration::ZERO).expect("valid secret")
    }

    #[test]
    fn known_answer_verifies() {
        let h = vec![("x-hub-signature-256", HEADER.to_owned())];
        assert_eq!(verifier().verify(&lookup(&h), PAYLOAD, 0), Ok(()));
    }

    #[test]
    fn known_answer_matches_sign() {
        assert_eq!(
            sign(SECRET.as_bytes(), PAYLOAD),
            vec![(SIGNATURE, HEADER.to_owned())]
        );
    }

    #[test]
    fn sha1_header_format_is_malformed() {
        // The legacy X-Hub-Signature format, offered in the wrong header.
        let h = vec![(
            SIGNATURE,
            "sha1=0123456789abcdef0123456789abcdef01234567".to_owned(),
        )];
        let result = verifier().verify(&lookup(&h), PAYLOAD, 0);
        assert!(
            matches!(result, Err(VerifyError::Malformed(_))),
            "{result:?}"
        );
    }
}
