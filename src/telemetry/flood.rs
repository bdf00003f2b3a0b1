//! Lines a client causes at will: libraries that write one per bad
//! request or connection (actix-http an ERROR line for each malformed
//! request, 4,700 a second from one Python loop on the loopback), which
//! would bury dedupd's own lines, trip the journal's rate limit for the
//! whole service, or fill a log file's disk. At most one a minute of
//! them is written, unless the log level names their library.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tracing::subscriber::Interest;
use tracing::{Level, Metadata};
use tracing_subscriber::filter::{DynFilterFn, LevelFilter};
use tracing_subscriber::layer::Context;

/// The targets whose lines a client causes: the HTTP/1 connection's
/// dispatcher (a request that does not parse, a peer gone mid-answer) and
/// its request decoder.
const CLIENT_CAUSED: &[&str] = &["actix_http::h1::dispatcher", "actix_http::h1::decoder"];

/// The library a level names to see every one of those lines.
pub const LIBRARY: &str = "actix_http";

/// How often one of those lines is written.
const EVERY: Duration = Duration::from_secs(60);

/// Whether the level names [`LIBRARY`] (every line is then written).
static NAMED: AtomicBool = AtomicBool::new(false);

/// When the last of those lines was written: milliseconds since [`START`],
/// plus one (0: never).
static LAST: AtomicU64 = AtomicU64::new(0);
static START: OnceLock<Instant> = OnceLock::new();

/// Follows the log level in force: one that names [`LIBRARY`] lets every
/// line of it through.
pub fn level_set(level: &str) {
    NAMED.store(level.contains(LIBRARY), Ordering::Relaxed);
}

fn client_caused(meta: &Metadata<'_>) -> bool {
    CLIENT_CAUSED.iter().any(|t| meta.target().starts_with(t))
}

/// Whether a line of `meta` may be written now: any other line always,
/// and those below WARN (written only at a level that asks for them).
fn allowed(meta: &Metadata<'_>) -> bool {
    if !client_caused(meta) || *meta.level() > Level::WARN || NAMED.load(Ordering::Relaxed) {
        return true;
    }
    let now = START.get_or_init(Instant::now).elapsed();
    let now = u64::try_from(now.as_millis())
        .unwrap_or(u64::MAX)
        .saturating_add(1);
    let last = LAST.load(Ordering::Relaxed);
    let every = u64::try_from(EVERY.as_millis()).unwrap_or(u64::MAX);
    if last != 0 && now < last.saturating_add(every) {
        return false;
    }
    // One writer a minute, however many threads ask at once.
    LAST.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
        .is_ok()
}

/// The filter: client-caused lines at most once a [`EVERY`], asked at
/// each line; every other callsite is let through once and for all.
pub fn filter<S>() -> DynFilterFn<
    S,
    impl Fn(&Metadata<'_>, &Context<'_, S>) -> bool,
    impl Fn(&'static Metadata<'static>) -> Interest,
> {
    DynFilterFn::new(|meta: &Metadata<'_>, _: &Context<'_, S>| allowed(meta))
        // Lets every level through itself: combined with the level's
        // filter (the lower hint wins, and none is the lowest), the
        // process keeps that filter's hint, which `log`'s gate and every
        // callsite's shortcut follow.
        .with_max_level_hint(LevelFilter::TRACE)
        .with_callsite_filter(|meta: &'static Metadata<'static>| {
            if client_caused(meta) {
                Interest::sometimes()
            } else {
                Interest::always()
            }
        })
}

#[cfg(test)]
mod tests {
    use tracing_subscriber::Registry;
    use tracing_subscriber::filter::{EnvFilter, FilterExt as _, LevelFilter};
    use tracing_subscriber::layer::Filter;

    /// With it, the level's filter still says the most verbose level any
    /// line may have: without a hint of its own, it said none, which reads
    /// as TRACE, and every `log` debug line of the libraries was formed
    /// and filtered line by line.
    #[test]
    fn the_levels_hint_is_kept() {
        let combined = EnvFilter::new("info").and(super::filter::<Registry>());
        assert_eq!(
            Filter::<Registry>::max_level_hint(&combined),
            Some(LevelFilter::INFO)
        );
    }
}
