"""Fixtures and hooks of the end-to-end suite (run by tests/e2e/run after tests/e2e/up); the
helpers the tests share are in the package asya_e2e beside this file.

Every test talks to the real test cluster through target/test-cluster/bin/{kubectl,helm};
nothing here is a stand-in for a server. `wait_for` polls a condition with a deadline: no test
sleeps in place of waiting.

Tests marked `disruptive` stop a shared service (the webhook, the broker, the provisioner) and
restore it before they end, pass or fail; they always run, after every other test, so the rest
of the suite never sees the outage. `-m "not disruptive"` leaves them out.
"""

from __future__ import annotations

import uuid

import pytest

from asya_e2e.env import KUBECONFIG, KUBECTL
from asya_e2e.kube import kubectl
from asya_e2e.wait import wait_for


def pytest_configure(config):
    config.addinivalue_line("markers", "disruptive: stops a shared service and restores it; runs after every other test")
    config.addinivalue_line("markers", "uses_actors(*keys): the actors a test of test_node_failures.py uses")


def pytest_collection_modifyitems(session, config, items):
    # Stable: the disruptive tests keep their relative order, after all the others.
    items.sort(key=lambda item: item.get_closest_marker("disruptive") is not None)


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
