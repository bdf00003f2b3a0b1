//! The webhook gateway: verify, store, acknowledge, deliver once in effect.
//!
//! - [`signature`]: the providers' signature schemes.
//! - [`locate`]: `header:NAME` / `body:/pointer` field locations.
//! - [`source`]: a configured source, parsed; [`sources`]: all of them,
//!   built from the settings, as one snapshot a reload replaces.
//! - [`ingest`]: headers, then body → a verified, parsed event (the HTTP
//!   handler is `routes::ingest`).
//! - [`delivery`]: the dispatcher and its workers: per stream in order,
//!   retries with backoff, dead letters.
//! - [`alerts`]: dedupd's own operational events, delivered as the
//!   internal source `dedupd-alerts`.
//! - [`filter`]: which events an operator means; [`scan`]: reading them,
//!   bounded and off the request path; [`jobs`]: bulk redelivery and
//!   erasure over a filter.
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
pub mod scan;
pub mod signature;
pub mod source;
pub mod sources;

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio::sync::Notify;

use crate::store::inbox::{Inbox, Retention};

pub use arrivals::Arrivals;
pub use source::Source;
pub use sources::Sources;

/// What ingest, delivery and the operator API share.
#[derive(Debug)]
pub struct Gateway {
    /// The sources in force: replaced whole by a reload
    /// ([`Gateway::replace_sources`]); read with [`Gateway::sources`] or
    /// [`Gateway::source`].
    sources: ArcSwap<Sources>,
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
    /// Where counts and bulk jobs read the inbox (see [`scan`]).
    pub scanner: scan::Scanner,
}

impl Gateway {
    /// A gateway over `sources`, with nothing arrived or waiting.
    pub fn new(
        sources: Sources,
        inbox: Arc<dyn Inbox>,
        retention: Retention,
        alerts: Option<Arc<alerts::Alerts>>,
        scanner: scan::Scanner,
    ) -> Self {
        Self {
            sources: ArcSwap::from_pointee(sources),
            inbox,
            wake: Notify::new(),
            jobs_wake: Notify::new(),
            arrivals: Arrivals::default(),
            retention,
            alerts,
            scanner,
        }
    }

    /// The sources in force now. One call, one configuration: a caller
    /// that looks up several names reads them from the same snapshot.
    pub fn sources(&self) -> Arc<Sources> {
        self.sources.load_full()
    }

    /// The source called `name`, as configured now.
    pub fn source(&self, name: &str) -> Option<Arc<Source>> {
        self.sources.load().get(name).cloned()
    }

    /// Puts `sources` in force (a reload): requests and turns that hold
    /// the old ones finish with them; every later lookup sees the new
    /// ones.
    pub fn replace_sources(&self, sources: Sources) {
        self.sources.store(Arc::new(sources));
    }

    /// Every lane holding a copy of the events of the source `name` (or of
    /// the source whose lane `name` is, configured or not): the source's
    /// own name, `name` and each destination's lane. What an erasure must
    /// reach: each lane stores the event's body.
    pub fn lanes_of(&self, name: &str) -> Vec<String> {
        Self::lanes_in(&self.sources(), name)
    }

    /// [`Gateway::lanes_of`] in `sources`.
    fn lanes_in(sources: &Sources, name: &str) -> Vec<String> {
        let posted = match sources.get(name) {
            Some(s) => s.lane_of.as_deref().unwrap_or(name),
            // A lane of a destination since removed: `SOURCE.DESTINATION`.
            None => name.split_once('.').map_or(name, |(source, _)| source),
        };
        let mut lanes = vec![posted.to_owned()];
        if name != posted {
            lanes.push(name.to_owned());
        }
        if let Some(source) = sources.get(posted) {
            for r in &source.routes {
                if !lanes.contains(&r.lane) {
                    lanes.push(r.lane.clone());
                }
            }
        }
        lanes
    }

    /// [`Gateway::lanes_of`], and the lanes of the source's destinations
    /// that are no longer configured but held events when this
    /// configuration was first looked at: where a provider's retry must be
    /// found a duplicate (read once per configuration, see
    /// [`Sources::stored_lanes`]; on the shared inbox, lanes another
    /// instance created since are checked by the ingest script itself).
    pub async fn lanes_held(&self, name: &str) -> Result<Vec<String>, crate::store::StoreError> {
        let sources = self.sources();
        let stored = sources
            .stored_lanes
            .get_or_try_init(|| self.lanes_in_inbox())
            .await?;
        Ok(Self::with_stored(&sources, name, stored))
    }

    /// Where an erasure must reach: [`Gateway::lanes_held`], but on an
    /// inbox other instances write too (the shared inbox) the lanes it
    /// holds now: another instance, configured with other destinations
    /// (a rolling change), may have created lanes since this process
    /// first looked, and each of them stores the event's body.
    pub async fn lanes_to_erase(
        &self,
        name: &str,
    ) -> Result<Vec<String>, crate::store::StoreError> {
        if !self.inbox.written_elsewhere() {
            return self.lanes_held(name).await;
        }
        let stored = self.lanes_in_inbox().await?;
        Ok(Self::with_stored(&self.sources(), name, &stored))
    }

    /// The lanes (`SOURCE.DESTINATION`) the inbox holds events in, by
    /// source.
    async fn lanes_in_inbox(
        &self,
    ) -> Result<HashMap<String, Vec<String>>, crate::store::StoreError> {
        let mut by_source: HashMap<String, Vec<String>> = HashMap::new();
        for (lane, _) in self.inbox.inbox_sources().await? {
            if let Some((source, _)) = lane.split_once('.') {
                by_source
                    .entry(source.to_owned())
                    .or_default()
                    .push(lane.clone());
            }
        }
        Ok(by_source)
    }

    /// [`Gateway::lanes_of`] `name`, and the lanes of its source in
    /// `stored`.
    fn with_stored(
        sources: &Sources,
        name: &str,
        stored: &HashMap<String, Vec<String>>,
    ) -> Vec<String> {
        let mut lanes = Self::lanes_in(sources, name);
        if let Some(extra) = stored.get(&lanes[0]) {
            // In name order: a count's cursor names its lane, and the
            // lanes after it must be the same ones next time.
            let mut extra: Vec<&String> = extra.iter().filter(|l| !lanes.contains(l)).collect();
            extra.sort();
            extra.dedup();
            lanes.extend(extra.into_iter().cloned());
        }
        lanes
    }

    /// The lanes a count or a bulk job over `name` reads: a source's own
    /// and each of its destinations' (configured, or holding events when
    /// this configuration was first looked at); a destination's lane
    /// (`SOURCE.NAME`) alone.
    pub async fn lanes_to_scan(&self, name: &str) -> Result<Vec<String>, crate::store::StoreError> {
        let lane_of_a_source = match self.source(name) {
            Some(s) => s.lane_of.is_some(),
            None => name.contains('.'),
        };
        if lane_of_a_source {
            return Ok(vec![name.to_owned()]);
        }
        self.lanes_to_erase(name).await
    }

    /// Erases event `id` in each of `lanes` (those of its source,
    /// [`Gateway::lanes_held`]): erased if any lane erased it, already
    /// erased if one had, not found if none holds it.
    pub async fn erase_everywhere(
        &self,
        lanes: &[String],
        id: &str,
        retention_ms: u64,
        now: crate::clock::Millis,
    ) -> Result<crate::store::inbox::EraseOutcome, crate::store::StoreError> {
        use crate::store::inbox::EraseOutcome;
        let mut outcome = EraseOutcome::NotFound;
        for lane in lanes {
            match self.inbox.erase(lane, id, retention_ms, now).await? {
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
