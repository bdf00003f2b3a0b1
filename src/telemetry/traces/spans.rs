//! The spans: one per ingest request, per delivery attempt and per
//! claims or ordering request, each held by the task that serves it (a
//! task-local), so the code inside notes what it learns ([`set`],
//! [`outcome`], [`mark`]) without a handle passed down. The span ends, and
//! goes to the export queue, when its future is done or dropped. Each is
//! a [`Recorded`]: plain values on the task, made into the SDK's span data
//! on the export thread.
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
use std::sync::OnceLock;

use futures_util::future::Either;

use opentelemetry::trace::{SpanContext, SpanKind, TraceFlags, TraceState};
use opentelemetry::trace::{SpanId, TraceId};
use opentelemetry::{KeyValue, Value};
use tokio::task::futures::TaskLocalFuture;

use super::recorded::{Recorded, Unsampled};
use super::{on, sampler, stored};

tokio::task_local! {
    /// The span of the request or attempt this task is serving.
    static CURRENT: RefCell<Current>;
}

/// A task's span. Small: the task-local is moved in and out of its
/// thread's slot at every poll.
struct Current {
    span: Held,
    /// Whether an outcome was noted (a refusal's code is the outcome
    /// otherwise).
    outcome: bool,
}

enum Held {
    /// Sampled: recorded, and sent to the queue when it ends.
    Recorded(Box<Recorded>),
    /// Left out by the sampler: its ids only (its flags are none), still
    /// propagated. Inline, not boxed: nothing allocated for a span left
    /// out.
    Unsampled(TraceId, SpanId),
    Ended,
}

impl Drop for Current {
    fn drop(&mut self) {
        if let Held::Recorded(mut span) = std::mem::replace(&mut self.span, Held::Ended) {
            span.end();
            super::finish(*span);
        }
    }
}

impl Current {
    fn span_context(&self) -> SpanContext {
        match &self.span {
            Held::Recorded(span) => span.span_context(),
            Held::Unsampled(trace_id, span_id) => SpanContext::new(
                *trace_id,
                *span_id,
                TraceFlags::default(),
                false,
                TraceState::NONE,
            ),
            Held::Ended => SpanContext::empty_context(),
        }
    }

    fn recorded(&mut self) -> Option<&mut Recorded> {
        match &mut self.span {
            Held::Recorded(span) => Some(span),
            _ => None,
        }
    }

    fn set_outcome(&mut self, outcome: &'static str) {
        self.outcome = true;
        if let Some(span) = self.recorded() {
            span.set_outcome(outcome);
        }
    }

    fn set_error(&mut self, description: &'static str) {
        if let Some(span) = self.recorded() {
            span.set_error(description);
        }
    }
}

/// `fut` inside the span `started` (or the context of one left out),
/// which ends when `fut` is done (or dropped).
fn inside<F: Future>(
    started: Result<Box<Recorded>, Unsampled>,
    fut: F,
) -> TaskLocalFuture<RefCell<Current>, F> {
    let span = match started {
        Ok(span) => Held::Recorded(span),
        Err(sc) => Held::Unsampled(sc.trace_id(), sc.span_id()),
    };
    let current = RefCell::new(Current {
        span,
        outcome: false,
    });
    CURRENT.scope(current, fut)
}

/// The ids of the sampled span the calling task is in, for its log lines.
pub fn log_ids() -> Option<(TraceId, SpanId)> {
    CURRENT
        .try_with(|c| {
            // Not while the span is being noted on (a line logged from
            // inside `with`): that line goes without ids, never a panic.
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

/// Runs one ingest request's `fut` in its `ingest` span, a trace's root.
/// Inside, note its source, scheme, event id and outcome ([`set`],
/// [`outcome`]); link the request's own trace with [`link_upstream`] once
/// its signature is verified and its event taken (not a duplicate).
pub fn ingest<F: Future>(fut: F) -> impl Future<Output = F::Output> + use<F> {
    let Some(sampler) = sampler() else {
        return Either::Left(fut);
    };
    // Boxed, as is an attempt's: its future is kilobytes, and each
    // wrapping would move it again.
    Either::Right(inside(
        Recorded::root("ingest", SpanKind::Server, sampler),
        Box::pin(fut),
    ))
}

/// Runs one delivery attempt's `fut` in its `deliver` span: a child of
/// the event's ingest span, whose context is stored in its `headers` (a
/// trace's root for an event stored without one). Inside, note its
/// status, latency and outcome.
pub fn attempt<F: Future>(
    headers: &[(String, String)],
    source: &str,
    destination: &str,
    event_id: &str,
    attempt: u32,
    fut: F,
) -> impl Future<Output = F::Output> + use<F> {
    let Some(sampler) = sampler() else {
        return Either::Left(fut);
    };
    let started = match stored(headers).and_then(parse_traceparent) {
        Some(parent) => Recorded::child("deliver", SpanKind::Client, &parent),
        None => Recorded::root("deliver", SpanKind::Client, sampler),
    };
    let started = started.map(|mut span| {
        span.set_attribute(KeyValue::new("dedupd.source", source.to_owned()));
        span.set_attribute(KeyValue::new("dedupd.destination", destination.to_owned()));
        span.set_attribute(KeyValue::new("dedupd.event_id", event_id.to_owned()));
        span.set_attribute(KeyValue::new("dedupd.attempt", i64::from(attempt)));
        span
    });
    Either::Right(inside(started, Box::pin(fut)))
}

/// Runs one claims or ordering request's `fut` in a span `name` (`claim`,
/// `done`, `extend`, `release`, `inspect`, `apply`, `head`), its own
/// trace. Inside, note its key ([`note_key`]), outcome and fence, and its
/// answer ([`answered`]). One the sampler leaves out is not built: nothing
/// propagates a claim's context. Its future is not boxed again: a claim
/// would pay for the box, and its span already costs about 2.35 µs, 13 %
/// of a pinned claim at `3ef4e81` (docs/performance.md).
pub fn api<F: Future>(name: &'static str, fut: F) -> impl Future<Output = F::Output> + use<F> {
    let Some(Ok(span)) = sampler().map(|sampler| Recorded::root(name, SpanKind::Server, sampler))
    else {
        return Either::Left(fut);
    };
    Either::Right(inside(Ok(span), fut))
}

/// Sets an attribute of the task's span.
pub fn set(key: &'static str, value: impl Into<Value>) {
    with(|c| {
        if let Some(span) = c.recorded() {
            span.set_attribute(KeyValue::new(key, value));
        }
    });
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
    with(|c| c.recorded().map(|span| span.add_event(name)));
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

/// Links the span to the trace of the `traceparent` its request came with,
/// if any: only its ids and flags, never its `tracestate` (the sender's
/// text, unverified). Call it for a verified request only, so strangers
/// cannot fill exports with links of their choosing, and not for a
/// duplicate: no provider signs `traceparent`, so a captured webhook sent
/// again could carry one of the sender's choosing.
pub fn link_upstream(traceparent: Option<&str>) {
    let Some(upstream) = with(|_| ()).and(traceparent) else {
        return;
    };
    if let Some(sc) = parse_traceparent(upstream) {
        with(|c| c.recorded().map(|span| span.add_link(sc)));
    }
}

/// A span's context as a W3C `traceparent`, written without an
/// allocation.
#[derive(Debug, Clone, Copy)]
pub struct Traceparent([u8; 55]);

impl Traceparent {
    fn of(sc: &SpanContext) -> Self {
        let mut text = *b"00-00000000000000000000000000000000-0000000000000000-00";
        // Each slice is exactly twice its bytes' length: never an error.
        let _ = hex::encode_to_slice(sc.trace_id().to_bytes(), &mut text[3..35]);
        let _ = hex::encode_to_slice(sc.span_id().to_bytes(), &mut text[36..52]);
        let _ = hex::encode_to_slice([sc.trace_flags().to_u8()], &mut text[53..55]);
        Self(text)
    }

    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

/// A W3C `traceparent`, strictly: version 00 (or a later one's first
/// four fields, but not ff), every field lowercase hex of the standard's
/// length, ids that are not all zeros. Only its ids and sampled flag are
/// kept. Anything else is no context at all (the attempt is a trace's
/// root, the link is not made).
fn parse_traceparent(text: &str) -> Option<SpanContext> {
    let lower_hex = |f: &str| f.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let mut fields = text.split('-');
    let [Some(version), Some(trace_id), Some(span_id), Some(flags)] =
        [fields.next(), fields.next(), fields.next(), fields.next()]
    else {
        return None;
    };
    // Ids shorter than the standard's, or uppercase: not a context dedupd
    // or a tracer wrote.
    if [version, trace_id, span_id, flags].map(str::len) != [2, 32, 16, 2]
        || ![version, trace_id, span_id, flags]
            .into_iter()
            .all(lower_hex)
        || version == "ff"
        || (version == "00" && text.len() != 55)
        || text.ends_with('-')
    {
        return None;
    }
    let trace_id = TraceId::from_hex(trace_id).ok()?;
    let span_id = SpanId::from_hex(span_id).ok()?;
    let flags = TraceFlags::new(u8::from_str_radix(flags, 16).ok()?) & TraceFlags::SAMPLED;
    let sc = SpanContext::new(trace_id, span_id, flags, true, TraceState::NONE);
    sc.is_valid().then_some(sc)
}

/// The trace context to store with an event ingested in the task's span
/// (its `traceparent`); nothing when traces are off.
pub fn stored_context() -> Option<(String, String)> {
    with(|c| {
        (
            super::STORED_CONTEXT.to_owned(),
            Traceparent::of(&c.span_context()).as_str().to_owned(),
        )
    })
}

/// The W3C header that continues the task's span in a request it sends:
/// `traceparent` (an attempt's spans carry no `tracestate`: the stored
/// context keeps none).
pub fn propagation() -> Option<Traceparent> {
    with(|c| Traceparent::of(&c.span_context()))
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
    // Its text is made on the export thread.
    with(|c| c.recorded().map(|span| span.set_key_hash(hash)));
}

/// Notes the fence a claim was given.
pub fn note_fence(fence: u64) {
    with(|c| c.recorded().map(|span| span.set_fence(fence)));
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// Runs `fut` in a sampled claims span, as [`api`] does with traces
    /// on; answers the span's trace and span ids.
    pub async fn in_a_sampled_span(fut: impl Future<Output = ()>) -> (String, String) {
        let always = opentelemetry_sdk::trace::Sampler::AlwaysOn;
        let span = Recorded::root("claim", SpanKind::Server, &always).expect("sampled");
        let sc = span.span_context();
        inside(Ok(span), fut).await;
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
            Traceparent::of(&sc).as_str(),
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
        assert!(propagation().is_none());
    }
}
