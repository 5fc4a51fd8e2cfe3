"""The test cluster with several nodes (issue 35): `ASYA_TEST_NODES=2` (tests/e2e/run's phase
`nodes` brings the second node up). Pods on different nodes reach each other, the Services and
the host's test servers; a node that crashes with envelopes in flight loses none of them, its
pods come back on the other node within the eviction time, and the node comes back.

Marked `nodes`: they run in that phase only, one at a time (a crash is felt cluster-wide)."""

from __future__ import annotations

import time
import uuid

import pytest

from asya_e2e import nodes
from asya_e2e.actors import EXAMPLES_IMAGE, ON_TEST_NODE, POD_TIMEOUT, apply_on_node, pod_story, pods, running_ready
from asya_e2e.brokers import TRANSPORTS, Collected
from asya_e2e.kube import apply, kubectl, kubectl_json
from asya_e2e.wait import wait_for

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
        out = kubectl("exec", "-n", namespace, name, "--", "python3", "-c", PROBE, *targets).stdout
        failed = [line for line in out.splitlines() if "FAILED" in line]
        assert not failed and out.count(" ok") == len(targets), f"from {name} on {nodes.node_of(pod)}:\n{out}"


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


def test_a_node_crash_loses_no_envelope_and_its_pods_come_back_on_the_other_node(namespace):
    """An actor with a pod on each node works through 40 half-second envelopes; the extra
    node crashes (kubelet, containerd, shims and containers SIGKILLed at once) while its pod
    is mid-envelope. Every envelope reaches x-sink, none is lost, and only what the crashed pod
    held (at most PREFETCH + PIPELINE) is done twice; the duplicates are counted and printed.
    The node turns NotReady after the controller manager's grace period, the pod is evicted
    after its tolerationSeconds and its replacement runs on the remaining node; then the node
    comes back, the evicted pod is gone from it, and both nodes are Ready."""
    name, tag, transport = "relay", f"crash-{uuid.uuid4().hex[:4]}", "rabbitmq"
    spec = {"transport": transport, "image": EXAMPLES_IMAGE, "imagePullPolicy": "IfNotPresent",
            "handler": "testing.act", "scaling": {"enabled": False}, "replicas": 2,
            "resiliency": {"actorTimeout": "20s"},
            "sidecar": {"env": [{"name": "ASYA_RABBITMQ_PREFETCH", "value": str(PREFETCH)},
                                {"name": "ASYA_RUNTIME_PIPELINE", "value": str(PIPELINE)}]}}
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
    print(f"\nnode crash: {ENVELOPES} envelopes, all in x-sink {recovered:.1f} s after the crash; "
          f"duplicates {len(duplicates)} {duplicates}")
    assert set(got) == set(ids), sorted(set(got) ^ set(ids))
    assert sump.items == [], [(e["id"], e["headers"].get("x-asya-error")) for e in sump.items]
    assert len(duplicates) <= PREFETCH + PIPELINE, duplicates

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
