//! `/v1/streams/{stream}`: apply events in order, read the head.

use actix_web::http::Method;
use actix_web::{HttpMessage, HttpRequest, HttpResponse, web};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::body::read_json;
use super::{AppState, Endpoint, below, path_segment};
use crate::domain::{CreatedAt, Key, ScopedKey};
use crate::error::{ApiError, Problem};
use crate::store::{ApplyOutcome, Head};
use crate::telemetry::{RouteName, traces};

/// The stream routes, relative to `/v1`, all dispatched by hand in
/// [`dispatch`].
pub fn endpoints() -> Vec<Endpoint> {
    vec![
        Endpoint::by_hand(Method::GET, HEAD),
        Endpoint::by_hand(Method::POST, APPLY),
    ]
}

/// The patterns, relative to `/v1`.
const HEAD: &str = "/streams/{stream}";
const APPLY: &str = "/streams/{stream}/apply";

/// Registers the stream routes (in the `/v1` scope, behind its tokens).
///
/// Dispatched by hand under a static prefix, as the claims routes are:
/// actix matched the two `{stream}` patterns with a regex engine, about a
/// fifth of an apply's CPU in the HTTP workers (see `docs/performance.md`).
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(web::scope("/streams").default_service(web::to(dispatch)));
}

/// Routes `/streams/...`; with traces on, each request is a span.
async fn dispatch(
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    super::traced(req, "/v1/streams/", span_name, |req| {
        route(state, req, payload)
    })
    .await
}

/// A streams request's span name.
fn span_name(_segments: usize, action: Option<&str>, _method: &Method) -> &'static str {
    if action == Some("apply") {
        "apply"
    } else {
        "head"
    }
}

/// Routes `/streams/...` by its segments and method.
async fn route(
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    // An empty stream is no resource (404), as with the `{stream}` pattern.
    let (segments, action) = below(&req, "/v1/streams/");
    let method = req.method();
    let route = match (segments, action) {
        (1, _) => "/v1/streams/{stream}",
        (2, Some("apply")) => "/v1/streams/{stream}/apply",
        _ => "unmatched",
    };
    req.extensions_mut().insert(RouteName(route));
    match (segments, action) {
        // `HEAD` as `GET`: actix drops the body of a `HEAD` answer.
        (1, _) if method == Method::GET || method == Method::HEAD => get_head(state, req).await,
        (1, _) => super::not_allowed(&req, "GET, HEAD"),
        (2, Some("apply")) if method == Method::POST => apply(state, req, payload).await,
        (2, Some("apply")) => super::not_allowed(&req, "POST"),
        _ => super::not_found(req).await,
    }
}

/// Body of apply.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApplyBody {
    /// The event's unique id.
    event_id: String,
    /// The event's RFC 3339 timestamp.
    created_at: String,
}

/// A head as the API shows it.
#[derive(Debug, Serialize, ToSchema)]
pub struct HeadView {
    /// Id of the newest applied event.
    pub event_id: String,
    /// Its `created_at`, RFC 3339 in UTC.
    pub created_at: String,
}

impl From<&Head> for HeadView {
    fn from(h: &Head) -> Self {
        Self {
            event_id: h.event_id.key_part().to_owned(),
            created_at: h.created_at.to_rfc3339(),
        }
    }
}

/// What an apply did.
#[derive(Debug, Serialize, ToSchema)]
pub struct Applied<'a> {
    /// The stream as given.
    stream: &'a str,
    /// `applied` (apply it: it is the newest), `stale` (do not: newer state
    /// is in place) or `duplicate` (already applied).
    outcome: ApplyOutcome,
    /// The stream's head after the apply.
    head: Option<HeadView>,
}

/// A stream's head.
#[derive(Debug, Serialize, ToSchema)]
pub struct StreamHead<'a> {
    /// The stream as given.
    stream: &'a str,
    /// The newest applied event.
    head: HeadView,
}

/// Records an event of a stream in `created_at` order: tells whether to
/// apply it.
#[utoipa::path(post, path = "/v1/streams/{stream}/apply", operation_id = "applyEvent", tag = "streams",
    security(("bearer" = [])),
    params(("stream" = String, Path, description = "The ordering scope (an order, a run, …), 1 to 512 bytes of UTF-8")),
    request_body(content = ApplyBody, content_type = "application/json"),
    responses(
        (status = 200, description = "The outcome and the head", body = Applied),
        (status = 400, description = "Invalid stream, event id, created_at or body", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Tokens are configured and none matched", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store cannot be reached or written; retry", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn apply(
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let stream = Key::parse(&path_segment(&req, 3, "stream")?, "stream")?;
    traces::note_key(stream.as_str());
    let body: ApplyBody =
        read_json(&req, payload, state.max_body_bytes, state.body_timeout).await?;
    let event_id = Key::parse(&body.event_id, "event_id")?;
    let created_at = CreatedAt::parse(&body.created_at, "created_at")?;
    let now = state.clock.now_ms();
    let result = state
        .store
        .apply(
            &ScopedKey::api(&stream),
            &ScopedKey::api(&event_id),
            created_at,
            state.retention_ms,
            now,
        )
        .await?;
    let outcome = match result.outcome {
        ApplyOutcome::Applied => "applied",
        ApplyOutcome::Stale => "stale",
        ApplyOutcome::Duplicate => "duplicate",
    };
    state.metrics.apply(outcome);
    traces::outcome(outcome);
    Ok(HttpResponse::Ok().json(Applied {
        stream: stream.as_str(),
        outcome: result.outcome,
        head: result.head.as_ref().map(HeadView::from),
    }))
}

/// The newest applied event of a stream.
#[utoipa::path(get, path = "/v1/streams/{stream}", operation_id = "getStreamHead", tag = "streams",
    security(("bearer" = [])),
    params(("stream" = String, Path, description = "The ordering scope (an order, a run, …), 1 to 512 bytes of UTF-8")),
    responses(
        (status = 200, description = "The head", body = StreamHead),
        (status = 404, description = "Nothing applied to this stream (or its retention passed)", body = Problem, content_type = "application/problem+json"),
        (status = 400, description = "Invalid stream, event id, created_at or body", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Tokens are configured and none matched", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store cannot be reached or written; retry", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn get_head(
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let stream = Key::parse(&path_segment(&req, 3, "stream")?, "stream")?;
    traces::note_key(stream.as_str());
    let now = state.clock.now_ms();
    match state.store.head(&ScopedKey::api(&stream), now).await? {
        Some(head) => {
            traces::outcome("found");
            Ok(HttpResponse::Ok().json(StreamHead {
                stream: stream.as_str(),
                head: HeadView::from(&head),
            }))
        }
        None => Err(ApiError::NotFound {
            code: "not_found",
            detail: "no event has been applied to this stream (or its retention passed)".into(),
        }),
    }
}
