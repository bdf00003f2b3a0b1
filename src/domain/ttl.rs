//! Time-to-live values, bounded by configuration.

use std::time::Duration;

use super::Invalid;
use crate::clock::Millis;

/// A TTL in milliseconds, at least 1 and at most the configured maximum.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct Ttl(u64);

impl Ttl {
    /// The TTL in milliseconds.
    pub fn as_ms(self) -> u64 {
        self.0
    }

    /// The expiry instant of a record written at `now` with this TTL.
    pub fn expires_at(self, now: Millis) -> Millis {
        now.saturating_add(self.0)
    }

    /// A TTL known to be valid, for tests and internal callers. Saturates to
    /// at least 1 ms.
    pub fn from_ms_unchecked(ms: u64) -> Self {
        Self(ms.max(1))
    }
}

/// The configured defaults and ceiling for TTLs.
#[derive(Debug, Clone, Copy)]
pub struct TtlBounds {
    /// TTL of a claim (and of an extend) when the request names none.
    pub default_claim: Ttl,
    /// TTL of a done record when the request names none.
    pub default_done: Ttl,
    /// Largest TTL a request may ask for, in milliseconds.
    pub max_ms: u64,
}

impl TtlBounds {
    /// Bounds from durations; the caller has checked they are ordered.
    pub fn new(default_claim: Duration, default_done: Duration, max: Duration) -> Self {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        Self {
            default_claim: Ttl::from_ms_unchecked(ms(default_claim)),
            default_done: Ttl::from_ms_unchecked(ms(default_done)),
            max_ms: ms(max),
        }
    }

    /// Parses a requested `ttl_ms`, falling back to `default`.
    pub fn parse(&self, requested: Option<u64>, default: Ttl) -> Result<Ttl, Invalid> {
        match requested {
            None => Ok(default),
            Some(0) => Err(Invalid::new("invalid_ttl", "ttl_ms", "must be at least 1")),
            Some(ms) if ms > self.max_ms => Err(Invalid::new(
                "invalid_ttl",
                "ttl_ms",
                format!("must be at most {} (the configured maximum)", self.max_ms),
            )
            .at_most(self.max_ms)),
            Some(ms) => Ok(Ttl(ms)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_are_bounded() {
        let b = TtlBounds::new(
            Duration::from_secs(300),
            Duration::from_secs(600),
            Duration::from_secs(1_000),
        );
        assert_eq!(b.parse(None, b.default_claim).unwrap().as_ms(), 300_000);
        assert!(b.parse(Some(0), b.default_claim).is_err());
        assert_eq!(b.parse(Some(1), b.default_claim).unwrap().as_ms(), 1);
        assert!(b.parse(Some(1_000_000), b.default_claim).is_ok());
        let over = b.parse(Some(1_000_001), b.default_claim).unwrap_err();
        assert_eq!((over.code, over.maximum), ("invalid_ttl", Some(1_000_000)));
        assert_eq!(b.parse(Some(0), b.default_claim).unwrap_err().maximum, None);
    }
}
