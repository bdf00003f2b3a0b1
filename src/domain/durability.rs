//! What an acknowledged write survives with the Redis backend, as
//! `storage.redis.durability` writes it: `"server"`, `"fsync"` or
//! `"replicas = N"`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Most replicas a write may wait for.
pub const MAX_REPLICAS: u32 = 16;

/// What a 2xx promises about a write to Redis.
/// In settings, the text it parses from (`"replicas = 1"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Durability {
    /// Whatever the server is configured to do (its `appendonly` and
    /// `appendfsync`): dedupd checks nothing and waits for nothing.
    #[default]
    Server,
    /// The server syncs every write before it answers (`appendonly yes`,
    /// `appendfsync always`): dedupd is not ready while it does not.
    Fsync,
    /// At least this many replicas have the write (`WAIT N timeout` after
    /// it): otherwise the answer is 503.
    Replicas(u32),
}

impl FromStr for Durability {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let expected = format!(
            "expected \"server\", \"fsync\" or \"replicas = N\" with N from 1 to {MAX_REPLICAS}"
        );
        match s.trim() {
            "server" => return Ok(Self::Server),
            "fsync" => return Ok(Self::Fsync),
            _ => {}
        }
        let (word, n) = s.split_once('=').ok_or_else(|| expected.clone())?;
        if word.trim() != "replicas" {
            return Err(expected);
        }
        match n.trim().parse::<u32>() {
            Ok(n) if (1..=MAX_REPLICAS).contains(&n) => Ok(Self::Replicas(n)),
            _ => Err(expected),
        }
    }
}

impl fmt::Display for Durability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Server => f.write_str("server"),
            Self::Fsync => f.write_str("fsync"),
            Self::Replicas(n) => write!(f, "replicas = {n}"),
        }
    }
}

impl TryFrom<String> for Durability {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<Durability> for String {
    fn from(v: Durability) -> Self {
        v.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_forms_parse_and_print_back() {
        for (text, want) in [
            ("server", Durability::Server),
            (" fsync ", Durability::Fsync),
            ("replicas = 1", Durability::Replicas(1)),
            ("replicas=16", Durability::Replicas(16)),
        ] {
            let d: Durability = text.parse().unwrap();
            assert_eq!(d, want, "{text}");
            assert_eq!(d.to_string().parse::<Durability>().unwrap(), d);
        }
    }

    #[test]
    fn anything_else_is_refused_saying_what_is_expected() {
        for bad in [
            "",
            "always",
            "replicas",
            "replicas = 0",
            "replicas = 17",
            "replicas = -1",
            "replica = 1",
            "fsync = 1",
        ] {
            let e = bad.parse::<Durability>().unwrap_err();
            assert!(e.contains("\"replicas = N\""), "{bad}: {e}");
        }
    }
}
