//! What every operator command (`events`, `claims`, `streams`, `jobs`)
//! does: takes `--json` and where the server is, sends one request, and
//! prints the answer (the server's JSON, or for people) or the refusal.

use std::process::ExitCode;

use serde_json::Value;

use dedupd::redact::{escape_control, json_for_terminal};

use super::client::{Client, Refusal, ServerArgs};
use super::out::{Printed, outln};

/// Flags every operator command takes.
#[derive(Debug, clap::Args)]
pub struct Common {
    /// Print the server's JSON answer instead of a table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    server: ServerArgs,
}

impl Common {
    /// Whether `--json` was given.
    pub(super) fn json(&self) -> bool {
        self.json
    }

    /// [`Common::call`] that hands the answer to `take` in both modes and
    /// prints nothing but a refusal.
    pub(super) fn call_quiet(
        &self,
        what: &str,
        build: impl FnOnce(&Client) -> reqwest::RequestBuilder,
        take: impl FnOnce(&Value),
    ) -> anyhow::Result<ExitCode> {
        let loaded = if self.server.needs_config() {
            Some(self.server.load()?)
        } else {
            None
        };
        let client = self.server.client(loaded.as_ref())?;
        match super::runtime()?.block_on(client.json(build(&client))) {
            Ok(v) => {
                take(&v);
                Ok(ExitCode::SUCCESS)
            }
            Err(e) => match e.downcast_ref::<Refusal>() {
                Some(r) => {
                    eprintln!("dedupd: {what}: {r}");
                    Ok(ExitCode::FAILURE)
                }
                None => Err(e),
            },
        }
    }

    /// Sends the request `build` makes and prints the answer: as JSON with
    /// `--json`, else with `show`. A refusal of `what` is printed to stderr
    /// (and its problem document to stdout with `--json`) and fails.
    pub(super) fn call(
        &self,
        what: &str,
        build: impl FnOnce(&Client) -> reqwest::RequestBuilder,
        show: impl FnOnce(&Value) -> Printed,
    ) -> anyhow::Result<ExitCode> {
        let loaded = if self.server.needs_config() {
            Some(self.server.load()?)
        } else {
            None
        };
        let client = self.server.client(loaded.as_ref())?;
        let answer = super::runtime()?.block_on(client.json(build(&client)));
        match answer {
            Ok(v) if self.json => {
                outln!("{}", json_for_terminal(&v))?;
                Ok(ExitCode::SUCCESS)
            }
            Ok(v) => {
                show(&v)?;
                Ok(ExitCode::SUCCESS)
            }
            Err(e) => match e.downcast_ref::<Refusal>() {
                Some(r) => {
                    if self.json {
                        match serde_json::from_str::<Value>(&r.body) {
                            Ok(problem) => outln!("{}", json_for_terminal(&problem))?,
                            Err(_) => outln!("{}", escape_control(r.body.trim()))?,
                        }
                    }
                    eprintln!("dedupd: {what}: {r}");
                    Ok(ExitCode::FAILURE)
                }
                None => Err(e),
            },
        }
    }
}
