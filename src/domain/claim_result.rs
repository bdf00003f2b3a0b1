//! A finished claim's result: the JSON value a worker kept with `done`,
//! returned to whoever asks about the key later (Powertools' idempotent
//! result).

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::Invalid;

/// Default of `claims.max_result_bytes`.
pub const DEFAULT_MAX_RESULT_BYTES: usize = 64 * 1024;

/// Largest `claims.max_result_bytes` accepted: a result is written to the
/// log and the data file with its done record, and read back whole.
pub const MAX_RESULT_BYTES_LIMIT: usize = 1024 * 1024;

/// Deepest nesting of arrays and objects a result may have: well below the
/// recursion limits of the parsers that read it back inside an answer
/// (`serde_json`'s 128 levels, the answer itself one of them; Python's
/// `json` fails near 1000).
pub const MAX_RESULT_DEPTH: usize = 100;

/// One JSON value (never `null`: a `null` result is no result), as the
/// client sent it: its text is kept byte for byte, so a number is never
/// rounded and a key order never changes. Logged and stored as that text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ClaimResult(Arc<str>);

impl ClaimResult {
    /// A result from the `result` field of a done, parsed already as JSON:
    /// `Ok(None)` for `null`; refused over `max_bytes` of text, nested
    /// deeper than [`MAX_RESULT_DEPTH`], or not JSON every reader takes.
    /// (The body's parser only skips over the value: it lets through a
    /// lone surrogate escape such as `"\ud800"` and numbers out of range
    /// such as `1e400`, which strict parsers, `serde_json`'s own included,
    /// refuse; so the value is parsed again, strictly.)
    pub fn parse(raw: &RawValue, max_bytes: usize) -> Result<Option<Self>, BadResult> {
        let text = raw.get();
        if text.len() > max_bytes {
            return Err(BadResult::TooLarge(ResultTooLarge {
                bytes: text.len(),
                max_bytes,
            }));
        }
        if depth(text) > MAX_RESULT_DEPTH {
            return Err(BadResult::Invalid(Invalid::new(
                "invalid_result",
                "result",
                format!("must be nested at most {MAX_RESULT_DEPTH} arrays or objects deep"),
            )));
        }
        if let Err(e) = serde_json::from_str::<serde_json::Value>(text) {
            return Err(BadResult::Invalid(Invalid::new(
                "invalid_result",
                "result",
                format!("must be JSON that every parser reads: {e}"),
            )));
        }
        if text == "null" {
            return Ok(None);
        }
        Ok(Some(Self(Arc::from(text))))
    }

    /// A result read back from storage; `Err` when the bytes are not one
    /// JSON value (never written so: a damaged record).
    pub fn from_stored(text: &str) -> Result<Self, Invalid> {
        serde_json::from_str::<&RawValue>(text)
            .map(|raw| Self(Arc::from(raw.get())))
            .map_err(|e| Invalid::new("invalid_result", "result", e.to_string()))
    }

    /// The JSON text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The value, to embed in a JSON answer as it is.
    pub fn as_raw(&self) -> &RawValue {
        // Only JSON text is ever held (checked by both constructors, and by
        // the log's checksum for what is replayed); the fallback keeps a
        // damaged record from failing an answer.
        serde_json::from_str::<&RawValue>(&self.0).unwrap_or_else(|_| null())
    }

    /// Bytes of its text.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Never true: a result is one JSON value, at least one byte.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The deepest nesting of arrays and objects in valid JSON text.
fn depth(text: &str) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for b in text.bytes() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

fn null() -> &'static RawValue {
    serde_json::from_str::<&'static RawValue>("null").expect("null is JSON")
}

/// Why a result is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadResult {
    /// Over `claims.max_result_bytes` (413).
    #[error(transparent)]
    TooLarge(#[from] ResultTooLarge),
    /// Nested too deep (400).
    #[error(transparent)]
    Invalid(#[from] Invalid),
}

/// A result over `claims.max_result_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the result is {bytes} bytes of JSON; claims.max_result_bytes is {max_bytes}")]
pub struct ResultTooLarge {
    /// Bytes of the result's JSON text.
    pub bytes: usize,
    /// The configured limit.
    pub max_bytes: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> Box<RawValue> {
        serde_json::from_str(s).expect("JSON")
    }

    #[test]
    fn a_result_keeps_its_text_byte_for_byte() {
        let text =
            r#"{"b":1,"a":12345678901234567890123,"f":0.1000000000000000055511151231257827}"#;
        let r = ClaimResult::parse(&raw(text), 1024).unwrap().unwrap();
        assert_eq!(r.as_str(), text);
        assert_eq!(r.as_raw().get(), text);
    }

    #[test]
    fn null_is_no_result_and_the_limit_counts_bytes() {
        assert_eq!(ClaimResult::parse(&raw("null"), 1024).unwrap(), None);
        assert!(
            ClaimResult::parse(&raw("\"12345678\""), 10)
                .unwrap()
                .is_some()
        );
        let err = ClaimResult::parse(&raw("\"123456789\""), 10).unwrap_err();
        assert_eq!(
            err,
            BadResult::TooLarge(ResultTooLarge {
                bytes: 11,
                max_bytes: 10
            })
        );
    }

    #[test]
    fn nesting_is_counted_outside_strings_and_refused_past_the_limit() {
        let nested = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(ClaimResult::parse(&raw(&nested(MAX_RESULT_DEPTH)), 1 << 20).is_ok());
        assert!(matches!(
            ClaimResult::parse(&raw(&nested(MAX_RESULT_DEPTH + 1)), 1 << 20),
            Err(BadResult::Invalid(_))
        ));
        assert_eq!(depth(r#"{"a":"[[[\"{{","b":[{"c":[]}]}"#), 4);
    }

    #[test]
    fn what_a_strict_parser_refuses_is_refused() {
        for text in [r#""\ud800""#, "1e400", r#"{"a":"\udc00x"}"#] {
            assert!(
                matches!(
                    ClaimResult::parse(&raw(text), 1 << 20),
                    Err(BadResult::Invalid(_))
                ),
                "{text}"
            );
        }
        for text in [r#""\ud83d\ude00""#, "1e300", r#""\u0000""#, "-0", "[]"] {
            assert!(ClaimResult::parse(&raw(text), 1 << 20).is_ok(), "{text}");
        }
        assert_eq!(depth(r#""\\""#), 0);
    }

    #[test]
    fn stored_text_that_is_not_json_is_refused() {
        assert!(ClaimResult::from_stored("{\"a\":").is_err());
        assert!(ClaimResult::from_stored("[1,2]").is_ok());
    }
}
