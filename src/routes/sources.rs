//! The operator API of the gateway: list a source's events by status, and
//! redeliver dead or stale ones.

use actix_web::http::Method;
use actix_web::{HttpRequest, HttpResponse, web};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::{AppState, Endpoint, Guard, path_segment, register};
use crate::clock::Millis;
use crate::domain::Invalid;
use crate::error::{ApiError, Problem};
use crate::gateway::delivery::circuit::State as CircuitState;
use crate::gateway::delivery::schedule::{LaneScope, LaneView};
use crate::store::StoreError;
use crate::store::inbox::{EventStatus, InboxEvent, ListOrder, RedeliverOutcome};

/// The source routes, relative to `/v1`.
pub fn endpoints() -> Vec<Endpoint> {
    vec![
        Endpoint::new(Method::GET, "/sources/{source}", || web::route().to(show)),
        Endpoint::new(Method::GET, "/sources/{source}/events", || {
            web::route().to(list)
        }),
        Endpoint::new(
            Method::POST,
            "/sources/{source}/events/{event_id}/redeliver",
            || web::route().to(redeliver),
        ),
    ]
}

/// Registers the source routes (in the `/v1` scope, behind its tokens).
pub fn configure(cfg: &mut web::ServiceConfig) {
    register(cfg, endpoints(), Guard::Open);
}

/// Query of the list endpoint.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// pending | delivered | stale | dead | erased | filtered
    status: String,
    /// Page size, 1 to 500 (default 100).
    limit: Option<usize>,
    /// The `next` cursor of the previous page.
    after: Option<String>,
    /// `oldest` (default) or `newest`: which end comes first.
    order: Option<String>,
}

/// An event as the operator API shows it (without its body).
#[derive(Debug, Serialize, ToSchema)]
pub struct EventView {
    /// The provider's event id.
    event_id: String,
    /// Where it is in its life.
    status: EventStatus,
    /// Its stream, if the source orders events.
    stream: Option<String>,
    /// Its `created_at` (or its receive time), RFC 3339.
    created_at: String,
    /// When dedupd accepted it, Unix ms.
    received_at_ms: Millis,
    attempts: u32,
    /// Pending: next attempt. Settled: when it settled.
    due_at_ms: Millis,
    /// What went wrong last, if anything.
    last_error: Option<String>,
    /// Settled: when the record is reaped.
    #[serde(skip_serializing_if = "Option::is_none")]
    expires_at_ms: Option<Millis>,
    /// Size of the stored body.
    body_bytes: usize,
    /// The bulk job that last replayed it (its `dedupd-replay` header).
    #[serde(skip_serializing_if = "Option::is_none")]
    replay_job: Option<String>,
}

/// A page of a source's events.
#[derive(Debug, Serialize, ToSchema)]
pub struct EventsPage {
    source: String,
    status: EventStatus,
    /// In the order asked for (oldest received first by default).
    events: Vec<EventView>,
    /// Pass as `after` for the next page; absent on the last.
    next: Option<String>,
}

/// A source's delivery state.
#[derive(Debug, Serialize, ToSchema)]
pub struct SourceView {
    source: String,
    /// False for a source that left the configuration but still has events.
    configured: bool,
    /// Its delivery lane; null when not configured, or for a source whose
    /// destinations all have lanes of their own.
    delivery: Option<DeliveryView>,
    /// The destination whose deliveries these are (`default` for a lone
    /// `forward_to`); null when it delivers none.
    destination: Option<String>,
    /// For a destination's lane (`SOURCE.DESTINATION`): its source.
    lane_of: Option<String>,
    /// For the source posted to: its destinations, each with the name its
    /// deliveries are listed and acted on under.
    destinations: Vec<DestinationRef>,
    /// Whether the store takes writes now: while it does not, nothing is
    /// taken in or delivered, whatever the delivery's state says.
    store: StoreState,
}

/// The store's state, as `/readyz` sees it.
#[derive(Debug, Serialize, ToSchema)]
pub struct StoreState {
    /// `ready`; `disk_low` (below `storage.min_free_bytes`: writes are
    /// refused, reads served); or `unavailable` (a disk fault, or the Redis
    /// backend down or not durable as configured: the log says which).
    state: &'static str,
}

impl StoreState {
    /// Whether writes fail now for another reason than a low disk.
    pub(super) fn is_unavailable(&self) -> bool {
        self.state == "unavailable"
    }

    pub(super) async fn now(state: &AppState) -> Self {
        Self {
            state: match super::health::readiness(state).await {
                Ok(()) => "ready",
                Err(StoreError::LowSpace { .. }) => "disk_low",
                Err(_) => "unavailable",
            },
        }
    }
}

/// One of a source's destinations.
#[derive(Debug, Serialize, ToSchema)]
pub struct DestinationRef {
    /// Its name.
    name: String,
    /// Where its deliveries are: `/v1/sources/{lane}/…`.
    lane: String,
}

/// A configured source's delivery lane and circuit breaker.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeliveryView {
    /// `running`, `paused` (after `pause_after` failures in a row) or
    /// `probing` (one delivery tests the destination); `unknown` when the
    /// fleet's state cannot be read (the store is down).
    state: &'static str,
    /// Whose breaker, hold and rate limit these are: `instance` (the local
    /// inbox: this instance's own) or `fleet` (the shared inbox: every
    /// instance's, the same from any). `in_flight` is always this
    /// instance's.
    scope: &'static str,
    /// What holds deliveries back now, if anything: `store` (the store
    /// cannot be written: nothing is delivered), `paused`, `probing`,
    /// `retry_after`, or `rate_limit` (no token left). With several, the
    /// one that lasts longest.
    held_by: Option<&'static str>,
    /// Until when `held_by` holds, Unix ms (null for `store` and
    /// `probing`: until the store answers, or the probe does).
    held_until_ms: Option<Millis>,
    /// With a rate limit and no token left: when the next one comes, Unix
    /// ms.
    rate_limited_until_ms: Option<Millis>,
    /// While paused: when it probes again, Unix ms.
    paused_until_ms: Option<Millis>,
    /// Failed deliveries in a row.
    consecutive_failures: u32,
    /// The destination answered 429 or 503 with `Retry-After`: no delivery
    /// starts before this time, Unix ms (at most `backoff_max` ahead). With
    /// a pause of the breaker too, the later of the two holds.
    retry_after_until_ms: Option<Millis>,
    /// Deliveries in flight now.
    in_flight: usize,
    /// The source's `max_in_flight`.
    max_in_flight: usize,
}

/// A redelivered event's new status.
#[derive(Debug, Serialize, ToSchema)]
pub struct Redelivered {
    source: String,
    event_id: String,
    /// Always `pending`.
    status: EventStatus,
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
            replay_job: e.replay.map(|m| m.job),
        }
    }
}

/// A source is known while it is configured, and after it left the
/// configuration for as long as the inbox holds events of it: those stay
/// listable and redeliverable (delivered when the source comes back).
pub(super) async fn known_source(state: &AppState, name: &str) -> Result<(), ApiError> {
    if state.gateway.source(name).is_some() || state.gateway.inbox.has_source(name).await? {
        Ok(())
    } else {
        Err(unknown_source(name))
    }
}

/// Refuses a redelivery into a source that delivers only through its
/// destinations' lanes: nothing would send it.
pub(super) fn delivers(state: &AppState, name: &str) -> Result<(), ApiError> {
    match state.gateway.source(name) {
        Some(s) if !s.delivers => Err(ApiError::Refused {
            code: "delivers_through_destinations",
            detail: format!(
                "source {name:?} delivers through its destinations, each on its own: redeliver \
                 to one of them, with the job's filter's `destination` ({}), or at its lane \
                 ({})",
                s.routes
                    .iter()
                    .map(|r| r.destination.clone())
                    .collect::<Vec<_>>()
                    .join(", "),
                s.routes
                    .iter()
                    .map(|r| format!("/v1/sources/{}", r.lane))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }),
        _ => Ok(()),
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
#[utoipa::path(get, path = "/v1/sources/{source}", operation_id = "getSource", tag = "gateway",
    security(("bearer" = [])),
    params(("source" = String, Path, description = "A source name: configured, or removed with events still stored")),
    responses(
        (status = 200, description = "The source's delivery state", body = SourceView),
        (status = 404, description = "`unknown_source`", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Tokens are configured and none matched", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store cannot be read or written now; retry", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn show(
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let source = path_segment(&req, 3, "source")?;
    let Some(configured) = state.gateway.source(&source) else {
        known_source(&state, &source).await?;
        return Ok(HttpResponse::Ok().json(SourceView {
            source,
            configured: false,
            delivery: None,
            destination: None,
            lane_of: None,
            destinations: Vec::new(),
            store: StoreState::now(&state).await,
        }));
    };
    let store = StoreState::now(&state).await;
    let lane = if store.is_unavailable() {
        state.dispatcher.lane(&source)
    } else {
        state.dispatcher.lane_now(&source).await
    };
    let delivery = lane.map(|lane| DeliveryView::of(&lane, &store));
    Ok(HttpResponse::Ok().json(SourceView {
        source,
        configured: true,
        destination: configured.delivers.then(|| configured.destination.clone()),
        delivery,
        lane_of: configured.lane_of.clone(),
        destinations: configured
            .routes
            .iter()
            .map(|r| DestinationRef {
                name: r.destination.clone(),
                lane: r.lane.clone(),
            })
            .collect(),
        store,
    }))
}

impl DeliveryView {
    /// A lane's view, with the store's state.
    pub(super) fn of(lane: &LaneView, store: &StoreState) -> Self {
        let (state, paused_until_ms) = match lane.state {
            // The fleet's state is in the store: not read while it is down.
            _ if lane.fleet_unread
                || (store.is_unavailable() && lane.scope == LaneScope::Fleet) =>
            {
                ("unknown", None)
            }
            CircuitState::Closed => ("running", None),
            CircuitState::Open { until } => ("paused", Some(until)),
            CircuitState::Probing { .. } => ("probing", None),
        };
        let (held_by, held_until_ms) = if store.is_unavailable() {
            (Some("store"), None)
        } else if state == "probing" {
            (Some("probing"), None)
        } else {
            [
                ("paused", paused_until_ms),
                ("retry_after", lane.held_until),
                ("rate_limit", lane.rate_limited_until),
            ]
            .into_iter()
            .filter_map(|(by, until)| Some((by, until?)))
            .max_by_key(|(_, until)| *until)
            .map_or((None, None), |(by, until)| (Some(by), Some(until)))
        };
        Self {
            state,
            scope: match lane.scope {
                LaneScope::Instance => "instance",
                LaneScope::Fleet => "fleet",
            },
            held_by,
            held_until_ms,
            rate_limited_until_ms: lane.rate_limited_until,
            paused_until_ms,
            consecutive_failures: lane.consecutive_failures,
            retry_after_until_ms: lane.held_until,
            in_flight: lane.in_flight,
            max_in_flight: lane.max_in_flight,
        }
    }
}

/// A source's events with one status, oldest (or newest) received first, a
/// page at a time.
#[utoipa::path(get, path = "/v1/sources/{source}/events", operation_id = "listSourceEvents", tag = "gateway",
    security(("bearer" = [])),
    params(("source" = String, Path, description = "A source name: configured, or removed with events still stored"), ListQuery),
    responses(
        (status = 200, description = "A page of events", body = EventsPage),
        (status = 400, description = "Bad status, limit, order or cursor", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "`unknown_source`", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Tokens are configured and none matched", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store cannot be read or written now; retry", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn list(
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
                "must be pending, delivered, stale, dead, erased or filtered; got {:?}",
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
    let order = match query.order.as_deref() {
        None | Some("oldest") => ListOrder::OldestFirst,
        Some("newest") => ListOrder::NewestFirst,
        Some(other) => {
            return Err(ApiError::Invalid(Invalid::new(
                "invalid_order",
                "order",
                format!("must be oldest or newest; got {other:?}"),
            )));
        }
    };
    let after = query.after.as_deref().map(decode_cursor).transpose()?;
    let (events, next) = state
        .gateway
        .inbox
        .list_events(&source, status, order, after, limit)
        .await?;
    Ok(HttpResponse::Ok().json(EventsPage {
        source,
        status,
        events: events.into_iter().map(EventView::from).collect(),
        next: next.as_ref().map(encode_cursor),
    }))
}

/// Puts a dead or stale event back to pending (a stale one is then
/// delivered even though it is older than its stream's head).
#[utoipa::path(post, path = "/v1/sources/{source}/events/{event_id}/redeliver", operation_id = "redeliverEvent", tag = "gateway",
    security(("bearer" = [])),
    params(("source" = String, Path, description = "A source name: configured, or removed with events still stored"), ("event_id" = String, Path, description = "The provider's event id")),
    responses(
        (status = 202, description = "Pending again", body = Redelivered),
        (status = 404, description = "`unknown_source` or `unknown_event`", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`not_redeliverable`: pending or delivered", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Tokens are configured and none matched", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store cannot be read or written now; retry", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn redeliver(
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let source = path_segment(&req, 3, "source")?;
    let event_id = path_segment(&req, 5, "event_id")?;
    known_source(&state, &source).await?;
    delivers(&state, &source)?;
    let now = state.clock.now_ms();
    match state
        .gateway
        .inbox
        .redeliver(&source, &event_id, now)
        .await?
    {
        RedeliverOutcome::Requeued => {
            // It goes before the newer events of its stream: the
            // dispatcher hands back any it leased ahead.
            match state.gateway.inbox.inbox_event(&source, &event_id).await {
                Ok(Some(e)) => {
                    state
                        .gateway
                        .arrivals
                        .push(&source, e.stream.as_deref(), e.created_at);
                }
                _ => state.gateway.arrivals.push_unknown(),
            }
            state.gateway.wake.notify_one();
            Ok(HttpResponse::Accepted().json(Redelivered {
                source,
                event_id,
                status: EventStatus::Pending,
            }))
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
