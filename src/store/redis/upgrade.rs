//! In a Redis Cluster: from the one-slot layout of earlier versions
//! (`{P}:c:{key}` and `{P}:fence`) to a slot per claim ([`Layout`]), so
//! that a claim held or done across the upgrade stays so and a key's fences
//! keep growing.
//!
//! - The old counter `{P}:fence` (G) stays: it is the floor of every slot's
//!   counter. claim.lua and done.lua raise a slot's counter to the floor
//!   before they take a fence, so every fence handed out after the upgrade
//!   is above every fence handed out before it.
//! - Each old record is copied to its new key with the Redis expiry it has
//!   left (move.lua: only if the new key is absent, and only once), then
//!   deleted. Records are found by `SCAN` on the master of `{P}`'s slot.
//! - `{P}:layout` remembers G once every old record is moved: a start that
//!   finds the same G skips the scan. A G that grew since means an instance
//!   of an earlier version claimed in the old layout after the upgrade: its
//!   records are moved again, with a warning.
//!
//! Every instance must run the new version together (stop the old ones,
//! then start the new ones): an old instance keeps claiming in the old
//! slot, where the new ones no longer look.
//!
//! Claims wait for the move (at most `response_timeout`, then 503), and so
//! does readiness. The move runs in a task of its own, so a request given
//! up on does not cancel it; a failed move is tried again by the next call.

use std::sync::{Arc, Mutex, PoisonError};

use redis::Script;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::client::{Client, RedisFault};
use super::layout::Layout;
use crate::store::StoreError;

/// Old records read per `SCAN` (and moved concurrently).
const SCAN_COUNT: usize = 256;

/// The move to the per-slot layout, started by the first call that needs
/// it.
pub(super) struct Upgrade {
    inner: Arc<Inner>,
}

struct Inner {
    client: Arc<Client>,
    copy: Script,
    /// `None` while the move is under way (or not started); then the
    /// floor of every slot's fence counter, or why the move failed.
    outcome: watch::Sender<Option<Result<u64, StoreError>>>,
    /// The task moving records, if one was started.
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Upgrade {
    /// A move over `client` that copies records with `copy` (move.lua).
    pub(super) fn new(client: Arc<Client>, copy: Script) -> Self {
        Self {
            inner: Arc::new(Inner {
                client,
                copy,
                outcome: watch::Sender::new(None),
                task: Mutex::new(None),
            }),
        }
    }

    /// The floor of every slot's fence counter, once the old layout's
    /// records are moved: waits for the move (starting it if none runs) at
    /// most `response_timeout`.
    pub(super) async fn floor(&self) -> Result<u64, StoreError> {
        let mut outcome = self.inner.outcome.subscribe();
        if let Some(Ok(floor)) = *outcome.borrow_and_update() {
            return Ok(floor);
        }
        self.start();
        let timeout = self.inner.client.opts().response_timeout;
        match tokio::time::timeout(timeout, outcome.wait_for(Option::is_some)).await {
            Ok(Ok(done)) => (*done).clone().unwrap_or_else(|| Err(moving())),
            _ => Err(moving()),
        }
    }

    /// Starts the move unless it runs or has succeeded.
    fn start(&self) {
        let mut task = self
            .inner
            .task
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let idle = task.as_ref().is_none_or(JoinHandle::is_finished);
        if !idle || matches!(*self.inner.outcome.borrow(), Some(Ok(_))) {
            return;
        }
        self.inner.outcome.send_replace(None);
        let inner = self.inner.clone();
        *task = Some(tokio::spawn(async move {
            let outcome = move_claims(&inner).await;
            if let Err(e) = &outcome {
                tracing::warn!(error = %e.chain(), "cannot move claims from the one-slot layout yet");
            }
            inner.outcome.send_replace(Some(outcome));
        }));
    }

    /// Stops a move under way (it resumes where it was on the next start:
    /// moved records are gone from the old layout).
    pub(super) fn stop(&self) {
        if let Some(task) = self
            .inner
            .task
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            task.abort();
        }
    }
}

fn moving() -> StoreError {
    RedisFault::MovingClaims.into()
}

/// Moves every record of the one-slot layout; answers the floor.
async fn move_claims(inner: &Arc<Inner>) -> Result<u64, StoreError> {
    let client = &inner.client;
    let prefix = &client.opts().prefix;
    let counter = Layout::OneSlot.fence_key(prefix, "");
    let layout = format!("{{{prefix}}}:layout");
    let (old_floor, moved_at): (Option<u64>, Option<u64>) = client
        .query(redis::cmd("MGET").arg(&counter).arg(&layout))
        .await?;
    let old_floor = old_floor.unwrap_or(0);
    if moved_at == Some(old_floor) {
        return Ok(old_floor);
    }
    if moved_at.is_some() {
        tracing::warn!(
            "claims were taken in the one-slot layout after this Redis Cluster moved to a \
             slot per claim: an instance of an earlier dedupd version runs against it; stop it. \
             Moving its claims"
        );
    }
    let old_claims = Layout::OneSlot.claim_key(prefix, "");
    let pattern = format!("{}*", glob_escape(&old_claims));
    let (mut moved, mut floor) = (0u64, old_floor);
    let mut cursor = 0u64;
    loop {
        let (next, keys): (u64, Vec<String>) = client
            .query_at(
                &old_claims,
                redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(SCAN_COUNT),
            )
            .await?;
        let mut batch = tokio::task::JoinSet::new();
        for old in keys {
            batch.spawn(move_one(inner.clone(), old));
        }
        while let Some(done) = batch.join_next().await {
            if let Some(fence) = done.map_err(|e| StoreError::Failed(Arc::new(e)))?? {
                moved += 1;
                // An old instance may have taken fences past the counter
                // read above: no slot's counter starts below a moved
                // record's fence.
                floor = floor.max(fence);
            }
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
    client
        .query::<()>(redis::cmd("SET").arg(&layout).arg(old_floor))
        .await?;
    if moved > 0 {
        tracing::info!(
            moved,
            floor,
            "moved claims from the one-slot layout to a slot each"
        );
    }
    Ok(floor)
}

/// Copies the record at `old` to its key in the per-slot layout and
/// deletes it; answers its fence (`None` when it was gone).
async fn move_one(inner: Arc<Inner>, old: String) -> Result<Option<u64>, StoreError> {
    let client = &inner.client;
    let prefix = &client.opts().prefix;
    let Some(key) = old.strip_prefix(&Layout::OneSlot.claim_key(prefix, "")) else {
        return Ok(None);
    };
    let pttl: i64 = client.query(redis::cmd("PTTL").arg(&old)).await?;
    let fields: Vec<String> = client.query(redis::cmd("HGETALL").arg(&old)).await?;
    // Gone (expired) between the scan and now: nothing to move.
    if pttl == -2 || fields.is_empty() {
        return Ok(None);
    }
    let fence = fields
        .chunks(2)
        .find(|kv| kv[0] == "f")
        .and_then(|kv| kv.get(1)?.parse().ok())
        .unwrap_or(0);
    let new = Layout::PerSlot.claim_key(prefix, key);
    let marker = format!("{new}:moved");
    let args: Vec<String> = std::iter::once(pttl.to_string()).chain(fields).collect();
    let _copied: i64 = client
        .run(&inner.copy, &[&new, &marker], args.as_slice())
        .await?;
    client.query::<i64>(redis::cmd("DEL").arg(&old)).await?;
    Ok(Some(fence))
}

/// `text` as a `SCAN MATCH` pattern that matches only itself.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn glob_escape_leaves_no_wildcard() {
        assert_eq!(
            super::glob_escape("{a*b?[c]\\}:c:"),
            "{a\\*b\\?\\[c\\]\\\\}:c:"
        );
    }
}
