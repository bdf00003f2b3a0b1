//! Owner tokens: 128 random bits, returned only to the claimer.

use std::fmt;

use subtle::ConstantTimeEq;

use super::Invalid;

/// An owner token. Shown to clients as 32 lowercase hex digits.
// Serialized only into the store's write-ahead log, never into answers.
#[derive(Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Token([u8; 16]);

impl Token {
    /// A fresh random token.
    pub fn random() -> Self {
        // ThreadRng is a CSPRNG seeded from, and reseeded by, the OS.
        Self(rand::random())
    }

    /// Parses the hex form a client sends back.
    pub fn parse(raw: &str) -> Result<Self, Invalid> {
        let mut bytes = [0u8; 16];
        hex::decode_to_slice(raw, &mut bytes).map_err(|_| {
            Invalid::new(
                "invalid_token",
                "token",
                "must be the 32 hex digits returned by the claim",
            )
        })?;
        Ok(Self(bytes))
    }

    /// The token as stored.
    pub fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }

    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// Compares in constant time, so timing does not reveal a token.
    pub fn matches(&self, other: &Token) -> bool {
        self.0.ct_eq(&other.0).into()
    }

    /// The hex form given to the claimer.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Debug for Token {
    // Tokens are secrets: keep them out of logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_through_hex_and_differ() {
        let a = Token::random();
        let b = Token::random();
        assert_ne!(a, b);
        assert_eq!(a.to_hex().len(), 32);
        assert!(Token::parse(&a.to_hex()).unwrap().matches(&a));
        assert!(!a.matches(&b));
    }

    #[test]
    fn malformed_tokens_are_refused() {
        assert!(Token::parse("").is_err());
        assert!(Token::parse("zz").is_err());
        assert!(Token::parse(&"a".repeat(34)).is_err());
    }
}
