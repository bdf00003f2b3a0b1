//! The config loader: TOML files and `DEDUPD_*` values through settings
//! loading, validation and the sources' checks, as `check-config` and
//! `serve` run them. Files nest arrays, inline tables, dotted keys and
//! table headers to every depth, set real keys to hostile values, and are
//! not always UTF-8; variables nest their names and values likewise.

use std::path::Path;

use dedupd::config::env::MAX_DEPTH;
use dedupd::config::{ConfigErrors, Loaded, Settings};
use dedupd::gateway::sources::build_sources;
use proptest::prelude::*;
use tempfile::TempDir;

use crate::{bounded, config, hostile_bytes, hostile_text, serial};

/// Keys that exist, so hostile values reach their checks.
const KEYS: &[&str] = &[
    "listen",
    "data_path",
    "log.level",
    "http.workers",
    "http.max_body_bytes",
    "http.body_timeout",
    "api.tokens",
    "api.tokens_file",
    "claims.max_ttl",
    "claims.default_ttl",
    "storage.checkpoint_bytes",
    "storage.redis.url",
    "resp.listen",
    "resp.max_connections",
    "gateway.max_in_flight",
    "sources.s.scheme",
    "sources.s.secrets",
    "sources.s.event_id",
    "sources.s.forward_to",
    "sources.s.tolerance",
    "sources.s.forward_headers",
];

/// A TOML value in hostile shapes.
fn toml_value() -> impl Strategy<Value = String> {
    let nested = (
        prop::sample::select(vec![("[", "]"), ("{a=", "}"), ("[{a=", "}]")]),
        0usize..200,
    )
        .prop_map(|((open, close), n)| format!("{}1{}", open.repeat(n), close.repeat(n)));
    prop_oneof![
        3 => hostile_text().prop_map(|t| toml::Value::String(t).to_string()),
        1 => any::<i64>().prop_map(|n| n.to_string()),
        1 => prop::sample::select(vec![
            "1e999", "-0", "nan", "inf", "18446744073709551616", "\"18446744073709551616s\"",
            "\"99999999999999999999d\"", "\"0s\"", "\"1ns\"", "\"[::]:0\"", "\"0.0.0.0:99999\"",
            "[]", "{}", "true", "1979-05-27T07:32:00Z",
        ]).prop_map(str::to_owned),
        2 => nested,
        1 => (0usize..100_000).prop_map(|n| "[".repeat(n)),
    ]
}

/// TOML text: real keys set to hostile values, nesting of every kind to
/// every depth, and any text.
fn toml_text() -> impl Strategy<Value = Vec<u8>> {
    let assignment = (prop::sample::select(KEYS.to_vec()), toml_value())
        .prop_map(|(k, v)| format!("{k} = {v}\n"));
    let dotted = (0usize..20_000).prop_map(|n| format!("{}b = 1\n", "a.".repeat(n)));
    let header = (0usize..20_000).prop_map(|n| format!("[{}b]\nc = 1\n", "a.".repeat(n)));
    let tables = (0usize..10_000).prop_map(|n| "[[sources]]\n".repeat(n));
    prop_oneof![
        4 => prop::collection::vec(assignment, 1..6).prop_map(|v| v.concat().into_bytes()),
        1 => dotted.prop_map(String::into_bytes),
        1 => header.prop_map(String::into_bytes),
        1 => tables.prop_map(String::into_bytes),
        2 => hostile_bytes(),
    ]
}

/// Loads and checks as `check-config` does (settings, then sources) and
/// renders what it would print.
fn check(fig: &figment::Figment) -> Result<Loaded, ConfigErrors> {
    let loaded = Settings::load_from(fig)?;
    build_sources(&loaded)?;
    let _ = loaded.settings.to_redacted_toml();
    Ok(loaded)
}

fn load_file(path: &Path, text: &[u8]) -> Result<Loaded, ConfigErrors> {
    std::fs::write(path, text).unwrap();
    check(&Settings::figment_with_env(Some(path), Vec::new()))
}

/// Any file is loaded or refused with errors; nesting deeper than the TOML
/// parser's limit (80) is refused, whatever the stack.
#[test]
fn any_config_file_is_loaded_or_refused() {
    let _serial = serial();
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("dedupd.toml");
    proptest!(config(), |(text in toml_text())| {
        bounded(|| {
            let _ = load_file(&path, &text);
            Ok(())
        })?;
    });
}

/// Every kind of nesting, at every depth around the parser's limit: within
/// it the file parses (and its unknown key is named); past it, refused.
#[test]
fn config_nesting_is_refused_past_the_parsers_limit() {
    let _serial = serial();
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("dedupd.toml");
    let kinds = prop::sample::select(vec![0usize, 1, 2, 3]);
    proptest!(config(), |(kind in kinds, depth in 1usize..200)| {
        bounded(|| {
            let text = match kind {
                0 => format!("x = {}1{}\n", "[".repeat(depth), "]".repeat(depth)),
                1 => format!("x = {}1{}\n", "{a=".repeat(depth), "}".repeat(depth)),
                2 => format!("{}b = 1\n", "x.".repeat(depth)),
                _ => format!("[{}b]\nc = 1\n", "x.".repeat(depth)),
            };
            let errors = load_file(&path, text.as_bytes()).unwrap_err().to_string();
            // toml's messages: "recursion limit" (keys), "max recursion
            // depth met" (arrays and inline tables).
            let refused = errors.contains("recursion limit") || errors.contains("recursion depth");
            prop_assert!(errors.contains("unknown field") || refused, "{}", errors);
            if depth > 80 {
                prop_assert!(refused, "{depth}: {errors}");
            }
            Ok(())
        })?;
    });
}

/// A `DEDUPD_*` variable as figment's environment layer names it: a real
/// key or one of many parts, with a hostile value, and how deep its value
/// is known to nest at least (0 when not known).
fn var() -> impl Strategy<Value = (String, String, usize)> {
    let key = prop_oneof![
        4 => prop::sample::select(KEYS.to_vec()).prop_map(str::to_owned),
        1 => (0usize..40_000).prop_map(|n| format!("{}b", "a.".repeat(n))),
        1 => "[a-z_.]{1,40}",
    ];
    // Each opens the levels it names, however many times it is repeated:
    // brackets, and `"` figment reads as a character, inside a word or
    // after a word's `=` rather than as a string that would hide them.
    let deep = [
        ("[", 1),
        ("{a=", 1),
        ("{\"a\"=[", 2),
        ("['\"',", 1),
        ("[a\",", 1),
        ("[a=\",", 1),
        ("[\"]\",", 1),
    ];
    let value = prop_oneof![
        3 => (hostile_text(), Just(0)),
        2 => (toml_value(), Just(0)),
        1 => (prop::sample::select(deep.to_vec()), 0usize..60_000)
            .prop_map(|((open, levels), n)| (open.repeat(n), levels * n)),
    ];
    (key, value).prop_map(|(key, (value, nesting))| (key, value, nesting))
}

/// Any variables are loaded or refused; one nested deeper than
/// [`MAX_DEPTH`] is refused by name before it is parsed (figment's parser
/// recursed into 50 000 `[` until the stack overflowed).
#[test]
fn any_environment_is_loaded_or_refused() {
    let _serial = serial();
    proptest!(config(), |(vars in prop::collection::vec(var(), 0..4))| {
        bounded(|| {
            // Keys with an empty part are skipped, as figment's `Env` does.
            let deepest = vars
                .iter()
                .filter(|(k, _, _)| !k.split('.').any(str::is_empty))
                .map(|(k, _, nesting)| k.split('.').count() + nesting)
                .max()
                .unwrap_or(0);
            let vars = vars.iter().map(|(k, v, _)| (k.clone(), v.clone()));
            let result = check(&Settings::figment_with_env(None, vars.collect::<Vec<_>>()));
            if deepest > MAX_DEPTH {
                let errors = result.unwrap_err().to_string();
                prop_assert!(errors.contains("levels deep"), "{}", errors);
            }
            Ok(())
        })?;
    });
}

/// The deepest variable the guard lets through is parsed on a worker's
/// 2 MiB stack (this test's) in a debug build: the bound leaves room.
#[test]
fn the_deepest_accepted_variable_parses() {
    let _serial = serial();
    let value = format!("{}{}", "[".repeat(MAX_DEPTH - 1), "]".repeat(MAX_DEPTH - 1));
    let errors = check(&Settings::figment_with_env(
        None,
        [("listen".to_owned(), value)],
    ))
    .unwrap_err()
    .to_string();
    assert!(!errors.contains("levels deep"), "{errors}");
    assert!(errors.contains("listen"), "{errors}");
}
