#!/usr/bin/env bash
# The article's claim, `SET k:<random> processing NX EX 300`, sent by
# redis-benchmark to dedupd's Redis-protocol listener (release build, redb
# on disk, every write synced before its reply) and to redis-server made as
# durable (AOF, appendfsync always), in one run, with and without
# pipelining; redis-server without persistence for reference.
#
#   benches/resp_vs_redis.sh                          # 10 s per run, c64, P1 and P16
#   DURATION=5 CONCURRENCY="16 64" PIPELINE="1 16" benches/resp_vs_redis.sh
#
# Env: DURATION (s, default 10), CONCURRENCY (default "64"), PIPELINE
# (default "1 16"), KEEP=1 (keep the temp dir), BENCH_TMP (parent of the
# temp dir, default /var/tmp; must not be tmpfs), QUIET_WAIT (s to wait for
# other builds to finish, default 900), RB_THREADS (redis-benchmark
# --threads, default 2), PIN=1 (each server on CPU 0, redis-benchmark on
# CPU 1: the 1-vCPU VM, the same for both sides). Besides requests per second, it prints the CPU time
# each server spent per SET, by thread (from /proc): where the time goes.
set -euo pipefail

BENCH=resp_vs_redis
DURATION=${DURATION:-10}
CONCURRENCY=${CONCURRENCY:-64}
PIPELINE=${PIPELINE:-1 16}
RB_THREADS=${RB_THREADS:-2}
# shellcheck source=benches/lib.sh
. "$(dirname "$0")/lib.sh"

need redis-server redis-server redis-tools
need redis-benchmark redis-tools
need redis-cli redis-tools
for t in cargo ss awk curl; do command -v $t >/dev/null || die "'$t' is missing"; done

build_release
wait_quiet
log "waited ${waited}s for other builds; load average $(cut -d' ' -f1-3 /proc/loadavg)"

RPORT=$(free_port)
start_dedupd dedupd "[resp]
listen = \"127.0.0.1:$RPORT\""
[ "$(redis-cli -h 127.0.0.1 -p "$RPORT" ping 2>/dev/null)" = PONG ] || die "dedupd's RESP listener does not answer"
start_redis redis-aof "${AOF_ARGS[@]}"; RAOF=$PORT; PAOF=$RPID
start_redis redis-none "${NONE_ARGS[@]}"; RNONE=$PORT; PNONE=$RPID
[ "$(redis-cli -p "$RAOF" config get appendfsync | tail -1)" = always ] || die "AOF redis is not appendfsync always"

RB_CMD=(SET k:__rand_int__ processing NX EX 300)
RB_OPTS=(-r 100000000 --csv); [ "$RB_THREADS" -gt 1 ] && RB_OPTS+=(--threads "$RB_THREADS")
RES=$TMP/results; : >"$RES"
CPU=$TMP/cpu; : >"$CPU"
run() { # KIND PORT PID C P
    local kind=$1 port=$2 pid=$3 c=$4 p=$5 probe rps n f0 line
    wait_quiet
    probe=$(( c * p * 300 > 50000 ? c * p * 300 : 50000 ))
    rps=$("${CLIENT_CPU[@]}" redis-benchmark -h 127.0.0.1 -p "$port" -c "$c" -P "$p" -n "$probe" "${RB_OPTS[@]}" "${RB_CMD[@]}" 2>/dev/null |
        awk -F'"' 'NR == 2 { print int($4) }')
    n=$(( rps * DURATION > probe ? rps * DURATION : probe ))
    f0=$(flag)
    threads_cpu "$pid" >"$TMP/cpu0"
    line=$("${CLIENT_CPU[@]}" redis-benchmark -h 127.0.0.1 -p "$port" -c "$c" -P "$p" -n "$n" "${RB_OPTS[@]}" "${RB_CMD[@]}" 2>/dev/null | sed -n 2p)
    threads_cpu "$pid" >"$TMP/cpu1"
    [ -n "$line" ] || die "no redis-benchmark result for $kind c=$c P=$p"
    awk -F'"' -v k="$kind" -v c="$c" -v p="$p" -v f="$f0/$(flag)" \
        '{ printf "%s %s %s %.0f %.3f %.3f %s\n", k, c, p, $4, $10, $14, f }' <<<"$line" >>"$RES"
    printf '  c=%-4s P=%-3s %-7s %s\n' "$c" "$p" "$kind" "$(cpu_per_op "$TMP/cpu0" "$TMP/cpu1" "$n")" >>"$CPU"
}
for c in $CONCURRENCY; do
    for p in $PIPELINE; do
        log "c=$c P=$p: dedupd";                      run dedupd "$RPORT" "$DPID" "$c" "$p"
        log "c=$c P=$p: redis appendfsync always";    run aof "$RAOF" "$PAOF" "$c" "$p"
        log "c=$c P=$p: redis no persistence";        run none "$RNONE" "$PNONE" "$c" "$p"
    done
done

echo
machine
echo "       'build' column: a rustc/cc1/clippy-driver/cargo process was running at the start/end of that run ('-' = none)."
echo "Pinned: $([ "$PIN" = 1 ] && echo "yes, servers on CPU 0, redis-benchmark on CPU 1" || echo no)"
echo "Duration: about ${DURATION}s per run; dedupd $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$ROOT" diff --quiet HEAD -- src 2>/dev/null || echo ' + uncommitted src changes'), redis $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/')"
echo
echo "SET k:__rand_int__ processing NX EX 300 (ops/s; latencies in ms; ratio = dedupd / Redis AOF always; goal: tput >= 0.80x, p99 <= 2x):"
awk '
    { k[$1 " " $2 " " $3] = $0; if (!(($2 " " $3) in seen)) { seen[$2 " " $3] = 1; cs[++nc] = $2 " " $3 } }
    END {
        printf "%5s %3s | %-22s | %-22s | %-22s | %-13s | %s\n", "", "", "dedupd (RESP)", "Redis AOF always", "Redis no persistence", "dedupd/AOF", ""
        printf "%5s %3s | %8s %6s %6s | %8s %6s %6s | %8s %6s %6s | %6s %6s | %s\n", "conns", "P", "ops/s", "p50", "p99", "ops/s", "p50", "p99", "ops/s", "p50", "p99", "tput", "p99", "build d/aof/none"
        for (i = 1; i <= nc; i++) {
            split(cs[i], cp, " "); split(k["dedupd " cs[i]], d, " "); split(k["aof " cs[i]], a, " "); split(k["none " cs[i]], z, " ")
            printf "%5s %3s | %8d %6.2f %6.2f | %8d %6.2f %6.2f | %8d %6.2f %6.2f | %5.2fx %5.2fx | %s %s %s\n", cp[1], cp[2],
                d[4], d[5], d[6], a[4], a[5], a[6], z[4], z[5], z[6],
                a[4] ? d[4] / a[4] : 0, a[6] ? d[6] / a[6] : 0, d[7], a[7], z[7]
        }
    }' "$RES"
echo
echo "Server CPU per SET, in microseconds (user + system time of each thread name, from /proc, over the measured run):"
cat "$CPU"
echo
echo "Commands:"
echo "  dedupd:  $BIN serve --config dedupd.toml   ([resp] listen 127.0.0.1:$RPORT, data_path in the temp dir, log.level warn, http.workers 2)"
echo "  redis:   redis-server --port P --bind 127.0.0.1 --dir D --appendonly yes --appendfsync always --save \"\" --auto-aof-rewrite-percentage 0"
echo "           redis-server --port P --bind 127.0.0.1 --dir D --appendonly no --save \"\"   (reference)"
echo "  load:    redis-benchmark -h 127.0.0.1 -p PORT -c N -P P -n <probe ops/s x ${DURATION}> ${RB_OPTS[*]} ${RB_CMD[*]}"
