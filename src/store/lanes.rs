//! A delivery lane's state shared by a fleet (`gateway.inbox = "shared"`):
//! what the destination asked (`Retry-After`), its `rate_limit` as one
//! token bucket, and its circuit breaker, kept where every instance that
//! delivers the lane reads and writes it, so the fleet acts as one sender.
//!
//! An instance asks [`Lanes::gate`] before it starts deliveries of a lane
//! and tells [`Lanes::report`] how they went. Each call is one atomic step
//! on the lane's own state, so the fleet starts at most `burst + rate × t`
//! deliveries of a lane in any `t`, one probe at a time decides whether a
//! paused destination is back, and a transition (paused, resumed) is
//! answered to exactly one caller, which logs and alerts it.
//!
//! Where the inbox is this process's own, the scheduler keeps all of this
//! in memory and [`super::inbox::Inbox::lanes`] is `None`.

use async_trait::async_trait;

use super::StoreError;
use crate::clock::Millis;

/// What an instance asks before it starts deliveries of a lane.
#[derive(Debug, Clone, PartialEq)]
pub struct GateAsk {
    /// How many it could start now (its own limits allowing).
    pub want: u32,
    /// The lane's `rate_limit` in deliveries per millisecond, and its
    /// burst; `None` without one. A change keeps the tokens, up to the new
    /// burst.
    pub rate: Option<(f64, u32)>,
    /// If this caller takes the probe of a paused lane: when its hold on
    /// the probe ends unless it reports first (the probe's timeout and a
    /// margin), so a dead holder does not keep the lane paused.
    pub probe_until: Millis,
}

/// Where a lane is, fleet-wide, as a gate or a report saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaneState {
    /// Deliveries may start (as many as granted).
    Open,
    /// The destination asked (`Retry-After`) to be left alone until `until`.
    Held,
    /// The breaker is open: paused until `until`.
    Paused,
    /// The pause is over and this caller holds the probe (granted 1).
    Probe,
    /// The pause is over and another instance's probe is out, held until
    /// `until` at the latest.
    Probing,
    /// No token left: the next one comes at `until`.
    Limited,
}

impl LaneState {
    /// Its name in metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Held => "held",
            Self::Paused => "paused",
            Self::Probe => "probe",
            Self::Probing => "probing",
            Self::Limited => "limited",
        }
    }
}

/// A breaker transition, answered to the one caller whose report made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaneTransition {
    /// Closed → paused after `failures` consecutive failed attempts.
    Paused,
    /// The probe failed: paused again, for longer.
    PausedAgain,
    /// A delivery succeeded while paused or probing: closed.
    Resumed,
}

/// A lane's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneGate {
    /// Deliveries the caller may start now (at most what it wanted).
    pub granted: u32,
    pub state: LaneState,
    /// Until when `state` holds (0 for [`LaneState::Open`]).
    pub until: Millis,
    /// Consecutive failed attempts, fleet-wide.
    pub failures: u32,
    /// What the caller's report changed, if anything.
    pub transition: Option<LaneTransition>,
}

/// How deliveries of a lane went, as an instance reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// An attempt failed; the destination asked to be left alone until
    /// `hold_until` (`Retry-After`), if it did.
    Failed { hold_until: Option<Millis> },
    /// The destination answered 2xx.
    Succeeded,
    /// The caller's probe ended without a request (stale, lease lost), or
    /// it was granted and not used: another caller may take it.
    Neutral,
    /// Tokens granted but not used (nothing to start after all): back to
    /// the bucket, up to the burst.
    Refund(u32),
}

/// A report, with the lane's settings the breaker needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneReport {
    pub outcome: Outcome,
    /// `pause_after`: consecutive failures that pause the lane (0: never).
    pub pause_after: u32,
    /// `backoff_min` and `backoff_max`, ms: the pause after the n-th
    /// opening in a row is `min · 2^(n−1)`, at most `max`.
    pub backoff_min_ms: Millis,
    pub backoff_max_ms: Millis,
}

/// A lane's fleet-wide state, read only (for the operator).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FleetLane {
    /// `Retry-After` hold, while it lasts.
    pub held_until: Option<Millis>,
    /// The breaker's pause, while it lasts.
    pub paused_until: Option<Millis>,
    /// The breaker is open and its pause over: one probe decides.
    pub probing: bool,
    /// Consecutive failed attempts.
    pub failures: u32,
    /// With a rate limit and no token left: when the next one comes.
    pub rate_limited_until: Option<Millis>,
}

/// The fleet's shared lane state.
#[async_trait]
pub trait Lanes: Send + Sync + std::fmt::Debug {
    /// Asks to start up to `ask.want` deliveries of `lane` at `now`.
    async fn gate(&self, lane: &str, ask: &GateAsk, now: Millis) -> Result<LaneGate, StoreError>;

    /// Reports how deliveries of `lane` went at `now`.
    async fn report(
        &self,
        lane: &str,
        report: &LaneReport,
        now: Millis,
    ) -> Result<LaneGate, StoreError>;

    /// `lane`'s state at `now`, changing nothing.
    async fn state(&self, lane: &str, now: Millis) -> Result<FleetLane, StoreError>;

    /// Forgets `lane`'s state once its destination changed to
    /// `destination` (an id of it): the breaker and a hold were about the
    /// old one. Only the first instance to ask forgets; the others, asking
    /// with the same destination later in a rolling reload, find the state
    /// already about it and keep it. Answers whether it forgot.
    async fn reset(&self, lane: &str, destination: &str) -> Result<bool, StoreError>;
}
