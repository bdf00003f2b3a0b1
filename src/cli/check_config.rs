//! `dedupd check-config`: the effective settings (secrets redacted), or
//! every mistake with the key and where its value came from.

use std::path::Path;
use std::process::ExitCode;

use dedupd::config::Loaded;
use dedupd::config::telemetry::{self, TraceExport};

use super::out::{Printed, out, outln};

/// Prints the effective settings and sources (with `quiet`, one line
/// that says the configuration is good); FAILURE with the errors on stderr
/// when it is wrong. Warnings go to stderr either way.
pub fn run(config: Option<&Path>, quiet: bool) -> anyhow::Result<ExitCode> {
    let loaded = super::load(config);
    // Traces as `serve` would export them, the standard OTEL_* variables
    // applied; one it would refuse is an error.
    let traces = match &loaded {
        Ok((loaded, _)) => match loaded
            .settings
            .telemetry
            .traces
            .decide(|n| std::env::var(n))
        {
            Ok(traces) => Some(traces),
            Err(e) => {
                eprintln!("{e}");
                return Ok(ExitCode::FAILURE);
            }
        },
        Err(_) => None,
    };
    match loaded {
        Ok((loaded, sources)) if quiet => {
            for file in loaded.open_secret_files() {
                eprintln!("warning: {file}");
            }
            for setting in loaded.settings_without_effect() {
                eprintln!("warning: {setting}");
            }
            let posted = sources.iter().filter(|s| s.lane_of.is_none()).count();
            outln!(
                "configuration good: {posted} source(s), {} API token(s), data in {}",
                loaded.api_tokens.len(),
                // The file's: printed escaped.
                dedupd::redact::escape_control(&loaded.settings.data_path.to_string_lossy())
            )?;
            Ok(ExitCode::SUCCESS)
        }
        Ok((loaded, sources)) => {
            out!("{}", loaded.settings.to_redacted_toml())?;
            for source in &sources {
                if let Some(of) = &source.lane_of {
                    // A destination's lane takes no posts: its source does.
                    outln!(
                        "\n# destination {} of source {of}: listed as {} -> {}",
                        source.destination,
                        source.name,
                        dedupd::redact::url(&source.forward_to)
                    )?;
                } else if !source.delivers {
                    outln!(
                        "\n# source {}: {:?} signatures, /ingest/{} -> its destinations",
                        source.name,
                        source.scheme,
                        source.name
                    )?;
                } else {
                    outln!(
                        "\n# source {}: {:?} signatures, /ingest/{} -> {}",
                        source.name,
                        source.scheme,
                        source.name,
                        dedupd::redact::url(&source.forward_to)
                    )?;
                }
            }
            if let Some(traces) = &traces {
                traces_in_effect(traces)?;
            }
            removed_sources(&loaded, &sources)?;
            for file in loaded.open_secret_files() {
                eprintln!("warning: {file}");
            }
            for setting in loaded.settings_without_effect() {
                eprintln!("warning: {setting}");
            }
            let read_only = match loaded.api_read_tokens.len() {
                0 => String::new(),
                n => format!(" and {n} read-only token(s)"),
            };
            outln!(
                "\n# {} API token(s){read_only} in effect; {}",
                loaded.api_tokens.len(),
                if loaded.api_tokens.is_empty() {
                    "/v1 is open to anyone who can reach the listener"
                } else {
                    "/v1 requires a bearer token"
                }
            )?;
            Ok(ExitCode::SUCCESS)
        }
        Err(errors) => {
            eprintln!("{errors}");
            Ok(ExitCode::FAILURE)
        }
    }
}

/// Where `serve` would export traces, the standard `OTEL_*` variables
/// applied (they override `[telemetry.traces]` above), or why it would
/// not; and which of those variables are set (by name: a value may hold
/// credentials).
fn traces_in_effect(traces: &Result<TraceExport, telemetry::Off>) -> Printed {
    match traces {
        Ok(t) => outln!(
            "\n# traces: exported to {} as service {:?}, sample ratio {}, queue of {} spans",
            dedupd::redact::url_str(&t.endpoint),
            t.service_name,
            t.sample_ratio,
            t.queue
        )?,
        Err(off) => outln!("\n# traces: off: {off}")?,
    }
    let set = telemetry::standard_variables_set(|n| std::env::var(n));
    if !set.is_empty() {
        outln!(
            "# {} set: they override [telemetry.traces] above",
            set.join(", ")
        )?;
    }
    Ok(())
}

/// Names each source that left the configuration but still has events in
/// the data file, with its count of pending events. A destination's lane
/// (`SOURCE.DESTINATION`) is configured while its destination is.
fn removed_sources(
    loaded: &Loaded,
    sources: &[std::sync::Arc<dedupd::gateway::Source>],
) -> Printed {
    let path = &loaded.settings.data_path;
    // The file's path, and names read from the data file: printed escaped.
    let shown = dedupd::redact::escape_control(&path.to_string_lossy()).into_owned();
    match dedupd::store::inbox_sources_in_file(path) {
        Ok(None) => {}
        Ok(Some(found))
            if loaded.settings.gateway.inbox == dedupd::config::sources::InboxPlace::Shared =>
        {
            let pending: u64 = found.iter().map(|(_, n)| n).sum();
            if pending > 0 {
                outln!(
                    "\n# gateway.inbox = \"shared\", but {} holds {pending} pending event(s) of \
                     this instance's local inbox: they are not delivered from there. Stop the \
                     instance and run `dedupd inbox migrate` to move them into the shared inbox",
                    shown
                )?;
            }
        }
        Ok(Some(found)) => {
            for (name, pending) in found {
                let name = dedupd::redact::escape_control(&name).into_owned();
                let alerts = loaded.settings.alerts.is_some()
                    && name == dedupd::config::alerts::ALERT_SOURCE;
                let configured = loaded.settings.sources.contains_key(&name)
                    || sources.iter().any(|s| s.name == name);
                let idle = sources.iter().any(|s| s.name == name && !s.delivers);
                if idle && pending > 0 {
                    outln!(
                        "\n# source {name}: {pending} pending event(s) in {} from before its \
                         destinations, none of which is named default; not delivered, listable \
                         under /v1/sources/{name}/events, reaped after gateway.dead_retention",
                        shown
                    )?;
                }
                if !alerts && !configured {
                    outln!(
                        "\n# removed source {name}: {pending} pending event(s) in {}; not \
                         delivered, listable under /v1/sources/{name}/events, reaped after \
                         gateway.dead_retention",
                        shown
                    )?;
                }
            }
        }
        Err(e) => outln!(
            "\n# events of removed sources not checked: cannot read {}: {e}",
            shown
        )?,
    }
    Ok(())
}
