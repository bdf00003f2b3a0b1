//! `dedupd init`: writes a commented `dedupd.toml` with one source, fresh
//! random secrets and an API token, checked before it is written and never
//! written over an existing file.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use anyhow::{Context, anyhow, bail};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use dedupd::config::{CONFIG_ENV, Settings};
use dedupd::domain::{ALL_SCHEMES, Scheme, valid_source_name};
use dedupd::gateway::sources::build_sources;
use figment::providers::{Format, Toml};

use super::out::outln;

/// `dedupd init` arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// File to write; an existing file is never overwritten.
    #[arg(long, env = CONFIG_ENV, default_value = "dedupd.toml")]
    config: PathBuf,
    /// Name of the source, served at /ingest/NAME.
    #[arg(long, default_value = "sume")]
    source: String,
    /// Signature scheme: sume, standard-webhooks, stripe, github, slack,
    /// shopify, paddle, svix, square, zoom or linear [default: the
    /// source's own when its name is one, otherwise standard-webhooks].
    #[arg(long, value_parser = parse_scheme)]
    scheme: Option<Scheme>,
    /// Where dedupd delivers the source's events (your application).
    #[arg(long, default_value = "http://127.0.0.1:3000/hooks")]
    forward_to: String,
}

/// Parses a scheme as the `scheme` setting names it.
pub fn parse_scheme(raw: &str) -> Result<Scheme, String> {
    ALL_SCHEMES
        .into_iter()
        .find(|s| s.name() == raw)
        .ok_or_else(|| {
            let names: Vec<&str> = ALL_SCHEMES.iter().map(|s| s.name()).collect();
            format!("expected one of {}", names.join(", "))
        })
}

/// Writes the file and says what to run next.
pub fn run(args: &Args) -> anyhow::Result<()> {
    if !valid_source_name(&args.source) {
        bail!(
            "--source {:?}: a source name is 1 to 64 of A-Z a-z 0-9 _ -",
            args.source
        );
    }
    let scheme = args
        .scheme
        .or_else(|| parse_scheme(&args.source).ok())
        .unwrap_or(Scheme::StandardWebhooks);
    let text = render(&args.source, scheme, &args.forward_to);
    check(&text).context("nothing was written")?;
    let path = &args.config;
    let mut file = match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        // It holds secrets.
        .mode(0o600)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => bail!(
            "{} already exists: not overwriting it. Remove it first, or write \
             another file with --config PATH",
            path.display()
        ),
        Err(e) => return Err(anyhow!(e).context(format!("cannot create {}", path.display()))),
    };
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing {}", path.display()))?;
    let shown = path.display();
    outln!(
        "wrote {shown}: source {name} ({scheme} signatures) at /ingest/{name}, \
         delivering to {to}\n\
         \n\
         Next, each in its own terminal:\n\
         \x20 dedupd serve --config {shown}\n\
         \x20 dedupd receive --config {shown}\n\
         \x20 dedupd trigger {name} --config {shown} --duplicate",
        name = args.source,
        scheme = scheme.name(),
        to = dedupd::redact::url_str(&args.forward_to),
    )?;
    Ok(())
}

/// Loads `text` as `check-config` would (defaults under it, no
/// environment) and builds its sources.
fn check(text: &str) -> anyhow::Result<()> {
    let fig = Settings::defaults_figment().merge(Toml::string(text));
    let loaded = Settings::load_from(&fig)?;
    build_sources(&loaded)?;
    Ok(())
}

/// `n` random bytes.
fn random(n: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; n];
    rand::fill(bytes.as_mut_slice());
    bytes
}

/// A TOML string literal.
fn quoted(s: &str) -> String {
    toml::Value::String(s.to_owned()).to_string()
}

/// `line` with `comment` after it, comments lined up.
fn commented(line: &str, comment: &str) -> String {
    if comment.is_empty() {
        format!("{line}\n")
    } else {
        format!("{line:<38} # {comment}\n")
    }
}

/// What keeps a captured request from being posted again: for a scheme
/// that signs a timestamp, `tolerance`; for the others (whose `tolerance`
/// would bound nothing), what does instead.
fn replay(scheme: Scheme) -> String {
    if scheme.signs_timestamp() {
        // Linear's own SDK allows a minute.
        let tolerance = if scheme == Scheme::Linear { "1m" } else { "5m" };
        return commented(
            &format!("tolerance = {}", quoted(tolerance)),
            "replay window on the signed timestamp",
        );
    }
    format!(
        "# {} signs no timestamp, so a captured request verifies forever and\n\
         # there is no `tolerance` to set. A replay is answered as a duplicate\n\
         # while dedupd knows its event_id: the event's retention, and after it\n\
         # gateway.dedupe_window (30 days) from its receipt; then it is delivered\n\
         # again (docs/gateway.md, \"How long replay protection lasts\").\n",
        provider(scheme)
    )
}

/// The provider's name, for a comment.
fn provider(scheme: Scheme) -> &'static str {
    match scheme {
        Scheme::Github => "GitHub",
        Scheme::Shopify => "Shopify",
        Scheme::Square => "Square",
        other => other.name(),
    }
}

/// The file's text.
fn render(name: &str, scheme: Scheme, forward_to: &str) -> String {
    // Standard Webhooks secrets are keys in base64; the others are used as
    // text.
    let provider_secret = if scheme.base64_secrets() {
        format!("whsec_{}", STANDARD.encode(random(24)))
    } else {
        hex::encode(random(24))
    };
    let destination_secret = format!("whsec_{}", STANDARD.encode(random(32)));
    let api_token = hex::encode(random(32));
    let square_url = format!("notification_url = \"https://hooks.example.com/ingest/{name}\"");
    let fields: &[(&str, &str)] = match scheme {
        Scheme::Sume => &[
            (
                "event_id = \"body:/request_id\"",
                "dedupe on the envelope's request_id",
            ),
            (
                "created_at = \"body:/created_at\"",
                "order by created_at ...",
            ),
            ("stream = \"body:/run_id\"", "... within a run"),
        ],
        Scheme::StandardWebhooks => &[
            (
                "event_id = \"header:webhook-id\"",
                "covered by the signature: dedupe on it",
            ),
            (
                "created_at = \"body:/timestamp\"",
                "order by the payload's timestamp ...",
            ),
            (
                "# stream = \"body:/data/id\"",
                "... within a stream, if events have one",
            ),
        ],
        Scheme::Stripe => &[
            ("event_id = \"body:/id\"", "the event's evt_... id"),
            (
                "created_at = \"body:/created\"",
                "order by `created` (Unix seconds) ...",
            ),
            ("created_at_format = \"unix-seconds\"", ""),
            (
                "stream = \"body:/data/object/id\"",
                "... per object (an invoice, a customer)",
            ),
        ],
        Scheme::Github => &[
            (
                "# GitHub signs only the body: its X-GitHub-Delivery id is in an",
                "",
            ),
            (
                "# unsigned header. Dedupe on the hash of the signed body instead: a",
                "",
            ),
            (
                "# redelivery of the same event is the same bytes (docs/gateway.md).",
                "",
            ),
            ("event_id = \"body-sha256\"", ""),
        ],
        Scheme::Slack => &[
            (
                "event_id = \"body:/event_id\"",
                "the Events API's Ev... id, the same on retries",
            ),
            (
                "created_at = \"body:/event_time\"",
                "order by event_time (Unix seconds) ...",
            ),
            ("created_at_format = \"unix-seconds\"", ""),
            ("stream = \"body:/event/channel\"", "... per channel"),
        ],
        Scheme::Shopify => &[
            (
                "# Shopify signs only the body; X-Shopify-Event-Id is unsigned.",
                "",
            ),
            ("event_id = \"body-sha256\"", "a retry is the same bytes"),
            (
                "created_at = \"body:/updated_at\"",
                "order by the resource's updated_at ...",
            ),
            ("stream = \"body:/id\"", "... per resource (an order)"),
        ],
        Scheme::Paddle => &[
            ("event_id = \"body:/event_id\"", "the evt_... id"),
            (
                "created_at = \"body:/occurred_at\"",
                "order by occurred_at ...",
            ),
            (
                "stream = \"body:/data/id\"",
                "... per entity (a subscription)",
            ),
        ],
        Scheme::Svix => &[
            (
                "event_id = \"header:svix-id\"",
                "covered by the signature: dedupe on it",
            ),
            (
                "created_at = \"body:/timestamp\"",
                "Clerk: Unix ms; Resend: body:/created_at",
            ),
            ("stream = \"body:/data/id\"", "per object (a user)"),
        ],
        Scheme::Square => &[
            (
                square_url.as_str(),
                "exactly as registered at Square: it is signed",
            ),
            ("event_id = \"body:/event_id\"", "the event's id"),
            (
                "created_at = \"body:/created_at\"",
                "order by created_at ...",
            ),
            ("stream = \"body:/data/id\"", "... per object (a payment)"),
        ],
        Scheme::Zoom => &[
            (
                "# Zoom's body has no event id: dedupe on its hash (a retry is",
                "",
            ),
            ("# the same bytes).", ""),
            ("event_id = \"body-sha256\"", ""),
            (
                "created_at = \"body:/event_ts\"",
                "order by event_ts (Unix ms) ...",
            ),
            ("created_at_format = \"unix-millis\"", ""),
            (
                "stream = \"body:/payload/object/id\"",
                "... per object (a meeting)",
            ),
        ],
        Scheme::Linear => &[
            (
                "# Linear signs the body, and its webhookTimestamp (checked against",
                "",
            ),
            (
                "# tolerance) changes on every retry, as does the unsigned",
                "",
            ),
            (
                "# Linear-Delivery: dedupe on what the event is, the action on an",
                "",
            ),
            ("# entity at a time.", ""),
            (
                "event_id = \"body:/action + body:/data/id + body:/createdAt\"",
                "",
            ),
            (
                "created_at = \"body:/createdAt\"",
                "order by when it happened ...",
            ),
            ("stream = \"body:/data/id\"", "... per entity (an issue)"),
        ],
    };
    let fields: String = fields.iter().map(|(l, c)| commented(l, c)).collect();
    format!(
        r#"# dedupd settings, written by `dedupd init`. Check them with
#   dedupd check-config --config <this file>
# Any key may be overridden by a DEDUPD_* environment variable, nested keys
# joined with "__" (DEDUPD_LISTEN=127.0.0.1:9000). "Settings" in
# docs/operations.md lists every key. This file holds secrets: keep it out
# of version control.

# Where `dedupd serve` listens; `dedupd trigger` and the operator commands
# (`dedupd events`, `claims`, `streams`) find the server here too.
listen = "127.0.0.1:8080"
# The embedded store, relative to the directory dedupd runs in.
data_path = "dedupd.redb"

[api]
# Bearer token for /v1; the operator commands send it from here.
tokens = [{api_token}]

# The provider posts to /ingest/{name}.
[sources.{name}]
scheme = {scheme}
# The provider's signing secret. This fresh one lets `dedupd trigger` sign
# test events; put the provider's own secret first when you connect it
# (several may be listed during a rotation).
secrets = [{provider_secret}]
{replay}{fields}# Your application. `dedupd receive` listens on 127.0.0.1:3000.
forward_to = {forward_to}
# dedupd signs what it forwards (Standard Webhooks) with this secret; give
# it to your application (`dedupd receive` reads it from here). To rotate
# it, list the new and this one in destination_secrets (docs/gateway.md).
destination_secret = {destination_secret}
max_attempts = 12                      # then the event is dead
backoff_min = "1s"                     # the first retry's delay, doubled per failure ...
backoff_max = "1h"                     # ... up to this
"#,
        api_token = quoted(&api_token),
        replay = replay(scheme),
        scheme = quoted(scheme.name()),
        provider_secret = quoted(&provider_secret),
        forward_to = quoted(forward_to),
        destination_secret = quoted(&destination_secret),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scheme_renders_a_file_that_passes_the_checks() {
        for scheme in ALL_SCHEMES {
            let text = render("src", scheme, "http://127.0.0.1:3000/hooks");
            assert!(
                check(&text).is_ok(),
                "{scheme:?}: {:?}\n{text}",
                check(&text)
            );
        }
    }

    #[test]
    fn secrets_are_fresh_each_time() {
        let a = render("sume", Scheme::Sume, "http://127.0.0.1:3000/hooks");
        let b = render("sume", Scheme::Sume, "http://127.0.0.1:3000/hooks");
        assert_ne!(a, b);
    }

    #[test]
    fn a_bad_forward_to_is_named() {
        let text = render("sume", Scheme::Sume, "not a url");
        let err = format!("{:#}", check(&text).expect_err("bad url"));
        assert!(err.contains("sources.sume.forward_to"), "{err}");
    }
}
