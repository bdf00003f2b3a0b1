//! A claims or ordering request's span, as its worker notes it: plain
//! values (its ids, times, key hash, outcome and fence) with nothing
//! allocated, made into the SDK's span data on the export thread
//! ([`ApiSpan::into_data`]). These are the spans of the claim path, where
//! every microsecond shows: an SDK span there costs its worker a span of
//! some 300 bytes moved at every poll, an attribute vector and the hash's
//! text allocated, and frees of both on another thread. The ids come from
//! the SDK's generator and the sampling from the SDK's sampler; the export
//! is the SDK's, as for every span.

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

/// An open (or ended) claims or ordering request's span.
#[derive(Debug)]
pub struct ApiSpan {
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
    /// Anything else noted (nothing, on the claims and ordering paths:
    /// these stay unallocated).
    attributes: Vec<KeyValue>,
    events: Vec<Event>,
    links: Vec<Link>,
    dropped: u32,
}

impl ApiSpan {
    /// A new trace's root span `name`, started now; none when `sampler`
    /// does not sample it.
    pub fn start(name: &'static str, sampler: &Sampler) -> Option<Self> {
        let ids = RandomIdGenerator::default();
        let trace_id = ids.new_trace_id();
        let sampled = sampler.should_sample(None, trace_id, name, &SpanKind::Server, &[], &[]);
        if sampled.decision != SamplingDecision::RecordAndSample {
            return None;
        }
        let start = opentelemetry::time::now();
        Some(Self {
            name,
            trace_id,
            span_id: ids.new_span_id(),
            start,
            end: start,
            key_hash: None,
            outcome: None,
            fence: None,
            error: None,
            attributes: Vec::new(),
            events: Vec::new(),
            links: Vec::new(),
            dropped: 0,
        })
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
        push(&mut self.attributes, kv, &mut self.dropped);
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
        push(&mut self.events, event, &mut 0);
    }

    pub fn add_link(&mut self, sc: SpanContext) {
        push(&mut self.links, Link::with_context(sc), &mut 0);
    }

    /// Ends the span now.
    pub fn end(&mut self) {
        self.end = opentelemetry::time::now();
    }

    /// The SDK's span data for the exporter (on the export thread).
    pub fn into_data(self) -> SpanData {
        let mut attributes = Vec::with_capacity(3 + self.attributes.len());
        if let Some(hash) = self.key_hash {
            attributes.push(KeyValue::new("dedupd.key_hash", format!("{hash:016x}")));
        }
        if let Some(outcome) = self.outcome {
            attributes.push(KeyValue::new("dedupd.outcome", outcome));
        }
        if let Some(fence) = self.fence {
            let fence = i64::try_from(fence).unwrap_or(i64::MAX);
            attributes.push(KeyValue::new("dedupd.fence", fence));
        }
        attributes.extend(self.attributes);
        let mut events = SpanEvents::default();
        events.events = self.events;
        let mut links = SpanLinks::default();
        links.links = self.links;
        SpanData {
            span_context: SpanContext::new(
                self.trace_id,
                self.span_id,
                TraceFlags::SAMPLED,
                false,
                TraceState::NONE,
            ),
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Server,
            name: Cow::Borrowed(self.name),
            start_time: self.start,
            end_time: self.end,
            attributes,
            dropped_attributes_count: self.dropped,
            events,
            links,
            status: self.error.map_or(Status::Unset, Status::error),
            instrumentation_scope: scope().clone(),
        }
    }
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
    fn an_api_span_becomes_the_span_data_an_sdk_span_would() {
        let always = Sampler::AlwaysOn;
        let mut span = ApiSpan::start("claim", &always).expect("sampled");
        span.set_key_hash(0x00ab_cdef_0123_4567);
        span.set_outcome("claimed");
        span.set_fence(7);
        span.end();
        let sc = span.span_context();
        let data = span.into_data();
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
    fn an_api_span_is_sampled_by_the_sdk_sampler_and_fails_as_told() {
        assert!(ApiSpan::start("claim", &Sampler::AlwaysOff).is_none());
        assert!(ApiSpan::start("claim", &Sampler::TraceIdRatioBased(0.0)).is_none());
        let mut span = ApiSpan::start("head", &Sampler::TraceIdRatioBased(1.0)).expect("sampled");
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
}
