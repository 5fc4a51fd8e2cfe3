"""Shared helpers for the end-to-end suite (run by tests/e2e/run after tests/e2e/up).

Every test talks to the real test cluster through target/test-cluster/bin/{kubectl,helm};
nothing here is a stand-in for a server. `wait_for` polls a condition with a deadline: no test
sleeps in place of waiting.

Tests marked `disruptive` stop a shared service (the webhook, the broker, the provisioner) and
restore it before they end, pass or fail; they always run, after every other test, so the rest
of the suite never sees the outage. `-m "not disruptive"` leaves them out.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "target" / "test-cluster"
KUBECONFIG = Path(os.environ.get("KUBECONFIG", CLUSTER / "kubeconfig"))
KUBECTL = Path(os.environ.get("ASYA_TEST_KUBECTL", CLUSTER / "bin" / "kubectl"))
HELM = Path(os.environ.get("ASYA_TEST_HELM", CLUSTER / "bin" / "helm"))
CHART = ROOT / "deploy" / "chart"
CRDS = ROOT / "deploy" / "crds"
STATE = CLUSTER / "e2e"


def bin_dir() -> str:
    """The binaries of the profile `make` built (ASYA_BIN_DIR: ci under `make test`), else dev's."""
    target = os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/asya-rs/target"))
    return os.environ.get("ASYA_BIN_DIR") or os.path.join(target, "debug")


class CommandError(AssertionError):
    pass


def run(args, *, check=True, input=None, timeout=120, env=None):
    """Runs a command; returns CompletedProcess with text stdout/stderr."""
    full_env = dict(os.environ, KUBECONFIG=str(KUBECONFIG))
    if env:
        full_env.update(env)
    p = subprocess.run(
        [str(a) for a in args],
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )
    if check and p.returncode != 0:
        raise CommandError(
            f"command failed ({p.returncode}): {' '.join(map(str, args))}\n"
            f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}"
        )
    return p


def kubectl(*args, **kw):
    return run([KUBECTL, "--kubeconfig", KUBECONFIG, *args], **kw)


def kubectl_json(*args, **kw):
    return json.loads(kubectl(*args, "-o", "json", **kw).stdout)


def helm(*args, **kw):
    return run([HELM, "--kubeconfig", KUBECONFIG, *args], **kw)


def wait_for(what, fn, timeout=60.0, interval=0.2):
    """Polls fn until it returns a truthy value; fails naming `what` and the last result."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            last = fn()
            if last:
                return last
        except CommandError as e:  # not there yet
            last = e
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last}")
        time.sleep(interval)


def crds_generated() -> bool:
    return any(CRDS.glob("*.yaml"))


def webhook_enabled() -> bool:
    f = CLUSTER / "e2e" / "webhook-enabled"
    return f.exists() and f.read_text().strip() == "1"


def keda_running() -> bool:
    """KEDA's operator runs in the test cluster (tests/cluster/up with the node, unless
    ASYA_TEST_KEDA=0): its HPAs really scale the workloads the provisioner renders."""
    out = run([KUBECTL, "get", "apiservice", "v1beta1.external.metrics.k8s.io", "-o",
               "jsonpath={.status.conditions[?(@.type=='Available')].status}"], check=False)
    return out.returncode == 0 and out.stdout.strip() == "True"


def cluster_config() -> dict:
    """The cluster configuration the chart renders for the e2e values (tests/e2e/up)."""
    import yaml

    return yaml.safe_load((STATE / "config.yaml").read_text())


def pytest_configure(config):
    config.addinivalue_line("markers", "disruptive: stops a shared service and restores it; runs after every other test")
    config.addinivalue_line("markers", "uses_actors(*keys): the actors a test of test_node_failures.py uses")


def pytest_collection_modifyitems(session, config, items):
    # Stable: the disruptive tests keep their relative order, after all the others.
    items.sort(key=lambda item: item.get_closest_marker("disruptive") is not None)


def e2e_up():
    """tests/e2e/up: (re)starts whatever of the environment is not running (idempotent)."""
    run([ROOT / "tests" / "e2e" / "up"], timeout=600)


RELEASE, RELEASE_NS = "asya", "asya-system"


def components_in_pods() -> bool:
    """The webhook and the provisioner run as the chart's pods (tests/e2e/up with the test
    node), not as local processes."""
    f = STATE / "mode"
    return f.exists() and f.read_text().strip() == "pods"


def provisioner_url() -> str:
    """The provisioner's HTTP endpoint (readyz, metrics): its pod's address, or the local
    process's port; tests/e2e/up writes it each time it (re)starts the provisioner."""
    return (STATE / "provisioner-url").read_text().strip()


def component_log(name: str) -> str:
    """What the webhook or provisioner NAME has logged since it last started."""
    if components_in_pods():
        return kubectl("logs", "-n", RELEASE_NS, f"deployment/{RELEASE}-{name}", "--tail=-1").stdout
    return (STATE / f"{name}.log").read_text()


def pid_alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


BINARIES = {"webhook": "asya-webhook", "provisioner": "asya-queue-provisioner"}


def component_pid(name: str) -> int:
    """The host pid of the webhook or provisioner NAME (a pod's process is one of this
    machine's too): for CPU and memory figures."""
    if not components_in_pods():
        return int((STATE / f"{name}.pid").read_text().strip())
    found = []
    for d in Path("/proc").iterdir():
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone, or not a process
            continue
        if argv and Path(argv[0].decode(errors="replace")).name == BINARIES[name] and \
                b"--config=/etc/asya/config.yaml" in argv:
            found.append(int(d.name))
    assert len(found) == 1, f"expected one {name} pod process, found {found}"
    return found[0]


def _pods_of(name: str) -> list[dict]:
    return kubectl_json("get", "pods", "-n", RELEASE_NS, "-l",
                        f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component={name}")["items"]


def stop_component(name: str, sig=signal.SIGTERM) -> None:
    """Stops the webhook or provisioner NAME: the local process by SIG, or the chart's pods by
    scaling the Deployment to zero (SIGKILL: the pods are deleted without a grace period, so
    nothing shuts down cleanly and a held lease stays held until it expires)."""
    if not components_in_pods():
        pid = int((STATE / f"{name}.pid").read_text().strip())
        os.kill(pid, sig)
        wait_for(f"the {name} to stop", lambda: not pid_alive(pid), timeout=20)
        return
    kubectl("scale", "deployment", f"{RELEASE}-{name}", "-n", RELEASE_NS, "--replicas=0")
    if sig == signal.SIGKILL:
        for p in _pods_of(name):
            kubectl("delete", "pod", p["metadata"]["name"], "-n", RELEASE_NS, "--grace-period=0", "--force",
                    "--wait=false", check=False)
    wait_for(f"the {name}'s pods to stop", lambda: not _pods_of(name), timeout=60)


@contextmanager
def process_stopped(name: str, sig=signal.SIGTERM):
    """The webhook or provisioner NAME is stopped inside the block and started again by
    tests/e2e/up when the block ends, however it ends."""
    try:
        yield stop_component(name, sig)
    finally:
        e2e_up()


@pytest.fixture(scope="session", autouse=True)
def _cluster_is_up():
    if not KUBECONFIG.exists() or not KUBECTL.exists():
        pytest.exit("the test cluster is not up: run tests/e2e/up (or tests/e2e/run)", returncode=2)


@pytest.fixture
def namespace():
    """A fresh namespace, deleted after the test (deletion is not waited for)."""
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    kubectl("create", "namespace", name)
    wait_for(f"service account in {name}", lambda: kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0)
    yield name
    kubectl("delete", "namespace", name, "--wait=false", check=False)
