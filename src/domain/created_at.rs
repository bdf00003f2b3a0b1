//! Event timestamps: RFC 3339 with an offset, or Unix seconds or
//! milliseconds (Stripe's `created`, Slack's `event_time`, Zoom's
//! `event_ts`), compared as instants.

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::Invalid;

/// An event's `created_at`, as nanoseconds since the Unix epoch (UTC).
/// Two timestamps in different offsets that name the same instant are equal.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct CreatedAt(i128);

impl CreatedAt {
    /// Parses an RFC 3339 timestamp (`2026-11-29T10:00:00Z`,
    /// `2026-11-29T11:00:00.123+01:00`); any offset, any sub-second digits.
    pub fn parse(raw: &str, field: &'static str) -> Result<Self, Invalid> {
        OffsetDateTime::parse(raw, &Rfc3339)
            .map(|t| Self(t.unix_timestamp_nanos()))
            .map_err(|_| {
                Invalid::new(
                    "invalid_created_at",
                    field,
                    format!(
                        "expected an RFC 3339 timestamp with an offset, such as \
                         2026-11-29T10:00:00Z or 2026-11-29T11:00:00.5+01:00; got {raw:?}"
                    ),
                )
            })
    }

    /// Reads a `created_at` a source's locator found, as `format` says:
    /// `text` for a JSON string, else the JSON text of a number.
    pub fn read(
        raw: &str,
        is_number: bool,
        format: CreatedAtFormat,
        field: &'static str,
    ) -> Result<Self, Invalid> {
        let unit = match format {
            CreatedAtFormat::Rfc3339 if is_number => {
                return Err(invalid(
                    field,
                    format!(
                        "expected an RFC 3339 string (created_at_format = \"rfc3339\"), found the number {raw}"
                    ),
                ));
            }
            CreatedAtFormat::Rfc3339 => return Self::parse(raw, field),
            CreatedAtFormat::Auto if !is_number && !is_decimal(raw) => {
                return Self::parse(raw, field);
            }
            CreatedAtFormat::Auto => None,
            CreatedAtFormat::UnixSeconds => Some(NANOS_PER_S),
            CreatedAtFormat::UnixMillis => Some(NANOS_PER_MS),
        };
        let Some((whole, fraction)) = decimal(raw) else {
            return Err(invalid(
                field,
                format!(
                    "expected Unix {} as a non-negative decimal number, got {raw:?}",
                    match unit {
                        Some(NANOS_PER_MS) => "milliseconds",
                        Some(_) => "seconds",
                        None => "seconds or milliseconds",
                    }
                ),
            ));
        };
        // Auto: below 10^11 is seconds (up to the year 5138), else
        // milliseconds (from 1973-03-03 on).
        let unit = unit.unwrap_or(if whole < AUTO_MILLIS_FROM {
            NANOS_PER_S
        } else {
            NANOS_PER_MS
        });
        let nanos = whole
            .checked_mul(unit)
            .and_then(|n| n.checked_add(fraction_nanos(fraction, unit)))
            .filter(|n| *n <= LATEST_NANOS)
            .ok_or_else(|| {
                invalid(
                    field,
                    format!("{raw} is past the year 9999 in Unix {}", unit_name(unit)),
                )
            })?;
        Ok(Self(nanos))
    }

    /// From stored nanoseconds.
    pub fn from_unix_nanos(nanos: i128) -> Self {
        Self(nanos)
    }

    /// Nanoseconds since the Unix epoch.
    pub fn unix_nanos(self) -> i128 {
        self.0
    }

    /// RFC 3339 in UTC, with as many sub-second digits as needed.
    pub fn to_rfc3339(self) -> String {
        OffsetDateTime::from_unix_timestamp_nanos(self.0)
            .ok()
            .and_then(|t| t.format(&Rfc3339).ok())
            .unwrap_or_else(|| format!("@{}ns", self.0))
    }
}

/// How a source's `created_at` is written (`created_at_format`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CreatedAtFormat {
    /// A string is RFC 3339, unless it is a plain decimal number; a
    /// number (or such a string) is Unix seconds below 10^11, else Unix
    /// milliseconds.
    #[default]
    Auto,
    /// An RFC 3339 string only.
    Rfc3339,
    /// Unix seconds, a number or a string of one, fractions allowed.
    UnixSeconds,
    /// Unix milliseconds, likewise.
    UnixMillis,
}

const NANOS_PER_S: i128 = 1_000_000_000;
const NANOS_PER_MS: i128 = 1_000_000;
/// Where auto detection reads milliseconds rather than seconds.
const AUTO_MILLIS_FROM: i128 = 100_000_000_000;
/// 9999-12-31T23:59:59.999999999Z, the last instant RFC 3339 can write.
const LATEST_NANOS: i128 = 253_402_300_799_999_999_999;

fn invalid(field: &'static str, reason: String) -> Invalid {
    Invalid::new("invalid_created_at", field, reason)
}

fn unit_name(unit: i128) -> &'static str {
    if unit == NANOS_PER_MS {
        "milliseconds"
    } else {
        "seconds"
    }
}

/// Digits, optionally a dot and more digits: no sign, no exponent.
fn is_decimal(raw: &str) -> bool {
    decimal(raw).is_some()
}

/// The whole part and the fraction's digits of a plain decimal.
fn decimal(raw: &str) -> Option<(i128, &str)> {
    let (whole, fraction) = raw.split_once('.').unwrap_or((raw, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || whole.len() > 24 || !digits(whole) || !digits(fraction) {
        return None;
    }
    if raw.ends_with('.') {
        return None;
    }
    Some((whole.parse().ok()?, fraction))
}

/// A fraction's digits of one `unit`, in nanoseconds (truncated past the
/// nanosecond).
fn fraction_nanos(fraction: &str, unit: i128) -> i128 {
    let mut nanos = 0;
    let mut scale = unit;
    for b in fraction.bytes() {
        scale /= 10;
        if scale == 0 {
            break;
        }
        nanos += i128::from(b - b'0') * scale;
    }
    nanos
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_instant_in_different_offsets_is_equal() {
        let a = CreatedAt::parse("2026-11-29T10:00:00Z", "created_at").unwrap();
        let b = CreatedAt::parse("2026-11-29T11:00:00+01:00", "created_at").unwrap();
        let c = CreatedAt::parse("2026-11-29T05:30:00.000000000-04:30", "created_at").unwrap();
        assert_eq!(a, b);
        assert_eq!(a, c);
        assert_eq!(a.to_rfc3339(), "2026-11-29T10:00:00Z");
    }

    #[test]
    fn sub_second_precision_orders() {
        let a = CreatedAt::parse("2026-11-29T10:00:00.1Z", "created_at").unwrap();
        let b = CreatedAt::parse("2026-11-29T10:00:00.100000001Z", "created_at").unwrap();
        assert!(a < b);
    }

    fn read(raw: &str, number: bool, format: CreatedAtFormat) -> Result<String, String> {
        CreatedAt::read(raw, number, format, "created_at")
            .map(CreatedAt::to_rfc3339)
            .map_err(|e| e.reason)
    }

    #[test]
    fn unix_seconds_and_milliseconds_read_as_instants() {
        use CreatedAtFormat::*;
        let at = Ok("2018-08-02T10:10:20Z".to_owned());
        // Stripe's `created`: Unix seconds, a number.
        assert_eq!(read("1533204620", true, Auto), at);
        assert_eq!(read("1533204620", true, UnixSeconds), at);
        // Zoom's `event_ts`: milliseconds.
        assert_eq!(read("1533204620000", true, Auto), at);
        assert_eq!(read("1533204620000", true, UnixMillis), at);
        // Slack's `event_ts` is a string with microseconds.
        assert_eq!(
            read("1533204620.000105", false, Auto),
            Ok("2018-08-02T10:10:20.000105Z".to_owned())
        );
        assert_eq!(
            read("1533204620000.5", true, UnixMillis),
            Ok("2018-08-02T10:10:20.0005Z".to_owned())
        );
        // An explicit unit wins over the magnitude.
        assert_eq!(
            read("1533204620", true, UnixMillis),
            Ok("1970-01-18T17:53:24.62Z".to_owned())
        );
        // A string still reads as RFC 3339 under auto.
        assert_eq!(read("2018-08-02T12:10:20+02:00", false, Auto), at);
        assert_eq!(read("0", true, Auto), Ok("1970-01-01T00:00:00Z".to_owned()));
    }

    #[test]
    fn bad_numbers_are_refused_with_the_reason() {
        use CreatedAtFormat::*;
        for (raw, number, format, says) in [
            ("-5", true, Auto, "non-negative decimal"),
            ("1e9", true, UnixSeconds, "decimal"),
            ("12.", false, UnixSeconds, "decimal"),
            ("", false, UnixMillis, "decimal"),
            ("2018-08-02T10:10:20Z", false, UnixSeconds, "Unix seconds"),
            ("1533204620", true, Rfc3339, "RFC 3339 string"),
            ("1533204620", false, Rfc3339, "RFC 3339"),
            ("253402300800", true, UnixSeconds, "past the year 9999"),
            ("99999999999999999999999", true, Auto, "past the year 9999"),
            ("9999999999999999999999999", true, Auto, "decimal"),
        ] {
            let err = read(raw, number, format).unwrap_err();
            assert!(err.contains(says), "{raw} {format:?}: {err}");
        }
        // The last second of the year 9999 still reads.
        assert_eq!(
            read("253402300799", true, UnixSeconds),
            Ok("9999-12-31T23:59:59Z".to_owned())
        );
    }

    #[test]
    fn created_at_format_names() {
        for (f, name) in [
            (CreatedAtFormat::Auto, "auto"),
            (CreatedAtFormat::Rfc3339, "rfc3339"),
            (CreatedAtFormat::UnixSeconds, "unix-seconds"),
            (CreatedAtFormat::UnixMillis, "unix-millis"),
        ] {
            assert_eq!(serde_json::to_value(f).unwrap(), name);
        }
    }

    #[test]
    fn timestamps_without_offset_or_malformed_are_refused() {
        for bad in [
            "2026-11-29T10:00:00",
            "2026-11-29",
            "yesterday",
            "1764410400",
        ] {
            let err = CreatedAt::parse(bad, "created_at").unwrap_err();
            assert!(err.reason.contains("RFC 3339"), "{bad}: {err}");
        }
    }
}
