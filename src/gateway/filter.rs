//! Which events an operator means: a filter over one source's events (a
//! status; receive-time and `created_at` ranges; a stream; a body field's
//! value; text in the last error), checked over the inbox's listing in
//! receive order. Counting what matches is the dry run of a bulk
//! operation (docs/design/operator-power.md).

use serde::{Deserialize, Serialize};

use crate::clock::Millis;
use crate::domain::CreatedAt;
use crate::store::StoreError;
use crate::store::inbox::{Cursor, EventStatus, Inbox, InboxEvent, ListOrder};

/// Ids a count names.
pub const NAMED: usize = 10;
/// Rows a count reads at most: past it, the count says "at least".
pub const MAX_SCAN: u64 = 1_000_000;
/// Rows per listing page read.
const PAGE: usize = 500;

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
        let error = self
            .error_contains
            .as_ref()
            .is_none_or(|text| e.last_error.as_ref().is_some_and(|err| err.contains(text)));
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

/// What a count found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counted {
    /// Events that match.
    pub matched: u64,
    /// Events read to find them.
    pub scanned: u64,
    /// False when [`MAX_SCAN`] stopped the count first: `matched` is then
    /// a lower bound.
    pub complete: bool,
    /// The first [`NAMED`] that match, oldest received first.
    pub first_ids: Vec<String>,
}

/// Counts the events of `source` that `filter` matches, reading at most
/// `max_scan` rows.
pub async fn count(
    inbox: &dyn Inbox,
    source: &str,
    filter: &EventFilter,
    max_scan: u64,
) -> Result<Counted, StoreError> {
    let mut counted = Counted {
        complete: true,
        ..Counted::default()
    };
    let mut after: Option<Cursor> = None;
    loop {
        let (page, next) = inbox
            .list_events(source, filter.status, ListOrder::OldestFirst, after, PAGE)
            .await?;
        for listed in page {
            if counted.scanned >= max_scan {
                counted.complete = false;
                return Ok(counted);
            }
            counted.scanned += 1;
            // Receive order: nothing past the range's end matches.
            if filter
                .received_to
                .is_some_and(|t| listed.received_at_ms >= t)
            {
                return Ok(counted);
            }
            if let Some(event) = matching(inbox, filter, listed).await? {
                counted.matched += 1;
                if counted.first_ids.len() < NAMED {
                    counted.first_ids.push(event.event_id);
                }
            }
        }
        match next {
            Some(cursor) => after = Some(cursor),
            None => return Ok(counted),
        }
    }
}

/// `listed` (a row of a listing, without its body) if `filter` matches it,
/// reading its body only when the filter needs it and all else matches.
pub async fn matching(
    inbox: &dyn Inbox,
    filter: &EventFilter,
    listed: InboxEvent,
) -> Result<Option<InboxEvent>, StoreError> {
    if !filter.needs_body() {
        return Ok(filter.matches(&listed).then_some(listed));
    }
    if !filter.matches_without_body(&listed) {
        return Ok(None);
    }
    Ok(inbox
        .inbox_event(&listed.source, &listed.event_id)
        .await?
        .filter(|full| filter.matches(full)))
}

impl EventFilter {
    /// Whether `e` may match, on everything but its body: a body is read
    /// only for those.
    fn matches_without_body(&self, e: &InboxEvent) -> bool {
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
