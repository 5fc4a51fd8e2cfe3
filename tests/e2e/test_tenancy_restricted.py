"""Actors run in a namespace that enforces Pod Security "restricted" (issue 26, finding 4;
docs/DESIGN.md §5 and §9).

The API server's own PodSecurity admission plugin is the judge: it is on by default in
kube-apiserver, and tests/cluster's `--enable-admission-plugins` only adds plugins to the
defaults. A ReplicaSet whose pod it refuses gets no pod at all (only a FailedCreate event), so
a running pod of the actor in such a namespace is the proof that the pod, as the webhook
injected it, passed. A first test shows the plugin really enforces in the namespace, so the
second one cannot pass because nothing was checked."""

from __future__ import annotations

import json
import os
import uuid

import pytest

from asya_e2e.actors import EXAMPLES_IMAGE, ON_TEST_NODE, POD_TIMEOUT, apply_on_node, wait_running
from asya_e2e.brokers import TRANSPORTS, Collected
from asya_e2e.kube import kubectl, kubectl_json
from asya_e2e.wait import wait_for

RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}
# Every container of a restricted pod (the Pod Security Standards, level restricted).
CONTAINER_RULES = ("allowPrivilegeEscalation", "capabilities.drop", "runAsNonRoot", "seccompProfile")


@pytest.fixture
def restricted_namespace(namespace):
    kubectl("label", "namespace", namespace, *(f"{k}={v}" for k, v in RESTRICTED.items()))
    return namespace


def bare_pod(ns: str) -> dict:
    """A pod with no security settings, not asking for injection (the webhook never sees it)."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bare", "namespace": ns},
            "spec": {"tolerations": ON_TEST_NODE,
                     "containers": [{"name": "c", "image": EXAMPLES_IMAGE, "imagePullPolicy": "IfNotPresent"}]}}


def unmet(pod_spec: dict) -> list[str]:
    """The restricted rules a running pod's containers do not meet (pod-level settings count
    where the standard lets them)."""
    pod = pod_spec.get("securityContext", {})
    out = []
    for c in pod_spec.get("initContainers", []) + pod_spec["containers"]:
        sc = c.get("securityContext", {})
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{c['name']}: allowPrivilegeEscalation")
        if "ALL" not in sc.get("capabilities", {}).get("drop", []):
            out.append(f"{c['name']}: capabilities.drop")
        if sc.get("runAsNonRoot", pod.get("runAsNonRoot")) is not True:
            out.append(f"{c['name']}: runAsNonRoot")
        seccomp = sc.get("seccompProfile", pod.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{c['name']}: seccompProfile")
    return out


def test_the_api_server_refuses_an_unrestricted_pod_in_the_namespace(restricted_namespace):
    """The control: PodSecurity admission enforces `restricted` here, naming the rules."""
    p = kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(bare_pod(restricted_namespace)),
                check=False)
    assert p.returncode != 0, p.stdout
    assert 'violates PodSecurity "restricted:latest"' in p.stderr, p.stderr
    for rule in ("allowPrivilegeEscalation", "runAsNonRoot", "seccompProfile"):
        assert rule in p.stderr, p.stderr


@pytest.mark.skipif(os.environ.get("ASYA_TEST_NODE", "1") == "0",
                    reason="ASYA_TEST_NODE=0: the test cluster runs without a node")
def test_a_flat_actor_runs_in_a_restricted_namespace_and_its_results_reach_x_sink(restricted_namespace):
    """The examples image as a flat-spec actor: the provisioner's Deployment, with the sidecar
    and the runtime installer injected by the webhook, is admitted under `restricted`, its
    pod runs, and envelopes go through it to x-sink."""
    ns = restricted_namespace
    send, take = TRANSPORTS["rabbitmq"]
    apply_on_node(ns, "shout", {"transport": "rabbitmq", "image": EXAMPLES_IMAGE, "imagePullPolicy": "IfNotPresent",
                                "handler": "pipeline.shout", "scaling": {"enabled": False}, "replicas": 1})
    pod = wait_running(ns, "shout")[0]
    spec = pod["spec"]
    names = [c["name"] for c in spec.get("initContainers", []) + spec["containers"]]
    assert {"asya-sidecar", "asya-install-runtime", "asya-runtime"} <= set(names), names
    assert unmet(spec) == [], unmet(spec)
    # The API server recorded the level it admitted the pod under.
    labels = kubectl_json("get", "namespace", ns)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted", labels

    route = {"actors": ["shout"], "current": 0}
    trace = uuid.uuid4().hex
    words = ["restricted", "still", "works"]
    for i, w in enumerate(words):
        send(f"asya-{ns}-shout", {"id": f"r{i}", "route": route, "headers": {"trace_id": trace},
                                  "payload": {"word": w, "position": i}})
    sink = Collected(take, f"asya-{ns}-x-sink")
    got = wait_for("three results in x-sink", lambda: sink.at_least(3), timeout=POD_TIMEOUT, interval=1.0)
    assert sorted((e["payload"]["position"], e["payload"]["word"]) for e in got) == [
        (i, w.upper()) for i, w in enumerate(words)]
    assert all(e["headers"]["trace_id"] == trace for e in got)

    # Nothing of the actor was refused on the way (a refusal is a FailedCreate event).
    events = kubectl_json("get", "events", "-n", ns)["items"]
    refused = [e["message"] for e in events if "violates PodSecurity" in e.get("message", "")]
    assert refused == [], refused
