"""Route-aware wake-up benchmark (docs/benchmarks.md, docs/DESIGN.md §6.1): not part of the e2e
suite (the file name does not match test_*.py); run explicitly against the chart's pods on the
test node:

    make images IMAGE_PROFILE=ci && /work/bin/with-cluster tests/e2e/up
    source tests/cluster/env
    /work/bin/with-cluster python3 -m pytest -q -s -p no:cacheprovider tests/e2e/bench_wake.py

For 1, 3 and 5 hops (`testing.act`, echo) at zero pods (`pollingInterval: 2` as in the demo),
one envelope sent to the first hop; the time until its result is in x-sink. Twice: with
`wake.enabled=false` (helm upgrade of the release, values kept: each hop waits for KEDA's poll
of its own queue and a pod start, the hops one after the other) and with wake-up on (the
sender wakes the whole route as the gateway and `asya send` do, then sends). Prints one
`WAKE` line per run with where the time went, from each pod's own timestamps (created,
scheduled, runtime container started, Ready), relative to the send. ASYA_BENCH_HOPS
("1,3,5") sets the route lengths. The release is left with wake-up on.
"""

from __future__ import annotations

import datetime
import os
import time
import uuid

from asya_e2e.actors import EXAMPLES_IMAGE, POD_TIMEOUT, apply_on_node, pods
from asya_e2e.brokers import Collected, management, rabbit_send, rabbit_take
from asya_e2e.env import CHART
from asya_e2e.kube import get, helm, kubectl, kubectl_json, status
from asya_e2e.wait import wait_for

HOPS = [int(h) for h in os.environ.get("ASYA_BENCH_HOPS", "1,3,5").split(",")]


def ts(s: str) -> float:
    return datetime.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def set_wake(enabled: bool) -> None:
    helm("upgrade", "asya", str(CHART), "-n", "asya-system", "--reuse-values",
         "--set", f"wake.enabled={str(enabled).lower()}", "--wait", "--timeout", "4m", timeout=300)
    kubectl("rollout", "status", "deployment/asya-provisioner", "-n", "asya-system", "--timeout=240s", timeout=300)


def triggers(ns: str, name: str) -> int:
    so = get("scaledobject", ns, name) or {}
    return len(so.get("spec", {}).get("triggers", []))


def wake_route(ns: str, actors: list[str]) -> None:
    """What a sender does (the gateway's tool call, `asya send`): a message into each wake queue."""
    for a in actors:
        management("POST", "/api/exchanges/%2F/asya/publish", {
            "properties": {}, "routing_key": f"asya-{ns}-{a}_wake",
            "payload": '{"wake":true,"from":"bench"}', "payload_encoding": "string"})


def pod_times(ns: str, actor: str, t0: float) -> str:
    items = kubectl_json("get", "pods", "-n", ns, "-l", f"asya.sh/actor={actor}")["items"]
    if not items:
        return f"{actor}: no pod"
    p = items[0]
    cond = {c["type"]: ts(c["lastTransitionTime"]) for c in p["status"].get("conditions", [])
            if c["status"] == "True"}
    started = next((ts(c["state"]["running"]["startedAt"]) for c in p["status"].get("containerStatuses", [])
                    if c["name"] == "asya-runtime" and "running" in c.get("state", {})), None)
    rel = lambda t: f"{t - t0:5.1f}" if t else "  -  "  # noqa: E731
    return (f"{actor}: created {rel(ts(p['metadata']['creationTimestamp']))} scheduled {rel(cond.get('PodScheduled'))} "
            f"runtime-started {rel(started)} ready {rel(cond.get('Ready'))}")


def run(hops: int, wake: bool) -> float:
    ns = f"bw-{uuid.uuid4().hex[:8]}"
    kubectl("create", "namespace", ns)
    try:
        names = [f"h{i}" for i in range(1, hops + 1)]
        for n in names:
            apply_on_node(ns, n, {"transport": "rabbitmq", "image": EXAMPLES_IMAGE, "imagePullPolicy": "IfNotPresent",
                                  "handler": "testing.act",
                                  "scaling": {"enabled": True, "minReplicaCount": 0, "maxReplicaCount": 1,
                                              "pollingInterval": 2, "cooldownPeriod": 30}})
        for n in names:
            wait_for(f"{n} at zero, napping, {2 if wake else 1} trigger(s)",
                     lambda n=n: pods(ns, n) == [] and status(ns, n).get("phase") == "Napping"
                     and triggers(ns, n) == (2 if wake else 1), timeout=POD_TIMEOUT, interval=0.5)
        sink = Collected(rabbit_take, f"asya-{ns}-x-sink")
        t0 = time.time()
        if wake:
            wake_route(ns, names)
        rabbit_send(f"asya-{ns}-h1", {"id": "first", "route": {"actors": names, "current": 0}, "headers": {},
                                      "payload": {"do": "echo"}})
        wait_for("the result in x-sink", lambda: sink.at_least(1), timeout=POD_TIMEOUT * hops, interval=0.1)
        took = time.time() - t0
        print(f"\nWAKE hops={hops} wake={'on' if wake else 'off'} first_result={took:.1f}s", flush=True)
        for n in names:
            print(f"    {pod_times(ns, n, t0)}", flush=True)
        return took
    finally:
        kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_first_result_at_zero_by_hops():
    results = {}
    try:
        for wake in (False, True):
            set_wake(wake)
            for h in HOPS:
                results[(h, wake)] = run(h, wake)
    finally:
        set_wake(True)
    print("\nhops  wake off  wake on")
    for h in HOPS:
        print(f"{h:4d}  {results.get((h, False), float('nan')):7.1f}s  {results.get((h, True), float('nan')):6.1f}s")
