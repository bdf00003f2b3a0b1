#!/usr/bin/env bash
# The systemd drill (issue 51): the Debian package under a real systemd.
#
#   .ci/systemd-drill.sh PACKAGE.deb UPGRADE.deb
#
# Boots a minimal Debian (bookworm) under systemd-nspawn, with systemd as
# its PID 1 and a network of its own (loopback only), installs PACKAGE with
# dpkg, and checks what an operator relies on:
#   - install: the unit enabled and started, an API token made (0600, root)
#     in /etc/dedupd/credentials (0700), staged for the service at start;
#   - start: `systemctl start` returns once READY=1 came, /readyz answers,
#     a signed webhook reaches an application inside the container;
#   - the journal: structured lines with source, event id and outcome;
#   - reload: a source's secret and the API token rotated by `systemctl
#     reload` (same process, the new ones accepted, the old token refused),
#     a broken file refused with the service untouched;
#   - crash: SIGKILL under ingest load, restarted, every event answered
#     2xx delivered;
#   - watchdog: SIGSTOP, restarted within WatchdogSec (5 s for the drill),
#     nothing acknowledged lost;
#   - stop: `systemctl stop` during deliveries exits cleanly;
#   - the sandbox: a dynamic user, no writes outside its state directory,
#     no /home; with CPUAffinity=0, SCHED_BATCH under the system call filter;
#   - backup: dedupd-backup.service writes a backup (0600, verified), which
#     `dedupd restore` puts back: what came before it is there, what came
#     after is not, fences go on; the timer is installed, not enabled;
#   - upgrade: UPGRADE (the same build, a higher version) keeps the edited
#     settings, restarts the service and serves the old data, and a data
#     file of the schema before (tests/golden/schema-11) is migrated;
#   - remove keeps the data; purge removes it.
#
# Needs root, systemd-nspawn (systemd-container), debootstrap, python3.
# The base system is made once with debootstrap and kept in
# $DRILL_CACHE (/var/cache/dedupd-drill); each run works on a copy of it.
set -euo pipefail
cd "$(dirname "$0")/.."
deb=$(realpath "$1")
upgrade=$(realpath "$2")
cache=${DRILL_CACHE:-/var/cache/dedupd-drill}
base=$cache/rootfs

log() { printf '== drill: %s\n' "$*"; }
# grep -q in a pipe: grep reads all of its input (grep -q would stop at
# the first match, and the writer's SIGPIPE fail the pipe under pipefail).
has() { grep "$@" >/dev/null; }
die() {
    printf 'drill FAILED: %s\n' "$*" >&2
    # What the service said last, while the container is still up.
    if [ -n "${init:-}" ]; then
        printf -- '-- the last of journalctl -u dedupd:\n' >&2
        nsenter -t "$init" -a -- journalctl -u dedupd -o cat --no-pager -n 25 >&2 || true
    fi
    exit 1
}

if [ ! -x "$base/usr/lib/systemd/systemd" ]; then
    log "making the base system with debootstrap (once; kept in $base)"
    rm -rf "$base.tmp"
    mkdir -p "$cache"
    debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus,curl,ca-certificates \
        bookworm "$base.tmp" http://deb.debian.org/debian >"$cache/debootstrap.log" 2>&1 ||
        { tail -20 "$cache/debootstrap.log"; die "debootstrap"; }
    mv "$base.tmp" "$base"
fi

work=$(mktemp -d /var/tmp/dedupd-drill.XXXXXX)
root=$work/root
nspawn=""
cleanup() {
    if [ -n "$nspawn" ] && kill -0 "$nspawn" 2>/dev/null; then
        kill -TERM "$nspawn" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$nspawn" 2>/dev/null || break; sleep 0.2; done
        kill -KILL "$nspawn" 2>/dev/null || true
    fi
    [ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
cp -a "$base" "$root"
cp "$deb" "$root/root/dedupd.deb"
cp "$upgrade" "$root/root/dedupd-upgrade.deb"
python3 tests/golden/unpack.py tests/golden/schema-11 "$root/root/schema-11"
echo drill >"$root/etc/hostname"

log "booting the container"
systemd-nspawn -D "$root" --boot --register=no --keep-unit --private-network \
    --console=read-only >"$work/console" 2>&1 &
nspawn=$!
init=""
for _ in $(seq 100); do
    # The container's PID 1 is nspawn's child.
    init=$(pgrep -P "$nspawn" -x systemd || true)
    [ -n "$init" ] && break
    sleep 0.1
done
[ -n "$init" ] || { cat "$work/console"; die "no systemd in the container"; }
c() { nsenter -t "$init" -a -- "$@"; }
state=$(c systemctl is-system-running --wait || true)
log "booted ($state)"

log "install: dpkg -i"
c env DEBIAN_FRONTEND=noninteractive dpkg -i /root/dedupd.deb >"$work/dpkg-install" 2>&1 ||
    { cat "$work/dpkg-install"; die "dpkg -i"; }
c systemctl is-enabled dedupd >/dev/null || die "the unit is not enabled"
c systemctl is-active dedupd >/dev/null || { c journalctl -u dedupd --no-pager | tail -20; die "the unit is not started"; }
mode=$(c stat -c '%a %U' /etc/dedupd/credentials /etc/dedupd/credentials/api-tokens | tr '\n' ' ')
[ "$mode" = "700 root 600 root " ] || die "/etc/dedupd/credentials and its api-tokens are $mode, not 700 and 600 root's"
token=$(c cat /etc/dedupd/credentials/api-tokens)
[ "${#token}" -ge 32 ] || die "the API token is too short"

log "start: a source and an application; systemctl restart returns once ready"
# The README's first webhook, as written there: the settings' own
# [sources.sume] example uncommented (an edited conffile: an upgrade must
# keep it), its secrets root-only where it names them.
c sed -i '/^# \[sources.sume\]/,$ s/^# //' /etc/dedupd/dedupd.toml
SUME_SIGNING_SECRET=drill_secret_0123456789abcdef
echo "$SUME_SIGNING_SECRET" | c install -m 600 /dev/stdin /etc/dedupd/credentials/sume-secrets
echo "whsec_$(head -c 32 /dev/urandom | base64)" | c install -m 600 /dev/stdin /etc/dedupd/credentials/sume-destination
# The drill's watchdog: 5 s, not 30, so a frozen process is restarted soon.
c mkdir -p /etc/systemd/system/dedupd.service.d
c sh -c 'printf "[Service]\nWatchdogSec=5s\n" >/etc/systemd/system/dedupd.service.d/drill.conf'
c systemctl daemon-reload
c systemctl restart dedupd
# The application: it verifies with the staged destination secret, there
# once dedupd has started.
c systemd-run --unit=drill-app --property=Restart=always \
    /usr/bin/dedupd receive --config /etc/dedupd/dedupd.toml >/dev/null
[ "$(c systemctl show -P ActiveState dedupd)" = active ] || die "not active once systemctl restart returned"
c curl -fsS http://127.0.0.1:8080/readyz >/dev/null || die "/readyz does not answer once started"
api() { c curl -fsS -H "authorization: Bearer $token" "http://127.0.0.1:8080$1"; }

# trigger: posts one signed sample event; prints its id on success.
trigger() {
    local out
    out=$(c /usr/bin/dedupd trigger sume --config /etc/dedupd/dedupd.toml 2>/dev/null) || return 1
    printf '%s\n' "$out" | sed -n 's/^sume event \([^ ]*\).*/\1/p' | head -1
}
delivered() { c journalctl -u drill-app -o cat --no-pager | grep -c "$1" || true; }
first=$(trigger) || die "the first webhook was refused"
for _ in $(seq 100); do [ "$(delivered "$first")" -gt 0 ] && break; sleep 0.1; done
[ "$(delivered "$first")" -gt 0 ] || die "the webhook $first did not reach the application"

log "the journal: structured lines"
lines=$(c journalctl -u dedupd -o cat --no-pager)
printf '%s\n' "$lines" | grep "\"event_id\":\"$first\"" | has '"outcome":"accepted"' ||
    die "no structured line with the event id and its outcome: $(printf '%s' "$lines" | tail -5)"
printf '%s\n' "$lines" | grep "\"event_id\":\"$first\"" | has '"source":"sume"' ||
    die "no structured line with the source"
starts=$(c journalctl -u dedupd -o cat --no-pager | grep -c 'configuration good' || true)
[ "$starts" -ge 1 ] || die "ExecStartPre's check did not say its one line"

log "reload: a rotated secret and API token, a broken file, without a restart"
pid0=$(c systemctl show -P MainPID dedupd)
c journalctl -u dedupd -o cat --no-pager | has 'staged 3 credential(s)' ||
    die "the start did not stage the credentials"
c stat -c '%a %u' /run/dedupd/credentials/sume-secrets | has -x "400 $(c stat -c %u /run/dedupd)" ||
    die "the staged secret is not the service user's alone"
# The new secret first: dedupd trigger signs with a source's first one.
c sh -c 'printf "drill_rotated_0123456789abcdef\ndrill_secret_0123456789abcdef\n" >/etc/dedupd/credentials/sume-secrets'
c sh -c 'printf "drill-rotated-token-0123456789abcdef\n" >/etc/dedupd/credentials/api-tokens'
c systemctl reload dedupd || die "systemctl reload failed"
# ExecReload='s dedupd reload waited for the server's answer.
c journalctl -u dedupd -o cat --no-pager | has "reloaded: dedupd (pid $pid0)" ||
    die "dedupd reload did not wait for the server's answer"
for _ in $(seq 50); do
    c journalctl -u dedupd -o cat --no-pager | has 'configuration reloaded' && break
    sleep 0.1
done
c journalctl -u dedupd -o cat --no-pager | has 'configuration reloaded' || die "no 'configuration reloaded' line"
[ "$(c systemctl show -P MainPID dedupd)" = "$pid0" ] || die "the reload restarted the service"
rotated=$(trigger) || die "a webhook signed with the rotated secret was refused after the reload"
old_token=$(c curl -s -o /dev/null -w '%{http_code}' -H "authorization: Bearer $token" \
    "http://127.0.0.1:8080/v1/sources/sume/events/$rotated")
[ "$old_token" = 401 ] || die "the old API token got $old_token, not 401, after the reload"
token=drill-rotated-token-0123456789abcdef
api "/v1/sources/sume/events/$rotated" >/dev/null || die "the rotated API token is refused after the reload"
c cp /etc/dedupd/dedupd.toml /root/dedupd.toml.good
c sh -c 'printf "\n[sources.broken]\nscheme = \"sume\"\n" >>/etc/dedupd/dedupd.toml'
if c systemctl reload dedupd 2>/dev/null; then die "a broken file was reloaded"; fi
c journalctl -u dedupd -o cat --no-pager | has 'not reloaded: the configuration has errors' ||
    die "the refused reload said nothing in the journal"
[ "$(c systemctl show -P MainPID dedupd)" = "$pid0" ] || die "the refused reload restarted the service"
c cp /root/dedupd.toml.good /etc/dedupd/dedupd.toml
again=$(trigger) || die "not serving with the rotated secret after a refused reload"
for id in "$rotated" "$again"; do
    for _ in $(seq 100); do [ "$(delivered "$id")" -gt 0 ] && break; sleep 0.1; done
    [ "$(delivered "$id")" -gt 0 ] || die "$id, posted after the reload, was not delivered"
done

log "crash: SIGKILL under ingest load"
pid0=$(c systemctl show -P MainPID dedupd)
acked=()
for _ in $(seq 20); do
    if id=$(trigger); then acked+=("$id"); fi
done
# Killed with posts on their way; the load goes on through the restart
# (RestartSec=2s), until 20 more are answered.
posting=()
for _ in $(seq 5); do trigger >/dev/null & posting+=($!); done
c systemctl kill -s KILL dedupd
wait "${posting[@]}" || true
before=${#acked[@]}
deadline=$((SECONDS + 30))
while [ $((${#acked[@]} - before)) -lt 20 ] && [ $SECONDS -lt $deadline ]; do
    if id=$(trigger); then acked+=("$id"); else sleep 0.2; fi
done
pid1=$(c systemctl show -P MainPID dedupd)
[ "$pid1" != "$pid0" ] && [ "$pid1" != 0 ] || die "not restarted after SIGKILL"
[ "${#acked[@]}" -ge 40 ] || die "only ${#acked[@]} posts were answered 2xx around the kill"
for id in "${acked[@]}"; do
    for _ in $(seq 300); do [ "$(delivered "$id")" -gt 0 ] && break; sleep 0.1; done
    [ "$(delivered "$id")" -gt 0 ] || die "$id was answered 2xx and never delivered"
done
log "crash: ${#acked[@]} events answered 2xx, every one delivered"

log "watchdog: SIGSTOP"
# sh's own kill: a minimal system has no /bin/kill.
c sh -c "kill -STOP $pid1"
for _ in $(seq 200); do
    pid2=$(c systemctl show -P MainPID dedupd)
    [ "$pid2" != "$pid1" ] && [ "$pid2" != 0 ] && break
    sleep 0.1
done
[ "$pid2" != "$pid1" ] || die "not restarted by the watchdog within 20 s"
for _ in $(seq 50); do
    c journalctl -u dedupd -o cat --no-pager | has 'Watchdog timeout' && break
    sleep 0.1
done
c journalctl -u dedupd -o cat --no-pager | has 'Watchdog timeout' || die "no watchdog line in the journal"
# MainPID changes when the new process starts; it serves once READY=1.
for _ in $(seq 100); do
    [ "$(c systemctl show -P ActiveState dedupd)" = active ] && break
    sleep 0.1
done
after=$(trigger) || die "not serving after the watchdog restart"
for id in "${acked[@]}" "$after"; do
    for _ in $(seq 300); do [ "$(delivered "$id")" -gt 0 ] && break; sleep 0.1; done
    [ "$(delivered "$id")" -gt 0 ] || die "$id lost across the watchdog restart"
done

log "stop: systemctl stop during deliveries"
for _ in $(seq 10); do trigger >/dev/null || true; done
c systemctl stop dedupd
result=$(c systemctl show -P Result dedupd)
status=$(c systemctl show -P ExecMainStatus dedupd)
[ "$result" = success ] && [ "$status" = 0 ] || die "stop: Result=$result ExecMainStatus=$status"
c systemctl start dedupd

log "the sandbox: a dynamic user, nothing outside its state directory"
pid=$(c systemctl show -P MainPID dedupd)
uid=$(c awk '/^Uid:/ { print $2 }' "/proc/$pid/status")
[ "$uid" -ge 61184 ] && [ "$uid" -le 65519 ] || die "runs as uid $uid, not a dynamic user"
c test -d /home || c mkdir /home
c sh -c 'echo private >/home/secret'
# In the service's own mount namespace, as its user.
as_service() { c nsenter -t "$pid" -m -S "$uid" -G "$uid" -- "$@"; }
as_service sh -c 'echo x >/var/lib/dedupd/drill-probe' || die "cannot write its state directory"
if as_service sh -c 'echo x >/etc/dedupd/drill-probe' 2>/dev/null; then die "wrote /etc"; fi
if as_service sh -c 'echo x >/usr/drill-probe' 2>/dev/null; then die "wrote /usr"; fi
if as_service cat /home/secret 2>/dev/null; then die "read /home"; fi
as_service rm -f /var/lib/dedupd/drill-probe
# ProcSubset=pid hides /proc/meminfo from the service: the automatic
# key-memory cap must still follow the machine (once it was the fallback's
# 384 MiB on any machine), and never exceed half of it.
cap=$(c curl -fsS -H "authorization: Bearer $token" http://127.0.0.1:8080/metrics |
    awk '$1 == "dedupd_store_max_key_memory_bytes" { printf "%.0f", $2 }')
total=$(($(c awk '/^MemTotal:/ { print $2 }' /proc/meminfo) * 1024))
[ -n "$cap" ] || die "no dedupd_store_max_key_memory_bytes in /metrics"
[ "$cap" -le $((total / 2)) ] || die "the key-memory cap $cap is over half of $total bytes"
if [ "$total" -ge $((2 << 30)) ] && [ "$cap" -eq $(((1 << 29) - (128 << 20))) ]; then
    die "the key-memory cap is the fallback's 384 MiB on a machine of $total bytes"
fi

log "one CPU: SCHED_BATCH under the unit's system call filter"
# The unit with CPUAffinity=0, as on a 1-vCPU VM: dedupd schedules itself
# as SCHED_BATCH (the policy, field 41 of /proc/PID/stat: 3); with both
# CPUs it is left as SCHED_OTHER (0).
policy() { c sh -c "sed 's/.*) //' /proc/$(c systemctl show -P MainPID dedupd)/stat" | awk '{ print $39 }'; }
if [ "$(nproc)" -ge 2 ]; then
    [ "$(policy)" = 0 ] || die "with two CPUs the policy is $(policy), not SCHED_OTHER"
fi
c sh -c 'printf "[Service]\nCPUAffinity=0\n" >/etc/systemd/system/dedupd.service.d/one-cpu.conf'
c systemctl daemon-reload
c systemctl restart dedupd
[ "$(policy)" = 3 ] || { c journalctl -u dedupd -o cat --no-pager | tail -5; die "with one CPU the policy is $(policy), not SCHED_BATCH"; }
c curl -fsS http://127.0.0.1:8080/readyz >/dev/null || die "/readyz does not answer on one CPU"
c rm /etc/systemd/system/dedupd.service.d/one-cpu.conf
c systemctl daemon-reload
c systemctl restart dedupd

log "backup: dedupd-backup.service under systemd, then restored"
if c systemctl is-enabled dedupd-backup.timer >/dev/null 2>&1; then die "the backup timer was enabled unasked"; fi
claim() {
    c curl -fsS -X POST -H "authorization: Bearer $token" "http://127.0.0.1:8080/v1/claims/$1" |
        sed -n 's/.*"fence":\([0-9]*\).*/\1/p'
}
fence0=$(claim drill-before-backup) || die "a claim before the backup was refused"
[ -n "$fence0" ] || die "the claim before the backup has no fence"
c systemctl start dedupd-backup || { c journalctl -u dedupd-backup -o cat --no-pager | tail -20; die "dedupd-backup failed"; }
backup=$(c sh -c 'ls /var/backups/dedupd/dedupd-*.backup')
[ "$(printf '%s\n' "$backup" | wc -l)" = 1 ] || die "not one backup file: $backup"
[ "$(c stat -c '%a %U' "$backup")" = "600 root" ] || die "the backup is not 0600 root's"
c journalctl -u dedupd-backup -o cat --no-pager | has "^wrote $backup" || die "dedupd-backup did not say what it wrote"
c /usr/bin/dedupd verify "$backup" >/dev/null || die "the backup does not verify"
late=$(trigger) || die "a webhook after the backup was refused"
c systemctl stop dedupd
c /usr/bin/dedupd restore "$backup" --config /etc/dedupd/dedupd.toml --replace >"$work/restore" 2>&1 ||
    { cat "$work/restore"; die "dedupd restore"; }
c systemctl start dedupd || { c journalctl -u dedupd -o cat --no-pager | tail -20; die "does not start on the restored file"; }
api "/v1/sources/sume/events/$first" | has "\"event_id\":\"$first\"" || die "the event before the backup is not restored"
api /v1/claims/drill-before-backup | has '"state":"processing"' || die "the claim before the backup is not restored"
gone=$(c curl -s -o /dev/null -w '%{http_code}' -H "authorization: Bearer $token" \
    "http://127.0.0.1:8080/v1/sources/sume/events/$late")
[ "$gone" = 404 ] || die "the event after the backup got $gone, not 404, after the restore"
fence1=$(claim drill-after-restore) || die "a claim after the restore was refused"
[ "$fence1" -gt "$fence0" ] || die "a fence went backwards: $fence1 after $fence0"
c systemctl enable --now dedupd-backup.timer >/dev/null 2>&1 || die "cannot enable the backup timer"

log "upgrade: a higher version keeps the settings, restarts, serves the old data"
old=$(api "/v1/sources/sume/events/$first") || die "the event before the upgrade is not there"
pid=$(c systemctl show -P MainPID dedupd)
c env DEBIAN_FRONTEND=noninteractive dpkg -i --force-confold /root/dedupd-upgrade.deb >"$work/dpkg-upgrade" 2>&1 ||
    { cat "$work/dpkg-upgrade"; die "dpkg -i of the upgrade"; }
c grep -q '^\[sources.sume\]' /etc/dedupd/dedupd.toml || die "the edited settings were replaced"
c systemctl is-enabled dedupd-backup.timer >/dev/null || die "the upgrade disabled the backup timer"
pidu=$(c systemctl show -P MainPID dedupd)
[ "$pidu" != "$pid" ] || die "not restarted by the upgrade"
api "/v1/sources/sume/events/$first" | has "\"event_id\":\"$first\"" || die "the old data is not served after the upgrade"

log "upgrade: a data file of schema 11 is migrated"
c systemctl stop dedupd
# As an operator restores a file: the service's own owner (its dynamic
# user owns the directory; systemd does not chown what is in it).
c sh -c 'cd /var/lib/private/dedupd && rm -f dedupd.redb* &&
    cp /root/schema-11/dedupd.redb* . && chown --reference=. dedupd.redb*'
c systemctl start dedupd || { c journalctl -u dedupd -o cat --no-pager | tail -20; die "does not start on a schema 11 file"; }
api /v1/claims/job-done | has '"state":"done"' || die "the schema 11 file's claim is not there"
api /v1/sources/sume/events/ok-1 | has '"status":"delivered"' || die "the schema 11 file's event is not there"

log "remove keeps the data; purge removes it"
c env DEBIAN_FRONTEND=noninteractive dpkg -r dedupd >/dev/null 2>&1 || die "dpkg -r"
c test -e /var/lib/private/dedupd/dedupd.redb || die "remove took the data"
c test -e /etc/dedupd/credentials/api-tokens || die "remove took the API token"
if c systemctl is-active dedupd >/dev/null 2>&1; then die "still running after remove"; fi
c env DEBIAN_FRONTEND=noninteractive dpkg --purge dedupd >/dev/null 2>&1 || die "dpkg --purge"
if c test -e /var/lib/private/dedupd; then die "purge left the data"; fi
if c test -e /etc/dedupd/credentials; then die "purge left the credentials"; fi
if c test -e /etc/systemd/system/timers.target.wants/dedupd-backup.timer; then die "purge left the backup timer enabled"; fi
c test -e "$backup" || die "purge took the backups (they are the operator's)"

log "passed"
