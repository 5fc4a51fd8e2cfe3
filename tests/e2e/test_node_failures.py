"""What happens on the real node when things go wrong (issue 14): pods that go away mid-envelope
lose nothing, the failure phases of `kubectl get asyas` are set by what really fails on the
kubelet and clear once the cause is fixed, and the native sidecar outlives the runtime.

Every actor here runs the examples image's `testing.act` handler (deploy/examples/handlers/
testing.py); the slow case is `{"do": "sleep", "seconds": N, "started": PATH}`, which touches
PATH in the runtime container before it sleeps, so a test knows the handler is mid-envelope
before it kills anything. Nothing here stops a shared service: a broken broker is one actor's
sidecar pointed at a closed port."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from datetime import datetime

import pytest

from conftest import KUBECONFIG, KUBECTL, kubectl, kubectl_json, wait_for
from test_node import (EXAMPLES_IMAGE, POD_TIMEOUT, TRANSPORTS, Collected, apply, get, pod_story, pods,
                       status, wait_running)

pytestmark = pytest.mark.skipif(__import__("os").environ.get("ASYA_TEST_NODE", "1") == "0",
                                reason="ASYA_TEST_NODE=0: the test cluster runs without a node")

HANDLER = "testing.act"
# A closed port on the pod's own loopback: the connection is refused at once, and no shared
# broker is touched.
DEAD_BROKER = {"rabbitmq": {"name": "ASYA_RABBITMQ_URL", "value": "amqp://guest:guest@127.0.0.1:1/%2F"},
               "sqs": {"name": "ASYA_SQS_ENDPOINT", "value": "http://127.0.0.1:1"}}


def actor(transport: str, **spec) -> dict:
    """A fixed-size actor of the examples image (KEDA is not the point unless spec says so)."""
    return {"transport": transport, "image": EXAMPLES_IMAGE, "imagePullPolicy": "IfNotPresent",
            "handler": HANDLER, "scaling": {"enabled": False}, "replicas": 1, **spec}


def send_all(ns: str, transport: str, target: str, envelopes: list[dict]) -> None:
    send, _ = TRANSPORTS[transport]
    for e in envelopes:
        send(f"asya-{ns}-{target}", {"route": {"actors": [target], "current": 0}, "headers": {}, **e})


def sleeper(i: int, seconds: float, tag: str) -> dict:
    return {"id": f"{tag}-{i}", "payload": {"do": "sleep", "seconds": seconds, "i": i,
                                            "started": f"/tmp/started-{tag}-{i}"}}


def started_in(ns: str, pod: str, tag: str) -> list[str]:
    """The sleeping envelopes whose handler has begun in POD (their `started` files)."""
    out = kubectl("exec", "-n", ns, pod, "-c", "asya-runtime", "--", "python3", "-c",
                  f"import glob; print('\\n'.join(glob.glob('/tmp/started-{tag}-*')))", check=False)
    return [line for line in out.stdout.split() if line] if out.returncode == 0 else []


def ends(ns: str, transport: str, ids: list[str], timeout: float) -> tuple[list[dict], list[dict]]:
    """Takes from x-sink and x-sump until every id of IDS is in one of them: (sink, sump)."""
    _, take = TRANSPORTS[transport]
    sink, sump = Collected(take, f"asya-{ns}-x-sink"), Collected(take, f"asya-{ns}-x-sump")

    def all_there():
        sink.at_least(len(ids))
        sump.at_least(len(ids))
        return set(ids) <= {e["id"] for e in sink.items + sump.items}

    try:
        wait_for(f"{len(ids)} envelopes in x-sink or x-sump", all_there, timeout=timeout, interval=0.5)
    except AssertionError as e:
        seen = sorted(x["id"] for x in sink.items + sump.items)
        raise AssertionError(f"{e}\nmissing: {sorted(set(ids) - set(seen))}; seen: {seen}\n{pod_story(ns)}") from None
    return sink.items, sump.items


def phase(ns: str, name: str) -> str | None:
    return status(ns, name).get("phase")


def wait_phase(ns: str, name: str, want: set[str], timeout: float = POD_TIMEOUT) -> dict:
    try:
        return wait_for(f"{ns}/{name} in phase {sorted(want)}",
                        lambda: (st := status(ns, name)).get("phase") in want and st, timeout=timeout, interval=0.5)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{pod_story(ns)}") from None


def container(pod: dict, name: str) -> dict:
    st = pod.get("status", {})
    for c in st.get("initContainerStatuses", []) + st.get("containerStatuses", []):
        if c["name"] == name:
            return c
    return {}


# --- 1. nothing lost when a pod goes away -----------------------------------------------------


@pytest.mark.parametrize("how", ["sigterm", "force"])
@pytest.mark.parametrize("transport", ["rabbitmq", "sqs"])
def test_nothing_lost_when_the_pod_is_deleted_mid_envelope(namespace, transport, how):
    """Four slow envelopes, all taken by the actor's one pod (one in the handler, three queued
    on the runtime); the pod is deleted while the first sleeps. With SIGTERM the runtime
    finishes what it holds and the native sidecar, still up, delivers the results: each id once,
    in x-sink. With no grace period nothing is acknowledged, the broker gives every envelope
    to the replacement pod: each id in x-sink at least once, none missing, none unknown."""
    ns, tag = namespace, "del"
    env = []
    if transport == "sqs" and how == "force":
        # A killed sidecar extends nothing; what it held comes back after this, not actorTimeout + 30s.
        env = [{"name": "ASYA_SQS_VISIBILITY_TIMEOUT", "value": "6s"}]
    apply(ns, "slow", actor(transport, resiliency={"actorTimeout": "20s"}, sidecar={"env": env}))
    pod = wait_running(ns, "slow")[0]["metadata"]["name"]
    envelopes = [sleeper(i, 3, tag) for i in range(4)]
    ids = [e["id"] for e in envelopes]
    send_all(ns, transport, "slow", envelopes)
    wait_for("a handler mid-envelope", lambda: started_in(ns, pod, tag), timeout=60, interval=0.3)

    if how == "force":
        kubectl("delete", "pod", pod, "-n", ns, "--grace-period=0", "--force", "--wait=false")
    else:
        kubectl("delete", "pod", pod, "-n", ns, "--wait=false")
    sink, sump = ends(ns, transport, ids, timeout=150)

    got = sorted(e["id"] for e in sink + sump)
    assert set(got) == set(ids), got
    assert sump == [], [(e["id"], e["headers"].get("x-asya-error")) for e in sump]
    assert all(e["payload"]["do"] == "sleep" for e in sink), sink
    if how == "sigterm":
        assert got == sorted(ids), f"a graceful stop processes each envelope once: {got}"
        # The pod that was deleted did the work: nothing had to be redelivered to its successor.
        new = [p for p in pods(ns, "slow") if p["metadata"]["name"] != pod]
        assert all(not started_in(ns, p["metadata"]["name"], tag) for p in new), "redelivered"


def test_nothing_lost_when_keda_scales_in_with_work_in_flight(namespace):
    """Two KEDA-managed pods each mid-envelope (prefetch 1: one envelope per pod at a time);
    the ScaledObject's bounds drop from 2 to 1, KEDA's HPA scales the Deployment in and one of
    the busy pods is terminated: its envelope still finishes and every id ends in x-sink once."""
    ns, tag, transport = namespace, "keda", "rabbitmq"
    spec = actor(transport, resiliency={"actorTimeout": "20s"},
                 sidecar={"env": [{"name": "ASYA_RABBITMQ_PREFETCH", "value": "1"},
                                  {"name": "ASYA_RUNTIME_PIPELINE", "value": "1"}]})
    spec.pop("replicas")
    spec["scaling"] = {"enabled": True, "minReplicaCount": 2, "maxReplicaCount": 2, "queueLength": 1,
                       "pollingInterval": 1, "cooldownPeriod": 1}
    apply(ns, "inout", spec)
    busy = [p["metadata"]["name"] for p in wait_running(ns, "inout", count=2)]
    envelopes = [sleeper(i, 6, tag) for i in range(4)]
    ids = [e["id"] for e in envelopes]
    send_all(ns, transport, "inout", envelopes)
    wait_for("both pods mid-envelope", lambda: all(started_in(ns, p, tag) for p in busy[:2]), timeout=60,
             interval=0.3)

    spec["scaling"] = dict(spec["scaling"], minReplicaCount=1, maxReplicaCount=1)
    apply(ns, "inout", spec)
    wait_for("KEDA to scale in to one replica",
             lambda: (get("deployment", ns, "inout") or {}).get("spec", {}).get("replicas") == 1,
             timeout=60, interval=0.5)
    sink, sump = ends(ns, transport, ids, timeout=120)
    got = sorted(e["id"] for e in sink + sump)
    assert got == sorted(ids), got
    assert sump == [], sump
    wait_for("one pod left", lambda: len(pods(ns, "inout")) == 1, timeout=60, interval=0.5)


# --- 2. the failure phases ---------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["rabbitmq", "sqs"])
def test_a_handler_timeout_restarts_the_runtime_and_the_policy_decides(namespace, transport):
    """actorTimeout 3s and a policy that retries ActorTimeout once: the envelope that sleeps
    past it is tried twice, each timeout restarts the runtime container (its restart count
    rises), then it goes to x-sump saying the retries are exhausted; the restarted runtime
    serves the next envelope."""
    ns = namespace
    resiliency = {"actorTimeout": "3s",
                  "policies": {"timeouts": {"maxAttempts": 2, "backoff": "constant", "initialInterval": "1s"}},
                  "rules": [{"match": "ActorTimeout", "policy": "timeouts"}]}
    apply(ns, "stuck", actor(transport, resiliency=resiliency))
    pod = wait_running(ns, "stuck")[0]
    name = pod["metadata"]["name"]
    before = container(pod, "asya-runtime")["restartCount"]

    send_all(ns, transport, "stuck", [{"id": "late", "payload": {"do": "sleep", "seconds": 60}}])
    _, sump = ends(ns, transport, ["late"], timeout=120)
    assert [e["id"] for e in sump] == ["late"], sump
    err = sump[0]["headers"]["x-asya-error"]
    assert err["type"] == "ActorTimeout" and "retries exhausted: 2 of 2" in err["reason"], err

    restarts = wait_for("the runtime container restarted after each timeout",
                        lambda: (n := container(kubectl_json("get", "pod", name, "-n", ns), "asya-runtime")
                                 ["restartCount"]) >= before + 2 and n, timeout=60, interval=0.5)
    assert restarts >= before + 2
    send_all(ns, transport, "stuck", [{"id": "after", "payload": {"do": "echo", "n": 1}}])
    sink, _ = ends(ns, transport, ["after"], timeout=90)
    assert [e["payload"] for e in sink] == [{"do": "echo", "n": 1}]


def test_a_handler_that_cannot_be_imported_is_a_runtime_error_until_fixed(namespace):
    ns = namespace
    apply(ns, "broken", actor("rabbitmq", handler="no_such_module.handle"))
    st = wait_phase(ns, "broken", {"RuntimeError"})
    workload = {c["type"]: c for c in st["conditions"]}["WorkloadReady"]
    assert workload["status"] == "False" and "asya-runtime" in workload["message"], workload
    pod = pods(ns, "broken")[0]
    log = kubectl("logs", "-n", ns, pod["metadata"]["name"], "-c", "asya-runtime", "--previous",
                  check=False).stdout + kubectl("logs", "-n", ns, pod["metadata"]["name"], "-c", "asya-runtime",
                                                check=False).stdout
    assert "no_such_module" in log, log

    apply(ns, "broken", actor("rabbitmq"))
    wait_phase(ns, "broken", {"Running"})
    send_all(ns, "rabbitmq", "broken", [{"id": "fixed", "payload": {"do": "echo"}}])
    sink, _ = ends(ns, "rabbitmq", ["fixed"], timeout=60)
    assert [e["id"] for e in sink] == ["fixed"]


def test_an_image_that_does_not_exist_is_an_image_pull_error_until_fixed(namespace):
    ns = namespace
    apply(ns, "noimage", actor("rabbitmq", image="localhost/asya-rs/does-not-exist:1"))
    st = wait_phase(ns, "noimage", {"ImagePullError"})
    workload = {c["type"]: c for c in st["conditions"]}["WorkloadReady"]
    assert "asya-runtime" in workload["message"] and "Pull" in workload["message"], workload

    apply(ns, "noimage", actor("rabbitmq"))
    wait_phase(ns, "noimage", {"Running"})


@pytest.mark.parametrize("transport", ["rabbitmq", "sqs"])
def test_a_sidecar_that_cannot_reach_its_broker_is_an_error_until_fixed(namespace, transport):
    """One actor's sidecar points at a closed port: it gives up after its startup timeout and
    restarts, the actor says SidecarError (or TransportError); pointed back at the real
    broker, it is Running again and works."""
    ns = namespace
    broken = [DEAD_BROKER[transport], {"name": "ASYA_TRANSPORT_STARTUP_TIMEOUT", "value": "3s"}]
    apply(ns, "cutoff", actor(transport, sidecar={"env": broken}))
    st = wait_phase(ns, "cutoff", {"SidecarError", "TransportError"})
    workload = {c["type"]: c for c in st["conditions"]}["WorkloadReady"]
    assert "asya-sidecar" in workload["message"], workload

    apply(ns, "cutoff", actor(transport))
    wait_phase(ns, "cutoff", {"Running"})
    send_all(ns, transport, "cutoff", [{"id": "through", "payload": {"do": "echo"}}])
    sink, _ = ends(ns, transport, ["through"], timeout=60)
    assert [e["id"] for e in sink] == ["through"]


# --- 3. the native sidecar's order ------------------------------------------------------------


def first_log_time(ns: str, pod: str, c: str) -> datetime:
    out = kubectl("logs", "-n", ns, pod, "-c", c, "--timestamps").stdout.splitlines()
    assert out, f"{c} logged nothing"
    stamp = out[0].split(" ", 1)[0]  # RFC 3339 with nanoseconds
    return datetime.fromisoformat(stamp[:26] + "+00:00")


def test_the_native_sidecar_starts_before_the_runtime_and_stops_after_it(namespace):
    """The sidecar is an init container with restartPolicy Always: it runs (and logs) before
    the runtime starts; when the pod is deleted mid-envelope the runtime is stopped first and
    finishes its handler while the sidecar is still up, which then delivers the result and
    stops last."""
    ns, tag = namespace, "order"
    apply(ns, "order", actor("rabbitmq", resiliency={"actorTimeout": "20s"}))
    pod = wait_running(ns, "order")[0]
    name = pod["metadata"]["name"]
    sidecar = [c for c in pod["spec"]["initContainers"] if c["name"] == "asya-sidecar"]
    assert sidecar and sidecar[0].get("restartPolicy") == "Always", pod["spec"]["initContainers"]
    assert container(pod, "asya-sidecar")["state"]["running"]["startedAt"] <= \
        container(pod, "asya-runtime")["state"]["running"]["startedAt"]
    assert first_log_time(ns, name, "asya-sidecar") < first_log_time(ns, name, "asya-runtime")

    # Watch the pod's status to the end while it is deleted with a handler running.
    watch = subprocess.Popen([str(KUBECTL), "--kubeconfig", str(KUBECONFIG), "get", "pod", name, "-n", ns,
                              "--watch", "--output-watch-events", "-o", "json"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        send_all(ns, "rabbitmq", "order", [sleeper(0, 4, tag)])
        wait_for("the handler mid-envelope", lambda: started_in(ns, name, tag), timeout=60, interval=0.3)
        kubectl("delete", "pod", name, "-n", ns, "--wait=true", timeout=120)
        sink, _ = ends(ns, "rabbitmq", [f"{tag}-0"], timeout=60)
        assert [e["id"] for e in sink] == [f"{tag}-0"]
    finally:
        watch.terminate()
    seen = []
    dec = json.JSONDecoder()
    text, i = watch.stdout.read(), 0
    while i < len(text):
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            break
        obj, i = dec.raw_decode(text, i)
        seen.append(obj["object"])
    # Some status had the runtime finished (cleanly: its handler ended) with the sidecar still running.
    order = [(container(p, "asya-runtime").get("state", {}), container(p, "asya-sidecar").get("state", {}))
             for p in seen]
    assert any("terminated" in rt and "running" in sc for rt, sc in order), order
    last_rt, last_sc = order[-1]
    if "terminated" in last_rt and "terminated" in last_sc:
        assert last_rt["terminated"]["exitCode"] == 0, last_rt
        assert last_rt["terminated"]["finishedAt"] <= last_sc["terminated"]["finishedAt"], order[-1]
