//! The spans: one per ingest request, per delivery attempt and per
//! claims or ordering request, each held by the task that serves it (a
//! task-local), so the code inside notes what it learns ([`set`],
//! [`outcome`], [`mark`]) without a handle passed down. The span ends, and
//! goes to the export queue, when its future is done or dropped. Ingest
//! and attempt spans are the OpenTelemetry SDK's own; a claims or ordering
//! request's is an [`ApiSpan`], made into the SDK's span data on the
//! export thread.
//!
//! Not `tracing` spans turned into OpenTelemetry ones by a layer: that
//! costs about twice as much per span (each field recorded, each poll's
//! enter and exit goes through the layer), on the paths every webhook and
//! claim takes. Log lines still join the traces without a `tracing` span
//! entered at every poll (which cost a delivery attempt 6–9 µs): the log
//! format asks the task for its span's ids ([`log_ids`]) when it writes a
//! line.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;

use futures_util::future::Either;

use opentelemetry::trace::{
    Span as _, SpanContext, SpanKind, Status, TraceContextExt, TraceFlags, TraceState, Tracer as _,
};
use opentelemetry::trace::{SpanId, TraceId};
use opentelemetry::{Context, KeyValue, Value};
use opentelemetry_sdk::trace::{SdkTracer, Span};
use tokio::task::futures::TaskLocalFuture;

use super::api_span::ApiSpan;
use super::{api_sampler, on, stored, tracer};

tokio::task_local! {
    /// The span of the request or attempt this task is serving.
    static CURRENT: RefCell<Current>;
}

struct Current {
    span: Held,
    /// Whether an outcome was noted (a refusal's code is the outcome
    /// otherwise).
    outcome: bool,
}

/// A task's span.
enum Held {
    /// An ingest's or an attempt's: the SDK's, which ends when dropped.
    Sdk(Span),
    /// A claims or ordering request's, sent to the queue when dropped.
    Api(ApiSpan),
    Ended,
}

impl Drop for Current {
    fn drop(&mut self) {
        if let Held::Api(mut span) = std::mem::replace(&mut self.span, Held::Ended) {
            span.end();
            super::finish(span);
        }
    }
}

impl Current {
    fn span_context(&self) -> SpanContext {
        match &self.span {
            Held::Sdk(span) => span.span_context().clone(),
            Held::Api(span) => span.span_context(),
            Held::Ended => SpanContext::empty_context(),
        }
    }

    fn set_attribute(&mut self, kv: KeyValue) {
        match &mut self.span {
            Held::Sdk(span) => span.set_attribute(kv),
            Held::Api(span) => span.set_attribute(kv),
            Held::Ended => {}
        }
    }

    fn set_outcome(&mut self, outcome: &'static str) {
        self.outcome = true;
        match &mut self.span {
            Held::Sdk(span) => span.set_attribute(KeyValue::new("dedupd.outcome", outcome)),
            Held::Api(span) => span.set_outcome(outcome),
            Held::Ended => {}
        }
    }

    fn set_error(&mut self, description: &'static str) {
        match &mut self.span {
            Held::Sdk(span) => span.set_status(Status::error(description)),
            Held::Api(span) => span.set_error(description),
            Held::Ended => {}
        }
    }

    fn add_event(&mut self, name: &'static str) {
        match &mut self.span {
            Held::Sdk(span) => span.add_event(name, Vec::new()),
            Held::Api(span) => span.add_event(name),
            Held::Ended => {}
        }
    }

    fn add_link(&mut self, sc: SpanContext) {
        match &mut self.span {
            Held::Sdk(span) => span.add_link(sc, Vec::new()),
            Held::Api(span) => span.add_link(sc),
            Held::Ended => {}
        }
    }
}

/// A future run inside its span.
type Inside<F> = TaskLocalFuture<RefCell<Current>, Pin<Box<F>>>;

/// `fut` inside `span`, which ends when `fut` is done (or dropped).
fn inside<F: Future>(span: Held, fut: F) -> Inside<F> {
    let current = RefCell::new(Current {
        span,
        outcome: false,
    });
    // Boxed: a request's or an attempt's future is hundreds of bytes or
    // more, and each wrapping would move it again.
    CURRENT.scope(current, Box::pin(fut))
}

/// The ids of the sampled span the calling task is in, for its log lines.
pub fn log_ids() -> Option<(TraceId, SpanId)> {
    CURRENT
        .try_with(|c| {
            // Not while the span is being noted on (a line logged from
            // inside the SDK): that line goes without ids.
            let c = c.try_borrow().ok()?;
            let sc = c.span_context();
            sc.is_sampled().then(|| (sc.trace_id(), sc.span_id()))
        })
        .ok()
        .flatten()
}

/// `f` on the task's span, if it has one.
fn with<R>(f: impl FnOnce(&mut Current) -> R) -> Option<R> {
    if !on() {
        return None;
    }
    CURRENT.try_with(|c| f(&mut c.borrow_mut())).ok()
}

fn tracer_on() -> Option<&'static SdkTracer> {
    tracer().filter(|_| on())
}

/// Room for an ingest's or an attempt's attributes, made at once (grown
/// from none, the vector would be copied on the way).
const ATTRIBUTES: usize = 8;

/// Runs one ingest request's `fut` in its `ingest` span, a trace's root.
/// Inside, note its source, scheme, event id and outcome ([`set`],
/// [`outcome`]); link the request's own trace with [`link_upstream`] once
/// its signature is verified.
pub fn ingest<F: Future>(fut: F) -> impl Future<Output = F::Output> + use<F> {
    let Some(tracer) = tracer_on() else {
        return Either::Left(fut);
    };
    let span = tracer
        .span_builder("ingest")
        .with_kind(SpanKind::Server)
        .with_attributes(Vec::with_capacity(ATTRIBUTES))
        .start_with_context(tracer, &Context::new());
    Either::Right(inside(Held::Sdk(span), fut))
}

/// Runs one delivery attempt's `fut` in its `deliver` span: a child of
/// the event's ingest span, whose context is stored in its `headers`.
/// Inside, note its status, latency and outcome.
pub fn attempt<F: Future>(
    headers: &[(String, String)],
    source: &str,
    destination: &str,
    event_id: &str,
    attempt: u32,
    fut: F,
) -> impl Future<Output = F::Output> + use<F> {
    let Some(tracer) = tracer_on() else {
        return Either::Left(fut);
    };
    let parent = stored(headers)
        .and_then(parse_traceparent)
        .map_or_else(Context::new, |sc| {
            Context::new().with_remote_span_context(sc)
        });
    let mut attributes = Vec::with_capacity(ATTRIBUTES);
    attributes.extend([
        KeyValue::new("dedupd.source", source.to_owned()),
        KeyValue::new("dedupd.destination", destination.to_owned()),
        KeyValue::new("dedupd.event_id", event_id.to_owned()),
        KeyValue::new("dedupd.attempt", i64::from(attempt)),
    ]);
    let span = tracer
        .span_builder("deliver")
        .with_kind(SpanKind::Client)
        .with_attributes(attributes)
        .start_with_context(tracer, &parent);
    Either::Right(inside(Held::Sdk(span), fut))
}

/// Runs one claims or ordering request's `fut` in a span `name` (`claim`,
/// `done`, `extend`, `release`, `inspect`, `apply`, `head`), its own
/// trace. Inside, note its key ([`note_key`]), outcome and fence, and its
/// answer ([`answered`]). One the sampler leaves out is not built.
pub fn api<F: Future>(name: &'static str, fut: F) -> impl Future<Output = F::Output> + use<F> {
    let Some(span) = api_sampler()
        .filter(|_| on())
        .and_then(|sampler| ApiSpan::start(name, sampler))
    else {
        return Either::Left(fut);
    };
    Either::Right(inside(Held::Api(span), fut))
}

/// Sets an attribute of the task's span.
pub fn set(key: &'static str, value: impl Into<Value>) {
    with(|c| c.set_attribute(KeyValue::new(key, value)));
}

/// Sets the span's `dedupd.outcome`.
pub fn outcome(outcome: &'static str) {
    with(|c| c.set_outcome(outcome));
}

/// Marks the span as failed (`description` says how).
pub fn failed(description: &'static str) {
    with(|c| c.set_error(description));
}

/// Marks a step of an ingest on its span, as a span event at this time:
/// `verified` (the signature, then the event's id, stream and
/// `created_at`) or `stored` (the durable write, its commit's sync
/// included: the answer waits for it). Events, not child spans: a span
/// costs several times more, on the path every webhook takes.
pub fn mark(name: &'static str) {
    with(|c| c.add_event(name));
}

/// Notes a request's answer on its span: a refusal's code as its outcome
/// unless it noted one, and a server error as the span's error. Not the
/// HTTP status: a claims or ordering request's outcome names it, and each
/// attribute costs on the claim path.
pub fn answered(status: u16, refusal: Option<&'static str>) {
    with(|c| {
        if let Some(code) = refusal.filter(|_| !c.outcome) {
            c.set_outcome(code);
        }
        if status >= 500 {
            c.set_error("server error");
        }
    });
}

/// Links the span to the trace of the `traceparent` its request came with
/// (`header`), if any: only its ids and flags, never its `tracestate`
/// (the sender's text, unverified). Call it for a verified request only,
/// so strangers cannot fill exports with links of their choosing.
pub fn link_upstream<'a>(header: &dyn Fn(&str) -> Option<&'a str>) {
    let Some(upstream) = with(|_| ()).and_then(|()| header("traceparent")) else {
        return;
    };
    if let Some(sc) = parse_traceparent(upstream) {
        with(|c| c.add_link(sc));
    }
}

/// The span's context as a W3C `traceparent`.
fn traceparent(sc: &SpanContext) -> String {
    format!(
        "00-{}-{}-{:02x}",
        sc.trace_id(),
        sc.span_id(),
        sc.trace_flags().to_u8()
    )
}

/// A W3C `traceparent`, strictly: version 00 (or a later one's first
/// four fields), every field lowercase hex of the standard's length, ids
/// that are not all zeros. Anything else
/// is no context at all (the attempt is a trace's root, the link is not
/// made).
fn parse_traceparent(text: &str) -> Option<SpanContext> {
    use opentelemetry::propagation::TextMapPropagator;
    // The propagator takes ids shorter than the standard's; a stored or
    // sent context of another length is not one dedupd or a tracer wrote.
    let lower_hex = |f: &str| f.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let fields = text.split('-').take(4);
    if fields.clone().map(str::len).ne([2, 32, 16, 2])
        || !fields.clone().all(lower_hex)
        || (text.starts_with("00") && text.len() != 55)
        || text.ends_with('-')
    {
        return None;
    }
    let get = |name: &str| (name == "traceparent").then_some(text);
    let cx = opentelemetry_sdk::propagation::TraceContextPropagator::new().extract(&Headers(&get));
    let sc = cx.span().span_context().clone();
    // Ids and the sampled flag only: nothing of the sender's state.
    sc.is_valid().then(|| {
        SpanContext::new(
            sc.trace_id(),
            sc.span_id(),
            sc.trace_flags() & TraceFlags::SAMPLED,
            true,
            TraceState::NONE,
        )
    })
}

/// A header lookup as the propagator reads it.
struct Headers<'h, 'a>(&'h dyn Fn(&str) -> Option<&'a str>);

impl opentelemetry::propagation::Extractor for Headers<'_, '_> {
    fn get(&self, key: &str) -> Option<&str> {
        (self.0)(key)
    }

    fn keys(&self) -> Vec<&str> {
        vec!["traceparent"]
    }
}

/// The trace context to store with an event ingested in the task's span
/// (its `traceparent`); nothing when traces are off.
pub fn stored_context() -> Option<(String, String)> {
    with(|c| {
        (
            super::STORED_CONTEXT.to_owned(),
            traceparent(&c.span_context()),
        )
    })
}

/// The W3C header that continues the task's span in a request it sends:
/// `traceparent` (an attempt's spans carry no `tracestate`: the stored
/// context keeps none).
pub fn propagation() -> Option<(&'static str, String)> {
    with(|c| ("traceparent", traceparent(&c.span_context())))
}

/// Notes the request's key (a claim's key, a stream) on its span, as a
/// hash: 16 hex digits of a SipHash-2-4 (a keyed pseudo-random function)
/// under a 128-bit key this process drew at random. Keys are never
/// recorded raw (they may hold an order number or an e-mail address), and
/// the hash cannot be reversed by trying likely keys without the process's
/// key: the same key gives the same hash for as long as the process lives,
/// so one key's requests can be followed, and another process gives
/// another.
pub fn note_key(key: &str) {
    use siphasher::sip::SipHasher24;
    use std::hash::Hasher as _;
    if !on() {
        return;
    }
    static KEYED: OnceLock<SipHasher24> = OnceLock::new();
    let mut hasher = *KEYED.get_or_init(|| SipHasher24::new_with_key(&rand::random()));
    hasher.write(key.as_bytes());
    let hash = hasher.finish();
    with(|c| match &mut c.span {
        // Its text is made on the export thread.
        Held::Api(span) => span.set_key_hash(hash),
        _ => c.set_attribute(KeyValue::new("dedupd.key_hash", format!("{hash:016x}"))),
    });
}

/// Notes the fence a claim was given.
pub fn note_fence(fence: u64) {
    with(|c| match &mut c.span {
        Held::Api(span) => span.set_fence(fence),
        _ => c.set_attribute(KeyValue::new(
            "dedupd.fence",
            i64::try_from(fence).unwrap_or(i64::MAX),
        )),
    });
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// Runs `fut` in a sampled claims span, as [`api`] does with traces
    /// on; answers the span's trace and span ids.
    pub async fn in_a_sampled_span(fut: impl Future<Output = ()>) -> (String, String) {
        let always = opentelemetry_sdk::trace::Sampler::AlwaysOn;
        let span = ApiSpan::start("claim", &always).expect("sampled");
        let sc = span.span_context();
        inside(Held::Api(span), fut).await;
        (sc.trace_id().to_string(), sc.span_id().to_string())
    }

    #[test]
    fn a_traceparent_is_read_strictly_and_keeps_nothing_but_ids_and_sampling() {
        let sc = parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03")
            .expect("a valid traceparent");
        assert_eq!(
            sc.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(sc.span_id().to_string(), "00f067aa0ba902b7");
        assert_eq!(
            sc.trace_flags(),
            TraceFlags::SAMPLED,
            "flags beyond sampled dropped"
        );
        assert!(sc.is_remote());
        assert_eq!(
            traceparent(&sc),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
        for bad in [
            "",
            "garbage",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "+0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-+1",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
        ] {
            assert!(parse_traceparent(bad).is_none(), "{bad:?}");
        }
    }

    #[tokio::test]
    async fn with_traces_off_nothing_is_built_and_the_futures_run_as_they_are() {
        assert!(!on());
        assert_eq!(ingest(async { 7 }).await, 7);
        assert_eq!(api("claim", async { 8 }).await, 8);
        assert_eq!(
            attempt(&[], "sume", "default", "e1", 1, async { 9 }).await,
            9
        );
        assert_eq!(stored_context(), None);
        assert_eq!(propagation(), None);
    }
}
