//! `dedupd reload --pid PID`: what `ExecReload=` runs. Checks the
//! configuration as `check-config` does, then sends SIGHUP to the serving
//! dedupd, which reads it again (see `dedupd::reload`), and, when the
//! server keeps a reload status (under systemd's `RuntimeDirectory=`),
//! waits for the reload's outcome: refused by the server (which also
//! checks the file against its running settings), it fails too. A
//! minimal system has no `kill` (it comes with procps): the unit calls
//! only dedupd.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use dedupd::config::CONFIG_ENV;
use dedupd::redact::{escape_control, escape_lines};
use dedupd::reload::status::{self, State, Status};
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
    /// The server's reload status file, whose outcome it waits for
    /// [default: reload-status in $RUNTIME_DIRECTORY, which systemd sets;
    /// without one, it returns once the signal is sent].
    #[arg(long)]
    status: Option<PathBuf>,
    /// How long it waits for the server to say how the reload went.
    #[arg(long, default_value = "30s", value_parser = super::parse_wait)]
    wait: Duration,
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
    if let Some(other) = not_serving(args.pid) {
        bail!(
            "process {raw} is not a `dedupd serve` (its command line: {other}): nothing was \
             signalled (a stale --pid, or one another process took over?)"
        );
    }
    let file = args.status.clone().or_else(status::path);
    // Read before the signal: which reload will answer it.
    let before = match &file {
        Some(path) => status::read(path)
            .with_context(|| format!("cannot read the reload status {}", path.display()))?,
        None => None,
    };
    kill_process(pid, Signal::HUP)
        .with_context(|| format!("cannot send SIGHUP to process {raw}"))?;
    let (Some(path), Some(before)) = (file, before) else {
        outln!(
            "sent SIGHUP to dedupd (pid {raw}): it reads the configuration again and logs \
             \"configuration reloaded\", or \"reload refused\" with what is wrong"
        )?;
        return Ok(ExitCode::SUCCESS);
    };
    wait_for(&path, before.answering(), args.wait, raw)
}

/// What process `pid` runs, when it is not a `dedupd serve` (a program
/// whose name starts with `dedupd`, with the argument `serve`): SIGHUP
/// would end most other programs. None when it is one, or when `/proc`
/// cannot tell (another system): then it is signalled as asked.
fn not_serving(pid: u32) -> Option<String> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<String> = cmdline
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let program = args.first().map(|a| {
        Path::new(a)
            .file_name()
            .map_or(a.as_str(), |n| n.to_str().unwrap_or(""))
    });
    let serving = program.is_some_and(|p| p.starts_with("dedupd"))
        && args.iter().skip(1).any(|a| a == "serve");
    if serving {
        return None;
    }
    let shown: String = args.join(" ").chars().take(120).collect();
    Some(if shown.is_empty() {
        "none: a kernel thread, or gone".into()
    } else {
        format!("{shown:?}")
    })
}

/// Waits until reload `generation` (or a later one) has an outcome in the
/// status file, and says it.
fn wait_for(path: &Path, generation: u64, wait: Duration, pid: i32) -> anyhow::Result<ExitCode> {
    let deadline = Instant::now() + wait;
    loop {
        if let Some(Status {
            generation: g,
            state,
            errors,
            restart_only,
        }) = status::read(path)
            .with_context(|| format!("cannot read the reload status {}", path.display()))?
            && g >= generation
        {
            match state {
                State::Reloaded if restart_only.is_empty() => {
                    outln!("reloaded: dedupd (pid {pid}) put the configuration in force")?;
                    return Ok(ExitCode::SUCCESS);
                }
                State::Reloaded => {
                    // The reload went well: what it could apply is in force.
                    outln!(
                        "reloaded: dedupd (pid {pid}) put the configuration in force, but for \
                         settings that need a restart to change, which keep their running \
                         values until then: {}",
                        escape_control(&restart_only.join(", "))
                    )?;
                    return Ok(ExitCode::SUCCESS);
                }
                State::Refused => {
                    // The file is the service user's: printed escaped, line
                    // breaks kept.
                    for e in &errors {
                        eprintln!("{}", escape_lines(e));
                    }
                    eprintln!(
                        "dedupd: reload refused by the server (pid {pid}): the running settings stay in force"
                    );
                    return Ok(ExitCode::FAILURE);
                }
                State::Serving | State::Reloading => {}
            }
        }
        if Instant::now() >= deadline {
            eprintln!(
                "dedupd: sent SIGHUP to pid {pid}, but it has not said how the reload went \
                 within {}: see its log",
                humantime::format_duration(wait)
            );
            return Ok(ExitCode::FAILURE);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
