//! The `dedupd` command line: `serve` here, the other subcommands in `cli/`.
#![forbid(unsafe_code)]

mod cli;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

/// mimalloc: the writer and the HTTP workers allocate and free many small
/// buffers per request (glibc's malloc and free were about a tenth of the
/// writer's time in a profile of the claims path). `serve` turns off the
/// transparent huge pages it asks for (`dedupd::huge_pages`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{Parser, Subcommand};
use cli::load;
use dedupd::clock::SystemClock;
use dedupd::config::CONFIG_ENV;
use dedupd::startup::Application;

/// Webhook processing that happens once in effect.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the API until SIGTERM or SIGINT; SIGHUP reloads the
    /// configuration (sources, API tokens, log level).
    Serve {
        /// TOML settings file (default: none, or $DEDUPD_CONFIG).
        #[arg(long, env = CONFIG_ENV)]
        config: Option<PathBuf>,
        /// Open a data file that was not closed cleanly although its
        /// write-ahead log is missing, losing the writes the log held
        /// (refused otherwise, with an error that names both files).
        #[arg(long)]
        accept_missing_log: bool,
    },
    /// Check the configuration, then have a serving dedupd reload it
    /// (SIGHUP): what systemd's ExecReload= runs.
    Reload(cli::reload::Args),
    /// Copy root-only credentials (API tokens, secrets) into the service's
    /// runtime directory for its dynamic user: what the unit runs as root
    /// before each start and reload.
    StageCredentials(cli::credentials::Args),
    /// Print the effective settings (secrets redacted) or what is wrong.
    CheckConfig {
        /// TOML settings file (default: none, or $DEDUPD_CONFIG).
        #[arg(long, env = CONFIG_ENV)]
        config: Option<PathBuf>,
        /// One line when the configuration is good (the unit's check at
        /// every start); warnings and mistakes as ever, on stderr.
        #[arg(long, short)]
        quiet: bool,
    },
    /// Write a commented dedupd.toml with one source and fresh secrets.
    Init(cli::init::Args),
    /// Post a signed sample event to a running server's /ingest/SOURCE.
    Trigger(cli::trigger::Args),
    /// Listen as your application would: verify, print and answer deliveries.
    Receive(cli::receive::Args),
    /// A running server's gateway events: list, show, count, redeliver,
    /// erase (one, or all a filter matches).
    #[command(subcommand)]
    Events(Box<cli::operator::EventsCommand>),
    /// A running server's bulk jobs: list, show, cancel.
    #[command(subcommand)]
    Jobs(cli::jobs::JobsCommand),
    /// A running server's claims.
    #[command(subcommand)]
    Claims(cli::operator::ClaimsCommand),
    /// A running server's stream heads.
    #[command(subcommand)]
    Streams(cli::operator::StreamsCommand),
    /// The inbox, with the instance stopped: migrate to the shared inbox.
    #[command(subcommand)]
    Inbox(cli::inbox::InboxCommand),
    /// Print a shell's completions for dedupd (bash, zsh, fish, elvish,
    /// powershell).
    Completions { shell: clap_complete::Shell },
    /// Write the man pages, dedupd(1) and one per subcommand, into a
    /// directory.
    Man {
        /// Where to write them.
        #[arg(long)]
        out: PathBuf,
    },
    /// Write a backup of the data file while the server serves (one file,
    /// checked before it is kept).
    Backup(cli::backup::BackupArgs),
    /// Check a backup, or a stopped instance's data file, changing nothing.
    Verify(cli::backup::VerifyArgs),
    /// Put a backup in place of the data file, with the instance stopped.
    Restore(cli::backup::RestoreArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::CheckConfig { config, quiet } => cli::check_config::run(config.as_deref(), quiet),
        Command::Reload(args) => cli::reload::run(&args),
        Command::StageCredentials(args) => cli::credentials::run(&args),
        Command::Completions { shell } => cli::docs::completions::<Cli>(shell),
        Command::Man { out } => cli::docs::man_pages::<Cli>(&out),
        Command::Init(args) => cli::init::run(&args).map(|()| ExitCode::SUCCESS),
        Command::Trigger(args) => cli::trigger::run(&args),
        Command::Receive(args) => cli::receive::run(&args).map(|()| ExitCode::SUCCESS),
        Command::Events(cmd) => cli::operator::events(&cmd),
        Command::Jobs(cmd) => cli::jobs::jobs(&cmd),
        Command::Claims(cmd) => cli::operator::claims(&cmd),
        Command::Streams(cmd) => cli::operator::streams(&cmd),
        Command::Inbox(cmd) => cli::inbox::run(&cmd),
        Command::Backup(args) => cli::backup::backup(&args),
        Command::Verify(args) => cli::backup::verify(&args),
        Command::Restore(args) => cli::backup::restore(&args),
        Command::Serve {
            config,
            accept_missing_log,
        } => {
            let loaded = match load(config.as_deref()) {
                Ok((mut l, _)) => {
                    l.settings.storage.accept_missing_log = accept_missing_log;
                    l
                }
                Err(errors) => {
                    eprintln!("{errors}");
                    return ExitCode::FAILURE;
                }
            };
            let traces = match loaded
                .settings
                .telemetry
                .traces
                .export(|n| std::env::var(n))
            {
                Ok(traces) => traces,
                Err(e) => {
                    eprintln!("dedupd: {e}");
                    return ExitCode::FAILURE;
                }
            };
            dedupd::telemetry::init(&loaded.settings.log);
            loaded.warn_about_open_secret_files();
            loaded.warn_about_settings_without_effect();
            dedupd::limits::ensure_open_files(&loaded.settings);
            dedupd::huge_pages::turn_off();
            dedupd::scheduling::on_one_cpu(loaded.settings.cpu_scheduling);
            // After the scheduling policy is set: the export thread takes it.
            if let Some(export) = &traces
                && let Err(e) = dedupd::telemetry::traces::install(export)
            {
                eprintln!("dedupd: {e}");
                return ExitCode::FAILURE;
            }
            let served = serve(loaded, config);
            // Its warning (spans left unexported) comes before `stopped`.
            dedupd::telemetry::traces::shutdown();
            Ok(match served {
                Ok(()) => {
                    tracing::info!("stopped");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    let text = cli::error_text(&e);
                    tracing::error!(error = text, "dedupd failed");
                    eprintln!("dedupd: {text}");
                    ExitCode::FAILURE
                }
            })
        }
    };
    outcome.unwrap_or_else(|e| {
        // `dedupd events list | head -1`: the reader has what it wanted.
        if cli::out::reader_left(&e) {
            return ExitCode::SUCCESS;
        }
        eprintln!("dedupd: {}", cli::error_text(&e));
        ExitCode::FAILURE
    })
}

#[tokio::main]
async fn serve(loaded: dedupd::config::Loaded, config: Option<PathBuf>) -> anyhow::Result<()> {
    // Watched before anything else: a SIGTERM from here on stops gracefully
    // (one during the start waits until the app is up, then stops it), and
    // a SIGHUP (whose default kills) reloads once the app is up.
    let (signals, hup) = Signals::install()?;
    let listen = loaded.settings.listen;
    let data = loaded.settings.data_path.clone();
    let starting = dedupd::systemd::extend_start();
    let app = Application::build(loaded, Arc::new(SystemClock)).await?;
    drop(starting);
    tracing::info!(
        %listen,
        port = app.port(),
        resp_port = app.resp_port(),
        data = %data.display(),
        "dedupd serving"
    );
    let handle = app.handle();
    // READY first: the watchdog's first ping comes at once, and systemd
    // (and the tests) must hear that the service is up before any ping.
    dedupd::systemd::ready(&format!("serving on {}:{}", listen.ip(), app.port()));
    if let Some(period) = dedupd::systemd::watchdog_period() {
        tokio::spawn(dedupd::systemd::watchdog(
            app.liveness(),
            period,
            app.stopped(),
        ));
    }
    tokio::spawn(reload_on_hangup(
        hup,
        app.reloader(),
        config,
        listen,
        app.port(),
    ));
    tokio::spawn(async move {
        let signal = signals.wait().await;
        tracing::info!(
            signal,
            "shutting down: finishing in-flight requests and deliveries"
        );
        dedupd::systemd::stopping("stopping: finishing in-flight requests and deliveries");
        handle.stop(true).await;
    });
    app.run_until_stopped().await?;
    Ok(())
}

/// Reloads the configuration from `config` on each SIGHUP, one at a time,
/// off the async threads (it reads files); the outcome goes to the log,
/// systemd's status line and, with a runtime directory, the status file
/// `dedupd reload` waits on.
async fn reload_on_hangup(
    mut hup: tokio::signal::unix::Signal,
    reloader: dedupd::reload::Reloader,
    config: Option<PathBuf>,
    listen: std::net::SocketAddr,
    port: u16,
) {
    use dedupd::reload::status::{self, State, Status};
    let file = status::path();
    let record = |s: &Status| {
        if let Some(path) = &file
            && let Err(e) = status::write(path, s)
        {
            tracing::warn!(path = %path.display(), error = %e, "cannot write the reload status");
        }
    };
    let mut generation = 0;
    record(&Status::at(generation, State::Serving));
    while hup.recv().await.is_some() {
        generation += 1;
        record(&Status::at(generation, State::Reloading));
        tracing::info!(signal = "SIGHUP", "reloading the configuration");
        let (r, file) = (reloader.clone(), config.clone());
        let outcome = tokio::task::spawn_blocking(move || r.reload(file.as_deref())).await;
        let serving = format!("serving on {}:{port}", listen.ip());
        match outcome {
            Ok(Ok(reloaded)) => {
                dedupd::systemd::status(&format!("{serving}; configuration reloaded"));
                record(&Status::reloaded(generation, &reloaded.restart_only));
            }
            Ok(Err(errors)) => {
                dedupd::systemd::status(&format!(
                    "{serving}; reload refused ({} error(s), see the log): the previous settings stay in force",
                    errors.0.len()
                ));
                record(&Status::refused(
                    generation,
                    errors.0.iter().map(ToString::to_string),
                ));
            }
            Err(e) => {
                tracing::error!(error = %e, "the reload failed");
                record(&Status::refused(
                    generation,
                    [format!("the reload failed: {e}")],
                ));
            }
        }
    }
}

/// SIGTERM and SIGINT, both graceful stops.
struct Signals {
    /// SIGTERM (systemd's stop).
    term: tokio::signal::unix::Signal,
    /// SIGINT (Ctrl-C).
    int: tokio::signal::unix::Signal,
}

impl Signals {
    /// Takes both signals, and SIGHUP (returned apart), over from their
    /// default (which kills the process).
    fn install() -> std::io::Result<(Self, tokio::signal::unix::Signal)> {
        use tokio::signal::unix::{SignalKind, signal};
        let signals = Self {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        };
        Ok((signals, signal(SignalKind::hangup())?))
    }

    /// Waits for either; names it.
    async fn wait(mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}
