//! Liveness and readiness.

use actix_web::http::Method;
use actix_web::{HttpResponse, web};
use serde::Serialize;
use utoipa::ToSchema;

use super::{AppState, Endpoint, Guard, register};
use crate::error::{ApiError, Problem};
use crate::store::StoreError;

/// `/healthz` and `/readyz`.
pub fn endpoints() -> Vec<Endpoint> {
    vec![
        Endpoint::new(Method::GET, "/healthz", || web::route().to(healthz)),
        Endpoint::new(Method::GET, "/readyz", || web::route().to(readyz)),
    ]
}

/// Registers `/healthz` and `/readyz` (no token needed).
pub fn configure(cfg: &mut web::ServiceConfig) {
    register(cfg, endpoints(), Guard::Open);
}

/// The answer of both probes.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// `ok` (healthz) or `ready` (readyz).
    pub status: &'static str,
}

/// The process is up and serving HTTP.
#[utoipa::path(get, path = "/healthz", operation_id = "checkLiveness", tag = "health",
    responses((status = 200, description = "The process serves HTTP", body = Health)))]
pub(super) async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(Health { status: "ok" })
}

/// The store answers: requests can be served.
#[utoipa::path(get, path = "/readyz", operation_id = "checkReadiness", tag = "health",
    responses(
        (status = 200, description = "The store answers", body = Health),
        (status = 503, description = "The store cannot be reached or written (a full disk)",
            body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn readyz(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    // Any failure means "not ready": 503, so load balancers route around
    // us, with the reason (but no cause: this needs no token).
    match readiness(&state).await {
        Ok(()) => Ok(HttpResponse::Ok().json(Health { status: "ready" })),
        Err(StoreError::LowSpace { free, floor }) => Err(ApiError::NotReady {
            reason: "disk_low",
            detail: format!(
                "{free} bytes are free on the data file's disk: less the room a checkpoint of \
                 the write-ahead log needs, below storage.min_free_bytes ({floor}): writes are \
                 refused until space frees; reads are served"
            ),
        }),
        Err(e) => {
            tracing::warn!(error = %e.chain(), "not ready");
            Err(ApiError::NotReady {
                reason: "store_unavailable",
                detail: "the store cannot be reached or written now (a disk fault, the Redis \
                         backend is down, or it does not give storage.redis.durability): the \
                         log says which"
                    .into(),
            })
        }
    }
}

/// Whether requests can be served: the store answers, then the inbox.
/// Recorded in the metrics (`dedupd_ready`, `dedupd_store_up`), so
/// `/readyz` and `/metrics` agree and a change seen by either is counted.
pub(super) async fn readiness(state: &AppState) -> Result<(), StoreError> {
    let ready = match state.store.ready().await {
        Ok(()) => state.gateway.inbox.ready().await,
        failed => failed,
    };
    state.metrics.set_readiness(&ready);
    if let Some(alerts) = &state.gateway.alerts {
        alerts.readiness(&ready);
    }
    ready
}
