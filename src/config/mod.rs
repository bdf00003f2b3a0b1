//! Settings: defaults, then a TOML file, then `DEDUPD_*` environment
//! variables (nested keys joined with `__`, as in
//! `DEDUPD_CLAIMS__MAX_TTL=7d`). Durations are written as `300s`, `5m`, `1d`.
//!
//! [`Settings::load`] extracts and validates; every error names the key and
//! where its value came from.

pub mod alerts;
mod bounded;
pub mod env;
mod file;
mod idle;
mod readable;
pub mod reload;
mod secret;
pub mod sources;
pub mod telemetry;

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::Figment;
use figment::providers::Serialized;
use serde::{Deserialize, Serialize};

pub use readable::OpenSecretFile;
pub use secret::Secret;

use self::sources::{GatewaySettings, SourceSettings};
use crate::domain::valid_source_name;

use crate::domain::TtlBounds;

/// Largest `claims.max_ttl`: far beyond any retry horizon, and an expiry
/// (now + TTL, in ms) that redb and Redis's `PEXPIRE` both store.
pub const MAX_TTL_BOUND: Duration = Duration::from_secs(3650 * 86_400);

/// Longest retention or dedupe window: every record's expiry (now plus
/// it, in ms) is then one redb and Redis's `PEXPIRE` both store, and the
/// data file keeps the window in whole ms.
pub const MAX_RETENTION: Duration = MAX_TTL_BOUND;

/// Most writes in one commit: the writer allocates a batch this large.
pub const MAX_BATCH: usize = 65_536;
/// Highest `storage.max_key_memory_bytes`: 1 PiB, far past any machine's
/// memory (a typo's extra digits are an error, not no cap).
pub const MAX_KEY_MEMORY_BYTES: u64 = 1 << 50;

/// Most writes waiting for the writer.
pub const MAX_QUEUE_CAPACITY: usize = 1_000_000;

/// Largest `/v1` body: what one request may make the server buffer (as a
/// source's `max_body_bytes`).
pub const MAX_HTTP_BODY: usize = 16 * 1024 * 1024;

/// Most records the reaper deletes in one write transaction, which holds
/// the writer meanwhile.
pub const MAX_REAPER_BATCH: u64 = 100_000;

/// Environment variable naming the config file when `--config` is absent.
pub const CONFIG_ENV: &str = "DEDUPD_CONFIG";

/// Everything dedupd can be told.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Address the HTTP server listens on.
    pub listen: SocketAddr,
    /// The redb data file.
    pub data_path: PathBuf,
    pub log: LogSettings,
    pub http: HttpSettings,
    /// The `/v1` API.
    pub api: ApiSettings,
    pub claims: ClaimSettings,
    /// The applied-events table.
    pub ordering: OrderingSettings,
    /// Where state lives: the embedded redb file, or Redis for claims and
    /// ordering (the gateway inbox stays in the file).
    pub storage: StorageSettings,
    pub reaper: ReaperSettings,
    /// Gateway delivery, shared by all sources.
    pub gateway: GatewaySettings,
    /// Webhook sources by name (`[sources.NAME]`), served at `/ingest/NAME`.
    pub sources: BTreeMap<String, SourceSettings>,
    /// The Redis-protocol listener.
    pub resp: RespSettings,
    /// Operational alerts as signed webhooks (`[alerts]`); absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alerts: Option<alerts::AlertSettings>,
    /// How the process asks to be scheduled (see `crate::scheduling`).
    pub cpu_scheduling: CpuScheduling,
    /// OpenTelemetry traces (`[telemetry.traces]`); off by default.
    pub telemetry: telemetry::TelemetrySettings,
}

/// How the process asks to be scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CpuScheduling {
    /// With one CPU, `SCHED_BATCH` at the same nice value, unless the
    /// process was started with a policy other than the default one.
    #[default]
    Auto,
    /// As the process was started, whatever the CPUs.
    AsStarted,
}

/// The Redis-protocol (RESP2/RESP3) listener: SET/GET/DEL/EXPIRE/… on a
/// keyspace in the redb file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RespSettings {
    /// Address to listen on, such as `127.0.0.1:6380`; absent: no listener.
    pub listen: Option<SocketAddr>,
    /// Most open client connections; more are answered
    /// `ERR max number of clients reached` and closed.
    pub max_connections: usize,
    /// Most connections that have not authenticated yet (with API tokens
    /// set; never more than `max_connections`); more are refused with an
    /// error, so strangers cannot take the slots of clients that hold a
    /// token.
    pub max_unauthenticated: usize,
    /// A connection that completes no command for this long is closed
    /// (bytes that do not complete a command do not count).
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// With API tokens set, a connection that has not authenticated this
    /// long after it opened is closed.
    #[serde(with = "humantime_serde")]
    pub auth_timeout: Duration,
    /// A client that does not read a batch of replies within this long is
    /// disconnected.
    #[serde(with = "humantime_serde")]
    pub write_timeout: Duration,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSettings {
    /// A tracing filter such as `info` or `dedupd=debug,info`; `RUST_LOG`
    /// overrides it.
    pub level: String,
    /// `text` for people, `json` for log collectors.
    pub format: LogFormat,
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// HTTP server settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSettings {
    /// Worker threads serving requests.
    pub workers: usize,
    /// Largest accepted request body, in bytes (larger: 413).
    pub max_body_bytes: usize,
    /// How long shutdown waits for in-flight requests.
    #[serde(with = "humantime_serde")]
    pub shutdown_timeout: Duration,
    /// How long a request's body (a webhook's, or a `/v1` request's) may
    /// take to arrive once its headers did (408 and the connection closed
    /// after that).
    #[serde(with = "humantime_serde")]
    pub body_timeout: Duration,
    /// How long a client may take to send a request's headers.
    #[serde(with = "humantime_serde")]
    pub header_timeout: Duration,
    /// How long an answer may wait for a client that does not read it (or
    /// does not acknowledge it) before the connection is closed: the
    /// kernel's `TCP_USER_TIMEOUT` on each connection.
    #[serde(with = "humantime_serde")]
    pub write_timeout: Duration,
    /// Most open client connections, over all workers.
    pub max_connections: usize,
    /// Most open connections from one address (an IPv6 /64); more are
    /// closed at once. 0: no cap.
    pub max_connections_per_address: usize,
}

/// `/v1` API settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiSettings {
    /// Bearer tokens accepted on `/v1/*`. Empty (and no file): no auth, which
    /// is allowed only on a loopback address.
    pub tokens: Vec<Secret>,
    /// A file with one token per line (blank lines and `#` comments
    /// ignored), such as a systemd credential.
    pub tokens_file: Option<PathBuf>,
    /// Read-only bearer tokens: `GET` and `HEAD` on `/v1/*` and
    /// `/metrics`; refused on writes and by the Redis protocol.
    pub read_tokens: Vec<Secret>,
    /// A file of read-only tokens, as `tokens_file`.
    pub read_tokens_file: Option<PathBuf>,
}

/// Claim TTL settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimSettings {
    /// TTL of a claim (and an extend) that names none.
    #[serde(with = "humantime_serde")]
    pub default_ttl: Duration,
    /// TTL of a done record that names none.
    #[serde(with = "humantime_serde")]
    pub default_done_ttl: Duration,
    /// Largest TTL a request may name.
    #[serde(with = "humantime_serde")]
    pub max_ttl: Duration,
    /// Largest result a `done` may keep: bytes of its JSON text (larger:
    /// 413 `result_too_large`, nothing changed; 0 keeps none).
    pub max_result_bytes: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrderingSettings {
    /// How long applied events and stream heads are kept.
    #[serde(with = "humantime_serde")]
    pub retention: Duration,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageSettings {
    /// `redb` (default) or `redis` (needs a build with `--features redis`).
    pub backend: Backend,
    /// redb page cache, in bytes.
    pub cache_bytes: usize,
    /// Writes that may queue for the writer thread.
    pub queue_capacity: usize,
    /// Most writes per commit.
    pub max_batch: usize,
    /// A checkpoint (a durable commit of the data file, after which the
    /// write-ahead log starts over) once the log holds this many bytes.
    pub checkpoint_bytes: u64,
    /// ... or once this long passed since the last one. A checkpoint
    /// writes out the pages redb buffered since the last one while writes
    /// wait, so it takes as long as the writes between two take to write
    /// out: every second, about 10 ms at 60,000 claims/s on the 2-core VM
    /// (every 30 s, 50 ms or more).
    #[serde(with = "humantime_serde")]
    pub checkpoint_interval: Duration,
    /// ... or once no write came for this long (with anything logged), so
    /// a quiet moment takes the checkpoint instead of the next burst.
    #[serde(with = "humantime_serde")]
    pub checkpoint_idle: Duration,
    /// How long the writer may keep one redb transaction open over several
    /// batches before committing it (each batch is durable in the
    /// write-ahead log before it is answered; a read commits at once).
    /// `0s` commits every batch.
    #[serde(with = "humantime_serde")]
    pub commit_hold: Duration,
    pub redis: RedisSettings,
    /// Writes (ingest, claims, applies, RESP writes) are refused with 507
    /// while less than this is free on the data file's filesystem, so the
    /// disk never fills and a checkpoint and a replay always fit; they
    /// resume by themselves once space frees.
    pub min_free_bytes: u64,
    /// Most memory the embedded store's keys may take (claims and
    /// Redis-protocol keys, expired ones until the reaper deletes them;
    /// estimated per key): at the cap, a client's claim or `SET` of a new
    /// key is refused with 507 (a Redis `-OOM` error) until the reaper
    /// makes room. `0` (the default): half of the machine's memory (or of
    /// the service's memory limit when lower) less twice `cache_bytes`
    /// (the cache, and the copy of a checkpoint's pages held while they
    /// are written).
    pub max_key_memory_bytes: u64,
    /// Set for one start by `serve --accept-missing-log`: open a data file
    /// that was not closed cleanly although its write-ahead log is missing.
    /// Never read from a file or the environment, so it cannot stay on.
    #[serde(skip)]
    pub accept_missing_log: bool,
}

/// Which store holds claims, fences, applied events and stream heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// The embedded redb file.
    Redb,
    /// Redis (or Valkey, or a Redis Cluster), shared by several instances.
    Redis,
}

/// Redis settings (used with `backend = "redis"`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSettings {
    /// `redis://host:port/db`, `rediss://…` (TLS) or `redis+unix:///path`.
    /// May carry a password, so it is treated as a secret.
    pub url: Secret,
    /// Cluster nodes; when set, the cluster client is used instead of `url`.
    pub cluster_nodes: Vec<Secret>,
    /// Redis Sentinels (`redis://host:port`); when set, dedupd connects to
    /// the master they name `sentinel_master` (with `url`'s password and
    /// database; its host is ignored), and to the new one after a failover.
    pub sentinels: Vec<Secret>,
    /// The master's name among the sentinels (`sentinel monitor NAME …`).
    pub sentinel_master: String,
    /// Prefix of every key dedupd writes; no `{` or `}`.
    pub prefix: String,
    /// Redis keeps a key this long past its record's expiry. Records read
    /// as absent from their expiry on, by dedupd's clock; the slack covers
    /// clock differences between instances, so it should exceed them.
    #[serde(with = "humantime_serde")]
    pub expiry_slack: Duration,
    /// Time allowed to connect.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Time allowed for one answer.
    #[serde(with = "humantime_serde")]
    pub response_timeout: Duration,
    /// What an acknowledged write survives: `"server"` (whatever Redis is
    /// configured to do), `"fsync"` (Redis must sync every write: dedupd is
    /// not ready otherwise) or `"replicas = N"` (each write waits for N
    /// replicas, else 503).
    pub durability: crate::domain::Durability,
    /// With `durability = "replicas = N"`: how long a write waits for its
    /// replicas before it is answered 503.
    #[serde(with = "humantime_serde")]
    pub replicas_timeout: Duration,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReaperSettings {
    /// Longest the reaper sleeps; it wakes sooner for the next expiry. Also
    /// how long expired records wait under load before the reaper takes a
    /// third of the writer's time instead of a tenth.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Most records deleted per write transaction.
    pub batch_size: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            data_path: PathBuf::from("dedupd.redb"),
            log: LogSettings {
                level: "info".into(),
                format: LogFormat::Text,
            },
            http: HttpSettings {
                workers: 2,
                max_body_bytes: 64 * 1024,
                shutdown_timeout: Duration::from_secs(30),
                body_timeout: Duration::from_secs(10),
                header_timeout: Duration::from_secs(5),
                write_timeout: Duration::from_secs(30),
                max_connections: 1024,
                max_connections_per_address: 256,
            },
            api: ApiSettings {
                tokens: Vec::new(),
                tokens_file: None,
                read_tokens: Vec::new(),
                read_tokens_file: None,
            },
            claims: ClaimSettings {
                default_ttl: Duration::from_secs(300),
                default_done_ttl: Duration::from_secs(86_400),
                max_ttl: Duration::from_secs(30 * 86_400),
                max_result_bytes: crate::domain::DEFAULT_MAX_RESULT_BYTES,
            },
            ordering: OrderingSettings {
                retention: Duration::from_secs(30 * 86_400),
            },
            storage: StorageSettings {
                backend: Backend::Redb,
                cache_bytes: 64 * 1024 * 1024,
                queue_capacity: 4096,
                max_batch: 512,
                checkpoint_bytes: 64 * 1024 * 1024,
                checkpoint_interval: Duration::from_secs(1),
                checkpoint_idle: Duration::from_secs(1),
                commit_hold: Duration::from_millis(20),
                accept_missing_log: false,
                min_free_bytes: 8 * 1024 * 1024,
                max_key_memory_bytes: 0,
                redis: RedisSettings {
                    url: Secret::new("redis://127.0.0.1:6379"),
                    cluster_nodes: Vec::new(),
                    sentinels: Vec::new(),
                    sentinel_master: "mymaster".into(),
                    prefix: "dedupd".into(),
                    expiry_slack: Duration::from_secs(60),
                    connect_timeout: Duration::from_secs(2),
                    response_timeout: Duration::from_secs(2),
                    durability: crate::domain::Durability::Server,
                    replicas_timeout: Duration::from_secs(1),
                },
            },
            reaper: ReaperSettings {
                interval: Duration::from_secs(60),
                batch_size: 100,
            },
            gateway: GatewaySettings::default(),
            sources: BTreeMap::new(),
            alerts: None,
            cpu_scheduling: CpuScheduling::Auto,
            telemetry: telemetry::TelemetrySettings::default(),
            resp: RespSettings {
                listen: None,
                max_connections: 1024,
                max_unauthenticated: 64,
                idle_timeout: Duration::from_secs(300),
                auth_timeout: Duration::from_secs(10),
                write_timeout: Duration::from_secs(30),
            },
        }
    }
}

/// A setting that is wrong, with where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Dotted key, such as `claims.max_ttl`.
    pub key: String,
    /// Where the value came from: a file, an environment variable, or the
    /// defaults.
    pub origin: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ConfigError {
    // Printed to a terminal by `check-config`, `reload` and `serve`: a key
    // is the file's (a source's name may hold an escape sequence: a title
    // change, a clipboard write), so are parts of a message, and the
    // origin names a path. Control characters are written escaped; a
    // message's line breaks are kept.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use crate::redact::{escape_control, escape_lines};
        let origin = escape_control(&self.origin);
        let message = escape_lines(&self.message);
        if self.key.is_empty() {
            write!(f, "{message} (in {origin})")
        } else {
            let key = escape_control(&self.key);
            write!(f, "{key}: {message} (from {origin})")
        }
    }
}

/// All that is wrong with a configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "invalid setting {e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// Settings plus what was read on their behalf (token and secret files).
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The settings; each source's secrets include those of its files.
    pub settings: Settings,
    /// Every accepted full-access API token, inline and from
    /// `api.tokens_file`.
    pub api_tokens: Vec<Secret>,
    /// Every read-only token, inline and from `api.read_tokens_file`.
    pub api_read_tokens: Vec<Secret>,
    /// Where each value came from, for errors found after loading (`None`
    /// for settings built in code).
    pub figment: Option<Figment>,
}

impl Loaded {
    /// Settings built in code, as they are (tests, embedding).
    pub fn new(settings: Settings) -> Self {
        Self {
            settings,
            api_tokens: Vec::new(),
            api_read_tokens: Vec::new(),
            figment: None,
        }
    }

    /// An error about `key`, naming where its value came from.
    pub fn error(&self, key: &str, message: String) -> ConfigError {
        ConfigError {
            key: key.to_owned(),
            origin: self
                .figment
                .as_ref()
                .map_or_else(|| "settings built in code".into(), |f| origin(f, key)),
            message,
        }
    }
}

impl Settings {
    /// The defaults alone, as figment's first layer: every value as
    /// [`Settings::default`] has it, secrets included (serialized through
    /// [`secret::exposed`] into figment's own values, so the redacted form
    /// never becomes a setting).
    pub fn defaults_figment() -> Figment {
        let defaults = secret::exposed(|| {
            // Plain structs, maps, strings and numbers: nothing in them can
            // fail to serialize (every test that loads settings runs this).
            figment::value::Value::serialize(Settings::default())
                .expect("the default settings serialize")
        });
        Figment::from(Serialized::defaults(defaults))
    }

    /// The layered figment: defaults, `file` (if any), then `DEDUPD_*`.
    pub fn figment(file: Option<&Path>) -> Figment {
        Self::figment_with_env(file, env::process_vars())
    }

    /// As [`Settings::figment`], with `vars` as the `DEDUPD_*` layer instead
    /// of the process's environment: each a key as figment's `Env` makes it
    /// from a variable's name (`claims.max_ttl` for
    /// `DEDUPD_CLAIMS__MAX_TTL`) and the value. For tests and the fuzz
    /// targets; a variable nested deeper than [`env::MAX_DEPTH`] is an
    /// error, found before its value is parsed.
    pub fn figment_with_env(
        file: Option<&Path>,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Figment {
        let mut fig = Self::defaults_figment();
        if let Some(file) = file {
            fig = fig.merge(file::TomlFile::new(file));
        }
        vars.into_iter()
            // As `Env` skips them: no key part may be empty.
            .filter(|(key, _)| !key.split('.').any(str::is_empty))
            .fold(fig, |fig, (key, value)| fig.merge(env::Var { key, value }))
    }

    /// Loads from `file` (or the file named by `DEDUPD_CONFIG`) and the
    /// environment, then validates.
    pub fn load(file: Option<&Path>) -> Result<Loaded, ConfigErrors> {
        Self::load_checked(file, |_| Ok(()))
    }

    /// As [`Settings::load`], then `check` (which builds what the settings
    /// describe, such as the gateway's sources) runs on the loaded settings
    /// even when they have errors of their own, so every mistake is
    /// reported at once.
    pub fn load_checked(
        file: Option<&Path>,
        check: impl FnOnce(&Loaded) -> Result<(), ConfigErrors>,
    ) -> Result<Loaded, ConfigErrors> {
        let from_env = std::env::var_os(CONFIG_ENV).map(PathBuf::from);
        let file = file.map(Path::to_path_buf).or(from_env);
        if let Some(f) = &file
            && !f.is_file()
        {
            return Err(ConfigErrors(vec![ConfigError {
                key: String::new(),
                origin: format!("--config / {CONFIG_ENV}"),
                message: format!(
                    "config file {} does not exist or is not a file",
                    f.display()
                ),
            }]));
        }
        Self::load_from_checked(&Self::figment(file.as_deref()), check)
    }

    /// As [`Settings::load`], for the commands that read the settings for
    /// the server's address, an API token or the data file's path and never
    /// use a source's secrets (the operator commands, `backup`,
    /// `restore`): a source's secrets file that cannot be read is no error
    /// here (under the unit they name the service's staged copies, the
    /// service user's alone and gone while it is stopped, when `restore`
    /// runs). Every other mistake is, and the sources keep no secrets.
    pub fn load_for_operator(file: Option<&Path>) -> Result<Loaded, ConfigErrors> {
        match Self::load(file) {
            Ok(loaded) => Ok(loaded),
            Err(ConfigErrors(errors)) => {
                let unused = |key: &str| {
                    key.starts_with("sources.")
                        && (key.ends_with(".secrets_file")
                            || key.ends_with(".destination_secret_file"))
                };
                if errors.iter().all(|e| unused(&e.key)) {
                    let fig = Self::figment(
                        file.map(Path::to_path_buf)
                            .or_else(|| std::env::var_os(CONFIG_ENV).map(PathBuf::from))
                            .as_deref(),
                    );
                    let mut settings: Settings =
                        fig.extract().map_err(|_| ConfigErrors(errors.clone()))?;
                    for src in settings.sources.values_mut() {
                        src.secrets_file = None;
                        src.destination_secret_file = None;
                    }
                    settings.checked(&fig, |_| Ok(()))
                } else {
                    Err(ConfigErrors(errors))
                }
            }
        }
    }

    /// Extracts and validates settings from a prepared figment.
    pub fn load_from(fig: &Figment) -> Result<Loaded, ConfigErrors> {
        Self::load_from_checked(fig, |_| Ok(()))
    }

    fn load_from_checked(
        fig: &Figment,
        check: impl FnOnce(&Loaded) -> Result<(), ConfigErrors>,
    ) -> Result<Loaded, ConfigErrors> {
        let settings: Settings = fig.extract().map_err(|e| {
            ConfigErrors(
                e.into_iter()
                    .map(|e| ConfigError {
                        key: e.path.join("."),
                        origin: e
                            .metadata
                            .as_ref()
                            .map_or_else(|| "unknown source".into(), |m| describe(m, &e.path)),
                        message: file::error_message(&e.path, &e.kind),
                    })
                    .collect(),
            )
        })?;
        Self::checked(settings, fig, check)
    }

    /// Validates extracted `settings` (`fig` tells where each value came
    /// from), then runs `check` on them, with or without errors: every
    /// mistake is reported at once.
    fn checked(
        self,
        fig: &Figment,
        check: impl FnOnce(&Loaded) -> Result<(), ConfigErrors>,
    ) -> Result<Loaded, ConfigErrors> {
        let (loaded, mut errors) = self.validate(fig);
        if let Err(more) = check(&loaded) {
            errors.extend(more.0);
        }
        if errors.is_empty() {
            Ok(loaded)
        } else {
            Err(ConfigErrors(errors))
        }
    }

    /// The TTL bounds the API enforces.
    pub fn ttl_bounds(&self) -> TtlBounds {
        TtlBounds::new(
            self.claims.default_ttl,
            self.claims.default_done_ttl,
            self.claims.max_ttl,
        )
    }

    /// The effective settings as TOML, secrets redacted, and each source's
    /// `forward_to` without its userinfo and query (they may hold a
    /// password or an API key).
    pub fn to_redacted_toml(&self) -> String {
        let mut shown = self.clone();
        for source in shown.sources.values_mut() {
            if let Some(url) = &mut source.forward_to {
                *url = crate::redact::url_str(url);
            }
            for d in &mut source.destinations {
                d.forward_to = crate::redact::url_str(&d.forward_to);
            }
        }
        if let Some(url) = &mut shown.telemetry.traces.otlp_endpoint {
            *url = crate::redact::url_str(url);
        }
        toml::to_string_pretty(&shown)
            .unwrap_or_else(|e| format!("# cannot render settings: {e}\n"))
    }

    fn validate_redis(&self, bad: &mut impl FnMut(&str, String)) {
        let r = &self.storage.redis;
        if r.prefix.is_empty() || r.prefix.contains(['{', '}']) {
            bad(
                "storage.redis.prefix",
                "must be non-empty and free of '{' and '}' (they are Redis Cluster hash tags)"
                    .into(),
            );
        }
        for (key, d) in [
            ("storage.redis.connect_timeout", r.connect_timeout),
            ("storage.redis.response_timeout", r.response_timeout),
        ] {
            if d.is_zero() || d > Duration::from_secs(3600) {
                bad(key, "must be more than 0 and at most 1h".into());
            }
        }
        // Added to every record's expiry in Redis's own arithmetic.
        if r.expiry_slack > Duration::from_secs(86_400) {
            bad("storage.redis.expiry_slack", "must be at most 1d".into());
        }
        // The wait is one command: its answer must come within the
        // response timeout.
        let waits = matches!(r.durability, crate::domain::Durability::Replicas(_));
        if r.replicas_timeout.is_zero() || waits && r.replicas_timeout >= r.response_timeout {
            bad(
                "storage.redis.replicas_timeout",
                "must be more than 0 and less than storage.redis.response_timeout".into(),
            );
        }
        let g = &self.gateway;
        if !(1..=sources::MAX_INBOX_BUCKETS).contains(&g.inbox_buckets) {
            bad(
                "gateway.inbox_buckets",
                format!("must be 1 to {}", sources::MAX_INBOX_BUCKETS),
            );
        }
        if g.lease_grace < sources::MIN_LEASE_GRACE || g.lease_grace > sources::MAX_LEASE_GRACE {
            bad(
                "gateway.lease_grace",
                format!(
                    "must be {} to {}",
                    humantime::format_duration(sources::MIN_LEASE_GRACE),
                    humantime::format_duration(sources::MAX_LEASE_GRACE)
                ),
            );
        } else if g.inbox == sources::InboxPlace::Shared
            && self.storage.backend == Backend::Redis
            && g.lease_grace < self.storage.redis.response_timeout.saturating_mul(3)
        {
            // Renewed every quarter of the grace: one renewal that times out
            // must leave the next one time to land.
            bad(
                "gateway.lease_grace",
                format!(
                    "must be at least 3 times storage.redis.response_timeout ({}), so that a \
                     renewal that times out leaves the next one time to land",
                    humantime::format_duration(self.storage.redis.response_timeout)
                ),
            );
        }
        if g.scan_bytes == 0 {
            bad("gateway.scan_bytes", "must be more than 0".into());
        }
        if g.scan_time.is_zero() || g.scan_time > sources::MAX_SCAN_TIME {
            bad(
                "gateway.scan_time",
                format!(
                    "must be more than 0 and at most {}",
                    humantime::format_duration(sources::MAX_SCAN_TIME)
                ),
            );
        }
        if !(1..=sources::MAX_SCANS).contains(&g.max_scans) {
            bad(
                "gateway.max_scans",
                format!("must be 1 to {}", sources::MAX_SCANS),
            );
        }
        if g.inbox == sources::InboxPlace::Shared && self.storage.backend != Backend::Redis {
            bad(
                "gateway.inbox",
                "\"shared\" keeps the inbox in Redis: it needs storage.backend = \"redis\" \
                 (the local inbox, the default, lives in this instance's data file)"
                    .into(),
            );
        }
        if self.storage.backend != Backend::Redis {
            return;
        }
        #[cfg(not(feature = "redis"))]
        bad(
            "storage.backend",
            "this dedupd was built without Redis support; rebuild with `cargo build --release --features redis`"
                .into(),
        );
        #[cfg(feature = "redis")]
        {
            if r.cluster_nodes.is_empty() && redis::parse_redis_url(r.url.expose()).is_none() {
                bad(
                    "storage.redis.url",
                    "not a Redis URL: expected redis://host:port, rediss://… or redis+unix:///path"
                        .into(),
                );
            }
            for node in &r.cluster_nodes {
                if redis::parse_redis_url(node.expose()).is_none() {
                    bad(
                        "storage.redis.cluster_nodes",
                        "each node must be a redis:// URL".into(),
                    );
                    break;
                }
            }
            for node in &r.sentinels {
                if redis::parse_redis_url(node.expose()).is_none() {
                    bad(
                        "storage.redis.sentinels",
                        "each sentinel must be a redis:// URL".into(),
                    );
                    break;
                }
            }
            if !r.sentinels.is_empty() && !r.cluster_nodes.is_empty() {
                bad(
                    "storage.redis.sentinels",
                    "a Redis Cluster has no sentinels: set sentinels or cluster_nodes, not both"
                        .into(),
                );
            }
            if !r.sentinels.is_empty() && r.sentinel_master.trim().is_empty() {
                bad(
                    "storage.redis.sentinel_master",
                    "must name the master the sentinels monitor".into(),
                );
            }
        }
    }

    fn validate_resp(&self, no_tokens: bool, bad: &mut impl FnMut(&str, String)) {
        let r = &self.resp;
        if !(1..=1_000_000).contains(&r.max_connections) {
            bad("resp.max_connections", "must be 1 to 1000000".into());
        }
        if !(1..=1_000_000).contains(&r.max_unauthenticated) {
            bad("resp.max_unauthenticated", "must be 1 to 1000000".into());
        }
        for (key, d) in [
            ("resp.idle_timeout", r.idle_timeout),
            ("resp.auth_timeout", r.auth_timeout),
            ("resp.write_timeout", r.write_timeout),
        ] {
            if d.is_zero() || d > Duration::from_secs(7 * 86_400) {
                bad(key, "must be more than 0 and at most 7d".into());
            }
        }
        let Some(listen) = r.listen else {
            return;
        };
        if self.storage.backend == Backend::Redis {
            bad(
                "resp.listen",
                "the Redis-protocol listener serves a keyspace in the redb file; with \
                 storage.backend = \"redis\" there is a Redis already: point your Redis \
                 clients at it directly, and remove [resp] listen"
                    .into(),
            );
        }
        if no_tokens && !listen.ip().is_loopback() {
            bad(
                "resp.listen",
                format!(
                    "refusing to listen on {listen} without API tokens: anyone who can reach \
                     it could read and write keys. Set api.tokens or api.tokens_file (clients \
                     then AUTH with a token), or listen on a loopback address such as 127.0.0.1"
                ),
            );
        }
        if listen == self.listen && listen.port() != 0 {
            bad(
                "resp.listen",
                format!("{listen} is the HTTP listen address too: pick another port"),
            );
        }
    }

    /// `gateway.dedupe_window` covers every replay a source's signature
    /// check lets through. A signed timestamp `ts` is accepted while our
    /// clock is within `tolerance` of it, so the first post may arrive as
    /// early as `ts - tolerance` (a sender's clock ahead of ours) and a
    /// replay as late as `ts + tolerance`: twice the tolerance after the
    /// receipt the window counts from, plus a minute for the whole seconds
    /// signatures carry and the time the body takes to arrive. Without a
    /// signed timestamp (GitHub) any window is all the protection there
    /// is, so only the minute is required.
    fn validate_dedupe_window(&self, bad: &mut impl FnMut(&str, String)) {
        const MARGIN: Duration = Duration::from_secs(60);
        let window = self.gateway.dedupe_window;
        if window < MARGIN {
            bad(
                "gateway.dedupe_window",
                format!(
                    "{} is too short: must be at least 1m",
                    humantime::format_duration(window)
                ),
            );
            return;
        }
        if window > MAX_RETENTION {
            bad(
                "gateway.dedupe_window",
                "must be at most 3650d: the data file keeps it, and each record's expiry, in \
                 milliseconds"
                    .into(),
            );
            return;
        }
        for (name, src) in &self.sources {
            if !src.scheme.signs_timestamp() {
                continue;
            }
            let least = src.tolerance.saturating_mul(2).saturating_add(MARGIN);
            if window < least {
                bad(
                    "gateway.dedupe_window",
                    format!(
                        "{} is shorter than {}, twice sources.{name}.tolerance ({}) plus 1m: a \
                         replay signed within the tolerance could outlive the event's dedupe \
                         record and be delivered again",
                        humantime::format_duration(window),
                        humantime::format_duration(least),
                        humantime::format_duration(src.tolerance),
                    ),
                );
            }
        }
    }

    fn validate(mut self, fig: &Figment) -> (Loaded, Vec<ConfigError>) {
        let mut errors = Vec::new();
        let mut bad = |key: &str, message: String| {
            errors.push(ConfigError {
                key: key.to_owned(),
                origin: origin(fig, key),
                message,
            });
        };
        let c = &self.claims;
        if c.max_ttl.is_zero() {
            bad("claims.max_ttl", "must be more than 0".into());
        } else if c.max_ttl > MAX_TTL_BOUND {
            bad(
                "claims.max_ttl",
                format!(
                    "must be at most {} (3650 days): every backend can store an expiry that far ahead",
                    humantime::format_duration(MAX_TTL_BOUND)
                ),
            );
        }
        for (key, ttl) in [
            ("claims.default_ttl", c.default_ttl),
            ("claims.default_done_ttl", c.default_done_ttl),
        ] {
            if ttl.as_millis() == 0 {
                bad(key, "must be at least 1ms".into());
            } else if ttl > c.max_ttl {
                bad(
                    key,
                    format!(
                        "{} exceeds claims.max_ttl ({})",
                        humantime::format_duration(ttl),
                        humantime::format_duration(c.max_ttl)
                    ),
                );
            }
        }
        if c.max_result_bytes > crate::domain::MAX_RESULT_BYTES_LIMIT {
            bad(
                "claims.max_result_bytes",
                format!(
                    "must be 0 (keep no results) to {} (1 MiB)",
                    crate::domain::MAX_RESULT_BYTES_LIMIT
                ),
            );
        }
        if self.ordering.retention.as_millis() == 0 || self.ordering.retention > MAX_RETENTION {
            bad("ordering.retention", "must be 1ms to 3650d".into());
        }
        if !(1..=256).contains(&self.http.workers) {
            bad("http.workers", "must be between 1 and 256".into());
        }
        for (key, d) in [
            ("http.body_timeout", self.http.body_timeout),
            ("http.header_timeout", self.http.header_timeout),
            ("http.write_timeout", self.http.write_timeout),
        ] {
            if d.is_zero() || d > Duration::from_secs(300) {
                bad(key, "must be more than 0 and at most 5m".into());
            }
        }
        if !(16..=1_000_000).contains(&self.http.max_connections) {
            bad("http.max_connections", "must be 16 to 1000000".into());
        }
        if self.http.max_connections_per_address > 1_000_000 {
            bad(
                "http.max_connections_per_address",
                "must be 0 (no cap) to 1000000".into(),
            );
        }
        if !(1024..=MAX_HTTP_BODY).contains(&self.http.max_body_bytes) {
            bad(
                "http.max_body_bytes",
                format!("must be 1024 to {MAX_HTTP_BODY} (16 MiB)"),
            );
        }
        if self.storage.cache_bytes < 1024 * 1024 {
            bad(
                "storage.cache_bytes",
                "must be at least 1048576 (1 MiB)".into(),
            );
        }
        // Both size what the writer allocates: a batch of i64::MAX made its
        // thread panic (the process answered 503 to every write), larger
        // ones aborted the process at start.
        if !(1..=MAX_QUEUE_CAPACITY).contains(&self.storage.queue_capacity) {
            bad(
                "storage.queue_capacity",
                format!("must be 1 to {MAX_QUEUE_CAPACITY}"),
            );
        }
        if !(1..=MAX_BATCH).contains(&self.storage.max_batch) {
            bad("storage.max_batch", format!("must be 1 to {MAX_BATCH}"));
        }
        if !(1024 * 1024..=1024 * 1024 * 1024).contains(&self.storage.checkpoint_bytes) {
            bad(
                "storage.checkpoint_bytes",
                "must be 1048576 (1 MiB) to 1073741824 (1 GiB)".into(),
            );
        }
        if self.storage.checkpoint_interval < Duration::from_millis(100)
            || self.storage.checkpoint_interval > Duration::from_secs(3600)
        {
            bad("storage.checkpoint_interval", "must be 100ms to 1h".into());
        }
        if self.storage.checkpoint_idle < Duration::from_millis(10)
            || self.storage.checkpoint_idle > Duration::from_secs(3600)
        {
            bad("storage.checkpoint_idle", "must be 10ms to 1h".into());
        }
        if !(1024 * 1024..=1024 * 1024 * 1024 * 1024).contains(&self.storage.min_free_bytes) {
            bad(
                "storage.min_free_bytes",
                "must be 1048576 (1 MiB) to 1099511627776 (1 TiB)".into(),
            );
        }
        if self.storage.max_key_memory_bytes != 0
            && !(1024..=MAX_KEY_MEMORY_BYTES).contains(&self.storage.max_key_memory_bytes)
        {
            bad(
                "storage.max_key_memory_bytes",
                format!("must be 0 (automatic) or 1024 to {MAX_KEY_MEMORY_BYTES} (1 PiB)"),
            );
        }
        if self.storage.commit_hold > Duration::from_millis(100) {
            bad("storage.commit_hold", "must be 0s to 100ms".into());
        }
        self.validate_redis(&mut bad);
        if self.reaper.interval.as_millis() == 0 {
            bad("reaper.interval", "must be at least 1ms".into());
        }
        if !(1..=MAX_REAPER_BATCH).contains(&self.reaper.batch_size) {
            bad(
                "reaper.batch_size",
                format!("must be 1 to {MAX_REAPER_BATCH}: one transaction holds the writer"),
            );
        }
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.log.level) {
            bad("log.level", format!("not a tracing filter: {e}"));
        } else if let Some(word) = bare_target(&self.log.level) {
            bad(
                "log.level",
                format!(
                    "{word:?} is not a level (trace, debug, info, warn, error, off): alone, a \
                     word names a target, and nothing else would be logged. Write a level, or \
                     TARGET=LEVEL for one target (such as dedupd=debug)"
                ),
            );
        }
        if self.data_path.as_os_str().is_empty() {
            bad("data_path", "must not be empty".into());
        }

        if self.gateway.workers.is_some() {
            bad(
                "gateway.workers",
                "was replaced: set gateway.max_in_flight (deliveries in flight over all \
                 sources, default 256) and sources.NAME.max_in_flight (per source, default 16)"
                    .into(),
            );
        }
        if !(1..=sources::MAX_IN_FLIGHT).contains(&self.gateway.max_in_flight) {
            bad(
                "gateway.max_in_flight",
                format!("must be 1 to {}", sources::MAX_IN_FLIGHT),
            );
        }
        for (key, d) in [
            (
                "gateway.delivered_retention",
                self.gateway.delivered_retention,
            ),
            ("gateway.dead_retention", self.gateway.dead_retention),
        ] {
            if d.as_millis() == 0 || d > MAX_RETENTION {
                bad(key, "must be 1ms to 3650d".into());
            }
        }
        for (name, src) in &self.sources {
            for (key, d) in [
                ("delivered_retention", src.delivered_retention),
                ("dead_retention", src.dead_retention),
            ] {
                if d.is_some_and(|d| d.as_millis() == 0 || d > MAX_RETENTION) {
                    bad(
                        &format!("sources.{name}.{key}"),
                        "must be 1ms to 3650d".into(),
                    );
                }
            }
        }
        self.validate_dedupe_window(&mut bad);

        let weak = |t: &Secret| {
            let t = t.expose();
            t.len() < 16 || t.chars().any(|c| c.is_whitespace() || c.is_control())
        };
        const WEAK: &str =
            "each token must be at least 16 characters with no spaces or control characters";
        let mut tokens = |key: &str, inline: &[Secret], file: &Option<PathBuf>| {
            let mut all = inline.to_vec();
            if all.iter().any(weak) {
                bad(key, WEAK.into());
            }
            if let Some(path) = file {
                let key = format!("{key}_file");
                match read_lines(path) {
                    Ok(lines) => {
                        let from_file: Vec<Secret> = lines.into_iter().map(Secret::new).collect();
                        if from_file.iter().any(weak) {
                            bad(&key, format!("{}: {WEAK}", path.display()));
                        }
                        // Named to hold tokens, it holds none: taken as it
                        // is, /v1 on loopback would take requests without
                        // one (a token file made empty by an install that
                        // could not read /dev/urandom, or truncated).
                        if from_file.is_empty() {
                            bad(
                                &key,
                                format!(
                                    "{} holds no token: write one per line (at least 16 \
                                     characters), or remove the setting",
                                    path.display()
                                ),
                            );
                        }
                        all.extend(from_file);
                    }
                    Err(e) => bad(&key, e),
                }
            }
            all
        };
        let api_tokens = tokens("api.tokens", &self.api.tokens, &self.api.tokens_file);
        let api_read_tokens = tokens(
            "api.read_tokens",
            &self.api.read_tokens,
            &self.api.read_tokens_file,
        );
        if !api_read_tokens.is_empty() && api_tokens.is_empty() {
            bad(
                "api.read_tokens",
                "read-only tokens need full ones too (api.tokens or api.tokens_file): \
                 without, nothing could write through /v1"
                    .into(),
            );
        }
        if api_read_tokens
            .iter()
            .any(|r| api_tokens.iter().any(|t| t.expose() == r.expose()))
        {
            bad(
                "api.read_tokens",
                "a token is both full (api.tokens) and read-only: list it once".into(),
            );
        }
        if api_tokens.is_empty() && !self.listen.ip().is_loopback() {
            bad(
                "listen",
                format!(
                    "refusing to listen on {} without API tokens: anyone who can reach it \
                     could claim and release keys. Set api.tokens or api.tokens_file, or \
                     listen on a loopback address such as 127.0.0.1",
                    self.listen
                ),
            );
        }
        self.validate_resp(api_tokens.is_empty(), &mut bad);
        for (key, message) in self.telemetry.traces.problems() {
            bad(key, message);
        }
        if let Some(a) = &self.alerts {
            let (every, backlog) = (a.every, a.backlog_after);
            if !(Duration::from_secs(1)..=Duration::from_secs(86_400)).contains(&every) {
                bad("alerts.every", "must be 1s to 1d".into());
            }
            if !(Duration::from_secs(60)..=Duration::from_secs(30 * 86_400)).contains(&backlog) {
                bad("alerts.backlog_after", "must be 1m to 30d".into());
            }
        }
        if let Some(a) = &self.alerts
            && a.destination_secret.is_some()
            && !a.destination_secrets.is_empty()
        {
            // As for a source: with two lists, an operator rotating in one
            // secret would not know which one dedupd signs with.
            bad(
                "alerts.destination_secrets",
                "set destination_secret or destination_secrets, not both".into(),
            );
        }
        // Secrets named by file are read here and kept beside the inline
        // ones (`SourceSettings::files`), so what is loaded is complete and
        // still prints as given; the rest of a source is checked when
        // startup (and a reload) builds it (`gateway::sources::build_sources`).
        for (name, src) in &mut self.sources {
            if !valid_source_name(name) {
                bad(
                    &format!("sources.{name}"),
                    "a source name is 1 to 64 of A-Z a-z 0-9 _ -".into(),
                );
                continue;
            }
            if name == alerts::ALERT_SOURCE {
                bad(
                    &format!("sources.{name}"),
                    "this name is dedupd's own source of alerts (see [alerts]); choose another"
                        .into(),
                );
                continue;
            }
            if let Some(path) = src.secrets_file.take() {
                match read_lines(&path) {
                    Ok(lines) => src.files.secrets = lines.into_iter().map(Secret::new).collect(),
                    Err(e) => {
                        bad(&format!("sources.{name}.secrets_file"), e);
                        src.files.secrets_unreadable = true;
                    }
                }
                src.secrets_file = Some(path);
            }
            // One place holds the destination secrets: with two, an operator
            // rotating in one of them would not know which list dedupd signs
            // with.
            let places = [
                ("destination_secret", src.destination_secret.is_some()),
                ("destination_secrets", !src.destination_secrets.is_empty()),
                (
                    "destination_secret_file",
                    src.destination_secret_file.is_some(),
                ),
            ];
            let set: Vec<&str> = places
                .iter()
                .filter(|(_, on)| *on)
                .map(|(k, _)| *k)
                .collect();
            if let [first, .., last] = set[..] {
                bad(
                    &format!("sources.{name}.{last}"),
                    format!(
                        "set one of destination_secret (one secret), destination_secrets (several, \
                         during a rotation) or destination_secret_file, not {}",
                        if set.len() == 2 {
                            format!("both {first} and {last}")
                        } else {
                            "all three".to_owned()
                        }
                    ),
                );
            }
            if let Some(path) = src.destination_secret_file.take() {
                match read_lines(&path) {
                    Ok(lines) => {
                        src.files.destination_secrets =
                            lines.into_iter().map(Secret::new).collect();
                    }
                    Err(e) => {
                        bad(&format!("sources.{name}.destination_secret_file"), e);
                        src.files.destination_unreadable = true;
                    }
                }
                src.destination_secret_file = Some(path);
            }
        }
        let loaded = Loaded {
            settings: self,
            api_tokens,
            api_read_tokens,
            figment: Some(fig.clone()),
        };
        (loaded, errors)
    }
}

/// Where the value of `key` came from, in words. A key that was never set
/// (a missing optional field) is described by its nearest set parent.
fn origin(fig: &Figment, key: &str) -> String {
    let mut path: Vec<&str> = key.split('.').collect();
    while !path.is_empty() {
        if let Some(m) = fig.find_metadata(&path.join(".")) {
            return describe(m, &path);
        }
        path.pop();
    }
    "defaults".into()
}

/// The non-empty, non-comment lines of a secrets file, trimmed.
fn read_lines(path: &Path) -> Result<Vec<String>, String> {
    bounded::read_text(path, bounded::MAX_SECRETS_FILE)
        .map(|text| {
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(str::to_owned)
                .collect()
        })
        .map_err(|e| format!("cannot read {}: {e}", path.display()))
}

fn describe<K: AsRef<str>>(m: &figment::Metadata, path: &[K]) -> String {
    if m.name.contains("environment") {
        let var: Vec<String> = path.iter().map(|k| k.as_ref().to_uppercase()).collect();
        return format!("environment variable DEDUPD_{}", var.join("__"));
    }
    match &m.source {
        Some(figment::Source::File(p)) => format!("{} {}", m.name, p.display()),
        Some(figment::Source::Code(_)) => "defaults".into(),
        _ => m.name.to_string(),
    }
}

/// The first directive of a `log.level` filter that is a bare word but not
/// a level: tracing reads it as a target to log at every level, and turns
/// everything else off (`warning` for `warn` silenced the whole log).
pub fn bare_target(filter: &str) -> Option<&str> {
    // tracing's levels, by name or number (0 is off, 5 trace).
    const LEVELS: [&str; 12] = [
        "trace", "debug", "info", "warn", "error", "off", "0", "1", "2", "3", "4", "5",
    ];
    filter.split(',').map(str::trim).find(|d| {
        !d.is_empty()
            && !d.contains(['=', '['])
            && !LEVELS.iter().any(|l| l.eq_ignore_ascii_case(d))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use figment::providers::{Format, Toml};

    #[test]
    fn defaults_are_valid_and_loopback() {
        let loaded = Settings::load_from(&Settings::figment(None)).unwrap();
        assert!(loaded.settings.listen.ip().is_loopback());
        assert!(loaded.api_tokens.is_empty());
    }

    fn load_toml(text: &str) -> Result<Loaded, ConfigErrors> {
        Settings::load_from(&Settings::figment(None).merge(Toml::string(text)))
    }

    /// A bare word that is not a level is a target: `warning` for `warn`
    /// logged nothing at all. It is refused, naming the levels; levels in
    /// any case, TARGET=LEVEL directives and span filters still pass.
    #[test]
    fn a_log_level_that_is_a_bare_word_but_no_level_is_refused() {
        for bad in ["warning", "information", "info,dedupd", "err"] {
            let errors = load_toml(&format!("[log]\nlevel = \"{bad}\"\n")).unwrap_err();
            assert_eq!(errors.0.len(), 1, "{bad}: {errors}");
            assert_eq!(errors.0[0].key, "log.level");
            assert!(errors.0[0].message.contains("not a level"), "{errors}");
        }
        for good in [
            "warn",
            "INFO",
            "off",
            "info,dedupd=debug",
            "dedupd[ingest]=trace,warn",
        ] {
            let loaded = load_toml(&format!("[log]\nlevel = \"{good}\"\n"));
            assert!(loaded.is_ok(), "{good}: {:?}", loaded.err());
        }
    }

    #[test]
    fn cpu_scheduling_is_auto_by_default_and_refuses_an_unknown_value() {
        assert_eq!(
            load_toml("").unwrap().settings.cpu_scheduling,
            CpuScheduling::Auto
        );
        let started = load_toml("cpu_scheduling = \"as-started\"").unwrap();
        assert_eq!(started.settings.cpu_scheduling, CpuScheduling::AsStarted);
        let errors = load_toml("cpu_scheduling = \"fast\"").unwrap_err();
        assert_eq!(errors.0.len(), 1, "{errors}");
        assert_eq!(errors.0[0].key, "cpu_scheduling");
        assert!(errors.0[0].message.contains("as-started"), "{errors}");
    }

    #[cfg(feature = "redis")]
    #[test]
    fn lease_grace_is_10_s_by_default_bounded_and_outlasts_three_redis_answers() {
        let defaults = load_toml("").unwrap().settings;
        assert_eq!(defaults.gateway.lease_grace, Duration::from_secs(10));
        let shared = "[storage]\nbackend = \"redis\"\n[gateway]\ninbox = \"shared\"\n";
        let grace = |g: &str| format!("{shared}lease_grace = \"{g}\"\n");
        assert_eq!(
            load_toml(&grace("6s"))
                .unwrap()
                .settings
                .gateway
                .lease_grace,
            Duration::from_secs(6)
        );
        for bad in ["500ms", "11m", "0s"] {
            let errors = load_toml(&grace(bad)).unwrap_err();
            assert_eq!(errors.0.len(), 1, "{bad}: {errors}");
            assert_eq!(errors.0[0].key, "gateway.lease_grace");
            assert!(errors.0[0].message.contains("1s to 10m"), "{errors}");
        }
        // Renewed every quarter of it: a renewal that times out must leave
        // the next one time to land.
        let slow = format!(
            "{}[storage.redis]\nresponse_timeout = \"3s\"\n",
            grace("8s")
        );
        let errors = load_toml(&slow).unwrap_err();
        assert_eq!(errors.0[0].key, "gateway.lease_grace", "{errors}");
        assert!(errors.0[0].message.contains("3 times"), "{errors}");
        // Only the shared inbox renews leases.
        assert!(
            load_toml(
                "[gateway]\nlease_grace = \"2s\"\n[storage.redis]\nresponse_timeout = \"3s\""
            )
            .is_ok()
        );
    }

    #[test]
    fn read_only_tokens_are_loaded_apart_and_checked_like_full_ones() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("readers");
        std::fs::write(&file, "# readers\nfile-reader-0123456789\n").unwrap();
        let loaded = load_toml(&format!(
            "[api]\ntokens = [\"full-token-0123456789\"]\nread_tokens = \
             [\"read-token-0123456789\"]\nread_tokens_file = {:?}",
            file.display().to_string()
        ))
        .unwrap();
        assert_eq!(loaded.api_tokens.len(), 1);
        let readers: Vec<&str> = loaded.api_read_tokens.iter().map(Secret::expose).collect();
        assert_eq!(readers, ["read-token-0123456789", "file-reader-0123456789"]);

        std::fs::write(&file, "short\n").unwrap();
        let file_setting = format!("read_tokens_file = {:?}", file.display().to_string());
        for (api, key) in [
            // Without a full token nothing could write.
            (
                "read_tokens = [\"read-token-0123456789\"]",
                "api.read_tokens",
            ),
            (
                "tokens = [\"full-token-0123456789\"]\nread_tokens = [\"short\"]",
                "api.read_tokens",
            ),
            (
                "tokens = [\"same-token-0123456789\"]\nread_tokens = [\"same-token-0123456789\"]",
                "api.read_tokens",
            ),
            (
                &format!("tokens = [\"full-token-0123456789\"]\n{file_setting}"),
                "api.read_tokens_file",
            ),
        ] {
            let errors = load_toml(&format!("[api]\n{api}")).unwrap_err();
            assert!(errors.0.iter().any(|e| e.key == key), "{api}: {errors}");
        }
    }

    /// Once: a tokens file with no token in it (blank, or comments only)
    /// was taken as no tokens, and /v1 on loopback took requests without
    /// one. The package's install wrote such a file when it could not read
    /// /dev/urandom.
    #[test]
    fn a_tokens_file_that_holds_no_token_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("api-tokens");
        for text in ["", "\n", "# rotated\n\n"] {
            std::fs::write(&file, text).unwrap();
            for key in ["tokens_file", "read_tokens_file"] {
                let full = if key == "read_tokens_file" {
                    "tokens = [\"full-token-0123456789\"]\n"
                } else {
                    ""
                };
                let toml = format!("[api]\n{full}{key} = {:?}", file.display().to_string());
                let errors = load_toml(&toml).unwrap_err();
                assert!(
                    errors.0.iter().any(|e| e.key == format!("api.{key}")
                        && e.to_string().contains("holds no token")),
                    "{text:?} {key}: {errors}"
                );
            }
        }
        std::fs::write(&file, "# one\nfile-token-0123456789\n").unwrap();
        let toml = format!("[api]\ntokens_file = {:?}", file.display().to_string());
        assert_eq!(load_toml(&toml).unwrap().api_tokens.len(), 1);
    }

    /// Every default survives the defaults layer as it is: secrets too
    /// (`storage.redis.url` was loaded as the string `<redacted>`), while
    /// what is printed of the loaded settings stays redacted.
    #[test]
    fn defaults_load_as_they_are_and_print_redacted() {
        let loaded = Settings::load_from(&Settings::figment(None)).unwrap();
        let s = &loaded.settings;
        assert_eq!(s.storage.redis.url.expose(), "redis://127.0.0.1:6379");
        let values = |s: &Settings| secret::exposed(|| toml::to_string(s).unwrap());
        assert_eq!(values(s), values(&Settings::default()));
        let printed = s.to_redacted_toml();
        assert!(!printed.contains("redis://127.0.0.1:6379"), "{printed}");
        assert!(printed.contains("url = \"<redacted>\""), "{printed}");
        assert!(!format!("{s:?}").contains("redis://"));
    }

    /// With the Redis backend chosen and no URL given, the default URL is
    /// the one used: it was `<redacted>`, refused as "not a Redis URL".
    #[cfg(feature = "redis")]
    #[test]
    fn the_redis_backend_takes_the_default_url() {
        let fig = Settings::figment(None).merge(Serialized::default("storage.backend", "redis"));
        let loaded = Settings::load_from(&fig).unwrap();
        assert_eq!(
            loaded.settings.storage.redis.url.expose(),
            "redis://127.0.0.1:6379"
        );
    }

    /// toml 0.8's writer counted a run of quotes in a `u8`: 256 in a row
    /// in a setting (a `data_path`, a source's `event_id`) made check-config
    /// panic in a debug build and print TOML that does not read back in a
    /// release one. Found by `tests/fuzz/config.rs`; toml 0.9's writer
    /// saturates.
    #[test]
    fn long_runs_of_quotes_print_as_toml_that_reads_back() {
        let mut s = Settings::default();
        let path = format!("{}x{}", "\"".repeat(300), "'".repeat(300));
        s.data_path = PathBuf::from(&path);
        let text = s.to_redacted_toml();
        let back: toml::Value = toml::from_str(&text).unwrap();
        assert_eq!(back["data_path"].as_str(), Some(path.as_str()));
    }

    #[test]
    fn secrets_are_redacted_when_printed() {
        let mut s = Settings::default();
        s.api.tokens.push(Secret::new("supersecret-token-1234"));
        let text = s.to_redacted_toml();
        assert!(!text.contains("supersecret"), "{text}");
        assert!(text.contains("<redacted>"));
        assert!(!format!("{s:?}").contains("supersecret"));
    }
}
