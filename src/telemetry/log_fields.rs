//! The fields of a text log line, each one readable apart. A value is
//! written as it is when it is plain (printable ASCII without a space,
//! `=`, `"` or `\`), and quoted and escaped otherwise: an event id a
//! sender chose (`req_1 trace_id=…`), a key or an error's text can then
//! neither pass for a field of its own (a forged `trace_id`) nor start a
//! line. A message keeps its words but not its control characters.
//! tracing-subscriber's own fields write a value shown with `%` as it is.
//! JSON lines need none of this: each value is a JSON string.

use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing_subscriber::field::{MakeVisitor, VisitFmt, VisitOutput};
use tracing_subscriber::fmt::format::{DefaultVisitor, Writer};

/// The text lines' fields (for `fmt::Layer::fmt_fields`).
#[derive(Debug, Clone, Copy, Default)]
pub struct TextFields;

impl<'a> MakeVisitor<Writer<'a>> for TextFields {
    type Visitor = Quoting<'a>;

    fn make_visitor(&self, target: Writer<'a>) -> Quoting<'a> {
        Quoting(DefaultVisitor::new(target, true))
    }
}

/// tracing-subscriber's visitor (its layout, colours and `log.` fields
/// skipped), given each value in the form it may be written in.
#[derive(Debug)]
pub struct Quoting<'a>(DefaultVisitor<'a>);

impl Quoting<'_> {
    fn message(&mut self, field: &Field, text: &str) {
        self.0
            .record_debug(field, &format_args!("{}", Controls(text)));
    }

    fn value(&mut self, field: &Field, text: &str) {
        if plain(text) || quoted(text) {
            self.0.record_debug(field, &format_args!("{text}"));
        } else {
            // A `str`'s Debug: quoted, with `"`, `\` and what is not
            // printable escaped.
            self.0.record_debug(field, &text);
        }
    }
}

impl Visit for Quoting<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message(field, value);
        } else {
            // Quoted, as tracing-subscriber writes a `str` field.
            self.0.record_debug(field, &value);
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        let mut text = value.to_string();
        let mut source = value.source();
        while let Some(cause) = source {
            let _ = write!(text, ": {cause}");
            source = cause.source();
        }
        self.value(field, &text);
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let text = format!("{value:?}");
        if field.name() == "message" {
            self.message(field, &text);
        } else {
            self.value(field, &text);
        }
    }
}

impl VisitOutput<fmt::Result> for Quoting<'_> {
    fn finish(self) -> fmt::Result {
        self.0.finish()
    }
}

impl VisitFmt for Quoting<'_> {
    fn writer(&mut self) -> &mut dyn fmt::Write {
        self.0.writer()
    }
}

/// Printable ASCII with nothing a reader would take for the value's end
/// or another field's start.
fn plain(text: &str) -> bool {
    !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'"' | b'=' | b'\\'))
}

/// Already a quoted, escaped string (a `str` shown with `?`): a quote at
/// each end, none unescaped between, and no line or control character.
fn quoted(text: &str) -> bool {
    let Some(inner) = text
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .filter(|_| text.len() >= 2)
    else {
        return false;
    };
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            // The escaped character is skipped; none: the closing quote was.
            '\\' if chars.next().is_none() => return false,
            '"' => return false,
            c if c.is_control() || (c.is_whitespace() && c != ' ') => return false,
            _ => {}
        }
    }
    true
}

/// A message's text with its control and line-separating characters
/// escaped (`\n`, `\u{2028}`), so it stays on its line.
struct Controls<'a>(&'a str);

impl fmt::Display for Controls<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in self.0.chars() {
            if c.is_control() || (c.is_whitespace() && c != ' ') {
                write!(f, "{}", c.escape_default())?;
            } else {
                f.write_char(c)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_is_written_plain_only_when_nothing_in_it_could_end_it() {
        for text in [
            "req_13b7ec43d7467a30",
            "127.0.0.1:8080",
            "42",
            "-1.5",
            "Running",
        ] {
            assert!(plain(text), "{text}");
        }
        for text in ["", "a b", "a=b", "a\"b", "a\\b", "a\nb", "é", "a\u{2028}b"] {
            assert!(!plain(text), "{text:?}");
        }
        for text in [r#""""#, r#""a b""#, r#""a \"b\" c""#, r#""a\\""#, r#""é""#] {
            assert!(quoted(text), "{text}");
        }
        for text in [
            r#"""#,
            r#""a" b=c "d""#,
            r#""a\""#,
            "\"a\nb\"",
            "\"a\u{2028}b\"",
            r#"a""#,
        ] {
            assert!(!quoted(text), "{text}");
        }
    }
}
