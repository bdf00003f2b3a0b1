//! `created_at` parsing: RFC 3339 and near-misses (years of many digits,
//! a hundred thousand fractional digits, offsets out of range, leap
//! seconds, separators repeated), and any text.

use dedupd::domain::CreatedAt;
use proptest::prelude::*;

use crate::{bounded, config, hostile_text, serial};

/// Timestamps that are RFC 3339, or nearly: each part in or out of range.
fn near_rfc3339() -> impl Strategy<Value = String> {
    let year = prop_oneof!["[0-9]{4}", "[0-9]{0,12}", Just("-0001".to_owned())];
    let two = prop_oneof!["[0-9]{2}", "[0-9]{0,3}"];
    let fraction = prop_oneof![
        Just(String::new()),
        "\\.[0-9]{1,12}",
        (0usize..100_000).prop_map(|n| format!(".{}", "9".repeat(n))),
        Just(".".to_owned()),
    ];
    let offset = prop_oneof![
        Just("Z".to_owned()),
        Just("z".to_owned()),
        "[+-][0-9]{2}:[0-9]{2}",
        "[+-][0-9]{0,5}",
        Just(String::new()),
    ];
    (
        year,
        two.clone(),
        two.clone(),
        prop::sample::select(vec!["T", "t", " ", "_"]),
        two.clone(),
        two.clone(),
        two,
        fraction,
        offset,
    )
        .prop_map(|(y, mo, d, t, h, mi, s, f, o)| format!("{y}-{mo}-{d}{t}{h}:{mi}:{s}{f}{o}"))
}

/// Any text answers; an accepted timestamp prints as RFC 3339 that parses
/// back to the same instant — or, for the few instants RFC 3339 cannot
/// write in UTC (`0000-01-01T00:30:00+01:00` is in year -1), as
/// `@<nanoseconds>ns`, the documented fallback.
#[test]
fn created_at_parses_or_refuses_any_text() {
    let _serial = serial();
    let raw = prop_oneof![2 => near_rfc3339(), 1 => hostile_text()];
    proptest!(config(), |(raw in raw)| {
        bounded(|| {
            if let Ok(at) = CreatedAt::parse(&raw, "created_at") {
                let printed = at.to_rfc3339();
                if let Some(nanos) = printed.strip_prefix('@') {
                    prop_assert_eq!(nanos, format!("{}ns", at.unix_nanos()));
                } else {
                    prop_assert_eq!(CreatedAt::parse(&printed, "created_at"), Ok(at), "{}", printed);
                }
            }
            Ok(())
        })?;
    });
}

/// Unix-time `created_at`, in every format: numbers and near-numbers of
/// any length (a hundred thousand digits, fractions of any length, signs,
/// exponents). Any input answers; an accepted one is an instant RFC 3339
/// can write, and a plain whole number of seconds reads as exactly that.
#[test]
fn unix_created_at_reads_or_refuses_any_number() {
    use dedupd::domain::CreatedAtFormat;
    let _serial = serial();
    let raw = prop_oneof![
        2 => "[0-9]{1,30}(\\.[0-9]{0,30})?",
        1 => (0usize..100_000).prop_map(|n| "9".repeat(n)),
        1 => (0usize..100_000).prop_map(|n| format!("1.{}", "5".repeat(n))),
        1 => "[-+]?[0-9]{0,12}[eE.]?[-+]?[0-9]{0,5}",
        1 => hostile_text(),
    ];
    let format = prop::sample::select(vec![
        CreatedAtFormat::Auto,
        CreatedAtFormat::Rfc3339,
        CreatedAtFormat::UnixSeconds,
        CreatedAtFormat::UnixMillis,
    ]);
    proptest!(config(), |(raw in raw, format in format, number in any::<bool>())| {
        bounded(|| {
            if let Ok(at) = CreatedAt::read(&raw, number, format, "created_at") {
                let printed = at.to_rfc3339();
                prop_assert!(!printed.starts_with('@'), "{} read as {}", raw, printed);
                if format == CreatedAtFormat::UnixSeconds
                    && let Ok(s) = raw.parse::<i128>()
                {
                    prop_assert_eq!(at.unix_nanos(), s * 1_000_000_000);
                }
            }
            Ok(())
        })?;
    });
}
