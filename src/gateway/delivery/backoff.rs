//! The retry policy of one event: exponential backoff with jitter.

use rand::Rng;

use crate::clock::Millis;
use crate::gateway::Source;

/// Delay before the attempt after `attempt` failures: `backoff_min`
/// doubled per failure, capped at `backoff_max`, then jittered to a uniform
/// value in [delay/2, delay] so retries of many events spread out.
pub fn backoff(source: &Source, attempt: u32) -> Millis {
    jittered(ceiling(source, attempt))
}

/// The un-jittered delay after `attempt` failures, ms.
pub fn ceiling(source: &Source, attempt: u32) -> Millis {
    let min = millis(source.backoff_min).max(1);
    let max = millis(source.backoff_max).max(min);
    let exp = attempt.saturating_sub(1).min(32);
    min.saturating_mul(1u64 << exp).min(max)
}

fn jittered(delay: Millis) -> Millis {
    rand::rng().random_range(delay / 2..=delay)
}

/// A duration in whole milliseconds, saturating.
pub fn millis(d: std::time::Duration) -> Millis {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::sources::SourceSettings;

    fn source(min: &str, max: &str) -> Source {
        let toml = format!(
            r#"
            scheme = "sume"
            event_id = "body:/id"
            forward_to = "http://127.0.0.1:9/"
            backoff_min = "{min}"
            backoff_max = "{max}"
            "#
        );
        let s: SourceSettings = toml::from_str(&toml).unwrap();
        Source::build(
            "s",
            &s,
            &["k".to_owned()],
            &["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_owned()],
        )
        .unwrap()
    }

    #[test]
    fn the_delay_doubles_per_failure_from_the_minimum() {
        let s = source("1s", "1h");
        assert_eq!(ceiling(&s, 1), 1_000);
        assert_eq!(ceiling(&s, 2), 2_000);
        assert_eq!(ceiling(&s, 3), 4_000);
        assert_eq!(ceiling(&s, 5), 16_000);
    }

    #[test]
    fn the_delay_stops_growing_at_the_maximum_even_after_many_failures() {
        let s = source("1s", "10s");
        assert_eq!(ceiling(&s, 4), 8_000);
        assert_eq!(ceiling(&s, 5), 10_000);
        assert_eq!(ceiling(&s, 1_000), 10_000);
        assert_eq!(ceiling(&s, u32::MAX), 10_000);
    }

    #[test]
    fn jitter_stays_between_half_and_the_whole_delay() {
        let s = source("100ms", "1s");
        for attempt in 1..8 {
            let max = ceiling(&s, attempt);
            for _ in 0..200 {
                let d = backoff(&s, attempt);
                assert!(
                    (max / 2..=max).contains(&d),
                    "{d} outside [{}, {max}]",
                    max / 2
                );
            }
        }
    }

    #[test]
    fn millis_saturates_instead_of_wrapping() {
        assert_eq!(millis(Duration::from_millis(1500)), 1500);
        assert_eq!(millis(Duration::MAX), u64::MAX);
    }
}
