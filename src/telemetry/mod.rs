//! What dedupd tells its operator: logs (level from `RUST_LOG` or the
//! settings, text or JSON lines), Prometheus metrics, one record per
//! request.

pub mod metrics;
mod requests;

pub use requests::{RouteName, observe_requests};
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
