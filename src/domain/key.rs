//! Keys: claim keys, stream names and event ids share one set of rules.

use super::Invalid;

/// Longest key, in bytes of UTF-8.
pub const MAX_KEY_BYTES: usize = 512;

/// A client-chosen name: 1 to 512 bytes of UTF-8 with no control characters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(String);

impl Key {
    /// Parses `raw` (already percent-decoded) as the field called `field`.
    pub fn parse(raw: &str, field: &'static str) -> Result<Self, Invalid> {
        let code = "invalid_key";
        if raw.is_empty() {
            return Err(Invalid::new(code, field, "must not be empty"));
        }
        if raw.len() > MAX_KEY_BYTES {
            return Err(Invalid::new(
                code,
                field,
                format!(
                    "must be at most {MAX_KEY_BYTES} bytes of UTF-8, got {}",
                    raw.len()
                ),
            ));
        }
        if let Some(c) = raw.chars().find(|c| c.is_control()) {
            return Err(Invalid::new(
                code,
                field,
                format!(
                    "must not contain control characters, found U+{:04X}",
                    u32::from(c)
                ),
            ));
        }
        Ok(Self(raw.to_owned()))
    }

    /// The key as the client sent it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Who owns a key. Namespaces keep the gateway's own claims, streams and
/// events apart from those of API users, so the two never collide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Namespace {
    /// Keys chosen by clients of the `/v1` API.
    Api,
    /// Keys the gateway makes for one configured source.
    Gateway(String),
    /// The gateway's per-stream delivery leases of one source (claims held
    /// while one instance delivers the stream), apart from its event ids.
    GatewayStream(String),
}

/// A [`Key`] placed in a [`Namespace`]: what the store actually keys on.
///
/// Encoding: `a/{key}` for the API, `g/{source}/{key}` for the gateway and
/// `s/{source}/{stream}` for its stream leases.
/// Source names cannot contain `/`, so the encoding is unambiguous.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct ScopedKey(String);

impl ScopedKey {
    /// Places `key` in `namespace`.
    pub fn new(namespace: &Namespace, key: &Key) -> Self {
        match namespace {
            Namespace::Api => Self(format!("a/{}", key.as_str())),
            Namespace::Gateway(source) => Self(format!("g/{source}/{}", key.as_str())),
            Namespace::GatewayStream(source) => Self(format!("s/{source}/{}", key.as_str())),
        }
    }

    /// A key in the API namespace.
    pub fn api(key: &Key) -> Self {
        Self::new(&Namespace::Api, key)
    }

    /// Rebuilds a scoped key from its stored encoding (as read back from a
    /// store); no validation, since only [`ScopedKey::new`] ever wrote it.
    pub fn from_stored(stored: String) -> Self {
        Self(stored)
    }

    /// Whether it is in the API's namespace (a client's claim), not the
    /// gateway's.
    pub fn is_api(&self) -> bool {
        self.0.starts_with("a/")
    }

    /// The stored encoding.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key without its namespace, as the client named it.
    pub fn key_part(&self) -> &str {
        match self.0.split_once('/') {
            Some(("g" | "s", rest)) => rest.split_once('/').map_or(rest, |(_, k)| k),
            Some((_, rest)) => rest,
            None => &self.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_of_1_to_512_bytes_without_control_characters_parse() {
        assert!(Key::parse("a", "key").is_ok());
        assert!(Key::parse(&"é".repeat(256), "key").is_ok());
        assert!(Key::parse("run/42 evt:7", "key").is_ok());
    }

    #[test]
    fn empty_long_and_control_keys_are_refused() {
        assert!(Key::parse("", "key").is_err());
        assert!(Key::parse(&"x".repeat(513), "key").is_err());
        assert!(Key::parse("a\nb", "key").is_err());
        assert!(Key::parse("a\u{7f}b", "key").is_err());
        assert!(Key::parse("a\u{85}b", "key").is_err());
    }

    #[test]
    fn namespaces_never_collide() {
        let k = Key::parse("gw/x", "key").unwrap();
        let api = ScopedKey::api(&k);
        let gw = ScopedKey::new(&Namespace::Gateway("x".into()), &k);
        assert_ne!(api, gw);
        assert_eq!(api.key_part(), "gw/x");
        assert_eq!(gw.key_part(), "gw/x");
    }
}
