//! A circuit breaker per source: after `pause_after` consecutive failed
//! attempts the source's deliveries pause as a whole, then one probe
//! delivery tests whether the destination is back.
//!
//! Closed → (threshold failures) → Open until a pause ends → Probing, one
//! delivery at a time → a 2xx closes it; a failure opens it again with a
//! longer pause. While open, no delivery starts, so pending events keep
//! their attempts. Time is the caller's clock reading, so tests drive it.

use crate::clock::Millis;

/// Where a source's circuit is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Deliveries run.
    Closed,
    /// Paused until this time (Unix ms).
    Open {
        /// When the pause ends and a probe may start.
        until: Millis,
    },
    /// One probe delivery at a time tests the destination.
    Probing {
        /// Whether the probe is in flight.
        in_flight: bool,
    },
}

/// A change worth one log line (and nothing per event).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// Closed → open after this many consecutive failures.
    Paused {
        /// Consecutive failed attempts.
        failures: u32,
        /// When a probe may start.
        until: Millis,
    },
    /// Open → probing: the pause ended.
    Probing,
    /// The probe failed: open again, for longer.
    PausedAgain {
        /// When the next probe may start.
        until: Millis,
    },
    /// A delivery succeeded while paused or probing: closed again.
    Resumed,
}

/// One source's circuit.
#[derive(Debug, Clone)]
pub struct Circuit {
    /// Consecutive failures that open it; 0 never does.
    threshold: u32,
    /// Consecutive failed attempts so far.
    failures: u32,
    /// Times it opened since it was last closed: the pause grows with it.
    trips: u32,
    /// Where it is.
    state: State,
}

impl Circuit {
    /// A closed circuit that opens after `threshold` consecutive failures
    /// (0: never).
    pub fn new(threshold: u32) -> Self {
        Self {
            threshold,
            failures: 0,
            trips: 0,
            state: State::Closed,
        }
    }

    /// Opens after `threshold` consecutive failures from now on (a
    /// reload changed `pause_after`); where it is and what it counted stay.
    pub fn set_threshold(&mut self, threshold: u32) {
        self.threshold = threshold;
    }

    /// Where it is now.
    pub fn state(&self) -> State {
        self.state
    }

    /// Consecutive failed attempts.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// How many of `free` slots may start a delivery at `now`; an open
    /// circuit whose pause ended turns to probing here.
    pub fn allowance(&mut self, free: usize, now: Millis) -> (usize, Option<Transition>) {
        match self.state {
            State::Closed => (free, None),
            State::Open { until } if now >= until => {
                self.state = State::Probing { in_flight: false };
                (free.min(1), Some(Transition::Probing))
            }
            State::Open { .. } => (0, None),
            State::Probing { in_flight } => (if in_flight { 0 } else { free.min(1) }, None),
        }
    }

    /// A delivery started (the probe, when probing).
    pub fn started(&mut self) {
        if let State::Probing { in_flight } = &mut self.state {
            *in_flight = true;
        }
    }

    /// When an open circuit lets a probe through.
    pub fn reopens_at(&self) -> Option<Millis> {
        match self.state {
            State::Open { until } => Some(until),
            _ => None,
        }
    }

    /// The destination answered 2xx.
    pub fn succeeded(&mut self) -> Option<Transition> {
        self.failures = 0;
        self.trips = 0;
        let was = std::mem::replace(&mut self.state, State::Closed);
        (was != State::Closed).then_some(Transition::Resumed)
    }

    /// An attempt failed at `now`; `pause(trips)` is how long the circuit
    /// stays open after its `trips`-th opening in a row.
    pub fn failed(&mut self, now: Millis, pause: impl Fn(u32) -> Millis) -> Option<Transition> {
        self.failures = self.failures.saturating_add(1);
        match self.state {
            State::Closed if self.threshold > 0 && self.failures >= self.threshold => {
                self.trips = 1;
                let until = now.saturating_add(pause(self.trips));
                self.state = State::Open { until };
                Some(Transition::Paused {
                    failures: self.failures,
                    until,
                })
            }
            State::Probing { .. } => {
                self.trips = self.trips.saturating_add(1);
                let until = now.saturating_add(pause(self.trips));
                self.state = State::Open { until };
                Some(Transition::PausedAgain { until })
            }
            _ => None,
        }
    }

    /// A turn ended without reaching the destination (stale, store busy):
    /// a probe slot is free again, nothing else changes.
    pub fn neutral(&mut self) {
        if let State::Probing { in_flight } = &mut self.state {
            *in_flight = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pause(trips: u32) -> Millis {
        1_000 * u64::from(trips)
    }

    #[test]
    fn it_opens_after_the_threshold_of_consecutive_failures_only() {
        let mut c = Circuit::new(3);
        assert_eq!(c.failed(0, pause), None);
        assert_eq!(c.failed(0, pause), None);
        assert_eq!(c.allowance(16, 0).0, 16);
        assert_eq!(
            c.failed(10, pause),
            Some(Transition::Paused {
                failures: 3,
                until: 1_010
            })
        );
        assert_eq!(c.allowance(16, 500), (0, None));
    }

    #[test]
    fn a_success_resets_the_count_of_failures() {
        let mut c = Circuit::new(3);
        c.failed(0, pause);
        c.failed(0, pause);
        assert_eq!(c.succeeded(), None, "closed stays closed: nothing to log");
        c.failed(0, pause);
        c.failed(0, pause);
        assert_eq!(c.state(), State::Closed);
    }

    #[test]
    fn after_the_pause_exactly_one_probe_runs() {
        let mut c = Circuit::new(1);
        c.failed(0, pause);
        assert_eq!(c.allowance(16, 999), (0, None));
        assert_eq!(c.reopens_at(), Some(1_000));
        assert_eq!(c.allowance(16, 1_000), (1, Some(Transition::Probing)));
        c.started();
        assert_eq!(c.allowance(16, 1_001), (0, None), "one probe at a time");
    }

    #[test]
    fn a_failed_probe_pauses_again_for_longer_and_a_good_one_resumes() {
        let mut c = Circuit::new(1);
        c.failed(0, pause);
        c.allowance(16, 1_000);
        c.started();
        assert_eq!(
            c.failed(1_000, pause),
            Some(Transition::PausedAgain { until: 3_000 })
        );
        assert_eq!(c.allowance(16, 2_999).0, 0);
        assert_eq!(c.allowance(16, 3_000), (1, Some(Transition::Probing)));
        c.started();
        assert_eq!(c.succeeded(), Some(Transition::Resumed));
        assert_eq!(c.allowance(16, 3_000), (16, None));
        // Closed again: the next trip starts from the shortest pause.
        c.failed(5_000, pause);
        assert_eq!(c.reopens_at(), Some(6_000));
    }

    #[test]
    fn a_probe_that_never_reached_the_destination_frees_the_probe_slot() {
        let mut c = Circuit::new(1);
        c.failed(0, pause);
        c.allowance(4, 1_000);
        c.started();
        c.neutral();
        assert_eq!(c.allowance(4, 1_000), (1, None));
        assert!(matches!(c.state(), State::Probing { .. }));
    }

    #[test]
    fn a_threshold_of_zero_never_pauses() {
        let mut c = Circuit::new(0);
        for _ in 0..100 {
            assert_eq!(c.failed(0, pause), None);
        }
        assert_eq!(c.allowance(8, 0), (8, None));
    }
}
