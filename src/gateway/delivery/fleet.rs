//! Delivery as one fleet (the shared inbox): before a pass starts
//! deliveries of a lane, it asks the lane's gate in the store how many may
//! start ([`crate::store::lanes`]): none while the destination's
//! `Retry-After` holds or its breaker is paused, one probe at a time once
//! the pause is over, and no more than the fleet's token bucket has. Each
//! turn reports how it went: failures (with a `Retry-After`) always,
//! successes while the fleet counts failures, so the breaker's count and
//! its transitions are the fleet's, and each transition is logged and
//! alerted once, by the instance whose report made it.
//!
//! With the local inbox, [`crate::store::inbox::Inbox::lanes`] is `None`
//! and none of this runs: the schedule keeps its own breaker and bucket.

use std::sync::Arc;

use futures_util::future::join_all;

use super::backoff::millis;
use super::circuit::Transition;
use super::schedule::Wants;
use super::{Dispatcher, GRACE_MS, log_transition};
use crate::clock::Millis;
use crate::store::StoreError;
use crate::store::lanes::{GateAsk, LaneGate, LaneReport, LaneState, LaneTransition, Outcome};

/// An id of a destination's URL (no secret in the store: its query may
/// hold one).
fn destination_id(url: &reqwest::Url) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(&Sha256::digest(url.as_str().as_bytes())[..8])
}

/// A lane the store could not be asked about waits this long.
const GATE_RETRY_MS: Millis = 500;

impl Dispatcher {
    /// With a fleet: asks the gate of each lane in `wants`, and keeps in
    /// `wants` only what the answers allow.
    /// Fails only when every gate asked failed (the store is down).
    pub(super) async fn gate_lanes(
        self: &Arc<Self>,
        wants: &mut Wants,
        now: Millis,
    ) -> Result<(), StoreError> {
        let Some(lanes) = self.gateway.inbox.lanes() else {
            return Ok(());
        };
        // A pass that failed after its gates leaves grants behind.
        self.return_unused();
        let names: Vec<String> = wants.reads.iter().map(|(s, _)| s.clone()).collect();
        let asked = self.schedule().to_gate(&names, now);
        if asked.is_empty() {
            return Ok(());
        }
        let asks: Vec<(String, GateAsk)> = asked
            .into_iter()
            .filter_map(|name| {
                let i = names.iter().position(|n| *n == name)?;
                let source = self.gateway.source(&name)?;
                let want = u32::try_from(wants.starts[i].0).unwrap_or(u32::MAX);
                let grace = self.lease_grace().map_or(GRACE_MS, millis);
                let ask = GateAsk {
                    want,
                    rate: source.rate.map(|(rate, burst)| (rate.per_ms(), burst)),
                    probe_until: now
                        .saturating_add(millis(source.forward_timeout))
                        .saturating_add(grace),
                };
                Some((name, ask))
            })
            .collect();
        let answers = join_all(asks.iter().map(|(lane, ask)| lanes.gate(lane, ask, now))).await;
        let mut failed = None;
        let mut ok = 0;
        let mut allowed: Vec<(String, Option<u32>)> = Vec::new();
        let mut probing = Vec::new();
        {
            let mut schedule = self.schedule();
            for ((lane, _), answer) in asks.iter().zip(answers) {
                let gate = match answer {
                    Ok(gate) => {
                        ok += 1;
                        gate
                    }
                    Err(e) => {
                        tracing::debug!(source = %lane, error = %e.chain(), "cannot ask the fleet's lane state; the lane waits");
                        failed.get_or_insert(e);
                        LaneGate {
                            granted: 0,
                            state: LaneState::Limited,
                            until: now.saturating_add(GATE_RETRY_MS),
                            failures: 0,
                            transition: None,
                        }
                    }
                };
                schedule.apply_gate(lane, &gate, now);
                self.metrics.fleet_gate(lane, gate.state.as_str());
                if gate.state == LaneState::Probe {
                    probing.push(lane.clone());
                }
                allowed.push((lane.clone(), Some(gate.granted)));
                if gate.state != LaneState::Open && gate.state != LaneState::Probe {
                    let at = gate.until;
                    if at > now {
                        wants.reopens_at = Some(wants.reopens_at.map_or(at, |r| r.min(at)));
                    }
                }
            }
        }
        for lane in probing {
            log_transition(&self.gateway, &lane, Transition::Probing, now);
        }
        if ok == 0
            && let Some(e) = failed
        {
            return Err(e);
        }
        // Keep what may start, as granted.
        let mut keep = Vec::new();
        for (i, (name, _)) in wants.reads.iter().enumerate() {
            let granted = allowed
                .iter()
                .find(|(l, _)| l == name)
                .and_then(|(_, g)| *g);
            match granted {
                Some(0) => {}
                Some(g) => keep.push((i, Some(g as usize))),
                None => keep.push((i, None)),
            }
        }
        let reads = std::mem::take(&mut wants.reads);
        let starts = std::mem::take(&mut wants.starts);
        for (i, granted) in keep {
            let (start, ahead) = starts[i];
            wants.reads.push(reads[i].clone());
            wants
                .starts
                .push((granted.map_or(start, |g| g.min(start)), ahead));
        }
        Ok(())
    }

    /// After a pick: gives the fleet back what this pass was granted and
    /// did not start (tokens, a probe), in the background.
    pub(super) fn return_unused(self: &Arc<Self>) {
        let unused = self.schedule().unused_grants();
        for (lane, left, probe) in unused {
            let has_rate = self.gateway.source(&lane).is_some_and(|s| s.rate.is_some());
            if probe {
                self.report_lane(&lane, Outcome::Neutral);
            }
            if left > 0 && has_rate {
                let n = u32::try_from(left).unwrap_or(u32::MAX);
                self.report_lane(&lane, Outcome::Refund(n));
            }
        }
    }

    /// Reports `outcome` of `lane` to the fleet in the background; logs and
    /// alerts the breaker transition it made, if any.
    pub(super) fn report_lane(self: &Arc<Self>, lane: &str, outcome: Outcome) {
        let Some(source) = self.gateway.source(lane) else {
            return;
        };
        let report = LaneReport {
            outcome,
            pause_after: source.pause_after,
            backoff_min_ms: millis(source.backoff_min),
            backoff_max_ms: millis(source.backoff_max),
        };
        let this = self.clone();
        let lane = lane.to_owned();
        tokio::spawn(async move {
            let Some(lanes) = this.gateway.inbox.lanes() else {
                return;
            };
            let now = this.clock.now_ms();
            match lanes.report(&lane, &report, now).await {
                Ok(gate) => {
                    this.schedule().saw_report(&lane, &gate, now);
                    let t = match gate.transition {
                        Some(LaneTransition::Paused) => Some(Transition::Paused {
                            failures: gate.failures,
                            until: gate.until,
                        }),
                        Some(LaneTransition::PausedAgain) => {
                            Some(Transition::PausedAgain { until: gate.until })
                        }
                        Some(LaneTransition::Resumed) => Some(Transition::Resumed),
                        None => None,
                    };
                    if let Some(t) = t {
                        log_transition(&this.gateway, &lane, t, now);
                    }
                    if gate.state != LaneState::Open {
                        this.gateway.wake.notify_one();
                    }
                }
                Err(e) => {
                    tracing::debug!(source = %lane, error = %e.chain(), "cannot report a delivery's outcome to the fleet's lane state");
                }
            }
        });
    }

    /// Hands the outcome of `source`'s turn of `event_id` to the fleet, if
    /// it is the fleet's business (see `Schedule::fleet_outcome`).
    pub(super) fn report_turn(
        self: &Arc<Self>,
        source: &str,
        event_id: &str,
        reached: super::schedule::Reached,
    ) {
        if self.gateway.inbox.lanes().is_none() {
            return;
        }
        let outcome = self.schedule().fleet_outcome(source, event_id, reached);
        if let Some(outcome) = outcome {
            self.report_lane(source, outcome);
        }
    }

    /// Forgets the fleet's state of `lanes` (their destination changed).
    pub(super) fn reset_lanes(&self, lanes: Vec<String>) {
        if lanes.is_empty() || self.gateway.inbox.lanes().is_none() {
            return;
        }
        let gateway = self.gateway.clone();
        tokio::spawn(async move {
            let Some(store) = gateway.inbox.lanes() else {
                return;
            };
            for lane in lanes {
                let Some(source) = gateway.source(&lane) else {
                    continue;
                };
                let destination = destination_id(&source.forward_to);
                match store.reset(&lane, &destination).await {
                    Ok(true) => {
                        tracing::info!(source = %lane, "destination changed: the fleet's breaker and Retry-After hold of it start over")
                    }
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!(source = %lane, error = %e.chain(), "cannot reset the fleet's state of a lane whose destination changed");
                    }
                }
            }
        });
    }
}
