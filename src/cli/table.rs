//! Plain-text tables, times and JSON values for people reading a terminal.

use std::time::Duration;

use dedupd::redact::escape_control;
use serde_json::Value;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// Left-aligned columns two spaces apart, headers first; the last column
/// is not padded.
pub fn render(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut text = String::new();
        for (i, (cell, w)) in cells.zip(&widths).enumerate() {
            if i > 0 {
                text.push_str("  ");
            }
            text.push_str(cell);
            if i + 1 < widths.len() {
                text.extend(std::iter::repeat_n(' ', w - cell.chars().count()));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&mut headers.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
    out
}

/// A JSON value as plain text for a terminal: strings unquoted (control
/// characters escaped: the server's answer is printed, whoever sent it),
/// null as "-".
pub fn text(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => escape_control(s).into_owned(),
        other => other.to_string(),
    }
}

/// An id (an event's, a stream's, a key) as a table shows it: escaped as
/// [`text`] is, and what shows as nothing too, then quoted for a shell
/// when it is not one plain word. Ids are the
/// sender's: one with a space (`req_7 --url=http://elsewhere`), copied
/// from the table into a command unquoted, sent the API token elsewhere.
pub fn word(v: &Value) -> String {
    match v {
        Value::String(s) => shell(s),
        other => text(other),
    }
}

/// `s` (the server's: an id, a cursor) as one word a shell reads back as
/// it, escaped for the terminal: for a table's cell or a command to paste.
pub fn shell(s: &str) -> String {
    dedupd::redact::shell_word(&dedupd::redact::escape_word(s)).into_owned()
}

/// Unix milliseconds as RFC 3339 in UTC.
pub fn rfc3339_ms(ms: u64) -> String {
    i128::from(ms)
        .checked_mul(1_000_000)
        .and_then(|ns| OffsetDateTime::from_unix_timestamp_nanos(ns).ok())
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_else(|| format!("{ms} ms"))
}

/// Unix milliseconds as RFC 3339 and how far from `now_ms` they are
/// ("in 4m 59s", "3s ago"), to the second.
pub fn when(ms: u64, now_ms: u64) -> String {
    let secs = |d: u64| humantime::format_duration(Duration::from_secs(d / 1000));
    let rel = if ms >= now_ms {
        format!("in {}", secs(ms - now_ms))
    } else {
        format!("{} ago", secs(now_ms - ms))
    };
    format!("{} ({rel})", rfc3339_ms(ms))
}

/// Now, in Unix milliseconds.
pub fn now_ms() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(now.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up_under_their_headers() {
        let text = render(
            &["KEY", "STATE", "FENCE"],
            &[
                vec!["a-long-key".into(), "done".into(), "7".into()],
                vec!["k".into(), "processing".into(), "12".into()],
            ],
        );
        assert_eq!(
            text,
            "KEY         STATE       FENCE\n\
             a-long-key  done        7\n\
             k           processing  12\n"
        );
    }

    #[test]
    fn times_are_rfc3339_with_a_distance_from_now() {
        assert_eq!(rfc3339_ms(1_800_000_000_123), "2027-01-15T08:00:00.123Z");
        assert_eq!(
            when(1_800_000_060_000, 1_800_000_000_000),
            "2027-01-15T08:01:00Z (in 1m)"
        );
        assert_eq!(
            when(1_800_000_000_000, 1_800_000_003_500),
            "2027-01-15T08:00:00Z (3s ago)"
        );
    }
}
