//! Which events an operator means: a filter over one source's events (a
//! status; receive-time and `created_at` ranges; a stream; a body field's
//! value; text in the last error), checked over the inbox's listing in
//! receive order (`gateway::scan` reads it). Counting what matches is the
//! dry run of a bulk operation (docs/design/operator-power.md).

use serde::{Deserialize, Serialize};

use crate::clock::Millis;
use crate::domain::CreatedAt;
use crate::store::inbox::{EventStatus, InboxEvent};

/// Rows a count reads at most: past it, the count says "at least" and
/// gives a cursor to go on from (see `gateway::scan`).
pub const MAX_SCAN: u64 = 1_000_000;

/// The events of one source an operator means. Stored with a bulk job
/// (as JSON, see `gateway::jobs`): fields are added with defaults only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventFilter {
    pub status: EventStatus,
    /// Received at or after, Unix ms.
    pub received_from: Option<Millis>,
    /// Received before, Unix ms.
    pub received_to: Option<Millis>,
    /// Created at or after.
    pub created_from: Option<CreatedAt>,
    /// Created before.
    pub created_to: Option<CreatedAt>,
    /// In this stream.
    pub stream: Option<String>,
    /// A body field (a JSON pointer such as `/type`) and its value: a
    /// string equals it, anything else equals it read as JSON (`7`, `true`).
    pub field: Option<(String, String)>,
    /// The last error contains this text.
    pub error_contains: Option<String>,
}

impl EventFilter {
    /// Every event with `status`.
    pub fn status(status: EventStatus) -> Self {
        Self {
            status,
            received_from: None,
            received_to: None,
            created_from: None,
            created_to: None,
            stream: None,
            field: None,
            error_contains: None,
        }
    }

    /// Whether matching needs the body (slower: one read per event).
    pub fn needs_body(&self) -> bool {
        self.field.is_some()
    }

    /// Whether `e` matches; `e.body` is read only with
    /// [`EventFilter::needs_body`].
    pub fn matches(&self, e: &InboxEvent) -> bool {
        let received = self.received_from.is_none_or(|t| e.received_at_ms >= t)
            && self.received_to.is_none_or(|t| e.received_at_ms < t);
        let created = self.created_from.is_none_or(|t| e.created_at >= t)
            && self.created_to.is_none_or(|t| e.created_at < t);
        let stream = self
            .stream
            .as_ref()
            .is_none_or(|s| e.stream.as_ref() == Some(s));
        let error = self.error_matches(e.last_error.as_deref());
        let field = self.field.as_ref().is_none_or(|(pointer, value)| {
            serde_json::from_slice::<serde_json::Value>(&e.body)
                .ok()
                .and_then(|body| body.pointer(pointer).cloned())
                .is_some_and(|found| match found {
                    serde_json::Value::String(s) => s == *value,
                    other => serde_json::from_str::<serde_json::Value>(value)
                        .is_ok_and(|wanted| wanted == other),
                })
        });
        e.status == self.status && received && created && stream && error && field
    }
}

/// What a filter's text values read as once they are dropped.
pub const DROPPED: &str = "(dropped when the job ended)";

impl EventFilter {
    /// The filter with its texts (stream, body field value, error text)
    /// dropped: what a finished job keeps, since an erasure's filter names
    /// the person erased.
    pub fn without_values(&self) -> Self {
        let dropped = |v: &Option<String>| v.as_ref().map(|_| DROPPED.to_owned());
        Self {
            stream: dropped(&self.stream),
            field: self
                .field
                .as_ref()
                .map(|(pointer, _)| (pointer.clone(), DROPPED.to_owned())),
            error_contains: dropped(&self.error_contains),
            ..self.clone()
        }
    }

    /// Whether a last error of `error` passes the filter's error text.
    pub fn error_matches(&self, error: Option<&str>) -> bool {
        self.error_contains
            .as_ref()
            .is_none_or(|text| error.is_some_and(|err| err.contains(text.as_str())))
    }

    /// Whether `e` may match, on everything but its body: a body is read
    /// only for those.
    pub fn matches_without_body(&self, e: &InboxEvent) -> bool {
        Self {
            field: None,
            ..self.clone()
        }
        .matches(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(
        received: Millis,
        stream: Option<&str>,
        error: Option<&str>,
        body: &str,
    ) -> InboxEvent {
        InboxEvent {
            source: "s".into(),
            event_id: format!("e{received}"),
            status: EventStatus::Dead,
            stream: stream.map(str::to_owned),
            created_at: CreatedAt::from_unix_nanos(i128::from(received) * 1_000_000),
            received_at_ms: received,
            attempts: 1,
            due_at_ms: received,
            last_error: error.map(str::to_owned),
            force: false,
            headers: Vec::new(),
            body: body.as_bytes().to_vec(),
            expires_at_ms: 0,
            lease: 0,
            body_bytes: body.len(),
            timeline: Vec::new(),
            replay: None,
        }
    }

    #[test]
    fn each_part_of_a_filter_narrows_it() {
        let e = event(
            1_000,
            Some("run_1"),
            Some("HTTP 503"),
            r#"{"type":"run.failed","n":7}"#,
        );
        let all = EventFilter::status(EventStatus::Dead);
        assert!(all.matches(&e));
        assert!(!EventFilter::status(EventStatus::Delivered).matches(&e));
        let cases: [(EventFilter, bool); 12] = [
            (
                EventFilter {
                    received_from: Some(1_000),
                    ..all.clone()
                },
                true,
            ),
            (
                EventFilter {
                    received_from: Some(1_001),
                    ..all.clone()
                },
                false,
            ),
            (
                EventFilter {
                    received_to: Some(1_001),
                    ..all.clone()
                },
                true,
            ),
            (
                EventFilter {
                    received_to: Some(1_000),
                    ..all.clone()
                },
                false,
            ),
            (
                EventFilter {
                    stream: Some("run_1".into()),
                    ..all.clone()
                },
                true,
            ),
            (
                EventFilter {
                    stream: Some("run_2".into()),
                    ..all.clone()
                },
                false,
            ),
            (
                EventFilter {
                    error_contains: Some("503".into()),
                    ..all.clone()
                },
                true,
            ),
            (
                EventFilter {
                    error_contains: Some("504".into()),
                    ..all.clone()
                },
                false,
            ),
            (
                EventFilter {
                    field: Some(("/type".into(), "run.failed".into())),
                    ..all.clone()
                },
                true,
            ),
            (
                EventFilter {
                    field: Some(("/type".into(), "run.ok".into())),
                    ..all.clone()
                },
                false,
            ),
            (
                EventFilter {
                    field: Some(("/n".into(), "7".into())),
                    ..all.clone()
                },
                true,
            ),
            (
                EventFilter {
                    field: Some(("/missing".into(), "7".into())),
                    ..all.clone()
                },
                false,
            ),
        ];
        for (i, (f, want)) in cases.iter().enumerate() {
            assert_eq!(f.matches(&e), *want, "case {i}: {f:?}");
        }
        let created = CreatedAt::from_unix_nanos(1_000_000_000);
        assert!(
            EventFilter {
                created_from: Some(created),
                ..all.clone()
            }
            .matches(&e)
        );
        assert!(
            !EventFilter {
                created_to: Some(created),
                ..all.clone()
            }
            .matches(&e)
        );
        let no_error = event(2_000, None, None, "not json");
        assert!(
            !EventFilter {
                error_contains: Some(String::new()),
                ..all.clone()
            }
            .matches(&no_error)
        );
        assert!(
            !EventFilter {
                field: Some(("/type".into(), "x".into())),
                ..all
            }
            .matches(&no_error)
        );
    }
}
