//! Clients nobody here wrote: the `redis` crate, redis-cli, and redis-py
//! running the article's own code, unchanged.

use super::resp_addr;
use super::spawn_resp_app;
use super::spawn_resp_app_at;
use crate::support::app::T0;
use crate::support::app::with_tokens;
/// The token the authenticated tests use.
const TOKEN: &str = "client-test-token-0123456789";

#[tokio::test]
async fn the_redis_crate_runs_the_recipe_over_resp2_and_resp3_and_pipelines() {
    let app = spawn_resp_app().await;
    let addr = resp_addr(&app);
    for url in [
        format!("redis://{addr}/"),
        format!("redis://{addr}/?protocol=resp3"),
    ] {
        let client = redis::Client::open(url.as_str()).unwrap();
        let mut con = client.get_multiplexed_async_connection().await.unwrap();
        let key = format!("sume:wh:{url}");
        let claim = || {
            redis::cmd("SET")
                .arg(&key)
                .arg("processing")
                .arg("NX")
                .arg("EX")
                .arg(300)
                .clone()
        };
        let first: Option<String> = claim().query_async(&mut con).await.unwrap();
        let second: Option<String> = claim().query_async(&mut con).await.unwrap();
        assert_eq!((first.as_deref(), second), (Some("OK"), None), "{url}");
        let () = redis::cmd("SET")
            .arg(&key)
            .arg("done")
            .arg("EX")
            .arg(86_400)
            .query_async(&mut con)
            .await
            .unwrap();
        let (value, ttl): (String, i64) = redis::pipe()
            .cmd("GET")
            .arg(&key)
            .cmd("TTL")
            .arg(&key)
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!((value.as_str(), ttl), ("done", 86_400), "{url}");
        let deleted: i64 = redis::cmd("DEL")
            .arg(&key)
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(deleted, 1);
        let missing: Option<String> = redis::cmd("GET")
            .arg(&key)
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(missing, None);
        let err = redis::cmd("FLUSHALL")
            .query_async::<()>(&mut con)
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("unknown command 'FLUSHALL'"),
            "{err}"
        );
        let pong: String = redis::cmd("PING").query_async(&mut con).await.unwrap();
        assert_eq!(pong, "PONG", "the connection stays usable");
    }
}

#[tokio::test]
async fn the_redis_crate_authenticates_with_a_token_and_is_refused_without() {
    let app = spawn_resp_app_at(T0, |l| with_tokens(l, &[TOKEN])).await;
    let addr = resp_addr(&app);
    for proto in ["", "?protocol=resp3"] {
        let client = redis::Client::open(format!("redis://:{TOKEN}@{addr}/{proto}")).unwrap();
        let mut con = client.get_multiplexed_async_connection().await.unwrap();
        let ok: String = redis::cmd("SET")
            .arg("k")
            .arg("v")
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(ok, "OK");

        let client = redis::Client::open(format!("redis://{addr}/{proto}")).unwrap();
        let refused = match client.get_multiplexed_async_connection().await {
            Err(e) => e.to_string(),
            Ok(mut con) => redis::cmd("GET")
                .arg("k")
                .query_async::<Option<String>>(&mut con)
                .await
                .unwrap_err()
                .to_string(),
        };
        assert!(refused.contains("NOAUTH"), "{proto}: {refused}");

        let client = redis::Client::open(format!("redis://:wrong@{addr}/{proto}")).unwrap();
        let err = client.get_multiplexed_async_connection().await.unwrap_err();
        // The crate words it by protocol: its own kind, or the server's code.
        assert!(
            err.kind() == redis::ErrorKind::AuthenticationFailed
                || err.to_string().contains("WRONGPASS"),
            "{err}"
        );
    }
}

/// Runs redis-cli with `args` (off the async threads, which serve the app).
#[cfg(feature = "redis")]
async fn redis_cli(args: Vec<String>, stdin: Option<&'static str>) -> (bool, String) {
    tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut child = std::process::Command::new("redis-cli")
            .args(&args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("redis-cli");
        let mut input = child.stdin.take().unwrap();
        input
            .write_all(stdin.unwrap_or_default().as_bytes())
            .unwrap();
        drop(input);
        let out = child.wait_with_output().unwrap();
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    })
    .await
    .unwrap()
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_cli_runs_the_recipe_in_resp2_and_resp3() {
    let app = spawn_resp_app().await;
    let port = app.resp_port.unwrap().to_string();
    let cli = |extra: &[&str]| -> Vec<String> {
        ["-p", &port]
            .iter()
            .chain(extra)
            .map(|s| (*s).to_owned())
            .collect()
    };
    for proto in ["-2", "-3"] {
        let key = format!("sume:wh:cli{proto}");
        let set = cli(&[proto, "SET", &key, "processing", "NX", "EX", "300"]);
        assert_eq!(redis_cli(set.clone(), None).await, (true, "OK\n".into()));
        assert_eq!(redis_cli(set, None).await, (true, "\n".into()), "nil");
        let ttl = redis_cli(cli(&[proto, "TTL", &key]), None).await;
        assert_eq!(ttl, (true, "300\n".into()));
        let del = redis_cli(cli(&[proto, "DEL", &key]), None).await;
        assert_eq!(del, (true, "1\n".into()));
    }
    let (ok, out) = redis_cli(cli(&[]), Some("SET a 1\nGET a\nFLUSHALL\nPING\n")).await;
    assert!(ok, "{out}");
    assert_eq!(
        out,
        "OK\n1\nERR unknown command 'FLUSHALL', with args beginning with: \n\nPONG\n"
    );
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_cli_authenticates_with_a_token() {
    let app = spawn_resp_app_at(T0, |l| with_tokens(l, &[TOKEN])).await;
    let port = app.resp_port.unwrap().to_string();
    let args = |extra: &[&str]| -> Vec<String> {
        ["-p", &port]
            .iter()
            .chain(extra)
            .map(|s| (*s).to_owned())
            .collect()
    };
    let (_, out) = redis_cli(args(&["PING"]), None).await;
    assert_eq!(out, "NOAUTH Authentication required.\n\n");
    let (ok, out) = redis_cli(args(&["--no-auth-warning", "-a", TOKEN, "PING"]), None).await;
    assert!(ok);
    assert_eq!(out, "PONG\n");
}

#[test]
fn the_articles_code_here_is_the_articles_code_unchanged() {
    let ours = include_str!("article.py");
    let article = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/background/redis-set-nx-ex-dedupe.txt");
    let Ok(text) = std::fs::read_to_string(&article) else {
        eprintln!("{} not found: nothing to compare with", article.display());
        return;
    };
    assert!(
        text.contains(ours),
        "tests/service/resp/article.py differs from the article's block"
    );
}

/// The article's Python block, unchanged, against dedupd: it prints
/// `True False`. Needs a Python with redis-py: `.ci/run` makes a virtualenv
/// and names its interpreter in `DEDUPD_TEST_PYTHON`.
#[tokio::test]
#[ignore = "needs DEDUPD_TEST_PYTHON (a python with redis-py); .ci/run runs it"]
async fn the_articles_python_code_prints_true_false_against_dedupd() {
    let python = std::env::var("DEDUPD_TEST_PYTHON")
        .expect("DEDUPD_TEST_PYTHON names a python that has redis-py (see .ci/run)");
    let app = spawn_resp_app().await;
    let url = format!("redis://{}", resp_addr(&app));
    let script = app.dir.path().join("article.py");
    std::fs::write(&script, include_str!("article.py")).unwrap();
    for round in 0..2 {
        let (python, url, script) = (python.clone(), url.clone(), script.clone());
        let out = tokio::task::spawn_blocking(move || {
            std::process::Command::new(python)
                .arg(script)
                .env("REDIS_URL", url)
                .output()
                .unwrap()
        })
        .await
        .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // The second run prints the same: the first one released its claim.
        assert_eq!(stdout, "True False\n", "run {round}");
    }
    let mut c = super::Raw::connect(&resp_addr(&app)).await;
    assert_eq!(c.cmd("EXISTS sume:wh:req_demo").await, b":0\r\n");
}
