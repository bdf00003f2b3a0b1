//! A lane's share of the fleet (the shared inbox): its `Retry-After` hold,
//! its rate limit and its breaker are the fleet's, kept in the store
//! ([`crate::store::lanes`]). Every pass that would start deliveries of a
//! lane asks its gate first, so a hold or a pause written by any instance
//! stops the others at their next pass. The schedule keeps what the fleet
//! last said, so that a lane the fleet holds back is not even read until
//! then, and what this pass was granted, so that the pick starts no more.

use super::{Lane, Reached, Schedule, State};
use crate::clock::Millis;
use crate::domain::Rate;
use crate::store::lanes::{LaneGate, LaneState, Outcome};

/// How long an answer "open" of a lane without a rate limit stands before
/// the gate is asked again. Asking at every pass cost Redis 45 µs of CPU
/// per delivered event (a pass starts one or two events, and passes come
/// at every answer: benches/fleet.rs, shared inbox × 3, end to end 0.88×);
/// standing 50 ms, a hold or a pause elsewhere is seen within it (the
/// requests this instance started in those 50 ms are already out). With a
/// rate limit every pass asks: the tokens are the fleet's.
pub const OPEN_FRESH_MS: Millis = 50;
/// Longest a lane waits on another instance's probe before asking again:
/// the probe's success is seen within it.
pub const PROBING_FRESH_MS: Millis = 500;
/// Longest a lane waits on a pause before asking again: a success
/// elsewhere (a request started before the pause, answered 2xx) resumes
/// the fleet's breaker before the pause ends, and is seen within it.
pub const PAUSED_FRESH_MS: Millis = 1_000;
/// Longest a lane waits on a `Retry-After` hold or an empty bucket before
/// asking again: an operator who deletes the lane's key, or a hold an
/// instance wrote with a clock far ahead that expires early, is seen
/// within it, not at the end the answer named.
pub const HELD_FRESH_MS: Millis = 5_000;

/// What the fleet last said of a lane, and this pass's grant.
#[derive(Debug, Default)]
pub(in crate::gateway::delivery) struct LaneFleet {
    /// The lane's `rate_limit` and burst (the fleet's bucket counts them).
    pub(super) rate: Option<(Rate, u32)>,
    /// This pass's grant: starts at most this many (`None`: no gate was
    /// asked this pass; the last "open" still stands).
    pub(super) granted: Option<usize>,
    /// The grant is the probe of a paused lane: the next pick is it.
    probe_granted: bool,
    /// This instance's probe in flight, by event id.
    probe: Option<String>,
    /// The last answer's state, and until when it holds.
    state: Option<(LaneState, Millis)>,
    /// Consecutive failures, fleet-wide, as last seen: a success is worth
    /// reporting only when there were some.
    failures: u32,
    /// Until when an "open" (without a rate limit) stands without asking.
    open_until: Millis,
    /// A `Retry-After` this instance was given, to report with the failure.
    hold: Option<Millis>,
}

impl LaneFleet {
    /// Whether the fleet holds the lane back (held, paused, another's probe
    /// out): nothing is leased ahead for it.
    pub(super) fn holds_back(&self) -> bool {
        matches!(
            self.state,
            Some((
                LaneState::Held | LaneState::Paused | LaneState::Probing | LaneState::Probe,
                _
            ))
        )
    }

    /// Until when the lane starts nothing at `now`, as the fleet last said;
    /// past it, the gate is asked again.
    pub(super) fn waits(&mut self, now: Millis) -> Option<Millis> {
        match self.state {
            Some((
                LaneState::Held | LaneState::Paused | LaneState::Limited | LaneState::Probing,
                until,
            )) if until > now => Some(until),
            _ => None,
        }
    }

    /// A pick of this lane started `event_id`.
    pub(super) fn started(&mut self, event_id: &str) {
        if let Some(g) = &mut self.granted {
            *g = g.saturating_sub(1);
        }
        if std::mem::take(&mut self.probe_granted) {
            self.probe = Some(event_id.to_owned());
        }
    }

    /// Takes an answer of the fleet's at `now`.
    fn saw(&mut self, gate: &LaneGate, now: Millis) {
        self.failures = gate.failures;
        // Another's probe may succeed any time: asked again soon.
        let until = match gate.state {
            LaneState::Probing => gate.until.min(now + PROBING_FRESH_MS),
            LaneState::Paused => gate.until.min(now + PAUSED_FRESH_MS),
            LaneState::Held | LaneState::Limited => gate.until.min(now + HELD_FRESH_MS),
            _ => gate.until,
        };
        self.state = Some((gate.state, until));
        self.open_until = if gate.state == LaneState::Open && self.rate.is_none() {
            now + OPEN_FRESH_MS
        } else {
            0
        };
    }
}

/// What the fleet last said of a lane, for the operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FleetSeen {
    pub state: LaneState,
    pub until: Millis,
    pub failures: u32,
}

impl Lane {
    fn fleet_mut(&mut self) -> Option<&mut LaneFleet> {
        self.fleet.as_mut()
    }
}

impl Schedule {
    /// Lanes in `lanes` whose gate must be asked at `now` before they
    /// start anything: those with a fleet share, unless an "open" of a
    /// lane without a rate limit still stands ([`OPEN_FRESH_MS`]).
    pub fn to_gate(&self, lanes: &[String], now: Millis) -> Vec<String> {
        lanes
            .iter()
            .filter(|name| {
                self.lane(name)
                    .and_then(|l| l.fleet.as_ref())
                    .is_some_and(|f| f.rate.is_some() || now >= f.open_until)
            })
            .cloned()
            .collect()
    }

    fn lane(&self, name: &str) -> Option<&Lane> {
        self.lanes.iter().find(|(l, _)| l == name).map(|(_, l)| l)
    }

    fn lane_mut(&mut self, name: &str) -> Option<&mut Lane> {
        self.lanes
            .iter_mut()
            .find(|(l, _)| l == name)
            .map(|(_, l)| l)
    }

    /// Takes the fleet's answer to a gate of `source` at `now`: this pass
    /// starts at most `gate.granted` of it.
    pub fn apply_gate(&mut self, source: &str, gate: &LaneGate, now: Millis) {
        if let Some(f) = self.lane_mut(source).and_then(Lane::fleet_mut) {
            f.saw(gate, now);
            f.granted = Some(gate.granted as usize);
            f.probe_granted = gate.state == LaneState::Probe && gate.granted > 0;
        }
    }

    /// Takes the fleet's answer to a report of `source` at `now` (its
    /// state, not a grant).
    pub fn saw_report(&mut self, source: &str, gate: &LaneGate, now: Millis) {
        if let Some(f) = self.lane_mut(source).and_then(Lane::fleet_mut) {
            f.saw(gate, now);
        }
    }

    /// After a pick: per lane, the grant it did not use (tokens to give
    /// back), and whether that was the probe (to hand it on). Clears the
    /// pass's grants.
    pub fn unused_grants(&mut self) -> Vec<(String, usize, bool)> {
        let mut unused = Vec::new();
        for (name, lane) in &mut self.lanes {
            if let Some(f) = &mut lane.fleet {
                let left = f.granted.take().unwrap_or(0);
                let probe = std::mem::take(&mut f.probe_granted);
                if left > 0 || probe {
                    unused.push((name.clone(), left, probe));
                }
            }
        }
        unused
    }

    /// A `Retry-After` this instance was given for `source`, to report to
    /// the fleet with the failure.
    pub fn fleet_hold(&mut self, source: &str, until: Millis) {
        if let Some(f) = self.lane_mut(source).and_then(Lane::fleet_mut) {
            f.hold = Some(f.hold.map_or(until, |h| h.max(until)));
        }
    }

    /// What to report to the fleet of `source`'s turn of `event_id` that
    /// reached `reached`, asked once, before [`Schedule::answered`]: a
    /// failure always; a success when the fleet counted failures or it was
    /// this instance's probe; a turn that sent nothing only when it was the
    /// probe. `None` without a fleet, or once answered.
    pub fn fleet_outcome(
        &mut self,
        source: &str,
        event_id: &str,
        reached: Reached,
    ) -> Option<Outcome> {
        if !self
            .requests
            .contains(&(source.to_owned(), event_id.to_owned()))
        {
            return None;
        }
        let f = self.lane_mut(source).and_then(Lane::fleet_mut)?;
        let was_probe = f.probe.as_deref() == Some(event_id);
        if was_probe {
            f.probe = None;
        }
        match reached {
            Reached::Failure => Some(Outcome::Failed {
                hold_until: f.hold.take(),
            }),
            Reached::Success if was_probe || f.failures > 0 => Some(Outcome::Succeeded),
            Reached::Nothing if was_probe => Some(Outcome::Neutral),
            _ => None,
        }
    }

    /// What the fleet last said of `source`, if it has a share.
    pub fn fleet_seen(&self, source: &str) -> Option<FleetSeen> {
        let f = self.lane(source)?.fleet.as_ref()?;
        let (state, until) = f.state?;
        Some(FleetSeen {
            state,
            until,
            failures: f.failures,
        })
    }
}

/// The breaker's state as the operator sees it, from the fleet's answer.
pub fn circuit_state(seen: &FleetSeen, now: Millis) -> State {
    match seen.state {
        LaneState::Paused if seen.until > now => State::Open { until: seen.until },
        LaneState::Paused | LaneState::Probing => State::Probing { in_flight: true },
        LaneState::Probe => State::Probing { in_flight: true },
        _ => State::Closed,
    }
}

#[cfg(test)]
mod tests {
    use super::super::LaneConfig;
    use super::super::tests::ev;
    use super::*;
    use crate::store::lanes::LaneTransition;

    fn fleet_lane(name: &str, limit: usize, rate: Option<(Rate, u32)>) -> Schedule {
        let mut s = Schedule::new(100, []);
        s.reconfigure(
            vec![LaneConfig {
                name: name.into(),
                limit,
                pause_after: 2,
                rate,
                new_destination: false,
                fleet: true,
            }],
            0,
        );
        s
    }

    fn gate(granted: u32, state: LaneState, until: Millis) -> LaneGate {
        LaneGate {
            granted,
            state,
            until,
            failures: 0,
            transition: None,
        }
    }

    fn pause(_: u32) -> Millis {
        1_000
    }

    #[test]
    fn a_fleet_lane_starts_what_it_was_granted_and_gives_back_the_rest() {
        let rate = Some(("10/s".parse().unwrap(), 5));
        let mut s = fleet_lane("a", 10, rate);
        // No local bucket: the fleet's gate decides.
        let w = s.wants(0);
        assert_eq!(
            w.starts,
            [(10, 80)],
            "8 ahead per slot, under 10 s of tokens"
        );
        assert_eq!(s.to_gate(&["a".into()], 0), ["a"]);
        s.apply_gate("a", &gate(2, LaneState::Open, 0), 0);
        let candidates = vec![(
            "a".into(),
            (0..5).map(|i| ev("a", &format!("e{i}"), None)).collect(),
        )];
        let (picked, _) = s.pick_keep(candidates);
        assert_eq!(picked.len(), 2);
        assert!(s.unused_grants().is_empty(), "both used");
        s.apply_gate("a", &gate(3, LaneState::Open, 0), 1);
        let (picked, _) = s.pick_keep(vec![("a".into(), vec![ev("a", "x", None)])]);
        assert_eq!(picked.len(), 1);
        assert_eq!(s.unused_grants(), [("a".to_owned(), 2, false)]);
        // A grant is for one pass: cleared, the next pass asks again (with
        // a rate limit, at once: the tokens are the fleet's).
        assert_eq!(s.to_gate(&["a".into()], 2), ["a"]);
    }

    #[test]
    fn an_open_answer_stands_50_ms_and_a_held_one_until_its_end() {
        let mut s = fleet_lane("a", 4, None);
        s.apply_gate("a", &gate(4, LaneState::Open, 0), 1_000);
        s.unused_grants();
        // Without a rate limit: another instance may be told to hold off
        // any time; this one knows within 50 ms.
        assert!(
            s.to_gate(&["a".into()], 1_000 + OPEN_FRESH_MS - 1)
                .is_empty()
        );
        assert_eq!(s.to_gate(&["a".into()], 1_000 + OPEN_FRESH_MS), ["a"]);
        assert_eq!(s.wants(1_001).reads.len(), 1, "open: read");
        s.apply_gate("a", &gate(0, LaneState::Held, 5_000), 1_300);
        s.unused_grants();
        let w = s.wants(2_000);
        assert!(w.reads.is_empty(), "held: not even read");
        assert_eq!(w.reopens_at, Some(5_000));
        assert_eq!(s.wants(5_000).reads.len(), 1);
        // Another's probe: asked again within half a second.
        s.apply_gate("a", &gate(0, LaneState::Probing, 60_000), 6_000);
        assert_eq!(s.wants(6_100).reopens_at, Some(6_000 + PROBING_FRESH_MS));
        // A pause of a minute: asked again within a second, so that a
        // resume by another instance's probe is seen that soon.
        s.apply_gate("a", &gate(0, LaneState::Paused, 70_000), 7_000);
        assert_eq!(s.wants(7_100).reopens_at, Some(7_000 + PAUSED_FRESH_MS));
        assert!(s.wants(7_000 + PAUSED_FRESH_MS - 1).reads.is_empty());
        assert_eq!(s.wants(7_000 + PAUSED_FRESH_MS).reads.len(), 1);
        // A pause ending sooner than that: asked at its end.
        s.apply_gate("a", &gate(0, LaneState::Paused, 8_300), 8_000);
        assert_eq!(s.wants(8_100).reopens_at, Some(8_300));
        // A hold of an hour (or one from a clock far ahead): asked again
        // within five seconds, so that its key deleted is seen that soon.
        s.apply_gate("a", &gate(0, LaneState::Held, 3_609_000), 9_000);
        assert_eq!(s.wants(9_100).reopens_at, Some(9_000 + HELD_FRESH_MS));
        assert_eq!(s.wants(9_000 + HELD_FRESH_MS).reads.len(), 1);
    }

    #[test]
    fn failures_are_reported_always_successes_only_when_the_fleet_counts_failures() {
        let mut s = fleet_lane("a", 4, None);
        s.apply_gate("a", &gate(4, LaneState::Open, 0), 0);
        let (picked, _) = s.pick_keep(vec![(
            "a".into(),
            (0..4).map(|i| ev("a", &format!("e{i}"), None)).collect(),
        )]);
        assert_eq!(picked.len(), 4);
        s.fleet_hold("a", 9_000);
        assert_eq!(
            s.fleet_outcome("a", "e0", Reached::Failure),
            Some(Outcome::Failed {
                hold_until: Some(9_000)
            })
        );
        // The local breaker never opens: the fleet's does.
        assert_eq!(s.answered("a", "e0", Reached::Failure, 0, pause), None);
        assert_eq!(s.answered("a", "e1", Reached::Failure, 0, pause), None);
        assert_eq!(s.view("a").unwrap().state, State::Closed);
        assert_eq!(s.fleet_outcome("a", "e0", Reached::Failure), None, "once");
        assert_eq!(
            s.fleet_outcome("a", "e2", Reached::Success),
            None,
            "no failures seen"
        );
        let mut failing = gate(0, LaneState::Open, 0);
        failing.failures = 2;
        failing.transition = Some(LaneTransition::Paused);
        s.saw_report("a", &failing, 0);
        assert_eq!(
            s.fleet_outcome("a", "e3", Reached::Success),
            Some(Outcome::Succeeded)
        );
    }

    #[test]
    fn the_probe_is_the_next_pick_and_its_end_is_reported_whatever_it_reached() {
        let mut s = fleet_lane("a", 4, None);
        s.apply_gate("a", &gate(1, LaneState::Probe, 30_000), 0);
        assert_eq!(
            s.wants(0).starts[0].1,
            0,
            "nothing held ahead while probing"
        );
        let (picked, _) = s.pick_keep(vec![(
            "a".into(),
            vec![ev("a", "p", None), ev("a", "q", None)],
        )]);
        assert_eq!(ids_of(&picked), ["p"]);
        assert!(s.unused_grants().is_empty());
        assert_eq!(
            s.fleet_outcome("a", "p", Reached::Nothing),
            Some(Outcome::Neutral)
        );
        // Granted and not used: handed on.
        s.apply_gate("a", &gate(1, LaneState::Probe, 30_000), 1);
        let (picked, _) = s.pick_keep(vec![("a".into(), Vec::new())]);
        assert!(picked.is_empty());
        assert_eq!(s.unused_grants(), [("a".to_owned(), 1, true)]);
        let seen = s.fleet_seen("a").unwrap();
        assert_eq!(circuit_state(&seen, 2), State::Probing { in_flight: true });
    }

    fn ids_of(v: &[crate::store::inbox::InboxEvent]) -> Vec<&str> {
        v.iter().map(|e| e.event_id.as_str()).collect()
    }
}
