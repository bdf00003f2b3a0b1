//! A span as its task notes it: plain values (its ids, times, and what
//! the task learns: a claim's key hash, outcome and fence, an ingest's or
//! an attempt's attributes and steps), made into the SDK's span data on
//! the export thread ([`Recorded::into_data`]). Every microsecond shows
//! on the paths these spans describe: an SDK span costs its task a span
//! of some 400 bytes moved in and out of the task-local at every poll, a
//! `Context` built for its parent, and its span data made on the task's
//! thread. The ids come from the SDK's generator and the sampling from
//! the SDK's sampler; the export is the SDK's, as for every span.

use std::borrow::Cow;
use std::sync::OnceLock;
use std::time::SystemTime;

use opentelemetry::trace::{
    Event, Link, SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::trace::{
    IdGenerator as _, RandomIdGenerator, Sampler, SamplingDecision, ShouldSample as _, SpanData,
    SpanEvents, SpanLinks,
};

/// The most attributes, events or links a span keeps (the SDK's default
/// limits); more are counted as dropped.
const LIMIT: usize = 128;

/// Room for a span's attributes, made at its first (grown from none, the
/// vector would be copied on the way): an attempt has up to eight.
const ATTRIBUTES: usize = 8;

/// An open (or ended) sampled span. Small, as a claim's span needs (160
/// bytes, not 224): it is written into the export queue whole at its end,
/// on the path it describes. What only ingest and attempt spans hold is
/// boxed ([`More`]).
#[derive(Debug)]
pub struct Recorded {
    name: &'static str,
    trace_id: TraceId,
    span_id: SpanId,
    start: SystemTime,
    end: SystemTime,
    /// The request's key, hashed ([`super::spans::note_key`]).
    key_hash: Option<u64>,
    outcome: Option<&'static str>,
    fence: Option<u64>,
    /// Failed, and how.
    error: Option<&'static str>,
    more: Option<Box<More>>,
    kind: SpanKind,
}

// Kept small: each byte is copied on the claims path.
const _: () = assert!(std::mem::size_of::<Recorded>() <= 160);

/// What a claims or ordering span never has: a parent, attributes beyond
/// its key, outcome and fence, events and links.
#[derive(Debug, Default)]
struct More {
    /// The parent's span id (another process's, or an earlier one's: a
    /// stored context); none for a trace's root.
    parent: Option<SpanId>,
    attributes: Vec<KeyValue>,
    events: Vec<Event>,
    links: Vec<Link>,
    dropped: u32,
}

/// A span the sampler left out: its context only, still propagated (with
/// the sampled flag off) so the trace's next hops leave it out too.
pub type Unsampled = SpanContext;

impl Recorded {
    /// A new trace's root span `name` of `kind`, started now, when
    /// `sampler` samples it.
    pub fn root(
        name: &'static str,
        kind: SpanKind,
        sampler: &Sampler,
    ) -> Result<Box<Self>, Unsampled> {
        let trace_id = RandomIdGenerator::default().new_trace_id();
        Self::root_in(trace_id, name, kind, sampler)
    }

    /// A root span `name` of `kind` in the trace `trace_id`, started now,
    /// when `sampler` samples that trace.
    pub fn root_in(
        trace_id: TraceId,
        name: &'static str,
        kind: SpanKind,
        sampler: &Sampler,
    ) -> Result<Box<Self>, Unsampled> {
        let span_id = RandomIdGenerator::default().new_span_id();
        if !samples(sampler, trace_id, name, &kind) {
            return Err(unsampled(trace_id, span_id));
        }
        Ok(Self::new(name, kind, trace_id, span_id))
    }

    /// A span `name` of `kind`, started now, a child of `parent` (a remote
    /// context): sampled when its parent was (the SDK's `ParentBased`
    /// rule for a remote parent).
    pub fn child(
        name: &'static str,
        kind: SpanKind,
        parent: &SpanContext,
    ) -> Result<Box<Self>, Unsampled> {
        let span_id = RandomIdGenerator::default().new_span_id();
        if !parent.is_sampled() {
            return Err(unsampled(parent.trace_id(), span_id));
        }
        let mut span = Self::new(name, kind, parent.trace_id(), span_id);
        span.more().parent = Some(parent.span_id());
        Ok(span)
    }

    fn new(name: &'static str, kind: SpanKind, trace_id: TraceId, span_id: SpanId) -> Box<Self> {
        let start = opentelemetry::time::now();
        Box::new(Self {
            name,
            trace_id,
            span_id,
            start,
            end: start,
            key_hash: None,
            outcome: None,
            fence: None,
            error: None,
            more: None,
            kind,
        })
    }

    fn more(&mut self) -> &mut More {
        self.more.get_or_insert_default()
    }

    pub fn span_context(&self) -> SpanContext {
        SpanContext::new(
            self.trace_id,
            self.span_id,
            TraceFlags::SAMPLED,
            false,
            TraceState::NONE,
        )
    }

    pub fn set_attribute(&mut self, kv: KeyValue) {
        let more = self.more();
        if more.attributes.capacity() == 0 {
            more.attributes.reserve_exact(ATTRIBUTES);
        }
        push(&mut more.attributes, kv, &mut more.dropped);
    }

    pub fn set_outcome(&mut self, outcome: &'static str) {
        self.outcome = Some(outcome);
    }

    pub fn set_key_hash(&mut self, hash: u64) {
        self.key_hash = Some(hash);
    }

    pub fn set_fence(&mut self, fence: u64) {
        self.fence = Some(fence);
    }

    pub fn set_error(&mut self, description: &'static str) {
        self.error = Some(description);
    }

    pub fn add_event(&mut self, name: &'static str) {
        let event = Event::new(name, opentelemetry::time::now(), Vec::new(), 0);
        push(&mut self.more().events, event, &mut 0);
    }

    pub fn add_link(&mut self, sc: SpanContext) {
        push(&mut self.more().links, Link::with_context(sc), &mut 0);
    }

    /// Ends the span now.
    pub fn end(&mut self) {
        self.end = opentelemetry::time::now();
    }

    /// The SDK's span data for the exporter (on the export thread).
    pub fn into_data(self) -> SpanData {
        let More {
            parent,
            attributes: noted,
            events,
            links,
            dropped,
        } = self.more.map(|more| *more).unwrap_or_default();
        let mut attributes = Vec::with_capacity(3 + noted.len());
        if let Some(hash) = self.key_hash {
            attributes.push(KeyValue::new("dedupd.key_hash", key_hash_text(hash)));
        }
        attributes.extend(noted);
        if let Some(outcome) = self.outcome {
            attributes.push(KeyValue::new("dedupd.outcome", outcome));
        }
        if let Some(fence) = self.fence {
            let fence = i64::try_from(fence).unwrap_or(i64::MAX);
            attributes.push(KeyValue::new("dedupd.fence", fence));
        }
        let mut span_events = SpanEvents::default();
        span_events.events = events;
        let mut span_links = SpanLinks::default();
        span_links.links = links;
        SpanData {
            span_context: SpanContext::new(
                self.trace_id,
                self.span_id,
                TraceFlags::SAMPLED,
                false,
                TraceState::NONE,
            ),
            parent_span_id: parent.unwrap_or(SpanId::INVALID),
            parent_span_is_remote: parent.is_some(),
            span_kind: self.kind,
            name: Cow::Borrowed(self.name),
            start_time: self.start,
            end_time: self.end,
            attributes,
            dropped_attributes_count: dropped,
            events: span_events,
            links: span_links,
            status: self.error.map_or(Status::Unset, Status::error),
            instrumentation_scope: scope().clone(),
        }
    }
}

/// A key's hash as its attribute's text: 16 lowercase hex digits, written
/// into one allocation of their size (`hex::encode` builds its string a
/// character at a time: 3 % of the export thread's time with claims).
fn key_hash_text(hash: u64) -> String {
    let mut text = [0u8; 16];
    // Exactly twice the hash's 8 bytes: never an error.
    let _ = hex::encode_to_slice(hash.to_be_bytes(), &mut text);
    std::str::from_utf8(&text).unwrap_or_default().to_owned()
}

/// Whether `sampler` samples a root span `name` of `kind` in the trace
/// `trace_id` (the SDK's `TraceIdRatioBased` decides by the id alone).
pub fn samples(sampler: &Sampler, trace_id: TraceId, name: &str, kind: &SpanKind) -> bool {
    sampler
        .should_sample(None, trace_id, name, kind, &[], &[])
        .decision
        == SamplingDecision::RecordAndSample
}

fn unsampled(trace_id: TraceId, span_id: SpanId) -> Unsampled {
    SpanContext::new(
        trace_id,
        span_id,
        TraceFlags::default(),
        false,
        TraceState::NONE,
    )
}

/// The instrumentation scope of every dedupd span (the tracer's).
pub fn scope() -> &'static InstrumentationScope {
    static SCOPE: OnceLock<InstrumentationScope> = OnceLock::new();
    SCOPE.get_or_init(|| InstrumentationScope::builder(super::SCOPE).build())
}

fn push<T>(to: &mut Vec<T>, item: T, dropped: &mut u32) {
    if to.len() < LIMIT {
        to.push(item);
    } else {
        *dropped = dropped.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claims_span_becomes_the_span_data_an_sdk_span_would() {
        let always = Sampler::AlwaysOn;
        let mut span = Recorded::root("claim", SpanKind::Server, &always).expect("sampled");
        span.set_key_hash(0x00ab_cdef_0123_4567);
        span.set_outcome("claimed");
        span.set_fence(7);
        span.end();
        let sc = span.span_context();
        let data = (*span).into_data();
        assert_eq!(data.span_context, sc);
        assert!(sc.is_valid() && sc.is_sampled() && !sc.is_remote());
        assert_eq!(data.parent_span_id, SpanId::INVALID);
        assert_eq!(data.name, "claim");
        assert_eq!(data.span_kind, SpanKind::Server);
        assert!(data.end_time >= data.start_time);
        assert_eq!(
            data.attributes,
            [
                KeyValue::new("dedupd.key_hash", "00abcdef01234567"),
                KeyValue::new("dedupd.outcome", "claimed"),
                KeyValue::new("dedupd.fence", 7_i64),
            ]
        );
        assert_eq!(data.status, Status::Unset);
        assert_eq!(data.instrumentation_scope.name(), super::super::SCOPE);
    }

    #[test]
    fn a_root_is_sampled_by_the_sdk_sampler_and_fails_as_told() {
        for off in [Sampler::AlwaysOff, Sampler::TraceIdRatioBased(0.0)] {
            let sc = Recorded::root("claim", SpanKind::Server, &off).expect_err("left out");
            assert!(
                sc.is_valid() && !sc.is_sampled(),
                "still a context to propagate"
            );
        }
        let ratio = Sampler::TraceIdRatioBased(1.0);
        let mut span = Recorded::root("head", SpanKind::Server, &ratio).expect("sampled");
        span.set_error("server error");
        for n in 0..200 {
            span.set_attribute(KeyValue::new("other", i64::from(n)));
        }
        let data = span.into_data();
        assert_eq!(data.status, Status::error("server error"));
        assert_eq!(data.attributes.len(), LIMIT);
        assert_eq!(data.attributes[0], KeyValue::new("other", 0_i64));
        assert_eq!(data.dropped_attributes_count, 72);
    }

    #[test]
    fn a_child_continues_its_stored_parent_and_follows_its_sampling() {
        let trace_id = TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap();
        let parent_id = SpanId::from_hex("00f067aa0ba902b7").unwrap();
        let parent = |flags| SpanContext::new(trace_id, parent_id, flags, true, TraceState::NONE);
        let mut span =
            Recorded::child("deliver", SpanKind::Client, &parent(TraceFlags::SAMPLED)).unwrap();
        span.set_attribute(KeyValue::new("dedupd.attempt", 2_i64));
        span.set_outcome("delivered");
        span.add_event("sent");
        span.end();
        let sc = span.span_context();
        assert_eq!(sc.trace_id(), trace_id);
        assert!(sc.span_id() != parent_id && sc.is_sampled());
        let data = span.into_data();
        assert_eq!(data.parent_span_id, parent_id);
        assert!(data.parent_span_is_remote);
        assert_eq!(data.span_kind, SpanKind::Client);
        assert_eq!(
            data.attributes,
            [
                KeyValue::new("dedupd.attempt", 2_i64),
                KeyValue::new("dedupd.outcome", "delivered"),
            ]
        );
        assert_eq!(data.events.events.len(), 1);
        assert_eq!(data.events.events[0].name, "sent");

        let left_out = Recorded::child("deliver", SpanKind::Client, &parent(TraceFlags::default()))
            .expect_err("its parent was left out");
        assert_eq!(left_out.trace_id(), trace_id);
        assert!(left_out.span_id() != parent_id && !left_out.is_sampled());
    }
}
