"""The test cluster's nodes (tests/cluster/nodes.sh): which are Ready, and the extra nodes'
crash and restart (tests/cluster/extra-node), for the high-availability tests."""

from __future__ import annotations

from asya_e2e.env import ROOT
from asya_e2e.kube import kubectl_json, run

EXTRA_NODE = ROOT / "tests" / "cluster" / "extra-node"


def node_name(i: int) -> str:
    return "asya-test-node" if i == 0 else f"asya-test-node-{i}"


def ready_nodes() -> list[str]:
    return sorted(n["metadata"]["name"] for n in kubectl_json("get", "nodes")["items"]
                  if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", [])))


def crash(i: int) -> None:
    """Node I's kubelet, containerd, shims and containers killed at once (SIGKILL)."""
    run([EXTRA_NODE, "crash", i])


def start(i: int) -> None:
    """Node I back (after a crash: cleaned up as a reboot would); returns once it is Ready."""
    run([EXTRA_NODE, "start", i], timeout=300)


def node_of(pod: dict) -> str:
    return pod.get("spec", {}).get("nodeName", "")
