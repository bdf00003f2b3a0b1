//! The webhook gateway: verify, store, acknowledge, deliver once in effect.
//!
//! - [`signature`]: the providers' signature schemes.
//! - [`locate`]: `header:NAME` / `body:/pointer` field locations.
//! - [`source`]: a configured source, parsed.
//! - [`ingest`]: headers, then body → a verified, parsed event (the HTTP
//!   handler is `routes::ingest`).
//! - [`delivery`]: the dispatcher and its workers: per stream in order,
//!   retries with backoff, dead letters.
//! - [`alerts`]: dedupd's own operational events, delivered as the
//!   internal source `dedupd-alerts`.
//! - [`filter`]: which events an operator means; [`jobs`]: bulk
//!   redelivery and erasure over a filter.
//! - [`arrivals`]: events that go before the next in line of their stream,
//!   for the dispatcher to hear of.

pub mod alerts;
pub mod arrivals;
pub mod delivery;
pub mod filter;
pub mod ingest;
pub mod jobs;
pub mod locate;
pub mod route;
pub mod signature;
pub mod source;

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::Notify;

use crate::store::inbox::{Inbox, Retention};

pub use arrivals::Arrivals;
pub use source::Source;

/// What ingest, delivery and the operator API share.
#[derive(Debug)]
pub struct Gateway {
    /// Sources by name.
    pub sources: HashMap<String, Arc<Source>>,
    /// The inbox (always the local data file).
    pub inbox: Arc<dyn Inbox>,
    /// Wakes the dispatcher when something became runnable.
    pub wake: Notify,
    /// Wakes the job runner when a job started or was cancelled.
    pub jobs_wake: Notify,
    /// Events that may go before one its stream had next in line.
    pub arrivals: Arrivals,
    /// Retentions of settled events.
    pub retention: Retention,
    /// Where operational alerts are raised, with `[alerts]`.
    pub alerts: Option<Arc<alerts::Alerts>>,
}

impl Gateway {
    /// The source called `name`.
    pub fn source(&self, name: &str) -> Option<&Arc<Source>> {
        self.sources.get(name)
    }

    /// Every lane holding a copy of the events of the source `name` (or of
    /// the source whose lane `name` is): the source's own name and each
    /// destination's lane. What an erasure must reach: each lane stores
    /// the event's body.
    pub fn lanes_of(&self, name: &str) -> Vec<String> {
        let posted = self
            .sources
            .get(name)
            .and_then(|s| s.lane_of.as_deref())
            .unwrap_or(name);
        let mut lanes = vec![posted.to_owned()];
        if let Some(source) = self.sources.get(posted) {
            for r in &source.routes {
                if !lanes.contains(&r.lane) {
                    lanes.push(r.lane.clone());
                }
            }
        }
        lanes
    }

    /// Erases event `id` in every lane of `source`'s source
    /// ([`Gateway::lanes_of`]): erased if any lane erased it, already
    /// erased if one had, not found if none holds it.
    pub async fn erase_everywhere(
        &self,
        source: &str,
        id: &str,
        retention_ms: u64,
        now: crate::clock::Millis,
    ) -> Result<crate::store::inbox::EraseOutcome, crate::store::StoreError> {
        use crate::store::inbox::EraseOutcome;
        let mut outcome = EraseOutcome::NotFound;
        for lane in self.lanes_of(source) {
            match self.inbox.erase(&lane, id, retention_ms, now).await? {
                EraseOutcome::Erased => outcome = EraseOutcome::Erased,
                EraseOutcome::AlreadyErased if outcome == EraseOutcome::NotFound => {
                    outcome = EraseOutcome::AlreadyErased;
                }
                _ => {}
            }
        }
        Ok(outcome)
    }

    /// Raises an alert, with `[alerts]` (see [`alerts::Alerts::raise`]).
    pub fn alert(&self, kind: &'static str, source: Option<&str>, detail: serde_json::Value) {
        if let Some(alerts) = &self.alerts {
            alerts.raise(kind, source, detail);
        }
    }
}
