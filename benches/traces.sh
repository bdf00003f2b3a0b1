#!/usr/bin/env bash
# What traces cost (issue 55), side by side in one run: the release build
# with [telemetry.traces] off (no span built), on at sample_ratio 1.0
# exporting to a collector that takes everything at once (nginx answering
# 200), and on with a collector that hangs (it accepts connections and never
# answers) or refuses (503). The collector is named the way users do, by
# OTEL_EXPORTER_OTLP_ENDPOINT.
#
#   benches/traces.sh                  # 3 rounds: claims 10 s at 64 connections, ingest 5 s
#   PIN=1 benches/traces.sh            # the server on CPU 0, every client on CPU 1
#   ROUNDS=1 DURATION=3 INGEST_S=2 MODES="off on" benches/traces.sh
#
# Env: ROUNDS (3; the modes alternate within each round), DURATION (claims,
# s, 10), CONNS (64), INGEST_S (the delivery bench's posting time, 5),
# MODES ("off on hang refuse"; also "before": BEFORE_BIN, a build from
# before traces, without them, to show what "off" costs; and "before-on":
# BEFORE_BIN with traces on, to compare two builds' spans), KEEP, BENCH_TMP,
# QUIET_WAIT, PIN, BIN_OVERRIDE (see benches/lib.sh).
#
# Claims: benches/loadgen.rs http-claim (claims/s, p99, and the server's CPU
# and context switches per claim from /proc, with the part of that CPU its
# export thread, dedupd-traces, took). Ingest: benches/delivery.rs's
# nginx scenario (events/s, the posts' p50/p99, CPU and switches per event
# for its ingest and delivery, and the end-to-end time). With off among
# the modes, then each mode's CPU an operation against off's in the same
# round: the median of the rounds' ratios, and each round's.
set -euo pipefail

BENCH=traces
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10}
CONNS=${CONNS:-64}
INGEST_S=${INGEST_S:-5}
MODES=${MODES:-off on hang refuse}
# shellcheck source=benches/lib.sh
. "$(dirname "$0")/lib.sh"

unset OTEL_EXPORTER_OTLP_ENDPOINT OTEL_EXPORTER_OTLP_TRACES_ENDPOINT OTEL_SDK_DISABLED
need nginx nginx-light
export PATH="$PATH:/usr/sbin"
for t in curl cargo awk python3; do command -v $t >/dev/null || die "'$t' is missing"; done

build_release
LOADGEN=$(cd "$ROOT" && cargo bench --quiet --bench loadgen --no-run --message-format=json |
    sed -n 's/.*"executable":"\([^"]*loadgen[^"]*\)".*/\1/p' | tail -1)
DELIVERY=$(cd "$ROOT" && cargo bench --quiet --bench delivery --no-run --message-format=json |
    sed -n 's/.*"executable":"\([^"]*delivery[^"]*\)".*/\1/p' | tail -1)
[ -x "$LOADGEN" ] && [ -x "$DELIVERY" ] || die "could not build benches/loadgen.rs and benches/delivery.rs"

# The collectors, on the client's CPU: nginx taking (200) or refusing (503)
# every export, and a listener that never accepts what it is sent.
SINK=$(free_port); REFUSE=$(free_port); HANG=$(free_port)
mkdir -p "$TMP/nginx"
cat >"$TMP/nginx/nginx.conf" <<NGINX
worker_processes 1;
daemon off;
pid $TMP/nginx/nginx.pid;
error_log $TMP/nginx/error.log;
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path $TMP/nginx/body;
    client_max_body_size 0;
    server { listen 127.0.0.1:$SINK; location / { return 200; } }
    server { listen 127.0.0.1:$REFUSE; location / { return 503; } }
}
NGINX
"${CLIENT_CPU[@]}" nginx -c "$TMP/nginx/nginx.conf" &
PIDS+=("$!")
"${CLIENT_CPU[@]}" python3 -c "
import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('127.0.0.1', $HANG)); s.listen(4096)
conns = []
while True:
    c, _ = s.accept(); conns.append(c)  # never read, never answered
" &
PIDS+=("$!")
sleep 0.5
[ "$(curl -s -o /dev/null -w '%{http_code}' -X POST "http://127.0.0.1:$SINK/v1/traces")" = 200 ] || die "the nginx collector does not answer"

HEAD_BIN=$BIN
case " $MODES " in *" before"*) [ -x "${BEFORE_BIN:-}" ] || die "modes before and before-on need BEFORE_BIN, another dedupd binary" ;; esac
endpoint() {
    case $1 in
        off | before) echo "" ;;
        on | before-on) echo "http://127.0.0.1:$SINK" ;;
        hang) echo "http://127.0.0.1:$HANG" ;;
        refuse) echo "http://127.0.0.1:$REFUSE" ;;
        *) die "unknown mode $1" ;;
    esac
}
with_traces() { # with_traces MODE CMD...: CMD with the mode's collector, or none
    local e; e=$(endpoint "$1"); shift
    if [ -n "$e" ]; then OTEL_EXPORTER_OTLP_ENDPOINT=$e "$@"; else "$@"; fi
}

RES=$TMP/results.txt
: >"$RES"
wait_quiet
log "waited ${waited}s for other builds; load average $(cut -d' ' -f1-3 /proc/loadavg)"
for ROUND in $(seq "$ROUNDS"); do
    for mode in $MODES; do
        case $mode in before*) BIN=$BEFORE_BIN ;; *) BIN=$HEAD_BIN ;; esac
        log "round $ROUND, traces $mode: claims, $CONNS connections, ${DURATION} s"
        wait_quiet
        with_traces "$mode" start_dedupd "claims-$mode-$ROUND"
        threads_cpu "$DPID" >"$TMP/cpu0"
        out=$("${CLIENT_CPU[@]}" "$LOADGEN" http-claim "127.0.0.1:$DPORT" "$CONNS" "$DURATION" 2 1)
        threads_cpu "$DPID" >"$TMP/cpu1"
        r=$(grep '^RESULT' <<<"$out") || die "no loadgen result: $out"
        n=$(sed 's/.*requests=\([0-9]*\).*/\1/' <<<"$r")
        cpu=$(cpu_per_op "$TMP/cpu0" "$TMP/cpu1" "$n")
        # The export thread's part (dedupd-traces=N in the per-thread figures).
        awk -v m="$mode" -v r="$ROUND" -v cpu="$cpu" '{
            for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
            split(cpu, c, "total="); split(c[2], t, " switches=")
            x = 0; if (match(cpu, /dedupd-traces=[0-9.]+/)) x = substr(cpu, RSTART + 14, RLENGTH - 14)
            printf "claims %s %s %.0f %.3f %.1f %.3f %.2f\n", m, r, v["rps"], v["p99_ms"], t[1], t[2], x
        }' <<<"$r" >>"$RES"
        kill "$DPID"; wait "$DPID" 2>/dev/null || true

        log "round $ROUND, traces $mode: ingest and delivery (benches/delivery.rs nginx, ${INGEST_S} s)"
        wait_quiet
        out=$(with_traces "$mode" env BENCH_BIN="$BIN" PIN="$PIN" SCENARIOS=nginx DURATION_S="$INGEST_S" \
            "${CLIENT_CPU[@]}" "$DELIVERY" --bench 2>&1) || die "the delivery bench failed: $out"
        echo "$out" >"$TMP/delivery-$mode-$ROUND.txt"
        awk -v m="$mode" -v r="$ROUND" '
            /-> ingest/ { match($0, /ingest [0-9.]+ events\/s/); split(substr($0, RSTART, RLENGTH), a, " "); rate = a[2]
                          match($0, /p50 [0-9.]+ ms/); split(substr($0, RSTART, RLENGTH), b, " "); p50 = b[2]
                          match($0, /p99 [0-9.]+ ms/); split(substr($0, RSTART, RLENGTH), c, " "); p99 = c[2] }
            /first post -> last delivery/ { match($0, /= [0-9.]+x/); e2e = substr($0, RSTART + 2, RLENGTH - 3) }
            /µs CPU and/ { match($0, /[0-9.]+ µs CPU/); split(substr($0, RSTART, RLENGTH), d, " "); cpu = d[1]
                           match($0, /[0-9.]+ context switches/); split(substr($0, RSTART, RLENGTH), e, " "); sw = e[1] }
            END { printf "ingest %s %s %s %s %s %s %s %s\n", m, r, rate, p50, p99, e2e, cpu, sw }' <<<"$out" >>"$RES"
    done
done

median() { sort -g | awk '{ a[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
echo
echo "Traces: off, on at sample_ratio 1.0 (nginx taking every export), a collector that hangs, one that refuses (503); before: ${BEFORE_BIN:-none}."
echo "$ROUNDS round(s), modes alternating within each; medians, each round's figure in brackets. $(date -u +%F), $(git -C "$ROOT" rev-parse --short HEAD), PIN=$PIN."
machine
echo
printf '%-8s %-9s %12s %10s %14s %16s %14s\n' claims mode "claims/s" "p99 ms" "µs CPU/claim" "switches/claim" "of it, export"
for mode in $MODES; do
    rows=$(awk -v m="$mode" '$1 == "claims" && $2 == m' "$RES")
    col() { awk -v k="$1" '{ print $k }' <<<"$rows"; }
    printf '%-8s %-9s %12s %10s %14s %16s %14s   [%s] [CPU %s]\n' "" "$mode" "$(col 4 | median)" "$(col 5 | median)" "$(col 6 | median)" "$(col 7 | median)" "$(col 8 | median)" "$(col 4 | xargs)" "$(col 6 | xargs)"
done
echo
printf '%-8s %-9s %12s %10s %10s %14s %16s %18s\n' ingest mode "events/s" "p50 ms" "p99 ms" "e2e ×posting" "µs CPU/event" "switches/event"
for mode in $MODES; do
    rows=$(awk -v m="$mode" '$1 == "ingest" && $2 == m' "$RES")
    col() { awk -v k="$1" '{ print $k }' <<<"$rows"; }
    printf '%-8s %-9s %12s %10s %10s %14s %16s %18s   [p99 %s] [CPU %s]\n' "" "$mode" "$(col 4 | median)" "$(col 5 | median)" "$(col 6 | median)" "$(col 7 | median)" "$(col 8 | median)" "$(col 9 | median)" "$(col 6 | xargs)" "$(col 8 | xargs)"
done
# Each round's figure against off's in the same round: a slow or quick
# spell of the VM moves both of a round's runs alike, and cancels out of
# their ratio, where it shifts the medians above.
case " $MODES " in *" off "*)
    echo
    echo "CPU an operation against off's in the same round: the median of the rounds' ratios [each round's]"
    for kind in claims ingest; do
        k=6; [ "$kind" = ingest ] && k=8
        for mode in $MODES; do
            [ "$mode" = off ] && continue
            awk -v kind="$kind" -v m="$mode" -v k="$k" '
                $1 == kind && $2 == "off" { off[$3] = $k }
                $1 == kind && $2 == m { on[$3] = $k; order[++rounds] = $3 }
                END {
                    for (i = 1; i <= rounds; i++) {
                        r = order[i]
                        if ((r in off) && off[r] > 0) { n++; a[n] = (on[r] / off[r] - 1) * 100; each = each sprintf(" %+.1f", a[n]) }
                    }
                    if (n == 0) exit
                    for (i = 2; i <= n; i++) { v = a[i]; for (j = i - 1; j >= 1 && a[j] > v; j--) a[j + 1] = a[j]; a[j + 1] = v }
                    med = (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
                    printf "%-8s %-9s %+7.1f %%   [%s ]\n", kind, m, med, each
                }' "$RES"
        done
    done ;;
esac
echo
echo "Measured with: ROUNDS=$ROUNDS DURATION=$DURATION CONNS=$CONNS INGEST_S=$INGEST_S MODES=\"$MODES\" PIN=$PIN${BEFORE_BIN:+ BEFORE_BIN=$BEFORE_BIN} benches/traces.sh"
