//! What the test binaries share: the real app on port 0 with a manual
//! clock (`app`), the gateway fixture (`gateway`), a real HTTP receiver
//! (`receiver`), an HTTP client (`http`), the `dedupd` binary as a process
//! (`process`), what an attacker reads back from files (`recover`), real `redis-server` and Redis Cluster processes (`redis`),
//! a fleet's Redis and what its instances show (`fleet`), loopback ports
//! (`ports`). Each binary includes it with
//! `#[path = "../support/mod.rs"] mod support;` and uses what it needs.
#![allow(dead_code)]

pub mod app;
#[cfg(feature = "redis")]
pub mod fleet;
pub mod gateway;
pub mod http;
pub mod ports;
pub mod process;
pub mod receiver;
pub mod recover;
#[cfg(feature = "redis")]
pub mod redis;
