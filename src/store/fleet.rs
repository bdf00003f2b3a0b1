//! State the instances of one fleet share (`gateway.inbox = "shared"`):
//! the [`Fleet`] trait, reached through [`Inbox::fleet`](super::inbox::Inbox::fleet).
//! Where the inbox is this process's own there is no fleet, and the
//! callers keep their per-process state.
//!
//! As every store method, each takes `now` (Unix ms) from the caller's
//! clock: the store never reads time itself, so the same inputs give the
//! same answers, and tests move time by hand.

use async_trait::async_trait;

use super::StoreError;
use crate::clock::Millis;

/// What the instances of a fleet agree on through the store.
#[async_trait]
pub trait Fleet: Send + Sync + std::fmt::Debug {
    /// Whether this instance sends an alert of `kind` about `source` now,
    /// so that the fleet sends at most one per `every_ms` and the last
    /// one folded is never lost (see [`AlertTurn`]).
    ///
    /// `local_folded`: alerts this instance folded into this one already
    /// (the fleet has not counted them). With [`AlertMode::Raise`], an
    /// alert the fleet has not seen; with [`AlertMode::Flush`], one the
    /// fleet folded earlier (answered [`AlertTurn::Fold`]) and counted
    /// then, asked again at or after that answer's `until`.
    async fn alert_turn(
        &self,
        kind: &str,
        source: Option<&str>,
        every_ms: u64,
        mode: AlertMode,
        local_folded: u64,
        now: Millis,
    ) -> Result<AlertTurn, StoreError>;
}

/// How an alert is put to [`Fleet::alert_turn`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlertMode {
    /// A new alert: it is sent if the fleet's interval for its kind and
    /// source is over (or never started), else folded and counted.
    Raise,
    /// An alert folded earlier, at its interval's end: sent with the count
    /// of those folded, unless another instance sent them already.
    Flush,
}

/// The fleet's answer to [`Fleet::alert_turn`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlertTurn {
    /// Send it now, its `suppressed` the alerts folded into it across the
    /// fleet (this instance's `local_folded` among them); a new interval
    /// starts.
    Send {
        /// Alerts of this kind and source folded into this one.
        suppressed: u64,
    },
    /// Folded and counted: keep it, and ask again with
    /// [`AlertMode::Flush`] at `until` (Unix ms), the interval's end.
    Fold {
        /// When the fleet's interval ends.
        until: Millis,
    },
    /// Drop it: another instance sent an alert that counted it.
    Gone,
}
