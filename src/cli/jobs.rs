//! Bulk jobs from the terminal: `dedupd events redeliver|erase` with a
//! filter (a dry run, or a job, optionally followed to its end) and
//! `dedupd jobs list|show|cancel`.

use std::process::ExitCode;
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use dedupd::redact::{escape_control, json_for_terminal};

use super::call::Common;
use super::filter::{BulkArgs, print_count};
use super::out::{out, outln};
use super::table::{self, text};

/// `dedupd jobs …`
#[derive(Debug, clap::Subcommand)]
pub enum JobsCommand {
    /// The bulk jobs kept (the last 100), newest first.
    List {
        #[command(flatten)]
        common: Common,
    },
    /// One job's progress.
    Show {
        id: String,
        /// Follow its progress until it finishes.
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Cancels a job: it queues nothing more, and ends once what it
    /// queued settled.
    Cancel {
        id: String,
        #[command(flatten)]
        common: Common,
    },
}

/// Runs `dedupd jobs …`.
pub fn jobs(cmd: &JobsCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        JobsCommand::List { common } => common.call(
            "jobs",
            |c| c.request(Method::GET, c.url(&["v1", "jobs"])),
            |v| {
                let jobs = v["jobs"].as_array().map_or(&[][..], Vec::as_slice);
                if jobs.is_empty() {
                    return outln!("no jobs");
                }
                let now = table::now_ms();
                let rows: Vec<Vec<String>> = jobs
                    .iter()
                    .map(|j| {
                        vec![
                            text(&j["id"]),
                            text(&j["source"]),
                            text(&j["kind"]),
                            text(&j["state"]),
                            progress(j),
                            j["created_ms"]
                                .as_u64()
                                .map_or_else(|| "-".into(), |ms| table::when(ms, now)),
                        ]
                    })
                    .collect();
                out!(
                    "{}",
                    table::render(
                        &["JOB", "SOURCE", "KIND", "STATE", "PROGRESS", "CREATED"],
                        &rows
                    )
                )
            },
        ),
        JobsCommand::Show { id, wait, common } => {
            if *wait {
                follow(common, id)
            } else {
                common.call(
                    &format!("job {id}"),
                    |c| c.request(Method::GET, c.url(&["v1", "jobs", id])),
                    |v| outln!("{}", line(v)),
                )
            }
        }
        JobsCommand::Cancel { id, common } => common.call(
            &format!("job {id}"),
            |c| c.request(Method::POST, c.url(&["v1", "jobs", id, "cancel"])),
            |v| {
                if v["state"] == "running" {
                    outln!(
                        "{}: cancelled; it queues nothing more and ends once what it queued settled",
                        text(&v["id"])
                    )
                } else {
                    outln!("{}: already {}", text(&v["id"]), text(&v["state"]))
                }
            },
        ),
    }
}

/// `dedupd events redeliver|erase --source S [filter]`: the dry run, or
/// the job.
pub fn bulk(
    kind: &str,
    source: &str,
    bulk: &BulkArgs,
    common: &Common,
) -> anyhow::Result<ExitCode> {
    let filter = &bulk.filter;
    if !bulk.dry_run && !filter.given() {
        // Most likely the id was forgotten: not every dead event at once.
        anyhow::bail!(
            "give an event id, or filter flags for a job over every event they match \
             (--status dead alone: every dead event of the source); --dry-run counts them first"
        );
    }
    if bulk.dry_run {
        return common.call(
            &format!("events of source {source}"),
            |c| {
                c.request(
                    Method::GET,
                    c.url_with(&["v1", "sources", source, "count"], &filter.query()),
                )
            },
            |v| {
                print_count(v, source, filter.status())?;
                outln!("run it again without --dry-run to {kind} them")
            },
        );
    }
    let mut started: Option<String> = None;
    let code = common.call(
        &format!("a {kind} job on source {source}"),
        |c| {
            c.request(Method::POST, c.url(&["v1", "sources", source, "jobs"]))
                .json(&json!({ "kind": kind, "filter": filter.json() }))
        },
        |v| {
            started = v["id"].as_str().map(str::to_owned);
            outln!(
                "started {}: {kind} of the {} events of source {source} the filter matches",
                text(&v["id"]),
                filter.status(),
            )?;
            outln!(
                "follow it with `dedupd jobs show {} --wait`, stop it with `dedupd jobs cancel {}`",
                text(&v["id"]),
                text(&v["id"]),
            )
        },
    )?;
    match started {
        Some(id) if bulk.wait && code == ExitCode::SUCCESS => follow(common, &id),
        _ => Ok(code),
    }
}

/// Prints the job's progress whenever it changes, until it finishes.
fn follow(common: &Common, id: &str) -> anyhow::Result<ExitCode> {
    // The id may be the server's answer: escaped where it is printed.
    let what = format!("job {}", escape_control(id));
    let mut last = String::new();
    loop {
        let mut answer = Value::Null;
        let code = common.call_quiet(
            &what,
            |c| c.request(Method::GET, c.url(&["v1", "jobs", id])),
            |v| answer = v.clone(),
        )?;
        if code != ExitCode::SUCCESS {
            return Ok(code);
        }
        let now = line(&answer);
        if now != last {
            if common.json() {
                outln!("{}", json_for_terminal(&answer))?;
            } else {
                outln!("{now}")?;
            }
            last = now;
        }
        if answer["state"] != "running" {
            return Ok(finished(&answer));
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// The exit status of a job that ended: success only when it ran to its
/// end (not cancelled, no error ended it) and nothing it replayed failed,
/// so a script that waits for it can tell.
fn finished(v: &Value) -> ExitCode {
    let id = text(&v["id"]);
    if v["state"] == "cancelled" {
        eprintln!("{id} was cancelled before it handled every match");
        return ExitCode::FAILURE;
    }
    if let Some(error) = v["error"].as_str() {
        eprintln!("{id} ended before it handled every match: {error}");
        return ExitCode::FAILURE;
    }
    let failed = v["failed"].as_u64().unwrap_or(0);
    if failed > 0 {
        eprintln!(
            "{id} ended with {failed} failed redeliveries: see `dedupd events list --source {} --status dead`",
            text(&v["source"])
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// A job's counters, in a few words.
fn progress(v: &Value) -> String {
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    match v["kind"].as_str() {
        Some("erase") => format!(
            "{} matched, {} erased, {} skipped",
            n("matched"),
            n("erased"),
            n("skipped")
        ),
        _ => format!(
            "{} matched, {} queued, {} delivered, {} failed, {} skipped",
            n("matched"),
            n("queued"),
            n("delivered"),
            n("failed"),
            n("skipped")
        ),
    }
}

/// A job on one line.
fn line(v: &Value) -> String {
    let mut s = format!(
        "{} {} on {}: {} ({}, {} read)",
        text(&v["id"]),
        text(&v["kind"]),
        text(&v["source"]),
        text(&v["state"]),
        progress(v),
        v["scanned"].as_u64().unwrap_or(0)
    );
    if v["cancelled"] == true && v["state"] == "running" {
        s.push_str(", cancelling");
    }
    if !v["error"].is_null() {
        s.push_str(&format!(": {}", text(&v["error"])));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// `--wait` exits 0 only for a job that ran to its end with nothing
    /// failed: a script can tell a cancelled one, one an error ended (its
    /// source removed), or one with failed redeliveries.
    #[test]
    fn a_job_that_did_not_handle_every_match_exits_1() {
        let job = |extra: Value| {
            let mut v = json!({"id": "job_1", "source": "sume", "state": "done", "failed": 0});
            v.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            v
        };
        assert_eq!(finished(&job(json!({}))), ExitCode::SUCCESS);
        for bad in [
            json!({"state": "cancelled"}),
            json!({"error": "source \"sume\" is no longer configured"}),
            json!({"failed": 2}),
        ] {
            assert_eq!(finished(&job(bad.clone())), ExitCode::FAILURE, "{bad}");
        }
    }
}
