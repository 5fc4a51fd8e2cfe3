"""Pods of this project on the test cluster's real node (kubelet + containerd + runc, bridge
CNI, kube-proxy, CoreDNS, KEDA's operator): AsyncActors become running pods with the injected
sidecar and the image of `make images`, envelopes go through them, KEDA scales from zero."""

from __future__ import annotations

import json
import os
import uuid

import pytest

from asya_e2e.actors import EXAMPLES_IMAGE, NODE, ON_TEST_NODE, POD_TIMEOUT, apply_on_node, pods, wait_running
from asya_e2e.brokers import TRANSPORTS, Collected
from asya_e2e.kube import get, kubectl, kubectl_json, status
from asya_e2e.wait import wait_for

pytestmark = pytest.mark.skipif(os.environ.get("ASYA_TEST_NODE", "1") == "0",
                                reason="ASYA_TEST_NODE=0: the test cluster runs without a node")


# --- the node --------------------------------------------------------------------------------


def test_node_is_ready_on_containerd():
    node = kubectl_json("get", "node", NODE)
    ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}
    assert ready["Ready"] == "True", node["status"]["conditions"]
    info = node["status"]["nodeInfo"]
    assert info["containerRuntimeVersion"].startswith("containerd://"), info
    assert info["kubeletVersion"].startswith("v1.35."), info
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addresses["InternalIP"] == os.environ.get("ASYA_TEST_HOST_IP", "10.245.0.1")


def test_keda_serves_the_external_metrics_api():
    svc = kubectl_json("get", "apiservice", "v1beta1.external.metrics.k8s.io")
    assert {c["type"]: c["status"] for c in svc["status"]["conditions"]}["Available"] == "True"
    assert svc["spec"]["service"] == {"name": "keda-metrics-apiserver", "namespace": "keda", "port": 443}
    for deploy in ("keda-operator", "keda-metrics-apiserver"):
        d = kubectl_json("get", "deployment", deploy, "-n", "keda")
        assert d["status"].get("readyReplicas") == 1, d["status"]


@pytest.mark.parametrize("transport", ["rabbitmq", "sqs"])
def test_three_actor_pipeline_runs_in_pods(namespace, transport):
    """validate -> split (fan-out) -> shout, each an AsyncActor of the examples image with the
    sidecar injected by the webhook: envelopes sent to the first queue end in x-sink with the
    expected payloads, trace headers kept; a bad one ends in x-sump with its traceback."""
    ns = namespace
    send, take = TRANSPORTS[transport]
    handlers = {"validate": "pipeline.Validator.check", "split": "pipeline.split", "shout": "pipeline.shout"}
    for name, handler in handlers.items():
        apply_on_node(ns, name, {"transport": transport, "image": EXAMPLES_IMAGE, "imagePullPolicy": "IfNotPresent",
                                 "handler": handler, "scaling": {"enabled": False}, "replicas": 1})
    for name in handlers:
        pod = wait_running(ns, name)[0]
        spec = pod["spec"]
        names = [c["name"] for c in spec.get("initContainers", []) + spec["containers"]]
        assert "asya-sidecar" in names and "asya-runtime" in [c["name"] for c in spec["containers"]], names

    route = {"actors": list(handlers), "current": 0}
    trace = uuid.uuid4().hex
    send(f"asya-{ns}-validate", {"id": "ok-1", "route": route, "headers": {"trace_id": trace},
                                 "payload": {"text": "hello brave world"}})
    send(f"asya-{ns}-validate", {"id": "bad-1", "route": route, "headers": {"trace_id": trace},
                                 "payload": {"text": "   "}})

    sink = Collected(take, f"asya-{ns}-x-sink")
    got = wait_for("three results in x-sink", lambda: sink.at_least(3), timeout=POD_TIMEOUT, interval=1.0)
    assert sorted((e["payload"]["position"], e["payload"]["word"]) for e in got) == [
        (0, "HELLO"), (1, "BRAVE"), (2, "WORLD")]
    # Fan-out: the first keeps the id, the others get {id}-{i} and the parent's id.
    assert sorted(e["id"] for e in got) == ["ok-1", "ok-1-1", "ok-1-2"]
    assert all(e.get("parent_id") == "ok-1" for e in got if e["id"] != "ok-1")
    assert all(e["headers"]["trace_id"] == trace for e in got)
    assert all(e["route"]["current"] == 3 for e in got), [e["route"] for e in got]

    sump = Collected(take, f"asya-{ns}-x-sump")
    failed = wait_for("the bad envelope in x-sump", lambda: sump.at_least(1), timeout=POD_TIMEOUT, interval=1.0)
    assert [e["id"] for e in failed] == ["bad-1"]
    err = failed[0]["headers"]["x-asya-error"]
    assert err["type"] == "ValueError" and "non-empty 'text'" in err["message"], err
    assert "/app/pipeline.py" in err["traceback"] and "in check" in err["traceback"], err
    assert failed[0]["headers"]["trace_id"] == trace


def deployment_replicas(ns: str, name: str) -> int | None:
    d = get("deployment", ns, name)
    return d["spec"].get("replicas") if d else None


@pytest.mark.parametrize("transport", ["rabbitmq", "sqs"])
def test_keda_scales_an_actor_from_zero_and_back(namespace, transport):
    """minReplicaCount 0: no pods; a burst brings pods up in proportion to queueLength (KEDA
    for 0 -> 1, the HPA on KEDA's external metric beyond), every envelope is processed, and
    the pods go back to zero after the cooldown; status tells the last scale."""
    ns = namespace
    send, take = TRANSPORTS[transport]
    apply_on_node(ns, "burst", {"transport": transport, "image": EXAMPLES_IMAGE, "imagePullPolicy": "IfNotPresent",
                                "handler": "testing.act",
                                "scaling": {"enabled": True, "minReplicaCount": 0, "maxReplicaCount": 3, "queueLength": 2,
                                            "pollingInterval": 1, "cooldownPeriod": 10}})
    wait_for("the ScaledObject ready", lambda: any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in (get("scaledobject", ns, "burst") or {}).get("status", {}).get("conditions", [])),
        timeout=POD_TIMEOUT, interval=1.0)
    wait_for("zero replicas before any work", lambda: deployment_replicas(ns, "burst") == 0, timeout=60)
    # The Deployment's first pod (made before KEDA took over) goes away.
    wait_for("no pods before any work", lambda: pods(ns, "burst") == [], timeout=POD_TIMEOUT, interval=1.0)
    wait_for("phase Napping at zero", lambda: status(ns, "burst").get("phase") == "Napping", timeout=60, interval=1.0)

    route = {"actors": ["burst"], "current": 0}
    for i in range(12):
        send(f"asya-{ns}-burst", {"id": f"b{i}", "route": route, "headers": {},
                                  "payload": {"do": "sleep", "seconds": 2, "i": i}})
    # 12 queued at 2 per pod: the maximum, 3 pods, all running the examples image.
    wait_for("3 replicas for 12 queued envelopes", lambda: deployment_replicas(ns, "burst") == 3,
             timeout=POD_TIMEOUT, interval=1.0)
    wait_running(ns, "burst", count=2)

    sink = Collected(take, f"asya-{ns}-x-sink")
    got = wait_for("all 12 processed", lambda: sink.at_least(12), timeout=POD_TIMEOUT, interval=1.0)
    assert sorted(e["payload"]["i"] for e in got) == list(range(12))
    st = status(ns, "burst")
    assert st.get("lastScaleTime") and st.get("lastScale"), st

    wait_for("back to zero replicas after the cooldown", lambda: deployment_replicas(ns, "burst") == 0,
             timeout=POD_TIMEOUT, interval=1.0)
    wait_for("no pods left", lambda: pods(ns, "burst") == [], timeout=POD_TIMEOUT, interval=1.0)
    wait_for("phase Napping again", lambda: status(ns, "burst").get("phase") == "Napping", timeout=120, interval=1.0)


def test_an_image_that_was_never_loaded_fails_to_pull_without_leaving_the_machine(namespace):
    """The test node asks no registry: containerd sends every well-known registry to a closed
    port on loopback, so the pull fails at once and says where it tried."""
    ns = namespace
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "nopull", "namespace": ns},
           "spec": {"tolerations": ON_TEST_NODE, "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": "ghcr.io/asya-rs/does-not-exist:1"}]}}
    kubectl("apply", "-f", "-", input=json.dumps(pod))

    def pull_failed():
        ev = kubectl_json("get", "events", "-n", ns, "--field-selector", "involvedObject.name=nopull")["items"]
        return [e["message"] for e in ev if e["reason"] == "Failed" and "127.0.0.1:9" in e["message"]]

    msgs = wait_for("the pull to fail against the loopback registry", pull_failed, timeout=120, interval=1.0)
    assert "does-not-exist" in msgs[0], msgs
