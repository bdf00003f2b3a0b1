//! `[alerts]`: operational events sent as signed webhooks.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::Secret;
use super::sources::SourceSettings;
use crate::domain::Scheme;

/// The internal source alerts are stored and delivered as. Not postable
/// (`/ingest/dedupd-alerts` is 404) and not a name a configured source may
/// take.
pub const ALERT_SOURCE: &str = "dedupd-alerts";

/// Where dedupd sends its alerts, and how often.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertSettings {
    /// The alert endpoint.
    pub forward_to: String,
    /// `whsec_<base64>` secret the alerts are signed with.
    #[serde(default)]
    pub destination_secret: Option<Secret>,
    /// Several secrets, during a rotation (one signature each).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub destination_secrets: Vec<Secret>,
    /// At most one alert per kind and source per interval; the others of
    /// the interval are folded into one sent at its end.
    #[serde(with = "humantime_serde", default = "default_every")]
    pub every: Duration,
    /// `backlog.stale` once a source's oldest pending event is older.
    #[serde(with = "humantime_serde", default = "default_backlog_after")]
    pub backlog_after: Duration,
    /// Time allowed for each delivery attempt of an alert.
    #[serde(with = "humantime_serde", default = "default_forward_timeout")]
    pub forward_timeout: Duration,
    /// Attempts before an alert is dead.
    #[serde(default = "default_max_attempts")]
    pub max_attempts: u32,
    /// Delay before the first retry; doubles with each failure.
    #[serde(with = "humantime_serde", default = "default_backoff_min")]
    pub backoff_min: Duration,
    /// Longest delay between retries.
    #[serde(with = "humantime_serde", default = "default_backoff_max")]
    pub backoff_max: Duration,
}

impl AlertSettings {
    /// The internal source's settings. Its signing secret only satisfies
    /// the source builder: nobody can post to it (routes::ingest).
    pub fn source(&self) -> SourceSettings {
        SourceSettings {
            scheme: Scheme::StandardWebhooks,
            secrets: Vec::new(),
            secrets_file: None,
            tolerance: Duration::from_secs(300),
            event_id: "header:webhook-id".into(),
            created_at: None,
            created_at_format: Default::default(),
            notification_url: None,
            stream: None,
            forward_to: Some(self.forward_to.clone()),
            destinations: Vec::new(),
            forward_timeout: self.forward_timeout,
            max_attempts: self.max_attempts,
            backoff_min: self.backoff_min,
            backoff_max: self.backoff_max,
            destination_secret: self.destination_secret.clone(),
            destination_secrets: self.destination_secrets.clone(),
            destination_secret_file: None,
            forward_headers: vec!["content-type".into()],
            max_body_bytes: 64 * 1024,
            delivered_retention: None,
            dead_retention: None,
            // A hanging alert endpoint holds these slots, no more.
            max_in_flight: 4,
            pause_after: 5,
            rate_limit: None,
            rate_burst: None,
            files: Default::default(),
        }
    }
}

fn default_every() -> Duration {
    Duration::from_secs(300)
}
fn default_backlog_after() -> Duration {
    Duration::from_secs(900)
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
    Duration::from_secs(600)
}
