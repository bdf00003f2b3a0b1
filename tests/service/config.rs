//! Configuration: `check-config` and `serve` refuse what they could not run
//! with, name the key, file or variable at fault, and never show a secret.

use std::process::Stdio;
use std::time::Duration;

use crate::support::process::check_config;
use crate::support::process::dedupd;
use crate::support::process::serve_config;
use crate::support::process::stop;
use tempfile::TempDir;
#[test]
fn check_config_prints_effective_settings_with_secrets_redacted() {
    let dir = TempDir::new().unwrap();
    let file = dir.path().join("dedupd.toml");
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "# rotated weekly\nfile-token-abcdefghijkl\n\n").unwrap();
    std::fs::write(
        &file,
        format!(
            "listen = \"0.0.0.0:9000\"\n[api]\ntokens = [\"inline-secret-0123456789\"]\ntokens_file = {:?}\n[claims]\nmax_ttl = \"7d\"\n",
            tokens.display().to_string()
        ),
    )
    .unwrap();
    let out = dedupd()
        .args(["check-config", "--config"])
        .arg(&file)
        .env("DEDUPD_CLAIMS__DEFAULT_TTL", "90s")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("listen = \"0.0.0.0:9000\""), "{stdout}");
    assert!(stdout.contains("max_ttl = \"7days\""), "{stdout}");
    assert!(
        stdout.contains("default_ttl = \"1m 30s\""),
        "env overrides file: {stdout}"
    );
    assert!(stdout.contains("<redacted>"));
    assert!(!stdout.contains("inline-secret"), "{stdout}");
    assert!(!stdout.contains("file-token"), "{stdout}");
    assert!(stdout.contains("2 API token(s)"), "{stdout}");
}

#[test]
fn check_config_names_the_bad_key_and_the_file_it_came_from() {
    let dir = TempDir::new().unwrap();
    let file = dir.path().join("bad.toml");
    std::fs::write(&file, "[claims]\ndefault_ttl = \"forever\"\n").unwrap();
    let out = check_config(&file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("claims.default_ttl"), "{stderr}");
    assert!(stderr.contains("bad.toml"), "{stderr}");
}

/// A key is the file's: one that holds an escape sequence (a title change,
/// a clipboard write) is named escaped, so reviewing a file from someone
/// else with `check-config` runs nothing in the terminal; as are `serve`'s
/// and `reload`'s errors, which print the same text.
#[test]
fn check_config_names_a_key_with_control_characters_escaped() {
    let dir = TempDir::new().unwrap();
    let file = dir.path().join("evil\u{1b}[31m.toml");
    std::fs::write(
        &file,
        "[sources.\"a\\u001b]52;c;cHduZWQ=\\u0007\"]\nscheme = \"sume\"\n",
    )
    .unwrap();
    for command in ["check-config", "serve"] {
        let out = dedupd()
            .arg(command)
            .arg("--config")
            .arg(&file)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{command}: {stderr}");
        assert!(
            stderr.contains("sources.a\\u{1b}]52;c;cHduZWQ=\\u{7}"),
            "{command}: {stderr}"
        );
        assert!(
            stderr.contains("evil\\u{1b}[31m.toml"),
            "{command}: {stderr}"
        );
        assert!(
            !stderr.contains(['\u{1b}', '\u{7}']),
            "{command}: {stderr:?}"
        );
    }
    // A good file's data_path, as check-config --quiet names it.
    let good = dir.path().join("good.toml");
    std::fs::write(
        &good,
        "listen = \"127.0.0.1:0\"\ndata_path = \"x\\u001b]0;T\\u0007.redb\"\n",
    )
    .unwrap();
    let out = dedupd()
        .args(["check-config", "--quiet", "--config"])
        .arg(&good)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("data in x\\u{1b}]0;T\\u{7}.redb"),
        "{stdout}"
    );
}

#[test]
fn check_config_names_the_environment_variable_of_a_bad_value() {
    let out = dedupd()
        .arg("check-config")
        .env("DEDUPD_HTTP__WORKERS", "lots")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("http.workers"), "{stderr}");
    assert!(stderr.contains("DEDUPD_HTTP__WORKERS"), "{stderr}");
}

/// figment parses a variable's brackets (and nests its name's `__` parts)
/// recursively: 50 000 of them overflowed the stack and aborted, as they
/// did behind a `'"'`. Now each is refused with the variable's name,
/// before anything is parsed.
#[test]
fn a_deeply_nested_environment_variable_is_refused_by_name() {
    let deep_value = dedupd()
        .arg("check-config")
        .env("DEDUPD_LISTEN", "[".repeat(50_000))
        .output()
        .unwrap();
    // A `"` figment reads as a character hid the brackets after it from
    // the guard, and this aborted the process as 50 000 `[` once did.
    let behind_a_quote = dedupd()
        .arg("check-config")
        .env("DEDUPD_LISTEN", format!("['\"',{}", "[".repeat(50_000)))
        .output()
        .unwrap();
    let deep_name = dedupd()
        .arg("check-config")
        .env(format!("DEDUPD_{}B", "A__".repeat(40_000)), "1")
        .output()
        .unwrap();
    for (out, named) in [
        (deep_value, "(from environment variable DEDUPD_LISTEN)"),
        (behind_a_quote, "(from environment variable DEDUPD_LISTEN)"),
        (deep_name, "DEDUPD_A__A__A__"),
    ] {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("levels deep"), "{stderr}");
        assert!(stderr.contains(named), "{stderr}");
        assert!(stderr.len() < 1000, "the name is cut short: {stderr}");
    }
}

#[test]
fn check_config_refuses_a_ttl_default_above_the_maximum() {
    let out = dedupd()
        .arg("check-config")
        .env("DEDUPD_CLAIMS__MAX_TTL", "1m")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("claims.default_ttl"), "{stderr}");
    assert!(stderr.contains("exceeds claims.max_ttl"), "{stderr}");
    assert!(stderr.contains("defaults"), "{stderr}");
}

#[test]
fn unknown_keys_and_missing_files_are_errors() {
    let dir = TempDir::new().unwrap();
    let file = dir.path().join("typo.toml");
    std::fs::write(&file, "[claims]\nmax_tll = \"1d\"\n").unwrap();
    let out = check_config(&file);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("max_tll"));

    let out = dedupd()
        .arg("check-config")
        .env("DEDUPD_CONFIG", dir.path().join("absent.toml"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("absent.toml"));
}

/// A standard `OTEL_*` variable dedupd cannot follow (a collector that is
/// no URL, gRPC) stops `serve` and `check-config` by name, before anything
/// is opened, and its value (which may hold credentials) is not quoted.
#[test]
fn serve_and_check_config_refuse_a_standard_otel_variable_they_cannot_follow() {
    let dir = TempDir::new().unwrap();
    for (name, value) in [
        (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "127.0.0.1:4318/s3cret",
        ),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
    ] {
        for command in ["check-config", "serve"] {
            let out = dedupd()
                .arg(command)
                .current_dir(dir.path())
                .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
                .env(name, value)
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{command} {name}: {stderr}");
            assert!(stderr.contains(name), "{command}: {stderr}");
            assert!(!stderr.contains("s3cret"), "{command}: {stderr}");
            assert!(
                !dir.path().join("dedupd.redb").exists(),
                "nothing was opened"
            );
        }
    }
}

/// `check-config` says what `serve` would do with traces, the standard
/// variables applied over the file (they override it), and names the ones
/// set without quoting them.
#[test]
fn check_config_shows_the_traces_serve_would_export_with_the_standard_variables_applied() {
    let dir = TempDir::new().unwrap();
    let config = dir.path().join("dedupd.toml");
    std::fs::write(
        &config,
        "[telemetry.traces]\notlp_endpoint = \"http://file-collector:4318\"\nservice_name = \"from-file\"\n",
    )
    .unwrap();
    let check = |vars: &[(&str, &str)]| {
        let mut cmd = dedupd();
        cmd.args(["check-config", "--config"]).arg(&config);
        for (name, value) in vars {
            cmd.env(name, value);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{vars:?}: {out:?}");
        let stdout = String::from_utf8(out.stdout).unwrap();
        let said: Vec<String> = stdout
            .lines()
            .filter(|l| l.starts_with("# traces") || l.contains(" set: they override"))
            .map(str::to_owned)
            .collect();
        said
    };
    assert_eq!(
        check(&[]),
        [
            r#"# traces: exported to http://file-collector:4318/v1/traces as service "from-file", sample ratio 1, queue of 4096 spans"#
        ]
    );
    assert_eq!(
        check(&[
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "http://127.0.0.1:4318/?api_key=s3cret"
            ),
            ("OTEL_SERVICE_NAME", "plain"),
            ("OTEL_TRACES_SAMPLER", "always_off"),
        ]),
        [
            r#"# traces: exported to http://127.0.0.1:4318/v1/traces?<redacted> as service "plain", sample ratio 0, queue of 4096 spans"#,
            "# OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER set: they override [telemetry.traces] above",
        ]
    );
    assert_eq!(
        check(&[("OTEL_SDK_DISABLED", "true")]),
        [
            "# traces: off: OTEL_SDK_DISABLED=true",
            "# OTEL_SDK_DISABLED set: they override [telemetry.traces] above",
        ]
    );
    assert_eq!(
        check(&[("OTEL_TRACES_EXPORTER", "none")]),
        [
            "# traces: off: OTEL_TRACES_EXPORTER=none",
            "# OTEL_TRACES_EXPORTER set: they override [telemetry.traces] above",
        ]
    );
    std::fs::write(&config, "").unwrap();
    assert_eq!(
        check(&[]),
        [
            "# traces: off: no collector set (telemetry.traces.otlp_endpoint, OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)"
        ]
    );
}

/// A collector on port 0 (no collector listens there: `serve` would drop
/// every span) stops `check-config`, from the file or a variable, naming
/// it; an endpoint too long for the exporter says so, not that it holds a
/// user name or password. Neither is quoted.
/// A FIFO where the data file goes: `check-config` (which reads the data
/// file's sources, read-only) says it cannot read it rather than waiting
/// for a writer for ever.
#[test]
fn check_config_with_a_fifo_as_its_data_file_answers_and_says_so() {
    let dir = TempDir::new().unwrap();
    let data = dir.path().join("dedupd.redb");
    crate::support::process::mkfifo(&data);
    let file = dir.path().join("dedupd.toml");
    std::fs::write(
        &file,
        format!(
            "data_path = {:?}\n[sources.sume]\n{}",
            data.display().to_string(),
            crate::support::gateway::settings_toml("http://127.0.0.1:9/hooks", &["s3cret-signing"])
        ),
    )
    .unwrap();
    let out = crate::support::process::unblocked("check-config", move || check_config(&file));
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("not a plain file"), "{text}");
}

#[test]
fn check_config_refuses_a_collector_on_port_0_or_too_long_and_says_which() {
    let dir = TempDir::new().unwrap();
    let config = dir.path().join("dedupd.toml");
    let refused = |endpoint: &str, vars: &[(&str, &str)]| -> String {
        std::fs::write(
            &config,
            format!("[telemetry.traces]\notlp_endpoint = \"{endpoint}\"\n"),
        )
        .unwrap();
        let mut cmd = dedupd();
        cmd.args(["check-config", "--config"]).arg(&config);
        for (name, value) in vars {
            cmd.env(name, value);
        }
        let out = cmd.output().unwrap();
        let said = String::from_utf8_lossy(&out.stderr).into_owned()
            + &String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success(), "{vars:?}: {said}");
        assert!(!said.contains("# traces: exported"), "{said}");
        assert!(!said.contains("s3cret"), "{said}");
        said
    };
    let said = refused("http://127.0.0.1:0/?k=s3cret", &[]);
    assert!(said.contains("telemetry.traces.otlp_endpoint"), "{said}");
    assert!(said.contains("must not name port 0"), "{said}");
    let said = refused(
        "http://127.0.0.1:4318",
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:0?k=s3cret")],
    );
    assert!(
        said.contains("OTEL_EXPORTER_OTLP_ENDPOINT must not name port 0"),
        "{said}"
    );
    let long = format!("http://127.0.0.1:4318/{}?k=s3cret", "a".repeat(80_000));
    let said = refused(
        "http://127.0.0.1:4318",
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", &long)],
    );
    assert!(
        said.contains("OTEL_EXPORTER_OTLP_ENDPOINT is too long"),
        "{said}"
    );
    assert!(!said.contains("user name"), "{said}");
}

#[test]
fn serve_refuses_a_non_loopback_address_without_tokens_and_says_why() {
    let dir = TempDir::new().unwrap();
    let out = dedupd()
        .arg("serve")
        .current_dir(dir.path())
        .env("DEDUPD_LISTEN", "0.0.0.0:0")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("without API tokens"), "{stderr}");
    assert!(stderr.contains("DEDUPD_LISTEN"), "{stderr}");
    assert!(
        !dir.path().join("dedupd.redb").exists(),
        "nothing was opened"
    );
}

#[test]
fn check_config_names_the_source_and_key_of_each_gateway_mistake() {
    let dir = TempDir::new().unwrap();
    let file = dir.path().join("sources.toml");
    std::fs::write(
        &file,
        r#"
[sources.sume]
scheme = "sume"
event_id = "body:request_id"
stream = "body:/run~2id"
forward_to = "not a url"

[sources.stripe]
scheme = "stripe"
secrets = ["whsec_abc"]
event_id = "header:Stripe Event"
forward_to = "ftp://example.com/x"
destination_secret = "not base64!"
"#,
    )
    .unwrap();
    let out = check_config(&file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    for key in [
        "sources.sume.secrets",
        "sources.sume.event_id",
        "sources.sume.stream",
        "sources.sume.forward_to",
        "sources.sume.destination_secret",
        "sources.stripe.event_id",
        "sources.stripe.forward_to",
        "sources.stripe.destination_secret",
    ] {
        assert!(stderr.contains(key), "{key} missing in:\n{stderr}");
    }
    assert!(stderr.contains("sources.toml"), "{stderr}");
    assert!(
        !stderr.contains("whsec_abc"),
        "secrets never appear in errors"
    );

    std::fs::write(&file, "[sources.x]\nscheme = \"smoke-signals\"\nevent_id = \"body:/id\"\nforward_to = \"http://127.0.0.1:1/\"\n").unwrap();
    let out = check_config(&file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("sources.x.scheme") && stderr.contains("smoke-signals"),
        "{stderr}"
    );
}

#[test]
fn a_valid_source_with_secrets_from_files_passes_check_config_redacted() {
    let dir = TempDir::new().unwrap();
    let secrets = dir.path().join("sume-keys");
    std::fs::write(&secrets, "old-sume-secret\nnew-sume-secret\n").unwrap();
    let dest = dir.path().join("dest");
    std::fs::write(&dest, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n").unwrap();
    let file = dir.path().join("ok.toml");
    std::fs::write(
        &file,
        format!(
            "[sources.sume]\nscheme = \"sume\"\nsecrets_file = {:?}\ndestination_secret_file = {:?}\nevent_id = \"body:/request_id\"\ncreated_at = \"body:/created_at\"\nstream = \"body:/run_id\"\nforward_to = \"http://127.0.0.1:3000/hooks/sume\"\n",
            secrets.display().to_string(),
            dest.display().to_string()
        ),
    )
    .unwrap();
    let out = check_config(&file);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("[sources.sume]"), "{stdout}");
    assert!(
        stdout.contains("max_attempts = 12"),
        "defaults are shown: {stdout}"
    );
    assert!(
        !stdout.contains("sume-secret") && !stdout.contains("MfKQ9"),
        "{stdout}"
    );
}

#[test]
fn check_config_says_what_replaced_gateway_workers() {
    let dir = TempDir::new().unwrap();
    let file = dir.path().join("old.toml");
    std::fs::write(&file, "[gateway]\nworkers = 4\nmax_in_flight = 0\n").unwrap();
    let out = check_config(&file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("gateway.workers")
            && stderr.contains("gateway.max_in_flight")
            && stderr.contains("sources.NAME.max_in_flight"),
        "{stderr}"
    );
    assert!(stderr.contains("must be 1 to 4096"), "{stderr}");
}

#[tokio::test]
async fn check_config_names_removed_sources_that_still_have_pending_events() {
    use crate::support::gateway::{body, gateway_app};
    use crate::support::receiver::{Behaviour, Receiver, eventually};

    let receiver = Receiver::start(Behaviour::Always(503)).await;
    let app = gateway_app(&receiver.url, |s| s.max_attempts = 100).await;
    for id in ["a", "b"] {
        app.ingest_ok(&body(id, id, "2026-11-29T10:00:00Z")).await;
    }
    eventually("both tried", || async { receiver.received().len() >= 2 }).await;
    let (loaded, dir, _) = app.stop().await;
    let file = dir.path().join("no-sources.toml");
    std::fs::write(
        &file,
        format!(
            "data_path = {:?}\n",
            loaded.settings.data_path.display().to_string()
        ),
    )
    .unwrap();
    let out = check_config(&file);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("removed source sume: 2 pending event(s)"),
        "{stdout}"
    );
}

#[test]
fn check_config_refuses_settings_that_open_holes_and_says_why() {
    let dir = TempDir::new().unwrap();
    let file = dir.path().join("holes.toml");
    std::fs::write(
        &file,
        r#"
[claims]
max_ttl = "4000d"

[storage]
checkpoint_idle = "5ms"
commit_hold = "1s"
max_key_memory_bytes = 10000000000000000

[sources.sume]
scheme = "sume"
secrets = ["sume-secret"]
tolerance = "500ms"
event_id = "header:X-Sume-Event-Id"
stream = "header:X-Run"
forward_to = "http://127.0.0.1:3000/hooks"
destination_secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

[sources.sw]
scheme = "standard-webhooks"
secrets = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]
tolerance = "2h"
event_id = "header:webhook-id"
forward_to = "http://127.0.0.1:3000/hooks"
destination_secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
"#,
    )
    .unwrap();
    let out = check_config(&file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    for (key, why) in [
        ("claims.max_ttl", "3650 days"),
        ("sources.sume.event_id", "not covered by the sume signature"),
        ("sources.sume.stream", "not covered by the sume signature"),
        ("sources.sume.tolerance", "must be 1s to 1h"),
        ("sources.sw.tolerance", "must be 1s to 1h"),
        ("storage.checkpoint_idle", "must be 10ms to 1h"),
        ("storage.commit_hold", "must be 0s to 100ms"),
        (
            "storage.max_key_memory_bytes",
            "must be 0 (automatic) or 1024 to 1125899906842624 (1 PiB)",
        ),
    ] {
        assert!(
            stderr.lines().any(|l| l.contains(key) && l.contains(why)),
            "{key}: {why} missing in:\n{stderr}"
        );
    }
    assert!(
        !stderr.contains("sources.sw.event_id"),
        "webhook-id is signed by standard-webhooks: {stderr}"
    );
}

/// A source table for the bounds below, with `extra` lines.
fn bounded_source(extra: &str) -> String {
    format!(
        "[sources.s]\nscheme = \"sume\"\nsecrets = [\"sume-secret-0123\"]\n\
         event_id = \"body:/id\"\nforward_to = \"http://127.0.0.1:3000/hooks\"\n\
         destination_secret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n{extra}\n"
    )
}

/// Every number check-config accepts, serve runs with. Each bound below
/// was a value that passed check-config and then made serve panic (a
/// writer batch of i64::MAX: `capacity overflow`, the process left
/// answering 503), abort (a queue or batch allocated up front), refuse to
/// start (a dedupe window past what the file stores in ms), let one client
/// make it buffer any body, or write expiries Redis cannot take. Each is
/// refused with its key and its range, and its largest value is accepted.
#[test]
fn check_config_bounds_every_number_that_serve_could_not_run_with() {
    let dir = TempDir::new().unwrap();
    // (the setting's TOML past its bound, the key, the range named, the
    // TOML at its bound)
    let cases: [(String, &str, &str, String); 17] = [
        (
            "[storage]\nmax_batch = 9223372036854775807".into(),
            "storage.max_batch",
            "must be 1 to 65536",
            "[storage]\nmax_batch = 65536".into(),
        ),
        (
            "[storage]\nmax_batch = 65537".into(),
            "storage.max_batch",
            "must be 1 to 65536",
            "[storage]\nmax_batch = 1".into(),
        ),
        (
            "[storage]\nqueue_capacity = 2305843009213693952".into(),
            "storage.queue_capacity",
            "must be 1 to 1000000",
            "[storage]\nqueue_capacity = 1000000".into(),
        ),
        (
            "[http]\nmax_body_bytes = 16777217".into(),
            "http.max_body_bytes",
            "must be 1024 to 16777216",
            "[http]\nmax_body_bytes = 16777216".into(),
        ),
        (
            "[ordering]\nretention = \"3651d\"".into(),
            "ordering.retention",
            "must be 1ms to 3650d",
            "[ordering]\nretention = \"3650d\"".into(),
        ),
        (
            "[gateway]\ndelivered_retention = \"3651d\"".into(),
            "gateway.delivered_retention",
            "must be 1ms to 3650d",
            "[gateway]\ndelivered_retention = \"3650d\"".into(),
        ),
        (
            "[gateway]\ndead_retention = \"500000000000y\"".into(),
            "gateway.dead_retention",
            "must be 1ms to 3650d",
            "[gateway]\ndead_retention = \"3650d\"".into(),
        ),
        (
            bounded_source("delivered_retention = \"3651d\""),
            "sources.s.delivered_retention",
            "must be 1ms to 3650d",
            bounded_source("delivered_retention = \"3650d\""),
        ),
        (
            bounded_source("dead_retention = \"0s\""),
            "sources.s.dead_retention",
            "must be 1ms to 3650d",
            bounded_source("dead_retention = \"1ms\""),
        ),
        (
            "[gateway]\ndedupe_window = \"500000000000y\"".into(),
            "gateway.dedupe_window",
            "must be at most 3650d",
            "[gateway]\ndedupe_window = \"3650d\"".into(),
        ),
        (
            "[reaper]\nbatch_size = 9223372036854775807".into(),
            "reaper.batch_size",
            "must be 1 to 100000",
            "[reaper]\nbatch_size = 100000".into(),
        ),
        (
            "[storage.redis]\nexpiry_slack = \"2d\"".into(),
            "storage.redis.expiry_slack",
            "must be at most 1d",
            "[storage.redis]\nexpiry_slack = \"1d\"".into(),
        ),
        (
            "[storage.redis]\nconnect_timeout = \"500000000000y\"".into(),
            "storage.redis.connect_timeout",
            "must be more than 0 and at most 1h",
            "[storage.redis]\nconnect_timeout = \"1h\"".into(),
        ),
        (
            "[storage.redis]\nresponse_timeout = \"2h\"".into(),
            "storage.redis.response_timeout",
            "must be more than 0 and at most 1h",
            "[storage.redis]\nresponse_timeout = \"1h\"".into(),
        ),
        (
            "[storage.redis]\nresponse_timeout = \"0s\"".into(),
            "storage.redis.response_timeout",
            "must be more than 0 and at most 1h",
            "[storage.redis]\nresponse_timeout = \"1ms\"".into(),
        ),
        (
            bounded_source("backoff_max = \"31d\""),
            "sources.s.backoff_max",
            "must be at most 30d",
            bounded_source("backoff_max = \"30d\""),
        ),
        (
            bounded_source("forward_timeout = \"500000000000y\""),
            "sources.s.forward_timeout",
            "must be more than 0 and at most 1h",
            bounded_source("forward_timeout = \"1h\""),
        ),
    ];
    for (i, (past, key, range, at)) in cases.iter().enumerate() {
        let file = dir.path().join(format!("past{i}.toml"));
        std::fs::write(&file, past).unwrap();
        let out = check_config(&file);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{past}: {stderr}");
        assert!(
            stderr.lines().any(|l| l.contains(key) && l.contains(range)),
            "{past}: {key}: {range} missing in:\n{stderr}"
        );
        let file = dir.path().join(format!("at{i}.toml"));
        std::fs::write(&file, at).unwrap();
        let out = check_config(&file);
        assert!(
            out.status.success(),
            "{at}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The report's cases through `serve` itself: a clear error and exit 1, not
/// a writer thread that panics while `/healthz` says 200, nor an abort; and
/// a dedupe window with a fraction of a millisecond (the file keeps whole
/// ms) serves, where it once refused to start.
#[tokio::test]
async fn serve_refuses_what_it_could_not_run_with_and_runs_what_check_config_accepts() {
    let dir = TempDir::new().unwrap();
    for (setting, key) in [
        (
            "[storage]\nmax_batch = 9223372036854775807",
            "storage.max_batch",
        ),
        (
            "[storage]\nmax_batch = 100000000000000",
            "storage.max_batch",
        ),
        (
            "[storage]\nqueue_capacity = 2305843009213693952",
            "storage.queue_capacity",
        ),
    ] {
        let file = dir.path().join("serve.toml");
        std::fs::write(&file, format!("listen = \"127.0.0.1:0\"\n{setting}\n")).unwrap();
        let mut child = dedupd()
            .args(["serve", "--config"])
            .arg(&file)
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // It used to keep running (a writer that panicked, every write
        // answered 503): waited for, up to a generous deadline.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("serve with {setting} was still running after 30 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{setting}: {stderr}");
        assert!(stderr.contains(key), "{setting}: {stderr}");
        assert!(!stderr.contains("panicked"), "{setting}: {stderr}");
        assert!(!dir.path().join("dedupd.redb").exists(), "nothing opened");
    }
    let file = dir.path().join("window.toml");
    std::fs::write(
        &file,
        format!(
            "data_path = {:?}\n[gateway]\ndedupe_window = \"30d 1ms 500us\"\n",
            dir.path().join("w.redb").display().to_string()
        ),
    )
    .unwrap();
    assert!(check_config(&file).status.success());
    let (child, port, drain) = serve_config(&file);
    let res = crate::support::http::client()
        .get(format!("http://127.0.0.1:{port}/readyz"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert!(stop(child, "-TERM", drain).await.success());
}

/// A dedupe window that a replay within a source's `tolerance` could
/// outlive is refused, naming the key, the source and both values; for a
/// source without a signed timestamp (github) only the minute counts.
#[test]
fn check_config_refuses_a_dedupe_window_shorter_than_twice_a_tolerance() {
    let dir = TempDir::new().unwrap();
    let file = dir.path().join("window.toml");
    let config = |window: &str| {
        format!(
            r#"
[gateway]
dedupe_window = "{window}"

[sources.sw]
scheme = "standard-webhooks"
secrets = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]
tolerance = "1h"
event_id = "header:webhook-id"
forward_to = "http://127.0.0.1:3000/hooks"
destination_secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

[sources.gh]
scheme = "github"
secrets = ["github-secret"]
tolerance = "1h"
event_id = "body:/id"
forward_to = "http://127.0.0.1:3000/hooks"
destination_secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
"#
        )
    };
    std::fs::write(&file, config("2h")).unwrap();
    let out = check_config(&file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.contains("gateway.dedupe_window"))
        .unwrap_or_else(|| panic!("gateway.dedupe_window missing in:\n{stderr}"));
    for part in ["window.toml", "2h", "sources.sw.tolerance", "1h", "2h 1m"] {
        assert!(line.contains(part), "{part} missing in: {line}");
    }
    assert!(
        !stderr.contains("sources.gh"),
        "github signs no timestamp: {stderr}"
    );

    std::fs::write(&file, config("2h 1m")).unwrap();
    let out = check_config(&file);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("dedupe_window = \"2h 1m\""),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    std::fs::write(&file, "[gateway]\ndedupe_window = \"59s\"\n").unwrap();
    let out = check_config(&file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("gateway.dedupe_window") && l.contains("at least 1m")),
        "{stderr}"
    );
}

/// A `tolerance` set for a scheme that signs no timestamp bounds nothing:
/// `check-config` accepts it and says so, naming the key and the file.
#[test]
fn check_config_warns_that_a_tolerance_does_nothing_where_no_timestamp_is_signed() {
    let dir = TempDir::new().unwrap();
    let file = dir.path().join("untimed.toml");
    std::fs::write(
        &file,
        r#"
[sources.sw]
scheme = "standard-webhooks"
secrets = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]
tolerance = "10m"
event_id = "header:webhook-id"
forward_to = "http://127.0.0.1:3000/hooks"
destination_secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

[sources.gh]
scheme = "github"
secrets = ["github-secret"]
tolerance = "5m"
event_id = "body-sha256"
forward_to = "http://127.0.0.1:3000/hooks"
destination_secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
"#,
    )
    .unwrap();
    let out = check_config(&file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let warning = stderr
        .lines()
        .find(|l| l.starts_with("warning: sources.gh.tolerance"))
        .unwrap_or_else(|| panic!("no warning about sources.gh.tolerance in:\n{stderr}"));
    for part in ["untimed.toml", "github signs no timestamp", "dedupe_window"] {
        assert!(warning.contains(part), "{part} missing in: {warning}");
    }
    assert!(!stderr.contains("sources.sw.tolerance"), "{stderr}");
}

#[test]
fn check_config_refuses_a_rate_limit_it_cannot_read_and_a_burst_without_one() {
    let dir = TempDir::new().unwrap();
    let file = dir.path().join("rates.toml");
    let source = |name: &str, extra: &str| {
        format!(
            "[sources.{name}]\nscheme = \"sume\"\nsecrets = [\"sume_test_secret\"]\nevent_id = \"body:/id\"\nforward_to = \"http://127.0.0.1:1/\"\ndestination_secret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n{extra}\n"
        )
    };
    std::fs::write(&file, source("a", "rate_limit = \"50/d\"")).unwrap();
    let out = check_config(&file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("rate_limit") && stderr.contains("N/s, N/m or N/h"),
        "{stderr}"
    );

    std::fs::write(&file, source("b", "rate_burst = 10")).unwrap();
    let out = check_config(&file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("sources.b.rate_burst") && stderr.contains("needs rate_limit"),
        "{stderr}"
    );

    std::fs::write(
        &file,
        source("c", "rate_limit = \"600/m\"\nrate_burst = 20"),
    )
    .unwrap();
    let out = check_config(&file);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("rate_limit = \"600/m\""));
}

#[test]
fn check_config_takes_several_destination_secrets_from_one_place_and_names_a_bad_entry() {
    const NEW: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
    const OLD: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let dir = TempDir::new().unwrap();
    let file = dir.path().join("rotation.toml");
    let keys = dir.path().join("destination-keys");
    let source = |extra: &str| {
        format!(
            "[sources.s]\nscheme = \"sume\"\nsecrets = [\"sume_test_secret\"]\nevent_id = \"body:/id\"\nforward_to = \"http://127.0.0.1:1/\"\n{extra}\n"
        )
    };
    let check = |extra: &str| {
        std::fs::write(&file, source(extra)).unwrap();
        let out = check_config(&file);
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        );
        for secret in [NEW, OLD] {
            let key = &secret["whsec_".len()..];
            assert!(
                !stdout.contains(key) && !stderr.contains(key),
                "{stdout}{stderr}"
            );
        }
        (out.status.success(), stdout, stderr)
    };
    let refused = |extra: &str, what: &[&str]| {
        let (ok, _, stderr) = check(extra);
        assert!(!ok, "{extra}: accepted");
        let line = stderr
            .lines()
            .find(|l| what.iter().all(|w| l.contains(w)))
            .unwrap_or_else(|| panic!("{extra}: no line with {what:?} in:\n{stderr}"));
        assert!(line.contains("rotation.toml"), "{line}");
    };

    let (ok, stdout, stderr) = check(&format!("destination_secrets = [{NEW:?}, {OLD:?}]"));
    assert!(ok, "{stderr}");
    let section = stdout
        .split("[sources.s]")
        .nth(1)
        .and_then(|rest| rest.split("\n[").next())
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(section.contains("destination_secrets = ["), "{stdout}");
    assert_eq!(
        section.matches("\"<redacted>\"").count(),
        3,
        "the provider's secret and both destination secrets: {stdout}"
    );
    std::fs::write(
        &keys,
        format!("# new, since 2027-01-10\n{NEW}\n\n# old\n{OLD}\n"),
    )
    .unwrap();
    let (ok, _, stderr) = check(&format!("destination_secret_file = {keys:?}"));
    assert!(ok, "{stderr}");

    refused(
        &format!("destination_secret = {OLD:?}\ndestination_secrets = [{NEW:?}, {OLD:?}]"),
        &[
            "sources.s.destination_secrets:",
            "not both destination_secret and destination_secrets",
        ],
    );
    refused(
        &format!("destination_secret = {OLD:?}\ndestination_secret_file = {keys:?}"),
        &[
            "sources.s.destination_secret_file:",
            "not both destination_secret and destination_secret_file",
        ],
    );
    let nine: Vec<String> = "ABCDEFGHI"
        .chars()
        .map(|c| format!("\"whsec_{}\"", c.to_string().repeat(32)))
        .collect();
    refused(
        &format!("destination_secrets = [{}]", nine.join(", ")),
        &[
            "sources.s.destination_secrets:",
            "at most 8 secrets (got 9)",
        ],
    );
    refused(
        &format!("destination_secrets = [{NEW:?}, \"whsec_not base64!\"]"),
        &[
            "sources.s.destination_secrets:",
            "entry 1 (counting from 0): expected whsec_<base64>",
        ],
    );
    refused(
        &format!("destination_secrets = [{NEW:?}, {OLD:?}, {NEW:?}]"),
        &[
            "sources.s.destination_secrets:",
            "entry 2 (counting from 0): the same key as entry 0",
        ],
    );
    std::fs::write(&keys, format!("{NEW}\n# a comment\nwhsec_\n")).unwrap();
    refused(
        &format!("destination_secret_file = {keys:?}"),
        &[
            "sources.s.destination_secret_file:",
            "secret 2 of the file (blank lines and # comments not counted): expected whsec_",
        ],
    );
    std::fs::write(&keys, "# nothing yet\n\n").unwrap();
    refused(
        &format!("destination_secret_file = {keys:?}"),
        &["sources.s.destination_secret_file:", "holds no secret"],
    );
    refused(
        "",
        &[
            "sources.s.destination_secret:",
            "missing",
            "destination_secrets",
        ],
    );
}

#[test]
fn check_config_refuses_a_redis_durability_it_cannot_read_or_give() {
    let dir = TempDir::new().unwrap();
    let file = dir.path().join("dedupd.toml");
    let refused = |toml: &str, what: &[&str]| {
        std::fs::write(&file, toml).unwrap();
        let out = check_config(&file);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "{toml}: accepted");
        for w in what {
            assert!(stderr.contains(w), "{toml}: {stderr}");
        }
    };
    refused(
        "[storage.redis]\ndurability = \"always\"\n",
        &["storage.redis.durability", "\"replicas = N\""],
    );
    refused(
        "[storage.redis]\ndurability = \"replicas = 0\"\n",
        &["storage.redis.durability", "from 1 to 16"],
    );
    refused(
        "[storage.redis]\ndurability = \"replicas = 1\"\nreplicas_timeout = \"2s\"\nresponse_timeout = \"2s\"\n",
        &[
            "storage.redis.replicas_timeout",
            "less than storage.redis.response_timeout",
        ],
    );
    std::fs::write(
        &file,
        "[storage.redis]\ndurability = \"replicas = 2\"\nreplicas_timeout = \"250ms\"\n",
    )
    .unwrap();
    let out = check_config(&file);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("durability = \"replicas = 2\""), "{shown}");
}

/// Sentinel URLs are checked only where Redis support is built in.
#[cfg(feature = "redis")]
#[test]
fn check_config_refuses_sentinels_it_cannot_use() {
    let dir = TempDir::new().unwrap();
    let file = dir.path().join("dedupd.toml");
    let refused = |toml: &str, what: &[&str]| {
        std::fs::write(&file, toml).unwrap();
        let out = check_config(&file);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "{toml}: accepted");
        for w in what {
            assert!(stderr.contains(w), "{toml}: {stderr}");
        }
    };
    let redis = "[storage]\nbackend = \"redis\"\n[storage.redis]\n";
    refused(
        &format!("{redis}sentinels = [\"not a url\"]\n"),
        &["storage.redis.sentinels", "redis:// URL"],
    );
    refused(
        &format!(
            "{redis}sentinels = [\"redis://127.0.0.1:26379\"]\n\
             cluster_nodes = [\"redis://127.0.0.1:7000\"]\n"
        ),
        &["storage.redis.sentinels", "not both"],
    );
    refused(
        &format!("{redis}sentinels = [\"redis://127.0.0.1:26379\"]\nsentinel_master = \" \"\n"),
        &["storage.redis.sentinel_master", "must name the master"],
    );
}

/// A secret file that cannot be read is one mistake: it was also reported
/// as empty (`holds no secret`, `no signing secret`), which sent the
/// operator looking at the file's lines. Each case has exactly one error.
#[test]
fn an_unreadable_secret_file_is_reported_once() {
    let dir = TempDir::new().unwrap();
    let file = dir.path().join("dedupd.toml");
    let missing = dir.path().join("no-such-file");
    for (secrets, destination, key) in [
        (
            "secrets = [\"sume_test_secret\"]".to_owned(),
            format!("destination_secret_file = {missing:?}"),
            "sources.s.destination_secret_file:",
        ),
        (
            format!("secrets_file = {missing:?}"),
            "destination_secret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"".to_owned(),
            "sources.s.secrets_file:",
        ),
    ] {
        std::fs::write(
            &file,
            format!(
                "[sources.s]\nscheme = \"sume\"\n{secrets}\n{destination}\nevent_id = \
                 \"body:/id\"\nforward_to = \"http://127.0.0.1:1/\"\n"
            ),
        )
        .unwrap();
        let out = check_config(&file);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{key}: accepted");
        let errors: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("invalid setting"))
            .collect();
        assert_eq!(errors.len(), 1, "{key}: {stderr}");
        assert!(
            errors[0].contains(key) && errors[0].contains("cannot read"),
            "{stderr}"
        );
    }
}

/// What check-config prints is a configuration it accepts: a source's
/// secret files were printed with their lines merged into `secrets` and
/// `destination_secrets` (as `<redacted>`), and that output, fed back,
/// was refused (destination_secrets and destination_secret_file both set).
#[test]
fn the_printed_settings_of_secret_files_read_back() {
    let dir = TempDir::new().unwrap();
    let secrets = dir.path().join("sume-keys");
    std::fs::write(&secrets, "old-sume-secret\nnew-sume-secret\n").unwrap();
    let dest = dir.path().join("dest");
    std::fs::write(&dest, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n").unwrap();
    let file = dir.path().join("given.toml");
    std::fs::write(
        &file,
        format!(
            "[sources.s]\nscheme = \"sume\"\nsecrets_file = {secrets:?}\n\
             destination_secret_file = {dest:?}\nevent_id = \"body:/id\"\n\
             forward_to = \"http://127.0.0.1:1/\"\n"
        ),
    )
    .unwrap();
    let out = check_config(&file);
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(printed.contains("secrets_file = "), "{printed}");
    assert!(printed.contains("destination_secret_file = "), "{printed}");
    let section = printed
        .split("[sources.s]")
        .nth(1)
        .and_then(|rest| rest.split("\n[").next())
        .unwrap_or_else(|| panic!("{printed}"));
    assert!(
        !section.contains("<redacted>"),
        "no inline secret was given: {printed}"
    );

    let again = dir.path().join("printed.toml");
    std::fs::write(&again, &printed).unwrap();
    let out = check_config(&again);
    assert!(
        out.status.success(),
        "{printed}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reprinted = String::from_utf8_lossy(&out.stdout);
    assert_eq!(reprinted, printed);
}

#[test]
fn check_config_refuses_a_source_named_for_the_alerts_and_names_a_bad_alerts_key() {
    let dir = TempDir::new().unwrap();
    let file = dir.path().join("alerts.toml");
    std::fs::write(
        &file,
        r#"
[sources.dedupd-alerts]
scheme = "sume"
secrets = ["s"]
event_id = "body:/id"
forward_to = "http://127.0.0.1:1/"

[alerts]
forward_to = "ftp://example.com/x"
destination_secret = "not base64!"
"#,
    )
    .unwrap();
    let out = check_config(&file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("sources.dedupd-alerts") && stderr.contains("dedupd's own source"),
        "{stderr}"
    );

    std::fs::write(
        &file,
        "[alerts]\nforward_to = \"ftp://example.com/x\"\ndestination_secret = \"not base64!\"\n",
    )
    .unwrap();
    let out = check_config(&file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    for key in ["alerts.forward_to", "alerts.destination_secret"] {
        assert!(stderr.contains(key), "{key} missing in:\n{stderr}");
    }
    assert!(stderr.contains("alerts.toml"), "{stderr}");

    std::fs::write(
        &file,
        "[alerts]\nforward_to = \"http://127.0.0.1:9/alerts\"\n\
         destination_secret = \"whsec_QWxlcnRzU2lnbmluZ1NlY3JldDEyMzQ1Ng==\"\n\
         destination_secrets = [\"whsec_QWxlcnRzU2lnbmluZ1NlY3JldDEyMzQ1Ng==\"]\n\
         every = \"0s\"\nbacklog_after = \"1s\"\n",
    )
    .unwrap();
    let out = check_config(&file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("alerts.destination_secrets") && stderr.contains("not both"),
        "{stderr}"
    );
    for key in ["alerts.every", "alerts.backlog_after"] {
        assert!(stderr.contains(key), "{key} missing in:\n{stderr}");
    }

    std::fs::write(
        &file,
        "[alerts]\nforward_to = \"http://127.0.0.1:9/alerts\"\n\
         destination_secret = \"whsec_QWxlcnRzU2lnbmluZ1NlY3JldDEyMzQ1Ng==\"\nevery = \"1m\"\n",
    )
    .unwrap();
    let out = check_config(&file);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("[alerts]"), "{stdout}");
    assert!(
        !stdout.contains("QWxlcnRz"),
        "the secret is redacted: {stdout}"
    );
}

#[test]
fn check_config_refuses_forwarding_a_header_dedupd_sets_itself() {
    let dir = TempDir::new().unwrap();
    let file = dir.path().join("reserved.toml");
    // A provider's header of one of these names would pose as dedupd's:
    // `dedupd-replay` says a bulk job sent the event again.
    for name in ["dedupd-attempt", "Dedupd-Replay"] {
        std::fs::write(
            &file,
            bounded_source(&format!("forward_headers = [\"content-type\", \"{name}\"]")),
        )
        .unwrap();
        let out = check_config(&file);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name}: {stderr}");
        assert!(
            stderr
                .lines()
                .any(|l| l.contains("sources.s.forward_headers") && l.contains("set by dedupd")),
            "{name}: {stderr}"
        );
    }
    std::fs::write(
        &file,
        bounded_source("forward_headers = [\"content-type\", \"x-request-id\"]"),
    )
    .unwrap();
    let out = check_config(&file);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A token or secrets file that is not a plain file is refused at once,
/// by name: a FIFO nobody writes used to hang `check-config`, the start
/// and a reload (and then the stop, waiting on the reload), and
/// `/dev/zero` grew the process's memory until the kernel killed it.
#[test]
fn a_secrets_file_that_is_a_fifo_or_a_device_is_refused_at_once() {
    let dir = TempDir::new().unwrap();
    let fifo = dir.path().join("fifo");
    crate::support::process::mkfifo(&fifo);
    let file = dir.path().join("dedupd.toml");
    std::fs::write(
        &file,
        format!(
            "[api]\ntokens_file = \"/dev/zero\"\n[sources.s]\nscheme = \"sume\"\nsecrets_file = \
             {fifo:?}\nevent_id = \"body:/id\"\nforward_to = \"http://127.0.0.1:1/\"\n"
        ),
    )
    .unwrap();
    let out = check_config(&file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "accepted: {stderr}");
    for (key, kind) in [
        ("api.tokens_file", "not a plain file (a device)"),
        ("sources.s.secrets_file", "not a plain file (a FIFO)"),
    ] {
        assert!(
            stderr.lines().any(|l| l.contains(key) && l.contains(kind)),
            "{key}: {stderr}"
        );
    }
}
