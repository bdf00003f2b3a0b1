//! Redis's own files after an erasure from the shared inbox.
//!
//! `erase.lua` takes an event's body and headers out of Redis's memory at
//! once, but Redis's persistence keeps them: the append-only file logs
//! every write, the one that stored the body included, until it is
//! rewritten; a snapshot (`dump.rdb`) holds what was there when it was
//! taken. So after an erasure dedupd asks every master for an AOF rewrite
//! (`BGREWRITEAOF`, where `appendonly` is on) and a new snapshot (`BGSAVE
//! SCHEDULE`, where `save` is configured). Once they finish, Redis deletes
//! the old files, and the body is in none of them.
//!
//! Requests fold: the first erasure asks at once, later ones at most once
//! every [`EVERY`]. A rewrite already running may have started before the
//! erasure, so it is waited out and another one asked for. The bound, in
//! the docs: an erased body is out of Redis's files within [`EVERY`] of
//! its erasure, plus the time Redis takes to rewrite. Replicas rewrite
//! their own files on their own schedule (`auto-aof-rewrite-percentage`);
//! a Redis that refuses the commands (a managed service, an ACL) keeps
//! the body until its own next rewrite, and dedupd warns.

use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::Value;
use tokio::sync::Notify;

use super::client::Client;

/// Least time between two rounds of rewrites.
pub const EVERY: Duration = Duration::from_secs(10);
/// How often a rewrite already running is looked at again.
const POLL: Duration = Duration::from_millis(200);
/// Longest wait for one that runs (a huge dataset): asked again later.
const LONGEST: Duration = Duration::from_secs(600);

/// Rounds of rewrites asked for after erasures.
#[derive(Debug)]
pub struct Rewrites {
    client: Arc<Client>,
    wanted: Arc<Notify>,
    started: std::sync::Once,
}

impl Rewrites {
    pub fn new(client: Arc<Client>) -> Arc<Self> {
        Arc::new(Self {
            client,
            wanted: Arc::new(Notify::new()),
            started: std::sync::Once::new(),
        })
    }

    /// An erasure was made: a round of rewrites is due. The first call
    /// starts the task that makes them (it ends with the last handle).
    pub fn erased(self: &Arc<Self>) {
        self.started.call_once(|| {
            tokio::spawn(run(Arc::downgrade(self), self.wanted.clone()));
        });
        self.wanted.notify_one();
    }

    /// One round: every master rewrites its AOF and takes a snapshot, as
    /// it is configured to. Returns once each one started them (after
    /// waiting out those already running).
    async fn round(&self) -> Result<(), String> {
        let masters = self
            .client
            .each_master(&redis::cmd("INFO").arg("persistence").to_owned())
            .await
            .map_err(|e| e.to_string())?;
        for (node, info) in masters {
            let info = text(&info.map_err(|e| format!("{node}: INFO: {e}"))?);
            if field(&info, "aof_enabled") == Some("1") {
                self.rewrite(&node).await?;
            }
            if self.saves(&node).await? {
                let asked = self
                    .client
                    .on_node(&node, &redis::cmd("BGSAVE").arg("SCHEDULE").to_owned())
                    .await
                    .map_err(|e| format!("{node}: BGSAVE: {e}"))?;
                asked.map_err(|e| format!("{node}: BGSAVE: {e}"))?;
            }
        }
        Ok(())
    }

    /// Asks `node` for an AOF rewrite, waiting out one already running.
    async fn rewrite(&self, node: &str) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + LONGEST;
        loop {
            let asked = self
                .client
                .on_node(node, &redis::cmd("BGREWRITEAOF"))
                .await
                .map_err(|e| format!("{node}: BGREWRITEAOF: {e}"))?;
            match asked {
                Ok(_) => return Ok(()),
                Err(e) if e.contains("in progress") && tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(POLL).await;
                }
                Err(e) => return Err(format!("{node}: BGREWRITEAOF: {e}")),
            }
        }
    }

    /// Whether `node` takes snapshots (`save` configured).
    async fn saves(&self, node: &str) -> Result<bool, String> {
        let reply = self
            .client
            .on_node(
                node,
                &redis::cmd("CONFIG").arg("GET").arg("save").to_owned(),
            )
            .await
            .map_err(|e| format!("{node}: CONFIG GET save: {e}"))?
            .map_err(|e| format!("{node}: CONFIG GET save: {e}"))?;
        let values: Vec<String> = match reply {
            Value::Array(v) => v.iter().map(text).collect(),
            Value::Map(v) => v.iter().flat_map(|(k, v)| [text(k), text(v)]).collect(),
            _ => Vec::new(),
        };
        Ok(values.get(1).is_some_and(|s| !s.trim().is_empty()))
    }
}

/// Makes a round each time one is due, at most one every [`EVERY`]; ends
/// once the inbox is gone.
async fn run(rewrites: Weak<Rewrites>, wanted: Arc<Notify>) {
    loop {
        let due = tokio::time::timeout(Duration::from_secs(60), wanted.notified()).await;
        let Some(r) = rewrites.upgrade() else { return };
        if due.is_err() {
            continue;
        }
        match r.round().await {
            Ok(()) => {
                tracing::info!(
                    "erased events: Redis asked to rewrite its append-only file and snapshot"
                );
            }
            Err(e) => {
                tracing::warn!(error = %e, "erased events: Redis cannot be asked to rewrite its files now; the erased bodies stay in its append-only file or snapshot until its next rewrite");
            }
        }
        drop(r);
        tokio::time::sleep(EVERY).await;
    }
}

/// A reply as text.
fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) | Value::VerbatimString { text: s, .. } => s.clone(),
        Value::Int(i) => i.to_string(),
        _ => String::new(),
    }
}

/// A field of an `INFO` reply.
fn field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines().find_map(|l| {
        l.strip_prefix(name)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(str::trim)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_info_field_is_read_by_its_whole_name() {
        let info =
            "# Persistence\r\naof_enabled_x:7\r\naof_enabled:1\r\naof_rewrite_in_progress:0\r\n";
        assert_eq!(field(info, "aof_enabled"), Some("1"));
        assert_eq!(field(info, "aof_rewrite_in_progress"), Some("0"));
        assert_eq!(field(info, "rdb_changes"), None);
    }
}
