//! Event timestamps: RFC 3339 with an offset, compared as instants.

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
