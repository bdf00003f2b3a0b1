#!/usr/bin/env bash
# Fails if an import runs back up across a layer that was once a cycle
# (arrows run one way: a module uses only those below it). error.rs
# answers for auth.rs's middleware, so it must not import auth (RetryAfter
# lives in domain/, below both); the CLI's shared modules and jobs.rs are
# below operator.rs, which hands jobs.rs the bulk form of `events
# redeliver|erase`.
set -euo pipefail
cd "$(dirname "$0")/.."
bad=0
# forbid FILE REGEX WHY: FILE must not match REGEX.
forbid() {
  if grep -nE "$2" "$1" >&2; then
    echo "$1 imports back up: $3" >&2
    bad=1
  fi
}
forbid src/error.rs 'crate::auth\b' "error.rs is below auth.rs"
for f in src/domain/*.rs; do
  forbid "$f" 'crate::(auth|error)\b' "domain/ is below auth.rs and error.rs"
done
forbid src/cli/jobs.rs 'super::operator\b' "jobs.rs is below operator.rs"
for f in src/cli/call.rs src/cli/client.rs src/cli/filter.rs src/cli/out.rs src/cli/table.rs; do
  forbid "$f" 'super::(operator|jobs)\b' "the CLI's shared modules are below the commands"
done
if [ "$bad" -ne 0 ]; then
  exit 1
fi
echo "layers: no import runs back up"
