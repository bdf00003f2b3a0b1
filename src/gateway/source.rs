//! A configured source, parsed into what ingest and delivery use.

use std::time::Duration;

use super::locate::Locator;
use super::route::RouteFilter;
use super::signature::{Scheme, Verifier, parse_whsec};
use crate::config::sources::SourceSettings;
use crate::store::inbox::Retention;

/// Largest `max_body_bytes` a source may set: bodies are held in memory
/// while they are verified and stored.
pub const MAX_BODY_LIMIT: usize = 16 * 1024 * 1024;

/// Longest time allowed for one delivery attempt.
const MAX_FORWARD_TIMEOUT: Duration = Duration::from_secs(3600);
/// The longest backoff, pause or `Retry-After` hold: the fleet's lane
/// state takes any time further ahead for a value no instance wrote
/// (`lanes.lua`'s horizon, 31 days).
const MAX_BACKOFF: Duration = Duration::from_secs(30 * 86_400);

/// Most destination secrets a source signs with. A rotation needs two;
/// each one more costs an HMAC and about 50 header bytes per forward.
pub const MAX_DESTINATION_SECRETS: usize = 8;

/// Shortest allowed replay window.
const MIN_TOLERANCE: Duration = Duration::from_secs(1);
/// Longest allowed replay window.
const MAX_TOLERANCE: Duration = Duration::from_secs(3600);

/// Whether the scheme's signature covers header `name` (lowercased): only
/// standard-webhooks and svix sign one a locator may read, their id.
fn signed_header(scheme: Scheme, name: &str) -> bool {
    match scheme {
        Scheme::StandardWebhooks => name.eq_ignore_ascii_case("webhook-id"),
        Scheme::Svix => name.eq_ignore_ascii_case("svix-id"),
        _ => false,
    }
}

pub use crate::config::sources::MAX_IN_FLIGHT;

/// Headers dedupd sets on forwarded requests itself (or that belong to the
/// connection), which `forward_headers` may not copy.
const RESERVED_HEADERS: &[&str] = &[
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "dedupd-attempt",
    "dedupd-source",
    "dedupd-destination",
    "dedupd-replay",
    crate::telemetry::traces::STORED_CONTEXT,
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
];

/// A source ready to serve: every setting parsed and checked.
#[derive(Clone)]
pub struct Source {
    /// Name in `/ingest/{name}` and in the config table.
    pub name: String,
    /// Signature scheme, for logs.
    pub scheme: Scheme,
    /// Checks the provider's signatures.
    pub verifier: Verifier,
    /// Where the event id is.
    pub event_id: Locator,
    /// Where `created_at` is, if configured.
    pub created_at: Option<Locator>,
    /// How `created_at` is written.
    pub created_at_format: crate::domain::CreatedAtFormat,
    /// The URL Square signs (square sources only).
    pub notification_url: Option<String>,
    /// Where the stream is, if configured.
    pub stream: Option<Locator>,
    /// The application's endpoint.
    pub forward_to: reqwest::Url,
    /// Time allowed per attempt.
    pub forward_timeout: Duration,
    /// Attempts before dead.
    pub max_attempts: u32,
    /// First retry delay.
    pub backoff_min: Duration,
    /// Retry delay ceiling.
    pub backoff_max: Duration,
    /// Keys dedupd signs forwarded requests with (Standard Webhooks), one
    /// signature each, in this order: 1 to [`MAX_DESTINATION_SECRETS`],
    /// no two alike.
    pub destination_keys: Vec<Vec<u8>>,
    /// Lowercased names of request headers passed on.
    pub forward_headers: Vec<String>,
    /// Largest accepted body, bytes.
    pub max_body_bytes: usize,
    /// Deliveries in flight at once.
    pub max_in_flight: usize,
    /// Consecutive failures that pause deliveries (0: never).
    pub pause_after: u32,
    /// Delivery rate limit and its burst, if any.
    pub rate: Option<(crate::domain::Rate, u32)>,
    /// Its own retentions, ms, where it overrides the gateway's (delivered
    /// and stale, dead): see [`Source::retention`].
    pub retention_override: (Option<u64>, Option<u64>),
    /// The destination it delivers to (`default` for a lone `forward_to`).
    pub destination: String,
    /// For a destination's lane other than the source's own name: the
    /// source it belongs to (ingest refuses posts to a lane).
    pub lane_of: Option<String>,
    /// Whether its own name is a lane the dispatcher delivers: false for
    /// a source whose destinations are all lanes of their own.
    pub delivers: bool,
    /// On the source posted to: where each event goes, by destination.
    pub routes: Vec<Route>,
}

/// One destination of a source, as ingest routes to it.
#[derive(Debug, Clone)]
pub struct Route {
    /// The destination's name.
    pub destination: String,
    /// The inbox lane its deliveries live in ([`lane_name`]).
    pub lane: String,
    /// Which events go there.
    pub filter: RouteFilter,
}

/// The name of the destination a lone `forward_to` is.
pub const DEFAULT_DESTINATION: &str = "default";

/// The inbox lane of a source's destination: the source's own name for
/// `default` (so a source's rows from before destinations are its
/// deliveries there), else `SOURCE.DESTINATION` (a `.` no source name
/// holds).
pub fn lane_name(source: &str, destination: &str) -> String {
    if destination == DEFAULT_DESTINATION {
        source.to_owned()
    } else {
        format!("{source}.{destination}")
    }
}

impl Source {
    /// How long this source's settled events are kept: its own
    /// retentions, else the gateway's.
    pub fn retention(&self, gateway: Retention) -> Retention {
        Retention {
            delivered_ms: self.retention_override.0.unwrap_or(gateway.delivered_ms),
            dead_ms: self.retention_override.1.unwrap_or(gateway.dead_ms),
        }
    }
}

impl std::fmt::Debug for Source {
    // The destination key is a secret: keep it out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Source")
            .field("name", &self.name)
            .field("scheme", &self.scheme)
            .field("forward_to", &crate::redact::url(&self.forward_to))
            .field("destination_keys", &"<redacted>")
            .finish_non_exhaustive()
    }
}

/// A source's setting that is wrong: the key under `sources.{name}` and why.
pub type SourceError = (&'static str, String);

impl Source {
    /// Builds a source from its settings, with secrets already read from
    /// files: `secrets` are those of [`SourceSettings::all_secrets`],
    /// `destination_secrets` those of
    /// [`SourceSettings::all_destination_secrets`]. Collects every error
    /// but those already reported of a secret file that could not be read:
    /// such a source is not built, with or without errors.
    pub fn build(
        name: &str,
        s: &SourceSettings,
        secrets: &[String],
        destination_secrets: &[String],
    ) -> Result<Self, Vec<SourceError>> {
        let mut errors: Vec<SourceError> = Vec::new();
        let verifier = if secrets.is_empty() {
            // An unreadable file was reported when the settings were
            // loaded; it is no second mistake that it held nothing.
            if !s.files.secrets_unreadable {
                errors.push((
                    "secrets",
                    "no signing secret: set secrets or secrets_file".into(),
                ));
            }
            None
        } else {
            Verifier::new(s.scheme, secrets, s.tolerance)
                .map(|v| v.with_notification_url(s.notification_url.as_deref().unwrap_or("")))
                .map_err(|e| errors.push(("secrets", e)))
                .ok()
        };
        match (s.scheme, s.notification_url.as_deref()) {
            (Scheme::Square, None) => errors.push((
                "notification_url",
                "missing: Square signs the URL it posts to; set the notification URL exactly \
                 as registered in Square's Developer Console (https://…/ingest/{name})"
                    .replace("{name}", name),
            )),
            (Scheme::Square, Some(url)) => match reqwest::Url::parse(url) {
                Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {}
                _ => errors.push((
                    "notification_url",
                    format!(
                        "{:?} is not an http:// or https:// URL",
                        crate::redact::url_str(url)
                    ),
                )),
            },
            (_, Some(_)) => errors.push((
                "notification_url",
                format!(
                    "only the square scheme signs a URL; the {} scheme has no use for it",
                    s.scheme.name()
                ),
            )),
            (_, None) => {}
        }
        let mut locate = |key: &'static str, raw: &str| {
            Locator::parse(raw).map_err(|e| errors.push((key, e))).ok()
        };
        let event_id = locate("event_id", &s.event_id);
        let created_at = s.created_at.as_deref().map(|r| locate("created_at", r));
        let stream = s.stream.as_deref().map(|r| locate("stream", r));
        // A field read from a header the signature does not cover can be
        // changed by anyone holding one captured request: fresh ids in the
        // replay window would each be delivered as a new event.
        for (key, l) in [
            ("created_at", created_at.as_ref().and_then(Option::as_ref)),
            ("stream", stream.as_ref().and_then(Option::as_ref)),
        ] {
            if l == Some(&Locator::BodySha256) {
                errors.push((
                    key,
                    "body-sha256 is only an event id (the hash of the body): point this at \
                     a field, as in body:/created_at"
                        .into(),
                ));
            }
            if key == "created_at" && matches!(l, Some(Locator::Join(_))) {
                errors.push((
                    key,
                    "created_at is one field: join fields (A + B) for event_id or stream only"
                        .into(),
                ));
            }
        }
        for (key, l) in [
            ("event_id", event_id.as_ref()),
            ("created_at", created_at.as_ref().and_then(Option::as_ref)),
            ("stream", stream.as_ref().and_then(Option::as_ref)),
        ] {
            for name in l.map(Locator::headers).unwrap_or_default() {
                if signed_header(s.scheme, name) {
                    continue;
                }
                errors.push((
                    key,
                    format!(
                        "header {name:?} is not covered by the {} signature, so anyone could \
                         change it in a captured request; read it from the body (body:/…){}",
                        s.scheme.name(),
                        match s.scheme {
                            Scheme::StandardWebhooks => " or use header:webhook-id",
                            Scheme::Svix => " or use header:svix-id",
                            _ if key == "event_id" => {
                                ", or dedupe on the body's hash: event_id = \"body-sha256\""
                            }
                            _ => "",
                        }
                    ),
                ));
            }
        }
        if !(MIN_TOLERANCE..=MAX_TOLERANCE).contains(&s.tolerance) {
            errors.push((
                "tolerance",
                format!(
                    "must be 1s to 1h (got {}): shorter rejects honest clock skew, longer \
                     weakens replay protection",
                    humantime::format_duration(s.tolerance)
                ),
            ));
        }
        let Some(raw_forward_to) = s.forward_to.as_deref() else {
            errors.push((
                "forward_to",
                "missing: set forward_to (the application's URL) or \
                 [[sources.NAME.destinations]]"
                    .into(),
            ));
            return Err(errors);
        };
        let forward_to = match reqwest::Url::parse(raw_forward_to) {
            Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => Some(u),
            Ok(u) => {
                errors.push((
                    "forward_to",
                    format!(
                        "{} must be an http:// or https:// URL with a host",
                        crate::redact::url(&u)
                    ),
                ));
                None
            }
            Err(e) => {
                errors.push((
                    "forward_to",
                    format!(
                        "{:?} is not a URL: {e}",
                        crate::redact::url_str(raw_forward_to)
                    ),
                ));
                None
            }
        };
        let destination_keys = match destination_keys(s, destination_secrets) {
            Ok(keys) => Some(keys),
            // Reported when the settings were loaded, as above.
            Err(_) if s.files.destination_unreadable && destination_secrets.is_empty() => None,
            Err(e) => {
                errors.push(e);
                None
            }
        };
        // A delivery's stream lease lasts this long plus a grace, as a
        // claim's TTL: past an hour no destination is still answering.
        if s.forward_timeout.is_zero() || s.forward_timeout > MAX_FORWARD_TIMEOUT {
            errors.push((
                "forward_timeout",
                "must be more than 0 and at most 1h".into(),
            ));
        }
        if s.max_attempts == 0 {
            errors.push(("max_attempts", "must be at least 1".into()));
        }
        if s.backoff_min.is_zero() {
            errors.push(("backoff_min", "must be more than 0".into()));
        }
        if s.backoff_max < s.backoff_min {
            errors.push(("backoff_max", "must not be less than backoff_min".into()));
        } else if s.backoff_max > MAX_BACKOFF {
            errors.push(("backoff_max", "must be at most 30d".into()));
        }
        if !(1..=MAX_BODY_LIMIT).contains(&s.max_body_bytes) {
            errors.push((
                "max_body_bytes",
                format!("must be 1 to {MAX_BODY_LIMIT} (16 MiB)"),
            ));
        }
        if !(1..=MAX_IN_FLIGHT).contains(&s.max_in_flight) {
            errors.push(("max_in_flight", format!("must be 1 to {MAX_IN_FLIGHT}")));
        }
        match (s.rate_limit, s.rate_burst) {
            (None, Some(_)) => errors.push(("rate_burst", "needs rate_limit".into())),
            (Some(_), Some(b)) if !(1..=crate::domain::rate::MAX_EVENTS).contains(&b) => {
                errors.push(("rate_burst", "must be 1 to 1000000".into()));
            }
            _ => {}
        }
        let mut forward_headers = Vec::new();
        for h in &s.forward_headers {
            match actix_web::http::header::HeaderName::from_bytes(h.as_bytes()) {
                Ok(_) if RESERVED_HEADERS.contains(&h.to_ascii_lowercase().as_str()) => errors.push((
                    "forward_headers",
                    format!("{h:?} is set by dedupd itself (or by the connection) and cannot be forwarded"),
                )),
                Ok(_) => forward_headers.push(h.to_ascii_lowercase()),
                Err(_) => errors.push(("forward_headers", format!("{h:?} is not a header name"))),
            }
        }
        match (
            verifier,
            event_id,
            created_at,
            stream,
            forward_to,
            destination_keys,
        ) {
            (
                Some(verifier),
                Some(event_id),
                created_at,
                stream,
                Some(forward_to),
                Some(destination_keys),
            ) if errors.is_empty() => Ok(Self {
                name: name.to_owned(),
                scheme: s.scheme,
                verifier,
                event_id,
                created_at: created_at.flatten(),
                created_at_format: s.created_at_format,
                notification_url: s.notification_url.clone(),
                stream: stream.flatten(),
                forward_to,
                forward_timeout: s.forward_timeout,
                max_attempts: s.max_attempts,
                backoff_min: s.backoff_min,
                backoff_max: s.backoff_max,
                destination_keys,
                forward_headers,
                max_body_bytes: s.max_body_bytes,
                max_in_flight: s.max_in_flight,
                pause_after: s.pause_after,
                rate: s
                    .rate_limit
                    .map(|r| (r, s.rate_burst.unwrap_or_else(|| r.default_burst()))),
                retention_override: (
                    s.delivered_retention
                        .map(crate::gateway::delivery::backoff::millis),
                    s.dead_retention
                        .map(crate::gateway::delivery::backoff::millis),
                ),
                destination: DEFAULT_DESTINATION.to_owned(),
                lane_of: None,
                delivers: true,
                routes: vec![Route {
                    destination: DEFAULT_DESTINATION.to_owned(),
                    lane: name.to_owned(),
                    filter: RouteFilter::default(),
                }],
            }),
            _ => Err(errors),
        }
    }
}

/// Settings a destination may set for itself: a lane's errors under
/// these keys are its own; the others are the source's (reported once).
const DESTINATION_KEYS: &[&str] = &[
    "forward_to",
    "forward_timeout",
    "max_attempts",
    "backoff_min",
    "backoff_max",
    "max_in_flight",
    "pause_after",
    "rate_limit",
    "rate_burst",
    "destination_secret",
    "destination_secrets",
];

/// Most destinations a source has.
pub const MAX_DESTINATIONS: usize = 32;

impl Source {
    /// Builds a source and the lanes of its destinations: with a lone
    /// `forward_to`, one [`Source`] (destination `default`); with
    /// `destinations`, the source posted to (carrying the routes; a lane
    /// itself if one destination is `default`) and a lane per other
    /// destination. `destination_secrets` are the source's; a destination
    /// with its own uses those. Errors are under keys relative to
    /// `sources.NAME` (`destinations.0.forward_to`).
    pub fn build_all(
        name: &str,
        s: &SourceSettings,
        secrets: &[String],
        destination_secrets: &[String],
    ) -> Result<Vec<Self>, Vec<(String, String)>> {
        let own = |e: Vec<SourceError>| -> Vec<(String, String)> {
            e.into_iter().map(|(k, m)| (k.to_owned(), m)).collect()
        };
        if s.destinations.is_empty() {
            return Self::build(name, s, secrets, destination_secrets)
                .map(|one| vec![one])
                .map_err(own);
        }
        let mut errors: Vec<(String, String)> = Vec::new();
        if s.forward_to.is_some() {
            errors.push((
                "forward_to".into(),
                "not with destinations: make it a destination (named \"default\" to keep \
                 its events' history)"
                    .into(),
            ));
        }
        if s.destinations.len() > MAX_DESTINATIONS {
            errors.push((
                "destinations".into(),
                format!("at most {MAX_DESTINATIONS} (got {})", s.destinations.len()),
            ));
        }
        let mut routes = Vec::new();
        let mut lanes = Vec::new();
        for (i, d) in s.destinations.iter().enumerate() {
            let at = |key: &str| format!("destinations.{i}.{key}");
            if !crate::domain::valid_source_name(&d.name) {
                errors.push((
                    at("name"),
                    format!("{:?}: 1 to 64 of A-Z a-z 0-9 _ -", d.name),
                ));
                continue;
            }
            if s.destinations[..i].iter().any(|o| o.name == d.name) {
                errors.push((at("name"), format!("{:?} is named twice", d.name)));
                continue;
            }
            let filter = match RouteFilter::parse(&d.filter) {
                Ok(f) => f,
                Err(e) => {
                    errors.push((at("filter"), e));
                    continue;
                }
            };
            for header in filter.headers() {
                if !signed_header(s.scheme, header) {
                    errors.push((
                        at("filter"),
                        format!(
                            "header {header:?} is not covered by the {} signature: anyone \
                             could change it in a captured request and route the event \
                             elsewhere; filter on the body (body:/…)",
                            s.scheme.name()
                        ),
                    ));
                }
            }
            let lane = lane_name(name, &d.name);
            let settings = d.over(s);
            let own_secrets: Vec<String>;
            let keys = if d.destination_secret.is_some() || !d.destination_secrets.is_empty() {
                own_secrets = d
                    .destination_secret
                    .iter()
                    .chain(&d.destination_secrets)
                    .map(|s| s.expose().to_owned())
                    .collect();
                &own_secrets[..]
            } else {
                destination_secrets
            };
            match Self::build(&lane, &settings, secrets, keys) {
                Ok(mut built) => {
                    built.destination.clone_from(&d.name);
                    built.lane_of = (lane != name).then(|| name.to_owned());
                    built.routes = Vec::new();
                    lanes.push(built);
                }
                Err(e) => errors.extend(
                    e.into_iter()
                        .filter(|(k, _)| DESTINATION_KEYS.contains(k))
                        .map(|(k, m)| (at(k), m)),
                ),
            }
            routes.push(Route {
                destination: d.name.clone(),
                lane,
                filter,
            });
        }
        // The source posted to: its verifier, locators and limits, with
        // the first destination's settings (and its own secrets, if it
        // has them: the source need not have any then).
        let first = s.destinations[0].over(s);
        let first_own: Vec<String> = s.destinations[0]
            .destination_secret
            .iter()
            .chain(&s.destinations[0].destination_secrets)
            .map(|s| s.expose().to_owned())
            .collect();
        let first_keys = if first_own.is_empty() {
            destination_secrets
        } else {
            &first_own[..]
        };
        let mut posted = match Self::build(name, &first, secrets, first_keys) {
            Ok(p) => p,
            Err(e) => {
                errors.extend(
                    e.into_iter()
                        .filter(|(k, _)| !DESTINATION_KEYS.contains(k))
                        .map(|(k, m)| (k.to_owned(), m)),
                );
                return Err(errors);
            }
        };
        if !errors.is_empty() {
            return Err(errors);
        }
        posted.routes = routes;
        match lanes.iter().position(|l| l.name == name) {
            // `default` is a lane of the source's own name: that source
            // is posted to and delivers.
            Some(i) => {
                let mut own = lanes.remove(i);
                own.routes = std::mem::take(&mut posted.routes);
                lanes.insert(0, own);
            }
            None => {
                posted.delivers = false;
                posted.destination = String::new();
                lanes.insert(0, posted);
            }
        }
        Ok(lanes)
    }

    /// The lane of destination `destination` of this source, if it has one.
    pub fn lane_of_destination(&self, destination: &str) -> Option<&str> {
        self.routes
            .iter()
            .find(|r| r.destination == destination)
            .map(|r| r.lane.as_str())
    }
}

/// The keys of a source's destination secrets, in order, or what is wrong
/// with them, under the key that holds them.
fn destination_keys(s: &SourceSettings, secrets: &[String]) -> Result<Vec<Vec<u8>>, SourceError> {
    let from_file = s.destination_secret_file.is_some();
    let key = if from_file {
        "destination_secret_file"
    } else if s.destination_secrets.is_empty() {
        "destination_secret"
    } else {
        "destination_secrets"
    };
    // Which entry of a list is wrong; a lone destination_secret needs no
    // such words.
    let entry = |i: usize| match key {
        "destination_secret_file" => format!("secret {} of the file", i + 1),
        _ => format!("entry {i}"),
    };
    let counted = if from_file {
        " (blank lines and # comments not counted)"
    } else {
        " (counting from 0)"
    };
    let at = |i: usize, e: String| match key {
        "destination_secret" => e,
        _ => format!("{}{counted}: {e}", entry(i)),
    };
    match secrets.len() {
        0 if from_file => {
            return Err((
                key,
                "holds no secret (only blank lines and # comments)".into(),
            ));
        }
        0 => {
            return Err((
                key,
                "missing: dedupd signs what it forwards; set destination_secret \
                 (whsec_<base64>), destination_secrets or destination_secret_file"
                    .into(),
            ));
        }
        n if n > MAX_DESTINATION_SECRETS => {
            return Err((
                key,
                format!(
                    "at most {MAX_DESTINATION_SECRETS} secrets (got {n}): a rotation needs two, \
                     and every forward carries one signature per secret"
                ),
            ));
        }
        _ => {}
    }
    let mut keys: Vec<Vec<u8>> = Vec::with_capacity(secrets.len());
    for (i, secret) in secrets.iter().enumerate() {
        let k = parse_whsec(secret).map_err(|e| (key, at(i, e)))?;
        // A secret listed twice is most likely the new one pasted where the
        // old one was meant (or the reverse): the application switching to
        // the one missing would reject every forward.
        if let Some(j) = keys.iter().position(|known| *known == k) {
            return Err((key, at(i, format!("the same key as {}", entry(j)))));
        }
        keys.push(k);
    }
    Ok(keys)
}
