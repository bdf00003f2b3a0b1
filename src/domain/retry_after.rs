//! How long a refused client waits before trying again. The limiter in
//! `auth` decides it; an HTTP answer carries it in `Retry-After`, the Redis
//! protocol in its error text. Here, below both, so neither imports the
//! other for it.

/// A throttled peer may try again after this long (whole seconds, at
/// least 1, as `Retry-After` says it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryAfter {
    /// Seconds until the peer's window passes, rounded up.
    pub secs: u64,
}
