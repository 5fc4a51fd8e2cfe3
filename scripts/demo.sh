#!/usr/bin/env bash
# `make demo-local` (`make demo` is the story on the test cluster: scripts/demo-cluster.sh).
# The Asya demo: a three-actor pipeline (validate -> split -> shout) on a real RabbitMQ, each
# actor a sidecar + runtime pair running as local processes, plus the x-sink and x-sump end
# actors. Sends a handful of envelopes (one fans out, one fails once and is retried, two fail
# for good) and prints where each ended with its payload. Stops everything it started.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/asya-rs/target}"

work="$(mktemp -d -t asya-demo.XXXXXX)"
pids=()
started_rabbit=""

cleanup() {
  local status=$?
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  if [ -n "$started_rabbit" ]; then
    echo "demo: stopping the RabbitMQ it started"
    tests/services/rabbitmq stop >/dev/null 2>&1 || true
  fi
  if [ $status -ne 0 ]; then
    echo "demo: failed; logs:" >&2
    tail -n 20 "$work"/*/*.log >&2 2>/dev/null || true
  fi
  rm -rf "$work"
  exit $status
}
trap cleanup EXIT INT TERM

if ! tests/services/rabbitmq status >/dev/null 2>&1; then
  echo "demo: starting RabbitMQ (tests/services/rabbitmq)"
  tests/services/rabbitmq start >/dev/null
  started_rabbit=1
fi

echo "demo: building the sidecar"
cargo build -q -p asya-sidecar
bin="$CARGO_TARGET_DIR/debug/asya-sidecar"
# What the injected init container does: put the runtime next to the user's code.
"$bin" install-runtime "$work/opt" >/dev/null

ns="demo-$(date +%s)"
results="$work/results.jsonl"
: > "$results"
export ASYA_TRANSPORT=rabbitmq
export ASYA_RABBITMQ_URL="${ASYA_RABBITMQ_URL:-amqp://guest:guest@127.0.0.1:5672/%2f}"
export ASYA_NAMESPACE="$ns"
export ASYA_QUEUE_AUTO_CREATE=true
export ASYA_LOG_FORMAT=text

port=18480
# start_actor NAME HANDLER MODE [VAR=VALUE...]: one runtime + one sidecar, as in a pod.
start_actor() {
  local name=$1 handler=$2 mode=$3; shift 3
  local dir="$work/$name"
  mkdir -p "$dir"
  port=$((port + 1))
  (cd deploy/examples/handlers && exec env ASYA_HANDLER="$handler" ASYA_HANDLER_MODE="$mode" \
      ASYA_SOCKET_DIR="$dir" ASYA_DEMO_RESULTS="$results" ASYA_DEMO_END="$name" "$@" \
      python3 "$work/opt/asya_runtime.py") 2>"$dir/runtime.log" &
  pids+=($!)
  env ASYA_ACTOR_NAME="$name" ASYA_HANDLER_MODE="$mode" ASYA_SOCKET_DIR="$dir" \
      ASYA_METRICS_ADDR="127.0.0.1:$port" "$@" "$bin" 2>"$dir/sidecar.log" &
  pids+=($!)
  for _ in $(seq 300); do
    curl -fs "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && { echo "demo: actor $name ready"; return 0; }
    sleep 0.1
  done
  echo "demo: actor $name did not become ready" >&2
  return 1
}

resiliency='{"policies":{"default":{"maxAttempts":3,"backoff":"constant","initialInterval":"1s","maxInterval":"1s"}},
             "rules":[{"match":"ContentPolicyViolation","action":"fail"}]}'
start_actor validate pipeline.Validator.check payload ASYA_RESILIENCY="$resiliency"
start_actor split pipeline.split payload
start_actor shout pipeline.shout payload
start_actor x-sink ends.record envelope
start_actor x-sump ends.record envelope

route='{"actors":["validate","split","shout"],"current":0}'
{
  echo "{\"id\":\"fanout\",\"route\":$route,\"headers\":{\"trace_id\":\"t-1\"},\"payload\":{\"text\":\"hello asya world\"}}"
  echo "{\"id\":\"retried\",\"route\":$route,\"headers\":{\"trace_id\":\"t-2\"},\"payload\":{\"text\":\"flaky once\",\"flaky\":true}}"
  echo "{\"id\":\"single\",\"route\":$route,\"headers\":{\"trace_id\":\"t-3\"},\"payload\":{\"text\":\"solo\"}}"
  echo "{\"id\":\"forbidden\",\"route\":$route,\"headers\":{\"trace_id\":\"t-4\"},\"payload\":{\"text\":\"a forbidden word\"}}"
  echo "{\"id\":\"invalid\",\"route\":$route,\"headers\":{\"trace_id\":\"t-5\"},\"payload\":{\"txt\":\"typo\"}}"
} > "$work/input.jsonl"
echo "demo: sending 5 envelopes to asya-$ns-validate"
"$bin" send "asya-$ns-validate" < "$work/input.jsonl"

# 3 + 2 + 1 words reach x-sink, two envelopes reach x-sump.
expected=8
for _ in $(seq 600); do
  [ "$(wc -l < "$results")" -ge "$expected" ] && break
  sleep 0.1
done

python3 - "$results" "$expected" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows.sort(key=lambda r: (r["end"], r["envelope"]["id"]))
print()
print("%-7s %-12s %-10s %s" % ("ENDED", "ID", "PARENT", "PAYLOAD / REASON"))
for r in rows:
    env = r["envelope"]
    err = env.get("headers", {}).get("x-asya-error")
    tail = json.dumps(env.get("payload"))
    if err:
        tail += "   <- %s: %s (%s)" % (err.get("type", err.get("error")), err.get("message", ""), err.get("reason"))
    attempts = env.get("headers", {}).get("x-asya-attempts")
    if attempts and not err:
        tail += "   (succeeded after %d failed attempt(s))" % len(attempts)
    print("%-7s %-12s %-10s %s" % (r["end"], env["id"], env.get("parent_id") or "-", tail))
print()
if len(rows) < int(sys.argv[2]):
    sys.exit("demo: only %d of %s envelopes arrived" % (len(rows), sys.argv[2]))
PY
echo "demo: done; stopping the actors"
