//! Gateway settings: global delivery settings and one table per source.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::Secret;
use std::collections::BTreeMap;

use crate::domain::{CreatedAtFormat, Rate, Scheme};
pub use crate::gateway::route::FilterValues;

/// Largest `max_in_flight`, per source and over all sources.
pub const MAX_IN_FLIGHT: usize = 4096;

/// Delivery settings shared by all sources.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewaySettings {
    /// Deliveries in flight at once, over all sources; each source also
    /// has its own limit (`sources.NAME.max_in_flight`).
    pub max_in_flight: usize,
    /// Replaced by `max_in_flight` (here and per source); only read to
    /// refuse it with a message that says so.
    #[serde(default, skip_serializing)]
    pub workers: Option<usize>,
    /// How long delivered and stale events are kept (for listing; while
    /// kept, a repeat of one is a duplicate).
    #[serde(with = "humantime_serde")]
    pub delivered_retention: Duration,
    /// How long dead events wait for a redeliver before they are reaped.
    #[serde(with = "humantime_serde")]
    pub dead_retention: Duration,
    /// How long after its receipt an event's id stays a duplicate once the
    /// event itself is reaped: a small record (no body) replaces it until
    /// then. All the replay protection a scheme without a signed timestamp
    /// (GitHub) has; at least twice a timestamped source's `tolerance`
    /// plus a minute (see `Settings::validate`).
    #[serde(with = "humantime_serde")]
    pub dedupe_window: Duration,
    /// Where the inbox lives: this instance's data file, or Redis, shared
    /// by every instance (`storage.backend = "redis"`).
    pub inbox: InboxPlace,
    /// Buckets per source of the shared inbox: how far one source spreads
    /// over a Redis Cluster's masters. Fixed once events are stored.
    pub inbox_buckets: u16,
    /// With the shared inbox: how long an instance's lease on an event
    /// outlives its last renewal. A live instance renews its leases every
    /// quarter of it, however long a delivery takes; a dead (or frozen) one
    /// loses its events to the others this long after its last renewal.
    #[serde(with = "humantime_serde")]
    pub lease_grace: Duration,
    /// Most body bytes one count (or dry run, or pass of a bulk job) reads
    /// and parses for a filter on a body field; past it, a count answers
    /// `complete: false` with a cursor (see `gateway::scan`).
    pub scan_bytes: u64,
    /// Longest one count (or dry run, or pass of a job) scans.
    #[serde(with = "humantime_serde")]
    pub scan_time: Duration,
    /// Counts, dry runs and job passes that scan at once; more wait.
    pub max_scans: usize,
}

/// Where the gateway inbox lives (`gateway.inbox`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InboxPlace {
    /// In this instance's data file: it delivers what it received.
    #[default]
    Local,
    /// In Redis: any instance ingests, any instance delivers.
    Shared,
}

/// Most buckets per source of the shared inbox.
pub const MAX_INBOX_BUCKETS: u16 = 1024;
/// `gateway.lease_grace` unless set.
pub const DEFAULT_LEASE_GRACE: Duration = Duration::from_secs(10);
/// Shortest `gateway.lease_grace`.
pub const MIN_LEASE_GRACE: Duration = Duration::from_secs(1);
/// Longest `gateway.lease_grace`.
pub const MAX_LEASE_GRACE: Duration = Duration::from_secs(600);
/// Most scans at once (`gateway.max_scans`).
pub const MAX_SCANS: usize = 16;
/// Longest `gateway.scan_time`.
pub const MAX_SCAN_TIME: Duration = Duration::from_secs(10);

impl Default for GatewaySettings {
    fn default() -> Self {
        Self {
            max_in_flight: 256,
            workers: None,
            delivered_retention: Duration::from_secs(7 * 86_400),
            dead_retention: Duration::from_secs(30 * 86_400),
            dedupe_window: Duration::from_secs(30 * 86_400),
            inbox: InboxPlace::Local,
            inbox_buckets: 16,
            lease_grace: DEFAULT_LEASE_GRACE,
            scan_bytes: 16 * 1024 * 1024,
            scan_time: Duration::from_millis(250),
            max_scans: 1,
        }
    }
}

/// One provider posting to `/ingest/{name}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceSettings {
    /// `sume`, `standard-webhooks`, `stripe`, `github`, `slack`, `shopify`,
    /// `paddle`, `svix`, `square`, `zoom` or `linear`.
    pub scheme: Scheme,
    /// Signing secrets; several during a rotation.
    #[serde(default)]
    pub secrets: Vec<Secret>,
    /// A file with one secret per line (`#` comments allowed).
    #[serde(default)]
    pub secrets_file: Option<PathBuf>,
    /// Largest accepted distance between the signed timestamp and now.
    #[serde(with = "humantime_serde", default = "default_tolerance")]
    pub tolerance: Duration,
    /// Where the event id is: `header:NAME`, `body:/json/pointer`, or
    /// `body-sha256` (the hash of the signed body).
    pub event_id: String,
    /// Where `created_at` is, if the events carry one.
    #[serde(default)]
    pub created_at: Option<String>,
    /// How `created_at` is written: `auto` (RFC 3339 strings, Unix seconds
    /// or milliseconds as numbers), `rfc3339`, `unix-seconds` or
    /// `unix-millis`.
    #[serde(default)]
    pub created_at_format: CreatedAtFormat,
    /// Square signs the URL it posts to: the notification URL exactly as
    /// registered there (required by, and only for, the square scheme).
    #[serde(default)]
    pub notification_url: Option<String>,
    /// Where the ordering scope is, if events are ordered per stream.
    #[serde(default)]
    pub stream: Option<String>,
    /// The application's endpoint: the destination named `default`. Not
    /// with `destinations`.
    #[serde(default)]
    pub forward_to: Option<String>,
    /// Several destinations, each with its own filter and delivery state
    /// (`[[sources.NAME.destinations]]`). Not with `forward_to`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub destinations: Vec<DestinationSettings>,
    /// Time allowed for each delivery attempt.
    #[serde(with = "humantime_serde", default = "default_forward_timeout")]
    pub forward_timeout: Duration,
    /// Attempts before an event is dead.
    #[serde(default = "default_max_attempts")]
    pub max_attempts: u32,
    /// Delay before the first retry; doubles with each failure.
    #[serde(with = "humantime_serde", default = "default_backoff_min")]
    pub backoff_min: Duration,
    /// Longest delay between retries.
    #[serde(with = "humantime_serde", default = "default_backoff_max")]
    pub backoff_max: Duration,
    /// `whsec_<base64>` secret dedupd signs forwarded requests with.
    #[serde(default)]
    pub destination_secret: Option<Secret>,
    /// Several `whsec_<base64>` secrets, during a rotation: each forward
    /// carries one signature per secret, in this order. Not with
    /// `destination_secret` or `destination_secret_file` (whose lines are
    /// kept apart, in `files`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub destination_secrets: Vec<Secret>,
    /// A file holding the destination secrets, one per line (`#` comments
    /// allowed).
    #[serde(default)]
    pub destination_secret_file: Option<PathBuf>,
    /// Request headers passed on to the application.
    #[serde(default = "default_forward_headers")]
    pub forward_headers: Vec<String>,
    /// Largest accepted body, bytes (larger: 413).
    #[serde(default = "default_max_body_bytes")]
    pub max_body_bytes: usize,
    /// How long this source's delivered and stale events are kept:
    /// overrides `gateway.delivered_retention` (for a source whose bodies
    /// must not be kept that long).
    #[serde(default, with = "humantime_serde::option")]
    pub delivered_retention: Option<Duration>,
    /// How long this source's dead events are kept: overrides
    /// `gateway.dead_retention`.
    #[serde(default, with = "humantime_serde::option")]
    pub dead_retention: Option<Duration>,
    /// Deliveries of this source in flight at once (under the gateway's
    /// global `max_in_flight`): what a hanging destination can hold.
    #[serde(default = "default_source_max_in_flight")]
    pub max_in_flight: usize,
    /// Consecutive failed attempts after which the source's deliveries
    /// pause and one probe tests the destination; 0 never pauses.
    #[serde(default = "default_pause_after")]
    pub pause_after: u32,
    /// Most deliveries started per period (`"50/s"`, `"600/m"`, `"1000/h"`);
    /// deliveries beyond it wait, they never fail. Absent: no limit.
    #[serde(default)]
    pub rate_limit: Option<Rate>,
    /// Deliveries that may start at once after a quiet time, under
    /// `rate_limit` (default: one second's worth, at least 1).
    #[serde(default)]
    pub rate_burst: Option<u32>,
    /// What the secret files held when the settings were loaded: kept
    /// apart from the lists as given, so that the settings print as given
    /// (check-config) and read back.
    #[serde(skip)]
    pub files: SecretFiles,
}

/// One of a source's destinations: where its matching events go, and how
/// (each setting left out is the source's).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DestinationSettings {
    /// 1 to 64 of A-Z a-z 0-9 _ -, unique in the source; `default` is the
    /// one a lone `forward_to` names.
    pub name: String,
    /// The application's endpoint.
    pub forward_to: String,
    /// Which events go here: fields by locator and their values (absent:
    /// every event). See `gateway::route`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub filter: BTreeMap<String, FilterValues>,
    #[serde(default, with = "humantime_serde::option")]
    pub forward_timeout: Option<Duration>,
    #[serde(default)]
    pub max_attempts: Option<u32>,
    #[serde(default, with = "humantime_serde::option")]
    pub backoff_min: Option<Duration>,
    #[serde(default, with = "humantime_serde::option")]
    pub backoff_max: Option<Duration>,
    #[serde(default)]
    pub max_in_flight: Option<usize>,
    #[serde(default)]
    pub pause_after: Option<u32>,
    #[serde(default)]
    pub rate_limit: Option<Rate>,
    #[serde(default)]
    pub rate_burst: Option<u32>,
    /// Its own secret(s) to sign forwards with (an application of its
    /// own); absent: the source's.
    #[serde(default)]
    pub destination_secret: Option<Secret>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub destination_secrets: Vec<Secret>,
}

impl DestinationSettings {
    /// `settings` with this destination's own values in place of the
    /// source's: what its deliveries run with.
    pub fn over(&self, settings: &SourceSettings) -> SourceSettings {
        let mut s = settings.clone();
        s.forward_to = Some(self.forward_to.clone());
        s.destinations = Vec::new();
        if let Some(v) = self.forward_timeout {
            s.forward_timeout = v;
        }
        if let Some(v) = self.max_attempts {
            s.max_attempts = v;
        }
        if let Some(v) = self.backoff_min {
            s.backoff_min = v;
        }
        if let Some(v) = self.backoff_max {
            s.backoff_max = v;
        }
        if let Some(v) = self.max_in_flight {
            s.max_in_flight = v;
        }
        if let Some(v) = self.pause_after {
            s.pause_after = v;
        }
        if self.rate_limit.is_some() {
            s.rate_limit = self.rate_limit;
            s.rate_burst = self.rate_burst;
        } else if self.rate_burst.is_some() {
            // The source's rate with this burst (refused without one).
            s.rate_burst = self.rate_burst;
        }
        if self.destination_secret.is_some() || !self.destination_secrets.is_empty() {
            s.destination_secret = self.destination_secret.clone();
            s.destination_secrets = self.destination_secrets.clone();
            s.destination_secret_file = None;
            s.files.destination_secrets = Vec::new();
            s.files.destination_unreadable = false;
        }
        s
    }
}

/// What a source's secret files held when the settings were loaded
/// (`Settings::validate`).
#[derive(Debug, Clone, Default)]
pub struct SecretFiles {
    /// The lines of `secrets_file`.
    pub secrets: Vec<Secret>,
    /// The lines of `destination_secret_file`.
    pub destination_secrets: Vec<Secret>,
    /// `secrets_file` could not be read. That was reported then: the
    /// secrets it would have held are not reported missing again.
    pub secrets_unreadable: bool,
    /// `destination_secret_file` could not be read, likewise.
    pub destination_unreadable: bool,
}

impl SourceSettings {
    /// Every secret this source's provider may sign with: `secrets`, then
    /// the lines of `secrets_file` once loaded.
    pub fn all_secrets(&self) -> impl Iterator<Item = &Secret> {
        self.secrets.iter().chain(&self.files.secrets)
    }

    /// Every secret dedupd signs this source's forwards with, in the order
    /// of their signatures: `destination_secret`, `destination_secrets`, or
    /// the lines of `destination_secret_file` once loaded (one of them).
    pub fn all_destination_secrets(&self) -> impl Iterator<Item = &Secret> {
        self.destination_secret
            .iter()
            .chain(&self.destination_secrets)
            .chain(&self.files.destination_secrets)
    }
}

fn default_tolerance() -> Duration {
    Duration::from_secs(300)
}
fn default_forward_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_max_attempts() -> u32 {
    12
}
fn default_backoff_min() -> Duration {
    Duration::from_secs(1)
}
fn default_backoff_max() -> Duration {
    Duration::from_secs(3600)
}
fn default_forward_headers() -> Vec<String> {
    vec!["content-type".into()]
}
fn default_source_max_in_flight() -> usize {
    16
}
fn default_pause_after() -> u32 {
    5
}
fn default_max_body_bytes() -> usize {
    256 * 1024
}
