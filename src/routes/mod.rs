//! HTTP resources, one module each. Handlers parse input into domain types
//! first and only then touch the store.

pub(crate) mod body;
pub mod claims;
pub mod health;
pub mod ingest;
pub mod metrics;
pub mod sources;
pub mod streams;

use std::sync::Arc;

use actix_web::{HttpRequest, web};

use crate::clock::SharedClock;
use crate::domain::{Invalid, TtlBounds};
use crate::error::ApiError;
use crate::gateway::Gateway;
use crate::gateway::delivery::Dispatcher;
use crate::store::Store;

/// What every handler shares.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The store.
    pub store: Arc<dyn Store>,
    /// Time.
    pub clock: SharedClock,
    /// TTL defaults and ceiling.
    pub ttl: TtlBounds,
    /// Retention of applied events and stream heads, milliseconds.
    pub retention_ms: u64,
    /// Largest request body, bytes.
    pub max_body_bytes: usize,
    /// The webhook gateway (sources, inbox).
    pub gateway: Arc<Gateway>,
    /// The delivery dispatcher, for each source's delivery state.
    pub dispatcher: Arc<Dispatcher>,
    /// How long ingest waits for a request body.
    pub body_timeout: std::time::Duration,
    /// Counters and histograms behind `GET /metrics`.
    pub metrics: Arc<crate::telemetry::metrics::Metrics>,
}

/// Registers the `/v1` resources on `cfg` (the caller adds auth).
pub fn configure_v1(cfg: &mut web::ServiceConfig) {
    claims::configure(cfg);
    streams::configure(cfg);
    sources::configure(cfg);
}

/// Segment `index` of the request path (`/v1/claims/{key}` has the key at
/// 3), percent-decoded strictly: a malformed escape or bytes that are not
/// UTF-8 are refused, never replaced, so two different raw keys can never
/// decode to the same key.
pub fn path_segment(
    req: &HttpRequest,
    index: usize,
    field: &'static str,
) -> Result<String, ApiError> {
    let raw = req.uri().path().split('/').nth(index).unwrap_or_default();
    let bytes = raw.as_bytes();
    for (i, b) in bytes.iter().enumerate() {
        if *b == b'%'
            && !(bytes.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                && bytes.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
        {
            return Err(ApiError::Invalid(Invalid::new(
                "invalid_key",
                field,
                "malformed percent-encoding: '%' must be followed by two hex digits",
            )));
        }
    }
    percent_encoding::percent_decode_str(raw)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| {
            ApiError::Invalid(Invalid::new(
                "invalid_key",
                field,
                "must be UTF-8 once percent-decoded",
            ))
        })
}

/// The answer for a known path with a method it does not take.
pub fn method_not_allowed(allowed: &'static str) -> actix_web::Route {
    web::route().to(move |req: HttpRequest| async move {
        Err::<actix_web::HttpResponse, _>(ApiError::MethodNotAllowed {
            method: req.method().to_string(),
            allowed,
        })
    })
}

/// The answer for a path that does not exist.
pub async fn not_found(req: HttpRequest) -> Result<actix_web::HttpResponse, ApiError> {
    Err(ApiError::NotFound {
        code: "not_found",
        detail: format!("no resource at {}", req.path()),
    })
}
