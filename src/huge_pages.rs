//! Transparent huge pages, off for the process.
//!
//! The allocator (mimalloc) asks the kernel for huge pages on its regions
//! (`MADV_HUGEPAGE`, which the common `madvise` setting honours), so the
//! memory the keys' index grows into came in 2 MiB pages, each zeroed by the
//! kernel inside the page fault of the thread that first touched it. Under
//! sustained claims the store's writer stopped for 3–7 ms about six times a
//! second that way (in a virtual machine, where a new page likely faults on
//! the host too), and every write queued behind it
//! (docs/design/sustained-claims.md). With 4 KiB pages the same zeroing is
//! spread over the writes. `serve` turns them off at start, whatever
//! `/sys/kernel/mm/transparent_hugepage/enabled` says; an operator who wants
//! them back sets mimalloc's own `MIMALLOC_ALLOW_THP=1`.

/// The environment variable that keeps huge pages on (mimalloc's own).
pub const KEEP_ENV: &str = "MIMALLOC_ALLOW_THP";

/// Turns transparent huge pages off for the whole process (the kernel's
/// flag is per process, checked at each page fault, so memory mapped
/// before this is covered too), unless [`KEEP_ENV`] asks to keep them.
/// Logs what it did; if the kernel refuses, dedupd runs with them.
pub fn turn_off() {
    if keep(std::env::var(KEEP_ENV).ok().as_deref()) {
        tracing::info!(
            env = KEEP_ENV,
            "transparent huge pages left as the kernel sets them"
        );
        return;
    }
    #[cfg(target_os = "linux")]
    if let Err(e) = rustix::thread::disable_transparent_huge_pages(true) {
        tracing::warn!(error = %e, "cannot turn transparent huge pages off: running with them");
    }
}

/// Whether `MIMALLOC_ALLOW_THP`'s value keeps huge pages on: set, and not
/// `0`, `false`, `off` or `no` (mimalloc takes an empty value as on too).
fn keep(value: Option<&str>) -> bool {
    value.is_some_and(|v| {
        !["0", "false", "off", "no"]
            .iter()
            .any(|t| v.trim().eq_ignore_ascii_case(t))
    })
}

#[cfg(test)]
mod tests {
    use super::keep;

    #[test]
    fn any_value_but_a_no_keeps_them() {
        for v in ["1", "2", "true", "ON", " yes ", ""] {
            assert!(keep(Some(v)), "{v}");
        }
        for v in ["0", "false", "OFF", " no "] {
            assert!(!keep(Some(v)), "{v}");
        }
        assert!(!keep(None));
    }
}
