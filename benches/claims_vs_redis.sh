#!/usr/bin/env bash
# Durable claims: dedupd (release build, redb on disk) against Redis made as
# durable (AOF, appendfsync always), with Redis without persistence for
# reference. Same concurrency levels, random keys, fixed duration each.
#
#   benches/claims_vs_redis.sh                       # 3 rounds, 10 s per run, 16 64 256
#   ROUNDS=1 DURATION=3 CONCURRENCY="64" KEEP=1 benches/claims_vs_redis.sh
#   SUSTAINED=1 benches/claims_vs_redis.sh           # issue 35's scenario: 3 rounds of 60 s at 64 and 256,
#                                                    # claims against Redis AOF-always (one client for both, then
#                                                    # wrk against redis-benchmark, with Redis without persistence
#                                                    # for reference), with p99.9, max and the checkpoints each
#                                                    # run held (about 35 minutes)
#
# Env: ROUNDS (default 3: every run is repeated this many times, rounds one
# after the other, and the tables show each figure's median over the rounds
# beside every round's ratios: this VM's disk latency moves Redis's and
# dedupd's figures by 30 % from one run to the next), DURATION (s, default
# 10), CONCURRENCY (default "16 64 256"),
# KEEP=1 (keep the temp dir, with each run's raw output: wrk-*.txt, same-*.txt), MIX=0 (skip the claim->done mix), FLOOR=0
# (skip the GET /healthz runs that show wrk's own latency floor), SAME=0
# (skip the runs with one client for both sides, benches/loadgen.rs),
# SAME_REF=0 (of those, leave out Redis without persistence and GET /healthz),
# OPS=0 (skip the other writes with that client: apply against the same
# ordering as a Lua script on the AOF Redis, and a claim's
# claim->extend->release; they need SAME=1),
# BENCH_TMP (parent of the temp dir, default /var/tmp; must not be tmpfs),
# QUIET_WAIT (s to wait for other builds to finish, default 900),
# WRK_THREADS (default 2), RB_THREADS (redis-benchmark --threads, default 2;
# 1 = its classic single-threaded client, which is faster on 2 cores),
# PIN=1 (each server on CPU 0, every client on CPU 1, both sides alike: the
# 1-vCPU VM; wrk then runs one thread unless WRK_THREADS says otherwise).
# Besides requests per second, it prints the CPU time each server spent
# per request, by thread (from /proc): where the time goes.
set -euo pipefail

BENCH=claims_vs_redis
SUSTAINED=${SUSTAINED:-0}
if [ "$SUSTAINED" = 1 ]; then
    # Long enough for checkpoints to land inside every run, as they do in
    # production: short rounds flatter dedupd.
    : "${DURATION:=60}" "${CONCURRENCY:=64 256}" "${MIX:=0}" "${FLOOR:=0}" "${SAME:=1}" "${SAME_REF:=0}" "${OPS:=0}"
fi
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10}
CONCURRENCY=${CONCURRENCY:-16 64 256}
MIX=${MIX:-1}
FLOOR=${FLOOR:-1}
SAME=${SAME:-1}
SAME_REF=${SAME_REF:-1}
OPS=${OPS:-1}
if [ "${PIN:-0}" = 1 ]; then WRK_THREADS=${WRK_THREADS:-1}; else WRK_THREADS=${WRK_THREADS:-2}; fi
RB_THREADS=${RB_THREADS:-2}
# shellcheck source=benches/lib.sh
. "$(dirname "$0")/lib.sh"

need redis-server redis-server redis-tools
need redis-benchmark redis-tools
need redis-cli redis-tools
need wrk wrk
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || die "ROUNDS must be a positive number, not '$ROUNDS'"
for t in curl cargo ss awk; do command -v $t >/dev/null || die "'$t' is missing"; done

build_release
if [ "$SAME" = 1 ]; then
    LOADGEN=$(cd "$ROOT" && cargo bench --quiet --bench loadgen --no-run --message-format=json |
        sed -n 's/.*"executable":"\([^"]*loadgen[^"]*\)".*/\1/p' | tail -1)
    [ -x "$LOADGEN" ] || die "could not build benches/loadgen.rs"
fi
wait_quiet
log "waited ${waited}s for other builds; load average $(cut -d' ' -f1-3 /proc/loadavg)"

start_dedupd dedupd
start_redis redis-aof "${AOF_ARGS[@]}"; RAOF=$PORT; PAOF=$RPID
start_redis redis-none "${NONE_ARGS[@]}"; RNONE=$PORT; PNONE=$RPID
[ "$(redis-cli -p "$RAOF" config get appendfsync | tail -1)" = always ] || die "AOF redis is not appendfsync always"

# --- wrk scripts -------------------------------------------------------------------
cat >"$TMP/claim.lua" <<'EOF'
-- POST /v1/claims/<random key>, empty body. arg 1: key prefix of this run.
local threads = {}
function setup(thread) threads[#threads + 1] = thread; thread:set("id", #threads) end
function init(args)
  prefix = "/v1/claims/" .. (args[1] or "k") .. "-" .. id .. "-"
  math.randomseed(os.time() + id * 7919)
  hdrs = { ["Content-Length"] = "0" }
end
function request()
  return wrk.format("POST", prefix .. math.random(0, 2147483646) .. "x" .. math.random(0, 2147483646), hdrs)
end
function done(s, lat)
  local e = s.errors
  io.write(string.format("RESULT %d %d %d %d %d %d %d %d\n", s.requests, s.duration, e.status,
    e.connect + e.read + e.write + e.timeout, lat:percentile(50), lat:percentile(99),
    lat:percentile(99.9), lat.max))
  for _, t in ipairs(threads) do
    if t:get("claims") then io.write(string.format("MIX %d %d %d\n", t:get("claims"), t:get("dones"), t:get("bad"))) end
  end
end
EOF
# claim -> done: each 201 pushes its key and token; the next request on the
# thread (usually the same connection's) marks it done with that token.
cat "$TMP/claim.lua" >"$TMP/mix.lua"
cat >>"$TMP/mix.lua" <<'EOF'
claims, dones, bad = 0, 0, 0
local q, n = {}, 0
local jhdr = { ["Content-Type"] = "application/json" }
function request()
  if n > 0 then
    local p = q[n]; q[n] = nil; n = n - 1
    return wrk.format("POST", p[1], jhdr, p[2])
  end
  return wrk.format("POST", prefix .. math.random(0, 2147483646) .. "x" .. math.random(0, 2147483646), hdrs)
end
function response(status, headers, body)
  if status == 201 then
    claims = claims + 1
    local key, tok = body:match('"key":"([^"]*)"'), body:match('"token":"([^"]*)"')
    n = n + 1; q[n] = { "/v1/claims/" .. key .. "/done", '{"token":"' .. tok .. '"}' }
  elseif status == 200 then dones = dones + 1
  else bad = bad + 1 end
end
EOF

# The floor: the same wrk against GET /healthz, which touches no store.
# What this shows of p99 is the load generator, the kernel and the HTTP
# server on this machine, before any claim work.
cat "$TMP/claim.lua" >"$TMP/floor.lua"
cat >>"$TMP/floor.lua" <<'EOF'
function request() return wrk.format("GET", "/healthz") end
EOF

# --- runs ------------------------------------------------------------------------------
RES=$TMP/results; : >"$RES"
CPU=$TMP/cpu; : >"$CPU"
cpu_row() { # KIND C OPS: the server's CPU per request over the run just measured
    printf '  round %s  c=%-4s %-10s %s\n' "$ROUND" "$2" "$1" "$(cpu_per_op "$TMP/cpu0" "$TMP/cpu1" "$3")" >>"$CPU"
}
# dedupd checkpoints once no write came for storage.checkpoint_idle (1 s):
# after a run that wrote, wait for that (up to 5 s), so its disk writes do
# not land in the next server's run. (Not counted in the run's CPU: while
# earlier runs' claims expire, the reaper's deletes would be too; once
# they do, 5 min after the first run, the writer is rarely idle for 1 s.)
checkpoints() { curl -s "http://127.0.0.1:$DPORT/metrics" | awk '$1 == "dedupd_store_checkpoint_seconds_count" { print $2 }'; }
# "count sum" of dedupd's checkpoint histogram: the checkpoints a run held
# and the seconds they took, from the difference over the run.
# ... and how many took at most 25 ms (the histogram's le="0.025" bucket).
checkpoint_stats() { curl -s "http://127.0.0.1:$DPORT/metrics" |
    awk '$1 == "dedupd_store_checkpoint_seconds_count" { c = $2 } $1 == "dedupd_store_checkpoint_seconds_sum" { s = $2 }
         $1 == "dedupd_store_checkpoint_seconds_bucket{le=\"0.025\"}" { q = $2 } END { print c + 0, s + 0, q + 0 }'; }
CKPT=$TMP/checkpoints; : >"$CKPT"
settle() {
    local n0 i; n0=$(checkpoints)
    for i in $(seq 100); do [ "$(checkpoints)" != "$n0" ] && return; sleep 0.05; done
    log "   no checkpoint within 5 s of the run's end"
}
note_checkpoints() { # KIND C STATS-BEFORE STATS-AFTER: the checkpoints a dedupd run held
    awk -v k="$1" -v c="$2" -v r="$ROUND" -v a="$3" -v b="$4" 'BEGIN { split(a, x, " "); split(b, y, " ")
        n = y[1] - x[1]; over = n - (y[3] - x[3])
        avg = (n > 0) ? sprintf("%.0f ms each on average, %d over 25 ms", (y[2] - x[2]) / n * 1000, over) : ""
        printf "  round %s  c=%-4s %-10s %3d checkpoints during the run, %s\n", r, c, k, n, avg }' >>"$CKPT"
}
run_wrk() { # KIND C SCRIPT
    local out f0
    wait_quiet; f0=$(flag)
    threads_cpu "$DPID" >"$TMP/cpu0"
    local k0 k1; k0=$(checkpoint_stats)
    out=$("${CLIENT_CPU[@]}" wrk -t "$WRK_THREADS" -c "$2" -d "${DURATION}s" --timeout 10s -s "$3" "http://127.0.0.1:$DPORT" -- "$1$2-$RANDOM$RANDOM")
    k1=$(checkpoint_stats)
    threads_cpu "$DPID" >"$TMP/cpu1"
    note_checkpoints "$1" "$2" "$k0" "$k1"
    [ "$1" = floor ] || settle
    echo "$out" >"$TMP/wrk-$1-$2.txt"
    local r; r=$(grep '^RESULT' <<<"$out") || die "no wrk result for $1 c=$2: $out"
    set -- "$1" "$2" $r
    cpu_row "$1" "$2" "$4"
    # kind c rps p50ms p99ms non2xx sockerr flag round - p99.9ms maxms
    awk -v k="$1" -v c="$2" -v f="$f0/$(flag)" -v n="$4" -v d="$5" -v s="$6" -v e="$7" -v a="$8" -v b="$9" \
        -v t="${10}" -v m="${11}" -v r="$ROUND" \
        'BEGIN { printf "%s %s %.0f %.3f %.3f %d %d %s %s 0 %.3f %.3f\n", k, c, n / d * 1e6, a / 1000, b / 1000, s, e, f, r, t / 1000, m / 1000 }' >>"$RES"
    { grep '^MIX' <<<"$out" || true; } | awk -v c="$2" -v r="$ROUND" '{ cl += $2; dn += $3; bd += $4 } END { if (NR) print "mixcount", c, cl, dn, bd, 0, 0, "-", r }' >>"$RES"
}
RB_CMD=(SET k:__rand_int__ processing NX EX 300)
RB_OPTS=(-r 100000000 --csv); [ "$RB_THREADS" -gt 1 ] && RB_OPTS+=(--threads "$RB_THREADS")
run_redis() { # KIND PORT PID C
    local probe rps n f0 t0 line pid=$3
    set -- "$1" "$2" "$4"
    wait_quiet
    probe=$(( $3 * 200 > 50000 ? $3 * 200 : 50000 ))
    rps=$("${CLIENT_CPU[@]}" redis-benchmark -h 127.0.0.1 -p "$2" -c "$3" -n "$probe" "${RB_OPTS[@]}" "${RB_CMD[@]}" |
        awk -F'"' 'NR == 2 { print int($4) }')
    n=$(( rps * DURATION > probe ? rps * DURATION : probe ))
    # The probe may run slower than the run that follows (this VM's disk
    # moves by a third from one minute to the next): a run that ended
    # before 80 % of DURATION is run once more, sized from its own rate, so
    # Redis's figures cover as long a run as dedupd's.
    local attempt took
    for attempt in 1 2; do
        f0=$(flag); t0=$(date +%s.%N)
        threads_cpu "$pid" >"$TMP/cpu0"
        line=$("${CLIENT_CPU[@]}" redis-benchmark -h 127.0.0.1 -p "$2" -c "$3" -n "$n" "${RB_OPTS[@]}" "${RB_CMD[@]}" | sed -n 2p)
        threads_cpu "$pid" >"$TMP/cpu1"
        [ -n "$line" ] || die "no redis-benchmark result for $1 c=$3"
        took=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
        log "   $n requests in $took s"
        if [ "$attempt" = 2 ] || awk -v t="$took" -v d="$DURATION" 'BEGIN { exit !(t >= 0.8 * d) }'; then break; fi
        n=$(awk -v n="$n" -v t="$took" -v d="$DURATION" 'BEGIN { printf "%d", n * d / t }')
        log "   shorter than 80 % of ${DURATION} s: again, with $n requests"
    done
    cpu_row "$1" "$3" "$n"
    # redis-benchmark gives no p99.9 (0 here); its max is field 16
    awk -F'"' -v k="$1" -v c="$3" -v f="$f0/$(flag)" -v r="$ROUND" '{ printf "%s %s %.0f %.3f %.3f 0 0 %s %s 0 0 %.3f\n", k, c, $4, $10, $14, f, r, $16 }' <<<"$line" >>"$RES"
}
run_same() { # KIND LOADGEN-KIND PORT PID C: the same client (benches/loadgen.rs) for every server
    local out f0 r
    wait_quiet; f0=$(flag)
    threads_cpu "$4" >"$TMP/cpu0"
    local k0 k1 writes=0
    case $1 in same-claim | same-apply | same-cycle) writes=1; k0=$(checkpoint_stats) ;; esac
    out=$("${CLIENT_CPU[@]}" "$LOADGEN" "$2" "127.0.0.1:$3" "$5" "$DURATION" 2 1) || die "loadgen $2 c=$5 failed: $out"
    threads_cpu "$4" >"$TMP/cpu1"
    if [ "$writes" = 1 ]; then
        # The 1 s warm-up is in these counts too.
        k1=$(checkpoint_stats); note_checkpoints "$1" "$5" "$k0" "$k1"; settle
    fi
    echo "$out" >"$TMP/same-$1-$5.txt"
    r=$(grep '^RESULT' <<<"$out") || die "no loadgen result for $1 c=$5: $out"
    # kind c rps p50ms p99ms errors 0 flag round p99ms-with-wrk's-correction p99.9ms maxms
    awk -v k="$1" -v c="$5" -v f="$f0/$(flag)" -v r="$ROUND" '{
        for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
        printf "%s %s %.0f %.3f %.3f %d 0 %s %s %.3f %.3f %.3f\n", k, c, v["rps"], v["p50_ms"], v["p99_ms"], v["errors"], f, r, v["p99co_ms"], v["p999_ms"], v["max_ms"]
    }' <<<"$r" >>"$RES"
    cpu_row "$1" "$5" "$(sed 's/.*requests=\([0-9]*\).*/\1/' <<<"$r")"
}
for ROUND in $(seq "$ROUNDS"); do
for c in $CONCURRENCY; do
    log "round $ROUND of $ROUNDS"
    if [ "$SAME" = 1 ]; then
        log "c=$c: same client: dedupd claims";  run_same same-claim http-claim "$DPORT" "$DPID" "$c"
        log "c=$c: same client: redis AOF";      run_same same-aof resp-set "$RAOF" "$PAOF" "$c"
        if [ "$SAME_REF" = 1 ]; then
            log "c=$c: same client: redis none";   run_same same-none resp-set "$RNONE" "$PNONE" "$c"
            log "c=$c: same client: GET /healthz"; run_same same-floor http-healthz "$DPORT" "$DPID" "$c"
        fi
        if [ "$OPS" = 1 ]; then
            log "c=$c: same client: dedupd apply"; run_same same-apply http-apply "$DPORT" "$DPID" "$c"
            log "c=$c: same client: redis AOF, the recipe's apply (Lua)"
            run_same same-aof-apply resp-apply "$RAOF" "$PAOF" "$c"
            log "c=$c: same client: dedupd claim->extend->release"
            run_same same-cycle http-claim-extend-release "$DPORT" "$DPID" "$c"
        fi
    fi
    log "c=$c: dedupd claims";          run_wrk claim "$c" "$TMP/claim.lua"
    log "c=$c: redis appendfsync always"; run_redis aof "$RAOF" "$PAOF" "$c"
    log "c=$c: redis no persistence";   run_redis none "$RNONE" "$PNONE" "$c"
    if [ "$MIX" = 1 ]; then log "c=$c: dedupd claim->done"; run_wrk mix "$c" "$TMP/mix.lua"; fi
    if [ "$FLOOR" = 1 ]; then log "c=$c: dedupd GET /healthz"; run_wrk floor "$c" "$TMP/floor.lua"; fi
done
done

# med(list): the median of a space-separated list of numbers (insertion
# sort: a list holds one value per round).
AWK_MED='
    function med(list,    v, n, i, j, t) {
        n = split(list, v, " ")
        for (i = 2; i <= n; i++) { t = v[i] + 0; for (j = i - 1; j >= 1 && v[j] + 0 > t; j--) v[j + 1] = v[j]; v[j + 1] = t }
        return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
    }'
# Each (kind, connections): the median of every figure over the rounds
# (errors summed), so the tables below read as one run's. Field 9: the
# one-client runs' p99 with wrk's correction (0 for the others); 10:
# p99.9 (0 for redis-benchmark's); 11: max.
MED=$TMP/medians
awk "$AWK_MED"'
    {
        id = $1 " " $2; if (!(id in seen)) { seen[id] = 1; ids[++m] = id }
        for (i = 3; i <= 5; i++) f[id, i] = f[id, i] " " $i
        f[id, 10] = f[id, 10] " " ($10 == "" ? 0 : $10)
        f[id, 11] = f[id, 11] " " ($11 == "" ? 0 : $11)
        f[id, 12] = f[id, 12] " " ($12 == "" ? 0 : $12)
        e6[id] += $6; e7[id] += $7; fl[id] = fl[id] (fl[id] == "" ? "" : ",") $8
    }
    END {
        for (x = 1; x <= m; x++) {
            id = ids[x]; split(id, k, " ")
            printf "%s %s %.0f %.3f %.3f %d %d %s %.3f %.3f %.3f\n", k[1], k[2], med(f[id, 3]), med(f[id, 4]), med(f[id, 5]), e6[id], e7[id], fl[id], med(f[id, 10]), med(f[id, 11]), med(f[id, 12])
        }
    }' "$RES" >"$MED"

# --- report -----------------------------------------------------------------------
echo
machine
echo "       'build' column: a rustc/cc1/clippy-driver/cargo process was running at the start/end of that run ('-' = none)."
echo "Pinned: $([ "$PIN" = 1 ] && echo "yes, servers on CPU 0, wrk, redis-benchmark and loadgen on CPU 1" || echo no)"
echo "Duration: ${DURATION}s per run; dedupd $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$ROOT" diff --quiet HEAD -- src 2>/dev/null || echo ' + uncommitted src changes'), redis $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/'), $(wrk --version 2>&1 | head -1 | cut -d' ' -f1-2)"
echo
echo "Claims (latencies in ms; ratio = dedupd / Redis AOF-always). wrk's latencies are corrected for coordinated"
echo "omission (wrk 4 adds samples for the requests a stall held back; see benches/loadgen.rs), redis-benchmark's are not,"
echo "so their p99 ratio weighs any stall of dedupd's far more than one of Redis's; the one-client table compares like with like:"
awk '
    { k[$1 " " $2] = $0; if (!($2 in seen)) { seen[$2] = 1; cs[++nc] = $2 } }
    END {
        printf "%5s | %-30s | %-22s | %-22s | %-13s | %s\n", "", "dedupd claims (wrk)", "Redis AOF always", "Redis no persistence", "dedupd/AOF", ""
        printf "%5s | %8s %6s %6s %7s | %8s %6s %6s | %8s %6s %6s | %6s %6s | %s\n", "conns", "claims/s", "p50", "p99", "non2xx", "ops/s", "p50", "p99", "ops/s", "p50", "p99", "tput", "p99", "build d/aof/none"
        for (i = 1; i <= nc; i++) {
            c = cs[i]; split(k["claim " c], d, " "); split(k["aof " c], a, " "); split(k["none " c], z, " ")
            printf "%5s | %8d %6.2f %6.2f %7s | %8d %6.2f %6.2f | %8d %6.2f %6.2f | %5.2fx %5.2fx | %s %s %s\n", c,
                d[3], d[4], d[5], d[6] + d[7], a[3], a[4], a[5], z[3], z[4], z[5],
                a[3] ? d[3] / a[3] : 0, a[5] ? d[5] / a[5] : 0, d[8], a[8], z[8]
        }
    }' "$MED"
echo
echo "The tails (medians over the rounds; ms): dedupd's p99.9 and max from wrk, Redis AOF-always's max from"
echo "redis-benchmark (it gives no p99.9). A request that waited on a checkpoint shows in dedupd's max:"
awk '
    { k[$1 " " $2] = $0; if ($1 == "claim") cs[++nc] = $2 }
    END {
        printf "%5s | %8s %7s %7s %7s | %8s %7s %7s | %6s %6s\n", "conns", "claims/s", "p99", "p99.9", "max", "AOF/s", "p99", "max", "tput", "p99"
        for (i = 1; i <= nc; i++) {
            c = cs[i]; split(k["claim " c], d, " "); split(k["aof " c], a, " ")
            printf "%5s | %8d %7.2f %7.2f %7.2f | %8d %7.2f %7.2f | %5.2fx %5.2fx\n", c, d[3], d[5], d[10], d[11], a[3], a[5], a[11],
                a[3] ? d[3] / a[3] : 0, a[5] ? d[5] / a[5] : 0
        }
    }' "$MED"
echo "Checkpoints each dedupd run held (from dedupd_store_checkpoint_seconds; a one-client run's count includes its 1 s warm-up):"
cat "$CKPT"
if [ "$MIX" = 1 ]; then
    echo
    echo "dedupd claim->done mix (each 201 claim is followed by POST /done with its token; ops = claims + dones):"
    awk '
        $1 == "mix" { m[$2] = $0; cs[++nc] = $2 } $1 == "mixcount" { x[$2] = $0 }
        END {
            printf "%5s | %8s %11s %6s %6s | %9s %9s %6s | %s\n", "conns", "ops/s", "claim+done/s", "p50", "p99", "201", "200", "other", "build"
            for (i = 1; i <= nc; i++) {
                c = cs[i]; split(m[c], r, " "); split(x[c], y, " ")
                printf "%5s | %8d %11d %6.2f %6.2f | %9d %9d %6d | %s\n", c, r[3], r[3] / 2, r[4], r[5], y[3], y[4], y[5] + r[7], r[8]
            }
        }' "$MED"
fi
if [ "$FLOOR" = 1 ]; then
    echo
    echo "The floor: the same wrk against GET /healthz (no store work) — the p99 that wrk, the kernel"
    echo "and the HTTP server give on this machine at this concurrency, before any claim work:"
    awk '
        $1 == "floor" { f[$2] = $0; cs[++nc] = $2 } $1 == "claim" { d[$2] = $0 }
        END {
            printf "%5s | %9s %6s %6s | %s\n", "conns", "req/s", "p50", "p99", "claims p99 / floor p99"
            for (i = 1; i <= nc; i++) {
                c = cs[i]; split(f[c], r, " "); split(d[c], x, " ")
                printf "%5s | %9d %6.2f %6.2f | %5.2fx\n", c, r[3], r[4], r[5], r[5] ? x[5] / r[5] : 0
            }
        }' "$MED"
fi
if [ "$SAME" = 1 ]; then
    echo
    echo "One client for both (benches/loadgen.rs, 2 threads, closed loop, 1 s warm-up, ${DURATION}s): dedupd claims over HTTP,"
    echo "Redis SET k:<random> processing NX EX 300 over RESP; the client's own cost is the same on both sides."
    echo "p50/p99 are as measured, like redis-benchmark's; 'p99, wrk-corrected' is the p99 after wrk's correction for"
    echo "coordinated omission (each latency L >= 2 x the mean interval between a connection's requests also counts as"
    echo "L - interval, L - 2 x interval, ...), which wrk applies to the figures in the first table and redis-benchmark does not:"
    [ "$SAME_REF" = 1 ] || echo "(SAME_REF=0: Redis without persistence and GET /healthz did not run; their columns show 0.)"
    awk '
        { k[$1 " " $2] = $0; if ($1 == "same-claim") cs[++nc] = $2 }
        END {
            printf "%5s | %-22s | %-22s | %-22s | %-13s | %-15s | %-20s | %s\n", "", "dedupd claims", "Redis AOF always", "Redis no persistence", "dedupd/AOF", "GET /healthz", "p99, wrk-corrected", ""
            printf "%5s | %8s %6s %6s | %8s %6s %6s | %8s %6s %6s | %6s %6s | %8s %6s | %6s %6s %6s | %s\n", "conns", "claims/s", "p50", "p99", "ops/s", "p50", "p99", "ops/s", "p50", "p99", "tput", "p99", "req/s", "p99", "dedupd", "AOF", "ratio", "errors, build d/aof/none"
            for (i = 1; i <= nc; i++) {
                c = cs[i]; split(k["same-claim " c], d, " "); split(k["same-aof " c], a, " "); split(k["same-none " c], z, " "); split(k["same-floor " c], f, " ")
                printf "%5s | %8d %6.2f %6.2f | %8d %6.2f %6.2f | %8d %6.2f %6.2f | %5.2fx %5.2fx | %8d %6.2f | %6.2f %6.2f %5.2fx | %d/%d/%d, %s %s %s\n", c,
                    d[3], d[4], d[5], a[3], a[4], a[5], z[3], z[4], z[5],
                    a[3] ? d[3] / a[3] : 0, a[5] ? d[5] / a[5] : 0, f[3], f[5], d[9], a[9], a[9] ? d[9] / a[9] : 0, d[6], a[6], z[6], d[8], a[8], z[8]
            }
        }' "$MED"
    echo
    echo "The tails with one client (medians over the rounds; ms; p99.9 and max as measured, then the p99 with wrk's"
    echo "correction on both sides: a stall of either server weighs the same):"
    awk '
        { k[$1 " " $2] = $0; if ($1 == "same-claim") cs[++nc] = $2 }
        END {
            printf "%5s | %8s %7s %7s %7s %7s | %8s %7s %7s %7s %7s | %6s %6s %9s\n", "conns", "claims/s", "p99", "p99.9", "max", "p99 co", "AOF/s", "p99", "p99.9", "max", "p99 co", "tput", "p99", "p99 co"
            for (i = 1; i <= nc; i++) {
                c = cs[i]; split(k["same-claim " c], d, " "); split(k["same-aof " c], a, " ")
                printf "%5s | %8d %7.2f %7.2f %7.2f %7.2f | %8d %7.2f %7.2f %7.2f %7.2f | %5.2fx %5.2fx %8.2fx\n", c,
                    d[3], d[5], d[10], d[11], d[9], a[3], a[5], a[10], a[11], a[9],
                    a[3] ? d[3] / a[3] : 0, a[5] ? d[5] / a[5] : 0, a[9] ? d[9] / a[9] : 0
            }
        }' "$MED"
    if [ "$OPS" = 1 ]; then
        echo
        echo "The other writes, same client: apply (POST /v1/streams/<random stream>/apply, one event) against the same"
        echo "ordering on Redis AOF always as one Lua script (EVALSHA: GET the head, SET the event id NX EX, SET the head EX if"
        echo "newer), and a claim's life (claim, extend with its token, release with its token; ops = every request) against"
        echo "Redis AOF always's SETs above:"
        awk '
            { k[$1 " " $2] = $0; if ($1 == "same-apply") cs[++nc] = $2 }
            END {
                printf "%5s | %-22s | %-22s | %-13s | %-22s | %-13s | %s\n", "", "dedupd apply", "Redis AOF, Lua apply", "apply/Lua", "claim/extend/release", "c/e/r / SET", ""
                printf "%5s | %8s %6s %6s | %8s %6s %6s | %6s %6s | %8s %6s %6s | %6s %6s | %s\n", "conns", "ops/s", "p50", "p99", "ops/s", "p50", "p99", "tput", "p99", "ops/s", "p50", "p99", "tput", "p99", "errors, build apply/lua/cycle"
                for (i = 1; i <= nc; i++) {
                    c = cs[i]; split(k["same-apply " c], p, " "); split(k["same-aof-apply " c], l, " ")
                    split(k["same-cycle " c], y, " "); split(k["same-aof " c], a, " ")
                    printf "%5s | %8d %6.2f %6.2f | %8d %6.2f %6.2f | %5.2fx %5.2fx | %8d %6.2f %6.2f | %5.2fx %5.2fx | %d/%d/%d, %s %s %s\n", c,
                        p[3], p[4], p[5], l[3], l[4], l[5], l[3] ? p[3] / l[3] : 0, l[5] ? p[5] / l[5] : 0,
                        y[3], y[4], y[5], a[3] ? y[3] / a[3] : 0, a[5] ? y[5] / a[5] : 0, p[6], l[6], y[6], p[8], l[8], y[8]
                }
            }' "$MED"
    fi
fi
echo
echo "dedupd / Redis AOF always in each round (throughput, p99; each pair ran back to back), and the median of each:"
awk "$AWK_MED"'
    {
        r[$1 " " $2 " " $9] = $3 " " $5; if ($9 > nr) nr = $9; if ($1 == "claim" && !($2 in seen)) { seen[$2] = 1; cs[++nc] = $2 }
        if ($10 != "") r["co-" $1 " " $2 " " $9] = $3 " " $10
    }
    END {
        split("claim,aof,wrk / redis-benchmark,same-claim,same-aof,one client (loadgen),co-same-claim,co-same-aof,one client (p99 corrected)," \
              "same-apply,same-aof-apply,apply / Lua apply,same-cycle,same-aof,claim/extend/release", p, ",")
        for (i = 1; i <= nc; i++) for (q = 1; q <= 13; q += 3) {
            line = ""; tl = ""; pl = ""
            for (k = 1; k <= nr; k++) {
                d = r[p[q] " " cs[i] " " k]; a = r[p[q + 1] " " cs[i] " " k]
                if (d == "" || a == "") continue
                split(d, dv, " "); split(a, av, " ")
                t = av[1] ? dv[1] / av[1] : 0; l = av[2] ? dv[2] / av[2] : 0
                line = line sprintf(" %5.2fx %5.2fx |", t, l); tl = tl " " t; pl = pl " " l
            }
            if (line != "") printf "  c=%-4s %-24s |%s median %5.2fx %5.2fx\n", cs[i], p[q + 2] ":", line, med(tl), med(pl)
        }
    }' "$RES"
echo
echo "Server CPU per request, in microseconds (user + system time of each thread name, from /proc, over the measured run;"
echo "a one-client run's includes its 1 s warm-up, divided by the requests after it: about 1/DURATION too high):"
cat "$CPU"
grep -q 'rewriting started' "$TMP/redis-aof/redis.log" &&
    echo "Note: the AOF redis ran a background AOF rewrite during the runs (see its log)."
echo
echo "Commands:"
echo "  dedupd:  $BIN serve --config dedupd.toml   (listen 127.0.0.1:$DPORT, data_path in the temp dir, log.level warn, http.workers 2)"
echo "  redis:   redis-server --port P --bind 127.0.0.1 --dir D --appendonly yes --appendfsync always --save \"\""
echo "           redis-server --port P --bind 127.0.0.1 --dir D --appendonly no --save \"\"   (reference)"
echo "  claims:  wrk -t $WRK_THREADS -c N -d ${DURATION}s --timeout 10s -s claim.lua http://127.0.0.1:$DPORT -- <prefix>   (POST /v1/claims/<prefix>-<thread>-<rand>x<rand>, empty body)"
[ "$FLOOR" = 1 ] && echo "  floor:   wrk -t $WRK_THREADS -c N -d ${DURATION}s --timeout 10s -s floor.lua http://127.0.0.1:$DPORT   (GET /healthz)"
[ "$MIX" = 1 ] && echo "  mix:     wrk -t $WRK_THREADS -c N -d ${DURATION}s --timeout 10s -s mix.lua http://127.0.0.1:$DPORT -- <prefix>"
echo "  redis:   redis-benchmark -c N -n <probe rps x ${DURATION}> ${RB_OPTS[*]} ${RB_CMD[*]}"
echo "           (n from a probe run of max(50000, 200 N) requests, so each run lasts about ${DURATION}s; one under 80 % of that is run again, sized from its own rate)"
[ "$SAME" = 1 ] && echo "  same:    $LOADGEN KIND 127.0.0.1:PORT N ${DURATION} 2 1   (= cargo bench --bench loadgen -- KIND ADDRESS N ${DURATION} 2 1; KIND http-claim, resp-set, http-healthz, http-apply, resp-apply, http-claim-extend-release)"
echo "  non2xx = wrk's non-2xx/3xx answers + socket errors (connect/read/write/timeout); must be 0."
