"""Route-aware wake-up on the test node (docs/DESIGN.md §6.1): three actors of a route and a
fourth of the namespace, all at zero pods; one envelope sent to the first, with no wake from
the sender. The first hop's sidecar, on receipt, wakes the later hops through their wake
queues (declared by the provisioner; KEDA's second trigger reads them): their Deployments go
to one replica while the first hop's handler still runs (nothing sent to them yet), the
fourth actor stays at zero, and after the cooldown every actor is back at zero. A last hop
that opts out (`scaling.wake: false`) gets no wake queue and no second trigger, stays at zero
until the envelope reaches its own queue, and still delivers."""

from __future__ import annotations

import os
import time
import urllib.error

import pytest

from asya_e2e.actors import EXAMPLES_IMAGE, POD_TIMEOUT, apply_on_node, pods
from asya_e2e.brokers import Collected, management, rabbit_send, rabbit_take
from asya_e2e.kube import get, kubectl
from asya_e2e.wait import wait_for

pytestmark = pytest.mark.skipif(os.environ.get("ASYA_TEST_NODE", "1") == "0",
                                reason="ASYA_TEST_NODE=0: the test cluster runs without a node")

HOPS = ["hop1", "hop2", "hop3"]
# The route's last hop, opted out of wake-up.
LATE = "late"
COOLDOWN = 10
# How long each hop's handler runs: longer than KEDA's poll (1 s) and a pod's start on the
# node, so the later hops are seen woken while the first still works.
HANDLER_SECONDS = 12


def replicas(ns: str, name: str) -> int | None:
    d = get("deployment", ns, name)
    return d["spec"].get("replicas") if d else None


def queue(ns: str, name: str) -> dict:
    return management("GET", f"/api/queues/%2F/asya-{ns}-{name}")


def queue_exists(ns: str, name: str) -> bool:
    try:
        queue(ns, name)
        return True
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return False
        raise


def at_zero(ns: str, name: str) -> bool:
    return replicas(ns, name) == 0 and pods(ns, name) == []


def test_the_first_hop_wakes_the_later_ones_and_nobody_else(namespace):
    ns = namespace
    spec = {"transport": "rabbitmq", "image": EXAMPLES_IMAGE, "imagePullPolicy": "IfNotPresent",
            "handler": "testing.act",
            "scaling": {"enabled": True, "minReplicaCount": 0, "maxReplicaCount": 1,
                        "pollingInterval": 1, "cooldownPeriod": COOLDOWN}}
    for name in HOPS + ["idle"]:
        apply_on_node(ns, name, spec)
    apply_on_node(ns, LATE, {**spec, "scaling": {**spec["scaling"], "wake": False}})
    for name in HOPS + ["idle", LATE]:
        wait_for(f"{name}'s ScaledObject ready", lambda n=name: any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in (get("scaledobject", ns, n) or {}).get("status", {}).get("conditions", [])),
            timeout=POD_TIMEOUT, interval=1.0)
        wait_for(f"{name} at zero", lambda n=name: at_zero(ns, n), timeout=POD_TIMEOUT, interval=1.0)

    # What the provisioner made: the wake queue beside each actor's, and the second trigger.
    for name in HOPS:
        wake = queue(ns, f"{name}_wake")
        assert wake["arguments"] == {"x-max-length": 1, "x-overflow": "drop-head",
                                     "x-message-ttl": COOLDOWN * 1000}, wake["arguments"]
        triggers = get("scaledobject", ns, name)["spec"]["triggers"]
        assert [t["metadata"]["queueName"] for t in triggers] == [f"asya-{ns}-{name}", f"asya-{ns}-{name}_wake"]
        assert triggers[1]["metadata"]["value"] == "1000000", triggers[1]
    assert not queue_exists(ns, f"{LATE}_wake"), "an actor that opted out got a wake queue"
    assert [t["metadata"]["queueName"] for t in get("scaledobject", ns, LATE)["spec"]["triggers"]] == [f"asya-{ns}-{LATE}"]

    # Sent without the sender's wake: what follows is the first hop's sidecar's doing.
    route = {"actors": HOPS + [LATE], "current": 0}
    rabbit_send(f"asya-{ns}-hop1", {"id": "w1", "route": route, "headers": {},
                                    "payload": {"do": "sleep", "seconds": HANDLER_SECONDS}})
    wait_for("hop1 started by its own queue", lambda: replicas(ns, "hop1") == 1, timeout=POD_TIMEOUT, interval=0.5)
    t_woken = {}

    def later_hops_woken():
        for name in HOPS[1:]:
            if name not in t_woken and replicas(ns, name) == 1:
                # Nothing sent to it yet: its queue never had a message.
                q = queue(ns, name)
                published = q.get("message_stats", {}).get("publish", 0)
                assert q["messages"] == 0 and published == 0, f"{name} got work before its wake: {q}"
                t_woken[name] = time.monotonic()
        return len(t_woken) == len(HOPS) - 1

    wait_for("hop2 and hop3 woken before hop1 sent them anything", later_hops_woken,
             timeout=POD_TIMEOUT, interval=0.5)
    assert rabbit_take(f"asya-{ns}-x-sink", 1) == [], "the envelope finished before the wake was seen"
    assert replicas(ns, "idle") == 0, "an actor no envelope is routed to was woken"
    assert replicas(ns, LATE) == 0, "an actor that opted out of wake-up was woken"

    sink = Collected(rabbit_take, f"asya-{ns}-x-sink")
    got = wait_for("the result in x-sink", lambda: sink.at_least(1), timeout=POD_TIMEOUT, interval=1.0)
    assert [e["id"] for e in got] == ["w1"]
    assert replicas(ns, "idle") == 0 and pods(ns, "idle") == []

    for name in HOPS + [LATE]:
        wait_for(f"{name} back at zero after the cooldown", lambda n=name: at_zero(ns, n),
                 timeout=POD_TIMEOUT, interval=1.0)
    assert queue(ns, "hop3_wake")["messages"] == 0, "the wake expired"

    # The wake queue goes with its actor.
    kubectl("delete", "asyncactor", "idle", "-n", ns)
    wait_for("idle's wake queue deleted with it", lambda: not queue_exists(ns, "idle_wake"), timeout=60, interval=1.0)
