//! Making values safe to print: URLs without what may be a credential, and
//! text from outside without terminal control characters.
//!
//! Every URL that dedupd prints or logs (check-config, `init`, the CLI's
//! errors, a source's `Debug`) goes through [`url`] or [`url_str`]:
//! `https://admin:hunter2@host/hooks?api_key=k` is shown as
//! `https://<redacted>@host/hooks?<redacted>`. The unit's `ExecStartPre`
//! sends check-config's output to the journal, which more people read than
//! the config file.

use std::borrow::Cow;
use std::fmt::Write as _;

use reqwest::Url;

/// What stands where a credential was.
const REDACTED: &str = "<redacted>";

/// `u` with its userinfo, query and fragment replaced by `<redacted>`:
/// scheme, host, port and path stay, so the reader still sees where it
/// points. A URL with no host (`mailto:…`, `admin:pass@host` read as a
/// scheme and a path) shows its scheme only.
pub fn url(u: &Url) -> String {
    if u.cannot_be_a_base() {
        return format!("{}:{REDACTED}", u.scheme());
    }
    let mut bare = u.clone();
    let userinfo = !u.username().is_empty() || u.password().is_some();
    // Neither fails on a URL that can be a base and has a host; without a
    // host there is no userinfo to take out.
    let _ = bare.set_password(None);
    let _ = bare.set_username("");
    bare.set_query(None);
    bare.set_fragment(None);
    let mut out = bare.to_string();
    if userinfo && let Some(at) = out.find("://") {
        out.insert_str(at + 3, &format!("{REDACTED}@"));
    }
    if u.query().is_some() {
        let _ = write!(out, "?{REDACTED}");
    }
    if u.fragment().is_some() {
        let _ = write!(out, "#{REDACTED}");
    }
    out
}

/// [`url`] of `raw`; text that is not a URL is redacted by its shape:
/// anything before an `@` in what follows `://`, and everything from the
/// first `?` or `#`.
pub fn url_str(raw: &str) -> String {
    if let Ok(u) = Url::parse(raw) {
        return url(&u);
    }
    let (head, tail) = match raw.find(['?', '#']) {
        Some(i) => (&raw[..i], Some(&raw[i..i + 1])),
        None => (raw, None),
    };
    let mut out = match head.find("://") {
        Some(i) => {
            let rest = &head[i + 3..];
            let end = rest.find('/').unwrap_or(rest.len());
            match rest[..end].rfind('@') {
                Some(at) => format!("{}://{REDACTED}@{}", &head[..i], &rest[at + 1..]),
                None => head.to_owned(),
            }
        }
        // No authority: whatever precedes an '@' may be a user and password.
        None => match head.rfind('@') {
            Some(at) => format!("{REDACTED}@{}", &head[at + 1..]),
            None => head.to_owned(),
        },
    };
    if let Some(mark) = tail {
        out.push_str(mark);
        out.push_str(REDACTED);
    }
    escape_control(&out).into_owned()
}

/// Whether `c` would do something to a terminal or to how the text around
/// it reads: C0 and C1 controls (ESC starts the ANSI sequences), DEL, and
/// the bidirectional overrides and isolates (which reorder what is shown).
fn unprintable(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Whether `c` shows as nothing, or breaks a line, where one word is
/// read: Unicode's format characters (zero-width spaces and joiners, the
/// word joiner and invisible operators, the byte-order mark, the soft
/// hyphen, tags), variation selectors, fillers, and the line and
/// paragraph separators. Fine inside prose (a joiner in Persian or an
/// emoji), not inside an id: `req_b1` and `req_b1` with a zero-width
/// space read the same.
fn invisible(c: char) -> bool {
    matches!(
        c,
        '\u{ad}'
            | '\u{34f}'
            | '\u{600}'..='\u{605}'
            | '\u{61c}'
            | '\u{6dd}'
            | '\u{70f}'
            | '\u{8e2}'
            | '\u{115f}'
            | '\u{1160}'
            | '\u{180b}'..='\u{180f}'
            | '\u{200b}'..='\u{200f}'
            | '\u{2028}'..='\u{202e}'
            | '\u{2060}'..='\u{206f}'
            | '\u{3164}'
            | '\u{fe00}'..='\u{fe0f}'
            | '\u{feff}'
            | '\u{ffa0}'
            | '\u{fff9}'..='\u{fffb}'
            | '\u{110bd}'
            | '\u{110cd}'
            | '\u{13430}'..='\u{1343f}'
            | '\u{1bca0}'..='\u{1bca3}'
            | '\u{1d173}'..='\u{1d17a}'
            | '\u{e0000}'..='\u{e0fff}'
    )
}

/// One word (an id) as a terminal shows it: as [`escape_control`], and
/// with what shows as nothing ([`invisible`]) escaped too.
pub fn escape_word(text: &str) -> Cow<'_, str> {
    escaped(text, |c| unprintable(c) || invisible(c))
}

/// `text` with every control character (and bidirectional control) written
/// as `\u{…}`, so text nobody verified can be printed to a terminal: an
/// `ESC [ 31 m` in a body shows as `\u{1b}[31m` instead of turning the
/// terminal red, and a `\r` cannot overwrite the line it is on.
pub fn escape_control(text: &str) -> Cow<'_, str> {
    escaped(text, unprintable)
}

/// As [`escape_control`], but for its line breaks: text of several lines
/// (an error's hints) printed as lines.
pub fn escape_lines(text: &str) -> Cow<'_, str> {
    escaped(text, |c| c != '\n' && unprintable(c))
}

/// `text` with each character `escape` picks written as `\u{…}`.
fn escaped(text: &str, escape: impl Fn(char) -> bool) -> Cow<'_, str> {
    if !text.chars().any(&escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if escape(c) {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `v` as compact JSON that a terminal can show: every control character
/// (and bidirectional control) inside a string written as a `\uXXXX`
/// escape. serde_json escapes C0 controls already, but writes DEL, C1
/// controls (`\u{9b}` is a CSI) and the bidi overrides as they are. The
/// text reads back as the same JSON value: outside strings JSON has no
/// such characters.
pub fn json_for_terminal(v: &serde_json::Value) -> String {
    let text = v.to_string();
    if !text.chars().any(unprintable) {
        return text;
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if unprintable(c) {
            // Every such character is in the Basic Multilingual Plane.
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    out
}

/// `word` as one shell word: as it is when it holds only characters no
/// shell treats specially, else in single quotes (each `'` in it written
/// `'\''`). For commands dedupd prints for the operator to paste.
pub fn shell_word(word: &str) -> Cow<'_, str> {
    let plain = !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.,:/@%+=".contains(&b));
    if plain {
        Cow::Borrowed(word)
    } else {
        Cow::Owned(format!("'{}'", word.replace('\'', "'\\''")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn userinfo_query_and_fragment_are_redacted() {
        let u = |s: &str| url(&Url::parse(s).expect("url"));
        assert_eq!(
            u("https://admin:hunter2pass@example.com:8443/hooks?api_key=k1&x=2#frag"),
            "https://<redacted>@example.com:8443/hooks?<redacted>#<redacted>"
        );
        assert_eq!(
            u("http://token@10.0.0.1/in"),
            "http://<redacted>@10.0.0.1/in"
        );
        assert_eq!(
            u("http://127.0.0.1:3000/hooks"),
            "http://127.0.0.1:3000/hooks"
        );
        assert_eq!(u("mailto:someone@example.com"), "mailto:<redacted>");
    }

    #[test]
    fn text_that_is_not_a_url_is_redacted_by_its_shape() {
        for (raw, shown) in [
            (
                "https://admin:hunter2pass@exa mple.com/x?api_key=k",
                "https://<redacted>@exa mple.com/x?<redacted>",
            ),
            ("admin:hunter2pass@host", "admin:<redacted>"),
            ("::admin:pw@host/x", "<redacted>@host/x"),
            ("not a url", "not a url"),
            ("a\u{1b}[31m", "a\\u{1b}[31m"),
        ] {
            assert_eq!(url_str(raw), shown, "{raw}");
        }
    }

    #[test]
    fn json_for_a_terminal_escapes_every_control_and_reads_back_the_same() {
        let v = serde_json::json!({
            "a": "\u{1b}[31mred\u{9b}2J\u{202e}x\u{7f}\u{85}", "b": ["ünï", 1], "c": null
        });
        let shown = json_for_terminal(&v);
        assert!(!shown.chars().any(unprintable), "{shown}");
        assert!(
            shown.contains("\\u001b[31mred\\u009b2J\\u202ex\\u007f\\u0085"),
            "{shown}"
        );
        assert!(shown.contains("ünï"));
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&shown).unwrap(),
            v
        );
    }

    #[test]
    fn a_shell_word_is_quoted_unless_plain() {
        assert_eq!(shell_word("eyJhZnRlciI6MX0="), "eyJhZnRlciI6MX0=");
        assert_eq!(shell_word("a b"), "'a b'");
        assert_eq!(shell_word(""), "''");
        assert_eq!(shell_word("x;$(id)`id`"), "'x;$(id)`id`'");
        assert_eq!(shell_word("it's"), "'it'\\''s'");
    }

    #[test]
    fn control_characters_are_escaped_and_the_rest_kept() {
        assert_eq!(escape_control("req_1 ünï"), "req_1 ünï");
        assert!(matches!(escape_control("plain"), Cow::Borrowed(_)));
        // A joiner belongs in prose (Persian, an emoji): kept.
        assert_eq!(escape_control("نمی\u{200c}خواهم"), "نمی\u{200c}خواهم");
        // Not in a word (an id): what shows as nothing, or breaks a line.
        assert_eq!(
            escape_word(
                "req_b1\u{200b}\u{feff}\u{2028}\u{ad}\u{61c}\u{2060}\u{e0041}\u{fe0f}\u{1b}"
            ),
            "req_b1\\u{200b}\\u{feff}\\u{2028}\\u{ad}\\u{61c}\\u{2060}\\u{e0041}\\u{fe0f}\\u{1b}"
        );
        assert!(matches!(escape_word("req_1 ünï"), Cow::Borrowed(_)));
        // Lines stay lines; a carriage return does not.
        assert_eq!(
            escape_lines("bad \u{1b}]0;x\u{7}\nhint\r"),
            "bad \\u{1b}]0;x\\u{7}\nhint\\u{d}"
        );
        assert_eq!(
            escape_control("\u{1b}[31mred\r\n\u{9b}2J\u{202e}x\u{7f}"),
            "\\u{1b}[31mred\\u{d}\\u{a}\\u{9b}2J\\u{202e}x\\u{7f}"
        );
    }
}
