//! The TOML file layer, and what a configuration error may show of a value.
//!
//! The file and the environment hold secrets (API tokens, provider secrets,
//! a Redis password), and `check-config` and `serve` print their errors to
//! the journal. figment's own TOML provider echoes the line of a syntax
//! error (`3 | tokens = ["…", ]]`), and its type errors quote the value
//! (`found string "…", expected a sequence`), which is the secret itself
//! when a token is written as a string instead of a list. So the file is
//! parsed here, and its syntax errors name the line, the column and the
//! parser's message only; and an error about a key that is, holds or is
//! part of a secret says what kind of value was found, not which.

use std::path::{Path, PathBuf};

use figment::error::{Actual, Kind};
use figment::value::{Dict, Map};
use figment::{Metadata, Profile, Provider};

/// The settings file, as figment's `Toml::file_exact` reads it (the same
/// metadata, so errors name it the same way), with errors that do not
/// echo its text.
#[derive(Debug)]
pub(super) struct TomlFile {
    path: PathBuf,
}

impl TomlFile {
    pub(super) fn new(path: &Path) -> Self {
        Self {
            path: path.to_path_buf(),
        }
    }
}

impl Provider for TomlFile {
    fn metadata(&self) -> Metadata {
        Metadata::from("TOML file", self.path.as_path())
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        let text = super::bounded::read_text(&self.path, super::bounded::MAX_SETTINGS_FILE)
            .map_err(|e| format!("cannot read {}: {e}", self.path.display()))?;
        let dict: Dict = toml::from_str(&text).map_err(|e| syntax_error(&text, &e))?;
        Ok(Profile::Default.collect(dict))
    }
}

/// A TOML error by line and column and the parser's message, without the
/// text of the line (which may hold a secret).
fn syntax_error(text: &str, e: &toml::de::Error) -> String {
    // The parser's messages say what it expected ("expected newline, `#`",
    // "recursion limit"), not what it found; any control character is
    // escaped all the same.
    let message = crate::redact::escape_control(e.message().trim()).into_owned();
    let Some(span) = e.span() else {
        return format!("TOML syntax error: {message}");
    };
    let before = text.get(..span.start).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
    format!(
        "TOML syntax error at line {line}, column {column}: {message} (the line is not shown: it \
         may hold a secret)"
    )
}

/// The keys whose values are secrets; `*` matches any source's name.
const SECRET_KEYS: [&[&str]; 8] = [
    &["api", "tokens"],
    &["api", "read_tokens"],
    &["sources", "*", "secrets"],
    &["sources", "*", "destination_secret"],
    &["sources", "*", "destination_secrets"],
    &["storage", "redis", "url"],
    &["storage", "redis", "cluster_nodes"],
    &["storage", "redis", "sentinels"],
];

/// Whether the value at `path` is a secret, part of one (`api.tokens.0`),
/// or a table that holds one (`api`, `sources.NAME`). Errors without a key
/// come from the layers themselves (a file's syntax, a variable nested too
/// deep), whose messages show no value.
fn may_hold_secret(path: &[String]) -> bool {
    !path.is_empty()
        && SECRET_KEYS.iter().any(|key| {
            path.iter()
                .zip(key.iter())
                .all(|(part, k)| *k == "*" || part == k)
        })
}

/// What an error about `path` may say: figment's message as it is, or,
/// where the value may be a secret, one that names the kind of value found
/// but not the value.
pub(super) fn error_message(path: &[String], kind: &Kind) -> String {
    if !may_hold_secret(path) {
        return kind.to_string();
    }
    const HIDDEN: &str = "(the value is not shown: it is a secret)";
    match kind {
        Kind::InvalidType(actual, expected) => {
            format!(
                "invalid type: found {}, expected {expected} {HIDDEN}",
                kind_of(actual)
            )
        }
        Kind::InvalidValue(actual, expected) => {
            format!(
                "invalid value: found {}, expected {expected} {HIDDEN}",
                kind_of(actual)
            )
        }
        Kind::Unsupported(_)
        | Kind::UnsupportedKey(..)
        | Kind::ISizeOutOfRange(_)
        | Kind::USizeOutOfRange(_) => format!("invalid value {HIDDEN}"),
        // Names of keys, counts, and messages written in code (a variable
        // nested too deep names the variable): never a value. A secret is
        // read as a string, whose only errors are the kinds above.
        _ => kind.to_string(),
    }
}

/// The kind of value `actual` is, without the value.
fn kind_of(actual: &Actual) -> &'static str {
    match actual {
        Actual::Bool(_) => "a boolean",
        Actual::Unsigned(_) | Actual::Signed(_) => "an integer",
        Actual::Float(_) => "a float",
        Actual::Char(_) => "a character",
        Actual::Str(_) => "a string",
        Actual::Bytes(_) => "bytes",
        Actual::Unit => "nothing",
        Actual::Seq => "a sequence",
        Actual::Map => "a map",
        _ => "a value of another kind",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(key: &str) -> Vec<String> {
        key.split('.').map(str::to_owned).collect()
    }

    #[test]
    fn secrets_their_parts_and_the_tables_holding_them_are_recognised() {
        for key in [
            "api.tokens",
            "api.tokens.0",
            "api.read_tokens",
            "api",
            "sources.billing.secrets",
            "sources.billing.secrets.1",
            "sources.billing.destination_secret",
            "sources.billing.destination_secrets",
            "sources.billing.destination_secrets.1",
            "sources.billing",
            "sources",
            "storage.redis.url",
            "storage.redis.cluster_nodes.2",
            "storage.redis",
            "storage",
        ] {
            assert!(may_hold_secret(&path(key)), "{key}");
        }
        assert!(!may_hold_secret(&[]), "a layer's own error");
        for key in [
            "api.tokens_file",
            "api.read_tokens_file",
            "sources.billing.secrets_file",
            "sources.billing.destination_secret_file",
            "sources.billing.forward_to",
            "storage.redis.prefix",
            "storage.max_batch",
            "http.workers",
            "listen",
        ] {
            assert!(!may_hold_secret(&path(key)), "{key}");
        }
    }

    #[test]
    fn a_secrets_type_error_names_the_kind_of_value_only() {
        let kind = Kind::InvalidType(Actual::Str("hunter2-token".into()), "a sequence".into());
        let shown = error_message(&path("api.tokens"), &kind);
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(
            shown.contains("found a string, expected a sequence"),
            "{shown}"
        );
        let shown = error_message(&path("http.workers"), &kind);
        assert!(shown.contains("hunter2-token"), "no secret: {shown}");
        let kind = Kind::InvalidValue(Actual::Signed(918_273_645), "a string".into());
        let shown = error_message(&path("sources.s.destination_secret"), &kind);
        assert!(!shown.contains("918273645"), "{shown}");
        assert!(shown.contains("found an integer"), "{shown}");
    }

    #[test]
    fn a_syntax_error_names_the_line_and_column_but_not_the_text() {
        let text = "listen = \"127.0.0.1:0\"\n[api]\ntokens = [\"hunter2-token\", ]]\n";
        let e = toml::from_str::<Dict>(text).unwrap_err();
        let shown = syntax_error(text, &e);
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(
            shown.starts_with("TOML syntax error at line 3, column 29: "),
            "{shown}"
        );
    }
}
