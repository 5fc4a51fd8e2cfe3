"""Fixtures and hooks of the end-to-end suite (run by tests/e2e/run after tests/e2e/up); the
helpers the tests share are in the package asya_e2e beside this file.

Every test talks to the real test cluster through target/test-cluster/bin/{kubectl,helm};
nothing here is a stand-in for a server. `wait_for` polls a condition with a deadline: no test
sleeps in place of waiting.

Tests marked `disruptive` stop a shared service (the webhook, the broker, the provisioner) and
restore it before they end, pass or fail; they always run, after every other test, so the rest
of the suite never sees the outage. `-m "not disruptive"` leaves them out.

Tests marked `nodes` need a cluster of several nodes and may crash one: tests/e2e/run runs
them last, in a phase of their own, after bringing up the extra node (`--e2e-phase=nodes`).

Phases (tests/e2e/run): every other test may share the cluster with other tests running at the
same time, in pytest-xdist workers (`--e2e-phase=shared`); tests marked `alone` (they measure
cluster-wide counters or timings, or load the shared provisioner enough to slow every other
test's waits) and the disruptive ones run after that, one at a time (`--e2e-phase=alone`).
Each marker says why where it is put. A module whose module-scoped fixture builds something
its tests share (actors, Prometheus' rules) keeps its tests on one worker with
`xdist_group`, so the fixture runs once; under xdist every worker has its own session, so no
fixture may assume it is the only one (every name a test makes is unique: a fresh uuid).
"""

from __future__ import annotations

import os
import uuid

import pytest

from asya_e2e.env import KUBECONFIG, KUBECTL
from asya_e2e.kube import kubectl
from asya_e2e.wait import wait_for


PHASES = ("all", "shared", "alone", "single", "nodes")


def pytest_addoption(parser):
    parser.addoption("--e2e-phase", choices=PHASES, default="all",
                     help="shared: only the tests that may run beside others (tests/e2e/run runs them in "
                          "pytest-xdist workers); alone: only those marked alone or disruptive; single: both; "
                          "nodes: only those marked nodes (a cluster of several nodes); all (default): every test")


def pytest_configure(config):
    config.addinivalue_line("markers", "disruptive: stops a shared service and restores it; runs after every other test")
    config.addinivalue_line("markers", "alone: must not share the cluster with another test (runs serially, "
                                       "after the shared phase, before the disruptive tests)")
    config.addinivalue_line("markers", "uses_actors(*keys): the actors a test of test_node_failures.py uses")
    config.addinivalue_line("markers", "nodes: needs a cluster of several nodes (ASYA_TEST_NODES=2) and may crash one; "
                                       "runs in tests/e2e/run's last phase, one at a time")
    # pytest-xdist registers it too; without xdist (ASYA_E2E_WORKERS=1) it is only a label.
    config.addinivalue_line("markers", "xdist_group(name): tests that run on one xdist worker")


# Under CI (`make test` sets it, as `make unit` does for the Rust tests) a test that would skip
# because a server, a module or a component is missing fails instead: CI never passes by
# skipping. Local runs keep the skips, with their reasons printed (tests/e2e/run passes -rs).
REQUIRE = os.environ.get("ASYA_REQUIRE_SERVICES") == "1"


def skip_reason(longrepr) -> str:
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def as_failure(rep) -> None:
    rep.outcome = "failed"
    rep.longrepr = ("skipped under CI (ASYA_REQUIRE_SERVICES=1), where a missing server, module "
                    f"or component is a failure: {skip_reason(rep.longrepr)}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if REQUIRE and rep.skipped and not hasattr(rep, "wasxfail"):
        as_failure(rep)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    # A module skipped whole at import (`pytest.importorskip`).
    outcome = yield
    rep = outcome.get_result()
    if REQUIRE and rep.skipped:
        as_failure(rep)


def runs_alone(item) -> bool:
    return any(item.get_closest_marker(m) is not None for m in ("alone", "disruptive"))


def in_phase(item, phase: str) -> bool:
    needs_nodes = item.get_closest_marker("nodes") is not None
    if phase == "all":
        return True
    if phase == "nodes":
        return needs_nodes
    if needs_nodes:
        return False
    return phase == "single" or runs_alone(item) == (phase == "alone")


def group_in_node_ids(items) -> None:
    """pytest-xdist's `--dist loadgroup` tells its scheduler a test's group by appending it to
    the test's node id (`id@group`), through a field pytest 9.2 no longer reads: there the
    groups are silently ignored and a group's tests spread over the workers (pytest-xdist
    issue 1386; its fix, pending, sets pytest's structured id instead). This does the same.
    Only on an xdist worker of such a pytest, and only where xdist's own suffix is missing."""
    try:
        from _pytest.nodeid import NodeId
    except ImportError:  # an older pytest: xdist's own suffix works
        return
    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        if names and "@" not in item.nodeid and hasattr(item, "_id"):
            item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(names)}")


def pytest_collection_modifyitems(session, config, items):
    if getattr(config.option, "loadgroup", False):
        group_in_node_ids(items)
    phase = config.getoption("--e2e-phase")
    if phase != "all":
        keep = [i for i in items if in_phase(i, phase)]
        dropped = [i for i in items if not in_phase(i, phase)]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = keep
    # Stable: the alone tests after the shared ones, the disruptive tests after them, the
    # multi-node ones last, each keeping its relative order.
    items.sort(key=lambda item: (item.get_closest_marker("nodes") is not None,
                                 item.get_closest_marker("disruptive") is not None,
                                 item.get_closest_marker("alone") is not None))


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
