//! `dedupd reload --pid PID`: what `ExecReload=` runs. Checks the
//! configuration as `check-config` does, then sends SIGHUP to the serving
//! dedupd, which reads it again (see `dedupd::reload`). A minimal system
//! has no `kill` (it comes with procps): the unit calls only dedupd.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use dedupd::config::CONFIG_ENV;
use rustix::process::{Pid, Signal, kill_process};

use super::out::outln;

/// `dedupd reload`'s flags.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// TOML settings file, checked before the signal goes (default: none,
    /// or $DEDUPD_CONFIG, as `serve` reads it).
    #[arg(long, env = CONFIG_ENV)]
    config: Option<PathBuf>,
    /// The serving dedupd's process id (systemd's $MAINPID).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(i32::MAX)))]
    pid: u32,
}

/// FAILURE, signalling nothing, when the configuration has errors: the
/// server would refuse it too, and `systemctl reload` then says so at once.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    if let Err(errors) = super::load(args.config.as_deref()) {
        eprintln!("{errors}");
        eprintln!(
            "dedupd: not reloaded: the configuration has errors; the running settings stay in force"
        );
        return Ok(ExitCode::FAILURE);
    }
    let raw = i32::try_from(args.pid).context("--pid is out of range")?;
    let pid = Pid::from_raw(raw).context("--pid must be a process id above 0")?;
    kill_process(pid, Signal::HUP)
        .with_context(|| format!("cannot send SIGHUP to process {raw}"))?;
    outln!(
        "sent SIGHUP to dedupd (pid {raw}): it reads the configuration again and logs \
         \"configuration reloaded\", or \"reload refused\" with what is wrong"
    )?;
    Ok(ExitCode::SUCCESS)
}
