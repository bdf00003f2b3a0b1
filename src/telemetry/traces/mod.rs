//! OpenTelemetry traces (`[telemetry.traces]`): one trace per webhook,
//! from its ingest to each delivery attempt, exported over OTLP/HTTP.
//!
//! Spans are `tracing` spans of target [`TARGET`], turned into OpenTelemetry
//! spans by `tracing-opentelemetry`; only that target is exported. With
//! export off (the default) [`on`] is false and no span is built: every
//! helper here answers `Span::none()` or nothing at once.
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

mod queue;

use std::collections::HashMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::KeyValue;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider, SpanExporter as _};
pub use queue::{SpanCounts, counts};
use tracing::Span;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::registry::LookupSpan;

use crate::config::telemetry::TraceExport;

/// The target of dedupd's traced spans: the only ones exported.
pub const TARGET: &str = "dedupd::trace";

/// The stored header that carries an event's trace context (its ingest
/// span's `traceparent`). Never forwarded (but by builds from before
/// traces, harmlessly), never shown as a header.
pub const STORED_CONTEXT: &str = "dedupd-trace-context";

static ON: AtomicBool = AtomicBool::new(false);
static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();
/// The tracer the claims and ordering spans are built with directly.
static TRACER: OnceLock<opentelemetry_sdk::trace::SdkTracer> = OnceLock::new();

/// Whether spans are built and exported.
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// The layer that exports dedupd's spans to `export`'s collector, with
/// its queue and thread started. Spans are built once [`enable`] is
/// called, when the layer is in the global subscriber.
pub fn layer<S>(export: &TraceExport) -> Result<impl Layer<S> + Send + Sync + use<S>, String>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
{
    // A redirect is not followed: it would carry OTEL_EXPORTER_OTLP_HEADERS
    // (an API key) to another host, or turn the POST into a GET.
    let client = crate::http_client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("dedupd/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| format!("cannot build the trace exporter's HTTP client: {e}"))?;
    let mut builder = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_http_client(client);
    if let Some(endpoint) = &export.endpoint {
        builder = builder.with_endpoint(endpoint.clone());
    }
    // The exporter's error quotes the endpoint, which may hold credentials.
    let mut exporter = builder.build().map_err(|_| {
        "cannot set up trace export: the collector's endpoint (telemetry.traces.otlp_endpoint, \
         OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT) is not a usable \
         http:// or https:// URL"
            .to_owned()
    })?;
    let resource = Resource::builder()
        .with_service_name(export.service_name.clone())
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        // Which instance of a fleet sent a span.
        .with_attribute(KeyValue::new("process.pid", i64::from(std::process::id())))
        .build();
    exporter.set_resource(&resource);
    let processor = queue::QueueProcessor::start(exporter, export.queue)
        .map_err(|e| format!("cannot start the trace exporter's thread: {e}"))?;
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            export.sample_ratio,
        ))))
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("dedupd");
    let _ = TRACER.set(tracer.clone());
    if PROVIDER.set(provider).is_err() {
        return Err("trace export was set up twice".into());
    }
    Ok(tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_location(false)
        .with_threads(false)
        .with_tracked_inactivity(false)
        // Parents come from the spans' own tree: nothing here reads the
        // OpenTelemetry context of the thread, so entering a span (each
        // poll of an instrumented future) need not set it.
        .with_context_activation(false)
        .with_filter(Targets::new().with_target(TARGET, tracing::Level::INFO)))
}

// Integers are recorded as i64: tracing-opentelemetry turns a u64 into
// text.

/// Spans are built from now: the layer [`layer`] made is installed.
pub fn enable() {
    ON.store(true, Ordering::Relaxed);
}

/// Exports what is queued and stops the exporter (at the process's end).
pub fn shutdown() {
    if let Some(provider) = PROVIDER.get() {
        let _ = provider.shutdown_with_timeout(std::time::Duration::from_secs(5));
    }
}

/// A request's headers as the propagator reads them.
struct Headers<'h, 'a>(&'h dyn Fn(&str) -> Option<&'a str>);

impl Extractor for Headers<'_, '_> {
    fn get(&self, key: &str) -> Option<&str> {
        (self.0)(key)
    }

    fn keys(&self) -> Vec<&str> {
        vec!["traceparent", "tracestate"]
    }
}

/// Records a built span's ids as its `trace_id` and `span_id` fields, so
/// every log line inside it carries them.
fn record_ids(span: &Span) {
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    if sc.is_valid() && sc.is_sampled() {
        span.record("trace_id", sc.trace_id().to_string());
        span.record("span_id", sc.span_id().to_string());
    }
}

/// The span of one ingest request. Fill in `dedupd.source`,
/// `dedupd.scheme`, `dedupd.event_id` and `dedupd.outcome` (and
/// `dedupd.code` for a refusal) as they are known; link the request's own
/// trace with [`link_upstream`] once its signature is verified.
pub fn ingest_span() -> Span {
    if !on() {
        return Span::none();
    }
    let span = tracing::info_span!(
        target: TARGET,
        "ingest",
        otel.kind = "server",
        otel.status_code = Empty,
        dedupd.source = Empty,
        dedupd.scheme = Empty,
        dedupd.event_id = Empty,
        dedupd.outcome = Empty,
        dedupd.code = Empty,
        http.response.status_code = Empty,
        trace_id = Empty,
        span_id = Empty,
    );
    record_ids(&span);
    span
}

/// Links `span` to the trace of the `traceparent` its request came with
/// (`header`), if any: only its ids and flags, never its `tracestate`
/// (the sender's text, unverified). Call it for a verified request only,
/// so strangers cannot fill exports with links of their choosing.
pub fn link_upstream<'a>(span: &Span, header: &dyn Fn(&str) -> Option<&'a str>) {
    if span.is_none() {
        return;
    }
    let only_parent = |name: &str| (name == "traceparent").then(|| header(name)).flatten();
    let upstream = TraceContextPropagator::new().extract(&Headers(&only_parent));
    let upstream = upstream.span().span_context().clone();
    if upstream.is_valid() {
        span.add_link(upstream);
    }
}

/// Marks a step of an ingest on its span, as a span event at this time:
/// `verified` (the signature, then the event's id, stream and
/// `created_at`) or `stored` (the durable write, its commit's sync
/// included: the answer waits for it). Events, not child spans: a span
/// costs several times more, on the path every webhook takes.
pub fn mark(span: &Span, name: &'static str) {
    if !span.is_none() {
        span.add_event(name, Vec::new());
    }
}

/// The trace context to store with an event ingested under `span`, as a
/// stored header; nothing when traces are off.
pub fn stored_context(span: &Span) -> Option<(String, String)> {
    if !on() {
        return None;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&span.context(), &mut carrier);
    carrier
        .remove("traceparent")
        .map(|tp| (STORED_CONTEXT.to_owned(), tp))
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

/// The trace id in a stored `traceparent` (`00-TRACE-SPAN-FLAGS`), when
/// the trace was sampled (exported): an unsampled one is in no backend.
pub fn trace_id(traceparent: &str) -> Option<&str> {
    let mut parts = traceparent.split('-');
    let (_version, id, _span, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let sampled = u8::from_str_radix(flags, 16).is_ok_and(|f| f & 1 == 1);
    (sampled
        && id.len() == 32
        && id.bytes().all(|b| b.is_ascii_hexdigit())
        && id.bytes().any(|b| b != b'0'))
    .then_some(id)
}

/// The span of one delivery attempt of an event with stored `headers`: a
/// child of its ingest span. Fill in the status, latency and outcome.
pub fn attempt_span(
    headers: &[(String, String)],
    source: &str,
    destination: &str,
    event_id: &str,
    attempt: u32,
) -> Span {
    if !on() {
        return Span::none();
    }
    let span = tracing::info_span!(
        target: TARGET,
        "deliver",
        otel.kind = "client",
        otel.status_code = Empty,
        dedupd.source = source,
        dedupd.destination = destination,
        dedupd.event_id = event_id,
        dedupd.attempt = i64::from(attempt),
        http.response.status_code = Empty,
        dedupd.latency_ms = Empty,
        dedupd.outcome = Empty,
        dedupd.retry_at_ms = Empty,
        trace_id = Empty,
        span_id = Empty,
    );
    if let Some(tp) = stored(headers) {
        let get = |name: &str| (name == "traceparent").then_some(tp);
        let parent = TraceContextPropagator::new().extract(&Headers(&get));
        if parent.span().span_context().is_valid() {
            let _ = span.set_parent(parent);
        }
    }
    record_ids(&span);
    span
}

/// What a claims or ordering request noted for its span, in the
/// request's extensions (only while traces are on).
#[derive(Debug, Default, Clone)]
struct ApiNotes {
    key_hash: Option<String>,
    outcome: Option<&'static str>,
    fence: Option<u64>,
}

fn note(req: &actix_web::HttpRequest, f: impl FnOnce(&mut ApiNotes)) {
    use actix_web::HttpMessage;
    if !on() {
        return;
    }
    let mut ext = req.extensions_mut();
    match ext.get_mut::<ApiNotes>() {
        Some(notes) => f(notes),
        None => {
            let mut notes = ApiNotes::default();
            f(&mut notes);
            ext.insert(notes);
        }
    }
}

/// Notes the request's key (a claim's key, a stream) for its span, as a
/// hash: 16 hex digits of an HMAC-SHA256 under a key this process drew at
/// random. Keys are never recorded raw (they may hold an order number or
/// an e-mail address), and the hash cannot be reversed by trying likely
/// keys: the same key gives the same hash for as long as the process
/// lives, so one key's requests can be followed, and another process
/// gives another.
pub fn note_key(req: &actix_web::HttpRequest, key: &str) {
    note(req, |n| {
        use hmac::{Hmac, KeyInit, Mac};
        static SALT: OnceLock<[u8; 32]> = OnceLock::new();
        let salt = SALT.get_or_init(rand::random);
        let mut mac =
            <Hmac<sha2::Sha256> as KeyInit>::new_from_slice(salt).expect("HMAC takes any key");
        mac.update(key.as_bytes());
        n.key_hash = Some(hex::encode(&mac.finalize().into_bytes()[..8]));
    });
}

/// Notes the request's outcome (`claimed`, `busy`, `applied`, …).
pub fn note_outcome(req: &actix_web::HttpRequest, outcome: &'static str) {
    note(req, |n| n.outcome = Some(outcome));
}

/// Notes the fence a claim was given.
pub fn note_fence(req: &actix_web::HttpRequest, fence: u64) {
    note(req, |n| n.fence = Some(fence));
}

/// The span of one claims or ordering request (`claim`, `done`, `extend`,
/// `release`, `inspect`, `apply`, `head`), made once it was answered,
/// from `started`: its own trace, with what the request noted, its status,
/// and a refusal's code as its outcome unless it noted one. Built with the
/// OpenTelemetry API directly, not through `tracing`: nothing logs inside
/// these requests, and the claim path is where a span's cost shows.
pub fn api_span(
    name: &'static str,
    started: std::time::SystemTime,
    req: &actix_web::HttpRequest,
    status: u16,
    refusal: Option<&'static str>,
) {
    use actix_web::HttpMessage;
    use opentelemetry::trace::{Span as _, SpanKind, Status, Tracer as _};
    let Some(tracer) = TRACER.get().filter(|_| on()) else {
        return;
    };
    let notes = req
        .extensions_mut()
        .remove::<ApiNotes>()
        .unwrap_or_default();
    let mut attributes = Vec::with_capacity(4);
    attributes.push(KeyValue::new(
        "http.response.status_code",
        i64::from(status),
    ));
    if let Some(hash) = notes.key_hash {
        attributes.push(KeyValue::new("dedupd.key_hash", hash));
    }
    if let Some(outcome) = notes.outcome.or(refusal) {
        attributes.push(KeyValue::new("dedupd.outcome", outcome));
    }
    if let Some(fence) = notes.fence {
        attributes.push(KeyValue::new(
            "dedupd.fence",
            i64::try_from(fence).unwrap_or(i64::MAX),
        ));
    }
    let mut span = tracer
        .span_builder(name)
        .with_kind(SpanKind::Server)
        .with_start_time(started)
        .with_attributes(attributes)
        .start_with_context(tracer, &opentelemetry::Context::new());
    if status >= 500 {
        span.set_status(Status::error("server error"));
    }
    span.end();
}

/// The W3C headers that continue `span`'s trace in a request it sends:
/// `traceparent`, and `tracestate` when there is one.
pub fn propagation(span: &Span) -> Vec<(&'static str, String)> {
    if !on() || span.is_none() {
        return Vec::new();
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&span.context(), &mut carrier);
    ["traceparent", "tracestate"]
        .into_iter()
        .filter_map(|name| Some((name, carrier.remove(name).filter(|v| !v.is_empty())?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_traces_off_no_span_is_built_and_nothing_is_stored() {
        assert!(!on());
        assert!(ingest_span().is_none());
        assert!(attempt_span(&[], "sume", "default", "e1", 1).is_none());
        assert_eq!(stored_context(&Span::none()), None);
        assert!(propagation(&Span::none()).is_empty());
    }

    #[test]
    fn a_stored_context_is_found_and_read_but_never_taken_for_a_header() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let headers = vec![
            ("webhook-id".to_owned(), "x".to_owned()),
            (STORED_CONTEXT.to_owned(), tp.to_owned()),
        ];
        assert_eq!(stored(&headers), Some(tp));
        assert_eq!(trace_id(tp), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
        assert!(is_internal(STORED_CONTEXT));
        assert!(!is_internal("traceparent"));
        // A name an older build can forward, should it find one stored.
        assert!(reqwest::header::HeaderName::from_bytes(STORED_CONTEXT.as_bytes()).is_ok());
        // Unsampled: in no backend, so never shown.
        assert_eq!(
            trace_id("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"),
            None
        );
        for bad in [
            "",
            "00",
            "00-xyz-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        ] {
            assert_eq!(trace_id(bad), None, "{bad:?}");
        }
    }
}
