//! The [`Fleet`] of the shared inbox: state the instances on one Redis
//! share, each piece a Lua script on one key with a hash tag of its own
//! (one cluster slot), beside the inbox's buckets:
//! - `P:{a:KIND:SOURCE}` (`-` for an alert without a source; a kind has
//!   a source always or never): an alert kind's interval (`alert.lua`).

use std::sync::Arc;

use async_trait::async_trait;
use redis::Script;

use super::client::{Client, RedisFault};
use crate::clock::Millis;
use crate::store::StoreError;
use crate::store::fleet::{AlertMode, AlertTurn, Fleet};

/// The fleet's state in Redis, over the inbox's connection.
pub struct RedisFleet {
    client: Arc<Client>,
    /// `alert.lua`, hashed once.
    alert: Script,
}

impl std::fmt::Debug for RedisFleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisFleet")
            .field("client", &self.client)
            .finish_non_exhaustive()
    }
}

impl RedisFleet {
    /// The fleet's state over `client`'s connection.
    pub fn new(client: Arc<Client>) -> Self {
        Self {
            client,
            alert: Script::new(&format!(
                "{}\n{}",
                include_str!("fleet_keys.lua"),
                include_str!("alert.lua")
            )),
        }
    }

    /// The key of an alert kind and source's interval. Kinds are dedupd's
    /// own (`backlog.stale`); source names are `[A-Za-z0-9_-]`, with a
    /// `.` in a destination's lane: neither can end the hash tag.
    fn alert_key(&self, kind: &str, source: Option<&str>) -> String {
        let prefix = &self.client.opts().prefix;
        format!("{prefix}:{{a:{kind}:{}}}", source.unwrap_or("-"))
    }
}

fn unexpected(reply: Vec<String>) -> StoreError {
    RedisFault::Unexpected {
        what: "alert",
        reply,
    }
    .into()
}

#[async_trait]
impl Fleet for RedisFleet {
    async fn alert_turn(
        &self,
        kind: &str,
        source: Option<&str>,
        every_ms: u64,
        mode: AlertMode,
        local_folded: u64,
        now: Millis,
    ) -> Result<AlertTurn, StoreError> {
        let key = self.alert_key(kind, source);
        let mode = match mode {
            AlertMode::Raise => "raise",
            AlertMode::Flush => "flush",
        };
        let args = [
            every_ms.max(1).to_string(),
            mode.to_owned(),
            local_folded.to_string(),
            now.to_string(),
        ];
        let reply: Vec<String> = self.client.run(&self.alert, &[&key], &args).await?;
        let num = |i: usize| reply.get(i).and_then(|v| v.parse::<u64>().ok());
        let turn = match (reply.first().map(String::as_str), num(1)) {
            (Some("send"), Some(suppressed)) => AlertTurn::Send { suppressed },
            (Some("fold"), Some(until)) => AlertTurn::Fold { until },
            (Some("gone"), _) => AlertTurn::Gone,
            _ => return Err(unexpected(reply)),
        };
        Ok(turn)
    }
}
