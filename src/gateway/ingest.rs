//! What ingest decides, without HTTP: from a request's headers (before its
//! body is read) and then its body to a verified, parsed event ready to
//! store. The HTTP handler is `routes::ingest`.

use serde_json::Value;

use super::Source;
use super::locate::{Found, Locator};
use super::signature::VerifyError;
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

/// Verifies the signature over `body` and reads the event's id, stream and
/// `created_at` as the source locates them. Nothing is stored here.
pub fn parse_event<'a>(
    source: &Source,
    header: &dyn Fn(&str) -> Option<&'a str>,
    body: &[u8],
    received_at: Millis,
) -> Result<NewEvent, IngestError> {
    source.verifier.verify(header, body, unix_s(received_at))?;
    let needs_json = std::iter::once(&source.event_id)
        .chain(&source.created_at)
        .chain(&source.stream)
        .any(Locator::needs_body);
    let json: Option<Value> = if needs_json {
        Some(serde_json::from_slice(body).map_err(|e| {
            IngestError::MalformedBody(format!(
                "the body is not JSON ({e}); this source reads fields from it"
            ))
        })?)
    } else {
        None
    };
    let event_id = match source.event_id.find(header, json.as_ref()) {
        Found::Text(s) => key(s, "event_id", "invalid_event_id")?,
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
                    "the event id at {} must be a string, found {v}",
                    source.event_id
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
        Some((_, Found::Text(s))) => Some(CreatedAt::parse(s, "created_at")?),
        Some((l, Found::Other(v))) => {
            return Err(invalid(
                "invalid_created_at",
                "created_at",
                format!("the created_at at {l} must be an RFC 3339 string, found {v}"),
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
        // Run ids are sometimes numbers: use their JSON text.
        Some((_, Found::Other(v))) if v.is_number() => {
            Some(key(&v.to_string(), "stream", "invalid_stream")?)
        }
        Some((l, Found::Other(v))) => {
            return Err(invalid(
                "invalid_stream",
                "stream",
                format!("the stream at {l} must be a string or number, found {v}"),
            ));
        }
    };
    let headers = source
        .forward_headers
        .iter()
        .filter_map(|name| header(name).map(|v| (name.clone(), v.to_owned())))
        .collect();
    Ok(NewEvent {
        source: source.name.clone(),
        event_id: event_id.as_str().to_owned(),
        stream: stream.map(|s| s.as_str().to_owned()),
        created_at: created_at
            .unwrap_or_else(|| CreatedAt::from_unix_nanos(i128::from(received_at) * 1_000_000)),
        received_at_ms: received_at,
        headers,
        body: body.to_vec(),
    })
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
