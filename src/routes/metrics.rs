//! `GET /metrics`: the Prometheus text format, behind the same bearer
//! tokens as `/v1`.

use actix_web::http::Method;
use actix_web::{HttpResponse, web};

use super::{AppState, Endpoint, Guard, register};
use crate::error::Problem;
use crate::gateway::delivery::circuit::State as CircuitState;
use crate::gateway::jobs::{self, JobState};
use crate::store::StoreError;

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

/// Longest a scrape waits for the store, for readiness and again for the
/// inbox's counts.
const SCRAPE_WAIT: std::time::Duration = std::time::Duration::from_millis(1500);

/// Every metric in the Prometheus text format (see "Monitoring" in
/// docs/operations.md for the families).
#[utoipa::path(get, path = "/metrics", operation_id = "getMetrics", tag = "operations",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Prometheus text exposition format 0.0.4", body = String,
            content_type = "text/plain; version=0.0.4; charset=utf-8"),
        (status = 401, description = "Tokens are configured and none was given", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn scrape(state: web::Data<AppState>) -> HttpResponse {
    // Readiness as `/readyz` would answer now (a read of the file, or a
    // PING to Redis), its gauges set inside; but a scrape answers in
    // time whatever the store does (Prometheus gives up after its
    // scrape_timeout, 10 s by default, and with it the alert that the
    // store is down): a store that does not answer within SCRAPE_WAIT is
    // down for this scrape.
    let ready = match tokio::time::timeout(SCRAPE_WAIT, super::health::readiness(&state)).await {
        Ok(ready) => ready,
        Err(_) => {
            let down = Err(StoreError::unavailable(format!(
                "the store did not answer within {} ms",
                SCRAPE_WAIT.as_millis()
            )));
            state.metrics.set_readiness(&down);
            down
        }
    };
    // Read from the schedule, which decides, rather than mirrored at each
    // transition: the gauge cannot miss one. Every source with series: one
    // a reload removed has no lane, so its gauges go to zero.
    let sources = state.metrics.source_names();
    for name in &sources {
        let paused = state
            .dispatcher
            .lane(name)
            .is_some_and(|lane| !matches!(lane.state, CircuitState::Closed));
        state.metrics.set_source_paused(name, paused);
    }
    // The gauges come from counts kept in memory: no scan per scrape. A
    // store that cannot be read leaves them as last read and still
    // answers: the scrape is how `dedupd_store_up` = 0 reaches an alert,
    // with every other family.
    let store_up = !matches!(
        ready,
        Err(StoreError::Unavailable(_) | StoreError::Failed(_))
    );
    if store_up {
        // One wait for both reads. The jobs: a bulk replay makes old
        // events pending again, and the alert on the oldest pending event
        // holds off while a job runs on the source.
        let inbox = state.gateway.inbox.as_ref();
        let reads = futures_util::future::join(inbox.inbox_summary(), jobs::list(inbox));
        match tokio::time::timeout(SCRAPE_WAIT, reads).await {
            Ok((summary, listed)) => {
                match summary {
                    Ok(summary) => state.metrics.set_inbox(&summary, state.clock.now_ms()),
                    Err(e) => tracing::warn!(
                        error = %e.chain(),
                        "cannot read the inbox: its gauges keep their last values"
                    ),
                }
                match listed {
                    Ok(listed) => {
                        for name in &sources {
                            let running = listed
                                .iter()
                                .filter(|j| j.source == *name && j.state == JobState::Running)
                                .count();
                            state.metrics.set_jobs_running(name, running);
                        }
                    }
                    Err(e) => tracing::warn!(
                        error = %e.chain(),
                        "cannot read the jobs: their gauge keeps its last values"
                    ),
                }
            }
            Err(_) => tracing::warn!(
                "the inbox did not answer in time: its gauges keep their last values"
            ),
        }
    }
    if let Some(space) = state.gateway.inbox.disk_space() {
        state.metrics.set_disk_space(space);
    }
    if let Some(keys) = state.gateway.inbox.keys_in_memory() {
        state.metrics.set_keys_in_memory(keys);
    }
    if crate::telemetry::traces::on() {
        state
            .metrics
            .set_trace_spans(crate::telemetry::traces::counts());
    }
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(state.metrics.render())
}
