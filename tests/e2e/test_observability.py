"""Observability against real servers (docs/observability.md): the test Prometheus of
tests/services discovers the actors' sidecars through the chart's own relabelling (its
asya-actors job is the docs' scrape config, which tests/monitoring keeps equal to the chart's
PodMonitor), its counters equal the envelopes sent through a three-actor pipeline, every
dashboard query returns data, and the chart's alerts (rendered with test-sized durations)
fire and resolve: failure ratio, broker disconnected, and "actor stuck" for an actor with
zero pods. The API server validates the chart's monitors against the Prometheus Operator's
CRDs. Traces across hops are tests/e2e/test_tracing.py's."""

from __future__ import annotations

import copy
import json
import os
import uuid

import pytest

from asya_e2e.actors import EXAMPLES_IMAGE, POD_TIMEOUT, apply_on_node, pods, wait_running
from asya_e2e.brokers import Collected, rabbit_send, rabbit_stopped, rabbit_take
from asya_e2e.kube import CommandError, keda_running, kubectl
from asya_e2e.observability import (
    alerts, chart_monitors_accepted, dashboard_queries, firing, install_monitoring_crds, query,
    release_has_gateway, render_chart, start_with_chart_rules, targets, value,
)
from asya_e2e.wait import wait_for

pytestmark = [
    pytest.mark.skipif(os.environ.get("ASYA_TEST_NODE", "1") == "0",
                       reason="ASYA_TEST_NODE=0: the test cluster runs without a node"),
    # One worker (tests/e2e/conftest.py): the `prometheus` fixture restarts the test Prometheus,
    # which a second worker's copy would do under this module's queries; every alert and
    # counter asserted is scoped to the test's own namespace and actor, so other modules'
    # tests may run beside it.
    pytest.mark.xdist_group("observability"),
]

HANDLERS = {"validate": "pipeline.Validator.check", "split": "pipeline.split", "shout": "pipeline.shout"}
GOOD, BAD = 4, 1
# Scrape and rule evaluation every 5 s (tests/services/prometheus.yml); a rate needs two scrapes.
PROM_TIMEOUT = 120
# Dashboard queries over counters that have a series only once their event happened.
NEEDS_AN_EVENT = {
    "Provisioner reconcile errors by kind": "a failed reconcile",
    "Gateway requests refused": "a refused gateway request",
}
# KEDA's operator metrics are KEDA's to export; the test Prometheus does not scrape KEDA.
NOT_SCRAPED_HERE = {"KEDA's value"}


@pytest.fixture(scope="module")
def prometheus():
    """The test Prometheus with the chart's rules and the local components' addresses."""
    return start_with_chart_rules()


def _new_namespace() -> str:
    ns = f"e2e-obs-{uuid.uuid4().hex[:8]}"
    kubectl("create", "namespace", ns)
    wait_for(f"service account in {ns}", lambda: kubectl("get", "sa", "default", "-n", ns, check=False).returncode == 0)
    return ns


def _deploy(ns: str, names) -> None:
    for name in names:
        apply_on_node(ns, name, {"transport": "rabbitmq", "image": EXAMPLES_IMAGE, "imagePullPolicy": "IfNotPresent",
                                 "handler": HANDLERS[name], "scaling": {"enabled": False}, "replicas": 1})
    for name in names:
        wait_running(ns, name)


def _envelope(route: list[str], text: str) -> dict:
    return {"id": f"obs-{uuid.uuid4().hex[:8]}", "route": {"actors": route, "current": 0},
            "headers": {}, "payload": {"text": text}}


@pytest.fixture(scope="module")
def pipeline(prometheus):
    """validate -> split (fan-out to three) -> shout on RabbitMQ, GOOD envelopes of three words
    through to x-sink and BAD ones to x-sump. Yields the namespace."""
    ns = _new_namespace()
    try:
        _deploy(ns, HANDLERS)
        for _ in range(GOOD):
            rabbit_send(f"asya-{ns}-validate", _envelope(list(HANDLERS), "one two three"))
        for _ in range(BAD):
            rabbit_send(f"asya-{ns}-validate", _envelope(list(HANDLERS), "   "))
        sink = Collected(rabbit_take, f"asya-{ns}-x-sink")
        wait_for("the results in x-sink", lambda: sink.at_least(3 * GOOD), timeout=POD_TIMEOUT, interval=1.0)
        sump = Collected(rabbit_take, f"asya-{ns}-x-sump")
        wait_for("the bad envelopes in x-sump", lambda: sump.at_least(BAD), timeout=POD_TIMEOUT, interval=1.0)
        yield ns
    finally:
        kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_the_api_server_validates_the_chart_monitors(namespace):
    install_monitoring_crds()
    assert sorted(chart_monitors_accepted(namespace)) == ["PodMonitor", "PrometheusRule", "ServiceMonitor"]
    # The validation is real: a relabel action the CRD does not know is refused.
    (pm,) = [d for d in render_chart("--set", "monitoring.podMonitor.enabled=true") if d["kind"] == "PodMonitor"]
    broken = copy.deepcopy(pm)
    broken["metadata"]["namespace"] = namespace
    broken["spec"]["podMetricsEndpoints"][0]["relabelings"][0]["action"] = "explode"
    with pytest.raises(CommandError, match="explode"):
        kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(broken))


def test_prometheus_discovers_the_sidecars_through_the_chart_relabelling(pipeline):
    ns = pipeline

    def ours():
        t = [x for x in targets("asya-actors") if x["labels"].get("namespace") == ns and x["health"] == "up"]
        return len(t) == len(HANDLERS) and t

    found = wait_for(f"{len(HANDLERS)} sidecar targets of {ns} up", ours, timeout=PROM_TIMEOUT, interval=1.0)
    assert sorted(t["labels"]["actor"] for t in found) == sorted(HANDLERS)
    for t in found:
        d = t["discoveredLabels"]
        assert d["__meta_kubernetes_pod_container_name"] == "asya-sidecar", d
        assert d["__meta_kubernetes_pod_container_port_name"] == "metrics", d
        # Native sidecars are init containers: discovery lists them too.
        assert d["__meta_kubernetes_pod_container_init"] == "true", d
        assert t["labels"]["pod"].startswith(t["labels"]["actor"]), t["labels"]


def test_counters_in_prometheus_equal_the_envelopes_sent(pipeline):
    ns = pipeline
    expected = {("validate", "success"): GOOD, ("split", "success"): GOOD, ("shout", "success"): 3 * GOOD}
    for (actor, status), n in expected.items():
        expr = f'sum(asya_actor_messages_processed_total{{namespace="{ns}",actor="{actor}",status="{status}"}})'
        wait_for(f"{expr} == {n}", lambda e=expr, n=n: value(e) == n, timeout=PROM_TIMEOUT, interval=1.0)
    failed = f'sum(asya_actor_messages_failed_total{{namespace="{ns}",actor="validate"}})'
    wait_for(f"{failed} == {BAD}", lambda: value(failed) == BAD, timeout=PROM_TIMEOUT, interval=1.0)
    sent = f'sum(asya_actor_messages_sent_total{{namespace="{ns}",destination="asya-{ns}-x-sink"}})'
    assert value(sent) == 3 * GOOD


def test_every_dashboard_query_returns_data(pipeline):
    ns = pipeline
    gateway = release_has_gateway()
    checked = 0
    for dashboard, panel, expr in dashboard_queries(ns):
        if panel in NEEDS_AN_EVENT or panel in NOT_SCRAPED_HERE:
            continue
        if panel.startswith("Gateway") and not gateway:
            continue
        wait_for(f"data for {dashboard} / {panel}: {expr}", lambda e=expr: query(e), timeout=PROM_TIMEOUT, interval=1.0)
        checked += 1
    assert checked >= 15, checked


def test_failure_ratio_alert_fires_then_resolves(pipeline):
    ns = pipeline
    for _ in range(2):
        rabbit_send(f"asya-{ns}-validate", _envelope(list(HANDLERS), "   "))
    wait_for("AsyaActorFailureRatioHigh firing for validate",
             lambda: firing("AsyaActorFailureRatioHigh", namespace=ns, actor="validate"), timeout=PROM_TIMEOUT, interval=1.0)
    # With no failure in the window (30 s here) the ratio falls under the threshold.
    wait_for("AsyaActorFailureRatioHigh resolved",
             lambda: not alerts("AsyaActorFailureRatioHigh", namespace=ns, actor="validate"), timeout=180, interval=1.0)


@pytest.mark.skipif(os.environ.get("ASYA_TEST_KEDA", "1") == "0", reason="ASYA_TEST_KEDA=0: no KEDA")
def test_actor_stuck_fires_for_an_actor_with_zero_pods(namespace, prometheus):
    """KEDA keeps the actor at zero pods (it looks at the queue once an hour), messages wait:
    only the provisioner's gauges see them, and AsyaActorStuck fires."""
    if not keda_running():
        pytest.skip("KEDA is not running in the test cluster")
    ns = namespace
    apply_on_node(ns, "idle", {"transport": "rabbitmq", "image": EXAMPLES_IMAGE, "imagePullPolicy": "IfNotPresent",
                               "handler": HANDLERS["shout"],
                               "scaling": {"enabled": True, "minReplicaCount": 0, "maxReplicaCount": 1,
                                           "pollingInterval": 3600}})
    wait_for("the idle actor's queue", lambda: kubectl("get", "asyncactor", "idle", "-n", ns, "-o",
                                                         "jsonpath={.status.queueUrl}").stdout, timeout=POD_TIMEOUT)
    wait_for("no pod of the idle actor", lambda: not pods(ns, "idle"), timeout=POD_TIMEOUT, interval=1.0)
    for _ in range(3):
        rabbit_send(f"asya-{ns}-idle", _envelope(["idle"], "wait"))
    gauge = f'asya_provisioner_actor_messages_queued{{namespace="{ns}",actor="idle"}}'
    # Every reconcile sets the gauges from the depth it reads. Unasked, the provisioner looks
    # at an idle actor every 60-75 s (queue-provisioner's unit tests pin it, and
    # test_provisioner.py's status test the 15-20 s of one with messages); an annotation asks
    # for a reconcile now. It changes no object KEDA reads, so KEDA still looks only hourly.
    poke = iter(range(10**6))

    def queued_three():
        kubectl("annotate", "--overwrite", "asyncactor", "idle", "-n", ns, f"e2e.asya.sh/poke={next(poke)}")
        return value(f"max({gauge})") == 3

    wait_for(f"{gauge} == 3", queued_three, timeout=240, interval=2.0)
    wait_for("AsyaActorStuck firing for idle", lambda: firing("AsyaActorStuck", namespace=ns, actor="idle"),
             timeout=PROM_TIMEOUT, interval=1.0)
    assert not pods(ns, "idle")


@pytest.mark.disruptive
def test_broker_disconnected_alert_fires_then_resolves(namespace, prometheus):
    ns = namespace
    _deploy(ns, ["validate"])
    up = f'max(asya_actor_transport_up{{namespace="{ns}",actor="validate"}})'
    wait_for(f"{up} == 1 in Prometheus", lambda: value(up) == 1, timeout=PROM_TIMEOUT, interval=1.0)
    with rabbit_stopped():
        wait_for("AsyaBrokerDisconnected firing", lambda: firing("AsyaBrokerDisconnected", namespace=ns, actor="validate"),
                 timeout=PROM_TIMEOUT, interval=1.0)
    wait_for("AsyaBrokerDisconnected resolved",
             lambda: not alerts("AsyaBrokerDisconnected", namespace=ns, actor="validate"), timeout=PROM_TIMEOUT, interval=1.0)
