//! What ingest decides, without HTTP: from a request's headers (before its
//! body is read) and then its body to a verified, parsed event ready to
//! store. The HTTP handler is `routes::ingest`.

use serde_json::Value;

use super::Source;
use super::locate::{Found, Locator, body_sha256};
use super::signature::{Scheme, VerifyError};
use crate::clock::Millis;
use crate::domain::{CreatedAt, Invalid, Key};
use crate::store::inbox::NewEvent;

/// Why a webhook request is refused.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// The signature, its headers or its timestamp (401).
    #[error(transparent)]
    Signature(#[from] VerifyError),
    /// The body is not JSON though the source reads fields from it (400).
    #[error("{0}")]
    MalformedBody(String),
    /// A field the source reads is absent or out of its rules (400).
    #[error(transparent)]
    Invalid(#[from] Invalid),
}

/// Checks what the headers alone can tell: the source's signature headers
/// are there and well-formed, and a signed timestamp is within tolerance.
pub fn check_headers<'a>(
    source: &Source,
    header: &dyn Fn(&str) -> Option<&'a str>,
    now_ms: Millis,
) -> Result<(), IngestError> {
    Ok(source.verifier.check_headers(header, unix_s(now_ms))?)
}

/// A provider's URL check, answered at once and never stored: Slack's
/// `url_verification` (its `challenge` back) and Zoom's
/// `endpoint.url_validation` (the `plainToken`, and its HMAC under the
/// secret that signed, `encryptedToken`). Both are signed like events.
/// `None` for anything else (an event, or a scheme without one).
pub fn handshake<'a>(
    source: &Source,
    header: &dyn Fn(&str) -> Option<&'a str>,
    body: &[u8],
    received_at: Millis,
) -> Result<Option<Value>, IngestError> {
    let marker: &[u8] = match source.scheme {
        Scheme::Slack => b"url_verification",
        Scheme::Zoom => b"endpoint.url_validation",
        _ => return Ok(None),
    };
    // Events skip the second HMAC and the JSON parse.
    if !body.windows(marker.len()).any(|w| w == marker) {
        return Ok(None);
    }
    let signer = source
        .verifier
        .verify_which(header, body, unix_s(received_at))?;
    let Ok(json) = serde_json::from_slice::<Value>(body) else {
        return Ok(None);
    };
    let text = |pointer: &str| json.pointer(pointer).and_then(Value::as_str);
    Ok(match source.scheme {
        Scheme::Slack if text("/type") == Some("url_verification") => {
            text("/challenge").map(|challenge| serde_json::json!({ "challenge": challenge }))
        }
        Scheme::Zoom if text("/event") == Some("endpoint.url_validation") => {
            text("/payload/plainToken").and_then(|plain| {
                let encrypted = source.verifier.hex_mac(signer, plain.as_bytes())?;
                Some(serde_json::json!({ "plainToken": plain, "encryptedToken": encrypted }))
            })
        }
        _ => None,
    })
}

/// Verifies the signature over `body` and reads the event's id, stream and
/// `created_at` as the source locates them. Nothing is stored here.
pub fn parse_event<'a>(
    source: &Source,
    header: &dyn Fn(&str) -> Option<&'a str>,
    body: &[u8],
    received_at: Millis,
) -> Result<NewEvent, IngestError> {
    parse_routed(source, header, body, received_at).map(|(event, _)| event)
}

/// Where an event goes: the lanes of the destinations whose filters it
/// matched; `None` for a source whose lone destination takes everything
/// (its own lane).
pub type Lanes = Option<Vec<String>>;

/// As [`parse_event`], and which of the source's destinations take it.
pub fn parse_routed<'a>(
    source: &Source,
    header: &dyn Fn(&str) -> Option<&'a str>,
    body: &[u8],
    received_at: Millis,
) -> Result<(NewEvent, Lanes), IngestError> {
    source.verifier.verify(header, body, unix_s(received_at))?;
    let single =
        matches!(source.routes.as_slice(), [r] if r.filter.is_all() && r.lane == source.name);
    let needs_json = std::iter::once(&source.event_id)
        .chain(&source.created_at)
        .chain(&source.stream)
        .any(Locator::needs_body)
        || source.routes.iter().any(|r| r.filter.needs_body());
    let json: Option<Value> = if needs_json {
        Some(serde_json::from_slice(body).map_err(|e| {
            IngestError::MalformedBody(format!(
                "the body is not JSON ({e}); this source reads fields from it"
            ))
        })?)
    } else {
        None
    };
    let hashed;
    let found = if source.event_id == Locator::BodySha256 {
        hashed = body_sha256(body);
        Found::Text(&hashed)
    } else {
        source.event_id.find(header, json.as_ref())
    };
    let event_id = match found {
        Found::Text(s) => key(s, "event_id", "invalid_event_id")?,
        Found::Joined(s) => key(&s, "event_id", "invalid_event_id")?,
        Found::Missing => {
            return Err(invalid(
                "missing_event_id",
                "event_id",
                format!("no event id at {}", source.event_id),
            ));
        }
        Found::Other(v) => {
            return Err(invalid(
                "invalid_event_id",
                "event_id",
                format!(
                    "the event id at {} must be a string, found {}",
                    source.event_id,
                    short(v)
                ),
            ));
        }
    };
    let created_at = match source
        .created_at
        .as_ref()
        .map(|l| (l, l.find(header, json.as_ref())))
    {
        None | Some((_, Found::Missing)) => None,
        Some((_, Found::Text(s))) => Some(CreatedAt::read(
            s,
            false,
            source.created_at_format,
            "created_at",
        )?),
        Some((_, Found::Other(v @ Value::Number(_)))) => Some(CreatedAt::read(
            &v.to_string(),
            true,
            source.created_at_format,
            "created_at",
        )?),
        // Refused by the source's checks: created_at is one field.
        Some((l, found @ (Found::Other(_) | Found::Joined(_)))) => {
            let v = match found {
                Found::Other(v) => v.clone(),
                _ => Value::Null,
            };
            return Err(invalid(
                "invalid_created_at",
                "created_at",
                format!(
                    "the created_at at {l} must be an RFC 3339 string or Unix seconds or \
                     milliseconds, found {}",
                    short(&v)
                ),
            ));
        }
    };
    let stream = match source
        .stream
        .as_ref()
        .map(|l| (l, l.find(header, json.as_ref())))
    {
        None | Some((_, Found::Missing)) => None,
        Some((_, Found::Text(s))) => Some(key(s, "stream", "invalid_stream")?),
        Some((_, Found::Joined(s))) => Some(key(&s, "stream", "invalid_stream")?),
        // Run ids are sometimes numbers: use their JSON text.
        Some((_, Found::Other(v))) if v.is_number() => {
            Some(key(&v.to_string(), "stream", "invalid_stream")?)
        }
        Some((l, Found::Other(v))) => {
            return Err(invalid(
                "invalid_stream",
                "stream",
                format!(
                    "the stream at {l} must be a string or number, found {}",
                    short(v)
                ),
            ));
        }
    };
    let headers = source
        .forward_headers
        .iter()
        .filter_map(|name| header(name).map(|v| (name.clone(), v.to_owned())))
        .collect();
    let lanes = (!single).then(|| {
        source
            .routes
            .iter()
            .filter(|r| r.filter.matches(header, json.as_ref()))
            .map(|r| r.lane.clone())
            .collect()
    });
    let event = NewEvent {
        source: source.name.clone(),
        event_id: event_id.as_str().to_owned(),
        stream: stream.map(|s| s.as_str().to_owned()),
        created_at: created_at
            .unwrap_or_else(|| CreatedAt::from_unix_nanos(i128::from(received_at) * 1_000_000)),
        received_at_ms: received_at,
        headers,
        body: body.to_vec(),
    };
    Ok((event, lanes))
}

/// A JSON value for an error message: at most 100 bytes of its text.
fn short(v: &Value) -> String {
    let mut text = v.to_string();
    if text.len() > 100 {
        let mut end = 100;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

fn unix_s(ms: Millis) -> i64 {
    i64::try_from(ms / 1000).unwrap_or(i64::MAX)
}

/// A key read from an event, refused with the ingest code of its field
/// (`invalid_event_id`, `invalid_stream`) rather than the API's
/// `invalid_key`.
fn key(raw: &str, field: &'static str, code: &'static str) -> Result<Key, IngestError> {
    Key::parse(raw, field).map_err(|e| invalid(code, field, e.reason))
}

fn invalid(code: &'static str, field: &'static str, reason: String) -> IngestError {
    IngestError::Invalid(Invalid::new(code, field, reason))
}
