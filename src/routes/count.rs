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
use crate::gateway::filter::EventFilter;
use crate::gateway::scan::{Position, ScanError};
use crate::gateway::source::lane_name;
use crate::store::inbox::EventStatus;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

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
    /// One destination's copies only (on a source with destinations; by
    /// default every destination's, each event counted once).
    destination: Option<String>,
    /// A count: go on from where an earlier count of the same filter
    /// stopped (its `next`). Not taken by a job.
    pub(super) after: Option<String>,
}

/// What the filter matches.
#[derive(Debug, Serialize, ToSchema)]
pub struct CountView {
    /// Events that match in what was read (from `after`, if given).
    matched: u64,
    /// Events read to find them.
    scanned: u64,
    /// False when the count stopped at its budget (`gateway.scan_bytes`,
    /// `gateway.scan_time`) before the end: `matched` counts what was read,
    /// and `next` goes on from there.
    complete: bool,
    /// The first 10 that match, oldest received first.
    first_ids: Vec<String>,
    /// When not complete: pass it as `after` to count on from here (the
    /// same filter; add up the `matched` of each answer).
    #[serde(skip_serializing_if = "Option::is_none")]
    next: Option<String>,
}

/// Which lanes a filter reads, and from where.
#[derive(Debug)]
pub(super) struct Scope {
    /// The name a job runs under: the source, or with `destination`, its
    /// lane.
    pub name: String,
    /// The lanes read, in order.
    pub lanes: Vec<String>,
    /// Where a count starts.
    pub from: Position,
}

pub(super) fn invalid(
    code: &'static str,
    field: &'static str,
    detail: impl Into<String>,
) -> ApiError {
    ApiError::Invalid(Invalid::new(code, field, detail))
}

impl FilterQuery {
    /// The lanes of `source` the parameters read (its own and each
    /// destination's, or `destination`'s alone), and where a count starts
    /// (`after`).
    pub(super) async fn scope(&self, state: &AppState, source: &str) -> Result<Scope, ApiError> {
        let (name, lanes) = match &self.destination {
            None => (
                source.to_owned(),
                state.gateway.lanes_to_scan(source).await?,
            ),
            Some(d) => {
                let lane = lane_name(source, d);
                let known =
                    state.gateway.lanes_to_scan(source).await?.contains(&lane) && lane != source;
                if !known || d.contains('.') {
                    return Err(ApiError::NotFound {
                        code: "unknown_destination",
                        detail: format!(
                            "source {source:?} has no destination {d:?} (nor events stored for one)"
                        ),
                    });
                }
                (lane.clone(), vec![lane])
            }
        };
        let from = match &self.after {
            None => Position::default(),
            Some(raw) => decode_position(raw, &lanes)?,
        };
        Ok(Scope { name, lanes, from })
    }

    /// The filter the parameters say, or what is wrong with them.
    pub(super) fn filter(&self) -> Result<EventFilter, ApiError> {
        // A job stores its filter and writes it with its progress: texts
        // are bounded.
        let texts = [
            ("destination", &self.destination),
            ("after", &self.after),
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
        let field = match (self.field.clone(), self.value.clone()) {
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
            created_from: created(self.created_from.clone(), "created_from")?,
            created_to: created(self.created_to.clone(), "created_to")?,
            stream: self.stream.clone(),
            field,
            error_contains: self.error_contains.clone(),
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
    let scope = query.scope(&state, &source).await?;
    let counted = count_in(&state, scope, filter).await?;
    Ok(HttpResponse::Ok().json(counted))
}

/// Counts what `filter` matches in `scope`, on the scan thread, within the
/// budget.
pub(super) async fn count_in(
    state: &AppState,
    scope: Scope,
    filter: EventFilter,
) -> Result<CountView, ApiError> {
    let lanes = scope.lanes.clone();
    let scanned = state
        .gateway
        .scanner
        .count(state.gateway.inbox.clone(), scope.lanes, filter, scope.from)
        .await
        .map_err(scan_error)?;
    Ok(CountView {
        matched: scanned.matched,
        scanned: scanned.rows,
        complete: scanned.next.is_none(),
        first_ids: scanned.matches.into_iter().map(|e| e.event_id).collect(),
        next: scanned.next.map(|p| encode_position(&p, &lanes)),
    })
}

/// A scan that did not run, for the client.
pub(super) fn scan_error(e: ScanError) -> ApiError {
    match e {
        ScanError::Store(e) => ApiError::Store(e),
        ScanError::Busy => ApiError::ScansBusy,
        ScanError::Stopped => ApiError::Store(crate::store::StoreError::Unavailable(
            std::sync::Arc::new(std::io::Error::other("the scan thread has stopped")),
        )),
    }
}

/// A count's cursor: the lane by name and the last row read there, so a
/// cursor never lands in another lane.
#[derive(Serialize, Deserialize)]
struct Cursor {
    lane: String,
    after: Option<(Millis, String)>,
}

fn encode_position(p: &Position, lanes: &[String]) -> String {
    let cursor = Cursor {
        lane: lanes.get(p.lane).cloned().unwrap_or_default(),
        after: p.after.clone(),
    };
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(&cursor).unwrap_or_default())
}

fn decode_position(raw: &str, lanes: &[String]) -> Result<Position, ApiError> {
    let bad = || {
        invalid(
            "invalid_cursor",
            "after",
            "must be the `next` of an earlier count of the same source and destination",
        )
    };
    let bytes = URL_SAFE_NO_PAD.decode(raw).map_err(|_| bad())?;
    let cursor: Cursor = serde_json::from_slice(&bytes).map_err(|_| bad())?;
    let lane = lanes
        .iter()
        .position(|l| *l == cursor.lane)
        .ok_or_else(bad)?;
    Ok(Position {
        lane,
        after: cursor.after,
    })
}
