//! `GET /metrics`: the Prometheus text format, behind the same bearer
//! tokens as `/v1`.

use actix_web::middleware::from_fn;
use actix_web::{HttpResponse, web};

use super::AppState;
use crate::auth::require_bearer;
use crate::error::ApiError;

/// Registers `/metrics`.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::resource("/metrics")
            .wrap(from_fn(require_bearer))
            .route(web::get().to(scrape))
            .default_service(super::method_not_allowed("GET")),
    );
}

/// Sets the inbox gauges from the store's counts (kept in memory, never a
/// scan), then renders every family.
async fn scrape(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let summary = state.gateway.inbox.inbox_summary().await?;
    state.metrics.set_inbox(&summary, state.clock.now_ms());
    Ok(HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(state.metrics.render()))
}
