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
//! every [`EVERY`]. A request waiting meanwhile is kept in Redis too (the
//! counter `PREFIX:{i}:rewrite_wanted`, raised by each erasure and taken
//! away once a round made after it was asked): an instance stopped, or
//! killed, before its round makes it at its next start, or another
//! instance at its own. A rewrite already running may have started before the
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

/// Longest wait before a failed round is tried again.
const RETRY_MAX: Duration = Duration::from_secs(300);

/// Rounds of rewrites asked for after erasures.
#[derive(Debug)]
pub struct Rewrites {
    client: Arc<Client>,
    /// The counter of erasures not yet followed by a round.
    wanted_key: String,
    wanted: Arc<Notify>,
    started: std::sync::Once,
    /// The runtime the inbox was made on: the task runs there, not on the
    /// runtime of whichever request erased first.
    runtime: Option<tokio::runtime::Handle>,
}

impl Rewrites {
    pub fn new(client: Arc<Client>) -> Arc<Self> {
        let rewrites = Arc::new(Self {
            wanted_key: format!("{}:{{i}}:rewrite_wanted", client.opts().prefix),
            client,
            wanted: Arc::new(Notify::new()),
            started: std::sync::Once::new(),
            runtime: tokio::runtime::Handle::try_current().ok(),
        });
        // A round an instance did not make before it stopped is made now
        // (once Redis answers).
        if let Some(runtime) = &rewrites.runtime {
            let weak = Arc::downgrade(&rewrites);
            drop(runtime.spawn(async move {
                // Every EVERY while Redis does not answer, for an hour.
                for _ in 0..360 {
                    let Some(r) = weak.upgrade() else { return };
                    match r.wanted_count().await {
                        Ok(Some(_)) => {
                            tracing::info!(
                                "erased events: a rewrite of Redis's files asked for before \
                                 this start was not made yet; asking"
                            );
                            r.start();
                            return;
                        }
                        Ok(None) => return,
                        Err(e) => tracing::debug!(error = %e, "cannot tell yet whether a rewrite of Redis's files is owed"),
                    }
                    drop(r);
                    tokio::time::sleep(EVERY).await;
                }
            }));
        }
        rewrites
    }

    /// An erasure was made: a round of rewrites is due, noted in Redis
    /// first (so a stop before the round does not lose it). The first call
    /// starts the task that makes them (it ends with the last handle).
    /// Each erasure raises the counter (one round trip beside its
    /// script): a round takes it away only if no erasure raised it since
    /// the round read it, in this process or another.
    pub async fn erased(self: &Arc<Self>) {
        let noted: Result<i64, _> = self
            .client
            .query(redis::cmd("INCR").arg(&self.wanted_key))
            .await;
        if let Err(e) = noted {
            tracing::warn!(error = %e, "erased events: the rewrite of Redis's files they need is not noted in Redis (asked now all the same; a stop before it is made loses it)");
        }
        self.start();
    }

    /// The erasures noted in Redis and not yet followed by a round.
    /// As stored: whatever else wrote the key (not a number, another
    /// type) neither stops a round nor is taken for a count.
    async fn wanted_count(&self) -> Result<Option<Vec<u8>>, String> {
        self.client
            .query(redis::cmd("GET").arg(&self.wanted_key))
            .await
            .map_err(|e| e.to_string())
    }

    /// Takes away the note of the erasures a round made after `seen` of
    /// them covers, unless more were noted since.
    async fn covered(&self, seen: &[u8]) -> Result<(), String> {
        let script = redis::Script::new(
            "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
        );
        self.client
            .run::<i64, &[u8]>(&script, &[&self.wanted_key], &[seen])
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    }

    /// Starts the task if it is not running, and asks it for a round.
    fn start(self: &Arc<Self>) {
        self.started.call_once(|| {
            let task = run(Arc::downgrade(self), self.wanted.clone());
            match &self.runtime {
                Some(runtime) => drop(runtime.spawn(task)),
                None => drop(tokio::spawn(task)),
            }
        });
        self.wanted.notify_one();
    }

    /// One round: every master rewrites its AOF (where `appendonly` is on)
    /// and takes a snapshot (where `save` is set). Each master is asked,
    /// whatever another answered: `Ok` with what could not be told (a
    /// master that refuses `CONFIG`), `Err` with what failed, to be asked
    /// again.
    async fn round(&self) -> Result<Vec<String>, String> {
        // The count now: an erasure that raises it later may not be in the
        // rewrite below, and keeps the round owed.
        let seen = self.wanted_count().await.unwrap_or_else(|e| {
            tracing::debug!(error = %e, "cannot read the count of erasures owed a rewrite; rewriting all the same");
            None
        });
        let masters = self
            .client
            .each_master(&redis::cmd("INFO").arg("persistence").to_owned())
            .await
            .map_err(|e| e.to_string())?;
        let (mut failed, mut unknown) = (Vec::new(), Vec::new());
        for (node, info) in masters {
            let info = match info {
                Ok(v) => text(&v),
                Err(e) => {
                    failed.push(format!("{node}: INFO: {e}"));
                    continue;
                }
            };
            if field(&info, "aof_enabled") == Some("1")
                && let Err(e) = self.rewrite(&node).await
            {
                failed.push(e);
            }
            match self.saves(&node).await {
                Ok(true) => {
                    let asked = self
                        .client
                        .on_node(&node, &redis::cmd("BGSAVE").arg("SCHEDULE").to_owned())
                        .await;
                    match asked {
                        Ok(Ok(_)) => {}
                        Ok(Err(e)) => failed.push(format!("{node}: BGSAVE: {e}")),
                        Err(e) => failed.push(format!("{node}: BGSAVE: {e}")),
                    }
                }
                Ok(false) => {}
                Err(e) => unknown.push(e),
            }
        }
        if !failed.is_empty() {
            return Err(failed.join("; "));
        }
        if let Some(seen) = seen {
            self.covered(&seen).await?;
        }
        Ok(unknown)
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

    /// Whether `node` takes snapshots (`save` configured); `Err` when it
    /// will not say.
    async fn saves(&self, node: &str) -> Result<bool, String> {
        let reply = self
            .client
            .on_node(
                node,
                &redis::cmd("CONFIG").arg("GET").arg("save").to_owned(),
            )
            .await
            .map_err(|e| format!("{node}: CONFIG GET save: {e}"))?
            .map_err(|e| {
                format!(
                    "{node} refuses CONFIG GET save ({e}): if it saves snapshots, an erased \
                     body stays in its snapshot until its next one"
                )
            })?;
        let values: Vec<String> = match reply {
            Value::Array(v) => v.iter().map(text).collect(),
            Value::Map(v) => v.iter().flat_map(|(k, v)| [text(k), text(v)]).collect(),
            _ => Vec::new(),
        };
        Ok(values.get(1).is_some_and(|s| !s.trim().is_empty()))
    }
}

/// Makes a round each time one is due, at most one every [`EVERY`]; a
/// round that failed is made again, waiting longer each time (up to
/// [`RETRY_MAX`]). Ends once the inbox is gone.
async fn run(rewrites: Weak<Rewrites>, wanted: Arc<Notify>) {
    let mut wait = EVERY;
    loop {
        let due = tokio::time::timeout(Duration::from_secs(60), wanted.notified()).await;
        let Some(r) = rewrites.upgrade() else { return };
        if due.is_err() {
            continue;
        }
        match r.round().await {
            Ok(unknown) => {
                wait = EVERY;
                tracing::info!(
                    "erased events: Redis asked to rewrite its append-only file and snapshot"
                );
                for u in unknown {
                    tracing::warn!(detail = %u, "erased events: cannot tell whether Redis saves snapshots");
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?wait, "erased events: Redis could not be asked to rewrite its files; the erased bodies stay in its append-only file or snapshot until it is");
                wanted.notify_one();
                wait = (wait * 2).min(RETRY_MAX);
            }
        }
        drop(r);
        tokio::time::sleep(wait).await;
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
