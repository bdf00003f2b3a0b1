//! The operator console (`GET /ui`) in a real Chromium over WebDriver,
//! against the real app (port 0, manual clock) and a real HTTP receiver.
//! One binary, so the browser tests run (or are filtered) as a unit:
//! `cargo test --test ui`. They need `chromium` and `chromedriver` (Debian:
//! `apt-get install chromium chromium-driver`) and fail saying so without.
#![allow(clippy::unwrap_used)]

mod browser;
mod console;
#[path = "../support/mod.rs"]
mod support;
