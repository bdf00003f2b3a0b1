//! `dedupd inbox migrate`: moves a stopped instance's local inbox into the
//! shared inbox (see `dedupd::store::move_inbox`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use dedupd::config::CONFIG_ENV;

#[cfg(feature = "redis")]
use super::out::outln;

/// The inbox itself, offline.
#[derive(Debug, Subcommand)]
pub enum InboxCommand {
    /// Move this instance's pending events from its data file into the
    /// shared inbox in Redis (gateway.inbox = "shared"). Stop the instance
    /// first; running it again changes nothing.
    Migrate {
        /// TOML settings file, with gateway.inbox = "shared" (default:
        /// none, or $DEDUPD_CONFIG).
        #[arg(long, env = CONFIG_ENV)]
        config: Option<PathBuf>,
        /// Count and name what would move; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

/// Runs an inbox command.
pub fn run(cmd: &InboxCommand) -> anyhow::Result<ExitCode> {
    let InboxCommand::Migrate { config, dry_run } = cmd;
    let loaded = match super::load(config.as_deref()) {
        Ok((l, _)) => l,
        Err(errors) => {
            eprintln!("{errors}");
            return Ok(ExitCode::FAILURE);
        }
    };
    migrate(&loaded.settings, *dry_run)
}

#[cfg(feature = "redis")]
fn migrate(settings: &dedupd::config::Settings, dry_run: bool) -> anyhow::Result<ExitCode> {
    let now = u64::try_from(super::now_unix_s()).unwrap_or(0) * 1000;
    let report = super::runtime()?.block_on(dedupd::store::move_inbox::move_to_shared(
        settings, dry_run, now,
    ))?;
    if report.is_empty() {
        outln!("no pending events in the data file: nothing to move")?;
    }
    for m in &report {
        let named = if m.first_ids.is_empty() {
            String::new()
        } else {
            let more = if m.pending > m.first_ids.len() as u64 {
                ", …"
            } else {
                ""
            };
            format!(" ({}{more})", m.first_ids.join(", "))
        };
        if dry_run {
            outln!(
                "{}: {} pending events would move{named}; {} stream heads would be copied",
                m.source,
                m.pending,
                m.heads
            )?;
        } else {
            outln!(
                "{}: {} pending events moved to the shared inbox ({} stored, {} already there){named}; {} stream heads copied; {} dedupe records copied",
                m.source,
                m.pending,
                m.stored,
                m.already,
                m.heads,
                m.dedupe
            )?;
        }
    }
    if dry_run {
        outln!("dry run: nothing changed")?;
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(not(feature = "redis"))]
fn migrate(_: &dedupd::config::Settings, _: bool) -> anyhow::Result<ExitCode> {
    anyhow::bail!("the shared inbox needs a build with `--features redis`")
}
