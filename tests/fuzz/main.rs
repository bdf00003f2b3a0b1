//! Fuzz targets on stable Rust: proptest generators aimed at the shapes an
//! attacker sends — deep nesting, huge declared lengths, long headers,
//! invalid UTF-8, separators repeated thousands of times — fed to every
//! parser of bytes dedupd does not control. Each target asserts what the
//! parser must never do: panic, overflow its stack, or allocate by a length
//! it was told; and, where there is one, a property of its answer.
//!
//! One module per parser:
//! - `signatures`: each signature scheme's header parsing and verification;
//! - `locators`: field locators, over arbitrary bodies, through ingest;
//! - `created_at`: RFC 3339 `created_at` parsing;
//! - `wal`: the write-ahead log's decoder (and opening a store over a
//!   hostile log);
//! - `config`: TOML text and `DEDUPD_*` values through settings loading;
//! - `resp`: RESP frames (the request parser, cut into arbitrary reads)
//!   and whole pipelines of commands through a real connection.
//!
//! How much: [`cases`] per target, 256 by default (the whole binary stays
//! within seconds in a debug build, so CI runs it with `cargo test`).
//! `DEDUPD_FUZZ_CASES=1000000 cargo test --test fuzz` is a long run.
//!
//! How the never-dos are caught:
//! - a panic fails the case, and proptest shrinks it to a small input;
//! - the stack: each case runs on the test's thread, 2 MiB like tokio's and
//!   actix's workers; recursion without a bound aborts the binary with
//!   "has overflowed its stack";
//! - memory: the binary's allocator is [`cap::Cap`] over the system's, and
//!   [`bounded`] lets a case allocate at most [`BUDGET`] beyond what was
//!   live when it started. An allocation past that fails, which aborts the
//!   binary with "memory allocation of N bytes failed": a parser that
//!   trusted a declared length. (The targets take turns, see [`serial`], so
//!   the budget is one case's alone.)
#![allow(clippy::unwrap_used)]

mod config;
mod created_at;
mod locators;
mod resp;
mod signatures;
mod wal;

use std::alloc::System;
use std::sync::{Mutex, MutexGuard, PoisonError};

use proptest::prelude::*;

#[global_allocator]
static ALLOCATOR: cap::Cap<System> = cap::Cap::new(System, usize::MAX);

/// Most bytes one case may allocate beyond what was live when it started:
/// far above what any input here needs (at most a few hundred KB, a few
/// times over), far below a declared length taken on trust (the smallest
/// one generated is 256 MiB).
pub const BUDGET: usize = 64 * 1024 * 1024;

/// Cases per target: `DEDUPD_FUZZ_CASES`, or 256.
pub fn cases() -> u32 {
    std::env::var("DEDUPD_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

/// The proptest settings of a target running `cases`: no regression files
/// written into the tree (a failure prints its minimal input instead).
pub fn config_with(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// [`config_with`] for [`cases`].
pub fn config() -> ProptestConfig {
    config_with(cases())
}

static SERIAL: Mutex<()> = Mutex::new(());

/// Held for a whole target: targets run one at a time, so what a case
/// allocates is its own.
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs one case with an allocation limit of [`BUDGET`] beyond what is
/// live now; the limit is lifted again however the case ends.
pub fn bounded(case: impl FnOnce() -> Result<(), TestCaseError>) -> Result<(), TestCaseError> {
    struct Lift;
    impl Drop for Lift {
        fn drop(&mut self) {
            let _ = ALLOCATOR.set_limit(usize::MAX);
        }
    }
    let _lift = Lift;
    let _ = ALLOCATOR.set_limit(ALLOCATOR.allocated().saturating_add(BUDGET));
    case()
}

/// Text in the shapes that break parsers: anything, one character repeated
/// up to 100 000 times (separators, brackets, digits), nesting openers,
/// and a valid-looking prefix with such a tail.
pub fn hostile_text() -> impl Strategy<Value = String> {
    let repeated = (
        prop::sample::select(vec![
            ",", "=", ";", " ", "[", "{", "{\"a\":", "\"", "\\", ".", ":", "0", "9", "v1=", "v1,",
            "t=", "~", "/", "-", "+", "\u{1b}", "\0", "é", "\u{202e}",
        ]),
        0usize..100_000,
    )
        .prop_map(|(s, n)| s.repeat(n));
    prop_oneof![
        3 => any::<String>(),
        2 => "[ -~]{0,64}",
        2 => repeated.clone(),
        1 => ("[ -~]{0,16}", repeated).prop_map(|(a, b)| a + &b),
    ]
}

/// Bytes in the same shapes, and invalid UTF-8.
pub fn hostile_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => prop::collection::vec(any::<u8>(), 0..512),
        2 => hostile_text().prop_map(String::into_bytes),
        1 => (prop::collection::vec(any::<u8>(), 0..16), 0usize..50_000)
            .prop_map(|(unit, n)| unit.repeat(n)),
        1 => prop::sample::select(vec![
            b"\xff\xfe".to_vec(),
            b"\xc3\x28".to_vec(),
            b"\xed\xa0\x80".to_vec(),
            b"\xf4\x90\x80\x80".to_vec(),
            b"\x80".repeat(1000),
        ]),
    ]
}
