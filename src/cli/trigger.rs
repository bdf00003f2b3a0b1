//! `dedupd trigger SOURCE`: builds a sample event for a configured source
//! (or takes a file), signs it as the provider would — the source's scheme,
//! its first secret — and posts it to the running server's
//! `/ingest/SOURCE`, printing each answer.
//!
//! `--duplicate` posts the same event twice. `--out-of-order` posts two
//! events of one stream, the newer first; it waits (through the operator
//! API at the config's `listen`, never at `--url`) until the newer one is
//! delivered, then posts the older, which the gateway settles as stale
//! instead of delivering it.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use dedupd::domain::CreatedAtFormat;
use dedupd::gateway::Source;
use dedupd::gateway::locate::{Found, Locator, body_sha256};
use dedupd::gateway::signature::{Scheme, sign_at};
use serde_json::{Value, json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::client::{Client, ServerArgs};
use super::out::outln;

/// How often `--out-of-order` looks at an event's status.
const POLL: Duration = Duration::from_millis(50);

/// `dedupd trigger` arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The source to post to: a `[sources.NAME]` of the configuration.
    source: String,
    /// Post this file's bytes instead of a sample event.
    #[arg(long, value_name = "FILE", conflicts_with = "out_of_order")]
    body: Option<PathBuf>,
    /// Post the same event twice: the second is answered as a duplicate.
    #[arg(long)]
    duplicate: bool,
    /// Post two events of one stream, the newer first; once the newer is
    /// delivered, the older is posted and settled as stale.
    #[arg(long, conflicts_with = "duplicate")]
    out_of_order: bool,
    /// How long --out-of-order waits for each event to settle.
    #[arg(long, default_value = "30s", value_parser = super::parse_wait)]
    wait: Duration,
    #[command(flatten)]
    server: ServerArgs,
}

/// One event to post.
#[derive(Debug, Clone)]
struct Sample {
    /// Its event id, as the source reads it.
    id: String,
    /// Its stream, if the source has streams.
    stream: Option<String>,
    /// Its `created_at`, if the source reads one.
    created_at: Option<String>,
    /// The body, byte for byte.
    body: Vec<u8>,
}

impl Sample {
    fn describe(&self) -> String {
        let mut s = self.id.clone();
        match (&self.stream, &self.created_at) {
            (Some(st), Some(c)) => s.push_str(&format!(" (stream {st}, created_at {c})")),
            (Some(st), None) => s.push_str(&format!(" (stream {st})")),
            (None, Some(c)) => s.push_str(&format!(" (created_at {c})")),
            (None, None) => {}
        }
        s
    }
}

/// Posts, prints, and fails if any post was refused.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let (loaded, mut sources) = super::load(args.server.config.as_deref())?;
    // dedupd's own alerts source takes no posts.
    sources.retain(|s| s.name != dedupd::config::alerts::ALERT_SOURCE);
    let Some(source) = sources.iter().find(|s| s.name == args.source) else {
        let names: Vec<&str> = sources.iter().map(|s| s.name.as_str()).collect();
        bail!(
            "no source named {:?} in the configuration ({}); `dedupd init` writes one",
            args.source,
            if names.is_empty() {
                "it has none: pass --config FILE or set DEDUPD_CONFIG".to_owned()
            } else {
                format!("it has: {}", names.join(", "))
            }
        );
    };
    let secret = loaded.settings.sources[&args.source]
        .all_secrets()
        .next()
        .map(|s| s.expose().to_owned())
        .ok_or_else(|| anyhow!("source {} has no secret", args.source))?;
    let client = args.server.client(Some(&loaded))?;
    // The operator API (for --out-of-order) is the configured server's:
    // `--url` may name any server, and the API token goes nowhere else.
    let api = ServerArgs {
        url: None,
        ..args.server.clone()
    }
    .client(Some(&loaded))?;
    let poster = Poster {
        client,
        api,
        source,
        secret,
        notification_url: source.notification_url.clone().unwrap_or_default(),
    };
    super::runtime()?.block_on(async {
        if args.out_of_order {
            return poster.out_of_order(args.wait).await;
        }
        let sample = match &args.body {
            Some(path) => from_file(source, path)?,
            None => sample(
                source,
                &new_stream(source.scheme),
                OffsetDateTime::now_utc(),
            ),
        };
        outln!("{} event {}", source.name, sample.describe())?;
        let mut ok = poster.post(&sample).await?;
        if args.duplicate {
            outln!("the same event again")?;
            ok &= poster.post(&sample).await?;
        }
        Ok(if ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        })
    })
}

/// Signs and posts for one source.
struct Poster<'a> {
    /// Posts to `/ingest/SOURCE` at `--url` (or the config's `listen`),
    /// without the API token.
    client: Client,
    /// The operator API at the config's `listen`, with its token.
    api: Client,
    source: &'a Source,
    /// The source's first signing secret.
    secret: String,
    /// The URL Square signs, as configured.
    notification_url: String,
}

impl Poster<'_> {
    /// Posts `sample` signed now and prints the answer; true for a 2xx.
    async fn post(&self, sample: &Sample) -> anyhow::Result<bool> {
        let url = self.client.url(&["ingest", &self.source.name]);
        // Ingest authenticates by the provider's signature: no API token.
        let mut req = self
            .client
            .anonymous(reqwest::Method::POST, url)
            .header("content-type", "application/json")
            .body(sample.body.clone());
        for (name, value) in sign_at(
            self.source.scheme,
            &self.secret,
            super::now_unix_s(),
            &sample.id,
            &self.notification_url,
            &sample.body,
        ) {
            req = req.header(name, value);
        }
        let res = self.client.send(req).await?;
        let status = res.status();
        // An answer cut short still shows its status; one without end is
        // an error.
        let body = match self.client.body(res).await {
            Ok(body) => body,
            Err(e) if e.is::<super::client::TooLarge>() => return Err(e),
            Err(_) => String::new(),
        };
        // `--url` may name any server: its answer is printed escaped.
        outln!(
            "  -> {status} {}",
            dedupd::redact::escape_control(body.trim())
        )?;
        Ok(status.is_success())
    }

    /// The newer event, its delivery, then the older one and its fate.
    async fn out_of_order(&self, wait: Duration) -> anyhow::Result<ExitCode> {
        let (Some(_), Some(_)) = (&self.source.stream, &self.source.created_at) else {
            bail!(
                "--out-of-order needs a source whose events have a stream and a \
                 created_at (the `stream` and `created_at` settings of \
                 sources.{}): without them events are not ordered",
                self.source.name
            );
        };
        let stream = new_stream(self.source.scheme);
        let now = OffsetDateTime::now_utc();
        let newer = sample(self.source, &stream, now);
        let older = sample(self.source, &stream, now - time::Duration::minutes(1));
        outln!("newer event {}", newer.describe())?;
        if !self.post(&newer).await? {
            return Ok(ExitCode::FAILURE);
        }
        outln!("waiting for {} to be delivered", newer.id)?;
        match self.settled(&newer.id, wait).await? {
            "delivered" => outln!("  -> delivered")?,
            other => bail!(
                "{} was not delivered (it is {other}); the older event was not sent",
                newer.id
            ),
        }
        outln!("older event {}", older.describe())?;
        if !self.post(&older).await? {
            return Ok(ExitCode::FAILURE);
        }
        match self.settled(&older.id, wait).await? {
            "stale" => outln!(
                "  -> stale: not delivered, an event of its stream created later was \
                 delivered first"
            )?,
            other => outln!("  -> {other}")?,
        }
        Ok(ExitCode::SUCCESS)
    }

    /// Waits until event `id` is no longer pending and returns its status.
    async fn settled(&self, id: &str, wait: Duration) -> anyhow::Result<&'static str> {
        // At most a year (`parse_wait`): an Instant holds it.
        let deadline = Instant::now() + wait;
        loop {
            if !self.listed(id, "pending").await? {
                for status in ["stale", "dead", "delivered", "filtered"] {
                    if self.listed(id, status).await? {
                        return Ok(status);
                    }
                }
            }
            if Instant::now() >= deadline {
                bail!(
                    "{id} is still pending after {}: is the application at {} answering? \
                     (`dedupd receive` is one)",
                    humantime::format_duration(wait),
                    dedupd::redact::url(&self.source.forward_to)
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Whether the source's events with `status` include `id`, in any
    /// of its lanes (a destination's deliveries are listed under
    /// `SOURCE.DESTINATION`), page by page.
    async fn listed(&self, id: &str, status: &str) -> anyhow::Result<bool> {
        let mut lanes: Vec<&str> = vec![&self.source.name];
        for r in &self.source.routes {
            if !lanes.contains(&r.lane.as_str()) {
                lanes.push(&r.lane);
            }
        }
        for lane in lanes {
            if self.listed_in(lane, id, status).await? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Whether `lane`'s events with `status` include `id`, page by page.
    async fn listed_in(&self, lane: &str, id: &str, status: &str) -> anyhow::Result<bool> {
        let mut after: Option<String> = None;
        loop {
            let mut query = vec![("status", status.to_owned()), ("limit", "500".into())];
            if let Some(a) = after.take() {
                query.push(("after", a));
            }
            let url = self
                .api
                .url_with(&["v1", "sources", lane, "events"], &query);
            let page = self
                .api
                .json(self.api.request(reqwest::Method::GET, url))
                .await
                .context(
                    "following the events through the operator API at the config's `listen` \
                     (--url only receives the posts)",
                )?;
            let events = page["events"].as_array().map_or(&[][..], Vec::as_slice);
            if events.iter().any(|e| e["event_id"] == id) {
                return Ok(true);
            }
            match page["next"].as_str() {
                Some(next) => after = Some(next.to_owned()),
                None => return Ok(false),
            }
        }
    }
}

/// `n` random bytes as hex.
fn random_hex(n: usize) -> String {
    let mut bytes = vec![0u8; n];
    rand::fill(bytes.as_mut_slice());
    hex::encode(bytes)
}

/// A fresh stream name in the provider's style.
fn new_stream(scheme: Scheme) -> String {
    match scheme {
        Scheme::Sume => format!("run_{}", random_hex(6)),
        _ => format!("stream_{}", random_hex(6)),
    }
}

/// A fresh event id in the provider's style.
fn new_id(scheme: Scheme) -> String {
    match scheme {
        Scheme::Sume => format!("req_{}", random_hex(8)),
        Scheme::StandardWebhooks | Scheme::Svix => format!("msg_{}", random_hex(8)),
        Scheme::Slack => format!("Ev{}", random_hex(5).to_uppercase()),
        Scheme::Square => uuid_like(),
        Scheme::Stripe
        | Scheme::Github
        | Scheme::Shopify
        | Scheme::Paddle
        | Scheme::Zoom
        | Scheme::Linear => format!("evt_{}", random_hex(8)),
    }
}

/// A random id in the 8-4-4-4-12 hex form (Square's event ids).
fn uuid_like() -> String {
    let h = random_hex(16);
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// A sample event of `source`: its provider's envelope, with a fresh id
/// and the given stream and `created_at` wherever the source reads them
/// (as a number where its `created_at_format` says Unix time). With
/// `event_id = "body-sha256"` the id is the hash of the body, made unique
/// by a random `nonce`.
fn sample(source: &Source, stream: &str, created_at: OffsetDateTime) -> Sample {
    let id = new_id(source.scheme);
    let created_at = created_at
        .replace_nanosecond(u32::from(created_at.millisecond()) * 1_000_000)
        .unwrap_or(created_at);
    let created = created_at.format(&Rfc3339).unwrap_or_default();
    let unix_ms = i64::try_from(created_at.unix_timestamp_nanos() / 1_000_000).unwrap_or(0);
    let note = "sent by dedupd trigger";
    let mut body = match source.scheme {
        Scheme::Sume => json!({
            "type": "run.completed",
            "data": {"status": "succeeded", "message": note},
        }),
        Scheme::StandardWebhooks => json!({
            "type": "test.event",
            "data": {"message": note},
        }),
        Scheme::Stripe => json!({
            "object": "event",
            "type": "invoice.paid",
            "data": {"object": {"object": "invoice", "status": "paid"}},
        }),
        Scheme::Github => json!({
            "action": "opened",
            "zen": note,
        }),
        Scheme::Slack => json!({
            "type": "event_callback",
            "event": {"type": "message", "text": note},
        }),
        Scheme::Shopify => json!({
            "note": note,
            "financial_status": "paid",
        }),
        Scheme::Paddle => json!({
            "event_type": "transaction.completed",
            "notification_id": format!("ntf_{}", random_hex(8)),
            "data": {"status": "completed", "origin": note},
        }),
        Scheme::Svix => json!({
            "object": "event",
            "type": "user.updated",
            "data": {"object": "user", "first_name": note},
        }),
        Scheme::Square => json!({
            "merchant_id": "MLTEST",
            "type": "payment.updated",
            "data": {"type": "payment", "object": {"payment": {"note": note}}},
        }),
        Scheme::Zoom => json!({
            "event": "meeting.started",
            "payload": {"account_id": "test", "object": {"topic": note}},
        }),
        Scheme::Linear => json!({
            "action": "update",
            "type": "Issue",
            "data": {"title": note},
            // Linear's signed timestamp: when it sent the webhook.
            "webhookTimestamp": super::now_unix_s() * 1000,
        }),
    };
    if source.event_id == Locator::BodySha256 {
        put(
            &mut body,
            &Locator::Body("/nonce".into()),
            json!(random_hex(8)),
        );
    }
    put(&mut body, &source.event_id, json!(id));
    if let Locator::Join(parts) = &source.event_id {
        // Each field the id joins that the envelope lacks gets the fresh
        // id (the created_at and stream fields are set below).
        for part in parts {
            if let Locator::Body(pointer) = part
                && body.pointer(pointer).is_none()
            {
                put(&mut body, part, json!(id));
            }
        }
    }
    let created_at = source.created_at.as_ref().map(|l| {
        let value = match source.created_at_format {
            CreatedAtFormat::UnixSeconds => json!(unix_ms / 1000),
            CreatedAtFormat::UnixMillis => json!(unix_ms),
            CreatedAtFormat::Auto | CreatedAtFormat::Rfc3339 => json!(created),
        };
        put(&mut body, l, value);
        created.clone()
    });
    let stream = source.stream.as_ref().map(|l| {
        put(&mut body, l, json!(stream));
        stream.to_owned()
    });
    let id = joined_id(source, Some(&body)).unwrap_or(id);
    let body = serde_json::to_vec(&body).unwrap_or_default();
    let id = if source.event_id == Locator::BodySha256 {
        body_sha256(&body)
    } else {
        id
    };
    Sample {
        id,
        stream,
        created_at,
        body,
    }
}

/// The id a joined `event_id` reads from `body`, as the server will.
fn joined_id(source: &Source, body: Option<&Value>) -> Option<String> {
    let no_headers = |_: &str| None;
    match source.event_id.find(&no_headers, body) {
        Found::Joined(id) => Some(id),
        _ => None,
    }
}

/// A body from a file; its id is read where the source reads it (a header
/// such as `webhook-id` is given a fresh one).
fn from_file(source: &Source, path: &std::path::Path) -> anyhow::Result<Sample> {
    let body = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let json: Option<Value> = serde_json::from_slice(&body).ok();
    let text = |l: &Option<Locator>| match (l, &json) {
        (Some(Locator::Body(p)), Some(v)) => {
            v.pointer(p).and_then(Value::as_str).map(str::to_owned)
        }
        _ => None,
    };
    let id = match &source.event_id {
        Locator::Body(_) => text(&Some(source.event_id.clone())).ok_or_else(|| {
            anyhow!(
                "{} has no string at {} (the source's event_id): the server would refuse it",
                path.display(),
                source.event_id
            )
        })?,
        Locator::Header(_) => new_id(source.scheme),
        Locator::BodySha256 => body_sha256(&body),
        Locator::Join(_) => joined_id(source, json.as_ref()).ok_or_else(|| {
            anyhow!(
                "{} lacks a field of {} (the source's event_id): the server would refuse it",
                path.display(),
                source.event_id
            )
        })?,
    };
    Ok(Sample {
        id,
        stream: text(&source.stream),
        created_at: text(&source.created_at),
        body,
    })
}

/// Sets `value` at `locator` in `body`, making the objects on the way; a
/// header locator is carried by the signature (`webhook-id`) instead.
fn put(body: &mut Value, locator: &Locator, value: Value) {
    let Locator::Body(pointer) = locator else {
        return;
    };
    let mut at = body;
    for token in pointer.split('/').skip(1) {
        let token = token.replace("~1", "/").replace("~0", "~");
        if !at.is_object() {
            *at = json!({});
        }
        let Value::Object(map) = at else { return };
        at = map.entry(token).or_insert(Value::Null);
    }
    *at = value;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_makes_the_objects_on_the_way() {
        let mut v = json!({"type": "x"});
        put(&mut v, &Locator::Body("/data/a~1b".into()), json!("1"));
        put(&mut v, &Locator::Body("/request_id".into()), json!("req"));
        assert_eq!(
            v,
            json!({"type": "x", "request_id": "req", "data": {"a/b": "1"}})
        );
    }
}
