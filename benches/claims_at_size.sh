#!/usr/bin/env bash
# Claims with a million live keys, and while a million expire at once.
#
#   benches/claims_at_size.sh                  # KEYS=1000000 DURATION=15 C=64
#
# 1. empty store: wrk -c C for DURATION s, random keys            -> rate0, p99_0
# 2. preload KEYS claims that all expire in the same second (EXPIRE_AT)
# 3. at size: the same wrk run                                     -> rate1, p99_1, peak RSS
# 4. once the reaper starts on them, the same run while it deletes  -> rate2, p99_2
# Prints rate1 / rate0 (target >= 0.8), the peak RSS (target <= 256 MiB,
# storage.cache_bytes is 64 MiB) and p99_2 against p99_0 and p99_1 (target
# <= 2).
#
# Env: KEYS, DURATION, C, KEEP=1, BENCH_TMP, QUIET_WAIT, EXTRA_TOML (added to
# dedupd's settings, e.g. '[storage]\ncache_bytes = 16777216').
set -euo pipefail
BENCH=claims_at_size
KEYS=${KEYS:-1000000}
DURATION=${DURATION:-15}
C=${C:-64}
# shellcheck source=benches/lib.sh
. "$(dirname "$0")/lib.sh"

need wrk wrk
for t in curl cargo ss awk; do command -v $t >/dev/null || die "'$t' is missing"; done
build_release
wait_quiet
start_dedupd dedupd "$(printf '%b' "${EXTRA_TOML:-}")"
URL=http://127.0.0.1:$DPORT

# POST /v1/claims/<prefix>-<thread>-<n>; with EXPIRE_AT (Unix s) every claim
# lapses in that second, else the default TTL. Counts 201s.
cat >"$TMP/claims.lua" <<'LUA'
local threads = {}
function setup(thread) threads[#threads + 1] = thread; thread:set("id", #threads) end
function init(args)
  prefix = "/v1/claims/" .. args[1] .. "-" .. id .. "-"
  expire_at = tonumber(args[2])
  math.randomseed(os.time() + id * 7919)
  n, created = 0, 0
end
function request()
  n = n + 1
  local path = prefix .. n .. "x" .. math.random(0, 2147483646)
  if expire_at then
    local body = '{"ttl_ms":' .. math.max(1000, (expire_at - os.time()) * 1000) .. '}'
    return wrk.format("POST", path, { ["Content-Type"] = "application/json" }, body)
  end
  return wrk.format("POST", path, { ["Content-Length"] = "0" })
end
function response(status) if status == 201 then created = created + 1 end end
function done(s, lat)
  local c = 0
  for _, t in ipairs(threads) do c = c + t:get("created") end
  io.write(string.format("RESULT %d %d %d %d %d %d\n", s.requests, s.duration, c,
    s.errors.status + s.errors.connect + s.errors.read + s.errors.write + s.errors.timeout,
    lat:percentile(50), lat:percentile(99)))
end
LUA

RES=$TMP/results; : >"$RES"
run() { # LABEL SECONDS PREFIX [EXPIRE_AT] -> "rate p50ms p99ms created errors"
    local out r
    out=$(wrk -t 2 -c "$C" -d "$2s" --timeout 10s -s "$TMP/claims.lua" "$URL" -- "$3" ${4:-})
    r=$(grep '^RESULT' <<<"$out") || die "no wrk result for $1: $out"
    awk -v l="$1" -v f="$(flag)" '{ printf "%s %.0f %.3f %.3f %d %d %s\n", l, $1 / $2 * 1e6, $5 / 1000, $6 / 1000, $3, $4, f }' <<<"${r#RESULT }" | tee -a "$RES" >&2
}
reaped() { curl -s "$URL/metrics" | awk '/^dedupd_reaper_deleted_total\{table="claims"\}/ { print $2 }'; }
rss_mib() { awk '/^VmHWM/ { printf "%.0f", $2 / 1024 }' "/proc/$DPID/status"; }

wait_quiet; log "1. empty store, c=$C, ${DURATION}s"
run empty "$DURATION" e
rate0=$(awk '$1 == "empty" { print $2 }' "$RES")

# Preload: time for KEYS at 80 % of the empty rate, plus the at-size run.
pre=$(( KEYS * 10 / (rate0 * 8) + 1 ))
EXPIRE_AT=$(( $(date +%s) + pre + DURATION + 45 ))
log "2. preloading $KEYS claims expiring at $(date -d @"$EXPIRE_AT" +%T) (about ${pre}s)"
loaded=0; i=0
while [ "$loaded" -lt "$KEYS" ]; do
    i=$((i + 1))
    [ "$(date +%s)" -lt $((EXPIRE_AT - DURATION - 10)) ] || die "preload too slow: $loaded of $KEYS before the expiry"
    run "preload$i" "$(( (KEYS - loaded) * 10 / (rate0 * 8) + 2 < 20 ? (KEYS - loaded) * 10 / (rate0 * 8) + 2 : 20 ))" "p$i" "$EXPIRE_AT" >/dev/null 2>&1
    loaded=$(awk '$1 ~ /^preload/ { s += $5 } END { print s + 0 }' "$RES")
    log "   $loaded loaded"
done

wait_quiet; log "3. at size ($loaded preloaded + the empty run's keys), c=$C, ${DURATION}s"
run size "$DURATION" s
rss=$(rss_mib)

now=$(date +%s)
[ "$now" -lt "$EXPIRE_AT" ] || die "the preloaded claims expired before the at-size run ended"
log "4. waiting $((EXPIRE_AT - now))s for the expiry and for the reaper to start on it (it wakes at the next expiry it knew of, or after reaper.interval), then c=$C, ${DURATION}s while it works"
sleep $((EXPIRE_AT - now))
for _ in $(seq 700); do [ "$(reaped)" -gt 0 ] && break; sleep 0.1; done
[ "$(reaped)" -gt 0 ] || die "the reaper deleted nothing within 70 s of the expiry"
before=$(reaped)
run expiring "$DURATION" x
after=$(reaped)
sleep 1; final=$(reaped)

echo
machine
echo "dedupd $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'), c=$C, ${DURATION}s runs, settings: defaults${EXTRA_TOML:+ + $EXTRA_TOML}"
echo
awk -v rss="$rss" -v keys="$loaded" -v during=$((after - before)) -v total="$final" '
    { r[$1] = $2; p99[$1] = $4; e[$1] = $6; f[$1] = $7 }
    END {
        printf "%-28s %10s %8s %7s %s\n", "run", "claims/s", "p99 ms", "errors", "build"
        printf "%-28s %10d %8.2f %7d %s\n", "empty store", r["empty"], p99["empty"], e["empty"], f["empty"]
        printf "%-28s %10d %8.2f %7d %s\n", sprintf("%d live claims", keys), r["size"], p99["size"], e["size"], f["size"]
        printf "%-28s %10d %8.2f %7d %s\n", "while they expire", r["expiring"], p99["expiring"], e["expiring"], f["expiring"]
        print ""
        printf "at size / empty:          %.2fx claims/s   (target >= 0.80)\n", r["size"] / r["empty"]
        printf "peak RSS:                 %d MiB            (target <= 256)\n", rss
        printf "expiring / empty p99:     %.2fx            (target <= 2.00)\n", p99["expiring"] / p99["empty"]
        printf "expiring / at size p99:   %.2fx            (the at-size run may hold a checkpoint)\n", p99["expiring"] / p99["size"]
        printf "reaper: %d claims deleted during the run, %d by its end\n", during, total
    }' "$RES"
