//! Where a field of an event is: `header:NAME`, `body:/json/pointer`, or
//! (for an event id) `body-sha256`, the hash of the exact signed body.

use serde_json::Value;

/// A configured field location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Locator {
    /// A request header (name lowercased).
    Header(String),
    /// An RFC 6901 JSON pointer into the body.
    Body(String),
    /// The SHA-256 of the raw body, in hex: an event id for providers
    /// that sign only the body and put their delivery id in an unsigned
    /// header (GitHub, Shopify). Read by ingest from the bytes
    /// ([`body_sha256`]); [`Locator::find`] finds nothing there.
    BodySha256,
    /// Several fields that together identify an event, written
    /// `body:/action + body:/data/id + body:/createdAt`: their values as
    /// a JSON array of strings (numbers as their JSON text), so no two
    /// different lists read alike.
    Join(Vec<Locator>),
}

/// Most fields a joined locator reads.
const MAX_JOINED: usize = 8;

/// The `body-sha256` locator's value: the hex SHA-256 of the raw body.
pub fn body_sha256(body: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(body))
}

/// What was found at a location.
#[derive(Debug, Clone, PartialEq)]
pub enum Found<'a> {
    Missing,
    Text(&'a str),
    /// A JSON value that is not a string.
    Other(&'a Value),
    /// What a joined locator read.
    Joined(String),
}

impl Locator {
    /// Parses `header:NAME` or `body:/pointer`.
    pub fn parse(raw: &str) -> Result<Self, String> {
        if raw == "body-sha256" {
            return Ok(Self::BodySha256);
        }
        if raw.contains(" + ") {
            let parts = raw
                .split(" + ")
                .map(|part| match Self::parse(part.trim())? {
                    l @ (Self::Header(_) | Self::Body(_)) => Ok(l),
                    _ => Err(format!(
                        "{part:?}: a joined locator reads header:NAME and body:/pointer fields only"
                    )),
                })
                .collect::<Result<Vec<_>, _>>()?;
            if parts.len() > MAX_JOINED {
                return Err(format!("joins at most {MAX_JOINED} fields"));
            }
            return Ok(Self::Join(parts));
        }
        if let Some(name) = raw.strip_prefix("header:") {
            let name = name.trim();
            actix_web::http::header::HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("{name:?} is not a valid HTTP header name"))?;
            return Ok(Self::Header(name.to_ascii_lowercase()));
        }
        if let Some(pointer) = raw.strip_prefix("body:") {
            if !pointer.is_empty() && !pointer.starts_with('/') {
                return Err(format!(
                    "{pointer:?} is not a JSON pointer: it must be empty or start with '/', as in body:/request_id"
                ));
            }
            let mut chars = pointer.chars();
            while let Some(c) = chars.next() {
                if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
                    return Err(format!(
                        "{pointer:?} is not a JSON pointer: '~' must be followed by 0 or 1"
                    ));
                }
            }
            return Ok(Self::Body(pointer.to_owned()));
        }
        Err(format!(
            "{raw:?} must be header:NAME, body:/json/pointer (for example body:/request_id) or, \
             for event_id, body-sha256"
        ))
    }

    /// Whether the body must be parsed as JSON to read this location.
    pub fn needs_body(&self) -> bool {
        match self {
            Self::Body(_) => true,
            Self::Join(parts) => parts.iter().any(Self::needs_body),
            Self::Header(_) | Self::BodySha256 => false,
        }
    }

    /// The header names it reads.
    pub fn headers(&self) -> Vec<&str> {
        match self {
            Self::Header(name) => vec![name.as_str()],
            Self::Join(parts) => parts.iter().flat_map(Self::headers).collect(),
            Self::Body(_) | Self::BodySha256 => Vec::new(),
        }
    }

    /// Reads the location from the request.
    pub fn find<'a, 'h: 'a, 'b: 'a>(
        &self,
        header: &dyn Fn(&str) -> Option<&'h str>,
        body: Option<&'b Value>,
    ) -> Found<'a> {
        match self {
            Self::Header(name) => header(name).map_or(Found::Missing, Found::Text),
            Self::BodySha256 => Found::Missing,
            Self::Join(parts) => {
                let mut texts = Vec::with_capacity(parts.len());
                for part in parts {
                    match part.find(header, body) {
                        Found::Text(t) => texts.push(t.to_owned()),
                        Found::Other(v) if v.is_number() => texts.push(v.to_string()),
                        other @ (Found::Missing | Found::Other(_)) => return other,
                        Found::Joined(_) => return Found::Missing,
                    }
                }
                Found::Joined(serde_json::to_string(&texts).unwrap_or_default())
            }
            Self::Body(pointer) => match body.and_then(|b| b.pointer(pointer)) {
                None | Some(Value::Null) => Found::Missing,
                Some(Value::String(s)) => Found::Text(s),
                Some(other) => Found::Other(other),
            },
        }
    }
}

impl std::fmt::Display for Locator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Header(n) => write!(f, "header:{n}"),
            Self::Body(p) => write!(f, "body:{p}"),
            Self::BodySha256 => f.write_str("body-sha256"),
            Self::Join(parts) => {
                for (i, part) in parts.iter().enumerate() {
                    if i > 0 {
                        f.write_str(" + ")?;
                    }
                    write!(f, "{part}")?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locators_parse_and_find() {
        let body: Value =
            serde_json::json!({ "request_id": "r1", "run": { "id": 7 }, "a/b": "slash" });
        let h = |name: &str| (name == "x-id").then_some("h1");
        assert_eq!(
            Locator::parse("body:/request_id")
                .unwrap()
                .find(&h, Some(&body)),
            Found::Text("r1")
        );
        assert_eq!(
            Locator::parse("body:/a~1b").unwrap().find(&h, Some(&body)),
            Found::Text("slash")
        );
        assert!(matches!(
            Locator::parse("body:/run/id")
                .unwrap()
                .find(&h, Some(&body)),
            Found::Other(_)
        ));
        assert_eq!(
            Locator::parse("body:/nope").unwrap().find(&h, Some(&body)),
            Found::Missing
        );
        assert_eq!(
            Locator::parse("header:X-Id").unwrap().find(&h, None),
            Found::Text("h1")
        );
    }

    #[test]
    fn body_sha256_is_the_hex_hash_of_the_exact_bytes() {
        assert_eq!(Locator::parse("body-sha256"), Ok(Locator::BodySha256));
        assert_eq!(Locator::BodySha256.to_string(), "body-sha256");
        assert!(!Locator::BodySha256.needs_body());
        // sha256("abc"), FIPS 180-2 appendix B.1.
        assert_eq!(
            body_sha256(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        // One changed byte (a space) is another id.
        assert_ne!(body_sha256(br#"{"a":1}"#), body_sha256(br#"{"a": 1}"#));
    }

    #[test]
    fn a_joined_locator_reads_each_field_into_one_unambiguous_id() {
        let l = Locator::parse("body:/action + body:/data/id + header:x-kind").unwrap();
        assert_eq!(
            l.to_string(),
            "body:/action + body:/data/id + header:x-kind"
        );
        assert!(l.needs_body());
        assert_eq!(l.headers(), ["x-kind"]);
        let h = |name: &str| (name == "x-kind").then_some("issue");
        let body = serde_json::json!({ "action": "update", "data": { "id": 7 } });
        assert_eq!(
            l.find(&h, Some(&body)),
            Found::Joined(r#"["update","7","issue"]"#.to_owned())
        );
        // Any part missing: the whole is missing.
        let partial = serde_json::json!({ "action": "update" });
        assert_eq!(l.find(&h, Some(&partial)), Found::Missing);
        // "a|b" + "c" and "a" + "b|c" stay apart.
        let two = Locator::parse("body:/a + body:/b").unwrap();
        let x = serde_json::json!({ "a": "a|b", "b": "c" });
        let y = serde_json::json!({ "a": "a", "b": "b|c" });
        assert_ne!(two.find(&h, Some(&x)), two.find(&h, Some(&y)));
        for bad in [
            "body:/a + body-sha256",
            "body:/a + nope",
            "body:/a + body:/b + body:/c + body:/d + body:/e + body:/f + body:/g + body:/h + body:/i",
        ] {
            assert!(Locator::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn bad_locators_are_refused() {
        for bad in [
            "body:request_id",
            "body:/a~2",
            "header:bad name",
            "query:id",
            "/request_id",
            "body-sha256 ",
            "body-sha1",
        ] {
            assert!(Locator::parse(bad).is_err(), "{bad}");
        }
    }
}
