#!/usr/bin/env bash
# Writes the golden data files under tests/golden/ with REAL builds of
# dedupd: each case is the file (and write-ahead log) that the build of one
# commit leaves behind after the same scenario, run through its own HTTP
# API, gateway and Redis-protocol listener. tests/store/golden.rs opens each
# with the current build and checks that nothing was lost.
#
# usage: tests/golden/make.sh CASE=BINARY...
#   Each BINARY is `cargo build --bin dedupd` (debug is fine) of the commit
#   its CASE names below, e.g. in a throwaway worktree:
#     git worktree add --detach /tmp/old e1a7ba2
#     (cd /tmp/old && cargo build --bin dedupd)
#     tests/golden/make.sh schema-2=/tmp/old/target/debug/dedupd
#   Only the cases given are (re)written. Golden files are written once per
#   schema version or log format: never regenerate one with another build.
#
# Needs bash, curl, python3, openssl, redis-cli and libfaketime (Debian:
# apt-get install curl python3 openssl redis-tools faketime). The clock of
# dedupd is frozen at T0 = 2027-01-15T08:00:00Z (Unix ms 1800000000000)
# with libfaketime, so every expiry, receive time and retry time in the
# files is known to the test.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)

# case | commit | what the build has (claims: claims and ordering only;
# gateway: + webhook inbox; resp: + Redis-protocol keyspace; jobs: + bulk
# jobs and erasure, on a third source; results: + dones that keep a
# result) | config
# style (store: the [store] table; storage: [storage]) | how it stops
# (term: SIGTERM, a clean shutdown; kill: SIGKILL with the log holding
# batches not checkpointed)
CASES="
schema-1-claims   73fa530 claims  store   term
schema-1-no-lease 0566d69 gateway store   term
schema-1          a2c15fe gateway storage term
schema-2          e1a7ba2 gateway storage term
schema-3          a9f97d7 gateway storage term
schema-4          e32c837 resp    storage term
schema-5          cee9e51 resp    storage term
schema-6          dc8992a resp    storage term
log-format-1      bfe9ebb resp    storage kill
log-format-2      3481e83 resp    storage kill
schema-7          2cd3be3 resp    storage term
schema-8          6be7d97 resp    storage term
log-format-3      6be7d97 resp    storage kill
schema-9          c9a2cba jobs    storage term
log-format-4      c9a2cba jobs    storage kill
schema-10         51af7e1 jobs    storage term
schema-11         5d5add1 jobs    storage term
schema-12         90b41e1 jobs    storage term
schema-13         b43ec92 results storage term
log-format-7      b43ec92 results storage kill
schema-14         749b176 results storage term
"

usage() {
    echo "usage: $0 CASE=BINARY..." >&2
    echo "cases (each BINARY built from its COMMIT):" >&2
    echo "$CASES" | awk 'NF { printf "  %-18s %s\n", $1, $2 }' >&2
    exit 2
}

[ $# -gt 0 ] || usage

T0_TEXT="2027-01-15 08:00:00"
T0_S=1800000000
SECRET="sume_golden_secret"
# whsec_ + base64 of 32 bytes: the key dedupd signs forwarded requests with.
DEST_SECRET="whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

FAKETIME_LIB=""
for lib in /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1 \
    /usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1 \
    /usr/lib/faketime/libfaketimeMT.so.1; do
    [ -e "$lib" ] && FAKETIME_LIB=$lib && break
done
[ -n "$FAKETIME_LIB" ] || { echo "libfaketime not found (apt-get install faketime)" >&2; exit 1; }
for tool in curl python3 openssl redis-cli; do
    command -v "$tool" >/dev/null || { echo "$tool not found" >&2; exit 1; }
done

WORK=$(mktemp -d)
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# The application the gateway forwards to: 200 for event ids starting
# "ok", 503 for the others.
RECEIVER_PORT=$(free_port)
python3 - "$RECEIVER_PORT" <<'EOF' &
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        code = 200 if self.headers.get("webhook-id", "").startswith("ok") else 503
        self.send_response(code)
        self.send_header("content-length", "0")
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
EOF
PIDS+=($!)

die() { echo "make.sh: $*" >&2; exit 1; }

# json FIELD: reads a JSON document on stdin, prints one field.
json() { python3 -c 'import json,sys; v=json.load(sys.stdin); print(eval("v"+sys.argv[1]))' "$1"; }

# http METHOD PATH [BODY]: a request to dedupd's API; prints the body,
# fails on a status other than 2xx.
http() {
    local code data=()
    [ $# -lt 3 ] || data=(--data-binary "$3")
    code=$(curl -sS -o "$WORK/body" -w '%{http_code}' -X "$1" -H 'content-type: application/json' \
        "${data[@]}" "http://127.0.0.1:$PORT$2")
    [ "${code:0:1}" = 2 ] || die "$1 $2 answered $code: $(cat "$WORK/body")"
    cat "$WORK/body"
    echo "$1 $2 ${3:-} -> $code $(cat "$WORK/body")" >>"$ANSWERS"
}

# ingest SOURCE BODY: a webhook signed as the sume scheme wants
# (X-Sume-Signature: v1=hex(HMAC-SHA256(secret, "{timestamp}.{body}"))).
ingest() {
    local sig out
    sig=$(printf '%s' "$T0_S.$2" | openssl dgst -sha256 -hmac "$SECRET" | awk '{print $NF}')
    out=$(curl -sS -X POST -H 'content-type: application/json' -H "X-Sume-Timestamp: $T0_S" \
        -H "X-Sume-Signature: v1=$sig" --data-binary "$2" "http://127.0.0.1:$PORT/ingest/$1")
    echo "POST /ingest/$1 $2 -> $out" >>"$ANSWERS"
    case "$out" in
        *'"accepted"'* | *'"duplicate"'*) ;;
        *) die "ingest into $1 answered $out" ;;
    esac
}

# wait_for SOURCE STATUS EXPR: until the listing of SOURCE's events with
# STATUS satisfies the python expression EXPR over `events` (30 s at most).
wait_for() {
    local i
    for i in $(seq 300); do
        if curl -sS "http://127.0.0.1:$PORT/v1/sources/$1/events?status=$2" |
            python3 -c 'import json,sys; events=json.load(sys.stdin)["events"]; sys.exit(0 if eval(sys.argv[1]) else 1)' "$3" \
                2>/dev/null; then
            return 0
        fi
        sleep 0.1
    done
    die "$1 events with status $2 never satisfied: $3"
}

# wait_job ID EXPR: until the view of job ID satisfies the python
# expression EXPR over `job` (30 s at most).
wait_job() {
    local i
    for i in $(seq 300); do
        if curl -sS "http://127.0.0.1:$PORT/v1/jobs/$1" |
            python3 -c 'import json,sys; job=json.load(sys.stdin); sys.exit(0 if eval(sys.argv[1]) else 1)' "$2" \
                2>/dev/null; then
            return 0
        fi
        sleep 0.1
    done
    die "job $1 never satisfied: $2"
}

resp() {
    local out
    out=$(redis-cli -h 127.0.0.1 -p "$RESP_PORT" "$@")
    echo "RESP $* -> $out" >>"$ANSWERS"
    echo "$out"
}

config() {
    local kind=$1 style=$2 stop=$3
    cat <<EOF
listen = "127.0.0.1:$PORT"
data_path = "$DIR/dedupd.redb"

[log]
level = "warn"
EOF
    if [ "$stop" = kill ]; then
        # Checkpoints never come by themselves: the batches stay in the log.
        cat <<EOF

[$style]
checkpoint_bytes = 1073741824
checkpoint_interval = "1h"
checkpoint_idle = "1h"
EOF
    fi
    if [ "$kind" = resp ] || [ "$kind" = jobs ]; then
        printf '\n[resp]\nlisten = "127.0.0.1:%s"\n' "$RESP_PORT"
    fi
    if [ "$kind" != claims ]; then
        # sume: retries wait an hour (the clock is frozen: they never come);
        # fragile: one attempt, then dead; bulk (builds with jobs): as sume,
        # for the jobs and the erasure, apart from the other two.
        local sources="sume fragile"
        [ "$kind" != jobs ] || sources="sume fragile bulk"
        for source in $sources; do
            cat <<EOF

[sources.$source]
scheme = "sume"
secrets = ["$SECRET"]
event_id = "body:/id"
created_at = "body:/created_at"
stream = "body:/stream"
forward_to = "http://127.0.0.1:$RECEIVER_PORT/hook"
destination_secret = "$DEST_SECRET"
backoff_min = "1h"
backoff_max = "2h"
max_attempts = $([ $source = fragile ] && echo 1 || echo 3)
EOF
        done
    fi
}

# The scenario: what every case's file holds (see README.md).
scenario() {
    local kind=$1 token job
    # Claims: processing (with a fingerprint), done, extended, released.
    http POST /v1/claims/job-processing '{"ttl_ms":3600000,"fingerprint":"sha256:aa"}' >/dev/null
    token=$(http POST /v1/claims/job-done '{"ttl_ms":3600000}' | json '["token"]')
    http POST /v1/claims/job-done/done "{\"token\":\"$token\",\"ttl_ms\":86400000}" >/dev/null
    token=$(http POST /v1/claims/job-extended '{"ttl_ms":60000}' | json '["token"]')
    http POST /v1/claims/job-extended/extend "{\"token\":\"$token\",\"ttl_ms\":7200000}" >/dev/null
    token=$(http POST /v1/claims/job-released '{"ttl_ms":3600000}' | json '["token"]')
    http DELETE /v1/claims/job-released "{\"token\":\"$token\"}" >/dev/null
    # Ordering: applied, stale, duplicate; two streams.
    http POST /v1/streams/orders/apply '{"event_id":"evt-b","created_at":"2027-01-15T07:05:00Z"}' >/dev/null
    http POST /v1/streams/orders/apply '{"event_id":"evt-a","created_at":"2027-01-15T07:00:00Z"}' >/dev/null
    http POST /v1/streams/orders/apply '{"event_id":"evt-b","created_at":"2027-01-15T07:05:00Z"}' >/dev/null
    http POST /v1/streams/payments/apply '{"event_id":"evt-c","created_at":"2027-01-15T07:10:00Z"}' >/dev/null
    if [ "$kind" != claims ]; then
        # Gateway: delivered (on a stream, and without one), stale, pending
        # after a failed attempt, pending behind it on its stream, dead.
        ingest sume '{"id":"ok-1","stream":"run-1","created_at":"2027-01-15T07:00:00Z"}'
        ingest sume '{"id":"ok-3","created_at":"2027-01-15T07:20:00Z"}'
        wait_for sume delivered 'len(events) == 2'
        ingest sume '{"id":"ok-1","stream":"run-1","created_at":"2027-01-15T07:00:00Z"}'
        ingest sume '{"id":"ok-0","stream":"run-1","created_at":"2027-01-15T06:00:00Z"}'
        wait_for sume stale 'len(events) == 1'
        ingest sume '{"id":"fail-1","stream":"run-2","created_at":"2027-01-15T07:00:00Z"}'
        wait_for sume pending '[e["attempts"] for e in events] == [1]'
        ingest sume '{"id":"ok-2","stream":"run-2","created_at":"2027-01-15T07:30:00Z","note":"waits behind fail-1"}'
        ingest fragile '{"id":"fail-2","created_at":"2027-01-15T07:40:00Z"}'
        wait_for fragile dead 'len(events) == 1'
        wait_for sume pending 'sorted((e["event_id"], e["attempts"]) for e in events) == [("fail-1", 1), ("ok-2", 0)]'
    fi
    if [ "$kind" = resp ] || [ "$kind" = jobs ]; then
        # Keyspace: no expiry, an expiry, a binary value, a key deleted,
        # an expiry removed.
        [ "$(resp SET kv:plain value-1)" = OK ] || die "SET"
        [ "$(resp SET kv:temp value-2 PX 3600000)" = OK ] || die "SET PX"
        [ "$(printf 'bin\000\377' | resp -x SET kv:bin)" = OK ] || die "SET binary"
        [ "$(resp SET kv:gone x)" = OK ] || die "SET"
        [ "$(resp DEL kv:gone)" = 1 ] || die "DEL"
        [ "$(resp SET kv:persisted value-3 EX 60)" = OK ] || die "SET EX"
        [ "$(resp PERSIST kv:persisted)" = 1 ] || die "PERSIST"
    fi
    if [ "$kind" = jobs ]; then
        # On bulk: ok-4 delivered (the head of run-3), late-1 stale behind
        # it, ok-5 delivered, then erased.
        ingest bulk '{"id":"ok-4","stream":"run-3","created_at":"2027-01-15T07:00:00Z"}'
        wait_for bulk delivered 'len(events) == 1'
        ingest bulk '{"id":"late-1","stream":"run-3","created_at":"2027-01-15T06:00:00Z"}'
        wait_for bulk stale 'len(events) == 1'
        ingest bulk '{"id":"ok-5","created_at":"2027-01-15T07:50:00Z"}'
        wait_for bulk delivered 'len(events) == 2'
        http DELETE /v1/sources/bulk/events/ok-5 >/dev/null
        # A redeliver job of the delivered events: ok-4 (the erased ok-5 is
        # not delivered any more) replayed and acknowledged; the job done.
        job=$(http POST /v1/sources/bulk/jobs '{"kind":"redeliver","filter":{"status":"delivered"}}' | json '["id"]')
        wait_job "$job" 'job["state"] == "done" and job["delivered"] == 1'
        # A redeliver job of the stale events: late-1 replayed, answered
        # 503, its retry an hour away (never: the clock is frozen), so the
        # job still runs, waiting for it, when it is cancelled.
        job=$(http POST /v1/sources/bulk/jobs '{"kind":"redeliver","filter":{"status":"stale"}}' | json '["id"]')
        wait_for bulk pending '[(e["event_id"], e["attempts"]) for e in events] == [("late-1", 1)]'
        http POST "/v1/jobs/$job/cancel" >/dev/null
        wait_job "$job" 'job["cancelled"] and job["state"] == "running" and job["queued"] == 1'
        # What the build shows of them (recorded in answers.txt).
        for id in ok-4 late-1 ok-5; do http GET "/v1/sources/bulk/events/$id" >/dev/null; done
        http GET '/v1/sources/bulk/events?status=erased' >/dev/null
        http GET /v1/jobs >/dev/null
    fi
    if [ -n "${RESULTS:-}" ]; then
        # Dones that keep a result: a small one, and one of 300 bytes.
        token=$(http POST /v1/claims/job-result '{"ttl_ms":3600000}' | json '["token"]')
        http POST /v1/claims/job-result/done "{\"token\":\"$token\",\"ttl_ms\":86400000,\"result\":{\"charge\":\"ch_1\",\"amount\":12345678901234567890123}}" >/dev/null
        token=$(http POST /v1/claims/job-result-large '{"ttl_ms":3600000,"fingerprint":"sha256:cc"}' | json '["token"]')
        http POST /v1/claims/job-result-large/done "{\"token\":\"$token\",\"ttl_ms\":86400000,\"result\":\"$(printf 'r%.0s' $(seq 300))\"}" >/dev/null
        http GET /v1/claims/job-result >/dev/null
    fi
}

# trim_log FILE: cuts a write-ahead log after its last valid record (the
# chain of records from the header that each pass their checksum and are
# numbered one more than the one before): what follows is zeros written
# ahead or stale records, which a reader ignores anyway.
trim_log() {
    python3 - "$1" <<'EOF'
import sys, zlib
path = sys.argv[1]
data = open(path, "rb").read()
if data.startswith(b"DDWAL01\n"):
    at = 8
elif data[:5] == b"DDWAL" and data[7:8] == b"\n":
    at = 28  # format 2 on: magic, data file id, checksum
else:
    sys.exit(f"{path}: not a log")
last = None
records = 0
while at + 8 <= len(data):
    n = int.from_bytes(data[at:at + 4], "little")
    crc = int.from_bytes(data[at + 4:at + 8], "little")
    payload = data[at + 8:at + 8 + n]
    if n == 0 or len(payload) < n or zlib.crc32(payload) != crc:
        break
    seq, shift = 0, 0
    for b in payload:
        seq |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            break
    if last is not None and seq != last + 1:
        break
    last, at, records = seq, at + 8 + n, records + 1
open(path, "r+b").truncate(at)
print(f"{path}: {records} records, {at} bytes")
EOF
}

run_case() {
    local name=$1 bin=$2 commit kind style stop
    read -r _ commit kind style stop <<<"$(echo "$CASES" | awk -v n="$name" '$1 == n')"
    [ -n "${commit:-}" ] || { echo "unknown case $name" >&2; usage; }
    # A build with results has everything a build with jobs has.
    RESULTS=""
    if [ "$kind" = results ]; then
        RESULTS=1
        kind=jobs
    fi
    [ -x "$bin" ] || die "$bin is not an executable"
    echo "== $name: $bin (must be built from $commit)"
    DIR="$WORK/$name"
    mkdir -p "$DIR"
    PORT=$(free_port)
    RESP_PORT=$(free_port)
    ANSWERS="$DIR/answers.txt"
    config "$kind" "$style" "$stop" >"$DIR/dedupd.toml"
    LD_PRELOAD="$FAKETIME_LIB" FAKETIME="$T0_TEXT" DONT_FAKE_MONOTONIC=1 TZ=UTC \
        "$bin" serve --config "$DIR/dedupd.toml" >"$DIR/stdout" 2>"$DIR/stderr" &
    local pid=$!
    PIDS+=("$pid")
    local i
    for i in $(seq 300); do
        curl -sf "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 && break
        kill -0 "$pid" 2>/dev/null || die "$name: dedupd exited: $(cat "$DIR/stderr")"
        sleep 0.1
    done
    scenario "$kind"
    if [ "$stop" = kill ]; then
        kill -KILL "$pid"
    else
        kill -TERM "$pid"
    fi
    { wait "$pid"; } 2>/dev/null || true
    local out="$HERE/$name"
    rm -rf "$out"
    mkdir -p "$out"
    cp "$DIR/dedupd.redb" "$out/dedupd.redb"
    if [ -e "$DIR/dedupd.redb.wal" ]; then
        cp "$DIR/dedupd.redb.wal" "$out/dedupd.redb.wal"
        trim_log "$out/dedupd.redb.wal"
    fi
    # The log's second segment (builds from 4052785 on).
    if [ -e "$DIR/dedupd.redb.wal2" ]; then
        cp "$DIR/dedupd.redb.wal2" "$out/dedupd.redb.wal2"
        trim_log "$out/dedupd.redb.wal2"
    fi
    # The key file the inbox's sealed events open with (schema 12 on).
    if [ -e "$DIR/dedupd.redb.keys" ]; then
        cp "$DIR/dedupd.redb.keys" "$out/dedupd.redb.keys"
    fi
    cp "$ANSWERS" "$out/answers.txt"
    # As text: the tree tracks no data file dedupd could open.
    python3 "$HERE/pack.py" "$out"/dedupd.redb*
    ls -l "$out"
}

for arg in "$@"; do
    case "$arg" in
        *=*) run_case "${arg%%=*}" "${arg#*=}" ;;
        *) usage ;;
    esac
done
