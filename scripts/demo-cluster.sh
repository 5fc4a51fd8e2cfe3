#!/usr/bin/env bash
# `make demo`: the product's story on a real Kubernetes cluster on this machine.
#
#   1. the build and the cluster, exactly as `make test` brings them up: scripts/deps.sh, the
#      images from the `ci` cargo profile (`make images`), the test cluster with its node and
#      KEDA (`make services`: tests/cluster/up) and the Helm chart installed as pods
#      (tests/e2e/up). Cached: a second run takes seconds here;
#   2. the story, in a namespace of its own (asya-demo-HHMMSS): a Flavor, a pipeline of
#      AsyncActors (validate -> split -> shout, scaling from zero with KEDA) and the end actor
#      x-sink (x-sump stays a queue: failed envelopes wait there); an actor the webhook refuses
#      and one it accepts with a warning; envelopes sent (a fan-out, a retried one, one that a
#      too strict policy in validate's env fails); the pods as they appear; the results as they
#      reach x-sink and x-sump; `kubectl get asyas -o wide`; `asya sump list/show`, the policy
#      fixed, `asya sump redrive` and the redriven envelope in x-sink; `asya trace` of an
#      envelope (its spans in the test Jaeger: the chart traces the sidecars); a flow
#      (docs/flows.md's order review: `asya flow compile`, `kubectl apply -f DIR` in a namespace
#      of its own, three orders taking three paths, each one's path and decisions, `asya trace`);
#      the Actors dashboard's queries in the test Prometheus, and a picture of them (target/demo/);
#   3. the namespace and the flavor deleted. The cluster keeps running (tests/cluster/down
#      stops it).
#
# Environment: ASYA_DEMO_KEEP=1 keeps the namespace at the end; ASYA_DEMO_LOAD=N sends N more
# envelopes over two minutes before the metrics part (what docs/img/actors-dashboard.png
# shows: 300); ASYA_DEMO_SKIP_UP=1 skips
# part 1 when the cluster and the chart are known to be up (an earlier `make demo` or
# `make test`), e.g. to show the story alone; IMAGE_PROFILE (default ci) the cargo profile of
# the images. `make demo-local` is the same pipeline as local processes,
# without a cluster (scripts/demo.sh).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/asya-rs/target}"
image_profile="${IMAGE_PROFILE:-ci}"
# A namespace of its own per run (labelled asya.sh/demo; the next run removes what an
# interrupted one left). The provisioner skips re-applying the transport Secret it put in a
# namespace of the same name for 10 minutes (queue-provisioner: applied cache), so a namespace
# re-created under the same name would start its sidecars without credentials.
ns="asya-demo-$(date +%H%M%S)"
# The flow example in a namespace of its own (its own x-sink and x-sump queues).
flow_ns="$ns-flow"
flavor=asya-demo-on-test-node
image=localhost/asya-rs/asya-examples:dev
logs="$root/target/demo"
mkdir -p "$logs"
# The `asya` command line (cli/), built with the images.
asya_bin="$CARGO_TARGET_DIR/$image_profile/asya"
asya() { "$asya_bin" -n "$ns" --release-namespace asya-system "$@"; }
t_start=$SECONDS

# --- output -------------------------------------------------------------------------------
bold="" red="" plain=""
if [ -t 1 ]; then bold=$'\033[1m' red=$'\033[31m' plain=$'\033[0m'; fi
n_heading=0
heading() { n_heading=$((n_heading + 1)); printf '\n%s==> %d. %s%s\n' "$bold" "$n_heading" "$*" "$plain"; }
say() { echo "    $*"; }
die() { printf '\ndemo: %sFAILED%s: %s\n' "$red" "$plain" "$*" >&2; exit 1; }
mmss() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

# progress LOG: copies the step's output into LOG and, while the step runs for long, prints a
# line now and then with the time so far and what it is doing (its last line of output).
progress() {
  local log=$1 t0=$SECONDS next=$((SECONDS + 20)) last="" line rc
  : > "$log"
  while :; do
    if IFS= read -r -t 5 line; then
      printf '%s\n' "$line" >> "$log"
      [ -n "${line//[[:space:]]/}" ] && last="$line"
    else
      rc=$?
      [ $rc -gt 128 ] || break          # end of output (not a timeout)
      [ -z "$line" ] || printf '%s' "$line" >> "$log"   # a partial line so far
    fi
    if [ $SECONDS -ge $next ]; then
      last="${last#"${last%%[![:space:]]*}"}"
      say "... $(mmss $((SECONDS - t0))) so far: ${last:0:110}"
      next=$((SECONDS + 60))
    fi
  done
}

# step NAME EXPECTED CMD...: runs a build step quietly (output in target/demo/NAME.log) with
# progress lines; on failure prints the end of its log.
step() {
  local name=$1 expected=$2; shift 2
  local log="$logs/$name.log" t0=$SECONDS
  say "\$ $*    (first run: $expected; afterwards: seconds)"
  if ! "$@" 2>&1 < /dev/null | progress "$log"; then
    echo "---- last lines of $log:" >&2
    tail -n 40 "$log" >&2
    die "\`$*\` failed after $(mmss $((SECONDS - t0))) (whole log: $log)"
  fi
  say "done in $(mmss $((SECONDS - t0)))"
}

# --- 1. the build and the cluster -------------------------------------------------------------
cold=()
[ -x "$CARGO_TARGET_DIR/$image_profile/asya-sidecar" ] || cold+=("the Rust binaries and the images (15-40 min)")
cluster_cache="${ASYA_TEST_CLUSTER_CACHE:-$HOME/.cache/asya-rs/test-cluster}"
compgen -G "$cluster_cache/bin/asya-test-cluster-*" >/dev/null || cold+=("the Kubernetes binaries, helm and CoreDNS from their Go modules (15-30 min)")
compgen -G "$cluster_cache/keda-*/keda-adapter" >/dev/null || cold+=("KEDA from its Go module (15-60 min)")
echo "asya-rs demo: a pipeline of Python actors on a Kubernetes cluster built on this machine"
if [ ${#cold[@]} -gt 0 ]; then
  echo "First run on this machine: everything is built from source, which takes a long time"
  echo "on 2 cores (45-90 minutes in all; the steps print progress every minute):"
  printf '  - %s\n' "${cold[@]}"
  echo "Later runs reuse the caches (~/.cache/asya-rs, Go's caches) and take about a minute."
else
  echo "Build caches found: this run should take about a minute."
fi

if [ "${ASYA_DEMO_SKIP_UP:-}" != 1 ]; then
  heading "Dependencies (Debian and Python packages, Go tools)"
  step deps "a few minutes" ./scripts/deps.sh
  heading "Images: the Rust binaries (cargo profile $image_profile) and the OCI images"
  step images "15-40 min" make --no-print-directory images IMAGE_PROFILE="$image_profile"
  heading "The cluster: RabbitMQ, an API server, a node on containerd, CoreDNS and KEDA"
  # deps.sh has just run; tests/services/up need not run it again.
  export ASYA_SKIP_DEPS=1
  step cluster "30-90 min, KEDA the largest" make --no-print-directory services
  heading "The Helm chart: the admission webhook and the queue provisioner as pods"
  step chart "a minute" ./tests/e2e/up
else
  heading "ASYA_DEMO_SKIP_UP=1: using the cluster and the chart as they are"
fi
# shellcheck source=tests/cluster/env
source tests/cluster/env
[ -f "$KUBECONFIG" ] && kubectl get --raw /readyz >/dev/null 2>&1 \
  || die "the test cluster does not answer (make demo without ASYA_DEMO_SKIP_UP brings it up)"
[ "$(cat target/test-cluster/e2e/mode 2>/dev/null)" = pods ] \
  || die "the chart is not installed as pods (make demo without ASYA_DEMO_SKIP_UP installs it)"
kubectl get pods -n asya-system -o wide | sed 's/^/    /'

# The test Prometheus, scraping the sidecars (the chart PodMonitor's relabelling,
# tests/services/prometheus.yml) before any envelope is sent, so the run's metrics are there.
# Its Kubernetes discovery reads the cluster's credentials when it starts: a Prometheus started
# before the cluster made them (tests/services/up) discovers nothing and is restarted, once.
prometheus="${ASYA_TEST_PROMETHEUS_URL:-http://127.0.0.1:9090}"
prometheus_ok=""
discovers() {
  curl -fsS -m 5 "$prometheus/api/v1/targets?state=active" 2>/dev/null \
    | python3 -c 'import json,sys; t=json.load(sys.stdin)["data"]["activeTargets"]; sys.exit(not any(x["labels"].get("job")=="asya-control-plane" for x in t))'
}
if "$root/tests/services/prometheus" start >/dev/null 2>&1; then
  deadline=$((SECONDS + 30))
  until discovers || [ $SECONDS -ge $deadline ]; do sleep 1; done
  if ! discovers; then
    say "(the test Prometheus does not see the cluster: restarting it so it reads the cluster's credentials)"
    "$root/tests/services/prometheus" restart >/dev/null 2>&1 || true
    deadline=$((SECONDS + 30))
    until discovers || [ $SECONDS -ge $deadline ]; do sleep 1; done
  fi
  discovers && prometheus_ok=1
fi
[ -n "$prometheus_ok" ] || say "(tests/services/prometheus would not start or discover the cluster: no metrics part)"

# --- 2. the story ------------------------------------------------------------------------------
# Everything the story made goes at the end; on failure it stays for a look (the next run
# removes it first).
cleanup() {
  local status=$?
  if [ $status -ne 0 ] && kubectl get namespace "$ns" >/dev/null 2>&1; then
    {
      echo "---- what the cluster says (namespace $ns is kept for a look; the next run removes it):"
      kubectl get asyas -n "$ns" -o wide 2>&1 || true
      kubectl get pods -n "$ns" -o wide 2>&1 || true
      kubectl get events -n "$ns" --sort-by=.lastTimestamp 2>&1 | tail -n 20 || true
    } >&2
  fi
  exit $status
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# remove_demo NAMESPACE...: the actors first (the provisioner deletes their queues), then the
# namespaces and the flavor.
remove_demo() {
  local n
  for n in "$@"; do
    kubectl delete asyncactors --all -n "$n" --ignore-not-found --wait=true --timeout=120s >/dev/null 2>&1 || true
  done
  for n in "$@"; do
    kubectl delete namespace "$n" --ignore-not-found --wait=true --timeout=180s >/dev/null \
      || die "namespace $n is still terminating after 3 minutes (kubectl get all,asyas -n $n)"
  done
  kubectl delete flavor "$flavor" --ignore-not-found >/dev/null || die "could not delete flavor $flavor"
}
left="$(kubectl get namespaces -l asya.sh/demo=true -o jsonpath='{.items[*].metadata.name}')"
if [ -n "$left" ]; then
  echo; say "(removing what an earlier run left: namespace(s) $left)"
  # shellcheck disable=SC2086
  remove_demo $left
fi

t_story=$SECONDS
heading "A namespace ($ns), and a Flavor: what the platform team sets once for many actors"
say "This flavor lets pods run on the test node (it is tainted) and scales from zero fast."
cat > "$logs/flavor.yaml" <<YAML
apiVersion: v1
kind: Namespace
metadata:
  name: $ns
  labels: {asya.sh/demo: "true"}
---
apiVersion: asya.sh/v1alpha1
kind: Flavor
metadata:
  name: $flavor
spec:
  tolerations:
  - {key: asya.sh/test-node, operator: Exists, effect: NoSchedule}
  scaling:
    enabled: true
    minReplicaCount: 0      # no pods while the queue is empty
    maxReplicaCount: 2
    queueLength: 5
    pollingInterval: 2      # KEDA looks at the queue every 2 seconds
    cooldownPeriod: 30      # and scales back to zero 30 seconds after the last envelope
YAML
sed '1,/^---$/d' "$logs/flavor.yaml" | sed 's/^/    | /'
kubectl apply -f "$logs/flavor.yaml" | sed 's/^/    /'

heading "The pipeline: validate -> split -> shout, and the end actor x-sink"
say "Plain Python handlers (deploy/examples/handlers), image $image."
say "validate retries transient errors and sends a content-policy violation straight to x-sump;"
say "its policy (the words it blocks) is in its env. x-sink prints what reaches it; x-sump is left"
say "a plain queue, where failed envelopes wait for \`asya sump\`."
cat > "$logs/actors.yaml" <<YAML
apiVersion: asya.sh/v1alpha1
kind: AsyncActor
metadata: {name: validate, namespace: $ns}
spec:
  transport: rabbitmq
  image: $image
  handler: pipeline.Validator.check
  flavors: [$flavor]
  env:
  - {name: ASYA_DEMO_BLOCKED_WORDS, value: "forbidden,spam"}
  resiliency:
    policies:
      default: {maxAttempts: 3, backoff: constant, initialInterval: 1s, maxInterval: 1s}
    rules:
    - {match: ContentPolicyViolation, action: fail}
---
apiVersion: asya.sh/v1alpha1
kind: AsyncActor
metadata: {name: split, namespace: $ns}
spec:
  transport: rabbitmq
  image: $image
  handler: pipeline.split     # returns a list: one envelope per word (fan-out)
  flavors: [$flavor]
---
apiVersion: asya.sh/v1alpha1
kind: AsyncActor
metadata: {name: x-sink, namespace: $ns}
spec:
  transport: rabbitmq
  image: $image
  handler: ends.record
  handlerMode: envelope
  flavors: [$flavor]
  scaling: {enabled: false}   # always on: one pod
  replicas: 1
  env:
  - {name: ASYA_DEMO_RESULTS, value: /dev/stdout}
  - {name: ASYA_DEMO_END, value: x-sink}
YAML
sed -n '1,/^---/p' "$logs/actors.yaml" | sed '$d' | sed 's/^/    | /'
say "| ... (split, x-sink: $logs/actors.yaml)"
kubectl apply -f "$logs/actors.yaml" 2>&1 | sed 's/^/    /'

heading "A flow: the order review of docs/flows.md, compiled to AsyncActors (namespace $flow_ns)"
say "One Python function (deploy/examples/flows/order_review.py): its awaits are actor calls; the"
say "branches, the retry loop, the except paths between them run in the sidecars, without hops."
say "\$ asya flow compile deploy/examples/flows/order_review.py -o $logs/order-review --module orders --image $image"
rm -rf "$logs/order-review"
"$asya_bin" flow compile deploy/examples/flows/order_review.py -o "$logs/order-review" --module orders \
  --image "$image" 2>&1 | sed 's/^/    /' || die "asya flow compile failed"
# What a user adds for this cluster: the transport, the test node, one pod each (the pods start
# now, while the pipeline's story goes on; the flow's envelopes come after asya trace).
python3 - "$logs/order-review" <<'PY'
import pathlib, sys, yaml
for f in pathlib.Path(sys.argv[1]).glob("actor-*.yaml"):
    doc = yaml.safe_load(f.read_text())
    doc["spec"].update({"transport": "rabbitmq", "scaling": {"enabled": False}, "replicas": 1,
                        "tolerations": [{"key": "asya.sh/test-node", "operator": "Exists", "effect": "NoSchedule"}]})
    f.write_text(yaml.safe_dump(doc))
PY
kubectl create namespace "$flow_ns" >/dev/null && kubectl label namespace "$flow_ns" asya.sh/demo=true >/dev/null
say "\$ kubectl apply -n $flow_ns -f $logs/order-review"
kubectl apply -n "$flow_ns" -f "$logs/order-review" 2>&1 | sed 's/^/    /'

heading "The third actor, written with the older field names: accepted, with a warning"
cat > "$logs/shout.yaml" <<YAML
apiVersion: asya.sh/v1alpha1
kind: AsyncActor
metadata: {name: shout, namespace: $ns}
spec:
  transport: rabbitmq
  image: $image
  handler: pipeline.shout
  flavors: [$flavor]
  scaling:
    minReplicas: 0            # the seed guides' alias of minReplicaCount
    maxReplicas: 2
YAML
sed 's/^/    | /' "$logs/shout.yaml"
out="$(kubectl apply -f "$logs/shout.yaml" 2>&1)" || die "shout was refused: $out"
sed 's/^/    /' <<<"$out"
grep -q '^Warning: ' <<<"$out" || die "shout was accepted without the alias warning"
say "stored in the canonical form: spec.scaling = $(kubectl get asya shout -n "$ns" -o jsonpath='{.spec.scaling}')"

heading "An actor with a mistake: the admission webhook refuses it, naming the field and the rule"
cat > "$logs/refused.yaml" <<YAML
apiVersion: asya.sh/v1alpha1
kind: AsyncActor
metadata: {name: translate, namespace: $ns}
spec:
  transport: rabbitmq
  image: $image
  handler: "pipeline:translate"   # module:function, as gunicorn writes it
  flavors: [$flavor]
  scaling: {minReplicaCount: 3, maxReplicaCount: 1}
YAML
sed 's/^/    | /' "$logs/refused.yaml"
if out="$(kubectl apply -f "$logs/refused.yaml" 2>&1)"; then
  kubectl delete -f "$logs/refused.yaml" --ignore-not-found >/dev/null 2>&1 || true
  die "the webhook accepted an invalid actor: $out"
fi
say "kubectl apply says:"
sed 's/^/    ! /' <<<"$out"

heading "KEDA takes over: the pipeline's actors wait at zero pods, the end actor runs"
# Napping: KEDA holds the Deployment at zero and no pod is left. An error phase that lasts is
# reported at once, with the actor's status message.
deadline=$((SECONDS + 240))
declare -A failing_since=()
while :; do
  waiting=() n=0
  while read -r a phase message; do
    n=$((n + 1))
    want=Napping
    case "$a" in x-sink) want=Running ;; esac
    [ "$phase" = "$want" ] && { unset "failing_since[$a]"; continue; }
    waiting+=("$a:${phase:-none}")
    case "$phase" in
      RuntimeError|SidecarError|ImagePullError|TransportError|Degraded)
        : "${failing_since[$a]:=$SECONDS}"
        [ $((SECONDS - failing_since[$a])) -lt 20 ] \
          || die "actor $a is in phase $phase: $message (kubectl describe asya $a -n $ns; kubectl get events -n $ns)" ;;
      *) unset "failing_since[$a]" ;;
    esac
  done < <(kubectl get asyas -n "$ns" -o jsonpath='{range .items[*]}{.metadata.name} {.status.phase} {.status.message}{"\n"}{end}')
  [ ${#waiting[@]} -gt 0 ] || [ $n -ne 4 ] || break
  [ $SECONDS -lt $deadline ] || die "after 4 minutes, not yet at rest: ${waiting[*]}"
  sleep 1
done
kubectl get asyas -n "$ns" | sed 's/^/    /'
echo
kubectl get pods -n "$ns" | sed 's/^/    /'

heading "Envelopes in, pods up from zero, results out"
say "Sending 3 envelopes to queue asya-$ns-validate (RabbitMQ), route validate -> split -> shout:"
say "  hello      'hello asya world'   split fans it out: three words reach x-sink"
say "  flaky      'flaky once'          fails once (UpstreamBusy), retried after 1s, then succeeds"
say "  forbidden  'a forbidden word'    ContentPolicyViolation (validate's policy): straight to x-sump"
say "Then, as they happen: the pods KEDA starts (pods), what reaches x-sink (its actor's log) and"
say "x-sump (\`asya sump list\`, which browses the queue and leaves every message in place)."
echo
python3 - "$ns" "$ASYA_TEST_RABBITMQ_MANAGEMENT_URL" "$asya_bin" <<'PY'
import base64, json, queue, subprocess, sys, threading, time, urllib.request, uuid

ns, mgmt, asya = sys.argv[1], sys.argv[2], sys.argv[3]
trace = uuid.uuid4().hex[:12]
expected = {"x-sink": {"hello", "hello-1", "hello-2", "flaky", "flaky-1"}, "x-sump": {"forbidden"}}
events = queue.Queue()
procs = []


def follow(tag, cmd):
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    procs.append(p)
    def pump():
        for line in p.stdout:
            events.put((tag, line.rstrip("\n")))
    threading.Thread(target=pump, daemon=True).start()


def publish(envelope):
    req = urllib.request.Request(
        f"{mgmt}/api/exchanges/%2F/asya/publish", method="POST",
        data=json.dumps({"properties": {"delivery_mode": 2, "content_type": "application/json"},
                         "routing_key": f"asya-{ns}-validate", "payload": json.dumps(envelope),
                         "payload_encoding": "string"}).encode(),
        headers={"Content-Type": "application/json",
                 "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
    with urllib.request.urlopen(req, timeout=10) as r:
        if not json.load(r).get("routed"):
            sys.exit(f"demo: RabbitMQ routed nothing to asya-{ns}-validate")


def wake(actors):
    """Route-aware wake-up (docs/DESIGN.md §6.1): a message into each actor's wake queue, so
    KEDA starts the whole pipeline at once instead of one hop at a time. Best effort."""
    for a in actors:
        req = urllib.request.Request(
            f"{mgmt}/api/exchanges/%2F/asya/publish", method="POST",
            data=json.dumps({"properties": {}, "routing_key": f"asya-{ns}-{a}_wake",
                             "payload": json.dumps({"wake": True, "from": "demo"}),
                             "payload_encoding": "string"}).encode(),
            headers={"Content-Type": "application/json",
                     "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
        try:
            urllib.request.urlopen(req, timeout=10).close()
        except OSError as e:
            print(f"    (wake {a}: {e})", flush=True)


def watch_sump():
    """x-sump as `asya sump list` sees it, every 2 s: each new envelope once."""
    listed = set()
    while True:
        out = subprocess.run([asya, "-n", ns, "--release-namespace", "asya-system", "sump", "list", "-o", "json"],
                             capture_output=True, text=True)
        if out.returncode == 0:
            for e in json.loads(out.stdout)["envelopes"]:
                if e["id"] not in listed:
                    listed.add(e["id"])
                    events.put(("x-sump", e))
        time.sleep(2)


follow("pods", ["kubectl", "get", "pods", "-n", ns, "--watch", "-l", "asya.sh/actor in (validate,split,shout)"])
follow("x-sink", ["kubectl", "logs", "-f", "-n", ns, "-l", "asya.sh/actor=x-sink", "-c", "asya-runtime", "--tail=-1"])
threading.Thread(target=watch_sump, daemon=True).start()
time.sleep(1)  # the followers attached

route = {"actors": ["validate", "split", "shout"], "current": 0}
t0 = time.monotonic()
wake(route["actors"])
for id_, payload in [("hello", {"text": "hello asya world"}), ("flaky", {"text": "flaky once", "flaky": True}),
                     ("forbidden", {"text": "a forbidden word"})]:
    publish({"id": id_, "route": route, "headers": {"trace_id": trace}, "payload": payload})
print(f"    [  0.0s] sent     hello, flaky, forbidden (trace_id {trace})", flush=True)

seen = {"x-sink": set(), "x-sump": set()}
last_pod_line = {}
deadline = t0 + 300
try:
    while any(expected[e] - seen[e] for e in expected):
        try:
            tag, line = events.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            missing = {e: sorted(expected[e] - seen[e]) for e in expected if expected[e] - seen[e]}
            sys.exit(f"demo: after 5 minutes, not yet arrived: {missing}")
        stamp = f"[{time.monotonic() - t0:5.1f}s]"
        if tag == "pods":
            # kubectl repeats a pod's line for changes it does not show (AGE aside): once is enough.
            cols = line.split()
            key = tuple(cols[:3])
            if last_pod_line.get(cols[0] if cols else "") == key:
                continue
            if cols:
                last_pod_line[cols[0]] = key
            print(f"    {stamp} pods     {line}", flush=True)
            continue
        if tag == "x-sump":
            seen[tag].add(line["id"])
            what = f"{line.get('type') or '?'}: {line.get('message') or ''}  [{line.get('reason') or ''}]"
            print(f"    {stamp} {tag:8} {line['id']:10}{'':14} {what}", flush=True)
            continue
        try:
            rec = json.loads(line)
            env = rec["envelope"]
        except (ValueError, KeyError, TypeError):
            continue  # the runtime's own log lines
        if env.get("headers", {}).get("trace_id") != trace:
            continue  # left in an end queue by an earlier run
        seen[tag].add(env["id"])
        err = env.get("headers", {}).get("x-asya-error")
        parent = f" (from {env['parent_id']})" if env.get("parent_id") else ""
        if err:
            what = f"{err.get('type', '?')}: {err.get('message', '')}  [{err.get('reason', '')}]"
        else:
            what = json.dumps(env.get("payload"))
            attempts = env.get("headers", {}).get("x-asya-attempts")
            if attempts:
                what += f"  (after {len(attempts)} failed attempt(s))"
        print(f"    {stamp} {tag:8} {env['id']:10}{parent:14} {what}", flush=True)
    print(f"    all {sum(map(len, expected.values()))} results in {time.monotonic() - t0:.1f}s "
          f"({len(seen['x-sink'])} in x-sink, {len(seen['x-sump'])} in x-sump)")
finally:
    for p in procs:
        p.terminate()
PY

heading "kubectl get asyas -o wide"
# The status follows the pods within seconds (the provisioner watches them).
deadline=$((SECONDS + 20))
until [ "$(kubectl get asyas -n "$ns" -o jsonpath='{.items[*].status.phase}')" = "Running Running Running Running Running" ] \
  || [ $SECONDS -ge $deadline ]; do sleep 1; done
# QUEUED and PROCESSING are the provisioner's last look at the broker: every 15-20 s while a
# queue has messages (once a minute when idle). All results are in: wait for the look that
# sees the queues empty, so the table tells the truth.
say "(waiting for the provisioner's next look at the queues: every 15-20 s while they have messages)"
deadline=$((SECONDS + 40))
until [ -z "$(kubectl get asyas -n "$ns" -o jsonpath='{.items[*].status.queuedMessages}' | tr -d ' 0')" ] \
  || [ $SECONDS -ge $deadline ]; do sleep 1; done
kubectl get asyas -n "$ns" -o wide | sed 's/^/    /'
say "(QUEUED and PROCESSING: the provisioner's last look at the broker, every 15-20 s while a"
say " queue has messages, once a minute when idle; KEDA reads the queues itself to scale.)"
say "(with no more envelopes, KEDA scales validate, split and shout back to zero after the 30s cooldown)"

heading "x-sump: the failed envelope, listed without taking it off the queue"
say "\$ asya -n $ns sump list"
asya sump list 2>&1 | sed 's/^/    /'
echo
say "\$ asya -n $ns sump show forbidden"
asya sump show forbidden 2>&1 | sed 's/^/    /'

heading "The cause fixed, the failed envelope redriven to where it failed"
say "validate's policy blocked 'forbidden' by mistake: from now on it blocks spam only."
say "\$ kubectl patch asyncactor validate --type merge -p '{\"spec\":{\"env\":[{\"name\":\"ASYA_DEMO_BLOCKED_WORDS\",\"value\":\"spam\"}]}}'"
kubectl patch asyncactor validate -n "$ns" --type merge \
  -p '{"spec":{"env":[{"name":"ASYA_DEMO_BLOCKED_WORDS","value":"spam"}]}}' | sed 's/^/    /'
# The provisioner puts the env in the Deployment; a pod still running the old policy goes
# (rollout status waits for that; at zero pods KEDA starts a new one with the fix).
blocked_in_deployment() {
  kubectl get deployment validate -n "$ns" -o json | python3 -c '
import json, sys
d = json.load(sys.stdin)
print(*[e.get("value", "") for c in d["spec"]["template"]["spec"]["containers"] for e in c.get("env", [])
        if e["name"] == "ASYA_DEMO_BLOCKED_WORDS"])'
}
deadline=$((SECONDS + 60))
until [ "$(blocked_in_deployment)" = spam ]; do
  [ $SECONDS -lt $deadline ] || die "the provisioner did not put the fixed policy in Deployment validate within 60s"
  sleep 1
done
kubectl rollout status deployment/validate -n "$ns" --timeout=180s >/dev/null \
  || die "validate's pods did not roll to the fixed policy within 3 minutes"
say "(the provisioner updated Deployment validate; no pod runs the old policy any more)"
echo
say "\$ asya -n $ns sump redrive --error ContentPolicyViolation"
asya sump redrive --error ContentPolicyViolation 2>&1 | sed 's/^/    /' \
  || die "asya sump redrive failed"
say "Sent back to validate with its route and id, its attempts reset; x-sump no longer holds it:"
say "\$ asya -n $ns sump list"
asya sump list 2>&1 | sed 's/^/    /'
say "Waiting for it in x-sink (KEDA starts validate, split and shout again from zero):"
python3 - "$ns" <<'PY' || die "the redriven envelope did not reach x-sink"
import json, subprocess, sys, time

ns = sys.argv[1]
want, seen, t0 = {"forbidden", "forbidden-1", "forbidden-2"}, set(), time.monotonic()
while want - seen:
    if time.monotonic() - t0 > 240:
        sys.exit(f"demo: after 4 minutes, not in x-sink: {sorted(want - seen)}")
    out = subprocess.run(["kubectl", "logs", "-n", ns, "-l", "asya.sh/actor=x-sink", "-c", "asya-runtime",
                          "--tail=-1"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        try:
            env = json.loads(line)["envelope"]
        except (ValueError, KeyError, TypeError):
            continue
        redriven = env.get("headers", {}).get("x-asya-redriven")
        if env.get("id") in want - seen and redriven:
            seen.add(env["id"])
            print(f"    [{time.monotonic() - t0:5.1f}s] x-sink   {env['id']:12} {json.dumps(env.get('payload'))}"
                  f"  (redriven {redriven.get('count')}x)", flush=True)
    time.sleep(1)
PY

heading "One envelope's trace: asya trace hello"
say "The chart gives every sidecar OTEL_* variables (tracing.enabled, otlpEndpoint: the test"
say "Jaeger); each hop records process / runtime call / send spans in the envelope's trace."
say "\$ asya -n $ns trace hello"
asya trace hello 2>&1 | sed 's/^/    /' || say "(asya trace failed: see above)"
say "(the same trace in Jaeger's API: http://127.0.0.1:16686/api/traces/<trace id>)"

heading "The flow: three orders, three paths"
# Their pods started with the pipeline's story: by now they are usually up.
deadline=$((SECONDS + 180))
for a in validate charge express-ship standard-ship notify; do
  until [ "$(kubectl get pods -n "$flow_ns" -l "asya.sh/actor=$a" \
      -o jsonpath='{.items[*].status.conditions[?(@.type=="Ready")].status}')" = True ]; do
    [ $SECONDS -lt $deadline ] || die "the flow's actor $a has no ready pod after 3 minutes (kubectl get pods -n $flow_ns)"
    sleep 1
  done
done
say "Sent to the flow's entry queue asya-$flow_ns-validate, plain envelopes (route: validate):"
say "  big       items 60 + 50           express shipping"
say "  once      card declined once, US  PaymentDeclined caught by 'except PaymentError', charged again"
say "  declined  card always declined    three attempts, then 'raise': x-sump with charge's own error"
python3 - "$flow_ns" "$ASYA_TEST_RABBITMQ_MANAGEMENT_URL" <<'PY' || die "the flow's envelopes did not all arrive"
import base64, json, sys, time, urllib.request

ns, mgmt = sys.argv[1], sys.argv[2]
auth = {"Content-Type": "application/json", "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()}


def post(path, body):
    req = urllib.request.Request(f"{mgmt}/api/{path}", data=json.dumps(body).encode(), method="POST", headers=auth)
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)


orders = {"big": {"items": [{"price": 60}, {"price": 50}]},
          "once": {"items": [{"price": 5}], "card": "declined-once", "country": "US"},
          "declined": {"items": [{"price": 5}], "card": "declined"}}
t0 = time.monotonic()
for id_, payload in orders.items():
    env = {"id": id_, "route": {"actors": ["validate"], "current": 0}, "payload": payload}
    if not post("exchanges/%2F/asya/publish", {"properties": {"delivery_mode": 2}, "routing_key": f"asya-{ns}-validate",
                                                "payload": json.dumps(env), "payload_encoding": "string"})["routed"]:
        sys.exit(f"demo: RabbitMQ routed nothing to asya-{ns}-validate")
seen = {}
while len(seen) < len(orders):
    if time.monotonic() - t0 > 120:
        sys.exit(f"demo: after 2 minutes, not yet in x-sink or x-sump: {sorted(set(orders) - set(seen))}")
    for end in ("x-sink", "x-sump"):
        # Looked at and put back: `asya trace` below finds them there.
        for m in post(f"queues/%2F/asya-{ns}-{end}/get", {"count": 10, "ackmode": "ack_requeue_true",
                                                          "encoding": "auto"}):
            env = json.loads(m["payload"])
            if env["id"] in orders and env["id"] not in seen:
                seen[env["id"]] = (end, env)
    time.sleep(0.5)
for id_ in orders:
    end, env = seen[id_]
    print(f"    {end:8} {id_:9} path: {' -> '.join(env['route']['actors'])}")
    print(f"    {'':18} decisions: {', '.join((env.get('flow') or {}).get('trail') or []) or '(none)'}")
    if end == "x-sink":
        p = env["payload"]
        print(f"    {'':18} status={p['status']} attempt={p['attempt']} total={p['total']} shipping={p['shipping']}")
    else:
        e = env["headers"]["x-asya-error"]
        print(f"    {'':18} {e['type']}: {e['message']}  [{e['reason']}]")
print(f"    all three in {time.monotonic() - t0:.1f}s (decisions: source line and what it chose)")
PY
# The sidecars export their spans every 5 s: wait (at most 20 s) for the five hops of "once"
# in the trace backend, where each hop carries the decisions its sidecar took.
flow_trace() { "$asya_bin" -n "$flow_ns" --release-namespace asya-system trace once "$@"; }
deadline=$((SECONDS + 20))
until flow_trace -o json 2>/dev/null | python3 -c 'import json,sys; t=json.load(sys.stdin); sys.exit(not ("trace backend" in t["source"] and len(t["hops"]) >= 5))'; do
  [ $SECONDS -lt $deadline ] || break
  sleep 1
done
say "\$ asya -n $flow_ns trace once    (each hop with the decisions its sidecar took after the handler)"
flow_trace 2>&1 | sed 's/^/    /' || say "(asya trace failed: see above)"

if [ "${ASYA_DEMO_LOAD:-0}" -gt 0 ]; then
  heading "Load: ${ASYA_DEMO_LOAD} more envelopes over two minutes (ASYA_DEMO_LOAD)"
  say "1 to 5 words each; one in ten flaky (retried), one in ten with 'spam' (x-sump). KEDA scales up."
  python3 - "$ns" "$ASYA_TEST_RABBITMQ_MANAGEMENT_URL" "$ASYA_DEMO_LOAD" <<'PY' || die "sending the load failed"
import base64, json, random, sys, time, urllib.request

ns, mgmt, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
auth = "Basic " + base64.b64encode(b"guest:guest").decode()
words = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()
rng = random.Random(25)
t0 = time.monotonic()
for i in range(n):
    text = " ".join(rng.choice(words) for _ in range(rng.randint(1, 5)))
    kind = rng.random()
    payload = {"text": text + (" spam" if kind < 0.1 else ""), **({"flaky": True} if 0.1 <= kind < 0.2 else {})}
    env = {"id": f"load-{i}", "route": {"actors": ["validate", "split", "shout"], "current": 0},
           "headers": {}, "payload": payload}
    body = json.dumps({"properties": {"delivery_mode": 2}, "routing_key": f"asya-{ns}-validate",
                       "payload": json.dumps(env), "payload_encoding": "string"}).encode()
    req = urllib.request.Request(f"{mgmt}/api/exchanges/%2F/asya/publish", data=body, method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": auth})
    with urllib.request.urlopen(req, timeout=10) as r:
        if not json.load(r).get("routed"):
            sys.exit(f"demo: RabbitMQ routed nothing to asya-{ns}-validate")
    # Evenly over 120 s: a rate the dashboard's 1m windows show as a plateau.
    time.sleep(max(0.0, t0 + 120 * (i + 1) / n - time.monotonic()))
print(f"    sent {n} in {time.monotonic() - t0:.0f}s")
PY
  say "(waiting for the queues to drain)"
  deadline=$((SECONDS + 300))
  until [ -z "$(asya queues -o json 2>/dev/null | python3 -c 'import json,sys; print(*[r["actor"] for r in json.load(sys.stdin) if r.get("queued")])')" ]; do
    [ $SECONDS -lt $deadline ] || die "the pipeline's queues did not drain within 5 minutes (asya -n $ns queues)"
    sleep 2
  done
fi

heading "Metrics: the Actors dashboard's queries in the test Prometheus"
if [ -n "$prometheus_ok" ]; then
  q='sum by (namespace, actor) (asya_provisioner_actor_messages_queued{namespace="'"$ns"'"})'
  out=$(curl -fsS -m 5 --get --data-urlencode "query=$q" "$prometheus/api/v1/query" 2>/dev/null \
    | python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print("\n".join(x["metric"]["actor"] + ": " + x["value"][1] + " queued" for x in r))' 2>/dev/null || true)
  say "Prometheus (loopback only): $prometheus/query"
  say "the provisioner's per-actor gauges (they exist at zero pods too):"
  printf '%s\n' "${out:-(no data yet)}" | sed 's/^/      /'
  say "The Actors dashboard's main panels (deploy/chart/dashboards/actors.json), for this namespace:"
  scripts/plot-actors-dashboard.py --prometheus "$prometheus" --namespace "$ns" --since 15m --print-queries \
    > "$logs/actors-dashboard-queries.txt"
  sed 's/^/    /' "$logs/actors-dashboard-queries.txt"
  say "And drawn from Prometheus' data of this run (matplotlib; docs/observability.md has one):"
  scripts/plot-actors-dashboard.py --prometheus "$prometheus" --namespace "$ns" \
    --since "$(( (SECONDS - t_story) / 60 + 2 ))m" --out "$logs/actors-dashboard.png" 2>&1 | sed 's/^/    /' || true
else
  say "(the test Prometheus did not run or discover the cluster: see above)"
fi
say "every dashboard's queries: deploy/chart/dashboards/{actors,control-plane}.json (\"expr\"); alerts and"
say "runbooks: docs/observability.md"

# --- 3. clean up -------------------------------------------------------------------------------
if [ "${ASYA_DEMO_KEEP:-}" = 1 ]; then
  heading "Kept: namespaces $ns, $flow_ns and flavor $flavor (the next run removes them)"
  say "source tests/cluster/env; kubectl get asyas,pods -n $ns -w"
else
  heading "Cleaning up: namespaces $ns, $flow_ns and flavor $flavor (ASYA_DEMO_KEEP=1 keeps them)"
  remove_demo "$ns" "$flow_ns"
  say "deleted; the provisioner removed the queues with the actors"
fi
echo
echo "demo: done in $(mmss $((SECONDS - t_start))). The cluster keeps running for the next run:"
echo "  source tests/cluster/env && kubectl get pods -A     # look around"
echo "  tests/cluster/down                                  # stop it (removes its data)"
