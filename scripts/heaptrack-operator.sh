#!/bin/bash
# The operator under heaptrack, as the scale bench's SCALE_OPERATOR_BIN (BENCHMARKS.md, "heap
# profile"). heaptrack hooks glibc's malloc, so the operator is built with it first:
#   RUSTFLAGS="--cfg tidepool_system_malloc" cargo build --release -p tidepool-operator \
#     --target-dir target/system-malloc
#   cp target/system-malloc/release/tidepool-operator /tmp/tidepool-operator-glibc
#   SCALE_OPERATOR_BIN=scripts/heaptrack-operator.sh cargo bench -p tidepool-tests --bench scale -- ...
# Each operator the bench starts writes $HEAPTRACK_DIR/operator-<pid>.zst (default /tmp). The
# bench stops the operator with SIGTERM, which this script passes on to the traced process
# (heaptrack runs it as a child), so that heaptrack finishes its file.
set -u
BIN=${HEAPTRACK_OPERATOR:-/tmp/tidepool-operator-glibc}
heaptrack -o "${HEAPTRACK_DIR:-/tmp}/operator-$$" "$BIN" "$@" &
tracer=$!
stop() {
  local name p a
  name=$(basename "$BIN" | cut -c1-15)
  for p in $(pgrep -x "$name"); do
    a=$p
    while [ -n "$a" ] && [ "$a" -gt 1 ]; do
      if [ "$a" = "$tracer" ]; then kill -TERM "$p"; fi
      a=$(ps -o ppid= -p "$a" | tr -d ' ')
    done
  done
  wait "$tracer"
}
trap stop TERM INT
wait "$tracer"
