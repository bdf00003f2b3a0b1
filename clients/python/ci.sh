#!/usr/bin/env bash
# The Python client's checks: ruff (lint and format), mypy --strict, a
# build with `python -m build`, `pip install ./clients/python` into a fresh
# virtualenv, then pytest against the real release binary on both backends
# (embedded redb, and Redis with a redis-server the fixtures start), the
# examples' tests included.
#
#   clients/python/ci.sh [PYTHON]
#
# PYTHON is a virtualenv's python to test in; without it, target/py-venv is
# made (or reused). The binary is $DEDUPD_BIN, else target/release/dedupd,
# built with --features redis. Needs python3 (with venv) and redis-server;
# installs the test dependencies from the package registry, at the versions
# of ci-constraints.txt (an existing virtualenv is moved to them), which the
# builds' isolated environments get too (PIP_CONSTRAINT). Those need Python
# 3.10 or later: with an older PYTHON, the newest versions it can run.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
pipq() { "$@" --quiet --disable-pip-version-check; }

# Makes a virtualenv at $1, installing Debian's python3-venv when it is missing.
make_venv() {
  if python3 -m venv "$1" >/dev/null 2>&1; then return 0; fi
  rm -rf "$1"
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "python3 -m venv fails and there is no apt-get: install Python's venv module" >&2
    exit 1
  fi
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends python3 python3-venv
  python3 -m venv "$1"
}

echo "== python client: the interpreter and the test dependencies"
python="${1:-}"
if [ -z "$python" ]; then
  venv="$repo/target/py-venv"
  [ -x "$venv/bin/python" ] || { rm -rf "$venv"; make_venv "$venv"; }
  python="$venv/bin/python"
fi
"$python" --version
# The pins for an interpreter (empty before 3.10, which they need).
pins() {
  if "$1" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
    echo "$here/ci-constraints.txt"
  else
    echo "$1 is older than Python 3.10: its packages are not pinned (ci-constraints.txt)" >&2
  fi
}
constraints="$(pins "$python")"
PIP_CONSTRAINT="$constraints" pipq "$python" -m pip install \
  httpx pytest anyio mypy ruff build standardwebhooks flask

export DEDUPD_BIN="${DEDUPD_BIN:-$repo/target/release/dedupd}"
if [ ! -x "$DEDUPD_BIN" ]; then
  echo "no dedupd binary at $DEDUPD_BIN: cargo build --release --features redis first" >&2
  exit 1
fi
command -v redis-server >/dev/null || { echo "redis-server is missing (apt-get install redis-server)" >&2; exit 1; }

cd "$here"
echo "== python client: ruff check"
"$python" -m ruff check .

echo "== python client: ruff format --check"
"$python" -m ruff format --check .

echo "== python client: mypy --strict (the package, and the receiver example)"
"$python" -m mypy --strict src/dedupd examples/receiver.py

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

echo "== python client: python -m build"
PIP_CONSTRAINT="$constraints" "$python" -m build --outdir "$tmp/dist" . >"$tmp/build.log" 2>&1 \
  || { cat "$tmp/build.log"; exit 1; }
ls "$tmp/dist"

echo "== python client: pip install ./clients/python into a fresh virtualenv"
make_venv "$tmp/fresh"
fresh_constraints="$(pins "$tmp/fresh/bin/python")"
(cd "$repo" && PIP_CONSTRAINT="$fresh_constraints" pipq "$tmp/fresh/bin/python" -m pip install ./clients/python)
"$tmp/fresh/bin/python" -c 'import dedupd, httpx; print("imported dedupd", dedupd.__version__, "from", dedupd.__file__)'

echo "== python client: the built wheel into the test virtualenv"
pipq "$python" -m pip install --force-reinstall --no-deps "$tmp"/dist/dedupd-*.whl

echo "== python client: pytest tests/ on both backends (redb, redis) against $DEDUPD_BIN"
DEDUPD_TEST_BACKENDS=redb,redis "$python" -m pytest -p no:cacheprovider tests

echo "== python client: the examples' tests (the article's worker, the Flask receiver)"
DEDUPD_TEST_BACKENDS=redb,redis "$python" -m pytest -p no:cacheprovider examples
