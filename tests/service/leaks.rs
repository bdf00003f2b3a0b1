//! What the real binary prints, logs and leaves on disk: no credential of a
//! URL in check-config's output or in a delivery's log lines, and no data
//! file others can read.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use tempfile::TempDir;

use crate::support::ports::free_port;
use crate::support::process::check_config;
use crate::support::process::dedupd;
use crate::support::process::spawn_serving;
use crate::support::process::stop_logged;
use crate::support::receiver::eventually;
/// The password in the destination's userinfo.
const PASSWORD: &str = "hunter2pass";
/// The API key in its query string.
const API_KEY: &str = "k3y-in-the-query-0123";

/// A config whose one source delivers to a closed port through a URL with
/// a user, a password and an API key in its query; two fast attempts.
fn config_with_credentials(dir: &TempDir) -> std::path::PathBuf {
    let file = dir.path().join("dedupd.toml");
    let forward_to = format!(
        "http://admin:{PASSWORD}@127.0.0.1:{}/hooks?api_key={API_KEY}",
        free_port()
    );
    std::fs::write(
        &file,
        format!(
            "data_path = {:?}\n\
             [sources.sume]\n\
             scheme = \"sume\"\n\
             secrets = [\"sume-signing-secret-0123\"]\n\
             event_id = \"body:/request_id\"\n\
             forward_to = {forward_to:?}\n\
             destination_secret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n\
             max_attempts = 2\n\
             backoff_min = \"10ms\"\n\
             backoff_max = \"20ms\"\n",
            dir.path().join("dedupd.redb").display().to_string()
        ),
    )
    .unwrap();
    file
}

fn assert_no_credentials(what: &str, text: &str) {
    assert!(
        !text.contains(PASSWORD),
        "{what} shows the password:\n{text}"
    );
    assert!(!text.contains(API_KEY), "{what} shows the API key:\n{text}");
}

#[test]
fn check_config_shows_forward_to_without_its_userinfo_and_query() {
    let dir = TempDir::new().unwrap();
    let out = check_config(&config_with_credentials(&dir));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_no_credentials("check-config", &stdout);
    assert_no_credentials("check-config", &String::from_utf8_lossy(&out.stderr));
    // Still says where it delivers, in the settings and the sources' lines.
    assert!(
        stdout.contains("forward_to = \"http://<redacted>@127.0.0.1:"),
        "{stdout}"
    );
    assert!(
        stdout.contains("/ingest/sume -> http://<redacted>@127.0.0.1:"),
        "{stdout}"
    );
    assert!(stdout.contains("/hooks?<redacted>"), "{stdout}");
}

#[test]
fn a_bad_forward_to_is_named_without_its_credentials() {
    let dir = TempDir::new().unwrap();
    let file = config_with_credentials(&dir);
    let text = std::fs::read_to_string(&file)
        .unwrap()
        .replace("http://admin", "ftp://admin");
    std::fs::write(&file, text).unwrap();
    let out = check_config(&file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("sources.sume.forward_to"), "{stderr}");
    assert_no_credentials("check-config's error", &stderr);
}

/// A delivery that fails (the port is closed) until the event is dead:
/// neither its log lines nor its `last_error` carry the URL's credentials.
#[tokio::test]
async fn a_failed_delivery_logs_no_credential_of_its_url() {
    let dir = TempDir::new().unwrap();
    let config = config_with_credentials(&dir);
    let mut cmd = dedupd();
    cmd.args(["serve", "--config"])
        .arg(&config)
        .env("DEDUPD_LISTEN", "127.0.0.1:0");
    let (child, port, drain) = spawn_serving(cmd);
    let base = format!("http://127.0.0.1:{port}");
    let trigger = {
        let (config, base) = (config.clone(), base.clone());
        tokio::task::spawn_blocking(move || {
            dedupd()
                .args(["trigger", "sume", "--config"])
                .arg(&config)
                .args(["--url", &base])
                .output()
                .unwrap()
        })
        .await
        .unwrap()
    };
    assert!(
        trigger.status.success(),
        "{}",
        String::from_utf8_lossy(&trigger.stderr)
    );
    let client = crate::support::http::client();
    let dead = format!("{base}/v1/sources/sume/events?status=dead");
    let list = || async {
        client
            .get(&dead)
            .send()
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap()
    };
    eventually("the event is dead", || async {
        list().await["events"]
            .as_array()
            .is_some_and(|e| e.len() == 1)
    })
    .await;
    let listed = list().await;
    assert_no_credentials("the event's listing", &listed.to_string());
    assert!(
        listed["events"][0]["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("request failed")),
        "{listed}"
    );
    let (status, log) = stop_logged(child, "-TERM", drain).await;
    assert!(status.success());
    let log = log.join("\n");
    assert!(log.contains("delivery failed; will retry"), "{log}");
    assert!(log.contains("dead: every attempt failed"), "{log}");
    assert_no_credentials("the log", &log);
}

/// Outside systemd (no `UMask=0077`) the data file and its log hold
/// webhook bodies and claim tokens: under the usual umask 022 they are
/// still created readable by their owner only.
#[tokio::test]
async fn the_data_file_and_its_log_are_created_for_their_owner_only() {
    let dir = TempDir::new().unwrap();
    let data = dir.path().join("data").join("dedupd.redb");
    let mut cmd = Command::new("/bin/sh");
    for (k, _) in std::env::vars() {
        if k.starts_with("DEDUPD_") || k == "RUST_LOG" {
            cmd.env_remove(k);
        }
    }
    cmd.args(["-c", "umask 022 && exec \"$0\" serve"])
        .arg(env!("CARGO_BIN_EXE_dedupd"))
        .env("DEDUPD_LISTEN", "127.0.0.1:0")
        .env("DEDUPD_DATA_PATH", &data);
    let (child, port, drain) = spawn_serving(cmd);
    // A claim: something of value is on disk now.
    let res = crate::support::http::client()
        .post(format!("http://127.0.0.1:{port}/v1/claims/k"))
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&data), 0o600, "{}", data.display());
    // The write-ahead log's two segments.
    for name in ["dedupd.redb.wal", "dedupd.redb.wal2"] {
        let wal = dir.path().join("data").join(name);
        assert_eq!(mode(&wal), 0o600, "{}", wal.display());
    }
    assert_eq!(
        mode(&dir.path().join("data")),
        0o700,
        "the directory dedupd made for them"
    );
    assert!(stop_logged(child, "-TERM", drain).await.0.success());
}

/// The operator commands name the server they could not use, and reqwest's
/// own errors name the URL: neither shows a `--url`'s userinfo or query.
#[test]
fn operator_errors_name_the_server_without_its_credentials() {
    use std::io::{Read, Write};
    let claims_get = |port: u16| {
        dedupd()
            .args(["claims", "get", "k", "--url"])
            .arg(format!(
                "http://admin:{PASSWORD}@127.0.0.1:{port}/?api_key={API_KEY}"
            ))
            .args(["--token", "operator-token-0123456789"])
            .output()
            .unwrap()
    };
    // Nobody listens.
    let out = claims_get(free_port());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("cannot reach dedupd at http://<redacted>@127.0.0.1:"),
        "{stderr}"
    );
    assert_no_credentials("an unreachable server's error", &stderr);
    // A server that cuts its answer short: reqwest's error names the URL.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut request = [0u8; 4096];
        let _ = conn.read(&mut request).unwrap();
        conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{\"key\"")
            .unwrap();
    });
    let out = claims_get(port);
    server.join().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("reading the answer of"), "{stderr}");
    assert_no_credentials("a cut answer's error", &stderr);
}

/// `dedupd init` writes the API token and the signing secrets: the file is
/// its owner's only under the usual umask too.
#[test]
fn init_writes_its_config_for_its_owner_only() {
    let dir = TempDir::new().unwrap();
    let config = dir.path().join("dedupd.toml");
    let out = Command::new("/bin/sh")
        .args(["-c", "umask 022 && exec \"$0\" init --config \"$1\""])
        .arg(env!("CARGO_BIN_EXE_dedupd"))
        .arg(&config)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mode = std::fs::metadata(&config).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
}

/// A token passed as a string instead of a list (an easy slip, through
/// `DEDUPD_API__TOKENS` above all), any secret of the wrong type, and a
/// TOML syntax error on a secret's line: check-config and serve (whose
/// output goes to the journal) name the key or the line and column, and
/// never the value.
#[test]
fn configuration_errors_name_a_secrets_key_or_line_but_never_its_value() {
    const TOKEN: &str = "SUPERSECRETTOKEN-0123456789abcdef";
    const PROVIDER: &str = "PROVIDERSECRET-abcdef0123";
    const REDIS_PASSWORD: &str = "redispassw0rd-0123";
    const NUMERIC: &str = "918273645546372819";
    let dir = TempDir::new().unwrap();
    let source = |secret_lines: &str| {
        format!(
            "[sources.s]\nscheme = \"sume\"\nevent_id = \"body:/id\"\n\
             forward_to = \"http://127.0.0.1:9/\"\n{secret_lines}\n"
        )
    };
    let base = "listen = \"127.0.0.1:0\"\n";
    /// What goes wrong, the file's text, the environment, and what the
    /// error must name (the key, or the line and column).
    type Case = (
        &'static str,
        String,
        Vec<(&'static str, String)>,
        &'static str,
    );
    let cases: Vec<Case> = vec![
        (
            "a token as a string from the environment",
            base.into(),
            vec![("DEDUPD_API__TOKENS", TOKEN.into())],
            "api.tokens: invalid type: found a string, expected a sequence",
        ),
        (
            "a read-only token as a string from the environment",
            base.into(),
            vec![("DEDUPD_API__READ_TOKENS", TOKEN.into())],
            "(from environment variable DEDUPD_API__READ_TOKENS)",
        ),
        (
            "a token as a string in the file",
            format!("{base}[api]\ntokens = \"{TOKEN}\"\n"),
            vec![],
            "api.tokens",
        ),
        (
            "a number as a token",
            format!("{base}[api]\ntokens = [{NUMERIC}]\n"),
            vec![],
            "api.tokens.0: invalid type: found an integer, expected a string",
        ),
        (
            "the whole api table as a string",
            format!("{base}api = \"{TOKEN}\"\n"),
            vec![],
            "api: invalid type: found a string",
        ),
        (
            "a provider secret as a string",
            format!("{base}{}", source(&format!("secrets = \"{PROVIDER}\""))),
            vec![],
            "sources.s.secrets",
        ),
        (
            "a destination secret as a number",
            format!(
                "{base}{}",
                source(&format!(
                    "secrets = [\"{PROVIDER}\"]\ndestination_secret = {NUMERIC}"
                ))
            ),
            vec![],
            "sources.s.destination_secret",
        ),
        (
            "a Redis node with its password as a string",
            format!(
                "{base}[storage.redis]\ncluster_nodes = \"redis://:{REDIS_PASSWORD}@10.0.0.1:6379\"\n"
            ),
            vec![],
            "storage.redis.cluster_nodes",
        ),
        (
            "a Redis sentinel with its password as a string",
            format!(
                "{base}[storage.redis]\nsentinels = \"redis://:{REDIS_PASSWORD}@10.0.0.1:26379\"\n"
            ),
            vec![],
            "storage.redis.sentinels",
        ),
        (
            "a Redis URL with its password as a list, from the environment",
            base.into(),
            vec![(
                "DEDUPD_STORAGE__REDIS__URL",
                format!("[\"redis://:{REDIS_PASSWORD}@10.0.0.1:6379\", 5]"),
            )],
            "storage.redis.url",
        ),
        (
            "a syntax error on a token's line",
            format!("{base}[api]\ntokens = [\"{TOKEN}\", ]]\n"),
            vec![],
            "TOML syntax error at line 3, column",
        ),
        (
            "a syntax error inside a provider secret",
            format!(
                "{base}{}",
                source(&format!("secrets = [\"{PROVIDER}\\q\"]"))
            ),
            vec![],
            "at line 6, column",
        ),
    ];
    for (i, (what, text, env, named)) in cases.iter().enumerate() {
        let file = dir.path().join(format!("case{i}.toml"));
        std::fs::write(&file, text).unwrap();
        for command in ["check-config", "serve"] {
            let mut cmd = dedupd();
            cmd.args([command, "--config"])
                .arg(&file)
                .current_dir(dir.path());
            for (k, v) in env {
                cmd.env(k, v);
            }
            let out = cmd.output().unwrap();
            let shown = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(out.status.code(), Some(1), "{command}, {what}: {shown}");
            for secret in [TOKEN, PROVIDER, REDIS_PASSWORD, NUMERIC] {
                assert!(
                    !shown.contains(secret),
                    "{command}, {what}: shows the secret:\n{shown}"
                );
            }
            assert!(shown.contains(named), "{command}, {what}: {shown}");
            if env.is_empty() {
                assert!(
                    shown.contains(&format!("case{i}.toml")),
                    "{command}, {what}: {shown}"
                );
            }
        }
    }
    // A setting that is no secret is still shown, to help fix it.
    let file = dir.path().join("plain.toml");
    std::fs::write(&file, format!("{base}[http]\nworkers = \"lots\"\n")).unwrap();
    let out = check_config(&file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("http.workers"), "{stderr}");
    assert!(stderr.contains("\"lots\""), "{stderr}");
}

/// The warning lines of a log: what `serve` logged at `WARN`.
fn warnings(log: &[String]) -> Vec<&String> {
    log.iter()
        .filter(|l| {
            serde_json::from_str::<Value>(l).is_ok_and(|v| v["level"].as_str() == Some("WARN"))
        })
        .collect()
}

/// Starts `serve --config FILE` in `dir`, stops it, and returns its whole
/// log and what `check-config` printed to stderr for the same file.
async fn serve_and_check(dir: &TempDir, config: &std::path::Path) -> (Vec<String>, String) {
    let mut cmd = dedupd();
    cmd.args(["serve", "--config"])
        .arg(config)
        .current_dir(dir.path());
    let (child, _, mut log, drain) = crate::support::process::spawn_serving_logged(cmd, "port");
    let (status, rest) = stop_logged(child, "-TERM", drain).await;
    assert!(status.success());
    log.extend(rest);
    let check = check_config(config);
    assert!(check.status.success());
    (log, String::from_utf8_lossy(&check.stderr).into_owned())
}

/// Tokens and secrets are credentials: a file holding them that its group
/// or others may read gets a warning at start, in serve's log (and from
/// check-config), as the data file does. A settings file without a secret
/// in it (the systemd unit's, whose tokens are a credential) gets none.
#[tokio::test]
async fn serve_warns_of_every_file_of_secrets_or_data_others_may_read() {
    let dir = TempDir::new().unwrap();
    let path = |name: &str| dir.path().join(name);
    let write = |name: &str, text: &str, mode: u32| {
        std::fs::write(path(name), text).unwrap();
        std::fs::set_permissions(path(name), std::fs::Permissions::from_mode(mode)).unwrap();
        path(name).display().to_string()
    };
    let tokens = write("tokens", "file-token-0123456789abc\n", 0o644);
    let readers = write("readers", "read-token-0123456789abc\n", 0o640);
    let signing = write("signing", "provider-secret-0123\n", 0o604);
    let destination = write(
        "destination",
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n",
        0o660,
    );
    let private = write("private", "other-secret-0123\n", 0o600);
    // A data file made before dedupd created them 0600.
    let data = write("dedupd.redb", "", 0o644);
    let source = |name: &str, secrets_file: &str, destination: &str| {
        format!(
            "[sources.{name}]\nscheme = \"sume\"\nsecrets_file = {secrets_file:?}\n\
             event_id = \"body:/id\"\nforward_to = \"http://127.0.0.1:9/\"\n{destination}\n"
        )
    };
    let config = write(
        "dedupd.toml",
        &format!(
            "listen = \"127.0.0.1:0\"\ndata_path = {data:?}\n[api]\n\
             tokens = [\"inline-token-0123456789abc\"]\ntokens_file = {tokens:?}\n\
             read_tokens_file = {readers:?}\n{}{}",
            source(
                "open",
                &signing,
                &format!("destination_secret_file = {destination:?}")
            ),
            source(
                "closed",
                &private,
                "destination_secret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\""
            ),
        ),
        0o644,
    );
    let (log, check) = serve_and_check(&dir, std::path::Path::new(&config)).await;
    let warned = warnings(&log);
    for (file, holds) in [
        (&config, "api.tokens, sources.closed.destination_secret"),
        (&tokens, "api.tokens_file"),
        (&readers, "api.read_tokens_file"),
        (&signing, "sources.open.secrets_file"),
        (&destination, "sources.open.destination_secret_file"),
    ] {
        assert!(
            warned
                .iter()
                .any(|l| l.contains(&format!("\"path\":\"{file}\""))
                    && l.contains(holds)
                    && l.contains("group or others may read it")),
            "no warning for {file} ({holds}): {warned:#?}"
        );
        let line = check.lines().find(|l| l.contains(file.as_str()));
        assert!(
            line.is_some_and(|l| l.starts_with("warning: ") && l.contains(holds)),
            "check-config: {file}: {check}"
        );
    }
    assert!(
        warned
            .iter()
            .any(|l| l.contains(&format!("\"path\":\"{data}\""))
                && l.contains("webhook bodies and claim tokens")),
        "no warning for the data file: {warned:#?}"
    );
    assert!(
        !log.iter()
            .chain(
                check
                    .lines()
                    .map(|l| l.to_owned())
                    .collect::<Vec<_>>()
                    .iter()
            )
            .any(|l| l.contains(&private)),
        "a 0600 file is nobody's business: {warned:#?} {check}"
    );
    assert_eq!(warned.len(), 6, "one each: {warned:#?}");

    // Every file its owner's only, and a settings file holding no secret
    // (its tokens in a file of their own): no warning at all.
    for file in [&tokens, &readers, &signing, &destination, &data] {
        std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let plain = write(
        "plain.toml",
        &format!(
            "listen = \"127.0.0.1:0\"\ndata_path = {data:?}\n[api]\ntokens_file = {tokens:?}\n{}",
            source(
                "open",
                &signing,
                &format!("destination_secret_file = {destination:?}")
            ),
        ),
        0o644,
    );
    let (log, check) = serve_and_check(&dir, std::path::Path::new(&plain)).await;
    assert_eq!(warnings(&log), Vec::<&String>::new());
    assert!(!check.contains("warning"), "{check}");
}

/// The collector's endpoint may carry credentials too: `check-config`
/// shows it without its query, refuses a user name and password in it
/// (the exporter would not send them) without quoting them, and a bad one
/// in the environment stops `serve` with an error that does not quote it.
#[test]
fn the_trace_collectors_endpoint_is_shown_without_its_credentials() {
    let dir = TempDir::new().unwrap();
    let file = config_with_credentials(&dir);
    let base = std::fs::read_to_string(&file).unwrap();
    let with_endpoint = |endpoint: &str| {
        let text = format!("{base}[telemetry.traces]\notlp_endpoint = \"{endpoint}\"\n");
        std::fs::write(&file, text).unwrap();
    };
    with_endpoint(&format!("https://otel.example:4318/?key={API_KEY}"));
    let out = check_config(&file);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert_no_credentials("check-config", &stdout);
    assert!(
        stdout.contains("otlp_endpoint = \"https://otel.example:4318/?<redacted>\""),
        "{stdout}"
    );
    with_endpoint(&format!(
        "https://tenant:{PASSWORD}@otel.example:4318/?key={API_KEY}"
    ));
    let out = check_config(&file);
    let said =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("telemetry.traces.otlp_endpoint"), "{said}");
    assert!(said.contains("OTEL_EXPORTER_OTLP_HEADERS"), "{said}");
    assert_no_credentials("check-config", &said);
    // An endpoint the exporter cannot use, from the environment.
    with_endpoint("https://otel.example:4318");
    let out = dedupd()
        .args(["serve", "--config"])
        .arg(&file)
        .env(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            format!("http://u:{PASSWORD}@exa mple/?k={API_KEY}"),
        )
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT must be"),
        "{stderr}"
    );
    assert_no_credentials("serve", &stderr);
}
