//! The `dedupd` command line.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use dedupd::clock::SystemClock;
use dedupd::config::{CONFIG_ENV, ConfigErrors, Settings};
use dedupd::startup::{Application, build_sources};

/// Webhook processing that happens once in effect.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the API until SIGTERM or SIGINT.
    Serve {
        /// TOML settings file (default: none, or $DEDUPD_CONFIG).
        #[arg(long, env = CONFIG_ENV)]
        config: Option<PathBuf>,
    },
    /// Print the effective settings (secrets redacted) or what is wrong.
    CheckConfig {
        /// TOML settings file (default: none, or $DEDUPD_CONFIG).
        #[arg(long, env = CONFIG_ENV)]
        config: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::CheckConfig { config } => match load(config.as_deref()) {
            Ok((loaded, sources)) => {
                print!("{}", loaded.settings.to_redacted_toml());
                for source in &sources {
                    println!(
                        "\n# source {}: {:?} signatures, /ingest/{} -> {}",
                        source.name, source.scheme, source.name, source.forward_to
                    );
                }
                removed_sources(&loaded);
                println!(
                    "\n# {} API token(s) in effect; {}",
                    loaded.api_tokens.len(),
                    if loaded.api_tokens.is_empty() {
                        "/v1 is open to anyone who can reach the listener"
                    } else {
                        "/v1 requires a bearer token"
                    }
                );
                ExitCode::SUCCESS
            }
            Err(errors) => {
                eprintln!("{errors}");
                ExitCode::FAILURE
            }
        },
        Command::Serve { config } => {
            let loaded = match load(config.as_deref()) {
                Ok((l, _)) => l,
                Err(errors) => {
                    eprintln!("{errors}");
                    return ExitCode::FAILURE;
                }
            };
            dedupd::telemetry::init(&loaded.settings.log);
            match serve(loaded) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = format!("{e:#}"), "dedupd failed");
                    eprintln!("dedupd: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// Loads the settings and builds the sources from them: every mistake of
/// either kind, each naming its key and where its value came from.
fn load(
    file: Option<&std::path::Path>,
) -> Result<(dedupd::config::Loaded, Vec<Arc<dedupd::gateway::Source>>), ConfigErrors> {
    let loaded = Settings::load_checked(file, |l| build_sources(l).map(|_| ()))?;
    let sources = build_sources(&loaded)?;
    Ok((loaded, sources))
}

/// Names each source that left the configuration but still has events in
/// the data file, with its count of pending events.
fn removed_sources(loaded: &dedupd::config::Loaded) {
    let path = &loaded.settings.data_path;
    match dedupd::store::redb::inbox_sources_in_file(path) {
        Ok(None) => {}
        Ok(Some(found)) => {
            for (name, pending) in found {
                if !loaded.settings.sources.contains_key(&name) {
                    println!(
                        "\n# removed source {name}: {pending} pending event(s) in {}; not \
                         delivered, listable under /v1/sources/{name}/events, reaped after \
                         gateway.dead_retention",
                        path.display()
                    );
                }
            }
        }
        Err(e) => println!(
            "\n# events of removed sources not checked: cannot read {}: {e}",
            path.display()
        ),
    }
}

#[tokio::main]
async fn serve(loaded: dedupd::config::Loaded) -> anyhow::Result<()> {
    let listen = loaded.settings.listen;
    let data = loaded.settings.data_path.clone();
    let app = Application::build(loaded, Arc::new(SystemClock)).await?;
    tracing::info!(
        %listen,
        port = app.port(),
        data = %data.display(),
        "dedupd serving"
    );
    let handle = app.handle();
    if let Some(period) = dedupd::systemd::watchdog_period() {
        tokio::spawn(dedupd::systemd::watchdog(
            app.liveness(),
            period,
            app.stopped(),
        ));
    }
    dedupd::systemd::ready(&format!("serving on {}:{}", listen.ip(), app.port()));
    tokio::spawn(async move {
        let signal = shutdown_signal().await;
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

/// Waits for SIGTERM or SIGINT; both stop gracefully.
async fn shutdown_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = tokio::signal::ctrl_c() => "SIGINT",
        },
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch SIGTERM; only SIGINT stops dedupd");
            let _ = tokio::signal::ctrl_c().await;
            "SIGINT"
        }
    }
}
