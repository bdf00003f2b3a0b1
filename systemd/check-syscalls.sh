#!/usr/bin/env bash
# Runs dedupd under strace through a real workload — claims, a signed
# webhook delivered to a real receiver, a metrics scrape, a count over
# bodies, an erasure, SIGTERM — and
# checks every system call it made against the unit's SystemCallFilter=
# lines, expanded by systemd-analyze. A call the filter would refuse fails
# the check: the unit must not break the service.
#
# Usage: systemd/check-syscalls.sh [path/to/dedupd]   (needs strace, python3,
# curl and systemd-analyze)
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-target/debug/dedupd}"
unit=systemd/dedupd.service
work="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port="$(free_port)"
app_port="$(free_port)"

# A receiver that answers 204 and counts deliveries.
python3 - "$app_port" "$work/received" <<'PY' &
import http.server, sys
port, out = int(sys.argv[1]), sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        with open(out, "a") as f: f.write(self.headers.get("webhook-id", "") + "\n")
        self.send_response(204); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
PY

cat > "$work/dedupd.toml" <<TOML
listen = "127.0.0.1:$port"
data_path = "$work/dedupd.redb"
[sources.sume]
scheme = "sume"
event_id = "body:/request_id"
created_at = "body:/created_at"
stream = "body:/run_id"
secrets = ["strace_secret"]
forward_to = "http://127.0.0.1:$app_port/hooks"
destination_secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
TOML

# A soft open-files limit below what the settings need, so the trace covers
# serve raising it at start (as it does outside the unit's LimitNOFILE=).
ulimit -S -n 1024 2>/dev/null || true
strace -f -qq -o "$work/trace" "$bin" serve --config "$work/dedupd.toml" 2>"$work/log" &
pid=$!
for _ in $(seq 100); do curl -fs "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.1; done
curl -fs "http://127.0.0.1:$port/healthz" >/dev/null || { echo "dedupd did not start:"; cat "$work/log"; exit 1; }
curl -fs -X POST "http://127.0.0.1:$port/v1/claims/k1" >/dev/null
body='{"request_id":"req_strace","run_id":"run_1","created_at":"2026-11-30T10:00:00Z","type":"run.updated","data":{}}'
ts="$(date +%s)"
sig="$(python3 -c 'import hmac,hashlib,sys; print(hmac.new(b"strace_secret", (sys.argv[1]+"."+sys.argv[2]).encode(), hashlib.sha256).hexdigest())' "$ts" "$body")"
curl -fs -X POST "http://127.0.0.1:$port/ingest/sume" -H "X-Sume-Timestamp: $ts" \
  -H "X-Sume-Signature: v1=$sig" -H 'content-type: application/json' -d "$body" >/dev/null
for _ in $(seq 100); do grep -q req_strace "$work/received" 2>/dev/null && break; sleep 0.1; done
grep -q req_strace "$work/received" || { echo "the webhook was not delivered"; cat "$work/log"; exit 1; }
curl -fs "http://127.0.0.1:$port/metrics" >/dev/null
# A count that parses bodies (the scan threads) and an erasure (its key
# overwritten and synced in the key file).
curl -fs "http://127.0.0.1:$port/v1/sources/sume/count?status=delivered&field=/type&value=run.updated" \
  | grep -q '"matched":1' || { echo "the count did not find the event"; cat "$work/log"; exit 1; }
curl -fs -X DELETE "http://127.0.0.1:$port/v1/sources/sume/events/req_strace" >/dev/null
# SIGTERM to dedupd itself (strace's child): a graceful stop.
kill -TERM "$(pgrep -P "$pid")"
wait "$pid"

# Once more on one CPU, where dedupd syncs its log on a thread of its own
# and schedules itself as SCHED_BATCH (src/scheduling.rs): start, a claim, stop.
rm -f "$work/dedupd.redb"*
taskset -c 0 strace -f -qq -o "$work/trace1" "$bin" serve --config "$work/dedupd.toml" 2>"$work/log1" &
pid=$!
for _ in $(seq 100); do curl -fs "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.1; done
curl -fs -X POST "http://127.0.0.1:$port/v1/claims/k1" >/dev/null || { echo "dedupd on one CPU did not serve:"; cat "$work/log1"; exit 1; }
grep -q 'SCHED_BATCH.*) = 0' "$work/trace1" || { echo "dedupd on one CPU did not get SCHED_BATCH"; exit 1; }
kill -TERM "$(pgrep -P "$pid")"
wait "$pid"

python3 - "$unit" "$work/trace" "$work/trace1" <<'PY'
import re, subprocess, sys
unit, traces = sys.argv[1], sys.argv[2:]
def expand(name, seen=None):
    seen = seen if seen is not None else set()
    if not name.startswith("@"):
        return {name}
    if name in seen:
        return set()
    seen.add(name)
    out = set()
    for line in subprocess.run(["systemd-analyze", "syscall-filter", name], capture_output=True, text=True, check=True).stdout.splitlines()[1:]:
        line = line.strip()
        if line and not line.startswith("#"):
            out |= expand(line, seen)
    return out
# In order, as systemd applies them: the first line is an allow list, a
# later `~` line takes calls out of it, a later plain line puts them back.
allowed = set()
for line in open(unit):
    if line.startswith("SystemCallFilter="):
        v = line.split("=", 1)[1].strip()
        if v.startswith("~"):
            for n in v[1:].split(): allowed -= expand(n)
        else:
            for n in v.split(): allowed |= expand(n)
used = set()
for trace in traces:
    for line in open(trace):
        m = re.match(r"\d+\s+(?:<\.\.\. )?([a-z0-9_]+)[\( ]", line)
        if m and not line.split(None, 1)[1].startswith(("+++", "---")):
            used.add(m.group(1))
refused = sorted(used - allowed)
print(f"{len(used)} distinct system calls made; the unit's filter allows {len(allowed)}")
if refused:
    print("refused by SystemCallFilter=:", " ".join(refused))
    sys.exit(1)
print("every call the service made is allowed by the unit")
PY
