//! A delivery rate limit, as a source's `rate_limit` setting writes it:
//! `"50/s"`, `"600/m"`, `"1000/h"`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Most events a rate may allow in its period.
pub const MAX_EVENTS: u32 = 1_000_000;

/// `events` per `period_ms`.
/// In settings, the text it parses from (`"50/s"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Rate {
    pub events: u32,
    pub period_ms: u64,
}

impl Rate {
    /// Events per millisecond.
    pub fn per_ms(self) -> f64 {
        f64::from(self.events) / self.period_ms as f64
    }

    /// The default burst: what the rate allows in one second, at least 1.
    pub fn default_burst(self) -> u32 {
        let per_s = (f64::from(self.events) * 1000.0 / self.period_ms as f64).ceil();
        // per_s <= MAX_EVENTS * 1000 / 1000 here: fits in u32.
        (per_s as u32).max(1)
    }
}

impl FromStr for Rate {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let expected = "expected N/s, N/m or N/h with N from 1 to 1000000, such as \"50/s\"";
        let (n, unit) = s
            .trim()
            .split_once('/')
            .ok_or_else(|| expected.to_owned())?;
        let events: u32 = n.trim().parse().map_err(|_| expected.to_owned())?;
        if events == 0 || events > MAX_EVENTS {
            return Err(expected.to_owned());
        }
        let period_ms = match unit.trim() {
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            _ => return Err(expected.to_owned()),
        };
        Ok(Self { events, period_ms })
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unit = match self.period_ms {
            1_000 => "s",
            60_000 => "m",
            _ => "h",
        };
        write!(f, "{}/{unit}", self.events)
    }
}

impl TryFrom<String> for Rate {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<Rate> for String {
    fn from(v: Rate) -> Self {
        v.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_and_print_back() {
        for (text, events, period_ms) in [
            ("50/s", 50, 1_000),
            ("600/m", 600, 60_000),
            (" 1 / h ", 1, 3_600_000),
        ] {
            let r: Rate = text.parse().unwrap();
            assert_eq!((r.events, r.period_ms), (events, period_ms));
            assert_eq!(r.to_string().parse::<Rate>().unwrap(), r);
        }
    }

    #[test]
    fn anything_else_is_refused_saying_what_is_expected() {
        for bad in [
            "",
            "50",
            "0/s",
            "-1/s",
            "50/d",
            "1000001/s",
            "x/s",
            "50/s/s",
            "5.5/s",
        ] {
            let e = bad.parse::<Rate>().unwrap_err();
            assert!(e.contains("N/s, N/m or N/h"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_default_burst_is_one_seconds_worth_and_at_least_one() {
        assert_eq!("50/s".parse::<Rate>().unwrap().default_burst(), 50);
        assert_eq!("90/m".parse::<Rate>().unwrap().default_burst(), 2);
        assert_eq!("1/h".parse::<Rate>().unwrap().default_burst(), 1);
    }
}
