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

use super::recorded::{Recorded, Unsampled, samples};
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

/// Which event a delivery attempt is for, by what every store keeps of
/// it: an event stored without a trace context derives its trace from it.
#[derive(Debug, Clone, Copy)]
pub struct EventOf<'a> {
    /// The source it is stored under (a fan-out lane's own name).
    pub source: &'a str,
    pub event_id: &'a str,
    pub stream: Option<&'a str>,
    pub received_at_ms: u64,
}

impl EventOf<'_> {
    /// The trace of an event stored without a context (received with
    /// traces off, or by a build from before them): every attempt made for
    /// it with traces on is a root span in it (the trace has no ingest
    /// span). Derived, not drawn: from the event's source, id, stream and
    /// receive time, which every store keeps, so an attempt after a
    /// restart, on another instance of a shared inbox or from a bulk
    /// replay joins the same trace, and the event's page names it without
    /// a record of each attempt. SHA-256 over the fields, each written with
    /// its length: as uniform as the ratio sampler needs, and decided the
    /// same way for every attempt.
    fn derived_trace_id(&self) -> TraceId {
        use sha2::{Digest, Sha256};
        let mut hash = Sha256::new();
        hash.update(b"dedupd event trace\0");
        for field in [Some(self.source), Some(self.event_id), self.stream] {
            match field {
                Some(text) => {
                    hash.update([1]);
                    hash.update((text.len() as u64).to_be_bytes());
                    hash.update(text.as_bytes());
                }
                None => hash.update([0]),
            }
        }
        hash.update(self.received_at_ms.to_be_bytes());
        let digest = hash.finalize();
        let mut id = [0u8; 16];
        id.copy_from_slice(&digest[..16]);
        // All zeros is no trace (a chance of 2^-128, but never invalid).
        if id == [0; 16] {
            id[15] = 1;
        }
        TraceId::from_bytes(id)
    }
}

/// What an event's attempts are in: its stored ingest span (a remote
/// parent), or, stored without one (or with one that is not a valid
/// `traceparent`), the trace derived from the event.
fn event_context(headers: &[(String, String)], event: EventOf<'_>) -> Result<SpanContext, TraceId> {
    stored(headers)
        .and_then(parse_traceparent)
        .ok_or_else(|| event.derived_trace_id())
}

/// The trace an event's page names, the one its attempts made with traces
/// on are in: its ingest's, stored with it, when that was sampled; for
/// an event stored without one, while traces are on, the trace derived
/// from it, when the sampler samples it. None otherwise: an unsampled
/// trace is in no backend. Not for an erased event: its headers, the
/// context among them, are deleted, and it would pass for one stored
/// without a context (the event's page names no trace for it).
pub fn event_trace_id(headers: &[(String, String)], event: EventOf<'_>) -> Option<String> {
    let trace_id = match event_context(headers, event) {
        Ok(parent) => parent.is_sampled().then(|| parent.trace_id())?,
        Err(derived) => sampler()
            .filter(|s| samples(s, derived, "deliver", &SpanKind::Client))
            .map(|_| derived)?,
    };
    Some(trace_id.to_string())
}

/// Runs one delivery attempt's `fut` in its `deliver` span: a child of
/// the event's ingest span, whose context is stored in its `headers`, or
/// for an event stored without one a root span in the trace derived from
/// it ([`EventOf`]). Inside, note its status, latency and outcome. The
/// span's `dedupd.source` is `source` (a fan-out lane's source).
pub fn attempt<F: Future>(
    headers: &[(String, String)],
    event: EventOf<'_>,
    source: &str,
    destination: &str,
    attempt: u32,
    fut: F,
) -> impl Future<Output = F::Output> + use<F> {
    let Some(sampler) = sampler() else {
        return Either::Left(fut);
    };
    let started = match event_context(headers, event) {
        Ok(parent) => Recorded::child("deliver", SpanKind::Client, &parent),
        Err(derived) => Recorded::root_in(derived, "deliver", SpanKind::Client, sampler),
    };
    let started = started.map(|mut span| {
        span.set_attribute(KeyValue::new("dedupd.source", source.to_owned()));
        span.set_attribute(KeyValue::new("dedupd.destination", destination.to_owned()));
        span.set_attribute(KeyValue::new("dedupd.event_id", event.event_id.to_owned()));
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

    /// An event stored without a trace context: each of its attempts
    /// (after a restart, on another instance) finds the same trace, one
    /// of its own, sampled alike; a stored context is the parent instead.
    #[test]
    fn an_event_stored_without_a_context_has_one_trace_derived_from_it() {
        let event = EventOf {
            source: "sume",
            event_id: "evt_1",
            stream: Some("run_1"),
            received_at_ms: 1_765_000_000_000,
        };
        let derived = event_context(&[], event).expect_err("nothing stored");
        assert!(derived != TraceId::INVALID);
        assert_eq!(
            event_context(&[], event),
            Err(derived),
            "the same each time"
        );
        let others = [
            EventOf {
                source: "sume_eu",
                ..event
            },
            EventOf {
                event_id: "evt_2",
                ..event
            },
            EventOf {
                stream: None,
                ..event
            },
            EventOf {
                stream: Some(""),
                ..event
            },
            EventOf {
                received_at_ms: event.received_at_ms + 1,
                ..event
            },
            // Where one field ends and the next begins counts.
            EventOf {
                source: "sumee",
                event_id: "vt_1",
                ..event
            },
        ];
        let mut ids: Vec<TraceId> = others.iter().map(|e| e.derived_trace_id()).collect();
        ids.push(derived);
        ids.sort_by_key(|id| id.to_bytes());
        ids.dedup();
        assert_eq!(ids.len(), others.len() + 1, "each event a trace of its own");

        // Its attempts are roots in that trace, each a span of its own,
        // and the ratio sampler decides by the trace: alike every time.
        let always = opentelemetry_sdk::trace::Sampler::AlwaysOn;
        let a = Recorded::root_in(derived, "deliver", SpanKind::Client, &always).unwrap();
        let b = Recorded::root_in(derived, "deliver", SpanKind::Client, &always).unwrap();
        assert_eq!(a.span_context().trace_id(), derived);
        assert_eq!(b.span_context().trace_id(), derived);
        assert!(a.span_context().span_id() != b.span_context().span_id());
        let half = opentelemetry_sdk::trace::Sampler::TraceIdRatioBased(0.5);
        let decisions: Vec<bool> = (0..2000)
            .map(|n| {
                let e = EventOf {
                    received_at_ms: n,
                    ..event
                };
                let id = e.derived_trace_id();
                let first = Recorded::root_in(id, "deliver", SpanKind::Client, &half).is_ok();
                let again = Recorded::root_in(id, "deliver", SpanKind::Client, &half).is_ok();
                assert_eq!(first, again, "one event's attempts sampled alike");
                first
            })
            .collect();
        let sampled = decisions.iter().filter(|&&d| d).count();
        assert!(
            (800..1200).contains(&sampled),
            "about half sampled: {sampled}"
        );

        // Stored with a context: that is the attempts' parent.
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let headers = vec![(super::super::STORED_CONTEXT.to_owned(), tp.to_owned())];
        let parent = event_context(&headers, event).expect("stored");
        assert_eq!(
            parent.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(parent.span_id().to_string(), "00f067aa0ba902b7");
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
            attempt(
                &[],
                EventOf {
                    source: "sume",
                    event_id: "e1",
                    stream: None,
                    received_at_ms: 1,
                },
                "sume",
                "default",
                1,
                async { 9 }
            )
            .await,
            9
        );
        assert_eq!(stored_context(), None);
        assert!(propagation().is_none());
    }
}
