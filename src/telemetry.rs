//! Tracing setup: level from `RUST_LOG` or the settings, text or JSON lines.

use std::time::Instant;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use tracing_subscriber::EnvFilter;

use crate::config::{LogFormat, LogSettings};

/// Installs the global subscriber. Call once, before anything logs.
pub fn init(log: &LogSettings) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&log.level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // A second init (tests) keeps the first subscriber.
    let _ = match log.format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// Logs one event per request once it is answered: `info` with method,
/// path, status and duration, `error` for 5xx. Client refusals such as
/// `409 busy` are ordinary outcomes of a dedupe service, not warnings.
///
/// Nothing is formatted unless the event is enabled: a request path costs
/// a clock read and a status check (a span-per-request logger with a random
/// request id cost several percent of the claims path's CPU).
pub async fn log_requests(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let start = Instant::now();
    let info = tracing::enabled!(tracing::Level::INFO);
    let (method, path) = if info {
        (req.method().clone(), req.path().to_owned())
    } else {
        (actix_web::http::Method::GET, String::new())
    };
    let res = next.call(req).await;
    let status = match &res {
        Ok(r) => r.status(),
        Err(e) => e.as_response_error().status_code(),
    };
    let ms = start.elapsed().as_secs_f64() * 1e3;
    if status.is_server_error() {
        let (method, path) = match &res {
            Ok(r) => (
                r.request().method().to_string(),
                r.request().path().to_owned(),
            ),
            Err(_) => (method.to_string(), path),
        };
        tracing::error!(%method, %path, status = status.as_u16(), ms, "request failed");
    } else if info {
        tracing::info!(%method, %path, status = status.as_u16(), ms, "request done");
    }
    res
}
