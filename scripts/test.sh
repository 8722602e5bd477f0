#!/usr/bin/env bash
# tidepool's test command (README.md): installs what the tests need on a fresh machine,
# then checks formatting and lints and runs every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "installing ${need_apt[*]} (Debian packages) ..."
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
command -v kubectl >/dev/null 2>&1 || echo "warning: kubectl not found; the kubectl tests will fail saying so" >&2

# A one-off build gains nothing from incremental state (1.4 GB of target/ otherwise).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

cargo fmt --all --check
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --workspace --all-features --locked 2>&1 | tee "$log"
# One closing line over every test binary (the last binary cargo runs is a doc-test
# harness with nothing in it, which would otherwise be the closing line).
awk '/^test result:/ { p += $4; f += $6; i += $8 }
     END { printf "tests: %d passed, %d failed, %d skipped\n", p, f, i }' "$log"
