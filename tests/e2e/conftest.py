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


def pytest_configure(config):
    config.addinivalue_line("markers", "disruptive: stops a shared service and restores it; runs after every other test")


def pytest_collection_modifyitems(session, config, items):
    # Stable: the disruptive tests keep their relative order, after all the others.
    items.sort(key=lambda item: item.get_closest_marker("disruptive") is not None)


def e2e_up():
    """tests/e2e/up: (re)starts whatever of the environment is not running (idempotent)."""
    run([ROOT / "tests" / "e2e" / "up"], timeout=600)


def pid_alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def stop_process(name: str, sig=signal.SIGTERM) -> int:
    """Stops the local process NAME started by tests/e2e/up (webhook, provisioner); returns its pid."""
    pid = int((STATE / f"{name}.pid").read_text().strip())
    os.kill(pid, sig)
    wait_for(f"the {name} to stop", lambda: not pid_alive(pid), timeout=20)
    return pid


@contextmanager
def process_stopped(name: str, sig=signal.SIGTERM):
    """The local process NAME is stopped inside the block and started again by tests/e2e/up
    when the block ends, however it ends."""
    try:
        yield stop_process(name, sig)
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
