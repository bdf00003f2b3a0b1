//! `GET /v1/sources/{source}/count`: how many of a source's events a
//! filter matches, and the first of them — the dry run of a bulk
//! operation (see `gateway::filter`).

use actix_web::http::Method;
use actix_web::{HttpRequest, HttpResponse, web};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::sources::known_source;
use super::{AppState, Endpoint, Guard, path_segment, register};
use crate::clock::Millis;
use crate::domain::{CreatedAt, Invalid};
use crate::error::{ApiError, Problem};
use crate::gateway::filter::{self, EventFilter};
use crate::store::inbox::EventStatus;

/// The count route, relative to `/v1`.
pub fn endpoints() -> Vec<Endpoint> {
    vec![Endpoint::new(
        Method::GET,
        "/sources/{source}/count",
        || web::route().to(count),
    )]
}

/// Registers the count route (in the `/v1` scope, behind its tokens).
pub fn configure(cfg: &mut web::ServiceConfig) {
    register(cfg, endpoints(), Guard::Open);
}

/// Longest text a filter takes (a stream, a body field or its value,
/// error text), bytes.
const MAX_TEXT: usize = 1024;

/// Latest receive time a filter takes, Unix ms: the last of year 9999,
/// the latest an RFC 3339 time (or the console's `Date`) can show.
const MAX_RECEIVED_MS: Millis = 253_402_300_799_999;

/// The filter, as query parameters (the count) or a JSON object (a job).
#[derive(Debug, Deserialize, IntoParams, ToSchema)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct FilterQuery {
    /// pending | delivered | stale | dead | erased
    status: String,
    /// Received at or after, Unix ms.
    received_from: Option<Millis>,
    /// Received before, Unix ms.
    received_to: Option<Millis>,
    /// Created at or after, RFC 3339.
    created_from: Option<String>,
    /// Created before, RFC 3339.
    created_to: Option<String>,
    /// In this stream.
    stream: Option<String>,
    /// A body field, as a JSON pointer (`/type`); needs `value`.
    field: Option<String>,
    /// The body field's value: a string equals it, anything else equals
    /// it read as JSON (`7`, `true`).
    value: Option<String>,
    /// The last error contains this text.
    error_contains: Option<String>,
}

/// What the filter matches.
#[derive(Debug, Serialize, ToSchema)]
pub struct CountView {
    /// Events that match (a lower bound when `complete` is false).
    matched: u64,
    /// Events read to find them.
    scanned: u64,
    /// False when the count stopped after reading 1,000,000 events.
    complete: bool,
    /// The first 10 that match, oldest received first.
    first_ids: Vec<String>,
}

pub(super) fn invalid(
    code: &'static str,
    field: &'static str,
    detail: impl Into<String>,
) -> ApiError {
    ApiError::Invalid(Invalid::new(code, field, detail))
}

impl FilterQuery {
    /// The filter the parameters say, or what is wrong with them.
    pub(super) fn filter(self) -> Result<EventFilter, ApiError> {
        // A job stores its filter and writes it with its progress: texts
        // are bounded.
        let texts = [
            ("stream", &self.stream),
            ("field", &self.field),
            ("value", &self.value),
            ("error_contains", &self.error_contains),
            ("created_from", &self.created_from),
            ("created_to", &self.created_to),
        ];
        for (name, text) in texts {
            if text.as_ref().is_some_and(|t| t.len() > MAX_TEXT) {
                return Err(invalid(
                    "too_long",
                    name,
                    format!("at most {MAX_TEXT} bytes"),
                ));
            }
        }
        let times = [
            ("received_from", self.received_from),
            ("received_to", self.received_to),
        ];
        for (name, ms) in times {
            if ms.is_some_and(|t| t > MAX_RECEIVED_MS) {
                return Err(invalid(
                    "invalid_time",
                    name,
                    format!("Unix ms, at most {MAX_RECEIVED_MS} (the end of year 9999)"),
                ));
            }
        }
        let status = EventStatus::parse(&self.status).ok_or_else(|| {
            invalid(
                "invalid_status",
                "status",
                format!(
                    "must be pending, delivered, stale, dead, erased or filtered; got {:?}",
                    self.status
                ),
            )
        })?;
        let created = |raw: Option<String>, field: &'static str| {
            raw.map(|r| CreatedAt::parse(&r, field).map_err(ApiError::Invalid))
                .transpose()
        };
        let field = match (self.field, self.value) {
            (Some(pointer), Some(value)) if pointer.starts_with('/') => Some((pointer, value)),
            (Some(pointer), Some(_)) => {
                return Err(invalid(
                    "invalid_field",
                    "field",
                    format!("must be a JSON pointer such as /type; got {pointer:?}"),
                ));
            }
            (None, None) => None,
            _ => {
                return Err(invalid(
                    "invalid_field",
                    "field",
                    "field and value go together",
                ));
            }
        };
        Ok(EventFilter {
            status,
            received_from: self.received_from,
            received_to: self.received_to,
            created_from: created(self.created_from, "created_from")?,
            created_to: created(self.created_to, "created_to")?,
            stream: self.stream,
            field,
            error_contains: self.error_contains,
        })
    }
}

/// How many of a source's events match a filter, and the first ten: what
/// a bulk operation over the same filter would touch.
#[utoipa::path(get, path = "/v1/sources/{source}/count", operation_id = "countSourceEvents", tag = "gateway",
    security(("bearer" = [])),
    params(("source" = String, Path, description = "A source name: configured, or removed with events still stored"), FilterQuery),
    responses(
        (status = 200, description = "What the filter matches", body = CountView),
        (status = 400, description = "A parameter is wrong (`invalid_query`, `invalid_status`, a time that is not RFC 3339, `invalid_time` past year 9999, `invalid_field`)", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "`unknown_source`", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Tokens are configured and none matched", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store cannot be read now; retry", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn count(
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let source = path_segment(&req, 3, "source")?;
    known_source(&state, &source).await?;
    // Parsed here rather than by `web::Query`, whose error does not name
    // the parameter.
    let de =
        serde_urlencoded::Deserializer::new(form_urlencoded::parse(req.query_string().as_bytes()));
    let query: FilterQuery = serde_path_to_error::deserialize(de).map_err(|e| {
        let at = e.path().to_string();
        invalid(
            "invalid_query",
            "query",
            format!("{at}: {}", e.into_inner()),
        )
    })?;
    let filter = query.filter()?;
    let counted = filter::count(
        state.gateway.inbox.as_ref(),
        &source,
        &filter,
        filter::MAX_SCAN,
    )
    .await?;
    Ok(HttpResponse::Ok().json(CountView::from(counted)))
}

impl From<filter::Counted> for CountView {
    fn from(counted: filter::Counted) -> Self {
        Self {
            matched: counted.matched,
            scanned: counted.scanned,
            complete: counted.complete,
            first_ids: counted.first_ids,
        }
    }
}
