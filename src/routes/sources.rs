//! The operator API of the gateway: list a source's events by status, and
//! redeliver dead or stale ones.

use actix_web::{HttpRequest, HttpResponse, web};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};

use super::{AppState, method_not_allowed, path_segment};
use crate::clock::Millis;
use crate::domain::Invalid;
use crate::error::ApiError;
use crate::gateway::delivery::circuit::State as CircuitState;
use crate::store::inbox::{EventStatus, InboxEvent, RedeliverOutcome};

/// Registers the source routes.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::resource("/sources/{source}")
            .route(web::get().to(show))
            .default_service(method_not_allowed("GET")),
    )
    .service(
        web::resource("/sources/{source}/events")
            .route(web::get().to(list))
            .default_service(method_not_allowed("GET")),
    )
    .service(
        web::resource("/sources/{source}/events/{event_id}/redeliver")
            .route(web::post().to(redeliver))
            .default_service(method_not_allowed("POST")),
    );
}

/// Query of the list endpoint.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    /// pending | delivered | stale | dead
    status: String,
    /// Page size, 1 to 500 (default 100).
    limit: Option<usize>,
    /// The `next` cursor of the previous page.
    after: Option<String>,
}

/// An event as the operator API shows it (without its body).
#[derive(Debug, Serialize)]
struct EventView {
    event_id: String,
    status: EventStatus,
    stream: Option<String>,
    created_at: String,
    received_at_ms: Millis,
    attempts: u32,
    /// Pending: next attempt. Settled: when it settled.
    due_at_ms: Millis,
    last_error: Option<String>,
    /// Settled: when the record is reaped.
    #[serde(skip_serializing_if = "Option::is_none")]
    expires_at_ms: Option<Millis>,
    body_bytes: usize,
}

impl From<InboxEvent> for EventView {
    fn from(e: InboxEvent) -> Self {
        Self {
            body_bytes: e.body_bytes,
            event_id: e.event_id,
            status: e.status,
            stream: e.stream,
            created_at: e.created_at.to_rfc3339(),
            received_at_ms: e.received_at_ms,
            attempts: e.attempts,
            due_at_ms: e.due_at_ms,
            last_error: e.last_error,
            expires_at_ms: (e.expires_at_ms > 0).then_some(e.expires_at_ms),
        }
    }
}

/// A source is known while it is configured, and after it left the
/// configuration for as long as the inbox holds events of it: those stay
/// listable and redeliverable (delivered when the source comes back).
async fn known_source(state: &AppState, name: &str) -> Result<(), ApiError> {
    if state.gateway.source(name).is_some() || state.gateway.inbox.has_source(name).await? {
        Ok(())
    } else {
        Err(unknown_source(name))
    }
}

fn unknown_source(name: &str) -> ApiError {
    ApiError::NotFound {
        code: "unknown_source",
        detail: format!("no source named {name:?} is configured"),
    }
}

fn encode_cursor((at, id): &(u64, String)) -> String {
    URL_SAFE_NO_PAD.encode(format!("{at}:{id}"))
}

fn decode_cursor(raw: &str) -> Result<(u64, String), ApiError> {
    let bad = || {
        ApiError::Invalid(Invalid::new(
            "invalid_cursor",
            "after",
            "must be the `next` value of a previous page",
        ))
    };
    let text = URL_SAFE_NO_PAD
        .decode(raw)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(bad)?;
    let (at, id) = text.split_once(':').ok_or_else(bad)?;
    Ok((at.parse().map_err(|_| bad())?, id.to_owned()))
}

/// A source's delivery state: its limit and what is in flight, and its
/// circuit breaker (`running`, `paused` until a time, or `probing`).
async fn show(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let source = path_segment(&req, 3, "source")?;
    let Some(lane) = state.dispatcher.lane(&source) else {
        known_source(&state, &source).await?;
        return Ok(HttpResponse::Ok().json(serde_json::json!({
            "source": source,
            "configured": false,
            "delivery": null,
        })));
    };
    let (circuit, paused_until_ms) = match lane.state {
        CircuitState::Closed => ("running", None),
        CircuitState::Open { until } => ("paused", Some(until)),
        CircuitState::Probing { .. } => ("probing", None),
    };
    Ok(HttpResponse::Ok().json(serde_json::json!({
        "source": source,
        "configured": true,
        "delivery": {
            "state": circuit,
            "paused_until_ms": paused_until_ms,
            "consecutive_failures": lane.consecutive_failures,
            "in_flight": lane.in_flight,
            "max_in_flight": lane.max_in_flight,
        },
    })))
}

async fn list(
    state: web::Data<AppState>,
    req: HttpRequest,
    query: Result<web::Query<ListQuery>, actix_web::Error>,
) -> Result<HttpResponse, ApiError> {
    let source = path_segment(&req, 3, "source")?;
    known_source(&state, &source).await?;
    let query = query
        .map_err(|e| ApiError::Invalid(Invalid::new("invalid_query", "query", e.to_string())))?;
    let status = EventStatus::parse(&query.status).ok_or_else(|| {
        ApiError::Invalid(Invalid::new(
            "invalid_status",
            "status",
            format!(
                "must be pending, delivered, stale or dead; got {:?}",
                query.status
            ),
        ))
    })?;
    let limit = query.limit.unwrap_or(100);
    if !(1..=500).contains(&limit) {
        return Err(ApiError::Invalid(Invalid::new(
            "invalid_limit",
            "limit",
            "must be 1 to 500",
        )));
    }
    let after = query.after.as_deref().map(decode_cursor).transpose()?;
    let (events, next) = state
        .gateway
        .inbox
        .list_events(&source, status, after, limit)
        .await?;
    Ok(HttpResponse::Ok().json(serde_json::json!({
        "source": source,
        "status": status,
        "events": events.into_iter().map(EventView::from).collect::<Vec<_>>(),
        "next": next.as_ref().map(encode_cursor),
    })))
}

async fn redeliver(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let source = path_segment(&req, 3, "source")?;
    let event_id = path_segment(&req, 5, "event_id")?;
    known_source(&state, &source).await?;
    let now = state.clock.now_ms();
    match state
        .gateway
        .inbox
        .redeliver(&source, &event_id, now)
        .await?
    {
        RedeliverOutcome::Requeued => {
            state.gateway.wake.notify_one();
            Ok(HttpResponse::Accepted().json(serde_json::json!({
                "source": source, "event_id": event_id, "status": EventStatus::Pending,
            })))
        }
        RedeliverOutcome::NotFound => Err(ApiError::NotFound {
            code: "unknown_event",
            detail: format!(
                "source {source:?} has no event {event_id:?} (it may have been reaped)"
            ),
        }),
        RedeliverOutcome::NotRedeliverable(status) => Err(ApiError::NotRedeliverable { status }),
    }
}
