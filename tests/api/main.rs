//! HTTP tests of the real application, all in one binary.
#![allow(clippy::unwrap_used)]

mod auth;
mod bad_input;
mod browser;
mod claims;
mod cli;
mod cli_operator;
mod cli_tour;
mod concurrency;
mod console;
mod crash;
mod delivery;
mod disk;
mod edge;
mod gateway;
mod helpers;
mod leaks;
mod metrics;
mod openapi;
mod proxy;
mod receiver;
#[cfg(feature = "redis")]
mod redis_backend;
#[cfg(feature = "redis")]
mod redis_gateway;
#[cfg(feature = "redis")]
#[path = "../common/redis_server.rs"]
mod redis_server;
mod replay;
mod resp;
mod restart;
mod streams;
mod systemd;
