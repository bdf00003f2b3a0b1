#!/usr/bin/env bash
# Expired keys and memory (issue 52): claims with a short TTL at a steady
# rate for a few minutes, and every second how many keys the server holds
# in memory against how many are live, and its RSS.
#
#   benches/expiry_soak.sh                     # RATE=2100 TTL_MS=1000 DURATION=180
#   RATE=5000 DURATION=60 benches/expiry_soak.sh
#
# About RATE x TTL_MS / 1000 keys are live at any moment; whatever the
# server holds beyond that is expired and not yet reclaimed. wrk paces each
# of its C connections (default 8) to RATE / C claims a second; the rate
# reached is printed, with how many claims were refused (507 at the key
# cap). Env: RATE, TTL_MS, DURATION (s), C, PIN=1 (server on
# CPU 0, wrk on CPU 1), KEEP=1, BENCH_TMP, QUIET_WAIT, EXTRA_TOML (added to
# dedupd's settings), BIN_OVERRIDE (another build, for A/B runs).
set -euo pipefail
BENCH=expiry_soak
RATE=${RATE:-2100}
TTL_MS=${TTL_MS:-1000}
DURATION=${DURATION:-180}
C=${C:-8}
# shellcheck source=benches/lib.sh
. "$(dirname "$0")/lib.sh"

need wrk wrk
for t in curl cargo awk; do command -v $t >/dev/null || die "'$t' is missing"; done
build_release
wait_quiet
start_dedupd dedupd "$(printf '%b' "${EXTRA_TOML:-}")"
URL=http://127.0.0.1:$DPORT

# Each connection sends one claim, then waits its share of the second.
cat >"$TMP/soak.lua" <<LUA
local threads = {}
function setup(thread) threads[#threads + 1] = thread; thread:set("id", #threads) end
function init(args)
  prefix = "/v1/claims/soak-" .. id .. "-"
  n = 0
  math.randomseed(os.time() + id * 7919)
end
function delay() return math.floor(1000 * $C / $RATE) end
function request()
  n = n + 1
  return wrk.format("POST", prefix .. n .. "x" .. math.random(0, 2147483646),
    { ["Content-Type"] = "application/json" }, '{"ttl_ms":$TTL_MS}')
end
function done(s, lat)
  local e = s.errors
  io.write(string.format("RESULT %d %d %d %d %d\n", s.requests, s.duration,
    lat:percentile(50), lat:percentile(99), e.status + e.connect + e.read + e.write + e.timeout))
end
LUA

keys() { curl -s "$URL/metrics" | awk '/^dedupd_store_keys_in_memory\{space="claims"\}/ { print $2 }'; }
rss_mib() { awk '/^VmRSS/ { printf "%.0f", $2 / 1024 }' "/proc/$DPID/status"; }
reaped() { curl -s "$URL/metrics" | awk '/^dedupd_reaper_deleted_total\{table="claims"\}/ { print $2 }'; }

SAMPLES=$TMP/samples; : >"$SAMPLES"
log "claims with ttl_ms $TTL_MS at about $RATE/s for ${DURATION}s ($C connections)"
threads_cpu "$DPID" >"$TMP/cpu0"
"${CLIENT_CPU[@]}" wrk -t 1 -c "$C" -d "${DURATION}s" --timeout 10s -s "$TMP/soak.lua" "$URL" >"$TMP/wrk.txt" 2>&1 &
WRK=$!
t=0
while kill -0 "$WRK" 2>/dev/null; do
    sleep 1; t=$((t + 1))
    printf '%d %s %s %s\n' "$t" "$(keys)" "$(rss_mib)" "$(reaped)" >>"$SAMPLES"
done
wait "$WRK" || true
threads_cpu "$DPID" >"$TMP/cpu1"
r=$(grep '^RESULT' "$TMP/wrk.txt") || die "no wrk result: $(cat "$TMP/wrk.txt")"
read -r _ requests micros p50 p99 refused <<<"$r"
rate=$(( requests * 1000000 / micros ))
live=$(( rate * TTL_MS / 1000 ))
# Ten more seconds with no claims: how soon the rest go.
for i in $(seq 10); do
    sleep 1; t=$((t + 1))
    printf '%d %s %s %s\n' "$t" "$(keys)" "$(rss_mib)" "$(reaped)" >>"$SAMPLES"
done

echo
machine
echo "Pinned: $([ "$PIN" = 1 ] && echo "yes, the server on CPU 0, wrk on CPU 1" || echo no)"
echo "dedupd $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$ROOT" diff --quiet HEAD -- src 2>/dev/null || echo ' + uncommitted src changes'); reaper defaults unless EXTRA_TOML says otherwise"
echo "Claims: $requests in ${DURATION}s = $rate/s, ttl_ms $TTL_MS: about $live live at any moment; p50 $((p50 / 1000)).$(( (p50 % 1000) / 100 )) ms, p99 $((p99 / 1000)).$(( (p99 % 1000) / 100 )) ms"
echo "Refused or failed (not 2xx, or a socket error; at storage.max_key_memory_bytes a new key is refused with 507): $refused"
echo "Server CPU per claim (us, by thread): $(cpu_per_op "$TMP/cpu0" "$TMP/cpu1" "$requests")"
echo
echo "Every 10 s (t in s; keys = claims held in memory, live or expired and not yet reclaimed; reaped = claims the reaper deleted so far):"
printf '%6s %10s %10s %8s %10s\n' t keys "keys/live" "RSS MiB" reaped
awk -v live="$live" 'NR % 10 == 0 { printf "%6d %10d %9.1fx %8d %10d\n", $1, $2, live ? $2 / live : 0, $3, $4 }' "$SAMPLES"
med=$(awk -v d="$DURATION" '$1 > 10 && $1 <= d { print $2 }' "$SAMPLES" | sort -n |
    awk '{ k[NR] = $1 } END { print NR ? k[int((NR + 1) / 2)] : 0 }')
awk -v live="$live" -v d="$DURATION" -v med="$med" '
    $1 > 10 && $1 <= d { if ($2 > max) max = $2; if ($3 > rss) rss = $3 }
    END {
        printf "\nWhile claiming (after the first 10 s): keys in memory median %d (%.1fx live), most %d (%.1fx live); RSS at most %d MiB\n",
            med, live ? med / live : 0, max, live ? max / live : 0, rss
    }' "$SAMPLES"
echo "Ten seconds after the last claim: $(tail -1 "$SAMPLES" | awk '{ print $2 }') keys in memory"
echo
echo "Command: RATE=$RATE TTL_MS=$TTL_MS DURATION=$DURATION C=$C PIN=$PIN benches/expiry_soak.sh"
