//! The `DEDUPD_*` layer of the settings: figment's `Env` (prefix, `__` for
//! nesting, values parsed as figment values), one provider per variable,
//! with a depth limit checked before anything is parsed.
//!
//! figment nests a key per `__` and parses a value's `[`/`{` recursively;
//! both recurse once per level. `DEDUPD_LISTEN` set to 50 000 `[` (or a
//! name of 40 000 `A__`) overflowed the stack and aborted the process —
//! `check-config` and `serve` alike — before any setting was checked.
//! [`MAX_DEPTH`] levels is far more than any setting needs (the deepest,
//! `DEDUPD_SOURCES__NAME__FORWARD_HEADERS=["a"]`, has 4).

use figment::providers::Env;
use figment::value::{Dict, Map, Value};
use figment::{Error, Metadata, Profile, Provider};

/// Most nesting one variable may bring: the parts of its name joined by
/// `__`, plus the brackets open at once in its value.
pub const MAX_DEPTH: usize = 32;

/// What is shown of a variable's name in an error: no more than this.
const SHOWN_NAME: usize = 64;

/// figment's reading of the process's `DEDUPD_*` variables, kept for its
/// filtering (prefix, ignored names, empty parts) and its metadata.
pub(super) fn env() -> Env {
    // DEDUPD_URL and DEDUPD_TOKEN belong to the CLI's client commands,
    // DEDUPD_CONFIG names the file: none of them is a setting.
    Env::prefixed("DEDUPD_")
        .split("__")
        .ignore(&["config", "url", "token"])
}

/// The process's `DEDUPD_*` variables as keys and values: `claims.max_ttl`
/// for `DEDUPD_CLAIMS__MAX_TTL`.
pub(super) fn process_vars() -> Vec<(String, String)> {
    env()
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), v))
        .collect()
}

/// One variable: `key` as figment's `Env` makes it (lowercased, dotted),
/// `value` as set.
#[derive(Debug)]
pub(super) struct Var {
    pub(super) key: String,
    pub(super) value: String,
}

/// How deep the brackets of `value` go, as figment's value parser would
/// recurse into them: `[` and `{` outside double-quoted strings (backslash
/// escapes in them) open a level.
fn value_depth(value: &str) -> usize {
    let (mut depth, mut max) = (0usize, 0usize);
    let mut in_string = false;
    let mut escaped = false;
    for c in value.chars() {
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '[' | '{' => {
                depth += 1;
                max = max.max(depth);
            }
            ']' | '}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// `DEDUPD_` and the variable's name as written for `key`, cut short.
fn shown_name(key: &str) -> String {
    let name = format!("DEDUPD_{}", key.replace('.', "__").to_ascii_uppercase());
    match name.char_indices().nth(SHOWN_NAME) {
        Some((cut, _)) => format!("{}…", &name[..cut]),
        None => name,
    }
}

impl Provider for Var {
    fn metadata(&self) -> Metadata {
        env().metadata()
    }

    fn data(&self) -> Result<Map<Profile, Dict>, Error> {
        let parts = self.key.split('.').count();
        let depth = parts.saturating_add(value_depth(&self.value));
        if depth > MAX_DEPTH {
            let mut e = Error::from(format!(
                "{} is nested {depth} levels deep (its name's `__` parts and its value's \
                 brackets); settings are read to {MAX_DEPTH} levels at most",
                shown_name(&self.key)
            ));
            // Named by its first part, so the error reads like any other
            // setting's: `listen: … (from environment variable DEDUPD_LISTEN)`.
            e.path = self.key.split('.').take(1).map(str::to_owned).collect();
            return Err(e);
        }
        // figment 0.10's string unescaping slices at a character count as
        // if it were a byte offset: a backslash after any non-ASCII
        // character panics it. Such a value is taken as the plain string
        // it is (a list or table written that way is then refused by type,
        // with the setting's name), never parsed.
        let value: Value = if !self.value.is_ascii() && self.value.contains('\\') {
            Value::from(self.value.clone())
        } else {
            match self.value.parse() {
                Ok(v) => v,
                Err(never) => match never {},
            }
        };
        let dict = figment::util::nest(&self.key, value)
            .into_dict()
            .unwrap_or_default();
        Ok(Profile::Default.collect(dict))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brackets_count_outside_strings_only() {
        assert_eq!(value_depth("127.0.0.1:8080"), 0);
        assert_eq!(value_depth(r#"["a", "b"]"#), 1);
        assert_eq!(value_depth(r#"{a = [1, {b = [2]}]}"#), 4);
        assert_eq!(value_depth(r#"["[[[[", "\"[[["]"#), 1);
        assert_eq!(value_depth(&"[".repeat(50_000)), 50_000);
        assert_eq!(value_depth("]]]][["), 2);
    }

    /// figment's parser panicked on this (found by the fuzz target).
    #[test]
    fn a_backslash_after_non_ascii_text_is_a_plain_string() {
        let var = Var {
            key: "listen".into(),
            value: "\"\u{1f574}\u{111e1}\\K\"".into(),
        };
        let data = var.data().unwrap();
        let listen = &data[&Profile::Default]["listen"];
        assert_eq!(listen.as_str(), Some(var.value.as_str()));
    }

    #[test]
    fn long_names_are_cut_short_in_errors() {
        assert_eq!(shown_name("claims.max_ttl"), "DEDUPD_CLAIMS__MAX_TTL");
        let long = shown_name(&"a.".repeat(1000));
        assert!(long.ends_with('…') && long.chars().count() == SHOWN_NAME + 1);
    }
}
