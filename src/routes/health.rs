//! Liveness and readiness.

use actix_web::{HttpResponse, web};

use super::AppState;
use crate::error::ApiError;
use crate::store::StoreError;

/// Registers `/healthz` and `/readyz`.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/healthz", web::get().to(healthz))
        .route("/readyz", web::get().to(readyz));
}

/// The process is up and serving HTTP.
async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({ "status": "ok" }))
}

/// The store answers: requests can be served.
async fn readyz(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    // Any failure means "not ready": 503, so load balancers route around us.
    state
        .store
        .ready()
        .await
        .map_err(|e| ApiError::Store(StoreError::Unavailable(e.to_string())))?;
    Ok(HttpResponse::Ok().json(serde_json::json!({ "status": "ready" })))
}
