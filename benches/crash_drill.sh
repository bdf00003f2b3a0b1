#!/usr/bin/env bash
# The crash test of tests/service/crash_and_restart.rs at scale, on the release build:
# SIGKILL the server under concurrent claim -> done -> apply workers,
# ROUNDS times; after every restart each claim, done and apply acknowledged
# so far must be there with its fence, and a new claim's fence must be
# above every fence seen. CI runs the same test small (4 rounds, 16
# workers, 300 claims a round).
#
#   benches/crash_drill.sh                                # ROUNDS=10 WORKERS=64 CLAIMS=10000 (about 6 min)
#   ROUNDS=3 WORKERS=32 CLAIMS=5000 benches/crash_drill.sh
#
# Env: ROUNDS (kills), WORKERS (concurrent workers), CLAIMS (new claims
# acknowledged before each kill), BENCH_TMP (where the data directory
# goes, default /var/tmp; must not be tmpfs), KEEP=1 (keep it).
set -euo pipefail

BENCH=crash_drill
QUIET_WAIT=${QUIET_WAIT:-0}
# shellcheck source=benches/lib.sh
. "$(dirname "$0")/lib.sh"

ROUNDS=${ROUNDS:-10}
WORKERS=${WORKERS:-64}
CLAIMS=${CLAIMS:-10000}
for v in ROUNDS WORKERS CLAIMS; do
    [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive number, not '${!v}'"
done

log "building the api tests in release (the test drives target/release/dedupd)"
cd "$ROOT"
start=$(date +%s)
DEDUPD_CRASH_ROUNDS=$ROUNDS DEDUPD_CRASH_WORKERS=$WORKERS DEDUPD_CRASH_CLAIMS=$CLAIMS DEDUPD_CRASH_DIR=$TMP \
    cargo test --release --test service -- --exact \
    crash_and_restart::sigkill_under_concurrent_load_loses_nothing_acknowledged_and_fences_only_grow --nocapture 2>&1 |
    grep -E '^(crash drill|test |test result)|panicked|assert' || die "the drill failed (run it again with the cargo test command above to see why)"
log "done in $(( $(date +%s) - start )) s (build included)"
