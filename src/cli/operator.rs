//! The operator API from the terminal: `dedupd events
//! list|show|count|redeliver|erase` (their bulk form is in `jobs`),
//! `dedupd claims get`, `dedupd streams get`. Tables for people by
//! default; `--json` prints the server's answer as it is, for scripts.

use std::process::ExitCode;

use reqwest::Method;
use serde_json::Value;

use dedupd::redact::{escape_control, shell_word};

use super::call::Common;
use super::filter::{BulkArgs, FilterArgs, print_count};
use super::out::{Printed, out, outln};
use super::table::{self, text};

/// `dedupd events …`
#[derive(Debug, clap::Subcommand)]
pub enum EventsCommand {
    /// A source's gateway events with one status, oldest received first.
    List {
        #[command(flatten)]
        at: Lane,
        /// pending, delivered, stale, dead, erased or filtered.
        #[arg(long, default_value = "dead",
              value_parser = ["pending", "delivered", "stale", "dead", "erased", "filtered"])]
        status: String,
        /// Events per page, 1 to 500.
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// Continue after this cursor (the `next` of the previous page).
        #[arg(long)]
        after: Option<String>,
        #[command(flatten)]
        common: Common,
    },
    /// One event: its state, and its last attempts (when each was sent,
    /// the status, the latency and the error).
    Show {
        #[command(flatten)]
        at: Lane,
        id: String,
        #[command(flatten)]
        common: Common,
    },
    /// How many of a source's events match a filter, and the first ten:
    /// what a bulk operation over the same filter would touch.
    Count {
        #[command(flatten)]
        at: Lane,
        #[command(flatten)]
        filter: FilterArgs,
        /// Go on from where a count of the same filter stopped at the
        /// server's scan budget (the cursor it printed).
        #[arg(long)]
        after: Option<String>,
        #[command(flatten)]
        common: Common,
    },
    /// Sends events again: one dead or stale event by its id, or every
    /// event a filter matches, as a job (`--dry-run` counts them first).
    /// A job replays delivered events too, with a `dedupd-replay` header.
    Redeliver {
        #[command(flatten)]
        at: Lane,
        /// One event (without a filter).
        id: Option<String>,
        #[command(flatten)]
        bulk: BulkArgs,
        #[command(flatten)]
        common: Common,
    },
    /// Erases events: body and stored headers deleted, the record (and
    /// its id, a duplicate) kept. One event by its id, or every event a
    /// filter matches, as a job (`--dry-run` counts them first).
    Erase {
        #[command(flatten)]
        at: Lane,
        /// One event (without a filter).
        id: Option<String>,
        #[command(flatten)]
        bulk: BulkArgs,
        #[command(flatten)]
        common: Common,
    },
}

/// Which source's events, or which of its destinations'.
#[derive(Debug, Clone, clap::Args)]
pub struct Lane {
    /// The source.
    #[arg(long)]
    pub source: String,
    /// One of its destinations (`[[sources.NAME.destinations]]`): its
    /// deliveries. Absent: the source's own name, which is its
    /// destination `default` (or, with destinations, where the events no
    /// destination took are listed as filtered).
    #[arg(long)]
    pub destination: Option<String>,
}

impl Lane {
    /// Where the API lists them: the source, or `SOURCE.DESTINATION`.
    pub fn lane(&self) -> String {
        match &self.destination {
            Some(d) => dedupd::gateway::source::lane_name(&self.source, d),
            None => self.source.clone(),
        }
    }
}

/// `dedupd claims …`
#[derive(Debug, clap::Subcommand)]
pub enum ClaimsCommand {
    /// A key's claim: its state, fence and expiry.
    Get {
        /// The key, as API clients name it (unencoded).
        key: String,
        #[command(flatten)]
        common: Common,
    },
}

/// `dedupd streams …`
#[derive(Debug, clap::Subcommand)]
pub enum StreamsCommand {
    /// A stream's head: the newest event applied to it.
    Get {
        /// The stream, as API clients name it (unencoded).
        stream: String,
        #[command(flatten)]
        common: Common,
    },
}

/// Runs `dedupd events …`.
pub fn events(cmd: &EventsCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        EventsCommand::List {
            at,
            status,
            limit,
            after,
            common,
        } => common.call(
            &format!("events of source {}", at.lane()),
            |c| {
                let source = &at.lane();
                let mut query = vec![("status", status.clone()), ("limit", limit.to_string())];
                if let Some(a) = after {
                    query.push(("after", a.clone()));
                }
                c.request(
                    Method::GET,
                    c.url_with(&["v1", "sources", source, "events"], &query),
                )
            },
            |v| print_events(v, &at.lane(), status),
        ),
        EventsCommand::Show { at, id, common } => {
            let source = &at.lane();
            common.call(
                &format!("event {id} of source {source}"),
                |c| c.request(Method::GET, c.url(&["v1", "sources", source, "events", id])),
                |v| print_event(v, source),
            )
        }
        EventsCommand::Count {
            at,
            filter,
            after,
            common,
        } => {
            let source = &at.lane();
            let mut query = filter.query();
            if let Some(after) = after {
                query.push(("after", after.clone()));
            }
            common.call(
                &format!("events of source {source}"),
                |c| {
                    c.request(
                        Method::GET,
                        c.url_with(&["v1", "sources", source, "count"], &query),
                    )
                },
                |v| print_count(v, source, filter.status()),
            )
        }
        EventsCommand::Redeliver {
            at,
            id: None,
            bulk,
            common,
        } => super::jobs::bulk("redeliver", &at.lane(), bulk, common),
        EventsCommand::Erase {
            at,
            id: None,
            bulk,
            common,
        } => super::jobs::bulk("erase", &at.lane(), bulk, common),
        EventsCommand::Redeliver {
            at,
            id: Some(id),
            bulk,
            common,
        } => {
            let source = &at.lane();
            one_event_only(bulk)?;
            common.call(
                &format!("event {id} of source {source}"),
                |c| {
                    c.request(
                        Method::POST,
                        c.url(&["v1", "sources", source, "events", id, "redeliver"]),
                    )
                },
                |v| {
                    outln!(
                        "{} of source {}: {} again; it will be delivered",
                        text(&v["event_id"]),
                        text(&v["source"]),
                        text(&v["status"])
                    )
                },
            )
        }
        EventsCommand::Erase {
            at,
            id: Some(id),
            bulk,
            common,
        } => {
            let source = &at.lane();
            one_event_only(bulk)?;
            common.call(
                &format!("event {id} of source {source}"),
                |c| {
                    c.request(
                        Method::DELETE,
                        c.url(&["v1", "sources", source, "events", id]),
                    )
                },
                |v| {
                    outln!(
                        "{} of source {}: erased (its body and headers are deleted; its id stays a duplicate)",
                        text(&v["event_id"]),
                        text(&v["source"]),
                    )
                },
            )
        }
    }
}

/// Refuses filter flags beside an event id.
fn one_event_only(bulk: &BulkArgs) -> anyhow::Result<()> {
    if bulk.filter.given() || bulk.dry_run || bulk.wait {
        anyhow::bail!(
            "give an event id or filter flags (--status, --since, ...), not both: with an id, one event; with a filter, a job"
        );
    }
    Ok(())
}

/// Runs `dedupd claims …`.
pub fn claims(cmd: &ClaimsCommand) -> anyhow::Result<ExitCode> {
    let ClaimsCommand::Get { key, common } = cmd;
    common.call(
        &format!("claim {key}"),
        |c| c.request(Method::GET, c.url(&["v1", "claims", key])),
        |v| {
            let now = table::now_ms();
            out!(
                "{}",
                table::render(
                    &["KEY", "STATE", "FENCE", "EXPIRES AT"],
                    &[vec![
                        table::word(&v["key"]),
                        text(&v["state"]),
                        text(&v["fence"]),
                        v["expires_at_ms"]
                            .as_u64()
                            .map_or_else(|| "-".into(), |ms| table::when(ms, now)),
                    ]],
                )
            )
        },
    )
}

/// Runs `dedupd streams …`.
pub fn streams(cmd: &StreamsCommand) -> anyhow::Result<ExitCode> {
    let StreamsCommand::Get { stream, common } = cmd;
    common.call(
        &format!("stream {stream}"),
        |c| c.request(Method::GET, c.url(&["v1", "streams", stream])),
        |v| {
            out!(
                "{}",
                table::render(
                    &["STREAM", "HEAD EVENT", "HEAD CREATED AT"],
                    &[vec![
                        table::word(&v["stream"]),
                        table::word(&v["head"]["event_id"]),
                        text(&v["head"]["created_at"]),
                    ]],
                )
            )
        },
    )
}

/// One event: its fields, then its attempt timeline.
fn print_event(v: &Value, source: &str) -> Printed {
    let now = table::now_ms();
    let at = |field: &str| {
        v[field]
            .as_u64()
            .filter(|ms| *ms > 0)
            .map_or_else(|| "-".into(), |ms| table::when(ms, now))
    };
    let pending = v["status"] == "pending";
    let fields = [
        ("EVENT", table::word(&v["event_id"])),
        ("SOURCE", escape_control(source).into_owned()),
        ("STATUS", text(&v["status"])),
        ("STREAM", table::word(&v["stream"])),
        ("CREATED AT", text(&v["created_at"])),
        ("RECEIVED", at("received_at_ms")),
        (
            if pending { "NEXT ATTEMPT" } else { "SETTLED" },
            at("due_at_ms"),
        ),
        ("ATTEMPTS", text(&v["attempts"])),
        ("LAST ERROR", text(&v["last_error"])),
        ("KEPT UNTIL", at("expires_at_ms")),
        ("BODY", format!("{} bytes", text(&v["body_bytes"]))),
    ];
    let width = fields.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (k, value) in fields {
        outln!("{k:width$}  {value}")?;
    }
    outln!()?;
    let attempts = v["timeline"].as_array().map_or(&[][..], Vec::as_slice);
    if attempts.is_empty() {
        return outln!("no attempts yet");
    }
    let rows: Vec<Vec<String>> = attempts
        .iter()
        .map(|a| {
            vec![
                text(&a["attempt"]),
                a["at_ms"]
                    .as_u64()
                    .map_or_else(|| "-".into(), table::rfc3339_ms),
                text(&a["status"]),
                a["latency_ms"]
                    .as_f64()
                    .map_or_else(|| "-".into(), |ms| format!("{ms:.1} ms")),
                text(&a["error"]),
            ]
        })
        .collect();
    out!(
        "{}",
        table::render(&["ATTEMPT", "SENT AT", "STATUS", "LATENCY", "ERROR"], &rows)
    )
}

fn print_events(v: &Value, source: &str, status: &str) -> Printed {
    let events = v["events"].as_array().map_or(&[][..], Vec::as_slice);
    if events.is_empty() {
        outln!("no {status} events in source {source}")?;
    } else {
        let rows: Vec<Vec<String>> = events
            .iter()
            .map(|e| {
                vec![
                    table::word(&e["event_id"]),
                    text(&e["status"]),
                    table::word(&e["stream"]),
                    text(&e["created_at"]),
                    text(&e["attempts"]),
                    text(&e["last_error"]),
                ]
            })
            .collect();
        out!(
            "{}",
            table::render(
                &[
                    "EVENT ID",
                    "STATUS",
                    "STREAM",
                    "CREATED AT",
                    "ATTEMPTS",
                    "LAST ERROR"
                ],
                &rows,
            )
        )?;
    }
    if let Some(next) = v["next"].as_str() {
        // The cursor is the server's: escaped for the terminal and quoted
        // for the shell the line may be pasted into.
        outln!(
            "more: dedupd events list --source {} --status {} --after {}",
            table::shell(source),
            shell_word(status),
            table::shell(next)
        )?;
    }
    Ok(())
}
