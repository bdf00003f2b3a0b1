//! Tracing setup: level from `RUST_LOG` or the settings, text or JSON lines.

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use tracing::Span;
use tracing_actix_web::{DefaultRootSpanBuilder, RootSpanBuilder};
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

/// One span per request (tracing-actix-web's fields), closed by one event
/// with the status: `info` for answers, `error` for 5xx. Client refusals such
/// as `409 busy` are ordinary outcomes of a dedupe service, not warnings.
#[derive(Debug, Clone, Copy)]
pub struct RequestSpans;

impl RootSpanBuilder for RequestSpans {
    fn on_request_start(request: &ServiceRequest) -> Span {
        tracing_actix_web::root_span!(request)
    }

    fn on_request_end<B: MessageBody>(
        span: Span,
        outcome: &Result<ServiceResponse<B>, actix_web::Error>,
    ) {
        DefaultRootSpanBuilder::on_request_end(span.clone(), outcome);
        let status = match outcome {
            Ok(res) => res.status(),
            Err(e) => e.as_response_error().status_code(),
        };
        let _entered = span.enter();
        if status.is_server_error() {
            tracing::error!(status = status.as_u16(), "request failed");
        } else {
            tracing::info!(status = status.as_u16(), "request done");
        }
    }
}
