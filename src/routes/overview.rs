//! `GET /v1/sources`: every source at a glance — the configured ones and
//! the removed ones whose events the inbox still holds — with counts by
//! status, how long the oldest pending event has waited, and the delivery
//! state. What the operator console's overview shows.

use std::collections::BTreeMap;

use futures_util::future::join_all;

use actix_web::http::Method;
use actix_web::{HttpResponse, web};
use serde::Serialize;
use utoipa::ToSchema;

use super::sources::{DeliveryView, StoreState};
use super::{AppState, Endpoint, Guard, register};
use crate::clock::Millis;
use crate::error::{ApiError, Problem};
use crate::store::inbox::SourceSummary;

/// The overview route, relative to `/v1`.
pub fn endpoints() -> Vec<Endpoint> {
    vec![Endpoint::new(Method::GET, "/sources", || {
        web::route().to(list)
    })]
}

/// Registers the overview route (in the `/v1` scope, behind its tokens).
pub fn configure(cfg: &mut web::ServiceConfig) {
    register(cfg, endpoints(), Guard::Open);
}

/// Every source, in name order.
#[derive(Debug, Serialize, ToSchema)]
pub struct Overview {
    /// The server's clock when it answered, Unix ms (ages are measured from it).
    now_ms: Millis,
    /// Whether the store takes writes now (as `/readyz` sees it): while it
    /// does not, nothing is taken in or delivered.
    store: StoreState,
    /// One row per source.
    sources: Vec<SourceRow>,
}

/// One source in the overview.
#[derive(Debug, Serialize, ToSchema)]
pub struct SourceRow {
    source: String,
    /// Whether it is in the configuration (false: removed, events kept).
    configured: bool,
    /// Events waiting for delivery or between attempts.
    pending: u64,
    /// Events delivered (kept for `gateway.delivered_retention`).
    delivered: u64,
    /// Events settled as stale.
    stale: u64,
    /// Events waiting for an operator's redeliver.
    dead: u64,
    /// Events erased by an operator (body and headers deleted, the record
    /// kept for the source's dead retention).
    erased: u64,
    /// Events none of the source's destinations took (kept, never sent).
    filtered: u64,
    /// When the oldest pending event was received, Unix ms.
    oldest_pending_received_at_ms: Option<Millis>,
    /// How long it has waited, ms, by the server's clock.
    oldest_pending_age_ms: Option<Millis>,
    /// The delivery lane; null for a removed source.
    delivery: Option<DeliveryView>,
}

/// Every source with its events by status, its oldest pending event's age
/// and its delivery state. Reads counts kept in memory and one index entry
/// per source with pending events: it never scans the inbox.
#[utoipa::path(get, path = "/v1/sources", operation_id = "listSources", tag = "gateway",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Every configured source, and every removed one with events", body = Overview),
        (status = 401, description = "Tokens are configured and none matched", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store cannot be read or written now; retry", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn list(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let now = state.clock.now_ms();
    let mut by_name: BTreeMap<String, SourceSummary> = state
        .gateway
        .inbox
        .inbox_summary()
        .await?
        .into_iter()
        .map(|s| (s.source.clone(), s))
        .collect();
    let sources = state.gateway.sources();
    for name in sources.names() {
        by_name
            .entry(name.clone())
            .or_insert_with(|| SourceSummary {
                source: name.clone(),
                pending: 0,
                delivered: 0,
                stale: 0,
                dead: 0,
                erased: 0,
                filtered: 0,
                oldest_pending_ms: None,
            });
    }
    let store = StoreState::now(&state).await;
    // With the store down, each lane's fleet state would wait out its own
    // timeout: this instance's view says enough (`held_by: store`).
    let down = store.is_unavailable();
    let lanes = join_all(by_name.keys().map(|name| {
        let dispatcher = &state.dispatcher;
        async move {
            if down {
                dispatcher.lane(name)
            } else {
                dispatcher.lane_now(name).await
            }
        }
    }))
    .await;
    let sources = by_name
        .into_values()
        .zip(lanes)
        .map(|(s, lane)| SourceRow {
            configured: sources.get(&s.source).is_some(),
            delivery: lane.as_ref().map(|l| DeliveryView::of(l, &store)),
            oldest_pending_age_ms: s.oldest_pending_ms.map(|at| now.saturating_sub(at)),
            oldest_pending_received_at_ms: s.oldest_pending_ms,
            pending: s.pending,
            delivered: s.delivered,
            stale: s.stale,
            dead: s.dead,
            erased: s.erased,
            filtered: s.filtered,
            source: s.source,
        })
        .collect();
    Ok(HttpResponse::Ok().json(Overview {
        now_ms: now,
        store,
        sources,
    }))
}
