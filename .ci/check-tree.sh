#!/usr/bin/env bash
# Fails if the tree tracks a data file or a log: a committed write-ahead log
# was once replayed into every fresh clone's new database. The golden files
# of tests/golden/ (the formats the store must keep opening) are kept as
# text (tests/golden/pack.py), so no exception is made for them.
set -euo pipefail
cd "$(dirname "$0")/.."
bad=$(git ls-files |
  grep -E '\.(redb|wal|wal2|keys|log)$|(^|/)log[0-9]*\.txt$|(^|/)nohup\.out$' || true)
if [ -n "$bad" ]; then
  echo "data or log files are tracked (remove them with git rm --cached; .gitignore covers them):" >&2
  echo "$bad" >&2
  exit 1
fi
# Nothing large either, but the console's screenshot.
big=$(git ls-files -z | grep -zEv '^docs/.*\.png$' |
  xargs -0 -r stat -c '%s %n' | awk '$1 > 512 * 1024 { print $2 " (" $1 " bytes)" }')
if [ -n "$big" ]; then
  echo "files over 512 KiB are tracked; is this a data file?" >&2
  echo "$big" >&2
  exit 1
fi
echo "tree: no data or log files tracked"
