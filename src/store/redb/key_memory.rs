//! How much memory the in-memory index may take
//! (`storage.max_key_memory_bytes`).
//!
//! Claims and the Redis-protocol keyspace keep every key in memory
//! ([`super::kv_index`]): about 275 bytes for a claim with a 26-byte key,
//! over 4 KiB for a Redis-protocol key at its 4 KiB limit. Without a cap,
//! a client allowed to write could grow the process until the kernel
//! killed it, and the restart, which rebuilds the index from the file,
//! would be killed the same way. The index estimates what its keys take
//! ([`super::kv_index::Slot::cost`]); at the cap, writes by clients that
//! would add a key are refused (HTTP 507, a Redis `-OOM` error) until the
//! reaper deletes expired ones, and everything else goes on.
//!
//! `0` (the default) takes half of the memory this process may use (the
//! machine's, or its cgroup's limit when lower) less twice redb's page
//! cache: the cache itself, and the copy of a checkpoint's page writes
//! held while the flusher writes them ([`super::pending_pages`]: redb's
//! write buffer, at most half the cache, in a buffer that may have grown
//! to twice what it holds).

use std::path::Path;

/// The automatic cap never goes below this.
pub const AUTO_MIN: u64 = 8 << 20;

/// Memory assumed when neither the kernel nor a cgroup says.
const FALLBACK_MEMORY: u64 = 1 << 30;

/// The cap for the setting `setting` (0: automatic), in bytes, with redb's
/// page cache of `cache_bytes`.
pub fn resolve(setting: u64, cache_bytes: u64) -> u64 {
    if setting != 0 {
        return setting;
    }
    auto(memory_limit().unwrap_or(FALLBACK_MEMORY), cache_bytes)
}

/// The automatic cap with `memory` bytes to go by: half of them less the
/// page cache and the held copy of a checkpoint's pages (up to as much
/// again), at least [`AUTO_MIN`].
pub fn auto(memory: u64, cache_bytes: u64) -> u64 {
    (memory / 2)
        .saturating_sub(cache_bytes.saturating_mul(2))
        .max(AUTO_MIN)
}

/// The memory this process may use: the machine's, or the lowest limit of
/// its cgroup and the cgroups above it when lower (cgroup v2 `memory.max`,
/// v1 `memory.limit_in_bytes`).
pub fn memory_limit() -> Option<u64> {
    // sysinfo(2) first: the unit's `ProcSubset=pid` hides /proc/meminfo,
    // and without it the cap was the fallback's (384 MiB, on any machine).
    let total = machine_memory().or_else(|| {
        std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|s| mem_total(&s))
    });
    let cgroup = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|s| cgroup_limit(&s, Path::new("/sys/fs/cgroup")));
    lowest(total, cgroup)
}

fn lowest(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The machine's memory by `sysinfo(2)`, which needs no `/proc`.
fn machine_memory() -> Option<u64> {
    let info = rustix::system::sysinfo();
    #[allow(
        clippy::useless_conversion,
        reason = "a C unsigned long: 32 bits on 32-bit targets"
    )]
    let total = u64::from(info.totalram);
    total
        .checked_mul(u64::from(info.mem_unit.max(1)))
        .filter(|&bytes| bytes > 0)
}

/// `MemTotal` of `/proc/meminfo`, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The lowest memory limit of this process's cgroup (`/proc/self/cgroup`
/// as `cgroups`) and those above it, read under `root`; `None` when
/// unlimited or unknown. The hierarchy's own root is read too: in a
/// container the process's cgroup is often mounted there, while
/// `/proc/self/cgroup` names the host's path.
fn cgroup_limit(cgroups: &str, root: &Path) -> Option<u64> {
    let read = |path: &Path| -> Option<u64> {
        let s = std::fs::read_to_string(path).ok()?;
        // "max" (v2) or a huge number (v1) when unlimited.
        s.trim().parse().ok().filter(|&n: &u64| n < 1 << 60)
    };
    let mut limit = None;
    for line in cgroups.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let (base, file) = if controllers.is_empty() {
            (root.to_path_buf(), "memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            (root.join("memory"), "memory.limit_in_bytes")
        } else {
            continue;
        };
        // The cgroup, each one above it, and the hierarchy's root; only
        // the root for a path outside this namespace's view ("/../x").
        let path = path.trim_start_matches('/');
        let path = if path.split('/').any(|c| c == "..") {
            ""
        } else {
            path
        };
        let mut dir = Some(Path::new(path));
        while let Some(d) = dir {
            limit = lowest(limit, read(&base.join(d).join(file)));
            dir = d.parent();
        }
    }
    limit
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn automatic_is_half_the_memory_less_the_page_cache_twice_with_a_floor() {
        assert_eq!(auto(24 << 30, 64 << 20), (12 << 30) - (128 << 20));
        assert_eq!(
            auto(256 << 20, 64 << 20),
            AUTO_MIN,
            "half is the cache twice"
        );
        assert_eq!(auto(512 << 20, 64 << 20), 128 << 20);
        assert_eq!(resolve(4096, 64 << 20), 4096, "a set cap is taken as it is");
        assert!(resolve(0, 64 << 20) >= AUTO_MIN);
    }

    /// Once: under the unit's `ProcSubset=pid` /proc/meminfo is hidden,
    /// and the cap fell back to 384 MiB on any machine. The kernel's own
    /// figure is read without /proc, and says what /proc/meminfo says.
    #[test]
    fn the_machines_memory_is_read_without_proc_and_matches_meminfo() {
        let by_sysinfo = machine_memory().expect("sysinfo(2) answers on Linux");
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
        assert_eq!(Some(by_sysinfo), mem_total(&meminfo));
    }

    #[test]
    fn the_memory_total_is_read_in_bytes() {
        let meminfo = "MemTotal:       24683584 kB\nMemFree:        18107000 kB\n";
        assert_eq!(mem_total(meminfo), Some(24_683_584 * 1024));
        assert_eq!(mem_total("MemFree: 1 kB\n"), None);
    }

    #[test]
    fn a_cgroup_limit_is_the_lowest_of_the_cgroup_its_parents_and_the_root() {
        let root = std::env::temp_dir().join(format!("dedupd-cgroup-{}", std::process::id()));
        let v2 = root.join("system.slice/dedupd.service");
        let v1 = root.join("memory/box");
        std::fs::create_dir_all(&v2).unwrap();
        std::fs::create_dir_all(&v1).unwrap();
        std::fs::write(v2.join("memory.max"), "536870912\n").unwrap();
        std::fs::write(v1.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        assert_eq!(
            cgroup_limit("0::/system.slice/dedupd.service\n", &root),
            Some(512 << 20)
        );
        assert_eq!(
            cgroup_limit("4:memory:/box\n1:cpu:/\n", &root),
            None,
            "v1's unlimited"
        );
        // A slice's limit above the service's counts.
        std::fs::write(root.join("system.slice/memory.max"), "268435456\n").unwrap();
        assert_eq!(
            cgroup_limit("0::/system.slice/dedupd.service\n", &root),
            Some(256 << 20)
        );
        // A container: its cgroup is the hierarchy's root, while
        // /proc/self/cgroup names a path that does not exist there.
        std::fs::write(root.join("memory/memory.limit_in_bytes"), "134217728\n").unwrap();
        assert_eq!(
            cgroup_limit("4:memory:/docker/0123abcd\n", &root),
            Some(128 << 20)
        );
        // A path outside the namespace's view: only the root is read.
        assert_eq!(
            cgroup_limit("4:memory:/../../escape\n", &root),
            Some(128 << 20)
        );
        std::fs::write(root.join("system.slice/memory.max"), "max\n").unwrap();
        std::fs::write(v2.join("memory.max"), "max\n").unwrap();
        assert_eq!(
            cgroup_limit("0::/system.slice/dedupd.service\n", &root),
            None
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}
