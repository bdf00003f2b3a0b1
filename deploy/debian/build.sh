#!/usr/bin/env bash
# Builds the Debian package: target/debian/dedupd_VERSION-1_ARCH.deb.
#
#   deploy/debian/build.sh [--deb-version VERSION]
#
# A release build, then the man pages and shell completions from the binary
# itself (`dedupd man`, `dedupd completions`), then `cargo deb --no-build`
# with [package.metadata.deb] of Cargo.toml. Needs cargo-deb
# (`cargo install cargo-deb --locked`); further arguments go to cargo deb.
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v cargo-deb >/dev/null 2>&1 || { echo "cargo-deb is missing: cargo install cargo-deb --locked" >&2; exit 1; }

cargo build --release --locked --bin dedupd
assets=target/deb-assets
rm -rf "$assets"
mkdir -p "$assets/man" "$assets/completions"
target/release/dedupd man --out "$assets/man" >/dev/null
# gzip -n: no name or time in the header, so the package is the same
# bytes whoever builds it.
gzip -n -9 "$assets"/man/*.1
target/release/dedupd completions bash >"$assets/completions/dedupd"
target/release/dedupd completions zsh >"$assets/completions/_dedupd"
target/release/dedupd completions fish >"$assets/completions/dedupd.fish"
cargo deb --no-build "$@"
