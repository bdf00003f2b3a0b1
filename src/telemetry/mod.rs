//! What dedupd tells its operator: logs (level from `RUST_LOG` or the
//! settings, text or JSON lines), Prometheus metrics, one record per
//! request, and OpenTelemetry traces when a collector is set (`traces`).
//!
//! The level can change while serving ([`set_level`], on a reload); the
//! format is chosen once, at the start.

pub mod metrics;
mod requests;
pub mod traces;

use std::sync::OnceLock;

pub use requests::{RequestRecord, RouteName, WorkerHistograms};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry, fmt, reload};

use crate::config::{LogFormat, LogSettings};

/// The filter of the subscriber [`init`] installed, to swap on a reload;
/// unset when `RUST_LOG` chose it (it overrides the settings) or when
/// another subscriber was installed first (tests).
static FILTER: OnceLock<reload::Handle<EnvFilter, Registry>> = OnceLock::new();

/// Installs the global subscriber: log lines by the log level. Call once,
/// before anything logs. Traces are started apart
/// ([`traces::install`]), once the process's scheduling is set.
pub fn init(log: &LogSettings) {
    let (filter, from_env) = match EnvFilter::try_from_default_env() {
        Ok(f) => (f, true),
        Err(_) => (
            EnvFilter::try_new(&log.level).unwrap_or_else(|_| EnvFilter::new("info")),
            false,
        ),
    };
    let (filter, handle) = reload::Layer::new(filter);
    let lines = fmt::layer().with_writer(std::io::stderr);
    // A line written inside a sampled span carries its trace's ids.
    let lines = match log.format {
        LogFormat::Text => lines.map_event_format(traces::WithTraceIds::text).boxed(),
        LogFormat::Json => lines
            .json()
            .flatten_event(true)
            .map_event_format(traces::WithTraceIds::json)
            .boxed(),
    };
    // A second init (tests) keeps the first subscriber.
    let installed = tracing_subscriber::registry()
        .with(lines.with_filter(filter))
        .try_init()
        .is_ok();
    if installed && !from_env {
        let _ = FILTER.set(handle);
    }
}

/// What [`set_level`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// The new level is in force.
    Set,
    /// The filter stays: `RUST_LOG` chose it at the start (it overrides
    /// the settings), or another subscriber than [`init`]'s logs.
    Kept,
}

/// Puts `level` (a tracing filter, already validated as `log.level`) in
/// force for every later event, unless `RUST_LOG` chose the filter. Lines
/// of libraries that log through the `log` crate follow too.
pub fn set_level(level: &str) -> Result<Level, String> {
    let Some(handle) = FILTER.get() else {
        return Ok(Level::Kept);
    };
    let filter = EnvFilter::try_new(level).map_err(|e| e.to_string())?;
    handle.reload(filter).map_err(|e| e.to_string())?;
    // The `log` crate's own gate was set from the level at the start
    // (`try_init`); it must let through what the new filter may want.
    let max = tracing_subscriber::filter::LevelFilter::current();
    log::set_max_level(match max {
        l if l == tracing_subscriber::filter::LevelFilter::OFF => log::LevelFilter::Off,
        l if l == tracing_subscriber::filter::LevelFilter::ERROR => log::LevelFilter::Error,
        l if l == tracing_subscriber::filter::LevelFilter::WARN => log::LevelFilter::Warn,
        l if l == tracing_subscriber::filter::LevelFilter::INFO => log::LevelFilter::Info,
        l if l == tracing_subscriber::filter::LevelFilter::DEBUG => log::LevelFilter::Debug,
        _ => log::LevelFilter::Trace,
    });
    Ok(Level::Set)
}
