//! The shared inbox (`gateway.inbox = "shared"`): the gateway inbox in
//! Redis, so that any instance ingests and any instance delivers any event.
//!
//! A source's events are spread over `gateway.inbox_buckets` buckets by
//! their stream (an event without a stream, by its id). Everything of one
//! bucket carries one hash tag, `P:{i:SOURCE:BUCKET}`, so in a Redis
//! Cluster a bucket is one slot, and the buckets of a source spread over
//! the masters. Every step that must be atomic touches one event and its
//! stream, both in the event's bucket, and is one Lua script there
//! (`common.lua` lists the keys): the same steps, with the same invariants,
//! as the data file's write transaction (`store::redb::inbox`), with one
//! rule more, since several instances lease from one inbox: a stream's turn
//! stays with its leased event while the lease is live, so one event per
//! stream is in flight across the fleet.
//!
//! Reads that are not about one event (due events, listings, counts) ask
//! every bucket of a source and merge the answers.
//!
//! Bulk jobs' records are not about events: they live beside the buckets
//! under a hash tag of their own, `P:{j}` (`jobs.lua`). So does what the
//! instances agree on besides events, [`Inbox::fleet`] (`redis::fleet`).

mod codec;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::future::{join_all, try_join_all};
use redis::Script;

use self::codec::{Fields, LIST_FIELDS, created_key, decode, received_key};
use super::client::{Client, RedisFault, ms};
use super::fleet::RedisFleet;
use super::rewrite::Rewrites;
use crate::clock::Millis;
use crate::domain::{CreatedAt, ScopedKey};
use crate::store::StoreError;
use crate::store::fleet::Fleet;
use crate::store::inbox::{
    Attempt, Cursor, EraseOutcome, EventKey, EventStatus, Inbox, InboxEvent, IngestOutcome, Leased,
    LeasedEvent, ListOrder, NewEvent, RedeliverOutcome, ReplayMark, Retention, Settle, SourceDue,
    SourceSummary, StoredJob, TIMELINE_ATTEMPTS,
};

/// How the shared inbox is laid out and kept.
#[derive(Debug, Clone)]
pub struct SharedInboxOptions {
    /// Buckets per source (`gateway.inbox_buckets`): how far one source
    /// spreads over a cluster's masters.
    pub buckets: u16,
    /// How long after its receipt an event id stays a duplicate.
    pub dedupe_window: Duration,
    /// How long a lease outlives its last renewal (`gateway.lease_grace`).
    pub lease_grace: Duration,
}

/// The scripts, hashed once.
struct Scripts {
    ingest: Script,
    ingest_routed: Script,
    lease: Script,
    renew: Script,
    settle: Script,
    redeliver: Script,
    replay: Script,
    erase: Script,
    purge: Script,
    head: Script,
    /// Bulk jobs' records: a script of its own, without the buckets'
    /// common part.
    jobs: Script,
}

fn script(body: &str) -> Script {
    Script::new(&format!("{}\n{}", include_str!("common.lua"), body))
}

/// The gateway inbox in Redis, shared by every instance.
pub struct RedisInbox {
    client: Arc<Client>,
    /// Redis's files rewritten after erasures (see `rewrite`).
    rewrites: Arc<Rewrites>,
    opts: SharedInboxOptions,
    scripts: Scripts,
    slack_ms: u64,
    /// Sources this process has added to the set of sources.
    noted: Mutex<HashSet<String>>,
    /// Whether the layout in Redis was found to be this one.
    laid_out: AtomicBool,
    /// The fleet's delivery lanes, over the same connection.
    lanes: super::lanes::RedisLanes,
    /// What the instances on this inbox agree on besides its events, over
    /// the same connection.
    fleet: RedisFleet,
}

/// The layout's version: a change to how events are placed or stored
/// changes it, so an instance never reads a layout it does not know.
const LAYOUT_VERSION: u32 = 1;

impl std::fmt::Debug for RedisInbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisInbox")
            .field("client", &self.client)
            .field("buckets", &self.opts.buckets)
            .finish_non_exhaustive()
    }
}

/// FNV-1a: a bucket must not depend on the build or the process.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn unexpected(what: &'static str, reply: impl std::fmt::Debug) -> StoreError {
    RedisFault::Unexpected {
        what,
        reply: vec![format!("{reply:?}")],
    }
    .into()
}

/// One argument of a script, as bytes.
fn arg(v: impl ToString) -> Vec<u8> {
    v.to_string().into_bytes()
}

impl RedisInbox {
    /// The shared inbox over `client`'s connection.
    pub fn new(client: Arc<Client>, opts: SharedInboxOptions) -> Self {
        Self {
            slack_ms: ms(client.opts().expiry_slack),
            rewrites: Rewrites::new(client.clone()),
            lanes: super::lanes::RedisLanes::new(client.clone()),
            fleet: RedisFleet::new(client.clone()),
            client,
            opts: SharedInboxOptions {
                buckets: opts.buckets.max(1),
                ..opts
            },
            scripts: Scripts {
                ingest: script(include_str!("ingest.lua")),
                ingest_routed: script(include_str!("ingest_routed.lua")),
                lease: script(include_str!("lease.lua")),
                renew: script(include_str!("renew.lua")),
                settle: script(include_str!("settle.lua")),
                redeliver: script(include_str!("redeliver.lua")),
                replay: script(include_str!("replay.lua")),
                erase: script(include_str!("erase.lua")),
                purge: script(include_str!("purge.lua")),
                head: script(include_str!("head.lua")),
                jobs: Script::new(include_str!("jobs.lua")),
            },
            noted: Mutex::new(HashSet::new()),
            laid_out: AtomicBool::new(false),
        }
    }

    /// The shared inbox over a connection of its own. Call inside a tokio
    /// runtime.
    pub fn connect(
        opts: super::RedisOptions,
        inbox: SharedInboxOptions,
    ) -> Result<Self, StoreError> {
        Ok(Self::new(Arc::new(Client::new(opts)?), inbox))
    }

    /// The bucket of an event: by its stream, or its id without one.
    fn bucket_of(&self, key: &EventKey) -> u16 {
        let basis = key.stream.as_deref().unwrap_or(&key.event_id);
        u16::try_from(fnv1a(basis.as_bytes()) % u64::from(self.opts.buckets)).unwrap_or(0)
    }

    /// What ingest.lua (and ingest_routed.lua, before its own) takes after
    /// the bucket: the event's fields, its body, its dedupe record's end.
    fn ingest_args(&self, event: NewEvent, now: Millis) -> Result<Vec<Vec<u8>>, StoreError> {
        let headers =
            serde_json::to_vec(&event.headers).map_err(|e| StoreError::failed(e.to_string()))?;
        let window = ms(self.opts.dedupe_window);
        Ok(vec![
            arg(now),
            arg(&event.event_id),
            arg(event.stream.as_deref().unwrap_or("")),
            arg(event.stream.as_deref().map(hex::encode).unwrap_or_default()),
            arg(event.created_at.unix_nanos()),
            arg(created_key(event.created_at)),
            arg(event.received_at_ms),
            arg(received_key(event.received_at_ms)),
            headers,
            arg(event.body.len()),
            // The body as it came, byte for byte.
            event.body,
            arg(event.received_at_ms.saturating_add(window)),
            arg(self.slack_ms),
        ])
    }

    /// The prefix of every key of a bucket: one hash tag. A destination's
    /// lane (`SOURCE.DESTINATION`) shares its source's tag, so that an
    /// event's rows in every lane are in one slot, written by one script.
    fn bucket(&self, source: &str, bucket: u16) -> String {
        let prefix = &self.client.opts().prefix;
        match source.split_once('.') {
            Some((source, destination)) => {
                format!("{prefix}:{{i:{source}:{bucket}}}/{destination}")
            }
            None => format!("{prefix}:{{i:{source}:{bucket}}}"),
        }
    }

    /// Every bucket of a source.
    fn buckets(&self, source: &str) -> Vec<String> {
        (0..self.opts.buckets)
            .map(|b| self.bucket(source, b))
            .collect()
    }

    /// Checks, once per process, that the inbox in Redis is laid out as
    /// this instance places events (the first instance records its
    /// layout): an instance with another bucket count would look for
    /// events where they are not.
    async fn check_layout(&self) -> Result<(), StoreError> {
        if self.laid_out.load(Ordering::Relaxed) {
            return Ok(());
        }
        let ours = format!("v{LAYOUT_VERSION} buckets={}", self.opts.buckets);
        let key = format!("{}:{{i}}:layout", self.client.opts().prefix);
        // SET NX, then GET (not SET NX GET, which needs Redis 7): of two
        // first instances, one sets and both read the winner's.
        let mut set = redis::cmd("SET");
        set.arg(&key).arg(&ours).arg("NX");
        self.query::<Option<String>>(set).await?;
        let mut get = redis::cmd("GET");
        get.arg(&key);
        let found: Option<String> = self.query(get).await?;
        match found {
            Some(theirs) if theirs != ours => Err(StoreError::failed(format!(
                "the shared inbox in Redis is laid out as {theirs:?}, this instance as {ours:?}: \
                 every instance must run with the same gateway.inbox_buckets (and a dedupd \
                 that knows the layout)"
            ))),
            _ => {
                self.laid_out.store(true, Ordering::Relaxed);
                Ok(())
            }
        }
    }

    fn sources_key(&self) -> String {
        format!("{}:{{i}}:sources", self.client.opts().prefix)
    }

    /// Runs `jobs.lua` with `args` on the jobs' two keys (one slot).
    async fn run_jobs<T: redis::FromRedisValue>(
        &self,
        args: Vec<Vec<u8>>,
    ) -> Result<T, StoreError> {
        let prefix = &self.client.opts().prefix;
        let records = format!("{prefix}:{{j}}:jobs");
        let cancelled = format!("{prefix}:{{j}}:cancelled");
        self.client
            .run(&self.scripts.jobs, &[&records, &cancelled], &args)
            .await
    }

    /// Runs one of the inbox's scripts in bucket `t`.
    async fn run<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        t: &str,
        mut args: Vec<Vec<u8>>,
    ) -> Result<T, StoreError> {
        args.insert(0, t.as_bytes().to_vec());
        let count_key = format!("{t}:n");
        self.client.run(script, &[&count_key], &args).await
    }

    async fn query<T: redis::FromRedisValue>(&self, cmd: redis::Cmd) -> Result<T, StoreError> {
        self.client.query(&cmd).await
    }

    /// Adds `source` to the set of sources once per process.
    async fn note_source(&self, source: &str) -> Result<(), StoreError> {
        if self
            .noted
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(source)
        {
            return Ok(());
        }
        let mut cmd = redis::cmd("SADD");
        cmd.arg(self.sources_key()).arg(source);
        self.query::<i64>(cmd).await?;
        self.noted
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(source.to_owned());
        Ok(())
    }

    /// Every source ever noted, in name order.
    async fn noted_sources(&self) -> Result<Vec<String>, StoreError> {
        let mut cmd = redis::cmd("SMEMBERS");
        cmd.arg(self.sources_key());
        let mut sources: Vec<String> = self.query(cmd).await?;
        sources.sort();
        Ok(sources)
    }

    /// A source's counts by status (indexed by the status byte), summed
    /// over its buckets.
    async fn counts(&self, source: &str) -> Result<[u64; 6], StoreError> {
        let replies = try_join_all(self.buckets(source).into_iter().map(|t| {
            let mut cmd = redis::cmd("HMGET");
            cmd.arg(format!("{t}:n"))
                .arg(&["0", "1", "2", "3", "4", "5"]);
            self.query::<Vec<Option<i64>>>(cmd)
        }))
        .await?;
        Ok(summed(replies))
    }

    /// The bucket (prefix) that holds event `id` of `source`, found by
    /// asking every bucket: for the operator's lookups, which know no
    /// stream.
    async fn find(&self, source: &str, id: &str) -> Result<Option<String>, StoreError> {
        Ok(self.find_all(source, id).await?.into_iter().next())
    }

    /// Every bucket that holds event `id` of `source`: one, unless the id
    /// was posted with two streams.
    async fn find_all(&self, source: &str, id: &str) -> Result<Vec<String>, StoreError> {
        let buckets = self.buckets(source);
        let found = try_join_all(buckets.iter().map(|t| {
            let mut cmd = redis::cmd("EXISTS");
            cmd.arg(format!("{t}:e:{id}"));
            self.query::<i64>(cmd)
        }))
        .await?;
        Ok(buckets
            .into_iter()
            .zip(found)
            .filter(|(_, n)| *n > 0)
            .map(|(t, _)| t)
            .collect())
    }

    /// Event `id` in bucket `t`: every field but its body (with `body`,
    /// that too).
    async fn load(
        &self,
        source: &str,
        t: &str,
        id: &str,
        body: bool,
    ) -> Result<Option<InboxEvent>, StoreError> {
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(format!("{t}:e:{id}")).arg(LIST_FIELDS);
        if body {
            cmd.arg("bd");
        }
        let values: Vec<Option<Vec<u8>>> = self.query(cmd).await?;
        let mut fields = Fields::from_hmget(LIST_FIELDS, &values);
        if body {
            fields.body = values.last().cloned().flatten();
        }
        decode(source, id, &fields)
    }

    /// Sets a stream's head to (`created_at`, `event_id`) until `until`,
    /// unless its live head is as new or newer: whether it was set. For
    /// moving heads kept elsewhere (a local inbox's) into the shared inbox.
    pub async fn import_head(
        &self,
        source: &str,
        stream: &str,
        created_at: CreatedAt,
        event_id: &str,
        until: Millis,
        now: Millis,
    ) -> Result<bool, StoreError> {
        let key = EventKey::new(source, event_id, Some(stream));
        let t = self.bucket(source, self.bucket_of(&key));
        let args = vec![
            arg(now),
            arg(hex::encode(stream)),
            arg(created_key(created_at)),
            arg(event_id),
            arg(until),
            arg(self.slack_ms),
        ];
        let set: i64 = self.run(&self.scripts.head, &t, args).await?;
        Ok(set == 1)
    }

    /// Records event `id` of `source` (with `stream`) as seen until
    /// `until` unless a record of it is there already: for moving the
    /// dedupe records of a local inbox's settled events into the shared
    /// inbox, so a provider's retry of one stays a duplicate. Whether it
    /// was recorded.
    pub async fn import_dedupe(
        &self,
        source: &str,
        event_id: &str,
        stream: Option<&str>,
        until: Millis,
        now: Millis,
    ) -> Result<bool, StoreError> {
        if until <= now {
            return Ok(false);
        }
        let key = EventKey::new(source, event_id, stream);
        let t = self.bucket(source, self.bucket_of(&key));
        let mut cmd = redis::cmd("SET");
        cmd.arg(format!("{t}:d:{event_id}"))
            .arg(until)
            .arg("PX")
            .arg(until.saturating_sub(now).saturating_add(self.slack_ms))
            .arg("NX");
        let set: Option<String> = self.query(cmd).await?;
        Ok(set.is_some())
    }

    /// One settle script: the shared part of the three settles.
    #[allow(clippy::too_many_arguments)]
    async fn settle_with(
        &self,
        event: &EventKey,
        lease: u64,
        settle: &Settle,
        attempt: Option<&Attempt>,
        apply: Option<(CreatedAt, u64)>,
        retention: Retention,
        now: Millis,
    ) -> Result<(), StoreError> {
        let t = self.bucket(&event.source, self.bucket_of(event));
        let (kind, attempted, error, retry_at, keep) = match settle {
            Settle::Delivered { attempted } => {
                ("delivered", *attempted, "", 0, retention.delivered_ms)
            }
            Settle::Stale => ("stale", false, "", 0, retention.delivered_ms),
            Settle::Retry {
                retry_at,
                error,
                attempted,
            } => ("retry", *attempted, error.as_str(), *retry_at, 0),
            Settle::Dead { error } => ("dead", true, error.as_str(), 0, retention.dead_ms),
        };
        let attempt = match attempt {
            Some(a) => serde_json::to_vec(a).map_err(|e| StoreError::failed(e.to_string()))?,
            None => Vec::new(),
        };
        let (hs, ca, head_until) = match (apply, &event.stream) {
            (Some((created_at, retention_ms)), Some(stream)) => (
                arg(hex::encode(stream)),
                arg(created_key(created_at)),
                arg(now.saturating_add(retention_ms)),
            ),
            _ => (Vec::new(), Vec::new(), Vec::new()),
        };
        let args = vec![
            arg(now),
            arg(&event.event_id),
            arg(lease),
            arg(kind),
            arg(u8::from(attempted)),
            arg(error),
            arg(retry_at),
            arg(now.saturating_add(keep)),
            attempt,
            arg(TIMELINE_ATTEMPTS),
            hs,
            ca,
            head_until,
            arg(self.slack_ms),
        ];
        let reply: String = self.run(&self.scripts.settle, &t, args).await?;
        match reply.as_str() {
            "done" | "ignored" | "gone" => Ok(()),
            _ => Err(unexpected("settle", reply)),
        }
    }
}

/// A source's counts by status summed over its buckets' replies
/// (`HMGET {t}:n 0..5`): saturating, whatever Redis holds (three buckets
/// near i64::MAX overflowed).
fn summed(replies: Vec<Vec<Option<i64>>>) -> [u64; 6] {
    let mut sum = [0u64; 6];
    for reply in replies {
        for (total, n) in sum.iter_mut().zip(reply) {
            *total = total.saturating_add(u64::try_from(n.unwrap_or(0)).unwrap_or(0));
        }
    }
    sum
}

/// An ingest script's answer.
fn ingested(reply: String) -> Result<IngestOutcome, StoreError> {
    match reply.as_str() {
        "accepted" => Ok(IngestOutcome::Accepted),
        "duplicate" => Ok(IngestOutcome::Duplicate),
        _ => Err(unexpected("ingest", reply)),
    }
}

#[async_trait]
impl Inbox for RedisInbox {
    async fn ingest(&self, event: NewEvent, now: Millis) -> Result<IngestOutcome, StoreError> {
        self.check_layout().await?;
        let t = self.bucket(&event.source, self.bucket_of(&event.key()));
        self.note_source(&event.source).await?;
        let args = self.ingest_args(event, now)?;
        let reply: String = self.run(&self.scripts.ingest, &t, args).await?;
        ingested(reply)
    }

    async fn ingest_routed(
        &self,
        event: NewEvent,
        lanes: Vec<String>,
        known_in: Vec<String>,
        filtered_ms: u64,
        now: Millis,
    ) -> Result<IngestOutcome, StoreError> {
        self.check_layout().await?;
        let b = self.bucket_of(&event.key());
        let t = self.bucket(&event.source, b);
        self.note_source(&event.source).await?;
        for lane in &lanes {
            self.note_source(lane).await?;
        }
        let mut args = self.ingest_args(event, now)?;
        args.push(arg(now.saturating_add(filtered_ms)));
        args.push(arg(lanes.len()));
        args.extend(lanes.iter().map(|l| arg(self.bucket(l, b))));
        args.push(arg(known_in.len()));
        args.extend(known_in.iter().map(|l| arg(self.bucket(l, b))));
        let reply: String = self.run(&self.scripts.ingest_routed, &t, args).await?;
        ingested(reply)
    }

    async fn knows_event(&self, event: &EventKey, now: Millis) -> Result<bool, StoreError> {
        let t = self.bucket(&event.source, self.bucket_of(event));
        let id = &event.event_id;
        let mut exists = redis::cmd("EXISTS");
        exists.arg(format!("{t}:e:{id}"));
        let mut seen = redis::cmd("GET");
        seen.arg(format!("{t}:d:{id}"));
        let (row, record) =
            tokio::try_join!(self.query::<i64>(exists), self.query::<Option<u64>>(seen))?;
        Ok(row > 0 || record.is_some_and(|until| until > now))
    }

    /// The ingest script checks in the same round trip.
    fn precheck_duplicates(&self) -> bool {
        false
    }

    fn written_elsewhere(&self) -> bool {
        true
    }

    async fn lease_holds(&self, event: &EventKey, lease: u64) -> Result<bool, StoreError> {
        let t = self.bucket(&event.source, self.bucket_of(event));
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(format!("{t}:e:{}", event.event_id))
            .arg("st")
            .arg("ls");
        let values: Vec<Option<String>> = self.query(cmd).await?;
        Ok(matches!(
            values.as_slice(),
            [Some(st), Some(ls)] if st == "0" && ls.parse::<u64>().ok() == Some(lease)
        ))
    }

    fn lanes(&self) -> Option<&dyn crate::store::lanes::Lanes> {
        Some(&self.lanes)
    }

    fn lease_grace(&self) -> Option<Duration> {
        Some(self.opts.lease_grace)
    }

    /// One script per bucket, all buckets at once. A bucket that cannot be
    /// reached answers `None` for its leases (they run out unless a later
    /// renewal lands in time); the others are renewed all the same.
    async fn renew_leases(
        &self,
        leases: Vec<(EventKey, u64)>,
        until: Millis,
        now: Millis,
    ) -> Result<Vec<Option<crate::store::inbox::Renewal>>, StoreError> {
        let mut by_bucket: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (i, (key, _)) in leases.iter().enumerate() {
            let t = self.bucket(&key.source, self.bucket_of(key));
            by_bucket.entry(t).or_default().push(i);
        }
        let replies = join_all(by_bucket.iter().map(|(t, members)| {
            let mut args = vec![arg(now), arg(until)];
            for i in members {
                let (key, lease) = &leases[*i];
                args.push(arg(&key.event_id));
                args.push(arg(lease));
            }
            async move { self.run::<Vec<i64>>(&self.scripts.renew, t, args).await }
        }))
        .await;
        let mut renewed = vec![None; leases.len()];
        let mut failed = None;
        let mut answered = false;
        for ((t, members), reply) in by_bucket.iter().zip(replies) {
            let reply = match reply {
                Ok(reply) if reply.len() == members.len() => reply,
                Ok(reply) => return Err(unexpected("renew", reply)),
                Err(e) => {
                    tracing::debug!(bucket = %t, error = %e.chain(), "cannot renew the leases of a bucket");
                    failed.get_or_insert(e);
                    continue;
                }
            };
            answered = true;
            for (i, r) in members.iter().zip(reply) {
                use crate::store::inbox::Renewal;
                renewed[*i] = Some(match r {
                    1 => Renewal::Renewed,
                    2 => Renewal::Ended,
                    _ => Renewal::Lost,
                });
            }
        }
        match failed {
            Some(e) if !answered => Err(e),
            _ => Ok(renewed),
        }
    }

    fn dedupe_window(&self) -> Duration {
        self.opts.dedupe_window
    }

    fn fleet(&self) -> Option<&dyn Fleet> {
        Some(&self.fleet)
    }

    /// Also records the layout and this instance's sources again: a Redis
    /// that lost its data (restarted without persistence, an empty
    /// replica promoted) gets them back at the next readiness check.
    async fn ready(&self) -> Result<(), StoreError> {
        self.client.ready().await?;
        self.laid_out.store(false, Ordering::Relaxed);
        self.check_layout().await?;
        let noted: Vec<String> = self
            .noted
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .cloned()
            .collect();
        if !noted.is_empty() {
            let mut cmd = redis::cmd("SADD");
            cmd.arg(self.sources_key()).arg(noted);
            self.query::<i64>(cmd).await?;
        }
        Ok(())
    }

    async fn lease(
        &self,
        events: Vec<(EventKey, Millis)>,
        stale_check: Option<Retention>,
        now: Millis,
    ) -> Result<Leased, StoreError> {
        self.check_layout().await?;
        let stale_until = stale_check.map_or(0, |r| now.saturating_add(r.delivered_ms));
        let replies = join_all(events.iter().map(|(key, until)| {
            let t = self.bucket(&key.source, self.bucket_of(key));
            let args = vec![
                arg(now),
                arg(&key.event_id),
                arg(until),
                arg(u8::from(stale_check.is_some())),
                arg(stale_until),
            ];
            async move { self.run::<Vec<String>>(&self.scripts.lease, &t, args).await }
        }))
        .await;
        let mut out = Leased::default();
        let mut failed = None;
        for ((key, _), reply) in events.into_iter().zip(replies) {
            // One event's failure (its master gone, a timeout) must not
            // throw away the others' leases: they are answered, and the
            // call fails only when none got through.
            let reply = match reply {
                Ok(reply) => reply,
                Err(e) => {
                    tracing::debug!(source = %key.source, event_id = %key.event_id, error = %e.chain(), "cannot lease an event; it comes due again");
                    failed.get_or_insert(e);
                    continue;
                }
            };
            match reply.first().map(String::as_str) {
                None => {}
                Some("stale") => out.stale.push((key.source, key.event_id)),
                Some("leased") => {
                    let num = |i: usize| reply.get(i).and_then(|v| v.parse::<u64>().ok());
                    let (Some(lease), Some(attempts)) = (num(1), num(2)) else {
                        return Err(unexpected("lease", reply));
                    };
                    let replay = match reply.get(4).map(String::as_str) {
                        None | Some("") => None,
                        Some(job) => {
                            let Some(base) = num(5) else {
                                return Err(unexpected("lease", reply));
                            };
                            Some(ReplayMark {
                                job: job.to_owned(),
                                base_attempts: u32::try_from(base).unwrap_or(u32::MAX),
                            })
                        }
                    };
                    out.leased.push(LeasedEvent {
                        source: key.source,
                        event_id: key.event_id,
                        lease,
                        attempts: u32::try_from(attempts).unwrap_or(u32::MAX),
                        force: reply.get(3).map(String::as_str) == Some("1"),
                        replay,
                    });
                }
                Some(_) => return Err(unexpected("lease", reply)),
            }
        }
        match failed {
            Some(e) if out.leased.is_empty() && out.stale.is_empty() => Err(e),
            _ => Ok(out),
        }
    }

    async fn settle(
        &self,
        event: &EventKey,
        lease: u64,
        settle: Settle,
        retention: Retention,
        now: Millis,
    ) -> Result<(), StoreError> {
        self.settle_with(event, lease, &settle, None, None, retention, now)
            .await
    }

    async fn settle_attempt(
        &self,
        event: &EventKey,
        lease: u64,
        settle: Settle,
        attempt: Attempt,
        retention: Retention,
        now: Millis,
    ) -> Result<(), StoreError> {
        self.settle_with(event, lease, &settle, Some(&attempt), None, retention, now)
            .await
    }

    async fn settle_delivered(
        &self,
        event: &EventKey,
        lease: u64,
        apply: Option<(ScopedKey, ScopedKey, CreatedAt, u64)>,
        attempt: Option<Attempt>,
        retention: Retention,
        now: Millis,
    ) -> Result<(), StoreError> {
        let settle = Settle::Delivered { attempted: true };
        let apply = apply.map(|(_, _, created_at, retention_ms)| (created_at, retention_ms));
        self.settle_with(
            event,
            lease,
            &settle,
            attempt.as_ref(),
            apply,
            retention,
            now,
        )
        .await
    }

    async fn redeliver(
        &self,
        source: &str,
        event_id: &str,
        now: Millis,
    ) -> Result<RedeliverOutcome, StoreError> {
        // An id posted with two streams is in two buckets: the one that
        // can be redelivered is.
        let mut outcome = RedeliverOutcome::NotFound;
        for t in self.find_all(source, event_id).await? {
            let args = vec![arg(now), arg(event_id)];
            let reply: String = self.run(&self.scripts.redeliver, &t, args).await?;
            outcome = match reply.as_str() {
                "requeued" => return Ok(RedeliverOutcome::Requeued),
                "not_found" => outcome,
                other => match other.parse::<u8>() {
                    Ok(b) => RedeliverOutcome::NotRedeliverable(EventStatus::from_byte(b)),
                    Err(_) => return Err(unexpected("redeliver", reply)),
                },
            };
        }
        Ok(outcome)
    }

    async fn replay(
        &self,
        source: &str,
        event_id: &str,
        job: &str,
        now: Millis,
    ) -> Result<RedeliverOutcome, StoreError> {
        // As a redeliver: of an id posted with two streams, the copy that
        // can be replayed is.
        let mut outcome = RedeliverOutcome::NotFound;
        for t in self.find_all(source, event_id).await? {
            let args = vec![arg(now), arg(event_id), arg(job)];
            let reply: String = self.run(&self.scripts.replay, &t, args).await?;
            outcome = match reply.as_str() {
                "requeued" => return Ok(RedeliverOutcome::Requeued),
                "not_found" => outcome,
                other => match other.parse::<u8>() {
                    Ok(b) => RedeliverOutcome::NotRedeliverable(EventStatus::from_byte(b)),
                    Err(_) => return Err(unexpected("replay", reply)),
                },
            };
        }
        Ok(outcome)
    }

    async fn erase(
        &self,
        source: &str,
        event_id: &str,
        retention_ms: u64,
        now: Millis,
    ) -> Result<EraseOutcome, StoreError> {
        // Every copy of an id posted with two streams: an erasure leaves
        // no body behind.
        let mut outcome = EraseOutcome::NotFound;
        for t in self.find_all(source, event_id).await? {
            let args = vec![
                arg(now),
                arg(event_id),
                arg(now.saturating_add(retention_ms)),
            ];
            let reply: String = self.run(&self.scripts.erase, &t, args).await?;
            outcome = match reply.as_str() {
                "erased" => EraseOutcome::Erased,
                "already" if outcome == EraseOutcome::NotFound => EraseOutcome::AlreadyErased,
                "already" | "not_found" => outcome,
                _ => return Err(unexpected("erase", reply)),
            };
        }
        if outcome != EraseOutcome::NotFound {
            // Out of memory now; out of Redis's files once rewritten (an
            // erasure asked again asks again, should the last have failed).
            self.rewrites.erased().await;
        }
        Ok(outcome)
    }

    async fn put_job(&self, id: &str, record: Vec<u8>, _now: Millis) -> Result<(), StoreError> {
        let reply: i64 = self.run_jobs(vec![arg("put"), arg(id), record]).await?;
        match reply {
            1 => Ok(()),
            _ => Err(unexpected("a job's put", reply)),
        }
    }

    async fn end_job(&self, id: &str, record: Vec<u8>, now: Millis) -> Result<(), StoreError> {
        self.put_job(id, record, now).await?;
        // The versions before, in Redis's files until rewritten.
        self.rewrites.erased().await;
        Ok(())
    }

    async fn cancel_job(&self, id: &str, _now: Millis) -> Result<bool, StoreError> {
        let reply: i64 = self.run_jobs(vec![arg("cancel"), arg(id)]).await?;
        Ok(reply == 1)
    }

    async fn delete_job(&self, id: &str, _now: Millis) -> Result<(), StoreError> {
        self.run_jobs::<i64>(vec![arg("delete"), arg(id)])
            .await
            .map(|_| ())
    }

    async fn jobs(&self) -> Result<Vec<StoredJob>, StoreError> {
        // A script, so the records and the marks are read at one moment.
        let reply: Vec<Vec<u8>> = self.run_jobs(vec![arg("list")]).await?;
        if !reply.len().is_multiple_of(3) {
            return Err(unexpected("the jobs' list", reply.len()));
        }
        let mut out: Vec<StoredJob> = reply
            .chunks_exact(3)
            .map(|c| StoredJob {
                id: String::from_utf8_lossy(&c[0]).into_owned(),
                record: c[1].clone(),
                cancelled: c[2] == b"1",
            })
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    async fn purge_pending(
        &self,
        sources: Vec<String>,
        before: Millis,
        limit: u64,
        now: Millis,
    ) -> Result<u64, StoreError> {
        let mut left = limit;
        for source in sources {
            if left == 0 {
                break;
            }
            let take = usize::try_from(left).unwrap_or(usize::MAX);
            let buckets = self.buckets(&source);
            let firsts = try_join_all(buckets.iter().map(|t| {
                let mut cmd = redis::cmd("ZRANGE");
                cmd.arg(format!("{t}:s:0"))
                    .arg("-")
                    .arg(format!("({}", received_key(before)))
                    .arg("BYLEX")
                    .arg("LIMIT")
                    .arg(0)
                    .arg(take);
                self.query::<Vec<String>>(cmd)
            }))
            .await?;
            // The oldest received first, over every bucket.
            let mut gone: Vec<(String, usize)> = firsts
                .into_iter()
                .enumerate()
                .flat_map(|(b, members)| members.into_iter().map(move |m| (m, b)))
                .collect();
            gone.sort();
            gone.truncate(take);
            let mut by_bucket: BTreeMap<usize, Vec<Vec<u8>>> = BTreeMap::new();
            for (member, b) in gone {
                let id = member.get(21..).unwrap_or_default();
                by_bucket.entry(b).or_default().push(arg(id));
            }
            for (b, ids) in by_bucket {
                let mut args = vec![arg(now), arg("pending")];
                args.extend(ids);
                let reply: Vec<u64> = self.run(&self.scripts.purge, &buckets[b], args).await?;
                left = left.saturating_sub(reply.first().copied().unwrap_or(0));
            }
        }
        Ok(limit - left)
    }

    async fn purge_settled(&self, now: Millis, limit: u64) -> Result<(u64, bool), StoreError> {
        let mut left = limit;
        let mut more = false;
        for source in self.noted_sources().await? {
            for t in self.buckets(&source) {
                if left == 0 {
                    // Only whether more are left.
                    let mut count = redis::cmd("ZCOUNT");
                    count.arg(format!("{t}:x")).arg("-inf").arg(now);
                    if self.query::<u64>(count).await? > 0 {
                        return Ok((limit, true));
                    }
                    continue;
                }
                let args = vec![arg(now), arg("settled"), arg(left)];
                let reply: Vec<u64> = self.run(&self.scripts.purge, &t, args).await?;
                left = left.saturating_sub(reply.first().copied().unwrap_or(0));
                more |= reply.get(1).copied().unwrap_or(0) == 1;
            }
        }
        Ok((limit - left, more))
    }

    async fn due_events(
        &self,
        now: Millis,
        wants: Vec<(String, usize)>,
        max_bytes: u64,
    ) -> Result<Vec<SourceDue>, StoreError> {
        self.check_layout().await?;
        let mut out = Vec::with_capacity(wants.len());
        for (source, limit) in wants {
            let buckets = self.buckets(&source);
            // The first `limit` + 1 runnable events of each bucket, due or
            // not: merged, they hold the first `limit` of the source and
            // the next due time after them.
            let stop = isize::try_from(limit).unwrap_or(isize::MAX);
            let firsts = try_join_all(buckets.iter().map(|t| {
                let mut cmd = redis::cmd("ZRANGE");
                cmd.arg(format!("{t}:run"))
                    .arg(0)
                    .arg(stop)
                    .arg("WITHSCORES");
                self.query::<Vec<(String, f64)>>(cmd)
            }))
            .await?;
            let mut runnable: Vec<(u64, String, usize)> = firsts
                .into_iter()
                .enumerate()
                .flat_map(|(b, entries)| {
                    entries
                        .into_iter()
                        .map(move |(id, due)| (due as u64, id, b))
                })
                .collect();
            runnable.sort();
            // The rows of the candidates at once (bodies left out), then
            // the limits, then the bodies of the chosen at once.
            let candidates: Vec<&(u64, String, usize)> = runnable
                .iter()
                .take_while(|(at, _, _)| *at <= now)
                .take(limit)
                .collect();
            let rows = try_join_all(
                candidates
                    .iter()
                    .map(|(_, id, b)| self.load(&source, &buckets[*b], id, false)),
            )
            .await?;
            let mut found = SourceDue::default();
            let mut bytes = 0u64;
            let mut chosen = Vec::new();
            let mut rows = rows.into_iter();
            let mut ghosts = Vec::new();
            for (at, id, b) in &runnable {
                if *at > now || chosen.len() >= limit {
                    found.next = Some(*at);
                    break;
                }
                let Some(row) = rows.next() else {
                    // Past the rows read (some read were gone): the next
                    // read takes it.
                    found.next = Some(*at);
                    break;
                };
                // Gone since the index was read: reaped, or lost (deleted
                // by hand, evicted), which the lease script cleans up.
                let Some(e) = row else {
                    ghosts.push((*b, id.clone()));
                    continue;
                };
                let size = u64::try_from(e.body_bytes).unwrap_or(u64::MAX);
                if !chosen.is_empty() && bytes.saturating_add(size) > max_bytes {
                    found.next = Some(*at);
                    break;
                }
                bytes = bytes.saturating_add(size);
                chosen.push((e, *b));
            }
            let bodies = try_join_all(chosen.iter().map(|(e, b)| {
                let mut cmd = redis::cmd("HGET");
                cmd.arg(format!("{}:e:{}", buckets[*b], e.event_id))
                    .arg("bd");
                self.query::<Option<Vec<u8>>>(cmd)
            }))
            .await?;
            for (b, id) in ghosts {
                let args = vec![arg(now), arg(&id), arg("ghost"), arg(0), arg(0)];
                self.run::<Vec<String>>(&self.scripts.lease, &buckets[b], args)
                    .await?;
            }
            for ((e, _), body) in chosen.into_iter().zip(bodies) {
                if let Some(body) = body {
                    found.events.push(InboxEvent { body, ..e });
                }
            }
            out.push(found);
        }
        Ok(out)
    }

    async fn inbox_sources(&self) -> Result<Vec<(String, u64)>, StoreError> {
        let mut out = Vec::new();
        for source in self.noted_sources().await? {
            let counts = self.counts(&source).await?;
            if counts.iter().any(|&n| n > 0) {
                out.push((source, counts[0]));
            }
        }
        Ok(out)
    }

    async fn inbox_summary(&self) -> Result<Vec<SourceSummary>, StoreError> {
        let mut out = Vec::new();
        for source in self.noted_sources().await? {
            let c = self.counts(&source).await?;
            if c.iter().all(|&n| n == 0) {
                continue;
            }
            let oldest_pending_ms = if c[0] > 0 {
                let firsts = try_join_all(self.buckets(&source).into_iter().map(|t| {
                    let mut cmd = redis::cmd("ZRANGE");
                    cmd.arg(format!("{t}:s:0")).arg(0).arg(0);
                    self.query::<Vec<String>>(cmd)
                }))
                .await?;
                firsts
                    .iter()
                    .flatten()
                    .filter_map(|m| m.get(..20)?.parse::<u64>().ok())
                    .min()
            } else {
                None
            };
            out.push(SourceSummary {
                source,
                pending: c[0],
                delivered: c[1],
                stale: c[2],
                dead: c[3],
                erased: c[4],
                filtered: c[5],
                oldest_pending_ms,
            });
        }
        Ok(out)
    }

    async fn has_source(&self, source: &str) -> Result<bool, StoreError> {
        Ok(self.counts(source).await?.iter().any(|&n| n > 0))
    }

    async fn inbox_event(
        &self,
        source: &str,
        event_id: &str,
    ) -> Result<Option<InboxEvent>, StoreError> {
        let Some(t) = self.find(source, event_id).await? else {
            return Ok(None);
        };
        let Some(mut e) = self.load(source, &t, event_id, true).await? else {
            return Ok(None);
        };
        let mut cmd = redis::cmd("LRANGE");
        cmd.arg(format!("{t}:t:{event_id}")).arg(0).arg(-1);
        let timeline: Vec<Vec<u8>> = self.query(cmd).await?;
        e.timeline = timeline
            .iter()
            .filter_map(|a| serde_json::from_slice(a).ok())
            .collect();
        Ok(Some(e))
    }

    async fn list_events(
        &self,
        source: &str,
        status: EventStatus,
        order: ListOrder,
        after: Option<Cursor>,
        limit: usize,
    ) -> Result<(Vec<InboxEvent>, Option<Cursor>), StoreError> {
        let buckets = self.buckets(source);
        let cursor = after.map(|(at, id)| format!("({}:{id}", received_key(at)));
        let s = status.to_byte();
        let pages = try_join_all(buckets.iter().map(|t| {
            let mut cmd = redis::cmd("ZRANGE");
            cmd.arg(format!("{t}:s:{s}"));
            match order {
                ListOrder::OldestFirst => {
                    cmd.arg(cursor.as_deref().unwrap_or("-"))
                        .arg("+")
                        .arg("BYLEX");
                }
                ListOrder::NewestFirst => {
                    cmd.arg(cursor.as_deref().unwrap_or("+"))
                        .arg("-")
                        .arg("BYLEX")
                        .arg("REV");
                }
            }
            cmd.arg("LIMIT").arg(0).arg(limit.saturating_add(1));
            self.query::<Vec<String>>(cmd)
        }))
        .await?;
        let mut members: Vec<(String, usize)> = pages
            .into_iter()
            .enumerate()
            .flat_map(|(b, page)| page.into_iter().map(move |m| (m, b)))
            .collect();
        members.sort();
        if order == ListOrder::NewestFirst {
            members.reverse();
        }
        let more = members.len() > limit;
        members.truncate(limit);
        let loaded = try_join_all(members.iter().map(|(m, b)| {
            let id = m.get(21..).unwrap_or_default();
            self.load(source, &buckets[*b], id, false)
        }))
        .await?;
        // A listing shows no headers, as the data file's (sealed there).
        let events: Vec<InboxEvent> = loaded
            .into_iter()
            .flatten()
            .map(|e| InboxEvent {
                headers: Vec::new(),
                ..e
            })
            .collect();
        // From the last member read, not the last event loaded: a page
        // whose events were all reaped meanwhile still moves on.
        let next = if more {
            members.last().and_then(|(m, _)| {
                let at = m.get(..20)?.parse::<u64>().ok()?;
                Some((at, m.get(21..)?.to_owned()))
            })
        } else {
            None
        };
        Ok((events, next))
    }

    /// Redis has no writer of dedupd's to get stuck: its outages show in
    /// readiness, and the watchdog must not restart dedupd for them.
    async fn writer_responds(&self, _within: Duration) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::summed;

    #[test]
    fn counts_saturate_and_ignore_what_is_not_a_count() {
        let near = Some(i64::MAX);
        let sum = summed(vec![
            vec![near, Some(-5)],
            vec![near, None],
            vec![near, Some(2)],
        ]);
        assert_eq!(sum, [u64::MAX, 2, 0, 0, 0, 0]);
    }
}
