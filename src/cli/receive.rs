//! `dedupd receive`: a stand-in for your application. It verifies each
//! delivery's Standard Webhooks signature with the destination secrets,
//! prints one line per delivery and answers 204 — or 503 to the first
//! `--fail N` attempts of each event (by the `dedupd-attempt` header), or
//! 401 to a bad signature.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use actix_web::dev::ServerHandle;
use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use anyhow::{Context, anyhow, bail};
use dedupd::config::CONFIG_ENV;
use dedupd::gateway::locate::{Found, Locator};
use dedupd::gateway::signature::{Scheme, Verifier};
use dedupd::redact::escape_control;

use super::out::{Printed, StdoutError, outln};

/// Largest body read; what a source may set at most.
const MAX_BODY: usize = dedupd::gateway::source::MAX_BODY_LIMIT;

/// Timestamps further than this from now are refused, as Standard Webhooks
/// libraries do by default.
const TOLERANCE: Duration = Duration::from_secs(300);

/// `dedupd receive` arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Address to listen on (any path is accepted).
    #[arg(long, default_value = "127.0.0.1:3000")]
    listen: SocketAddr,
    /// TOML settings file holding the sources' destination secrets
    /// [default: none, or $DEDUPD_CONFIG].
    #[arg(long, env = CONFIG_ENV)]
    config: Option<PathBuf>,
    /// Verify with this source's destination secrets (any one of them)
    /// [default: any source's in the configuration].
    #[arg(long, conflicts_with = "secret")]
    source: Option<String>,
    /// Verify with this whsec_… secret instead of the configuration's.
    #[arg(long)]
    secret: Option<String>,
    /// Answer 503 to the first N attempts of each event, to see retries.
    #[arg(long, value_name = "N", default_value_t = 0)]
    fail: u32,
}

/// What every request is checked against.
#[derive(Debug)]
struct Checks {
    /// The destination secrets.
    verifier: Verifier,
    /// Where each source's events carry their stream, by source name.
    streams: BTreeMap<String, Locator>,
    /// Attempts of each event answered 503.
    fail: u32,
    /// The running server, stopped when a line cannot be printed.
    server: OnceLock<ServerHandle>,
    /// The failed print that stopped it, for `run` to return.
    unprinted: Mutex<Option<StdoutError>>,
}

/// Listens until SIGINT or SIGTERM.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let (secrets, streams, whose) = match &args.secret {
        Some(secret) => (
            vec![secret.clone()],
            BTreeMap::new(),
            "the --secret".to_owned(),
        ),
        None => from_config(args)?,
    };
    let verifier = Verifier::new(Scheme::StandardWebhooks, &secrets, TOLERANCE)
        .map_err(|e| anyhow!("destination secret: {e}"))?;
    let checks = web::Data::new(Checks {
        verifier,
        streams,
        fail: args.fail,
        server: OnceLock::new(),
        unprinted: Mutex::new(None),
    });
    let stopped = checks.clone();
    super::runtime()?.block_on(async {
        let server = HttpServer::new(move || {
            App::new()
                .app_data(checks.clone())
                .app_data(web::PayloadConfig::new(MAX_BODY))
                .default_service(web::to(hook))
        })
        .workers(1)
        .shutdown_timeout(1)
        .bind(args.listen)
        .with_context(|| format!("cannot listen on {}", args.listen))?;
        let addr = server.addrs().first().copied().unwrap_or(args.listen);
        let answer = if args.fail > 0 {
            format!(
                "503 to the first {} attempt(s) of each event, then 204",
                args.fail
            )
        } else {
            "204".to_owned()
        };
        line(&format!(
            "listening on http://{addr}: verifying Standard Webhooks signatures with {whose}; \
             answering {answer}"
        ))?;
        let server = server.run();
        let _ = stopped.server.set(server.handle());
        server.await.context("serving")?;
        match stopped.unprinted.lock().map(|mut e| e.take()) {
            Ok(Some(e)) => Err(e.into()),
            _ => Ok(()),
        }
    })
}

/// The destination secrets and stream locations of the configured sources
/// (or of `--source`), and words for them.
fn from_config(args: &Args) -> anyhow::Result<(Vec<String>, BTreeMap<String, Locator>, String)> {
    let (loaded, sources) = super::load(args.config.as_deref())?;
    let chosen: Vec<_> = sources
        .iter()
        .filter(|s| args.source.as_ref().is_none_or(|n| *n == s.name))
        .collect();
    if chosen.is_empty() {
        match &args.source {
            Some(n) => bail!("no source named {n:?} in the configuration"),
            None => bail!(
                "no source in the configuration to take a destination secret from: pass \
                 --config FILE (or set DEDUPD_CONFIG), or --secret whsec_…"
            ),
        }
    }
    let mut secrets = Vec::new();
    let mut streams = BTreeMap::new();
    for s in &chosen {
        // During a rotation a source signs with each of several secrets:
        // any one of them verifies, as in an application holding only one.
        match (
            loaded.settings.sources.get(&s.name),
            &loaded.settings.alerts,
        ) {
            (Some(src), _) => {
                secrets.extend(src.all_destination_secrets().map(|d| d.expose().to_owned()))
            }
            // dedupd's own alerts source (`[alerts]`).
            (None, Some(alerts)) => secrets.extend(
                alerts
                    .destination_secret
                    .iter()
                    .chain(&alerts.destination_secrets)
                    .map(|d| d.expose().to_owned()),
            ),
            (None, None) => {}
        }
        if let Some(l) = &s.stream {
            streams.insert(s.name.clone(), l.clone());
        }
    }
    let names: Vec<&str> = chosen.iter().map(|s| s.name.as_str()).collect();
    let whose = format!(
        "{} of source{} {}",
        if secrets.len() == names.len() {
            "the destination_secret".to_owned()
        } else {
            format!("any of the {} destination secrets", secrets.len())
        },
        if names.len() == 1 { "" } else { "s" },
        names.join(", ")
    );
    Ok((secrets, streams, whose))
}

/// Prints `text` as one line and flushes it, so a reader sees each
/// delivery as it happens.
fn line(text: &str) -> Printed {
    outln!("{text}")?;
    std::io::stdout().flush().map_err(StdoutError)
}

async fn hook(req: HttpRequest, body: web::Bytes, checks: web::Data<Checks>) -> HttpResponse {
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
    let id = header("webhook-id").unwrap_or("-");
    let attempt = header("dedupd-attempt").and_then(|a| a.parse::<u32>().ok());
    let verdict = checks.verifier.verify(&header, &body, super::now_unix_s());
    let stream = header("dedupd-source")
        .and_then(|s| checks.streams.get(s))
        .and_then(|l| {
            let json = l
                .needs_body()
                .then(|| serde_json::from_slice(&body).ok())
                .flatten();
            match l.find(&header, json.as_ref()) {
                Found::Text(s) => Some(s.to_owned()),
                Found::Joined(s) => Some(s),
                Found::Other(v) => Some(v.to_string()),
                Found::Missing => None,
            }
        })
        .unwrap_or_else(|| "-".to_owned());
    let (status, verified) = match &verdict {
        Err(e) => (401, format!("NOT VERIFIED ({e})")),
        Ok(()) if attempt.unwrap_or(1) <= checks.fail => (503, "verified".to_owned()),
        Ok(()) => (204, "verified".to_owned()),
    };
    let attempt = attempt.map_or_else(|| "?".to_owned(), |a| a.to_string());
    let note = if status == 503 {
        format!(" (--fail {})", checks.fail)
    } else {
        String::new()
    };
    // The id and the stream come from the request, verified or not: a
    // body may carry terminal escapes, so the line is printed escaped.
    let printed = line(&escape_control(&format!(
        "{id}  attempt {attempt}  stream {stream}  {verified}  -> {status}{note}"
    )));
    // Printing the deliveries is what `receive` is for: once it cannot
    // (its reader went away, `dedupd receive | head -3`), it stops, after
    // answering this one.
    if let Err(e) = printed {
        if let Ok(mut first) = checks.unprinted.lock() {
            first.get_or_insert(e);
        }
        if let Some(server) = checks.server.get() {
            actix_web::rt::spawn(server.stop(true));
        }
    }
    match status {
        401 => HttpResponse::Unauthorized().body("bad signature\n"),
        503 => HttpResponse::ServiceUnavailable().body("failing on purpose (--fail)\n"),
        _ => HttpResponse::NoContent().finish(),
    }
}
