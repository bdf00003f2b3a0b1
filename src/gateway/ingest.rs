//! `POST /ingest/{source}`, in this order: body size limit (413) →
//! signature and timestamp (401; nothing stored) → event id (400) → known
//! event (200 duplicate) → durable insert into the inbox → 200.
//!
//! The request never waits on the application: delivery happens later, in
//! the dispatcher.

use actix_web::{HttpRequest, HttpResponse, web};
use serde_json::{Value, json};

use super::locate::{Found, Locator};
use crate::clock::Millis;
use crate::domain::{CreatedAt, Invalid, Key};
use crate::error::ApiError;
use crate::routes::AppState;
use crate::routes::body::read_bytes;
use crate::store::inbox::{IngestOutcome, NewEvent};

/// Registers the ingest route.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::resource("/ingest/{source}")
            .route(web::post().to(ingest))
            .default_service(crate::routes::method_not_allowed("POST")),
    );
}

/// A key read from an event, refused with the ingest code of its field
/// (`invalid_event_id`, `invalid_stream`) rather than the API's
/// `invalid_key`.
fn ingest_key(raw: &str, field: &'static str, code: &'static str) -> Result<Key, ApiError> {
    Key::parse(raw, field).map_err(|e| invalid(code, field, e.reason))
}

fn invalid(code: &'static str, field: &'static str, reason: String) -> ApiError {
    ApiError::Invalid(Invalid::new(code, field, reason))
}

async fn ingest(
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let gw = &state.gateway;
    let name = crate::routes::path_segment(&req, 2, "source")?;
    let source = gw
        .source(&name)
        .cloned()
        .ok_or_else(|| ApiError::NotFound {
            code: "unknown_source",
            detail: format!("no source named {name:?} is configured"),
        })?;
    let body = read_bytes(&req, payload, source.max_body_bytes).await?;
    let received_at: Millis = state.clock.now_ms();
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
    let now_s = i64::try_from(received_at / 1000).unwrap_or(i64::MAX);
    source.verifier.verify(&header, &body, now_s)?;

    let needs_json = std::iter::once(&source.event_id)
        .chain(&source.created_at)
        .chain(&source.stream)
        .any(Locator::needs_body);
    let json: Option<Value> = if needs_json {
        Some(serde_json::from_slice(&body).map_err(|e| {
            ApiError::MalformedBody(format!(
                "the body is not JSON ({e}); this source reads fields from it"
            ))
        })?)
    } else {
        None
    };
    let event_id = match source.event_id.find(&header, json.as_ref()) {
        Found::Text(s) => ingest_key(s, "event_id", "invalid_event_id")?,
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
        .map(|l| (l, l.find(&header, json.as_ref())))
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
        .map(|l| (l, l.find(&header, json.as_ref())))
    {
        None | Some((_, Found::Missing)) => None,
        Some((_, Found::Text(s))) => Some(ingest_key(s, "stream", "invalid_stream")?),
        // Run ids are sometimes numbers: use their JSON text.
        Some((_, Found::Other(v))) if v.is_number() => {
            Some(ingest_key(&v.to_string(), "stream", "invalid_stream")?)
        }
        Some((l, Found::Other(v))) => {
            return Err(invalid(
                "invalid_stream",
                "stream",
                format!("the stream at {l} must be a string or number, found {v}"),
            ));
        }
    };

    // Only the local inbox is asked: ingest keeps working while a shared
    // store is down, and an event another instance received too is
    // resolved at delivery, by its claim in the shared store.
    let known = gw
        .inbox
        .inbox_event(&source.name, event_id.as_str())
        .await?
        .is_some();
    let outcome = if known {
        IngestOutcome::Duplicate
    } else {
        let headers = source
            .forward_headers
            .iter()
            .filter_map(|name| header(name).map(|v| (name.clone(), v.to_owned())))
            .collect();
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
        gw.inbox.ingest(event, received_at).await?
    };
    let status = match outcome {
        IngestOutcome::Accepted => {
            gw.wake.notify_one();
            tracing::info!(source = %source.name, event_id = %event_id, "event accepted");
            "accepted"
        }
        IngestOutcome::Duplicate => "duplicate",
    };
    Ok(HttpResponse::Ok().json(json!({ "status": status, "event_id": event_id.as_str() })))
}
