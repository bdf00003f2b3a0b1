//! Fingerprints: an optional digest of the payload a claim is for.

use super::Invalid;

/// Longest fingerprint, in bytes.
pub const MAX_FINGERPRINT_BYTES: usize = 256;

/// An opaque fingerprint such as a hex SHA-256 of the payload: 1 to 256
/// bytes, no control characters. Compared exactly.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Fingerprint(String);

impl Fingerprint {
    /// Parses the `fingerprint` field of a claim.
    pub fn parse(raw: &str) -> Result<Self, Invalid> {
        let code = "invalid_fingerprint";
        if raw.is_empty() || raw.len() > MAX_FINGERPRINT_BYTES {
            return Err(Invalid::new(
                code,
                "fingerprint",
                format!("must be 1 to {MAX_FINGERPRINT_BYTES} bytes"),
            ));
        }
        if raw.chars().any(char::is_control) {
            return Err(Invalid::new(
                code,
                "fingerprint",
                "must not contain control characters",
            ));
        }
        Ok(Self(raw.to_owned()))
    }

    /// The fingerprint as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}
