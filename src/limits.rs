//! Open files: what the settings need against `RLIMIT_NOFILE`.
//!
//! Every client connection (HTTP and Redis protocol) and every delivery's
//! connection is a descriptor. A soft limit below what the settings allow
//! (Debian's default is 1024, and the defaults allow 1024 HTTP connections
//! alone) makes `accept` fail under load long before `max_connections`
//! says no, with errors that do not name the cause. `serve` checks at
//! start: it raises the soft limit to the hard limit when the settings need
//! more, and warns when even the hard limit is short.

use crate::config::Settings;

/// Descriptors beside the connections: the data file and its log, the
/// listeners, the runtimes' epoll and event descriptors, stdio and the
/// journal, Redis connections (`storage.backend = "redis"`), DNS lookups.
pub const MARGIN: u64 = 256;

/// Soft limit raised to when the hard limit is unlimited: no kernel takes
/// `RLIM_INFINITY` for open files (`fs.nr_open` caps it, 1048576 by default).
const UNLIMITED_TARGET: u64 = 1 << 20;

/// Descriptors the settings may hold at once: `http.max_connections`,
/// `resp.max_connections` when the Redis-protocol listener is on, the
/// gateway's deliveries in flight (`gateway.max_in_flight`) plus the idle
/// connections its pool keeps per destination (one destination per source
/// at most), and [`MARGIN`].
pub fn needed(s: &Settings) -> u64 {
    let resp = if s.resp.listen.is_some() {
        s.resp.max_connections
    } else {
        0
    };
    // The pool keeps, per destination host, as many idle connections as the
    // largest per-source limit (capped by the global one).
    let idle_per_destination = s
        .sources
        .values()
        .map(|src| src.max_in_flight)
        .max()
        .unwrap_or(0)
        .min(s.gateway.max_in_flight);
    // `[alerts]` is one destination more.
    let destinations = s.sources.len() + usize::from(s.alerts.is_some());
    let delivery = s.gateway.max_in_flight + destinations * idle_per_destination;
    [s.http.max_connections, resp, delivery]
        .into_iter()
        .map(|n| u64::try_from(n).unwrap_or(u64::MAX))
        .fold(MARGIN, u64::saturating_add)
}

/// What to do about the open-files limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// The soft limit covers what the settings need.
    Enough,
    /// Raise the soft limit to `to` (the hard limit), which covers it.
    Raise {
        /// The new soft limit.
        to: u64,
    },
    /// Even the hard limit is short: raise the soft limit to it (`to`,
    /// when it is above the soft limit) and warn.
    Short {
        /// The new soft limit, if it can go up at all.
        to: Option<u64>,
    },
}

/// The plan for a process whose limits are `soft` and `hard` (`infinity`
/// being the platform's `RLIM_INFINITY`) and whose settings need `needed`.
pub fn plan(needed: u64, soft: u64, hard: u64, infinity: u64) -> Plan {
    if soft >= needed {
        return Plan::Enough;
    }
    let ceiling = if hard == infinity {
        UNLIMITED_TARGET.max(needed)
    } else {
        hard
    };
    if ceiling >= needed {
        Plan::Raise { to: ceiling }
    } else {
        Plan::Short {
            to: (ceiling > soft).then_some(ceiling),
        }
    }
}

/// Checks the process's open-files limit against the settings, raises the
/// soft limit if that helps, and logs what it found. Never fails: a limit
/// that cannot be read or raised is a warning, not a reason not to serve.
pub fn ensure_open_files(s: &Settings) {
    let need = needed(s);
    let (soft, hard) = match rlimit::Resource::NOFILE.get() {
        Ok(limits) => limits,
        Err(e) => {
            tracing::warn!(error = %e, needed = need, "cannot read the open files limit (RLIMIT_NOFILE)");
            return;
        }
    };
    let raise = |to: u64| match rlimit::Resource::NOFILE.set(to, hard) {
        Ok(()) => {
            tracing::info!(
                from = soft,
                to,
                needed = need,
                "raised the open files soft limit"
            );
            true
        }
        Err(e) => {
            tracing::warn!(error = %e, soft, to, "cannot raise the open files soft limit");
            false
        }
    };
    let short = |have: u64| {
        tracing::warn!(
            limit = have,
            needed = need,
            "the open files limit (RLIMIT_NOFILE) is below what the settings allow \
             (http.max_connections + resp.max_connections + gateway.max_in_flight and its \
             idle connections + {MARGIN}): connections beyond it fail to open. Raise it \
             (LimitNOFILE= in the unit, ulimit -n) or lower those settings"
        );
    };
    match plan(need, soft, hard, rlimit::INFINITY) {
        Plan::Enough => {
            tracing::debug!(soft, hard, needed = need, "open files limit");
        }
        Plan::Raise { to } => {
            if !raise(to) {
                short(soft);
            }
        }
        Plan::Short { to } => {
            let have = match to {
                Some(to) if raise(to) => to,
                _ => soft,
            };
            short(have);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::config::sources::SourceSettings;

    const INF: u64 = u64::MAX;

    fn source(max_in_flight: usize) -> SourceSettings {
        let text = format!(
            "scheme = \"sume\"\nevent_id = \"body:/id\"\nforward_to = \"http://127.0.0.1:1/\"\n\
             max_in_flight = {max_in_flight}\n"
        );
        toml::from_str(&text).expect("source")
    }

    #[test]
    fn the_defaults_need_http_and_deliveries_and_the_margin() {
        let s = Settings::default();
        assert_eq!(needed(&s), 1024 + 256 + MARGIN);
    }

    #[test]
    fn the_redis_protocol_counts_when_it_listens_and_each_destination_its_idle_pool() {
        let mut s = Settings::default();
        s.resp.listen = Some("127.0.0.1:6380".parse().expect("addr"));
        s.resp.max_connections = 500;
        s.http.max_connections = 2000;
        s.gateway.max_in_flight = 100;
        s.sources = BTreeMap::from([("a".into(), source(16)), ("b".into(), source(40))]);
        assert_eq!(needed(&s), 2000 + 500 + 100 + 2 * 40 + MARGIN);
        // A source's limit above the global one pools no more than it.
        s.sources = BTreeMap::from([("a".into(), source(4000))]);
        assert_eq!(needed(&s), 2000 + 500 + 100 + 100 + MARGIN);
    }

    #[test]
    fn a_short_soft_limit_is_raised_to_the_hard_one_and_a_short_hard_one_warned() {
        assert_eq!(plan(1536, 1536, 4096, INF), Plan::Enough);
        assert_eq!(plan(1536, 1024, 4096, INF), Plan::Raise { to: 4096 });
        assert_eq!(plan(1536, 1024, 1536, INF), Plan::Raise { to: 1536 });
        assert_eq!(plan(1536, 1024, 1200, INF), Plan::Short { to: Some(1200) });
        assert_eq!(plan(1536, 1024, 1024, INF), Plan::Short { to: None });
        // No hard limit: raised far enough, not to "infinity", which the
        // kernel refuses for open files.
        assert_eq!(plan(1536, 1024, INF, INF), Plan::Raise { to: 1 << 20 });
        assert_eq!(
            plan(2_000_000, 1024, INF, INF),
            Plan::Raise { to: 2_000_000 }
        );
    }
}
