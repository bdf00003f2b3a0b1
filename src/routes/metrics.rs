//! `GET /metrics`: the Prometheus text format, behind the same bearer
//! tokens as `/v1`.

use actix_web::http::Method;
use actix_web::{HttpResponse, web};

use super::{AppState, Endpoint, Guard, register};
use crate::error::{ApiError, Problem};

/// `GET /metrics`.
pub fn endpoints() -> Vec<Endpoint> {
    vec![Endpoint::new(Method::GET, "/metrics", || {
        web::route().to(scrape)
    })]
}

/// Registers `/metrics`.
pub fn configure(cfg: &mut web::ServiceConfig) {
    register(cfg, endpoints(), Guard::Bearer);
}

/// Every metric in the Prometheus text format (see "Monitoring" in
/// docs/operations.md for the families).
#[utoipa::path(get, path = "/metrics", operation_id = "getMetrics", tag = "operations",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Prometheus text exposition format 0.0.4", body = String,
            content_type = "text/plain; version=0.0.4; charset=utf-8"),
        (status = 401, description = "Tokens are configured and none was given", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The data file cannot be read now", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn scrape(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    // The gauges come from counts kept in memory: no scan per scrape.
    let summary = state.gateway.inbox.inbox_summary().await?;
    state.metrics.set_inbox(&summary, state.clock.now_ms());
    if let Some(space) = state.gateway.inbox.disk_space() {
        state.metrics.set_disk_space(space);
    }
    Ok(HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(state.metrics.render()))
}
