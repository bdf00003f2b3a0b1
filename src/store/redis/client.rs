//! The connection to Redis (one node, the master Sentinel names, or a
//! cluster) that claims and the shared inbox share, and what each write
//! does to be as durable as `storage.redis.durability` promises: a check
//! that the server syncs every write, or `WAIT` for its replicas.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr,
};
use redis::{FromRedisValue, RedisError, Script};
use tokio::sync::OnceCell;

use super::RedisOptions;
use super::sentinel::SentinelConn;
use crate::domain::Durability;
use crate::store::StoreError;

/// A connection to one node, to the master Sentinel names, or to a
/// cluster; each reconnects by itself.
#[derive(Clone)]
pub(super) enum Conn {
    Single(ConnectionManager),
    Sentinel(std::sync::Arc<SentinelConn>),
    Cluster(ClusterConnection),
}

/// The connection every part of the Redis backend shares, and what each
/// write must do to be as durable as `storage.redis.durability` says.
pub struct Client {
    opts: RedisOptions,
    /// Connected on first use, so dedupd starts (not ready) while Redis is
    /// down and recovers when it comes back. A single node's connection
    /// manager is created lazily at once and reconnects by itself.
    conn: OnceCell<Conn>,
    /// Held while a first cluster connect is under way.
    connecting: tokio::sync::Mutex<()>,
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

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("redis::Client")
            .field("cluster", &!self.opts.cluster_nodes.is_empty())
            .field("prefix", &self.opts.prefix)
            .finish_non_exhaustive()
    }
}

/// Why Redis did not answer as the store needs: the cause of its
/// [`StoreError`]s.
#[derive(Debug, thiserror::Error)]
pub(super) enum RedisFault {
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
    /// In a cluster, claims of the one-slot layout are still being moved
    /// to a slot each (`upgrade`), or the last attempt failed.
    #[error("moving claims from the one-slot layout of earlier versions")]
    MovingClaims,
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
            | RedisFault::NotSyncing { .. }
            | RedisFault::MovingClaims => true,
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

pub(super) fn map_err(e: RedisError) -> StoreError {
    RedisFault::Client(e).into()
}

fn manager_config(opts: &RedisOptions) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(opts.connect_timeout))
        .set_response_timeout(Some(opts.response_timeout))
        .set_number_of_retries(1)
        .set_max_delay(Duration::from_secs(1))
}

pub(super) fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Client {
    /// A client that connects on first use. Call inside a tokio runtime.
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
            opts,
            conn,
            connecting: tokio::sync::Mutex::new(()),
            closed: std::sync::atomic::AtomicBool::new(false),
            config_refused: std::sync::atomic::AtomicBool::new(false),
            syncing: std::sync::Mutex::new(None),
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

    pub(super) async fn conn(&self) -> Result<Conn, StoreError> {
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
    pub async fn run<T: FromRedisValue, A: redis::ToRedisArgs>(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[A],
    ) -> Result<T, StoreError> {
        let mut inv = script.prepare_invoke();
        for k in keys {
            inv.key(*k);
        }
        for a in args {
            inv.arg(a);
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
    pub async fn query<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, StoreError> {
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

    /// Runs one command without a key, such as `SCAN`, on the server that
    /// holds `key`: in a cluster, the master of its slot.
    pub(super) async fn query_at<T: FromRedisValue>(
        &self,
        key: &str,
        cmd: &redis::Cmd,
    ) -> Result<T, StoreError> {
        match self.conn().await? {
            Conn::Cluster(mut c) => {
                let route = Route::with_slot(Slot::for_key(key), SlotAddr::Master);
                let reply = c
                    .route_command(
                        cmd.clone(),
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                    )
                    .await
                    .map_err(map_err)?;
                T::from_redis_value(reply).map_err(|e| map_err(e.into()))
            }
            _ => self.query(cmd).await,
        }
    }

    /// Runs a server command (such as `INFO`) on every master: each one's
    /// name (`master` for one node or Sentinel's master, its address in a
    /// cluster) and its answer, or the error it answered with. `Err` when
    /// Redis cannot be reached.
    pub(super) async fn each_master(
        &self,
        cmd: &redis::Cmd,
    ) -> Result<Vec<(String, Result<redis::Value, String>)>, StoreError> {
        match self.conn().await? {
            Conn::Cluster(mut c) => {
                let reply = c
                    .route_command(
                        cmd.clone(),
                        RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None)),
                    )
                    .await
                    .map_err(map_err)?;
                let redis::Value::Map(answers) = reply else {
                    return Err(RedisFault::Unexpected {
                        what: "an answer of every master",
                        reply: vec![format!("{reply:?}")],
                    }
                    .into());
                };
                Ok(answers
                    .into_iter()
                    .map(|(node, answer)| {
                        let node = match node {
                            redis::Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
                            other => format!("{other:?}"),
                        };
                        let answer = match answer {
                            redis::Value::ServerError(e) => Err(e.to_string()),
                            v => Ok(v),
                        };
                        (node, answer)
                    })
                    .collect())
            }
            _ => Ok(vec![(
                "master".to_owned(),
                self.on_node("master", cmd).await?,
            )]),
        }
    }

    /// Runs a server command on the master named `node` by
    /// [`Client::each_master`]: its answer, or the error it answered with.
    /// `Err` when Redis cannot be reached.
    pub(super) async fn on_node(
        &self,
        node: &str,
        cmd: &redis::Cmd,
    ) -> Result<Result<redis::Value, String>, StoreError> {
        let answered = |r: Result<redis::Value, RedisError>| match r {
            Ok(v) => Ok(Ok(v)),
            Err(e) if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() => {
                Err(map_err(e))
            }
            Err(e) => Ok(Err(e.to_string())),
        };
        match self.conn().await? {
            Conn::Single(mut c) => answered(cmd.query_async(&mut c).await),
            Conn::Sentinel(s) => {
                let mut c = s.get().await.map_err(map_err)?;
                let r = cmd.query_async(&mut c).await;
                if let Err(e) = &r {
                    s.saw(e);
                }
                answered(r)
            }
            Conn::Cluster(mut c) => {
                let (host, port) = node
                    .rsplit_once(':')
                    .and_then(|(h, p)| Some((h.to_owned(), p.parse::<u16>().ok()?)))
                    .ok_or_else(|| RedisFault::Unexpected {
                        what: "a node's address",
                        reply: vec![node.to_owned()],
                    })?;
                let r = c
                    .route_command(
                        cmd.clone(),
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port }),
                    )
                    .await;
                answered(r)
            }
        }
    }

    /// The settings it was made with.
    pub fn opts(&self) -> &RedisOptions {
        &self.opts
    }

    /// Whether it talks to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        !self.opts.cluster_nodes.is_empty()
    }

    /// Ok when Redis answers, and (with `durability = "fsync"`) syncs
    /// every write.
    pub async fn ready(&self) -> Result<(), StoreError> {
        let pong: String = self.query(&redis::cmd("PING")).await?;
        if pong != "PONG" {
            return Err(RedisFault::Ping(pong).into());
        }
        if self.opts.durability == Durability::Fsync {
            self.check_syncing().await?;
        }
        Ok(())
    }

    /// Later calls answer [`StoreError::Unavailable`].
    pub fn close(&self) {
        self.closed
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

async fn query_on<C: ConnectionLike, T: FromRedisValue>(
    c: &mut C,
    cmd: &redis::Cmd,
) -> Result<T, StoreError> {
    cmd.query_async(c).await.map_err(map_err)
}
