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
