//! dedupd: webhook processing that happens once in effect.
//!
//! A map of the crate, from the outside in:
//!
//! - [`config`]: settings from defaults, a TOML file and `DEDUPD_*` variables,
//!   validated into [`config::Settings`].
//! - [`startup`]: [`startup::Application`] binds the listener, opens the store,
//!   starts the reaper; tests build it on port 0.
//! - [`gate`]: the one middleware in front of every route: the request's
//!   record, and the host, origin and token checks of [`auth`].
//! - [`routes`]: one module per HTTP resource; handlers see parsed types only.
//! - [`domain`]: types that cannot hold invalid input (keys, TTLs, tokens,
//!   fingerprints, event timestamps).
//! - [`error`]: the one error type the API renders as RFC 9457 problem details.
//! - [`store`]: the [`store::Store`] trait (claims, ordering, expiry), the
//!   gateway inbox and the Redis-protocol keyspace, opened from the settings
//!   by [`store::open`]; the embedded redb engine (one data file, a
//!   group-commit writer, a write-ahead log, backups taken while it
//!   serves) and the Redis backend.
//! - [`reaper`]: the task that deletes expired records in expiry order.
//! - [`reload`]: SIGHUP's reload of the sources, API tokens and log level
//!   while serving.
//! - [`resp`]: the Redis-protocol listener (SET/GET/DEL/EXPIRE/… over the
//!   keyspace in the data file).
//! - [`connections`]: the HTTP connections a stop waits for, and those it
//!   closes (a backup's answer it abandoned).
//! - [`limits`]: the open-files limit the settings need, checked at start.
//! - [`scheduling`]: with one CPU, `SCHED_BATCH` for the process.
//! - [`clock`]: wall-clock time in Unix milliseconds, replaceable in tests.
//! - [`telemetry`]: tracing setup.
//! - [`http_client`]: the HTTP client builder (reqwest over rustls on ring)
//!   for delivery and the CLI.
//! - [`redact`]: URLs without their credentials and outside text without
//!   control characters, for everything printed or logged.
#![forbid(unsafe_code)]

pub mod auth;
pub mod clock;
pub mod config;
pub mod connections;
pub mod domain;
pub mod error;
pub mod gate;
pub mod gateway;
pub mod http_client;
pub mod huge_pages;
pub mod limits;
pub mod peers;
pub mod reaper;
pub mod redact;
pub mod reload;
pub mod resp;
pub mod routes;
pub mod scheduling;
pub mod startup;
pub mod store;
pub mod systemd;
pub mod telemetry;
