"""Where things are: the repository, the test cluster's files and tools, and what
tests/e2e/up wrote about the environment it brought up (target/test-cluster/e2e)."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CLUSTER = ROOT / "target" / "test-cluster"
KUBECONFIG = Path(os.environ.get("KUBECONFIG", CLUSTER / "kubeconfig"))
KUBECTL = Path(os.environ.get("ASYA_TEST_KUBECTL", CLUSTER / "bin" / "kubectl"))
HELM = Path(os.environ.get("ASYA_TEST_HELM", CLUSTER / "bin" / "helm"))
CHART = ROOT / "deploy" / "chart"
CRDS = ROOT / "deploy" / "crds"
STATE = CLUSTER / "e2e"
# The chart's release as tests/e2e/up installs it.
RELEASE, RELEASE_NS = "asya", "asya-system"


def bin_dir() -> str:
    """The binaries of the profile `make` built (ASYA_BIN_DIR: ci under `make test`), else dev's."""
    target = os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/asya-rs/target"))
    return os.environ.get("ASYA_BIN_DIR") or os.path.join(target, "debug")


def crds_generated() -> bool:
    return any(CRDS.glob("*.yaml"))


def webhook_enabled() -> bool:
    f = CLUSTER / "e2e" / "webhook-enabled"
    return f.exists() and f.read_text().strip() == "1"


def cluster_config() -> dict:
    """The cluster configuration the chart renders for the e2e values (tests/e2e/up)."""
    import yaml

    return yaml.safe_load((STATE / "config.yaml").read_text())


def components_in_pods() -> bool:
    """The webhook and the provisioner run as the chart's pods (tests/e2e/up with the test
    node), not as local processes."""
    f = STATE / "mode"
    return f.exists() and f.read_text().strip() == "pods"


def provisioner_url() -> str:
    """The provisioner's HTTP endpoint (readyz, metrics): its pod's address, or the local
    process's port; tests/e2e/up writes it each time it (re)starts the provisioner."""
    return (STATE / "provisioner-url").read_text().strip()
