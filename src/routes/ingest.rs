//! `POST /ingest/{source}`, in this order, each step refusing before the
//! next costs anything:
//!
//! 1. from the headers alone: unknown source (404), signature headers
//!    absent or malformed or a signed timestamp out of tolerance (401), a
//!    declared length over the limit (413) — answered at once, without
//!    reading the body, and the connection is closed;
//! 2. the body, within `http.body_timeout` (408 and closed otherwise) and
//!    the source's `max_body_bytes` (413);
//! 3. the signature over the body (401; nothing stored), then the event id
//!    (400), stream and `created_at`;
//! 4. a known event id: 200 duplicate; otherwise a durable insert into the
//!    inbox, then 200 accepted (or filtered, when no destination of the
//!    source takes it).
//!
//! The request never waits on the application: delivery happens later, in
//! the dispatcher. With traces on, the request is an `ingest` span (its
//! events `verified` and `stored` mark the signature checked and the
//! durable write, sync included, done), and an event stored keeps its
//! context for its delivery attempts (`telemetry::traces`).

use actix_web::http::header::HeaderName;
use actix_web::http::{ConnectionType, Method};
use actix_web::{HttpRequest, HttpResponse, ResponseError, web};
use serde::Serialize;
use utoipa::ToSchema;

use super::body::read_bytes_within;
use super::{AppState, Endpoint, Guard, register};
use crate::auth::browser::only;
use crate::clock::Millis;
use crate::error::{ApiError, Problem};
use crate::gateway::alerts::ALERT_SOURCE;
use crate::gateway::ingest::{check_headers, handshake, parse_routed};
use crate::store::inbox::IngestOutcome;
use crate::telemetry::traces;

/// `POST /ingest/{source}`.
pub fn endpoints() -> Vec<Endpoint> {
    vec![Endpoint::new(Method::POST, "/ingest/{source}", || {
        web::route().to(ingest)
    })]
}

/// Registers the ingest route: providers sign, they hold no API token.
pub fn configure(cfg: &mut web::ServiceConfig) {
    register(cfg, endpoints(), Guard::Open);
}

/// The answer to an accepted or repeated webhook.
#[derive(Debug, Serialize, ToSchema)]
pub struct Ingested {
    /// What became of the event.
    pub status: IngestStatus,
    /// The provider's event id.
    pub event_id: String,
}

/// What became of a posted event. Each is answered 200: the provider must
/// not retry any of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum IngestStatus {
    /// Stored durably; it will be delivered.
    Accepted,
    /// Stored durably, but none of the source's destinations' filters
    /// takes it: kept as `filtered`, never delivered.
    Filtered,
    /// This source's inbox already holds the event id.
    Duplicate,
}

impl IngestStatus {
    /// The name, as answered and as counted in `dedupd_ingest_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Accepted => "accepted",
            Self::Filtered => "filtered",
            Self::Duplicate => "duplicate",
        }
    }
}

/// A refusal before (or instead of) reading the body: the connection is
/// closed, so a client cannot go on sending what will never be read.
fn refuse_and_close(e: &ApiError) -> HttpResponse {
    let mut res = e.error_response();
    res.head_mut().set_connection_type(ConnectionType::Close);
    res
}

/// Receives a provider's webhook: verified, stored durably, answered at
/// once; delivery to the application happens later.
#[utoipa::path(post, path = "/ingest/{source}", operation_id = "ingestWebhook", tag = "gateway",
    params(("source" = String, Path, description = "A configured source's name")),
    request_body(content = String, content_type = "application/json",
        description = "The provider's event, byte for byte as signed, with the signature \
            headers of the source's scheme (Sume: `X-Sume-Timestamp`, `X-Sume-Signature`; \
            Standard Webhooks: `webhook-id`, `webhook-timestamp`, `webhook-signature`; \
            Stripe: `Stripe-Signature`; GitHub: `X-Hub-Signature-256`; Slack: \
            `X-Slack-Request-Timestamp`, `X-Slack-Signature`; Shopify: `X-Shopify-Hmac-Sha256`; \
            Paddle: `Paddle-Signature`; Svix: `svix-id`, `svix-timestamp`, `svix-signature`; \
            Square: `x-square-hmacsha256-signature`; Zoom: `x-zm-request-timestamp`, \
            `x-zm-signature`; Linear: `Linear-Signature`)"),
    responses(
        (status = 200, description = "Stored durably (accepted), stored but taken by none of the source's destinations' filters, so never delivered (filtered), or already held (duplicate); or, for a Slack or Zoom source, the answer to the provider's signed URL check ({\"challenge\"} or {\"plainToken\", \"encryptedToken\"}), nothing stored", body = Ingested),
        (status = 400, description = "No usable event id, stream or created_at", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Signature missing, malformed, wrong, or its timestamp out of tolerance", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such source", body = Problem, content_type = "application/problem+json"),
        (status = 408, description = "The body did not arrive within http.body_timeout", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body over the source's max_body_bytes", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store cannot write now; the provider retries", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn ingest(
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> HttpResponse {
    traces::ingest(answer(&state, &req, payload)).await
}

/// The answer to one ingest request, noted on its span.
async fn answer(state: &AppState, req: &HttpRequest, payload: web::Payload) -> HttpResponse {
    let mut source = None;
    let result = receive(state, req, payload, &mut source).await;
    let refused = result.is_err();
    let (outcome, response) = match result {
        Ok(Received::Event(status, event_id)) => (
            status.as_str(),
            HttpResponse::Ok().json(Ingested { status, event_id }),
        ),
        Ok(Received::Handshake(reply)) => ("handshake", HttpResponse::Ok().json(reply)),
        Err(Refused { error, close }) => (
            error.code(),
            if close {
                refuse_and_close(&error)
            } else {
                error.error_response()
            },
        ),
    };
    if let Some(source) = source {
        state.metrics.ingest(&source, outcome);
    }
    if refused {
        traces::outcome("refused");
        traces::set("dedupd.code", outcome);
    } else {
        traces::outcome(outcome);
    }
    let status = response.status().as_u16();
    traces::set("http.response.status_code", i64::from(status));
    traces::answered(status, None);
    response
}

/// Why ingest refused a request, and whether the connection is closed.
struct Refused {
    error: ApiError,
    /// True for refusals made before the body was read (or while reading
    /// it): the client would otherwise go on sending it.
    close: bool,
}

impl From<ApiError> for Refused {
    fn from(error: ApiError) -> Self {
        Self {
            error,
            close: false,
        }
    }
}

/// What a request was.
enum Received {
    /// An event, what became of it, and its id.
    Event(IngestStatus, String),
    /// The provider's URL check and its answer (nothing stored).
    Handshake(serde_json::Value),
}

/// Steps 1–4; `source` names the configured source once it is known.
async fn receive(
    state: &AppState,
    req: &HttpRequest,
    payload: web::Payload,
    source_name: &mut Option<String>,
) -> Result<Received, Refused> {
    let closing = |error: ApiError| Refused { error, close: true };
    let gw = &state.gateway;
    let name = super::path_segment(req, 2, "source").map_err(closing)?;
    // The alerts source is dedupd's own: from outside it is unknown.
    // The alerts source and a destination's lane take no posts.
    let Some(source) = gw
        .source(&name)
        .filter(|s| s.name != ALERT_SOURCE && s.lane_of.is_none())
    else {
        return Err(closing(ApiError::NotFound {
            code: "unknown_source",
            detail: format!("no source named {name:?} is configured"),
        }));
    };
    *source_name = Some(source.name.clone());
    if traces::on() {
        traces::set("dedupd.source", source.name.clone());
        traces::set("dedupd.scheme", source.scheme.name());
    }
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
    check_headers(&source, &header, state.clock.now_ms()).map_err(|e| closing(e.into()))?;
    let body = read_bytes_within(req, payload, source.max_body_bytes, state.body_timeout)
        .await
        .map_err(closing)?;
    let received_at: Millis = state.clock.now_ms();
    if let Some(reply) = handshake(&source, &header, &body, received_at).map_err(ApiError::from)? {
        tracing::info!(source = %source.name, "answered the provider's URL check");
        return Ok(Received::Handshake(reply));
    }
    let (mut event, lanes) =
        parse_routed(&source, &header, &body, received_at).map_err(ApiError::from)?;
    if traces::on() {
        traces::mark("verified");
        traces::set("dedupd.event_id", event.event_id.clone());
        event.headers.extend(traces::stored_context());
    }
    // Only the inbox is asked: a local inbox keeps ingest working while a
    // shared store is down, and an event another instance received too is
    // resolved at delivery, by its claim in the shared store. With the
    // data file, a repeat is answered from a read, sparing the writer (and
    // its log) the body — a replay of an event reaped within
    // `gateway.dedupe_window` too; the insert checks again, so a race
    // between two posts stays a duplicate.
    let known = gw.inbox.precheck_duplicates()
        && gw
            .inbox
            .knows_event(&event.key(), received_at)
            .await
            .map_err(ApiError::from)?;
    let event_id = event.event_id.clone();
    let ordering = (event.stream.clone(), event.created_at);
    // The lanes the event went to, for the dispatcher to hear of; none
    // when every destination's filter missed it.
    let arrived: Vec<String> = lanes.clone().unwrap_or_else(|| vec![source.name.clone()]);
    let outcome = match lanes {
        _ if known => IngestOutcome::Duplicate,
        None => gw
            .inbox
            .ingest(event, received_at)
            .await
            .map_err(ApiError::from)?,
        Some(lanes) => {
            let known_in = gw.lanes_held(&source.name).await.map_err(ApiError::from)?;
            let filtered_ms = source.retention(gw.retention).delivered_ms;
            gw.inbox
                .ingest_routed(event, lanes, known_in, filtered_ms, received_at)
                .await
                .map_err(ApiError::from)?
        }
    };
    if !known {
        traces::mark("stored");
    }
    let status = match outcome {
        IngestOutcome::Duplicate => IngestStatus::Duplicate,
        IngestOutcome::Accepted if arrived.is_empty() => {
            tracing::info!(source = %source.name, event_id = %event_id, outcome = "filtered", "event filtered");
            IngestStatus::Filtered
        }
        IngestOutcome::Accepted => {
            for lane in &arrived {
                gw.arrivals.push(lane, ordering.0.as_deref(), ordering.1);
            }
            gw.wake.notify_one();
            tracing::info!(source = %source.name, event_id = %event_id, outcome = "accepted", "event accepted");
            IngestStatus::Accepted
        }
    };
    // The request's own trace, linked once the event is taken: not for a
    // duplicate, which may be a captured webhook sent again (its
    // signature still good; none covers `traceparent`) to plant a link.
    // Only a request with one `traceparent` has a context (W3C: several
    // are none).
    if traces::on() && !matches!(status, IngestStatus::Duplicate) {
        const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
        traces::link_upstream(only(req.headers(), &TRACEPARENT));
    }
    Ok(Received::Event(status, event_id))
}
