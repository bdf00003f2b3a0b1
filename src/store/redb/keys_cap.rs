//! How many keys the in-memory index may hold (`storage.max_keys_in_memory`).
//!
//! Claims and the Redis-protocol keyspace keep every key in memory
//! ([`super::kv_index`]), about 275 bytes each with a 26-byte key and up to
//! about 1 KiB with a 512-byte key and a fingerprint. Without a cap, a
//! client allowed to claim could grow the process until the kernel killed
//! it, and the restart, which rebuilds the index from the file, would be
//! killed the same way. At the cap, writes that may add a key are refused
//! (HTTP 507, a Redis `-OOM` error) until the reaper deletes expired ones;
//! everything else goes on.
//!
//! `0` (the default) sizes the cap from the machine: half of its memory
//! (or of the service's memory limit, when lower) at [`AUTO_BYTES_PER_KEY`]
//! a key.

use std::path::Path;

/// Bytes per key the automatic cap assumes: about twice a claim with a
/// short key, half of one with the longest key and a fingerprint.
pub const AUTO_BYTES_PER_KEY: u64 = 512;

/// The automatic cap never goes below this many keys.
pub const AUTO_MIN_KEYS: u64 = 100_000;

/// Memory assumed when neither `/proc/meminfo` nor a cgroup says.
const FALLBACK_MEMORY: u64 = 1 << 30;

/// The cap for the setting `setting` (0: automatic).
pub fn resolve(setting: u64) -> u64 {
    if setting != 0 {
        return setting;
    }
    auto(memory_limit().unwrap_or(FALLBACK_MEMORY))
}

/// The automatic cap with `memory` bytes to go by.
pub fn auto(memory: u64) -> u64 {
    (memory / 2 / AUTO_BYTES_PER_KEY).max(AUTO_MIN_KEYS)
}

/// The memory this process may use: the machine's, or its cgroup's limit
/// when that is lower (cgroup v2 `memory.max`, v1
/// `memory.limit_in_bytes`).
pub fn memory_limit() -> Option<u64> {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| mem_total(&s));
    let cgroup = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|s| cgroup_limit(&s, Path::new("/sys/fs/cgroup")));
    match (total, cgroup) {
        (Some(t), Some(c)) => Some(t.min(c)),
        (t, c) => t.or(c),
    }
}

/// `MemTotal` of `/proc/meminfo`, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The memory limit of this process's cgroup (`/proc/self/cgroup` as
/// `cgroups`), read under `root`; `None` when unlimited or unknown.
fn cgroup_limit(cgroups: &str, root: &Path) -> Option<u64> {
    let read = |path: std::path::PathBuf| -> Option<u64> {
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
        let path = path.trim_start_matches('/');
        let found = if controllers.is_empty() {
            read(root.join(path).join("memory.max"))
        } else if controllers.split(',').any(|c| c == "memory") {
            read(root.join("memory").join(path).join("memory.limit_in_bytes"))
        } else {
            None
        };
        limit = match (limit, found) {
            (Some(a), Some(b)) => Some(std::cmp::min(a, b)),
            (a, b) => a.or(b),
        };
    }
    limit
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn automatic_is_half_the_memory_at_512_bytes_a_key_with_a_floor() {
        assert_eq!(auto(24 << 30), 25_165_824);
        assert_eq!(auto(2 << 30), 2_097_152);
        assert_eq!(auto(16 << 20), AUTO_MIN_KEYS);
        assert_eq!(resolve(42), 42, "a set cap is taken as it is");
        assert!(resolve(0) >= AUTO_MIN_KEYS);
    }

    #[test]
    fn the_memory_total_is_read_in_bytes() {
        let meminfo = "MemTotal:       24683584 kB\nMemFree:        18107000 kB\n";
        assert_eq!(mem_total(meminfo), Some(24_683_584 * 1024));
        assert_eq!(mem_total("MemFree: 1 kB\n"), None);
    }

    #[test]
    fn a_cgroup_limit_is_read_from_v2_and_v1_and_unlimited_is_none() {
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
        std::fs::write(v1.join("memory.limit_in_bytes"), "268435456\n").unwrap();
        assert_eq!(
            cgroup_limit("4:memory:/box\n0::/system.slice/dedupd.service\n", &root),
            Some(256 << 20),
            "the lower of both"
        );
        std::fs::write(v2.join("memory.max"), "max\n").unwrap();
        assert_eq!(
            cgroup_limit("0::/system.slice/dedupd.service\n", &root),
            None
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}
