"""The test cluster with several nodes (issue 35): `ASYA_TEST_NODES=2` (tests/e2e/run's phase
`nodes` brings the second node up). Pods on different nodes reach each other, the Services and
the host's test servers; a node that crashes with envelopes in flight loses none of them, its
pods come back on the other node within the eviction time, and the node comes back; the
webhook's two replicas admit through a replica's deletion, a drain and a rollout without a
failure, and a node crash fails admissions only for a measured window; the provisioner's
leader killed mid-work is followed by the standby within the lease.

Marked `nodes`: they run in that phase only, one at a time (a crash is felt cluster-wide)."""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest

from asya_e2e import nodes
from asya_e2e.api import api_connection_factory
from asya_e2e.actors import EXAMPLES_IMAGE, ON_TEST_NODE, POD_TIMEOUT, apply_on_node, pod_story, pods, running_ready
from asya_e2e.brokers import TRANSPORTS, Collected
from asya_e2e.env import CHART
from asya_e2e.kube import apply, helm, kubectl, kubectl_json
from asya_e2e.wait import wait_for
from asya_e2e.writes import ContentHistory

pytestmark = [pytest.mark.nodes]

# The controller manager's --node-monitor-grace-period (tests/cluster/node.go): how long a
# silent kubelet's node stays Ready. Production clusters default to 40 s (50 s from 1.32).
NODE_MONITOR_GRACE = 20
# What the actors below tolerate of an unreachable or not-ready node before the taint manager
# evicts their pods (Kubernetes' default, by the DefaultTolerationSeconds plugin: 300 s).
TOLERATION_SECONDS = 5
SHORT_EVICTION = [{"key": f"node.kubernetes.io/{k}", "operator": "Exists", "effect": "NoExecute",
                   "tolerationSeconds": TOLERATION_SECONDS} for k in ("unreachable", "not-ready")]


@pytest.fixture(scope="module", autouse=True)
def two_nodes():
    ready = nodes.ready_nodes()
    if len(ready) < 2:
        pytest.skip(f"one node Ready ({ready}): these tests need ASYA_TEST_NODES=2 (tests/e2e/run's phase nodes)")
    return ready


def pinned_pod(ns: str, name: str, node: str) -> dict:
    """A pod of the examples image on NODE serving HTTP on 8080, and its Service."""
    labels = {"app": name}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
           "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "tolerations": ON_TEST_NODE,
                    "containers": [{"name": "web", "image": EXAMPLES_IMAGE, "imagePullPolicy": "IfNotPresent",
                                    "command": ["python3", "-m", "http.server", "8080"],
                                    "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True,
                                                        "capabilities": {"drop": ["ALL"]},
                                                        "seccompProfile": {"type": "RuntimeDefault"}}}]}}
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
           "spec": {"selector": labels, "ports": [{"port": 80, "targetPort": 8080}]}}
    apply(ns, pod)
    apply(ns, svc)
    return pod


# Run in a pod: each target "host:port" connected to (HTTP GET when http), one line per target.
PROBE = r"""
import socket, sys, urllib.request
for t in sys.argv[1:]:
    kind, addr = t.split("=", 1)
    try:
        if kind == "http":
            urllib.request.urlopen("http://" + addr + "/", timeout=5).read(1)
        else:
            host, port = addr.rsplit(":", 1)
            socket.create_connection((host, int(port)), timeout=5).close()
        print(t, "ok")
    except Exception as e:
        print(t, "FAILED", e)
"""


def test_pods_on_different_nodes_reach_each_other_the_services_and_the_host(namespace):
    """A pod on each node: each reaches the other by pod IP (bridge to bridge) and by its
    Service name (cluster DNS, kube-proxy), the API server's Service, and the host's RabbitMQ
    and SQS server by their Service names."""
    ready = nodes.ready_nodes()
    names = {node: f"web-{i}" for i, node in enumerate(ready[:2])}
    for node, name in names.items():
        pinned_pod(namespace, name, node)
    try:
        running = wait_for("both pods running", lambda: (p := [x for x in kubectl_json("get", "pods", "-n", namespace)["items"]
                                                               if running_ready(x)]) and len(p) == 2 and p,
                           timeout=POD_TIMEOUT, interval=1.0)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{pod_story(namespace)}") from None
    by_name = {p["metadata"]["name"]: p for p in running}
    assert {nodes.node_of(p) for p in running} == set(names), [(n, nodes.node_of(p)) for n, p in by_name.items()]
    for name, pod in by_name.items():
        other = next(p for n, p in by_name.items() if n != name)
        targets = [f"http={other['status']['podIP']}:8080",
                   f"http={other['metadata']['name']}.{namespace}.svc.cluster.local:80",
                   "tcp=kubernetes.default.svc.cluster.local:443",
                   "tcp=rabbitmq.default.svc.cluster.local:5672",
                   "tcp=sqs.default.svc.cluster.local:9324"]
        # kube-proxy programs a new Service's rules a moment after its endpoints are ready
        # (minSyncPeriod 1 s): until then its ClusterIP is routed nowhere. Polled, bounded.
        def probe():
            out = kubectl("exec", "-n", namespace, name, "--", "python3", "-c", PROBE, *targets).stdout
            return out.count(" ok") == len(targets) and out
        last = {}
        try:
            wait_for(f"every target reached from {name}", lambda: last.update(out=probe()) or last["out"],
                     timeout=30, interval=1.0)
        except AssertionError:
            out = kubectl("exec", "-n", namespace, name, "--", "python3", "-c", PROBE, *targets).stdout
            raise AssertionError(f"from {name} on {nodes.node_of(pod)}:\n{out}") from None


def sleeper(i: int, tag: str) -> dict:
    return {"id": f"{tag}-{i}", "payload": {"do": "sleep", "seconds": 0.5, "i": i, "started": f"/tmp/started-{tag}-{i}"}}


def started_on(ns: str, pod: str, tag: str) -> set[str]:
    out = kubectl("exec", "-n", ns, pod, "-c", "asya-runtime", "--", "python3", "-c",
                  f"import glob; print(' '.join(glob.glob('/tmp/started-{tag}-*')))", check=False)
    return set(out.stdout.split()) if out.returncode == 0 else set()


# One envelope at a time per pod on each side of the runtime: a pod holds at most
# PREFETCH + PIPELINE envelopes unacknowledged, the bound on what a crash can make redone.
PREFETCH, PIPELINE = 1, 1
ENVELOPES = 40


# What a crashed pod can have done without its broker hearing of it: RabbitMQ, the envelopes
# it held (prefetch + pipeline); SQS, also the deletes of a batch not yet sent (10 a batch).
DUPLICATES_BOUND = {"rabbitmq": PREFETCH + PIPELINE, "sqs": PIPELINE + 10}


@pytest.mark.parametrize("transport", ["rabbitmq", "sqs"])
def test_a_node_crash_loses_no_envelope_and_its_pods_come_back_on_the_other_node(namespace, transport):
    """An actor with a pod on each node works through 40 half-second envelopes; the extra
    node crashes (kubelet, containerd, shims and containers SIGKILLed at once) while its pod
    is mid-envelope. Every envelope reaches x-sink, none is lost, and only what the crashed pod
    held (DUPLICATES_BOUND) is done twice; the duplicates are counted and printed. On SQS the
    crashed pod's envelopes come back after the queue's visibility timeout (the actor's
    timeout, 20 s).
    The node turns NotReady after the controller manager's grace period, the pod is evicted
    after its tolerationSeconds and its replacement runs on the remaining node; then the node
    comes back, the evicted pod is gone from it, and both nodes are Ready."""
    name, tag = "relay", f"crash-{uuid.uuid4().hex[:4]}"
    env = [{"name": "ASYA_RUNTIME_PIPELINE", "value": str(PIPELINE)}]
    env += ([{"name": "ASYA_RABBITMQ_PREFETCH", "value": str(PREFETCH)}] if transport == "rabbitmq"
            else [{"name": "ASYA_SQS_POLLERS", "value": "1"}])
    spec = {"transport": transport, "image": EXAMPLES_IMAGE, "imagePullPolicy": "IfNotPresent",
            "handler": "testing.act", "scaling": {"enabled": False}, "replicas": 2,
            "resiliency": {"actorTimeout": "20s"}, "sidecar": {"env": env}}
    apply_on_node(namespace, name, {**spec, "tolerations": ON_TEST_NODE + SHORT_EVICTION})
    try:
        placed = wait_for("a ready pod of the actor on each node",
                          lambda: (p := [x for x in pods(namespace, name) if running_ready(x)])
                          and {nodes.node_of(x) for x in p} == {nodes.node_name(0), nodes.node_name(1)} and p,
                          timeout=POD_TIMEOUT, interval=1.0)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{pod_story(namespace)}") from None
    doomed = next(p["metadata"]["name"] for p in placed if nodes.node_of(p) == nodes.node_name(1))

    send, take = TRANSPORTS[transport]
    ids = [f"{tag}-{i}" for i in range(ENVELOPES)]
    for i in range(ENVELOPES):
        send(f"asya-{namespace}-{name}", {"route": {"actors": [name], "current": 0}, "headers": {}, **sleeper(i, tag)})
    sink = Collected(take, f"asya-{namespace}-x-sink")
    sump = Collected(take, f"asya-{namespace}-x-sump")
    # Mid-stream: some results out, and the doomed pod busy.
    wait_for("a few results, and the pod on the extra node mid-envelope",
             lambda: sink.at_least(4) and started_on(namespace, doomed, tag), timeout=120, interval=0.3)
    crashed_at = time.monotonic()
    nodes.crash(1)

    def all_there():
        sink.at_least(ENVELOPES)
        sump.at_least(1)
        return set(ids) <= {e["id"] for e in sink.items + sump.items}
    try:
        wait_for(f"{ENVELOPES} envelopes in x-sink or x-sump", all_there, timeout=180, interval=0.5)
    except AssertionError as e:
        seen = {x["id"] for x in sink.items + sump.items}
        raise AssertionError(f"{e}\nmissing: {sorted(set(ids) - seen)}\n{pod_story(namespace)}") from None
    recovered = time.monotonic() - crashed_at
    sump.at_least(1)  # one last look: nothing should be there
    got = [e["id"] for e in sink.items + sump.items]
    duplicates = sorted({i for i in got if got.count(i) > 1})
    print(f"\nnode crash ({transport}): {ENVELOPES} envelopes, all in x-sink {recovered:.1f} s after the crash; "
          f"duplicates {len(duplicates)} {duplicates}")
    assert set(got) == set(ids), sorted(set(got) ^ set(ids))
    assert sump.items == [], [(e["id"], e["headers"].get("x-asya-error")) for e in sump.items]
    assert len(duplicates) <= DUPLICATES_BOUND[transport], duplicates

    # The crashed node's pod: evicted once the node is unreachable, replaced on node 0.
    grace = NODE_MONITOR_GRACE + TOLERATION_SECONDS
    try:
        wait_for("the crashed node NotReady", lambda: nodes.node_name(1) not in nodes.ready_nodes(),
                 timeout=NODE_MONITOR_GRACE + 30, interval=0.5)
        not_ready = time.monotonic() - crashed_at
        wait_for(f"{doomed} evicted", lambda: kubectl_json("get", "pod", doomed, "-n", namespace)["metadata"]
                 .get("deletionTimestamp"), timeout=TOLERATION_SECONDS + 30, interval=0.5)
        evicted = time.monotonic() - crashed_at
        wait_for("two ready pods on the remaining node",
                 lambda: len([p for p in pods(namespace, name) if running_ready(p)
                              and nodes.node_of(p) == nodes.node_name(0)]) == 2,
                 timeout=POD_TIMEOUT, interval=1.0)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{pod_story(namespace)}") from None
    replaced = time.monotonic() - crashed_at
    print(f"node crash: NotReady after {not_ready:.1f} s, pod evicted after {evicted:.1f} s "
          f"(grace {NODE_MONITOR_GRACE} s + tolerationSeconds {TOLERATION_SECONDS} s), "
          f"replacement ready on {nodes.node_name(0)} after {replaced:.1f} s")
    # The taint manager runs every few seconds: eviction within the documented time plus that.
    assert evicted <= grace + 15, evicted

    t0 = time.monotonic()
    nodes.start(1)
    wait_for(f"the evicted pod {doomed} removed by the node that came back",
             lambda: doomed not in {p["metadata"]["name"] for p in pods(namespace, name)}, timeout=120, interval=1.0)
    assert nodes.ready_nodes() == [nodes.node_name(0), nodes.node_name(1)]
    print(f"node crash: node back and Ready, evicted pod cleaned up, {time.monotonic() - t0:.1f} s after its restart")


# --- the webhook's replicas -------------------------------------------------------------------

RELEASE_NS, WEBHOOK = "asya-system", "asya-webhook"


class AdmissionStream:
    """Creates, without pause, an injected pod and an AsyncActor in turn (server-side dry runs:
    the API server calls the webhook for each, nothing is stored), over one keep-alive
    connection, and notes the time and answer of every one that fails."""

    def __init__(self, ns: str):
        self.ns, self.connect, self.headers = ns, *api_connection_factory()
        self.failures: list[tuple[float, str, str]] = []
        self.count = 0
        self.stop = threading.Event()
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"generateName": "stream-", "labels": {"asya.sh/inject": "true", "asya.sh/actor": "stream"},
                            "annotations": {"asya.sh/handler": "testing.act", "asya.sh/transport": "rabbitmq"}},
               "spec": {"schedulingGates": [{"name": "asya.sh/stream"}],
                        "containers": [{"name": "asya-runtime", "image": EXAMPLES_IMAGE}]}}
        # An actor's name is its queue's: the webhook wants it (no generateName).
        self.act = {"apiVersion": "asya.sh/v1alpha1", "kind": "AsyncActor", "metadata": {},
                    "spec": {"transport": "rabbitmq", "image": EXAMPLES_IMAGE, "handler": "testing.act"}}
        self.requests = [(f"/api/v1/namespaces/{ns}/pods?dryRun=All", pod),
                         (f"/apis/asya.sh/v1alpha1/namespaces/{ns}/asyncactors?dryRun=All", self.act)]
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        conn = self.connect()
        while not self.stop.is_set():
            for path, body in self.requests:
                self.act["metadata"]["name"] = f"stream-{self.count}"
                t = time.monotonic()
                try:
                    conn.request("POST", path, body=json.dumps(body), headers=self.headers)
                    resp = conn.getresponse()
                    text = resp.read().decode(errors="replace")
                    if resp.status != 201:
                        self.failures.append((t, path.split("?")[0].rsplit("/", 1)[-1], f"{resp.status} {text[:300]}"))
                except OSError as e:  # the API server's connection, not the webhook's: reconnect
                    conn.close()
                    conn = self.connect()
                    self.failures.append((t, "connection", repr(e)))
                self.count += 1

    def __enter__(self):
        # Each request admitted once before the stream starts: a failure later is the
        # webhook's availability, not a request it would refuse anyway.
        conn = self.connect()
        for path, body in self.requests:
            self.act["metadata"]["name"] = "stream-check"
            conn.request("POST", path, body=json.dumps(body), headers=self.headers)
            resp = conn.getresponse()
            text = resp.read().decode(errors="replace")
            assert resp.status == 201, f"{path}: {resp.status} {text}"
        conn.close()
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=30)

    def failed_since(self, t0: float) -> list[tuple[float, str, str]]:
        return [f for f in self.failures if f[0] >= t0]


def failure_summary(failures: list[tuple[float, str, str]], t0: float) -> str:
    """Failed admissions grouped by what and answer: count, first and last (s after t0)."""
    groups: dict[tuple[str, str], list[float]] = {}
    for t, what, answer in failures:
        groups.setdefault((what, answer[:160]), []).append(t - t0)
    return "\n".join(f"{len(ts)}x {what} [{min(ts):.1f}..{max(ts):.1f} s]: {answer}"
                     for (what, answer), ts in sorted(groups.items(), key=lambda g: min(g[1])))


def webhook_pods() -> list[dict]:
    return kubectl_json("get", "pods", "-n", RELEASE_NS, "-l", "app.kubernetes.io/component=webhook")["items"]


def webhook_spread() -> bool:
    """Every webhook replica ready, none terminating, one on each node."""
    p = webhook_pods()
    live = [x for x in p if not x["metadata"].get("deletionTimestamp")]
    return (len(live) == 2 and all(running_ready(x) for x in live)
            and {nodes.node_of(x) for x in live} == {nodes.node_name(0), nodes.node_name(1)})


def roll_webhook():
    kubectl("rollout", "restart", f"deployment/{WEBHOOK}", "-n", RELEASE_NS)
    kubectl("rollout", "status", f"deployment/{WEBHOOK}", "-n", RELEASE_NS, "--timeout=240s", timeout=260)


def test_webhook_replicas_keep_admitting_through_deletion_drain_roll_and_a_node_crash(namespace):
    """Two webhook replicas, one per node, under a steady stream of admissions (injected pods
    and AsyncActors, failure policy Fail). Deleting a replica, draining its node and rolling
    the Deployment each cause no failed admission; a node crash causes failures only until the
    API server stops calling the dead replica (its endpoint goes once the node is NotReady):
    that window is measured and printed."""
    with AdmissionStream(namespace) as stream:
        results = {}
        # Roll: the replicas come back spread over both nodes (the chart's anti-affinity).
        t0 = time.monotonic()
        roll_webhook()
        wait_for("a ready webhook replica on each node", webhook_spread, timeout=POD_TIMEOUT, interval=1.0)
        results["roll"] = stream.failed_since(t0)

        # Delete the replica on the extra node (its grace period, as `kubectl delete pod` does).
        t0 = time.monotonic()
        victim = next(p["metadata"]["name"] for p in webhook_pods() if nodes.node_of(p) == nodes.node_name(1))
        kubectl("delete", "pod", victim, "-n", RELEASE_NS, "--wait=true", timeout=120)
        wait_for("two ready webhook replicas again", lambda: len([p for p in webhook_pods() if running_ready(p)
                                                                  and not p["metadata"].get("deletionTimestamp")]) == 2,
                 timeout=POD_TIMEOUT, interval=1.0)
        results["delete"] = stream.failed_since(t0)

        # Drain the extra node (the PDB keeps one replica), then let it take pods again.
        t0 = time.monotonic()
        kubectl("drain", nodes.node_name(1), "--ignore-daemonsets", "--delete-emptydir-data", "--force",
                "--timeout=240s", timeout=260)
        kubectl("uncordon", nodes.node_name(1))
        wait_for("two ready webhook replicas after the drain", lambda: len(
            [p for p in webhook_pods() if running_ready(p) and not p["metadata"].get("deletionTimestamp")]) == 2,
                 timeout=POD_TIMEOUT, interval=1.0)
        results["drain"] = stream.failed_since(t0)

        # Spread again for the crash (a roll: counted with the first).
        t0 = time.monotonic()
        roll_webhook()
        wait_for("a ready webhook replica on each node again", webhook_spread, timeout=POD_TIMEOUT, interval=1.0)
        results["roll"] += stream.failed_since(t0)

        print("\nwebhook replicas before the crash: " + "; ".join(
            f"{k}: {len(v)} failed" + (f"\n{failure_summary(v, v[0][0])}" if v else "") for k, v in results.items()))
        # Crash the extra node: its replica's endpoint stays until the node is NotReady.
        before = stream.count
        crashed_at = time.monotonic()
        nodes.crash(1)
        wait_for("the crashed node NotReady", lambda: nodes.node_name(1) not in nodes.ready_nodes(),
                 timeout=NODE_MONITOR_GRACE + 30, interval=0.5)
        # Admissions succeed again: 10 s without a failure.
        try:
            wait_for("10 s of admissions without a failure", lambda: time.monotonic() - max(
                [crashed_at] + [f[0] for f in stream.failures]) > 10, timeout=120, interval=0.5)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{failure_summary(stream.failed_since(crashed_at), crashed_at)}\n"
                                 f"{pod_story(RELEASE_NS)}") from None
        crash = stream.failed_since(crashed_at)
        during = stream.count - before
    nodes.start(1)
    wait_for("a ready webhook replica on each node after the node came back", lambda: len(
        [p for p in webhook_pods() if running_ready(p) and not p["metadata"].get("deletionTimestamp")]) == 2,
             timeout=POD_TIMEOUT, interval=1.0)

    window = (max(f[0] for f in crash) - crashed_at) if crash else 0.0
    print(f"\nwebhook replicas: {stream.count} admissions; failed: "
          + ", ".join(f"{k} {len(v)}" for k, v in results.items())
          + f"; node crash: {len(crash)} of {during} failed, the last {window:.1f} s after the crash")
    # The API server keeps one HTTP/2 connection to the webhook Service and sends every
    # review over it, to the replica it was dialled to, endpoints or not. The preStop delay
    # keeps a stopping replica serving while its endpoint goes; at SIGTERM it sends a GOAWAY
    # on that connection and answers the reviews under way (webhook/src/server.rs), so the
    # API server dials again, to a live replica, for its next review: none fails.
    limits = {"roll": 0, "drain": 0, "delete": 0}
    for k, v in results.items():
        assert len(v) <= limits[k], f"{k}: {len(v)} failed admissions:\n{failure_summary(v, v[0][0])}"
    assert all("connection" != what for _, what, _ in crash), crash[:3]
    # Until the node is NotReady (its grace period) and its endpoints are gone, and no longer.
    assert window <= NODE_MONITOR_GRACE + 15, (window, crash[-3:])


# --- the provisioner's failover ---------------------------------------------------------------

LEASE = "asya-queue-provisioner"
# queue-provisioner/src/leader.rs: LEASE_SECONDS (15) and the standby's RETRY (2 s).
LEASE_SECONDS, LEASE_RETRY = 15, 2
FLAT = {"image": "python:3.12-slim", "handler": "handlers.pipeline.double"}


def provisioner_pods() -> list[dict]:
    return [p for p in kubectl_json("get", "pods", "-n", RELEASE_NS, "-l", "app.kubernetes.io/component=provisioner")["items"]
            if not p["metadata"].get("deletionTimestamp")]


def lease_holder() -> str:
    lease = kubectl_json("get", "lease", LEASE, "-n", RELEASE_NS)
    return lease.get("spec", {}).get("holderIdentity") or ""


def test_provisioner_leader_killed_mid_work_fails_over_within_the_lease(namespace):
    """Two provisioner replicas (one per node); 200 actors applied at once and, while they are
    being provisioned, the leader's pod killed without a grace period (its lease is not given
    back). The standby takes the Lease within its duration plus a retry, every actor
    converges, no actor whose transport was Ready is ever seen otherwise, and no Deployment
    or ScaledObject is written twice with different content (every version the API server's
    watch delivers is compared)."""
    def scale(n: int):
        helm("upgrade", "asya", CHART, "-n", RELEASE_NS, "--reuse-values", "--set", f"provisioner.replicas={n}",
             "--wait", "--timeout", "4m", timeout=300)

    scale(2)
    history = None
    try:
        wait_for("two ready provisioner replicas", lambda: len([p for p in provisioner_pods() if running_ready(p)]) == 2,
                 timeout=POD_TIMEOUT, interval=1.0)
        n = 200
        docs = [{"apiVersion": "asya.sh/v1alpha1", "kind": "AsyncActor",
                 "metadata": {"name": f"f{i:03d}", "namespace": namespace}, "spec": dict(FLAT)} for i in range(n)]
        history = ContentHistory(namespace).__enter__()
        kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}), timeout=300)
        ready_once: set[str] = set()
        regressed: set[str] = set()

        def statuses() -> int:
            converged = 0
            for a in kubectl_json("get", "asyncactors", "-n", namespace)["items"]:
                name, st = a["metadata"]["name"], a.get("status", {})
                if st.get("transportStatus") == "Ready":
                    ready_once.add(name)
                    converged += bool(st.get("workloadKind"))
                elif name in ready_once:
                    regressed.add(name)
            return converged

        wait_for("the leader mid-way (some actors provisioned, not all)", lambda: 0 < statuses() < n,
                 timeout=120, interval=0.2)
        holder = lease_holder()
        leader = next(p["metadata"]["name"] for p in provisioner_pods() if holder.startswith(p["metadata"]["name"]))
        killed_at = time.monotonic()
        kubectl("delete", "pod", leader, "-n", RELEASE_NS, "--grace-period=0", "--force", "--wait=false")
        wait_for("another replica holding the Lease",
                 lambda: (h := lease_holder()) and not h.startswith(leader), timeout=LEASE_SECONDS + 30, interval=0.2)
        takeover = time.monotonic() - killed_at
        wait_for(f"{n} actors converged", lambda: statuses() == n, timeout=600, interval=1.0)
        converged = time.monotonic() - killed_at
        # Every object there is, seen by the watches (they deliver in order: once the listing
        # below has them all, so have the watches or they are about to).
        assert len(kubectl_json("get", "scaledobjects", "-n", namespace)["items"]) == n
        wait_for("the watches have seen every Deployment and ScaledObject", lambda: history.objects() == 2 * n,
                 timeout=60, interval=0.5)
        history.stop()
        print(f"\nprovisioner failover: the standby leads {takeover:.1f} s after the leader was killed "
              f"(lease {LEASE_SECONDS} s); all {n} actors converged {converged:.1f} s after; "
              f"{len(regressed)} Ready statuses regressed; {history.versions()} versions of "
              f"{history.objects()} objects watched, {len(history.rewritten())} written with different content"
              + (f"; watch errors: {history.errors}" if history.errors else ""))
        assert takeover <= LEASE_SECONDS + 2 * LEASE_RETRY + 3, takeover
        assert not regressed, sorted(regressed)
        assert not history.rewritten(), (history.rewritten(), history.differences())
    finally:
        if history:
            history.stop()
        scale(1)
