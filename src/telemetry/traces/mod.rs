//! OpenTelemetry traces (`[telemetry.traces]`): one trace per webhook,
//! from its ingest to each delivery attempt, exported over OTLP/HTTP.
//!
//! Spans are recorded as plain values by the task they describe
//! ([`spans`], [`recorded`]), with the OpenTelemetry SDK's ids, sampler
//! and exporter. With export off (the default) [`on`] is
//! false and no span is built: every helper runs its future as it is, or
//! answers nothing, at once.
//!
//! The ingest span's W3C context is stored with the event, as the stored
//! header [`STORED_CONTEXT`] (reserved: `forward_headers` may not name it,
//! so no provider's header meets it). Each delivery attempt, whenever and
//! wherever it runs (after a restart, on another instance of a shared
//! inbox, from a bulk replay), is a child of it, and the forward carries
//! the attempt's `traceparent` instead. A valid header name on purpose: a
//! build from before traces forwards every stored header, and one it
//! cannot send would fail the event's every attempt after a downgrade or
//! on an older instance of a fleet.
//!
//! A `traceparent` on an ingest request is linked, not adopted as parent:
//! anyone who can reach the ingest port can send one, and a parent chosen
//! by the sender would put dedupd's spans into a stranger's trace (or
//! many webhooks into one), and make the sender decide the sampling.
//! A link keeps the upstream trace findable without trusting it.

mod log_lines;
mod queue;
mod recorded;
mod spans;

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

pub use log_lines::WithTraceIds;
use opentelemetry::KeyValue;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::resource::TelemetryResourceDetector;
use opentelemetry_sdk::trace::{Sampler, SpanExporter as _};
pub use queue::{SpanCounts, counts};
pub use spans::{
    EventOf, Traceparent, answered, api, attempt, event_trace_id, failed, ingest, link_upstream,
    mark, note_fence, note_key, outcome, propagation, set, stored_context,
};

use crate::config::telemetry::TraceExport;

/// The stored header that carries an event's trace context (its ingest
/// span's `traceparent`). Never forwarded (but by builds from before
/// traces, harmlessly), never shown as a header.
pub const STORED_CONTEXT: &str = "dedupd-trace-context";

static ON: AtomicBool = AtomicBool::new(false);
/// The export thread, stopped at the process's end.
static EXPORT: OnceLock<queue::QueueProcessor> = OnceLock::new();
/// The sampler of every trace's root span (an attempt follows its stored
/// parent's decision instead).
static SAMPLER: OnceLock<Sampler> = OnceLock::new();
/// Where an ended span goes.
static QUEUE: OnceLock<queue::Handle> = OnceLock::new();
/// The instrumentation scope's name.
const SCOPE: &str = "dedupd";

/// Whether spans are built and exported.
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// The roots' sampler, while spans are built.
fn sampler() -> Option<&'static Sampler> {
    SAMPLER.get().filter(|_| on())
}

/// Queues an ended span for export (moved out of its box, which its task
/// frees on its own thread, where the next span reuses it).
fn finish(span: recorded::Recorded) {
    if let Some(queue) = QUEUE.get() {
        queue.push(span);
    }
}

/// Exports dedupd's spans to `export`'s collector from now: its queue and
/// thread started, spans built. Fails when the exporter cannot be set up
/// (an `OTEL_EXPORTER_OTLP_*` variable that is not a URL), or was already.
/// The export thread takes the calling thread's scheduling policy.
pub fn install(export: &TraceExport) -> Result<(), String> {
    // A redirect is not followed: it would carry OTEL_EXPORTER_OTLP_HEADERS
    // (an API key) to another host, or turn the POST into a GET. No user
    // agent of dedupd's: the exporter names itself in each request
    // (`OTel-OTLP-Exporter-Rust/…`, as the OTLP specification asks), over
    // the client's.
    let client = crate::http_client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| format!("cannot build the trace exporter's HTTP client: {e}"))?;
    // The endpoint as the settings and variables resolved it, not as the
    // exporter would read the variables: the URL checked is the one used.
    let builder = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_http_client(client)
        .with_endpoint(export.endpoint.clone());
    // The exporter's error quotes the endpoint, which may hold credentials.
    let mut exporter = builder.build().map_err(|_| {
        "cannot set up trace export: the collector's endpoint (telemetry.traces.otlp_endpoint, \
         OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT) is not a usable \
         http:// or https:// URL"
            .to_owned()
    })?;
    // The SDK's attributes, then `OTEL_RESOURCE_ATTRIBUTES` as the
    // settings read it (decoded: the SDK's detector does not), then
    // dedupd's own over both.
    let resource = Resource::builder_empty()
        .with_detector(Box::new(TelemetryResourceDetector))
        .with_attributes(
            export
                .resource
                .iter()
                .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
        )
        .with_service_name(export.service_name.clone())
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        // Which instance of a fleet sent a span.
        .with_attribute(KeyValue::new("process.pid", i64::from(std::process::id())))
        .build();
    exporter.set_resource(&resource);
    let processor = queue::QueueProcessor::start(exporter, export.queue)
        .map_err(|e| format!("cannot start the trace exporter's thread: {e}"))?;
    let queue = processor.handle();
    if EXPORT.set(processor).is_err() {
        return Err("trace export was set up twice".into());
    }
    let _ = SAMPLER.set(Sampler::TraceIdRatioBased(export.sample_ratio));
    let _ = QUEUE.set(queue);
    ON.store(true, Ordering::Relaxed);
    Ok(())
}

/// Exports what is queued and stops the exporter (at the process's end).
pub fn shutdown() {
    // No span is built from now; those that end still go to the queue.
    ON.store(false, Ordering::Relaxed);
    if let Some(export) = EXPORT.get() {
        const LAST: std::time::Duration = std::time::Duration::from_secs(5);
        tracing::debug!("sending the last trace spans (waiting at most 5 s)");
        if let Err(unsent) = export.shutdown(LAST) {
            tracing::warn!(
                error = %unsent.error,
                dropped = unsent.spans,
                "the last trace spans were not all exported within 5 s of the stop \
                 (the collector did not take them): they are dropped, and counted in \
                 dedupd_trace_spans_dropped_total{{reason=\"export_failed\"}}"
            );
        }
    }
}

/// The `traceparent` stored with an event, if any.
pub fn stored(headers: &[(String, String)]) -> Option<&str> {
    headers
        .iter()
        .find(|(name, _)| name == STORED_CONTEXT)
        .map(|(_, v)| v.as_str())
}

/// Whether a stored header is dedupd's own (never forwarded or shown).
pub fn is_internal(name: &str) -> bool {
    name == STORED_CONTEXT
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_context_is_found_and_read_but_never_taken_for_a_header() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let with = |tp: &str| {
            vec![
                ("webhook-id".to_owned(), "x".to_owned()),
                (STORED_CONTEXT.to_owned(), tp.to_owned()),
            ]
        };
        let event = EventOf {
            source: "sume",
            event_id: "evt_1",
            stream: None,
            received_at_ms: 1,
        };
        assert_eq!(stored(&with(tp)), Some(tp));
        assert_eq!(
            event_trace_id(&with(tp), event).as_deref(),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        assert!(is_internal(STORED_CONTEXT));
        assert!(!is_internal("traceparent"));
        // A name an older build can forward, should it find one stored.
        assert!(reqwest::header::HeaderName::from_bytes(STORED_CONTEXT.as_bytes()).is_ok());
        // Unsampled: in no backend, so never shown.
        let unsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
        assert_eq!(event_trace_id(&with(unsampled), event), None);
        // Not a context: the event's trace is the one derived from it,
        // named only while traces are on (no unit test turns them on).
        for bad in [
            "",
            "00",
            "00-xyz-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        ] {
            assert_eq!(event_trace_id(&with(bad), event), None, "{bad:?}");
        }
        assert_eq!(event_trace_id(&[], event), None);
    }
}
