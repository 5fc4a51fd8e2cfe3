"""AsyncActors and their pods: documents to apply, and waits on what the provisioner and the
node make of them."""

from __future__ import annotations

from asya_e2e.kube import apply, kubectl, kubectl_json, status
from asya_e2e.wait import wait_for

EXAMPLES_IMAGE = "localhost/asya-rs/asya-examples:dev"
NODE = "asya-test-node"
# The test node is dedicated (tests/cluster/node.go): pods that should run there say so.
ON_TEST_NODE = [{"key": "asya.sh/test-node", "operator": "Exists", "effect": "NoSchedule"}]
# Pod start on this 2-core machine shares the cores with everything else the suite runs.
POD_TIMEOUT = 180


def actor(name: str, spec: dict, labels: dict | None = None) -> dict:
    """An AsyncActor document (no namespace: `apply` sets it)."""
    meta = {"name": name}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "asya.sh/v1alpha1", "kind": "AsyncActor", "metadata": meta, "spec": spec}


# A flat-shape spec that needs nothing from the node (the provisioner's tests).
FLAT = {"image": "python:3.12-slim", "handler": "handlers.pipeline.double"}


def apply_on_node(ns: str, name: str, spec: dict) -> None:
    """Applies the AsyncActor `name` with `spec`, its pods tolerating the dedicated test node."""
    apply(ns, actor(name, {"tolerations": ON_TEST_NODE, **spec}))


def pods(ns: str, actor: str) -> list[dict]:
    return kubectl_json("get", "pods", "-n", ns, "-l", f"asya.sh/actor={actor}")["items"]


def running_ready(pod: dict) -> bool:
    st = pod.get("status", {})
    return st.get("phase") == "Running" and any(
        c["type"] == "Ready" and c["status"] == "True" for c in st.get("conditions", []))


def pod_story(ns: str) -> str:
    """What went wrong, for a failed wait: pods, their container states, recent events."""
    out = kubectl("get", "pods", "-n", ns, "-o", "wide", check=False).stdout
    events = kubectl("get", "events", "-n", ns, "--sort-by=.lastTimestamp", check=False).stdout
    return f"{out}\n{events[-4000:]}"


def wait_running(ns: str, actor: str, count: int = 1) -> list[dict]:
    try:
        return wait_for(f"{count} running, ready pod(s) of {ns}/{actor}",
                        lambda: (p := [x for x in pods(ns, actor) if running_ready(x)]) and len(p) >= count and p,
                        timeout=POD_TIMEOUT, interval=1.0)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{pod_story(ns)}") from None


def phase_is(ns, name, *phases):
    return lambda: status(ns, name).get("phase") in phases and status(ns, name)
