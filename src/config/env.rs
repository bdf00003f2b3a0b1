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

/// How deep figment's value parser (`figment::value::parse`, 0.10) would
/// recurse into `value`: its grammar followed without recursion, up to the
/// first place it would fail (where it stops, parsing nothing deeper).
/// Where a `"` starts a string is the parser's call, not the text's: only
/// where a value or a dictionary's key starts (`['"',[[…` is a character
/// `"`, and `[a",[[…` a word holding one, and the brackets after them
/// count). Skipping a string's escapes (which the parser may refuse) can
/// only count deeper than it goes, never less.
fn value_depth(value: &str) -> usize {
    /// What the parser expects next.
    enum Next {
        Value,
        Key,
        AfterValue,
    }
    let text = value.as_bytes();
    // Every byte the grammar names is ASCII, which no byte of a longer
    // UTF-8 character equals.
    let at = |i: usize| text.get(i).copied();
    let skip_whitespace = |mut i: usize| {
        while at(i).is_some_and(|b| b.is_ascii_whitespace()) {
            i += 1;
        }
        i
    };
    // Past the end of the string whose opening quote is at `i - 1`.
    let past_string = |mut i: usize| {
        let mut escaped = false;
        while let Some(b) = at(i) {
            i += 1;
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => return Some(i),
                _ => {}
            }
        }
        None
    };
    // The brackets open: true for a dictionary, false for an array.
    let mut open: Vec<bool> = Vec::new();
    let (mut max, mut i, mut next) = (0, 0, Next::Value);
    loop {
        match next {
            Next::Value => {
                i = skip_whitespace(i);
                next = Next::AfterValue;
                match at(i) {
                    _ if text[i..].starts_with(b"true") => i += 4,
                    _ if text[i..].starts_with(b"false") => i += 5,
                    Some(b @ (b'[' | b'{')) => {
                        i += 1;
                        open.push(b == b'{');
                        max = max.max(open.len());
                        let close = if b == b'{' { b'}' } else { b']' };
                        if at(i) == Some(close) {
                            i += 1;
                            open.pop();
                        } else {
                            next = if b == b'{' { Next::Key } else { Next::Value };
                        }
                    }
                    Some(b'"') => match past_string(i + 1) {
                        Some(past) => i = past,
                        None => return max,
                    },
                    // A character: `'`, any one, `'`.
                    Some(b'\'') => {
                        let one = value[i + 1..].chars().next().map_or(0, char::len_utf8);
                        if one == 0 || at(i + 1 + one) != Some(b'\'') {
                            return max;
                        }
                        i += one + 2;
                    }
                    // A word: up to a separator, maybe none.
                    _ => {
                        while at(i).is_some_and(|b| !matches!(b, b',' | b'{' | b'}' | b'[' | b']'))
                        {
                            i += 1;
                        }
                    }
                }
            }
            Next::Key => {
                i = skip_whitespace(i);
                if at(i) == Some(b'"') {
                    match past_string(i + 1) {
                        Some(past) => i = past,
                        None => return max,
                    }
                } else {
                    let start = i;
                    while at(i)
                        .is_some_and(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'))
                    {
                        i += 1;
                    }
                    if i == start {
                        return max;
                    }
                }
                i = skip_whitespace(i);
                if at(i) != Some(b'=') {
                    return max;
                }
                i += 1;
                next = Next::Value;
            }
            Next::AfterValue => {
                i = skip_whitespace(i);
                // At the top, the parser wants the end: nothing deeper.
                let Some(&dict) = open.last() else {
                    return max;
                };
                let close = if dict { b'}' } else { b']' };
                match at(i) {
                    Some(b',') if at(i + 1) == Some(close) => {
                        i += 2;
                        open.pop();
                    }
                    Some(b',') => {
                        i += 1;
                        next = if dict { Next::Key } else { Next::Value };
                    }
                    Some(b) if b == close => {
                        i += 1;
                        open.pop();
                    }
                    _ => return max,
                }
            }
        }
    }
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
        assert_eq!(value_depth("[[[]]]"), 3);
        assert_eq!(
            value_depth("]]]][["),
            0,
            "the parser stops at the first `]`"
        );
    }

    /// A `"` the parser does not read as a string's start (a character
    /// `'"'`, inside a word, or a word's `=`) hid the brackets after it,
    /// and 50 000 of them aborted `serve`.
    #[test]
    fn a_quote_that_starts_no_string_hides_no_bracket() {
        let deep = "[".repeat(50_000);
        for front in [r#"['"',"#, r#"[a","#, r#"[a=","#, r#"["]",["]",["]","#] {
            let value = format!("{front}{deep}");
            assert!(value_depth(&value) >= 50_000, "{front}");
            let var = Var {
                key: "listen".into(),
                value,
            };
            assert!(var.data().unwrap_err().to_string().contains("levels deep"));
        }
    }

    /// figment's value nested as deep as it goes, counted without
    /// recursion.
    fn nesting(value: &Value) -> usize {
        let mut deepest = 0;
        let mut todo = vec![(value, 0)];
        while let Some((value, depth)) = todo.pop() {
            deepest = deepest.max(depth);
            match value {
                Value::Array(_, items) => todo.extend(items.iter().map(|v| (v, depth + 1))),
                Value::Dict(_, dict) => todo.extend(dict.values().map(|v| (v, depth + 1))),
                _ => {}
            }
        }
        deepest
    }

    proptest::proptest! {
        /// Whatever figment parses is nested no deeper than the guard
        /// counted: short texts of the characters its grammar turns on.
        /// A backslash beside a non-ASCII character is never parsed
        /// (figment's unescaping panics on it; `Var::data` takes such a
        /// value as the plain string it is), so each text has one or the
        /// other.
        #[test]
        fn the_guard_never_counts_less_than_figment_nests(
            text in proptest::prop_oneof![
                "[\\[\\]{}\",'= a=_tf\\t\\\\]{0,24}",
                "[\\[\\]{}\",'= a=_tfé]{0,24}",
            ]
        ) {
            let parsed: Value = text.parse().unwrap_or_else(|never| match never {});
            proptest::prop_assert!(nesting(&parsed) <= value_depth(&text), "{:?}", text);
        }
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
