//! Requests off the wire: one command is an array of bulk strings
//! (`*N\r\n` then N times `$LEN\r\n<bytes>\r\n`), as every Redis client
//! sends it. Anything else (inline commands, nested arrays, maps,
//! attributes, integers) is a protocol error and closes the connection.
//!
//! The parser is a loop, not a recursive descent: a frame cannot nest, so
//! no input can exhaust the stack (a general RESP decoder recursed once
//! per `*1\r\n`, and 80 KB of them overflowed a worker's stack before
//! authentication). Every declared count and length is checked against
//! [`Limits`] before anything is allocated or read for it, so a client can
//! make the server hold at most `max_bytes` (plus one read) of a request.

use bytes::{Bytes, BytesMut};

/// How large one request may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most words (the command name and its arguments).
    pub max_args: usize,
    /// Most bytes of the whole request, headers and CRLFs included.
    pub max_bytes: usize,
}

/// Longest count line (`*N` or `$LEN`) before its CRLF: `$` and the 20
/// digits of u64::MAX, with room to spare.
const MAX_LINE: usize = 32;

/// What [`parse`] found at the front of the buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// One whole request, taken off the buffer. Empty for `*0` and `*-1`,
    /// which Redis skips without a reply.
    Command(Vec<Bytes>),
    /// The request is not all there yet; at least `need` more bytes are
    /// (its declared sizes are within the limits already).
    Incomplete {
        /// Bytes still missing, at least 1.
        need: usize,
    },
}

/// A request that breaks the protocol or the limits: answered with this
/// error, then the connection closes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolError(pub String);

impl std::fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Protocol error: {}", self.0)
    }
}

fn error<T>(message: impl Into<String>) -> Result<T, ProtocolError> {
    Err(ProtocolError(message.into()))
}

/// A byte for an error message: printable ASCII as it is, others escaped.
fn shown(b: u8) -> String {
    std::ascii::escape_default(b).to_string()
}

/// The count on the line that starts at `at` (just after its `*` or `$`):
/// `Ok(Some((value, next)))` with `next` past the CRLF, `Ok(None)` if the
/// line is not all there yet.
fn count_line(buf: &[u8], at: usize, what: &str) -> Result<Option<(i64, usize)>, ProtocolError> {
    let window = &buf[at..buf.len().min(at + MAX_LINE)];
    let Some(end) = window.iter().position(|&b| b == b'\r') else {
        if window.len() >= MAX_LINE {
            return error(format!("too big {what} count string"));
        }
        return Ok(None);
    };
    let Some(&next) = window.get(end + 1) else {
        return Ok(None);
    };
    if next != b'\n' {
        return error(format!("{what} count line does not end in CRLF"));
    }
    let digits = &window[..end];
    let negative = digits.first() == Some(&b'-');
    let magnitude = if negative { &digits[1..] } else { digits };
    let value = (!magnitude.is_empty() && magnitude.iter().all(u8::is_ascii_digit))
        .then(|| {
            magnitude.iter().try_fold(0i64, |v, d| {
                v.checked_mul(10)?.checked_add(i64::from(d - b'0'))
            })
        })
        .flatten()
        .ok_or_else(|| ProtocolError(format!("invalid {what} length")))?;
    Ok(Some((if negative { -value } else { value }, at + end + 2)))
}

/// Takes one request off the front of `buf` if it is all there, as
/// [`Parsed::Command`] (whose words share `buf`'s memory); otherwise
/// leaves `buf` as it is.
pub fn parse(buf: &mut BytesMut, limits: Limits) -> Result<Parsed, ProtocolError> {
    let Some(&first) = buf.first() else {
        return Ok(Parsed::Incomplete { need: 1 });
    };
    if first != b'*' {
        return error(format!(
            "expected '*', got '{}' (send each command as an array of bulk strings, as Redis \
             clients do; inline commands are not served)",
            shown(first)
        ));
    }
    let Some((count, mut at)) = count_line(buf, 1, "multibulk")? else {
        return Ok(Parsed::Incomplete { need: 1 });
    };
    if count <= 0 {
        let _ = buf.split_to(at);
        return Ok(Parsed::Command(Vec::new()));
    }
    let count = usize::try_from(count).unwrap_or(usize::MAX);
    if count > limits.max_args {
        return error(format!(
            "invalid multibulk length: a command of {count} words, more than {}",
            limits.max_args
        ));
    }
    // Grows as words arrive, never by the declared count alone.
    let mut spans: Vec<(usize, usize)> = Vec::with_capacity(count.min(16));
    for _ in 0..count {
        let Some(&marker) = buf.get(at) else {
            return Ok(Parsed::Incomplete { need: 1 });
        };
        if marker != b'$' {
            return error(format!("expected '$', got '{}'", shown(marker)));
        }
        let Some((len, start)) = count_line(buf, at + 1, "bulk")? else {
            return Ok(Parsed::Incomplete { need: 1 });
        };
        let len = usize::try_from(len).map_err(|_| ProtocolError("invalid bulk length".into()))?;
        let end = start.saturating_add(len).saturating_add(2);
        if end > limits.max_bytes {
            return error(format!("a request of more than {} bytes", limits.max_bytes));
        }
        if buf.len() < end {
            return Ok(Parsed::Incomplete {
                need: end - buf.len(),
            });
        }
        if &buf[start + len..end] != b"\r\n" {
            return error("a bulk string is not followed by CRLF");
        }
        spans.push((start, len));
        at = end;
    }
    let request = buf.split_to(at).freeze();
    Ok(Parsed::Command(
        spans
            .into_iter()
            .map(|(start, len)| request.slice(start..start + len))
            .collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        max_args: 8,
        max_bytes: 256,
    };

    fn parse_all(bytes: &[u8]) -> (Result<Parsed, ProtocolError>, usize) {
        let mut buf = BytesMut::from(bytes);
        let parsed = parse(&mut buf, LIMITS);
        (parsed, buf.len())
    }

    fn words(ws: &[&str]) -> Parsed {
        Parsed::Command(
            ws.iter()
                .map(|w| Bytes::copy_from_slice(w.as_bytes()))
                .collect(),
        )
    }

    #[test]
    fn a_command_is_taken_whole_and_the_next_is_left() {
        let (parsed, left) = parse_all(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*1\r\n$4\r\nPING\r\n");
        assert_eq!(parsed, Ok(words(&["GET", "k"])));
        assert_eq!(left, "*1\r\n$4\r\nPING\r\n".len());
    }

    #[test]
    fn every_prefix_of_a_command_is_incomplete_and_consumes_nothing() {
        let whole = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nvalue\r\n";
        for cut in 0..whole.len() {
            let (parsed, left) = parse_all(&whole[..cut]);
            assert!(
                matches!(parsed, Ok(Parsed::Incomplete { need }) if need >= 1),
                "{cut}: {parsed:?}"
            );
            assert_eq!(left, cut);
        }
        assert_eq!(parse_all(whole).0, Ok(words(&["SET", "k", "value"])));
    }

    #[test]
    fn an_incomplete_value_says_how_much_is_missing() {
        let (parsed, _) = parse_all(b"*2\r\n$3\r\nGET\r\n$100\r\nabc");
        assert_eq!(parsed, Ok(Parsed::Incomplete { need: 99 }));
    }

    #[test]
    fn empty_and_null_arrays_are_empty_commands() {
        assert_eq!(parse_all(b"*0\r\n").0, Ok(Parsed::Command(Vec::new())));
        assert_eq!(parse_all(b"*-1\r\n"), (Ok(Parsed::Command(Vec::new())), 0));
    }

    #[test]
    fn nesting_and_other_frames_are_protocol_errors() {
        for bad in [
            &b"*1\r\n*1\r\n$1\r\nx\r\n"[..],
            b"*1\r\n:5\r\n",
            b"+PING\r\n",
            b"PING\r\n",
            b"%1\r\n$1\r\na\r\n$1\r\nb\r\n",
            b"|1\r\n$1\r\na\r\n$1\r\nb\r\n",
            b"*1\r\n$x\r\n",
            b"*1\r\n$-1\r\n",
            b"*1\r\n$1\r\nxyz",
            b"*x\r\n",
            b"*1\rX",
        ] {
            let (parsed, left) = parse_all(bad);
            assert!(
                parsed.is_err(),
                "{}: {parsed:?}",
                String::from_utf8_lossy(bad)
            );
            assert_eq!(left, bad.len(), "nothing consumed");
        }
    }

    #[test]
    fn declared_sizes_over_the_limits_are_refused_before_the_bytes_arrive() {
        // Only the headers are sent: the refusal cannot wait for the data.
        assert!(parse_all(b"*9\r\n").0.is_err());
        assert!(parse_all(b"*2147483648\r\n").0.is_err());
        assert!(parse_all(b"*1\r\n$2147483648\r\n").0.is_err());
        assert!(parse_all(b"*1\r\n$9223372036854775807\r\n").0.is_err());
        assert!(parse_all(b"*1\r\n$99999999999999999999\r\n").0.is_err());
        assert!(parse_all(b"*2\r\n$200\r\n").0.is_ok(), "200 bytes fit");
        assert!(parse_all(b"*1\r\n$9999999999999999999\r\n").0.is_err());
        let mut two = b"*2\r\n$200\r\n".to_vec();
        two.extend([b'v'; 200]);
        two.extend(b"\r\n$60\r\n");
        let (parsed, _) = parse_all(&two);
        assert_eq!(
            parsed,
            Err(ProtocolError("a request of more than 256 bytes".into()))
        );
    }

    #[test]
    fn a_count_line_without_its_end_is_refused_once_too_long() {
        assert!(matches!(
            parse_all(b"*1111111111111111").0,
            Ok(Parsed::Incomplete { .. })
        ));
        assert!(parse_all(&[b'*'; 40]).0.is_err());
        assert!(
            parse_all(b"*1\r\n$000000000000000000000000000000000001")
                .0
                .is_err()
        );
    }
}
