//! Claims, fences, applied events and stream heads in Redis: the [`Store`]
//! of several instances.

use std::sync::Arc;

use async_trait::async_trait;
use redis::Script;

use super::client::{Client, RedisFault};
use super::layout::Layout;
use super::upgrade::Upgrade;
use crate::clock::Millis;
use crate::domain::{ClaimResult, CreatedAt, Fingerprint, ScopedKey, Token, Ttl};
use crate::store::{
    ApplyOutcome, ApplyResult, ClaimOutcome, ClaimState, ClaimView, DoneOutcome, ExtendOutcome,
    Head, PurgeReport, ReleaseOutcome, Store, StoreError, WriteStats,
};

/// The scripts, hashed once.
struct Scripts {
    claim: Script,
    done: Script,
    release: Script,
    extend: Script,
    apply: Script,
    mark: Script,
    confirm: Script,
}

/// How long a new event-id marker lives before its apply confirms it.
const PENDING_MARKER_MS: u64 = 60_000;

fn script(body: &str) -> Script {
    Script::new(&format!("{}\n{}", include_str!("common.lua"), body))
}

/// The Redis-backed [`Store`].
pub struct RedisStore {
    client: Arc<Client>,
    scripts: Scripts,
    slack_ms: u64,
    /// Per slot in a cluster, one slot otherwise.
    layout: Layout,
    /// In a cluster: the move from the one-slot layout, which claims wait
    /// for.
    upgrade: Option<Upgrade>,
}

fn num(s: Option<&String>) -> Result<u64, StoreError> {
    s.and_then(|v| v.parse().ok())
        .ok_or_else(|| RedisFault::MalformedNumber.into())
}

fn state(s: Option<&String>) -> ClaimState {
    if s.map(String::as_str) == Some("p") {
        ClaimState::Processing
    } else {
        ClaimState::Done
    }
}

/// A result as the scripts keep it: JSON text, '' or absent for none. Only
/// results parsed as JSON are ever stored; one that no longer parses is
/// dropped (the record stays done).
fn stored_result(r: Option<&str>) -> Option<ClaimResult> {
    r.filter(|r| !r.is_empty())
        .and_then(|r| ClaimResult::from_stored(r).ok())
}

fn unexpected(what: &'static str, reply: &[String]) -> StoreError {
    RedisFault::Unexpected {
        what,
        reply: reply.to_vec(),
    }
    .into()
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("client", &self.client)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Claims and ordering over `client`'s connection.
    pub fn new(client: Arc<Client>) -> Self {
        let (layout, upgrade) = if client.is_cluster() {
            let copy = script(include_str!("move.lua"));
            (Layout::PerSlot, Some(Upgrade::new(client.clone(), copy)))
        } else {
            (Layout::OneSlot, None)
        };
        Self {
            slack_ms: super::client::ms(client.opts().expiry_slack),
            layout,
            upgrade,
            client,
            scripts: Scripts {
                claim: script(include_str!("claim.lua")),
                done: script(include_str!("done.lua")),
                release: script(include_str!("release.lua")),
                extend: script(include_str!("extend.lua")),
                apply: script(include_str!("apply.lua")),
                mark: script(include_str!("mark.lua")),
                confirm: script(include_str!("confirm.lua")),
            },
        }
    }

    /// Claims and ordering over a connection of their own. Call inside a
    /// tokio runtime.
    pub fn connect(opts: super::RedisOptions) -> Result<Self, StoreError> {
        Ok(Self::new(Arc::new(Client::new(opts)?)))
    }

    fn claim_key(&self, k: &ScopedKey) -> String {
        self.layout
            .claim_key(&self.client.opts().prefix, k.as_str())
    }

    fn fence_key(&self, claim_key: &str) -> String {
        self.layout.fence_key(&self.client.opts().prefix, claim_key)
    }

    /// The floor of the fence counters: the one-slot layout's counter in a
    /// cluster, once its claims are moved (claims wait for that), else 0.
    async fn fence_floor(&self) -> Result<u64, StoreError> {
        match &self.upgrade {
            Some(upgrade) => upgrade.floor().await,
            None => Ok(0),
        }
    }

    fn head_key(&self, stream: &ScopedKey) -> String {
        format!(
            "{}:{{s:{}}}:head",
            self.client.opts().prefix,
            hex::encode(stream.as_str())
        )
    }

    fn event_key(&self, stream: &ScopedKey, event: &ScopedKey) -> String {
        format!(
            "{}:{{s:{}}}:e:{}",
            self.client.opts().prefix,
            hex::encode(stream.as_str()),
            event.as_str()
        )
    }

    fn marker_key(&self, event: &ScopedKey) -> String {
        format!(
            "{}:{{e:{}}}:seen",
            self.client.opts().prefix,
            hex::encode(event.as_str())
        )
    }

    async fn read_head(&self, stream: &ScopedKey, now: Millis) -> Result<Option<Head>, StoreError> {
        let reply: Vec<Option<String>> = self
            .client
            .query(
                redis::cmd("HMGET")
                    .arg(self.head_key(stream))
                    .arg(&["cs", "cn", "id", "e"]),
            )
            .await?;
        match reply.as_slice() {
            [Some(cs), Some(cn), Some(id), Some(e)] if e.parse::<u64>().is_ok_and(|e| e > now) => {
                Ok(Some(head_from(cs, cn, id)?))
            }
            _ => Ok(None),
        }
    }
}

fn head_from(cs: &str, cn: &str, id: &str) -> Result<Head, StoreError> {
    let bad = || StoreError::from(RedisFault::MalformedHead);
    let secs: i128 = cs.parse().map_err(|_| bad())?;
    let nanos: i128 = cn.parse().map_err(|_| bad())?;
    // Whatever Redis holds: past an i128 of nanoseconds is malformed too.
    let at = secs
        .checked_mul(1_000_000_000)
        .and_then(|n| n.checked_add(nanos))
        .ok_or_else(bad)?;
    Ok(Head {
        created_at: CreatedAt::from_unix_nanos(at),
        event_id: ScopedKey::from_stored(id.to_owned()),
    })
}

#[async_trait]
impl Store for RedisStore {
    async fn claim(
        &self,
        key: &ScopedKey,
        ttl: Ttl,
        fingerprint: Option<Fingerprint>,
        now: Millis,
    ) -> Result<ClaimOutcome, StoreError> {
        let token = Token::random();
        let floor = self.fence_floor().await?;
        let args = [
            now.to_string(),
            ttl.as_ms().to_string(),
            fingerprint
                .as_ref()
                .map_or("", Fingerprint::as_str)
                .to_owned(),
            token.to_hex(),
            self.slack_ms.to_string(),
            floor.to_string(),
        ];
        let claim_key = self.claim_key(key);
        let fence_key = self.fence_key(&claim_key);
        let keys = [claim_key.as_str(), fence_key.as_str()];
        // An answer lost on the way back would leave a claim nobody holds
        // the token of: retry once with the same token (the script answers
        // its own claim as claimed again).
        let reply: Vec<String> = match self.client.run(&self.scripts.claim, &keys, &args).await {
            Err(StoreError::Unavailable(_)) => {
                self.client.run(&self.scripts.claim, &keys, &args).await?
            }
            other => other?,
        };
        match reply.first().map(String::as_str) {
            Some("claimed") => Ok(ClaimOutcome::Claimed {
                token,
                fence: num(reply.get(1))?,
                expires_at_ms: num(reply.get(2))?,
            }),
            Some("busy") => Ok(ClaimOutcome::Busy {
                expires_at_ms: num(reply.get(2))?,
            }),
            Some("done") => Ok(ClaimOutcome::Done {
                expires_at_ms: num(reply.get(2))?,
                result: stored_result(reply.get(3).map(String::as_str)),
            }),
            Some("mismatch") => Ok(ClaimOutcome::FingerprintMismatch {
                state: state(reply.get(1)),
                expires_at_ms: num(reply.get(2))?,
            }),
            _ => Err(unexpected("claim", &reply)),
        }
    }

    async fn done_with(
        &self,
        key: &ScopedKey,
        token: Token,
        ttl: Ttl,
        result: Option<ClaimResult>,
        now: Millis,
    ) -> Result<DoneOutcome, StoreError> {
        let args = [
            now.to_string(),
            ttl.as_ms().to_string(),
            token.to_hex(),
            self.slack_ms.to_string(),
            self.fence_floor().await?.to_string(),
            result.as_ref().map_or("", ClaimResult::as_str).to_owned(),
        ];
        let claim_key = self.claim_key(key);
        let reply: Vec<String> = self
            .client
            .run(
                &self.scripts.done,
                &[&claim_key, &self.fence_key(&claim_key)],
                &args,
            )
            .await?;
        match reply.first().map(String::as_str) {
            Some("done") => Ok(DoneOutcome::Done {
                expires_at_ms: num(reply.get(1))?,
            }),
            Some("not_owner") => Ok(DoneOutcome::NotOwner {
                state: state(reply.get(1)),
                expires_at_ms: num(reply.get(2))?,
            }),
            _ => Err(unexpected("done", &reply)),
        }
    }

    async fn release(
        &self,
        key: &ScopedKey,
        token: Token,
        now: Millis,
    ) -> Result<ReleaseOutcome, StoreError> {
        self.fence_floor().await?;
        let args = [now.to_string(), token.to_hex()];
        let reply: Vec<String> = self
            .client
            .run(&self.scripts.release, &[&self.claim_key(key)], &args)
            .await?;
        match reply.first().map(String::as_str) {
            Some("released") => Ok(ReleaseOutcome::Released),
            Some("not_held") => Ok(ReleaseOutcome::NotHeld),
            Some("not_owner") => Ok(ReleaseOutcome::NotOwner {
                expires_at_ms: num(reply.get(1))?,
            }),
            Some("done") => Ok(ReleaseOutcome::Done {
                expires_at_ms: num(reply.get(1))?,
            }),
            _ => Err(unexpected("release", &reply)),
        }
    }

    async fn extend(
        &self,
        key: &ScopedKey,
        token: Token,
        ttl: Ttl,
        now: Millis,
    ) -> Result<ExtendOutcome, StoreError> {
        self.fence_floor().await?;
        let args = [
            now.to_string(),
            ttl.as_ms().to_string(),
            token.to_hex(),
            self.slack_ms.to_string(),
        ];
        let reply: Vec<String> = self
            .client
            .run(&self.scripts.extend, &[&self.claim_key(key)], &args)
            .await?;
        match reply.first().map(String::as_str) {
            Some("extended") => Ok(ExtendOutcome::Extended {
                expires_at_ms: num(reply.get(1))?,
            }),
            Some("lost") => Ok(ExtendOutcome::Lost),
            Some("not_owner") => Ok(ExtendOutcome::NotOwner {
                expires_at_ms: num(reply.get(1))?,
            }),
            Some("done") => Ok(ExtendOutcome::Done {
                expires_at_ms: num(reply.get(1))?,
            }),
            _ => Err(unexpected("extend", &reply)),
        }
    }

    async fn get(&self, key: &ScopedKey, now: Millis) -> Result<Option<ClaimView>, StoreError> {
        self.fence_floor().await?;
        let reply: Vec<Option<String>> = self
            .client
            .query(
                redis::cmd("HMGET")
                    .arg(self.claim_key(key))
                    .arg(&["s", "f", "e", "r"]),
            )
            .await?;
        match reply.as_slice() {
            [Some(s), Some(f), Some(e), r] => {
                let expires_at_ms: u64 = num(Some(e))?;
                if expires_at_ms <= now {
                    return Ok(None);
                }
                Ok(Some(ClaimView {
                    state: state(Some(s)),
                    fence: num(Some(f))?,
                    expires_at_ms,
                    result: stored_result(r.as_deref()),
                }))
            }
            _ => Ok(None),
        }
    }

    async fn apply(
        &self,
        stream: &ScopedKey,
        event_id: &ScopedKey,
        created_at: CreatedAt,
        retention_ms: u64,
        now: Millis,
    ) -> Result<ApplyResult, StoreError> {
        let marker = self.marker_key(event_id);
        let marker_args = [
            now.to_string(),
            stream.as_str().to_owned(),
            PENDING_MARKER_MS.min(retention_ms).to_string(),
            self.slack_ms.to_string(),
        ];
        let fresh: i64 = self
            .client
            .run(&self.scripts.mark, &[&marker], &marker_args)
            .await?;
        if fresh == 0 {
            return Ok(ApplyResult {
                outcome: ApplyOutcome::Duplicate,
                head: self.read_head(stream, now).await?,
            });
        }
        let nanos = created_at.unix_nanos();
        let args = [
            now.to_string(),
            nanos.div_euclid(1_000_000_000).to_string(),
            nanos.rem_euclid(1_000_000_000).to_string(),
            event_id.as_str().to_owned(),
            retention_ms.to_string(),
            self.slack_ms.to_string(),
        ];
        let reply: Vec<String> = self
            .client
            .run(
                &self.scripts.apply,
                &[&self.head_key(stream), &self.event_key(stream, event_id)],
                &args,
            )
            .await?;
        let outcome = match reply.first().map(String::as_str) {
            Some("applied") => ApplyOutcome::Applied,
            Some("stale") => ApplyOutcome::Stale,
            Some("duplicate") => ApplyOutcome::Duplicate,
            _ => return Err(unexpected("apply", &reply)),
        };
        let head = match &reply[1..] {
            [cs, cn, id] => Some(head_from(cs, cn, id)?),
            _ => None,
        };
        if outcome != ApplyOutcome::Duplicate {
            let confirm_args = [
                now.to_string(),
                stream.as_str().to_owned(),
                retention_ms.to_string(),
                self.slack_ms.to_string(),
            ];
            // The stream recorded the event: that is the answer. A marker
            // left pending only narrows cross-stream duplicate detection.
            if let Err(e) = self
                .client
                .run::<i64, String>(&self.scripts.confirm, &[&marker], &confirm_args)
                .await
            {
                tracing::warn!(error = %e.chain(), "cannot confirm an event-id marker");
            }
        }
        Ok(ApplyResult { outcome, head })
    }

    async fn head(&self, stream: &ScopedKey, now: Millis) -> Result<Option<Head>, StoreError> {
        self.read_head(stream, now).await
    }

    /// Redis expires its keys by itself: nothing to reap.
    async fn purge_expired(&self, _now: Millis, _limit: u64) -> Result<PurgeReport, StoreError> {
        Ok(PurgeReport::default())
    }

    async fn next_expiry(&self) -> Result<Option<Millis>, StoreError> {
        Ok(None)
    }

    /// Also not ready while claims of the one-slot layout are moved.
    async fn ready(&self) -> Result<(), StoreError> {
        self.client.ready().await?;
        self.fence_floor().await.map(drop)
    }

    fn write_stats(&self) -> WriteStats {
        WriteStats::default()
    }

    async fn close(&self) {
        self.client.close();
        if let Some(upgrade) = &self.upgrade {
            upgrade.stop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A head Redis holds whose seconds overflow nanoseconds is malformed
    /// (it panicked a debug build's worker and wrapped in a release one).
    #[test]
    fn a_head_past_what_nanoseconds_hold_is_malformed() {
        let huge = "10000000000000000000000000000000";
        for (cs, cn) in [
            (huge, "0"),
            ("1", &i128::MAX.to_string()[..]),
            ("-10000000000000000000000000000000", "0"),
        ] {
            let Err(e) = head_from(cs, cn, "e1") else {
                panic!("{cs} {cn} was read as a head");
            };
            assert!(format!("{e:?}").contains("MalformedHead"), "{e:?}");
        }
        assert!(head_from("1700000000", "5", "e1").is_ok());
    }
}
