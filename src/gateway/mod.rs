//! The webhook gateway.

pub mod signature;
