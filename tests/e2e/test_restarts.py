"""Restarts under load (issue 35): RabbitMQ restarted (or the SQS server out, paused) while a
pipeline of actors runs with envelopes in flight loses none of them, and the sidecars recover
on their own (no container restarts); the API server restarted leaves the webhook and the
provisioner running (no restarts: a provisioner that loses its Lease meanwhile stands down and
is elected again), and every AsyncActor, applied just before the restart or after it,
converges and gets its injected pod.

The SQS server of the tests (ElasticMQ) keeps its queues in memory, so a restart would empty
them, which SQS never does: its outage is played by pausing the server (SIGSTOP) for
SQS_OUTAGE seconds, an endpoint that stops answering and comes back with its messages.

Marked `disruptive`: each stops a server every other test uses (tests/services' RabbitMQ and
ElasticMQ, the cluster's API server) and brings it back, even when the test fails."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from contextlib import contextmanager

import pytest

from asya_e2e.actors import EXAMPLES_IMAGE, FLAT, actor, apply_on_node, pod_story, pods, wait_running
from asya_e2e.brokers import RABBIT_CTL, TRANSPORTS, rabbit_accepts_connections, sqs
from asya_e2e.env import ROOT
from asya_e2e.kube import apply, kubectl_json
from asya_e2e.provisioner import metric_total, provisioner_metrics
from asya_e2e.wait import wait_for

pytestmark = [pytest.mark.disruptive]

ENVELOPES = 60
RELEASE_NS = "asya-system"


def restarts(ns: str, selector: str) -> dict[str, int]:
    """Every container's restartCount (native sidecars are init containers) of the pods that
    `selector` picks in `ns`, by pod/container."""
    out = {}
    for p in kubectl_json("get", "pods", "-n", ns, "-l", selector)["items"]:
        st = p.get("status", {})
        for c in st.get("containerStatuses", []) + st.get("initContainerStatuses", []):
            out[f"{p['metadata']['name']}/{c['name']}"] = c["restartCount"]
    return out


class Arrivals:
    """Envelopes taken from an end queue, with the time each was seen; a broker that does
    not answer (it is being restarted) is 'nothing yet'."""

    def __init__(self, take, queue: str):
        self.take, self.queue, self.items = take, queue, []

    def poll(self, n: int) -> None:
        try:
            got = self.take(self.queue, max(1, n))
        except OSError:  # the management API is down with the broker
            return
        now = time.monotonic()
        self.items += [(now, e) for e in got]

    def ids(self) -> list[str]:
        return [e["id"] for _, e in self.items]


SQS_CTL = os.environ.get("ASYA_TEST_SQS_CTL", str(ROOT / "tests" / "services" / "elasticmq"))
SQS_OUTAGE = 15


@contextmanager
def rabbitmq_restarted():
    """RabbitMQ stopped cleanly (its connections closed) and started again with its durable
    data; always left running. Yields a dict with `stopped_at` and `back_at` (monotonic)."""
    times = {}
    try:
        times["stopped_at"] = time.monotonic()
        subprocess.run([RABBIT_CTL, "stop"], check=True, timeout=120)
        subprocess.run([RABBIT_CTL, "start"], check=True, timeout=180)
        wait_for("RabbitMQ accepting connections", rabbit_accepts_connections, timeout=60)
        times["back_at"] = time.monotonic()
        yield times
    finally:
        if "back_at" not in times:
            subprocess.run([RABBIT_CTL, "start"], check=False, timeout=180)
            wait_for("RabbitMQ accepting connections", rabbit_accepts_connections, timeout=60)


def sqs_answers() -> bool:
    try:
        sqs().list_queues()
        return True
    except Exception:  # botocore's connection errors
        return False


@contextmanager
def sqs_out():
    """The SQS server paused for SQS_OUTAGE s (requests hang, then time out), then resumed
    with its queues; always resumed. Yields a dict with `stopped_at` and `back_at`."""
    times = {}
    try:
        times["stopped_at"] = time.monotonic()
        subprocess.run([SQS_CTL, "pause"], check=True, timeout=30)
        time.sleep(SQS_OUTAGE)  # the outage itself: nothing to wait for
        subprocess.run([SQS_CTL, "resume"], check=True, timeout=60)
        times["back_at"] = time.monotonic()
        yield times
    finally:
        if "back_at" not in times:
            subprocess.run([SQS_CTL, "resume"], check=False, timeout=60)
        wait_for("the SQS server answering", sqs_answers, timeout=60)


OUTAGES = {"rabbitmq": rabbitmq_restarted, "sqs": sqs_out}


@pytest.mark.parametrize("transport", ["rabbitmq", "sqs"])
def test_broker_outage_under_load_loses_nothing_and_sidecars_recover(namespace, transport):
    """Two actors in a pipeline (first -> second) work through 60 envelopes; once results
    have started to come out, RabbitMQ is stopped and started again (SQS: the server paused,
    then resumed). Every envelope reaches x-sink (none x-sump), the duplicates (envelopes
    redelivered because their ack was lost with the connection, or their visibility timeout
    passed) are counted and printed, no container of the actors' pods restarts (the sidecars
    recover on their own), and the time from the broker's return to the next result is
    printed."""
    tag = f"out-{uuid.uuid4().hex[:4]}"
    spec = {"transport": transport, "image": EXAMPLES_IMAGE, "imagePullPolicy": "IfNotPresent",
            "handler": "testing.act", "scaling": {"enabled": False}, "replicas": 1,
            "resiliency": {"actorTimeout": "20s"}}
    for name in ("first", "second"):
        apply_on_node(namespace, name, spec)
    for name in ("first", "second"):
        wait_running(namespace, name)
    before = restarts(namespace, "asya.sh/actor in (first,second)")

    send, take = TRANSPORTS[transport]
    ids = [f"{tag}-{i}" for i in range(ENVELOPES)]
    for i in ids:
        send(f"asya-{namespace}-first", {"id": i, "route": {"actors": ["first", "second"], "current": 0},
                                         "headers": {}, "payload": {"do": "sleep", "seconds": 0.2}})
    sink = Arrivals(take, f"asya-{namespace}-x-sink")
    sump = Arrivals(take, f"asya-{namespace}-x-sump")
    wait_for("results coming out", lambda: sink.poll(ENVELOPES) or len(sink.items) >= 5, timeout=120, interval=0.3)
    before_restart = len(sink.items)

    with OUTAGES[transport]() as t:
        def all_there():
            sink.poll(ENVELOPES)
            sump.poll(ENVELOPES)
            return set(ids) <= set(sink.ids() + sump.ids())
        try:
            wait_for(f"{ENVELOPES} envelopes in x-sink or x-sump", all_there, timeout=180, interval=0.5)
        except AssertionError as e:
            seen = set(sink.ids() + sump.ids())
            raise AssertionError(f"{e}\nmissing: {sorted(set(ids) - seen)}\n{pod_story(namespace)}") from None
    sump.poll(ENVELOPES)
    # What the first look after the return found was in x-sink before the outage (the
    # management API is down with the broker); the next arrival is the first the sidecars
    # produced after it.
    polls = sorted({at for at, _ in sink.items if at >= t["back_at"]})
    recovered = (polls[1] - t["back_at"]) if len(polls) > 1 else float("nan")
    got = sink.ids() + sump.ids()
    duplicates = sorted({i for i in got if got.count(i) > 1})
    print(f"\n{transport} {'restart' if transport == 'rabbitmq' else 'outage'}: {ENVELOPES} envelopes through 2 actors, {before_restart} out before the stop; "
          f"broker away {t['back_at'] - t['stopped_at']:.1f} s; first result {recovered:.1f} s after it was back; "
          f"all in x-sink {sink.items[-1][0] - t['back_at']:.1f} s after; duplicates {len(duplicates)} {duplicates}")
    assert set(got) == set(ids), sorted(set(got) ^ set(ids))
    assert sump.items == [], [(e["id"], e["headers"].get("x-asya-error")) for _, e in sump.items]
    after_restarts = restarts(namespace, "asya.sh/actor in (first,second)")
    assert after_restarts == before, f"containers restarted: {before} -> {after_restarts}"


RESTART_APISERVER = ROOT / "tests" / "cluster" / "restart-apiserver"
# queue-provisioner/src/leader.rs: RENEW_DEADLINE and RENEW. A leader that cannot renew its
# Lease for RENEW_DEADLINE stands down (another replica may lead once the Lease has run out:
# two must never run) and campaigns again; it renews every RENEW, so an API server away for
# less than RENEW_DEADLINE - RENEW never costs it the lead, and one away for longer than
# RENEW_DEADLINE always does.
RENEW_DEADLINE, RENEW = 10, 5


def converged(ns: str, names: list[str]) -> bool:
    """Every actor of `names`: its queue Ready, its workload made, its scaling settled."""
    items = {a["metadata"]["name"]: a.get("status", {}) for a in kubectl_json("get", "asyncactors", "-n", ns)["items"]}
    return all(items.get(n, {}).get("transportStatus") == "Ready" and items[n].get("workloadKind")
               and items[n].get("scalingMode") for n in names)
# Actors applied just before the restart (provisioned across it) and after it.
BEFORE, AFTER = 5, 5


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_api_server_restarted_webhook_and_provisioner_recover_and_actors_converge(namespace, how):
    """AsyncActors applied just before the API server restarts and right after it all converge
    (transport Ready, workload, scaling), their pods are created through the webhook (the
    workload's ReplicaSet creates them once the webhook admits them: its actor cache followed
    the restart), and neither the webhook's containers nor the provisioner's restart. A
    provisioner leader that lives through it must follow the new API server's watches (a
    crash once left its caches frozen: no new actor reconciled, 422s on the others); one that
    cannot renew its Lease meanwhile stands down and is elected again, without an exit.
    `stop` stops the API server cleanly: on this machine its shutdown hangs until the cluster
    process kills it 20 s later, so it is away about 22 s (the leader stands down); `kill`
    SIGKILLs it, as a crash, away a few seconds (it keeps the lead). The figures printed say
    which."""
    webhook_before = restarts(RELEASE_NS, "app.kubernetes.io/component=webhook")
    provisioner_before = restarts(RELEASE_NS, "app.kubernetes.io/component=provisioner")
    assert webhook_before and provisioner_before, f"no webhook or provisioner pod in {RELEASE_NS}"
    stand_downs_before = metric_total(provisioner_metrics(), "asya_provisioner_leader_stand_downs_total")
    spec = {**FLAT, "transport": "rabbitmq", "scaling": {"enabled": False}, "replicas": 1}
    for i in range(BEFORE):
        apply(namespace, actor(f"before-{i}", spec))
    restart_at = time.monotonic()
    out = subprocess.run([RESTART_APISERVER] + (["--kill"] if how == "kill" else []),
                         capture_output=True, text=True, timeout=200)
    assert out.returncode == 0, out.stderr
    back_at = time.monotonic()
    away = back_at - restart_at
    print(f"\n{out.stdout.strip()}")
    for i in range(AFTER):
        wait_for(f"after-{i} applied", lambda: apply(namespace, actor(f"after-{i}", spec)) or True, timeout=60)
    names = [f"before-{i}" for i in range(BEFORE)] + [f"after-{i}" for i in range(AFTER)]
    try:
        # (They converge within 5 s of the API server's return: 60 s is ample.)
        wait_for(f"{BEFORE + AFTER} actors converged", lambda: converged(namespace, names), timeout=60, interval=1.0)
    except AssertionError as e:
        statuses = {a["metadata"]["name"]: a.get("status") for a in kubectl_json("get", "asyncactors", "-n", namespace)["items"]}
        raise AssertionError(f"{e}\n{statuses}") from None
    converged_after = time.monotonic() - back_at

    def injected_pods():
        return all(any(c["name"] == "asya-sidecar" for p in pods(namespace, n)
                       for c in p["spec"].get("initContainers", []) + p["spec"]["containers"]) for n in names)
    try:
        wait_for("a pod with the sidecar for every actor", injected_pods, timeout=120, interval=1.0)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{pod_story(namespace)}") from None
    injected = time.monotonic() - back_at
    webhook_after = restarts(RELEASE_NS, "app.kubernetes.io/component=webhook")
    provisioner_after = restarts(RELEASE_NS, "app.kubernetes.io/component=provisioner")
    metrics = provisioner_metrics()
    stand_downs = metric_total(metrics, "asya_provisioner_leader_stand_downs_total") - stand_downs_before
    print(f"API server restart ({how}): away {away:.1f} s; {BEFORE + AFTER} actors converged {converged_after:.1f} s after "
          f"it was back, their pods injected after {injected:.1f} s; webhook restarts "
          f"{sum(webhook_after.values()) - sum(webhook_before.values())}, provisioner restarts "
          f"{sum(provisioner_after.values()) - sum(provisioner_before.values())} (0 expected); "
          f"provisioner stand-downs {stand_downs:.0f}")
    assert webhook_after == webhook_before, f"webhook containers restarted: {webhook_before} -> {webhook_after}"
    assert provisioner_after == provisioner_before, f"provisioner containers restarted: {provisioner_before} -> {provisioner_after}"
    assert metric_total(metrics, "asya_provisioner_leader") == 1, "the provisioner leads again"
    if away > RENEW_DEADLINE + 2:
        assert stand_downs >= 1, f"away {away:.1f} s, yet the leader never stood down"
    elif away < RENEW_DEADLINE - RENEW - 1:
        assert stand_downs == 0, f"away {away:.1f} s only, yet the leader stood down"
