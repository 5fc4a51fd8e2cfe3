#!/usr/bin/env bash
# asya-sidecar-bench with the cores split as in a cluster: the broker and the bench's load
# generator (publisher, x-sink consumer, the ceiling loop) on CPU 0, the actor (the sidecar and
# its Python runtime) on CPU 1. On two shared cores the unpinned ratio measures the machine's
# CPU (broker + load generator + sidecar + runtime), not whether the sidecar keeps up with the
# broker: docs/benchmarks.md § Sidecar, "The ratio on two cores".
#
#   scripts/bench-sidecar-pinned.sh rabbitmq [RUNS] [-- BENCH ARGS]
#   scripts/bench-sidecar-pinned.sh sqs [RUNS] [-- BENCH ARGS]
#
# Needs tests/services up (its RabbitMQ or ElasticMQ is pinned for the runs and given both
# cores back at the end) and a built bench: BENCH (default
# $CARGO_TARGET_DIR/release/asya-sidecar-bench, the sidecar next to it).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
transport="${1:?usage: $0 rabbitmq|sqs [RUNS] [-- BENCH ARGS]}"
shift
runs=5
if [[ $# -gt 0 && "$1" != "--" ]]; then runs="$1"; shift; fi
[[ "${1:-}" == "--" ]] && shift
bench="${BENCH:-${CARGO_TARGET_DIR:-$HOME/.cache/asya-rs/target}/release/asya-sidecar-bench}"
[[ -x "$bench" ]] || { echo "bench-sidecar-pinned: no bench at $bench (cargo build --release -p asya-sidecar --bins, or set BENCH)" >&2; exit 1; }
[[ "$(nproc)" -ge 2 ]] || { echo "bench-sidecar-pinned: needs two CPUs, this machine has $(nproc)" >&2; exit 1; }
# shellcheck source=tests/services/env
source "$root/tests/services/env"

case "$transport" in
  rabbitmq) server=(beam.smp); args=(--transport rabbitmq --rabbit-count 20000) ;;
  sqs) server=(java); args=(--transport sqs --sqs-count 5000 --latency-samples 100) ;;
  *) echo "bench-sidecar-pinned: transport is rabbitmq or sqs, not '$transport'" >&2; exit 2 ;;
esac
pids=$(pgrep -x "${server[0]}" || true)
[[ -n "$pids" ]] || { echo "bench-sidecar-pinned: ${server[0]} is not running (tests/services/up)" >&2; exit 1; }

pin_actor() {
  # The bench starts the sidecar and the runtime; move them (every thread) as they appear.
  while true; do
    for p in $(pgrep -x asya-sidecar) $(pgrep -f asya_runtime.py); do taskset -a -p -c 1 "$p" >/dev/null 2>&1 || true; done
    sleep 0.05
  done
}
watcher=""
restore() {
  [[ -n "$watcher" ]] && kill "$watcher" 2>/dev/null || true
  for p in $pids; do taskset -a -p -c 0-$(($(nproc) - 1)) "$p" >/dev/null 2>&1 || true; done
}
trap restore EXIT
for p in $pids; do taskset -a -p -c 0 "$p" >/dev/null; done
pin_actor &
watcher=$!
for i in $(seq "$runs"); do
  echo "=== pinned run $i of $runs, $(date -u +%T) UTC, load $(cut -d' ' -f1-3 /proc/loadavg)"
  taskset -c 0 "$bench" "${args[@]}" "$@"
done
