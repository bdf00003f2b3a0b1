//! What dedupd tells its operator: logs (level from `RUST_LOG` or the
//! settings, text or JSON lines), Prometheus metrics, one record per
//! request, and OpenTelemetry traces when a collector is set (`traces`).
//!
//! The level can change while serving ([`set_level`], on a reload); the
//! format is chosen once, at the start.

mod flood;
mod log_fields;
pub mod metrics;
mod requests;
pub mod traces;

use std::sync::OnceLock;

pub use requests::{RequestRecord, RouteName, WorkerHistograms};
use tracing::Subscriber;
use tracing_subscriber::filter::FilterExt as _;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
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
    let from_env = std::env::var(EnvFilter::DEFAULT_ENV)
        .ok()
        .filter(|level| {
            // A word alone that is not a level names a target: `warning`
            // would turn every line off. Said, and the settings' level used.
            let Some(word) = crate::config::bare_target(level) else {
                return true;
            };
            eprintln!(
                "dedupd: RUST_LOG={level:?} is ignored: {word:?} is not a level (trace, debug, \
                 info, warn, error, off), and alone a word names a target, so nothing else \
                 would be logged; log.level ({:?}) is used",
                log.level
            );
            false
        })
        .and_then(|level| filter(&level).ok().map(|f| (f, level)));
    let (filter, from_env) = match from_env {
        Some((f, level)) => {
            flood::level_set(&level);
            (f, true)
        }
        None => {
            flood::level_set(&log.level);
            (
                filter(&log.level).unwrap_or_else(|_| EnvFilter::new("info")),
                false,
            )
        }
    };
    let (filter, handle) = reload::Layer::new(filter);
    // A second init (tests) keeps the first subscriber.
    let installed = tracing_subscriber::registry()
        .with(
            lines(log.format, std::io::stderr, colours()).with_filter(filter.and(flood::filter())),
        )
        .try_init()
        .is_ok();
    if installed && !from_env {
        let _ = FILTER.set(handle);
    }
}

/// Libraries whose lines say again, louder, what dedupd's own line says:
/// off unless a level names them. rustls's certificate verifier logs an
/// ERROR line at each TLS connection whose certificate fails (each
/// delivery attempt to such a destination, each export to such a
/// collector), beside dedupd's own line for it, which names the same
/// reason.
const QUIET: &[&str] = &["rustls_platform_verifier"];

/// The log filter of `level` (a tracing filter), with [`QUIET`]'s
/// libraries off unless it names them.
fn filter(level: &str) -> Result<EnvFilter, tracing_subscriber::filter::ParseError> {
    let mut filter = EnvFilter::try_new(level)?;
    for target in QUIET.iter().filter(|target| !level.contains(*target)) {
        filter = filter.add_directive(format!("{target}=off").parse()?);
    }
    Ok(filter)
}

/// Whether text lines are coloured: only on a terminal (not in a file or
/// the journal), unless `NO_COLOR` is set.
fn colours() -> bool {
    use std::io::IsTerminal as _;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// The log lines, in `format`, to `writer`, coloured or not (`ansi`). A
/// line written inside a sampled span carries its trace's ids; a text
/// line's values are quoted where they could be misread ([`log_fields`]).
fn lines<S, W>(format: LogFormat, writer: W, ansi: bool) -> Box<dyn Layer<S> + Send + Sync>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let lines = fmt::layer().with_writer(writer).with_ansi(ansi);
    match format {
        LogFormat::Text => lines
            .fmt_fields(log_fields::TextFields)
            .map_event_format(traces::WithTraceIds::text)
            .boxed(),
        LogFormat::Json => lines
            .json()
            .flatten_event(true)
            .map_event_format(traces::WithTraceIds::json)
            .boxed(),
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
    let filter = filter(level).map_err(|e| e.to_string())?;
    handle.reload(filter).map_err(|e| e.to_string())?;
    flood::level_set(level);
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

/// A log writer for tests: the lines written, kept in memory.
#[cfg(test)]
#[derive(Clone, Default)]
pub(crate) struct TestLines(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

#[cfg(test)]
impl std::io::Write for TestLines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
impl<'a> MakeWriter<'a> for TestLines {
    type Writer = Self;
    fn make_writer(&'a self) -> Self {
        self.clone()
    }
}

#[cfg(test)]
impl TestLines {
    /// The lines written so far, taken (the next call has only newer ones).
    pub(crate) fn take(&self) -> Vec<String> {
        let bytes = std::mem::take(&mut *self.0.lock().unwrap());
        String::from_utf8(bytes)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt;

    use super::{TestLines, filter};

    /// The lines written under the filter of `level`: an ERROR from rustls's
    /// verifier (its target as the `log` crate names it) and one of ours.
    fn written(level: &str) -> String {
        let lines = TestLines::default();
        let logging = tracing_subscriber::registry().with(
            tracing_subscriber::fmt::layer()
                .with_writer(lines.clone())
                .with_filter(filter(level).expect("a valid level")),
        );
        tracing::subscriber::with_default(logging, || {
            tracing::error!(
                target: "rustls_platform_verifier::verification::others",
                "failed to verify TLS certificate: invalid peer certificate: UnknownIssuer"
            );
            tracing::error!("delivery attempt failed: invalid peer certificate: UnknownIssuer");
            tracing::info!("an info line");
        });
        lines.take().join("\n")
    }

    #[test]
    fn the_tls_verifiers_own_error_line_is_off_unless_the_level_names_it() {
        for level in ["info", "debug", "warn,dedupd=trace"] {
            let text = written(level);
            assert!(text.contains("delivery attempt failed"), "{level}: {text}");
            assert!(!text.contains("failed to verify"), "{level}: {text}");
        }
        assert!(written("info").contains("an info line"));
        let named = written("info,rustls_platform_verifier=error");
        assert!(named.contains("failed to verify"), "{named}");
        assert!(named.contains("delivery attempt failed"), "{named}");
    }
}
