# Shared by the benchmark scripts in benches/: tools, a temp dir on disk,
# free ports, the release build, waiting for a quiet machine, starting
# dedupd and redis-server. Source it after setting BENCH (the script's name,
# for messages); it honours KEEP=1, BENCH_TMP, QUIET_WAIT and PIN=1.
# shellcheck shell=bash

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
KEEP=${KEEP:-0}
QUIET_WAIT=${QUIET_WAIT:-900}
# PIN=1: every server on CPU 0 and every load generator on CPU 1, for both
# sides alike (the 1-vCPU VM: there a hand-off between a server's threads
# costs what it costs, with no second core to hide it).
PIN=${PIN:-0}
SERVER_CPU=()
CLIENT_CPU=()
if [ "$PIN" = 1 ]; then
    [ "$(nproc)" -ge 2 ] || { echo "$BENCH: PIN=1 needs two CPUs" >&2; exit 1; }
    SERVER_CPU=(taskset -c 0)
    CLIENT_CPU=(taskset -c 1)
fi

die() { echo "$BENCH: $*" >&2; exit 1; }
log() { echo "== $*" >&2; }

need() { # need CMD DEBIAN_PACKAGE...
    command -v "$1" >/dev/null && return
    [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null ||
        die "'$1' is missing: install the Debian package(s) ${*:2}"
    log "installing ${*:2}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y "${@:2}" >/dev/null ||
        { apt-get update >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y "${@:2}" >/dev/null; } ||
        die "could not install ${*:2}"
}

# The temp dir: on a disk (tmpfs would flatter every sync), removed at exit
# with every process in PIDS stopped first.
TMP=$(mktemp -d "${BENCH_TMP:-/var/tmp}/$BENCH.XXXXXX")
case $(stat -f -c %T "$TMP") in tmpfs | ramfs) die "$TMP is on $(stat -f -c %T "$TMP"): set BENCH_TMP to a disk" ;; esac
PIDS=()
cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    if [ "$KEEP" = 1 ]; then log "kept $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
trap 'echo "$BENCH: failed at line $LINENO: $BASH_COMMAND" >&2' ERR
trap 'exit 130' INT TERM

# A port below the kernel's ephemeral range (where a client's connection,
# the export's to its collector say, could take it between this check and
# the bind), in no socket's use in any state.
free_port() {
    local p i low
    read -r low _ </proc/sys/net/ipv4/ip_local_port_range
    [ "$low" -gt 10000 ] || low=32768
    for i in $(seq 200); do
        p=$((10000 + RANDOM % (low - 10000)))
        [ -z "$(ss -Htan "( sport = :$p )")" ] && { echo "$p"; return; }
    done
    die "no free port found"
}

build_release() { # sets BIN (BIN_OVERRIDE: measure that binary instead, for A/B runs)
    log "cargo build --release"
    (cd "$ROOT" && cargo build --release --quiet "$@") || die "cargo build --release failed"
    BIN=${BIN_OVERRIDE:-$ROOT/target/release/dedupd}
}

# Builds (and cargo test runs) pollute the figures: before each measurement,
# wait until none has run for 5 s, up to QUIET_WAIT seconds in all.
busy() { pgrep -x rustc >/dev/null || pgrep -x cc1 >/dev/null || pgrep -x clippy-driver >/dev/null || pgrep -x cargo >/dev/null; }
waited=0
wait_quiet() {
    local calm=0 said=0 t0
    while [ "$calm" -lt 2 ]; do
        if busy; then
            [ "$waited" -ge "$QUIET_WAIT" ] && return
            [ "$said" = 1 ] || log "a build is running (rustc/cc1/clippy-driver/cargo): waiting (${waited}s of ${QUIET_WAIT}s used)"
            said=1; calm=0; t0=$(date +%s); sleep 5; waited=$((waited + $(date +%s) - t0))
        else calm=$((calm + 1)); sleep 2.5; fi
    done
}
flag() { busy && echo "BUILD" || echo "-"; }

start_dedupd() { # start_dedupd NAME [EXTRA TOML] ; sets DPORT, DPID
    local name=$1 i code per_address=""
    DPORT=$(free_port)
    # Every load generator connects from 127.0.0.1: lift the per-address
    # connection cap where the binary has one (builds before it refuse the key).
    if DEDUPD_HTTP__MAX_CONNECTIONS_PER_ADDRESS=0 "$BIN" check-config >/dev/null 2>&1; then
        per_address="max_connections_per_address = 0"
    fi
    mkdir -p "$TMP/$name"
    cat >"$TMP/$name/dedupd.toml" <<TOML
listen = "127.0.0.1:$DPORT"
data_path = "$TMP/$name/dedupd.redb"
${2:-}
[log]
level = "warn"
[http]
workers = 2
$per_address
TOML
    "${SERVER_CPU[@]}" "$BIN" serve --config "$TMP/$name/dedupd.toml" >"$TMP/$name/dedupd.log" 2>&1 &
    DPID=$!; PIDS+=("$DPID")
    for i in $(seq 600); do
        [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$DPORT/readyz")" = 200 ] && break
        kill -0 "$DPID" 2>/dev/null || { cat "$TMP/$name/dedupd.log" >&2; die "dedupd exited"; }
        [ "$i" = 600 ] && die "dedupd not ready after 60 s"
        sleep 0.1
    done
    code=$(curl -s -o /dev/null -w '%{http_code}' -X POST "http://127.0.0.1:$DPORT/v1/claims/smoke-$$-$RANDOM")
    [ "$code" = 201 ] || die "a first claim answered $code, not 201"
}

start_redis() { # start_redis NAME ARGS... ; sets PORT and RPID
    local name=$1 port i; shift
    port=$(free_port); mkdir -p "$TMP/$name"
    "${SERVER_CPU[@]}" redis-server --port "$port" --bind 127.0.0.1 --dir "$TMP/$name" --daemonize no \
        --logfile "$TMP/$name/redis.log" "$@" >/dev/null 2>&1 &
    RPID=$!; PIDS+=("$RPID")
    for i in $(seq 100); do
        [ "$(redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null)" = PONG ] && { PORT=$port; return; }
        sleep 0.1
    done
    die "redis $name did not start (see $TMP/$name/redis.log)"
}
# Automatic AOF rewrites are off: a rewrite forks and writes the whole data
# set, which would land in whichever run (dedupd's too) happens to follow.
AOF_ARGS=(--appendonly yes --appendfsync always --save "" --auto-aof-rewrite-percentage 0)
NONE_ARGS=(--appendonly no --save "")

# CPU time a server spends per request, from the scheduler's accounting
# (/proc/PID/task/TID/schedstat: nanoseconds on a CPU): far steadier between
# runs on this VM than requests per second are. Not the user + system ticks
# of .../stat: on this VM those missed about half of the HTTP workers' time
# (0.47 s against 0.84 s in one 5 s run; the writer's agreed), while the
# schedstat sums matched the process's own total. Ticks only where the
# kernel has no schedstat.
# Context switches per request come from the same snapshot (the threads'
# voluntary and involuntary counts in .../status): a hand-off between
# threads costs more on some VMs than the work it carries.
TICK_NS=$(( 1000000000 / $(getconf CLK_TCK) ))
threads_cpu() { # threads_cpu PID: "<thread name> <ns on a CPU>" per thread name
    local t
    for t in /proc/"$1"/task/*; do
        if [ -r "$t/schedstat" ]; then
            printf '%s %s\n' "$(tr ' ' _ <"$t/comm")" "$(awk '{ print $1 }' "$t/schedstat")"
        else
            printf '%s %s\n' "$(tr ' ' _ <"$t/comm")" "$(awk -v ns="$TICK_NS" '{ print ($14 + $15) * ns }' "$t/stat")"
        fi
        # Context switches, voluntary (a wait: a queue, a lock, a sync)
        # and not (preempted), under one pseudo-thread name.
        awk '/^(non)?voluntary_ctxt_switches:/ { s += $2 } END { printf "~switches %d\n", s }' "$t/status"
    done | awk '{ n[$1] += $2 } END { for (k in n) printf "%s %.0f\n", k, n[k] }' | LC_ALL=C sort
}
cpu_per_op() { # cpu_per_op BEFORE AFTER OPS: "name=us ..." per thread name, "total=us", then "switches=N" per op
    LC_ALL=C join -a 2 "$1" "$2" | awk -v ops="$3" '
        { d = (NF == 3 ? $3 - $2 : $2) / ops }
        $1 == "~switches" { sw = d; next }
        { d /= 1000; t += d; if (d >= 0.05) printf "%s=%.1f ", $1, d }
        END { printf "total=%.1f switches=%.3f\n", t, sw }'
}

machine() { # one line about the machine and the temp dir's disk
    local dev; dev=$(findmnt -n -o SOURCE -T "$TMP")
    echo "Machine: $(nproc) CPUs ($(lscpu | sed -n 's/^Model name: *//p')), $(uname -r), $(free -g | awk '/Mem:/ { print $2 }') GiB RAM"
    echo "Temp dir: $TMP on $dev ($(findmnt -n -o FSTYPE,OPTIONS -T "$TMP")); disk: $(lsblk -dn -o NAME,SIZE,ROTA,MODEL "$dev" 2>/dev/null | xargs || echo '?')"
    echo "Quiet: waited ${waited}s in all for other builds (limit QUIET_WAIT=${QUIET_WAIT}s); load average now $(cut -d' ' -f1-3 /proc/loadavg)."
}
