//! The fleet's shared lane state ([`crate::store::lanes`]) in Redis: one
//! hash per lane, `P:{d:LANE}`, changed only by `lanes.lua`. A lane name
//! is `SOURCE` or `SOURCE.DESTINATION`, of `[A-Za-z0-9_.-]`, so it cannot
//! end the hash tag; each lane is one slot, and a cluster spreads the
//! lanes over its masters.

use std::sync::Arc;

use async_trait::async_trait;
use redis::Script;

use super::client::Client;
use crate::clock::Millis;
use crate::store::StoreError;
use crate::store::lanes::{
    FleetLane, GateAsk, LaneGate, LaneReport, LaneState, LaneTransition, Lanes, Outcome,
};

/// No time `lanes.lua` writes is further ahead than this (its `HORIZON`).
const HORIZON_MS: Millis = 31 * 86_400_000;

/// The lanes' state in Redis.
pub struct RedisLanes {
    client: Arc<Client>,
    script: Script,
    /// This process, as the holder of a probe: random per start, so a
    /// restarted instance never finishes its previous life's probe.
    me: String,
}

impl std::fmt::Debug for RedisLanes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLanes")
            .field("me", &self.me)
            .finish_non_exhaustive()
    }
}

fn unexpected(reply: impl std::fmt::Debug) -> StoreError {
    super::client::RedisFault::Unexpected {
        what: "lanes",
        reply: vec![format!("{reply:?}")],
    }
    .into()
}

/// Reads `{granted, state, until, failures, transition}`.
fn gate_of(reply: Vec<String>) -> Result<LaneGate, StoreError> {
    let [granted, state, until, failures, transition] = reply.as_slice() else {
        return Err(unexpected(reply));
    };
    let num = |s: &str| s.parse::<u64>().ok();
    let (Some(granted), Some(until), Some(failures)) = (num(granted), num(until), num(failures))
    else {
        return Err(unexpected(reply));
    };
    let state = match state.as_str() {
        "open" => LaneState::Open,
        "held" => LaneState::Held,
        "paused" => LaneState::Paused,
        "probe" => LaneState::Probe,
        "probing" => LaneState::Probing,
        "limited" => LaneState::Limited,
        _ => return Err(unexpected(reply)),
    };
    let transition = match transition.as_str() {
        "" => None,
        "paused" => Some(LaneTransition::Paused),
        "paused_again" => Some(LaneTransition::PausedAgain),
        "resumed" => Some(LaneTransition::Resumed),
        _ => return Err(unexpected(reply)),
    };
    Ok(LaneGate {
        granted: u32::try_from(granted).unwrap_or(u32::MAX),
        state,
        until,
        failures: u32::try_from(failures).unwrap_or(u32::MAX),
        transition,
    })
}

impl RedisLanes {
    /// The lanes over `client`'s connection.
    pub fn new(client: Arc<Client>) -> Self {
        Self {
            client,
            script: Script::new(&format!(
                "{}\n{}",
                include_str!("fleet_keys.lua"),
                include_str!("lanes.lua")
            )),
            me: format!("{:016x}", rand::random::<u64>()),
        }
    }

    fn key(&self, lane: &str) -> String {
        format!("{}:{{d:{lane}}}", self.client.opts().prefix)
    }

    async fn run(&self, lane: &str, args: Vec<String>) -> Result<LaneGate, StoreError> {
        let key = self.key(lane);
        let reply: Vec<String> = self.client.run(&self.script, &[&key], &args).await?;
        gate_of(reply)
    }
}

#[async_trait]
impl Lanes for RedisLanes {
    async fn gate(&self, lane: &str, ask: &GateAsk, now: Millis) -> Result<LaneGate, StoreError> {
        let (rate, burst) = match ask.rate {
            // Exact in both directions: the script compares them as text.
            Some((per_ms, burst)) => (format!("{per_ms:e}"), burst.max(1).to_string()),
            None => (String::new(), String::new()),
        };
        let args = vec![
            "gate".to_owned(),
            now.to_string(),
            ask.want.to_string(),
            rate,
            burst,
            self.me.clone(),
            ask.probe_until.to_string(),
        ];
        self.run(lane, args).await
    }

    async fn report(
        &self,
        lane: &str,
        report: &LaneReport,
        now: Millis,
    ) -> Result<LaneGate, StoreError> {
        let (outcome, hold, refund) = match report.outcome {
            Outcome::Failed { hold_until } => ("fail", hold_until.unwrap_or(0), 0),
            Outcome::Succeeded => ("ok", 0, 0),
            Outcome::Neutral => ("neutral", 0, 0),
            Outcome::Refund(n) => ("refund", 0, n),
        };
        let args = vec![
            "report".to_owned(),
            now.to_string(),
            outcome.to_owned(),
            self.me.clone(),
            report.pause_after.to_string(),
            report.backoff_min_ms.max(1).to_string(),
            report.backoff_max_ms.max(1).to_string(),
            hold.to_string(),
            refund.to_string(),
        ];
        self.run(lane, args).await
    }

    async fn state(&self, lane: &str, now: Millis) -> Result<FleetLane, StoreError> {
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(self.key(lane))
            .arg(&["ra", "tk", "ta", "tr", "tb", "bs", "bu", "bf", "bq"]);
        let f: Vec<Option<String>> = self.client.query(&cmd).await?;
        let num = |i: usize| {
            f.get(i)
                .cloned()
                .flatten()
                .and_then(|v| v.parse::<f64>().ok())
        };
        // As the script reads them: a time past its horizon, or not a
        // time at all, is no time (once shown held until u64::MAX).
        let ms = |i: usize| {
            num(i)
                .filter(|v| *v >= 0.0 && *v <= now.saturating_add(HORIZON_MS) as f64)
                .map(|v| v as Millis)
        };
        let open = f.get(5).cloned().flatten().as_deref() == Some("o");
        let paused_until = ms(6).filter(|u| open && *u > now);
        let rate_limited_until = match (num(1), ms(2), num(3), num(4)) {
            (Some(tokens), Some(at), Some(per_ms), Some(burst)) => {
                next_token(tokens, at, per_ms, burst, now)
            }
            _ => None,
        };
        Ok(FleetLane {
            held_until: ms(0).filter(|u| *u > now),
            paused_until,
            probing: open && paused_until.is_none(),
            failures: ms(7).map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX)),
            rate_limited_until,
        })
    }

    async fn reset(&self, lane: &str, destination: &str) -> Result<bool, StoreError> {
        let key = self.key(lane);
        let args = ["reset", "0", destination];
        let forgot: i64 = self.client.run(&self.script, &[&key], &args).await?;
        Ok(forgot == 1)
    }
}

/// When a lane's bucket (`tokens` at `at`, refilled `per_ms`, up to
/// `burst`) next has a whole token, if it has none now: whatever Redis
/// holds (an infinite or tiny figure saturates, never overflows).
fn next_token(tokens: f64, at: Millis, per_ms: f64, burst: f64, now: Millis) -> Option<Millis> {
    // Not a positive rate (NaN included): no time to name.
    if per_ms.is_nan() || per_ms <= 0.0 {
        return None;
    }
    let tokens = (tokens + now.saturating_sub(at) as f64 * per_ms).min(burst);
    (tokens < 1.0).then(|| now.saturating_add(((1.0 - tokens) / per_ms).ceil() as Millis))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Figures no instance writes (Redis shared, or edited by hand) give
    /// a time, or none, never an overflow (which panicked a debug build's
    /// worker serving a source's view).
    #[test]
    fn a_bucket_of_any_figures_saturates() {
        let now = 1_000_000;
        assert_eq!(
            next_token(f64::NEG_INFINITY, now, 1e-300, 10.0, now),
            Some(Millis::MAX)
        );
        assert_eq!(
            next_token(-1e300, now, 1e-300, 10.0, now),
            Some(Millis::MAX)
        );
        assert_eq!(next_token(f64::NAN, now, 1.0, 10.0, now), None);
        assert_eq!(next_token(0.0, now, f64::NAN, 10.0, now), None);
        assert_eq!(next_token(0.0, now, 0.0, 10.0, now), None);
        // A bucket that is empty and refills one a second has one in 1 s.
        assert_eq!(next_token(0.0, now, 0.001, 10.0, now), Some(now + 1000));
        assert_eq!(next_token(5.0, now, 0.001, 10.0, now), None);
    }
}
