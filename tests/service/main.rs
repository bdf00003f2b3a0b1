//! The service from outside, all in one binary: the real application on
//! port 0 (in process, with a manual clock) or the real `dedupd` binary as
//! a process, over HTTP, the Redis protocol and the command line. One file
//! per feature a user would name; the fixtures are in `tests/support`.
#![allow(clippy::unwrap_used)]

#[path = "../support/mod.rs"]
mod support;

mod alerts;
mod auth;
mod backup;
mod bad_input;
mod circuit_breaker;
mod claim_results;
mod claims;
mod cli_operator;
mod cli_output;
mod cli_tour;
mod config;
mod crash_and_restart;
mod credentials;
mod cross_site;
mod delivery;
mod destinations;
mod disk_full;
mod erasure;
#[cfg(feature = "redis")]
mod failover;
#[cfg(feature = "redis")]
mod fleet;
#[cfg(feature = "redis")]
mod fleet_alerts;
#[cfg(feature = "redis")]
mod fleet_lanes;
mod gateway_ingest;
mod http_limits;
mod jobs;
mod key_file;
mod key_memory;
mod leaks;
mod lease_ahead;
mod logging;
mod metrics;
mod monitoring;
mod openapi;
mod operator_api;
mod ordering;
mod package_pages;
mod providers;
mod proxy;
#[cfg(feature = "redis")]
mod redis_backend;
#[cfg(feature = "redis")]
mod redis_gateway;
mod reload;
mod resp;
mod routing;
mod scans;
#[cfg(feature = "redis")]
mod shared_inbox;
mod sync_mode;
mod systemd;
mod traces;
mod upgrade;
