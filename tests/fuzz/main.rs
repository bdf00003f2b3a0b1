//! Property-based fuzzing of every parser of untrusted bytes, on stable
//! Rust: generators aimed at hostile shapes (deep nesting, huge declared
//! lengths, cut-off input), asserting no panic and bounded memory.
//!
//! CI runs a bounded number of cases per target; `DEDUPD_FUZZ_CASES=N`
//! runs N per target instead (a long run).

mod resp;

use proptest::test_runner::Config;

/// A proptest config of `default` cases, or `DEDUPD_FUZZ_CASES`.
pub fn config(default: u32) -> Config {
    let cases = std::env::var("DEDUPD_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}
