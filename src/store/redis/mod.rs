//! The Redis backend (cargo feature `redis`): claims, fences, applied events
//! and stream heads shared by several dedupd instances.
//!
//! Every check-and-set is one Lua script, run with EVALSHA (reloaded on
//! NOSCRIPT by [`redis::Script`]). Scripts take the caller's clock as an
//! argument and store each record's expiry, so behaviour matches the redb
//! store exactly; each key also gets a Redis expiry (`PEXPIRE`, the record's
//! TTL plus a small slack) so Redis reclaims memory by itself and the reaper
//! has nothing to do here.
//!
//! Key layout (`P` is the configured prefix; `hex(…)` keeps user text out
//! of hash tags, so no name can end a tag early or collide with another key):
//! - `{P}:c:{key}` claims and `{P}:fence` the fence counter: one hash tag,
//!   so a claim and the counter are in one slot and a claim's fence is taken
//!   atomically with it. In a Redis Cluster all claims live in that slot.
//! - `P:{s:hex(stream)}:head` and `P:{s:hex(stream)}:e:{event}`: a stream's
//!   head and its applied events share a hash tag, so one slot holds a stream.
//! - `P:{e:hex(event)}:seen`: which stream an event id was first applied to,
//!   so an id is a duplicate on every stream, as in the redb store. It is
//!   another slot, so it is set (briefly) before the stream's script runs and
//!   confirmed for the retention after it.

mod sentinel;

use std::time::Duration;

use async_trait::async_trait;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr,
};
use redis::{FromRedisValue, RedisError, Script};
use tokio::sync::OnceCell;

use self::sentinel::SentinelConn;

use super::{
    ApplyOutcome, ApplyResult, ClaimOutcome, ClaimState, ClaimView, DoneOutcome, ExtendOutcome,
    Head, PurgeReport, ReleaseOutcome, Store, StoreError, WriteStats,
};
use crate::clock::Millis;
use crate::domain::{CreatedAt, Durability, Fingerprint, ScopedKey, Token, Ttl};

/// How to reach Redis.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// `redis://host:port/db`, `rediss://…` or `redis+unix:///path/redis.sock`.
    pub url: String,
    /// Cluster nodes (`redis://host:port`); when set, the cluster client is
    /// used and `url` is ignored.
    pub cluster_nodes: Vec<String>,
    /// Prefix of every key; no `{` or `}`.
    pub prefix: String,
    /// Redis keeps a key this long past its record's expiry.
    pub expiry_slack: Duration,
    /// Time allowed to connect.
    pub connect_timeout: Duration,
    /// Time allowed for an answer.
    pub response_timeout: Duration,
    /// What an acknowledged write survives (see [`Durability`]).
    pub durability: Durability,
    /// How long a write waits for its replicas (`Durability::Replicas`).
    pub replicas_timeout: Duration,
    /// Sentinels (`redis://host:port`); when set, dedupd connects to the
    /// master they name [`RedisOptions::sentinel_master`], with `url`'s
    /// credentials and database.
    pub sentinels: Vec<String>,
    /// The master's name among the sentinels.
    pub sentinel_master: String,
}

/// A connection to one node, to the master Sentinel names, or to a
/// cluster; each reconnects by itself.
#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Sentinel(std::sync::Arc<SentinelConn>),
    Cluster(ClusterConnection),
}

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
    opts: RedisOptions,
    /// Connected on first use, so dedupd starts (not ready) while Redis is
    /// down and recovers when it comes back. A single node's connection
    /// manager is created lazily at once and reconnects by itself.
    conn: OnceCell<Conn>,
    /// Held while a first cluster connect is under way.
    connecting: tokio::sync::Mutex<()>,
    scripts: Scripts,
    slack_ms: u64,
    /// Set by `close`.
    closed: std::sync::atomic::AtomicBool,
    /// Redis refused CONFIG GET (warned once).
    config_refused: std::sync::atomic::AtomicBool,
    /// With `durability = "fsync"`: when the server's syncing was last
    /// seen, and what was seen (writes are refused while it does not sync).
    syncing: std::sync::Mutex<Option<(std::time::Instant, Result<(), StoreError>)>>,
}

/// How long a check that the server syncs every write is trusted.
const SYNC_CHECK_EVERY: Duration = Duration::from_secs(5);

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("cluster", &!self.opts.cluster_nodes.is_empty())
            .field("prefix", &self.opts.prefix)
            .finish_non_exhaustive()
    }
}

/// Why Redis did not answer as the store needs: the cause of its
/// [`StoreError`]s.
#[derive(Debug, thiserror::Error)]
enum RedisFault {
    /// The client or the server reported an error. Not given as the
    /// source: redis's own text already repeats its causes.
    #[error("redis: {0}")]
    Client(RedisError),
    /// The store was closed.
    #[error("the store is shut down")]
    Closed,
    /// The first connection to the cluster took longer than a connect may.
    #[error("connecting to the Redis cluster")]
    Connecting,
    /// `PING` was answered with something else than `PONG`.
    #[error("redis answered PING with {0}")]
    Ping(String),
    /// Fewer replicas than `storage.redis.durability` asks for took a write
    /// within `replicas_timeout`. The write may be there (on the master,
    /// and on some replicas): a retry finds it.
    #[error(
        "{acked} of the {wanted} replicas storage.redis.durability asks for took the write in time"
    )]
    NotReplicated { acked: u64, wanted: u32 },
    /// `storage.redis.durability = "fsync"`, and the server does not sync
    /// every write.
    #[error(
        "storage.redis.durability = \"fsync\", but Redis runs appendonly {appendonly}, \
         appendfsync {appendfsync}: set `appendonly yes` and `appendfsync always` (CONFIG SET \
         and in redis.conf), or choose another durability"
    )]
    NotSyncing {
        appendonly: String,
        appendfsync: String,
    },
    /// A script answered a number that does not parse.
    #[error("redis script returned a malformed number")]
    MalformedNumber,
    /// A stream head's fields do not parse.
    #[error("redis holds a malformed stream head")]
    MalformedHead,
    /// A script answered what it never answers.
    #[error("redis {what} script answered {reply:?}")]
    Unexpected {
        /// Which script.
        what: &'static str,
        /// Its answer.
        reply: Vec<String>,
    },
}

impl From<RedisFault> for StoreError {
    /// A script or type error is a bug (500); anything else (refused,
    /// dropped, timed out, cluster down, loading) means "not now" (503).
    fn from(f: RedisFault) -> Self {
        use redis::{ErrorKind, ServerErrorKind};
        let transient = match &f {
            RedisFault::Client(e) => match e.kind() {
                // Full, loading or otherwise busy servers answer with plain
                // errors.
                ErrorKind::Server(ServerErrorKind::ResponseError) => {
                    let text = e.to_string();
                    text.contains("max number of clients") || text.contains("OOM")
                }
                ErrorKind::Server(ServerErrorKind::CrossSlot | ServerErrorKind::NoPerm)
                | ErrorKind::UnexpectedReturnType => false,
                _ => true,
            },
            RedisFault::Closed
            | RedisFault::Connecting
            | RedisFault::Ping(_)
            | RedisFault::NotReplicated { .. }
            | RedisFault::NotSyncing { .. } => true,
            RedisFault::MalformedNumber
            | RedisFault::MalformedHead
            | RedisFault::Unexpected { .. } => false,
        };
        if transient {
            StoreError::Unavailable(std::sync::Arc::new(f))
        } else {
            StoreError::Failed(std::sync::Arc::new(f))
        }
    }
}

fn map_err(e: RedisError) -> StoreError {
    RedisFault::Client(e).into()
}

fn manager_config(opts: &RedisOptions) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(opts.connect_timeout))
        .set_response_timeout(Some(opts.response_timeout))
        .set_number_of_retries(1)
        .set_max_delay(Duration::from_secs(1))
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
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

fn unexpected(what: &'static str, reply: &[String]) -> StoreError {
    RedisFault::Unexpected {
        what,
        reply: reply.to_vec(),
    }
    .into()
}

impl RedisStore {
    /// A store that connects on first use. Call inside a tokio runtime.
    pub fn new(opts: RedisOptions) -> Result<Self, StoreError> {
        let conn = OnceCell::new();
        if !opts.sentinels.is_empty() {
            let sentinel = SentinelConn::new(
                &opts.sentinels,
                &opts.sentinel_master,
                &opts.url,
                opts.connect_timeout,
                opts.response_timeout,
            )
            .map_err(map_err)?;
            let _ = conn.set(Conn::Sentinel(std::sync::Arc::new(sentinel)));
        } else if opts.cluster_nodes.is_empty() {
            let client = redis::Client::open(opts.url.as_str()).map_err(map_err)?;
            let manager = ConnectionManager::new_lazy_with_config(client, manager_config(&opts))
                .map_err(map_err)?;
            let _ = conn.set(Conn::Single(manager));
        }
        Ok(Self {
            slack_ms: ms(opts.expiry_slack),
            opts,
            conn,
            connecting: tokio::sync::Mutex::new(()),
            closed: std::sync::atomic::AtomicBool::new(false),
            config_refused: std::sync::atomic::AtomicBool::new(false),
            syncing: std::sync::Mutex::new(None),
            scripts: Scripts {
                claim: script(include_str!("claim.lua")),
                done: script(include_str!("done.lua")),
                release: script(include_str!("release.lua")),
                extend: script(include_str!("extend.lua")),
                apply: script(include_str!("apply.lua")),
                mark: script(include_str!("mark.lua")),
                confirm: script(include_str!("confirm.lua")),
            },
        })
    }

    async fn connect_cluster(&self) -> Result<Conn, StoreError> {
        let client = redis::cluster::ClusterClient::builder(self.opts.cluster_nodes.clone())
            .connection_timeout(self.opts.connect_timeout)
            .response_timeout(self.opts.response_timeout)
            .retries(1)
            .build()
            .map_err(map_err)?;
        Ok(Conn::Cluster(
            client.get_async_connection().await.map_err(map_err)?,
        ))
    }

    async fn conn(&self) -> Result<Conn, StoreError> {
        if self.closed.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(RedisFault::Closed.into());
        }
        if let Some(c) = self.conn.get() {
            return Ok(c.clone());
        }
        // Callers wait for a first connect under way, but never longer than
        // a connect may take: requests cannot pile up behind a dead cluster.
        let _connecting = tokio::time::timeout(self.opts.connect_timeout, self.connecting.lock())
            .await
            .map_err(|_| StoreError::from(RedisFault::Connecting))?;
        if let Some(c) = self.conn.get() {
            return Ok(c.clone());
        }
        let conn = self.connect_cluster().await?;
        let _ = self.conn.set(conn.clone());
        Ok(conn)
    }

    /// Runs `script` with `keys` and `args` and reads its reply.
    async fn run<T: FromRedisValue>(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[String],
    ) -> Result<T, StoreError> {
        let mut inv = script.prepare_invoke();
        for k in keys {
            inv.key(*k);
        }
        for a in args {
            inv.arg(a.as_str());
        }
        if self.opts.durability == Durability::Fsync {
            self.syncing_now().await?;
        }
        match self.conn().await? {
            Conn::Single(mut c) => self.invoke_on(&mut c, &inv).await,
            Conn::Sentinel(s) => {
                let mut c = s.get().await.map_err(map_err)?;
                let r = self.invoke_on(&mut c, &inv).await;
                if let Err(StoreError::Unavailable(cause) | StoreError::Failed(cause)) = &r
                    && let Some(RedisFault::Client(e)) = cause.downcast_ref::<RedisFault>()
                {
                    s.saw(e);
                }
                r
            }
            Conn::Cluster(mut c) => {
                let reply = inv.invoke_async(&mut c).await.map_err(map_err)?;
                if let Durability::Replicas(wanted) = self.opts.durability {
                    // To the master that took the write (the first key's
                    // slot), on the cluster's one connection to it.
                    let route = Route::with_slot(
                        Slot::for_key(keys.first().copied().unwrap_or_default()),
                        SlotAddr::Master,
                    );
                    let acked = c
                        .route_command(
                            self.wait_cmd(wanted),
                            RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                        )
                        .await
                        .and_then(|v| Ok(u64::from_redis_value(v)?))
                        .map_err(map_err)?;
                    if acked < u64::from(wanted) {
                        return Err(RedisFault::NotReplicated { acked, wanted }.into());
                    }
                }
                Ok(reply)
            }
        }
    }

    /// `WAIT wanted replicas_timeout`.
    fn wait_cmd(&self, wanted: u32) -> redis::Cmd {
        let mut cmd = redis::cmd("WAIT");
        cmd.arg(wanted).arg(ms(self.opts.replicas_timeout));
        cmd
    }

    /// Runs a script on one connection, then, with `durability =
    /// "replicas = N"`, waits for its replicas: WAIT on the same connection,
    /// after the script, covers its write (and any earlier one on the
    /// connection, which only makes it wait longer).
    async fn invoke_on<C: ConnectionLike + Send, T: FromRedisValue>(
        &self,
        c: &mut C,
        inv: &redis::ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        let reply = inv.invoke_async(c).await.map_err(map_err)?;
        if let Durability::Replicas(wanted) = self.opts.durability {
            let acked: u64 = self
                .wait_cmd(wanted)
                .query_async(c)
                .await
                .map_err(map_err)?;
            if acked < u64::from(wanted) {
                return Err(RedisFault::NotReplicated { acked, wanted }.into());
            }
        }
        Ok(reply)
    }

    /// With `durability = "fsync"`: whether the server syncs every write,
    /// as seen within [`SYNC_CHECK_EVERY`] (a write asks before it runs:
    /// nothing is written while the server does not sync).
    async fn syncing_now(&self) -> Result<(), StoreError> {
        let seen = self
            .syncing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .filter(|(at, _)| at.elapsed() < SYNC_CHECK_EVERY)
            .map(|(_, r)| r.clone());
        match seen {
            Some(r) => r,
            None => self.check_syncing().await,
        }
    }

    /// Asks the server (in a cluster, every master) whether it syncs every
    /// write, and remembers the answer (not a failure to ask: the next
    /// write asks again). A server that refuses CONFIG (renamed or
    /// disabled, as managed services do) cannot be checked: dedupd warns
    /// once and trusts it.
    async fn check_syncing(&self) -> Result<(), StoreError> {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("GET").arg("appendonly").arg("appendfsync");
        // Each server's answer: its address (in a cluster), and its
        // settings, or why it refused.
        let answers: Vec<(String, Result<Vec<String>, String>)> = match self.conn().await? {
            Conn::Cluster(mut c) => {
                let routing = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                let nodes = match c.route_command(cmd, routing).await.map_err(map_err)? {
                    redis::Value::Map(nodes) => nodes,
                    other => vec![(redis::Value::Nil, other)],
                };
                let mut answers = Vec::with_capacity(nodes.len());
                for (addr, answer) in nodes {
                    let addr = String::from_redis_value(addr).unwrap_or_default();
                    let answer = match answer {
                        redis::Value::ServerError(e) => Err(format!("{e:?}")),
                        other => Ok(Vec::<String>::from_redis_value(other)
                            .map_err(|e| map_err(e.into()))?),
                    };
                    answers.push((format!(" (on {addr})"), answer));
                }
                answers
            }
            _ => match self.query::<Vec<String>>(&cmd).await {
                Ok(pairs) => vec![(String::new(), Ok(pairs))],
                Err(StoreError::Failed(e)) => vec![(String::new(), Err(e.to_string()))],
                Err(e) => return Err(e),
            },
        };
        let mut seen = Ok(());
        for (on, answer) in answers {
            let pairs = match answer {
                Ok(pairs) => pairs,
                Err(error) => {
                    if !self
                        .config_refused
                        .swap(true, std::sync::atomic::Ordering::Relaxed)
                    {
                        tracing::warn!(%error, "storage.redis.durability = \"fsync\", but Redis{on} refuses CONFIG GET: make sure it runs appendonly yes and appendfsync always");
                    }
                    continue;
                }
            };
            let value = |name: &str| {
                pairs
                    .chunks(2)
                    .find(|kv| kv[0].eq_ignore_ascii_case(name))
                    .and_then(|kv| kv.get(1).cloned())
                    .unwrap_or_default()
            };
            let (appendonly, appendfsync) = (value("appendonly"), value("appendfsync"));
            if appendonly != "yes" || appendfsync != "always" {
                seen = Err(RedisFault::NotSyncing {
                    appendonly: format!("{appendonly}{on}"),
                    appendfsync,
                }
                .into());
                break;
            }
        }
        *self
            .syncing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some((std::time::Instant::now(), seen.clone()));
        seen
    }

    /// Runs one plain command.
    async fn query<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, StoreError> {
        match self.conn().await? {
            Conn::Single(mut c) => query_on(&mut c, cmd).await,
            Conn::Sentinel(s) => {
                let mut c = s.get().await.map_err(map_err)?;
                let r = cmd.query_async(&mut c).await;
                if let Err(e) = &r {
                    s.saw(e);
                }
                r.map_err(map_err)
            }
            Conn::Cluster(mut c) => query_on(&mut c, cmd).await,
        }
    }

    fn claim_key(&self, k: &ScopedKey) -> String {
        format!("{{{}}}:c:{}", self.opts.prefix, k.as_str())
    }

    fn fence_key(&self) -> String {
        format!("{{{}}}:fence", self.opts.prefix)
    }

    fn head_key(&self, stream: &ScopedKey) -> String {
        format!(
            "{}:{{s:{}}}:head",
            self.opts.prefix,
            hex::encode(stream.as_str())
        )
    }

    fn event_key(&self, stream: &ScopedKey, event: &ScopedKey) -> String {
        format!(
            "{}:{{s:{}}}:e:{}",
            self.opts.prefix,
            hex::encode(stream.as_str()),
            event.as_str()
        )
    }

    fn marker_key(&self, event: &ScopedKey) -> String {
        format!(
            "{}:{{e:{}}}:seen",
            self.opts.prefix,
            hex::encode(event.as_str())
        )
    }

    async fn read_head(&self, stream: &ScopedKey, now: Millis) -> Result<Option<Head>, StoreError> {
        let reply: Vec<Option<String>> = self
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

async fn query_on<C: ConnectionLike, T: FromRedisValue>(
    c: &mut C,
    cmd: &redis::Cmd,
) -> Result<T, StoreError> {
    cmd.query_async(c).await.map_err(map_err)
}

fn head_from(cs: &str, cn: &str, id: &str) -> Result<Head, StoreError> {
    let bad = || StoreError::from(RedisFault::MalformedHead);
    let secs: i128 = cs.parse().map_err(|_| bad())?;
    let nanos: i128 = cn.parse().map_err(|_| bad())?;
    Ok(Head {
        created_at: CreatedAt::from_unix_nanos(secs * 1_000_000_000 + nanos),
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
        let args = [
            now.to_string(),
            ttl.as_ms().to_string(),
            fingerprint
                .as_ref()
                .map_or("", Fingerprint::as_str)
                .to_owned(),
            token.to_hex(),
            self.slack_ms.to_string(),
        ];
        let keys = [self.claim_key(key), self.fence_key()];
        let keys = [keys[0].as_str(), keys[1].as_str()];
        // An answer lost on the way back would leave a claim nobody holds
        // the token of: retry once with the same token (the script answers
        // its own claim as claimed again).
        let reply: Vec<String> = match self.run(&self.scripts.claim, &keys, &args).await {
            Err(StoreError::Unavailable(_)) => self.run(&self.scripts.claim, &keys, &args).await?,
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
            }),
            Some("mismatch") => Ok(ClaimOutcome::FingerprintMismatch {
                state: state(reply.get(1)),
                expires_at_ms: num(reply.get(2))?,
            }),
            _ => Err(unexpected("claim", &reply)),
        }
    }

    async fn done(
        &self,
        key: &ScopedKey,
        token: Token,
        ttl: Ttl,
        now: Millis,
    ) -> Result<DoneOutcome, StoreError> {
        let args = [
            now.to_string(),
            ttl.as_ms().to_string(),
            token.to_hex(),
            self.slack_ms.to_string(),
        ];
        let reply: Vec<String> = self
            .run(
                &self.scripts.done,
                &[&self.claim_key(key), &self.fence_key()],
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
        let args = [now.to_string(), token.to_hex()];
        let reply: Vec<String> = self
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
        let args = [
            now.to_string(),
            ttl.as_ms().to_string(),
            token.to_hex(),
            self.slack_ms.to_string(),
        ];
        let reply: Vec<String> = self
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
        let reply: Vec<Option<String>> = self
            .query(
                redis::cmd("HMGET")
                    .arg(self.claim_key(key))
                    .arg(&["s", "f", "e"]),
            )
            .await?;
        match reply.as_slice() {
            [Some(s), Some(f), Some(e)] => {
                let expires_at_ms: u64 = num(Some(e))?;
                if expires_at_ms <= now {
                    return Ok(None);
                }
                Ok(Some(ClaimView {
                    state: state(Some(s)),
                    fence: num(Some(f))?,
                    expires_at_ms,
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
                .run::<i64>(&self.scripts.confirm, &[&marker], &confirm_args)
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

    async fn ready(&self) -> Result<(), StoreError> {
        let pong: String = self.query(&redis::cmd("PING")).await?;
        if pong != "PONG" {
            return Err(RedisFault::Ping(pong).into());
        }
        if self.opts.durability == Durability::Fsync {
            self.check_syncing().await?;
        }
        Ok(())
    }

    fn write_stats(&self) -> WriteStats {
        WriteStats::default()
    }

    async fn close(&self) {
        self.closed
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
}
