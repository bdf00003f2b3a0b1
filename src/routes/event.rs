//! `GET /v1/sources/{source}/events/{event_id}`: one stored event whole —
//! its times, attempts and last error, its attempt timeline, the headers
//! kept for forwarding and the body — for the operator console's event view
//! and `dedupd events show`.

use actix_web::http::Method;
use actix_web::{HttpRequest, HttpResponse, web};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::Serialize;
use utoipa::ToSchema;

use super::sources::{EventView, known_source};
use super::{AppState, Endpoint, Guard, path_segment, register};
use crate::error::{ApiError, Problem};
use crate::store::inbox::{Attempt, EventStatus};

/// The event route, relative to `/v1`.
pub fn endpoints() -> Vec<Endpoint> {
    vec![
        Endpoint::new(Method::GET, "/sources/{source}/events/{event_id}", || {
            web::route().to(show)
        }),
        Endpoint::new(
            Method::DELETE,
            "/sources/{source}/events/{event_id}",
            || web::route().to(super::jobs::erase),
        ),
    ]
}

/// Registers the event route (in the `/v1` scope, behind its tokens).
pub fn configure(cfg: &mut web::ServiceConfig) {
    register(cfg, endpoints(), Guard::Open);
}

/// A stored header.
#[derive(Debug, Serialize, ToSchema)]
pub struct HeaderView {
    /// Header name, as received.
    name: String,
    value: String,
}

/// One delivery attempt: a request sent to the destination.
#[derive(Debug, Serialize, ToSchema)]
pub struct AttemptView {
    /// Its number (the `dedupd-attempt` header; restarts at 1 after a
    /// redeliver).
    attempt: u32,
    /// When it was sent, Unix ms.
    at_ms: u64,
    /// The HTTP status the destination answered; null when none came
    /// (connection refused, reset, timed out).
    status: Option<u16>,
    /// From sending the request to the answer or the failure, ms
    /// (µs precision).
    latency_ms: f64,
    /// What failed; null for a 2xx.
    error: Option<String>,
}

impl From<Attempt> for AttemptView {
    fn from(a: Attempt) -> Self {
        Self {
            attempt: a.attempt,
            at_ms: a.at_ms,
            status: a.status,
            latency_ms: a.latency_us as f64 / 1000.0,
            error: a.error,
        }
    }
}

/// An event with its headers, body and attempt timeline.
#[derive(Debug, Serialize, ToSchema)]
pub struct EventDetail {
    /// Everything a listing shows.
    #[serde(flatten)]
    event: EventView,
    /// Its last attempts, oldest first: at most 10 are kept with the event
    /// (an attempt's error at most 300 bytes); deleted with it.
    timeline: Vec<AttemptView>,
    /// The headers kept for forwarding (`forward_headers`), in order.
    headers: Vec<HeaderView>,
    /// The trace every attempt of this event made while traces are on
    /// belongs to. Received with traces on (`[telemetry.traces]`): its
    /// ingest's trace, the attempts children of that span, when it was
    /// sampled. Received with traces off: while they are on, a trace
    /// derived from the event, its attempts' spans the trace's roots, when
    /// sampled. Null otherwise, and always for an erased event: erasing
    /// deletes the stored context with the other headers, so its trace
    /// can no longer be told. An attempt made with traces off has no span
    /// in it.
    trace_id: Option<String>,
    /// The body as text, when it is UTF-8; null otherwise.
    body: Option<String>,
    /// The body in base64 (standard, padded), when it is not UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    body_base64: Option<String>,
}

/// One event whole: what a listing shows, plus its stored headers and body.
#[utoipa::path(get, path = "/v1/sources/{source}/events/{event_id}", operation_id = "getSourceEvent", tag = "gateway",
    security(("bearer" = [])),
    params(("source" = String, Path, description = "A source name: configured, or removed with events still stored"), ("event_id" = String, Path, description = "The provider's event id")),
    responses(
        (status = 200, description = "The event", body = EventDetail),
        (status = 404, description = "`unknown_source` or `unknown_event`", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Tokens are configured and none matched", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store cannot be read or written now; retry", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn show(
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let source = path_segment(&req, 3, "source")?;
    let event_id = path_segment(&req, 5, "event_id")?;
    known_source(&state, &source).await?;
    let Some(mut event) = state.gateway.inbox.inbox_event(&source, &event_id).await? else {
        return Err(ApiError::NotFound {
            code: "unknown_event",
            detail: format!(
                "source {source:?} has no event {event_id:?} (it may have been reaped)"
            ),
        });
    };
    let raw = std::mem::take(&mut event.body);
    let timeline = std::mem::take(&mut event.timeline)
        .into_iter()
        .map(AttemptView::from)
        .collect();
    let stored = std::mem::take(&mut event.headers);
    // Erasing deleted the stored trace context with the other headers:
    // without it the event would pass for one received with traces off,
    // and the page would name a derived trace none of its spans is in.
    let trace_id = (event.status != EventStatus::Erased)
        .then(|| {
            crate::telemetry::traces::event_trace_id(
                &stored,
                crate::telemetry::traces::EventOf {
                    source: &event.source,
                    event_id: &event.event_id,
                    stream: event.stream.as_deref(),
                    received_at_ms: event.received_at_ms,
                },
            )
        })
        .flatten();
    let headers = stored
        .into_iter()
        .filter(|(name, _)| !crate::telemetry::traces::is_internal(name))
        .map(|(name, value)| HeaderView { name, value })
        .collect();
    let (body, body_base64) = match String::from_utf8(raw) {
        Ok(text) => (Some(text), None),
        Err(e) => (None, Some(STANDARD.encode(e.as_bytes()))),
    };
    Ok(HttpResponse::Ok().json(EventDetail {
        event: EventView::from(event),
        timeline,
        headers,
        trace_id,
        body,
        body_base64,
    }))
}
