"""What happens on the real node when things go wrong (issue 14): pods that go away mid-envelope
lose nothing, the failure phases of `kubectl get asyas` are set by what really fails on the
kubelet and clear once the cause is fixed, and the native sidecar outlives the runtime.

Every actor here runs the examples image's `testing.act` handler (deploy/examples/handlers/
testing.py); the slow case is `{"do": "sleep", "seconds": N, "started": PATH}`, which touches
PATH in the runtime container before it sleeps, so a test knows the handler is mid-envelope
before it kills anything. A broken broker is one actor's sidecar pointed at a closed port; the
one test that stops a shared service (the webhook) is marked disruptive and runs last."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from datetime import datetime

import pytest

from asya_e2e.actors import EXAMPLES_IMAGE, POD_TIMEOUT, apply_on_node, pod_story, pods, wait_running
from asya_e2e.brokers import TRANSPORTS, Collected
from asya_e2e.components import process_stopped
from asya_e2e.env import KUBECONFIG, KUBECTL, webhook_enabled
from asya_e2e.kube import get, kubectl, kubectl_json, status
from asya_e2e.wait import wait_for

pytestmark = [
    pytest.mark.skipif(os.environ.get("ASYA_TEST_NODE", "1") == "0",
                       reason="ASYA_TEST_NODE=0: the test cluster runs without a node"),
    # One worker (tests/e2e/conftest.py): the `actors` fixture makes every actor the session's
    # tests use (it reads session.items, the whole selection on every xdist worker), so on two
    # workers all of them would be made twice. Each actor has its own namespace, ends and
    # broker (a dead one is a closed port in the pod), so other modules may run beside it.
    pytest.mark.xdist_group("node_failures"),
]

HANDLER = "testing.act"
BOTH = ["rabbitmq", "sqs"]
# A closed port on the pod's own loopback: the connection is refused at once, and no shared
# broker is touched.
DEAD_BROKER = {"rabbitmq": {"name": "ASYA_RABBITMQ_URL", "value": "amqp://guest:guest@127.0.0.1:1/%2F"},
               "sqs": {"name": "ASYA_SQS_ENDPOINT", "value": "http://127.0.0.1:1"}}
# Unset in CI. Set, these actors run that sidecar image (a build under test, loaded into the
# node under its own tag) and the node's shared :dev stays as it is.
SIDECAR_IMAGE = os.environ.get("ASYA_TEST_SIDECAR_IMAGE")


def example_spec(transport: str, sidecar_env=(), **spec) -> dict:
    """A fixed-size actor of the examples image (KEDA is not the point unless spec says so)."""
    sidecar = {"env": list(sidecar_env)}
    if SIDECAR_IMAGE:
        sidecar["image"] = SIDECAR_IMAGE
    return {"transport": transport, "image": EXAMPLES_IMAGE, "imagePullPolicy": "IfNotPresent",
            "handler": HANDLER, "scaling": {"enabled": False}, "replicas": 1, "sidecar": sidecar, **spec}


def keda_actor() -> dict:
    # One envelope per pod at a time, so both pods are busy with the four sent.
    spec = example_spec("rabbitmq", [{"name": "ASYA_RABBITMQ_PREFETCH", "value": "1"},
                                     {"name": "ASYA_RUNTIME_PIPELINE", "value": "1"}],
                        resiliency={"actorTimeout": "20s"})
    spec.pop("replicas")
    spec["scaling"] = {"enabled": True, "minReplicaCount": 2, "maxReplicaCount": 2, "queueLength": 1,
                       "pollingInterval": 1, "cooldownPeriod": 1}
    return spec


TIMEOUT_POLICY = {"actorTimeout": "3s",
                  "policies": {"timeouts": {"maxAttempts": 2, "backoff": "constant", "initialInterval": "1s"}},
                  "rules": [{"match": "ActorTimeout", "policy": "timeouts"}]}
# A killed sidecar extends nothing: what it held comes back after this, not actorTimeout + 30s.
SHORT_VISIBILITY = [{"name": "ASYA_SQS_VISIBILITY_TIMEOUT", "value": "6s"}]

# Every actor of this file, each alone in its namespace (its own x-sink and x-sump), created
# at once before the first test: pod starts on the shared 2-core node take tens of seconds
# and overlap here instead of adding up.
ACTORS = {
    **{f"sigterm-{t}": ("slow", example_spec(t, resiliency={"actorTimeout": "20s"})) for t in BOTH},
    **{f"force-{t}": ("slow", example_spec(t, SHORT_VISIBILITY if t == "sqs" else (), resiliency={"actorTimeout": "20s"}))
       for t in BOTH},
    "keda": ("inout", keda_actor()),
    **{f"timeout-{t}": ("stuck", example_spec(t, resiliency=TIMEOUT_POLICY)) for t in BOTH},
    # deploy/examples/handlers/broken_at_import.py: opens a model file the image does not have.
    "import": ("broken", example_spec("rabbitmq", handler="broken_at_import.handle")),
    "image": ("noimage", example_spec("rabbitmq", image="localhost/asya-rs/does-not-exist:1")),
    **{f"broker-{t}": ("cutoff", example_spec(t, [DEAD_BROKER[t], {"name": "ASYA_TRANSPORT_STARTUP_TIMEOUT", "value": "3s"}]))
       for t in BOTH},
    "order": ("order", example_spec("rabbitmq", resiliency={"actorTimeout": "20s"})),
}


def uses(*keys: str):
    """The actors of ACTORS a test uses: created by the `actors` fixture before the first test."""
    return pytest.mark.uses_actors(*keys)


@pytest.fixture(scope="module")
def actors(request):
    """key of ACTORS -> (namespace, actor name): every actor the selected tests use, applied
    at once."""
    wanted = {k for item in request.session.items for m in item.iter_markers("uses_actors") for k in m.args}
    made = {key: (f"e2e-{key}-{uuid.uuid4().hex[:6]}", name) for key, (name, _) in ACTORS.items() if key in wanted}
    for ns, _ in made.values():
        kubectl("create", "namespace", ns)
    try:
        for key, (ns, name) in made.items():
            wait_for(f"service account in {ns}",
                     lambda: kubectl("get", "sa", "default", "-n", ns, check=False).returncode == 0)
            apply_on_node(ns, name, ACTORS[key][1])
        yield made
    finally:
        for ns, _ in made.values():
            kubectl("delete", "namespace", ns, "--wait=false", check=False)


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
        wait_for(f"{len(ids)} envelopes in x-sink or x-sump of {ns}", all_there, timeout=timeout, interval=0.5)
    except AssertionError as e:
        seen = sorted(x["id"] for x in sink.items + sump.items)
        raise AssertionError(f"{e}\nmissing: {sorted(set(ids) - set(seen))}; seen: {seen}\n{pod_story(ns)}") from None
    return sink.items, sump.items


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


def workload_condition(st: dict) -> dict:
    return {c["type"]: c for c in st.get("conditions", [])}["WorkloadReady"]


# --- 1. nothing lost when a pod goes away -----------------------------------------------------


@pytest.mark.parametrize("how", [pytest.param("sigterm", marks=uses("sigterm-rabbitmq", "sigterm-sqs")),
                                 pytest.param("force", marks=uses("force-rabbitmq", "force-sqs"))])
def test_nothing_lost_when_the_pod_is_deleted_mid_envelope(actors, how):
    """On each transport: four slow envelopes, all taken by the actor's one pod (one in the
    handler, three queued on the runtime); the pod is deleted while the first sleeps. With
    SIGTERM the runtime finishes what it holds and the native sidecar, still up, delivers the
    results: each id once, in x-sink, none redone by the replacement pod. With no grace period
    nothing was acknowledged and the broker gives every envelope to the replacement pod: each
    id in x-sink, none missing, none unknown."""
    tag, started = f"{how}", {}
    for t in BOTH:
        ns, name = actors[f"{how}-{t}"]
        started[t] = wait_running(ns, name)[0]["metadata"]["name"]
        send_all(ns, t, name, [sleeper(i, 2, tag) for i in range(4)])
    for t in BOTH:
        ns, _ = actors[f"{how}-{t}"]
        wait_for(f"a handler mid-envelope in {ns}", lambda: started_in(ns, started[t], tag), timeout=60, interval=0.3)
        grace = ["--grace-period=0", "--force"] if how == "force" else []
        kubectl("delete", "pod", started[t], "-n", ns, "--wait=false", *grace)

    ids = [f"{tag}-{i}" for i in range(4)]
    for t in BOTH:
        ns, name = actors[f"{how}-{t}"]
        sink, sump = ends(ns, t, ids, timeout=150)
        got = sorted(e["id"] for e in sink + sump)
        assert set(got) == set(ids), (t, got)
        assert sump == [], (t, [(e["id"], e["headers"].get("x-asya-error")) for e in sump])
        if how == "sigterm":
            assert got == sorted(ids), f"{t}: a graceful stop processes each envelope once: {got}"
            others = [p["metadata"]["name"] for p in pods(ns, name) if p["metadata"]["name"] != started[t]]
            assert not any(started_in(ns, p, tag) for p in others), f"{t}: redone by the replacement pod"


@uses("keda")
def test_nothing_lost_when_keda_scales_in_with_work_in_flight(actors):
    """Two KEDA-managed pods each mid-envelope; the ScaledObject's bounds drop from 2 to 1,
    KEDA's HPA scales the Deployment in and one of the busy pods is terminated: its envelope
    still finishes and every id ends in x-sink once."""
    (ns, name), tag = actors["keda"], "keda"
    # KEDA owns the scale (its HPA exists) before anything is sent.
    wait_for("the ScaledObject ready", lambda: any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in (get("scaledobject", ns, name) or {}).get("status", {}).get("conditions", [])),
        timeout=POD_TIMEOUT, interval=1.0)
    busy = [p["metadata"]["name"] for p in wait_running(ns, name, count=2)][:2]
    ids = [f"{tag}-{i}" for i in range(4)]
    send_all(ns, "rabbitmq", name, [sleeper(i, 4, tag) for i in range(4)])
    wait_for("both pods mid-envelope", lambda: all(started_in(ns, p, tag) for p in busy), timeout=60, interval=0.3)

    spec = keda_actor()
    spec["scaling"] = dict(spec["scaling"], minReplicaCount=1, maxReplicaCount=1)
    apply_on_node(ns, name, spec)
    try:
        wait_for("KEDA to scale in to one replica",
                 lambda: (get("deployment", ns, name) or {}).get("spec", {}).get("replicas") == 1,
                 timeout=POD_TIMEOUT, interval=0.5)
    except AssertionError as e:
        # KEDA's operator behind (seen with a 1000-actor benchmark beside): its HPA keeps the old bounds.
        hpa = kubectl("get", "scaledobject,hpa", "-n", ns, "-o", "wide", check=False).stdout
        raise AssertionError(f"{e}\n{hpa}\n{pod_story(ns)}") from None
    sink, sump = ends(ns, "rabbitmq", ids, timeout=120)
    got = sorted(e["id"] for e in sink + sump)
    assert got == sorted(ids), got
    assert sump == [], sump
    left = wait_for("one pod left", lambda: len(p := pods(ns, name)) == 1 and p, timeout=60, interval=0.5)
    assert left[0]["metadata"]["name"] in busy


# --- 2. the failure phases ---------------------------------------------------------------------


@uses("timeout-rabbitmq", "timeout-sqs")
def test_a_handler_timeout_restarts_the_runtime_and_the_policy_decides(actors):
    """actorTimeout 3s and a policy that retries ActorTimeout once, on each transport: the
    envelope that sleeps past it is tried twice, each timeout restarts the runtime container
    (its restart count rises by two), then it goes to x-sump saying the retries are exhausted;
    the restarted runtime serves the next envelope."""
    before = {}
    for t in BOTH:
        ns, name = actors[f"timeout-{t}"]
        pod = wait_running(ns, name)[0]
        before[t] = (pod["metadata"]["name"], container(pod, "asya-runtime")["restartCount"])
        send_all(ns, t, name, [{"id": "late", "payload": {"do": "sleep", "seconds": 60}}])
    for t in BOTH:
        ns, name = actors[f"timeout-{t}"]
        _, sump = ends(ns, t, ["late"], timeout=120)
        assert [e["id"] for e in sump] == ["late"], sump
        err = sump[0]["headers"]["x-asya-error"]
        assert err["type"] == "ActorTimeout" and "retries exhausted: 2 of 2" in err["reason"], (t, err)
        pod, n = before[t]
        wait_for(f"{t}: the runtime container restarted after each timeout",
                 lambda: container(kubectl_json("get", "pod", pod, "-n", ns), "asya-runtime")["restartCount"] >= n + 2,
                 timeout=60, interval=0.5)
        send_all(ns, t, name, [{"id": "after", "payload": {"do": "echo", "n": 1}}])
    for t in BOTH:
        ns, _ = actors[f"timeout-{t}"]
        sink, _ = ends(ns, t, ["after"], timeout=90)
        assert [e["payload"] for e in sink] == [{"do": "echo", "n": 1}], t


FAILURES = {
    # key of ACTORS: the phase it must reach, the container the status must name
    "import": ({"RuntimeError"}, "asya-runtime"),
    "image": ({"ImagePullError"}, "asya-runtime"),
    "broker-rabbitmq": ({"SidecarError", "TransportError"}, "asya-sidecar"),
    "broker-sqs": ({"SidecarError", "TransportError"}, "asya-sidecar"),
}


@uses("import", "image", "broker-rabbitmq", "broker-sqs")
def test_failure_phases_are_set_and_clear_once_the_cause_is_fixed(actors):
    """A handler whose module raises at import (RuntimeError), an image that does not exist
    (ImagePullError), a sidecar whose broker is a closed port, on each transport: it gives up
    after its startup timeout and restarts (SidecarError). Each AsyncActor re-applied with
    the cause fixed is Running again and works. (One test: the four pod starts overlap.)"""
    for key, (want, who) in FAILURES.items():
        ns, name = actors[key]
        st = wait_phase(ns, name, want)
        cond = workload_condition(st)
        assert cond["status"] == "False" and who in cond["message"], (key, cond)
    ns, name = actors["import"]
    log = "".join(kubectl("logs", "-n", ns, p["metadata"]["name"], "-c", "asya-runtime", *prev, check=False).stdout
                  for p in pods(ns, name) for prev in ([], ["--previous"]))
    assert "FileNotFoundError" in log and "/models/weights.bin" in log, log

    for key in FAILURES:
        ns, name = actors[key]
        apply_on_node(ns, name, example_spec(ACTORS[key][1]["transport"]))
    for key in FAILURES:
        ns, name = actors[key]
        wait_phase(ns, name, {"Running"})
        t = ACTORS[key][1]["transport"]
        send_all(ns, t, name, [{"id": "fixed", "payload": {"do": "echo"}}])
    for key in FAILURES:
        ns, _ = actors[key]
        sink, _ = ends(ns, ACTORS[key][1]["transport"], ["fixed"], timeout=60)
        assert [e["id"] for e in sink] == ["fixed"], key


# --- 3. the native sidecar's order ------------------------------------------------------------


def log_lines(text: str) -> list[tuple[datetime, str]]:
    """`kubectl logs --timestamps` output: (time, line), times from the node with nanoseconds."""
    out = []
    for line in text.splitlines():
        stamp, _, rest = line.partition(" ")
        out.append((datetime.fromisoformat(stamp[:26].rstrip("Z") + "+00:00"), rest))
    return out


def follow(ns: str, pod: str, c: str) -> subprocess.Popen:
    return subprocess.Popen([str(KUBECTL), "--kubeconfig", str(KUBECONFIG), "logs", "-f", "--timestamps",
                             "-n", ns, pod, "-c", c], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


@uses("order")
def test_the_native_sidecar_starts_before_the_runtime_and_stops_after_it(actors):
    """The sidecar is an init container with restartPolicy Always: it runs (and logs) before
    the runtime starts. When the pod is deleted mid-envelope the kubelet stops the runtime
    first; it finishes its handler and exits while the sidecar is still up and delivers the
    result; only then is the sidecar told to stop (its SIGTERM line is logged after the
    runtime's last line), and it exits last."""
    (ns, actor_name), tag = actors["order"], "order"
    pod = wait_running(ns, actor_name)[0]
    name = pod["metadata"]["name"]
    sidecar = [c for c in pod["spec"]["initContainers"] if c["name"] == "asya-sidecar"]
    assert sidecar and sidecar[0].get("restartPolicy") == "Always", pod["spec"]["initContainers"]
    assert container(pod, "asya-sidecar")["state"]["running"]["startedAt"] <= \
        container(pod, "asya-runtime")["state"]["running"]["startedAt"]

    streams = {c: follow(ns, name, c) for c in ("asya-sidecar", "asya-runtime")}
    try:
        send_all(ns, "rabbitmq", actor_name, [sleeper(0, 4, tag)])
        wait_for("the handler mid-envelope", lambda: started_in(ns, name, tag), timeout=60, interval=0.3)
        kubectl("delete", "pod", name, "-n", ns, "--wait=false")
        sink, _ = ends(ns, "rabbitmq", [f"{tag}-0"], timeout=60)
        assert [e["id"] for e in sink] == [f"{tag}-0"]
        # The streams end when their containers exit.
        logs = {c: log_lines(p.communicate(timeout=60)[0]) for c, p in streams.items()}
    finally:
        for p in streams.values():
            p.kill()
    sc, rt = logs["asya-sidecar"], logs["asya-runtime"]
    assert sc and rt, logs
    assert sc[0][0] < rt[0][0], f"the sidecar logged first: {sc[0]} vs {rt[0]}"
    assert "stopped" in rt[-1][1], rt[-3:]
    term = [t for t, line in sc if "SIGTERM" in line]
    assert term and term[0] > rt[-1][0], f"sidecar SIGTERM {term} after the runtime's end {rt[-1]}"
    assert sc[-1][0] > rt[-1][0], (sc[-3:], rt[-3:])


# --- 4. the webhook down: labelled pods wait -------------------------------------------------


@pytest.mark.disruptive
def test_labelled_pods_wait_for_the_webhook_and_are_created_once_it_is_back(namespace):
    """With no webhook pod to answer and `failurePolicy: Fail`, the API server refuses the
    ReplicaSet's pod: no pod runs without its sidecar, and `kubectl get asyas` says why (the
    Deployment's ReplicaFailure). Unlabelled pods are admitted meanwhile. Once the webhook is
    back, the ReplicaSet's next attempt creates the pod, injected, and it serves."""
    if not webhook_enabled():
        pytest.skip("the webhook is not running in this environment")
    ns, name = namespace, "waiter"
    apply_on_node(ns, name, example_spec("rabbitmq"))
    wait_phase(ns, name, {"Running"})
    before = {p["metadata"]["name"] for p in pods(ns, name)}
    with process_stopped("webhook"):
        kubectl("delete", "pod", *before, "-n", ns, "--wait=false")
        st = wait_phase(ns, name, {"Degraded"}, timeout=120)
        cond = workload_condition(st)
        assert cond["status"] == "False" and cond["reason"] == "FailedCreate", cond
        assert "pods cannot be created" in cond["message"] and "pods.inject.asya.sh" in cond["message"], cond
        alive = [p["metadata"]["name"] for p in pods(ns, name) if not p["metadata"].get("deletionTimestamp")]
        assert not alive, f"a pod was created without the webhook: {alive}"
        plain = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain", "namespace": ns},
                 "spec": {"containers": [{"name": "c", "image": EXAMPLES_IMAGE}]}}
        kubectl("apply", "-f", "-", input=json.dumps(plain))
    # tests/e2e/up brought the webhook back; the ReplicaSet retries with its own backoff.
    wait_phase(ns, name, {"Running"})
    now = [p for p in pods(ns, name) if not p["metadata"].get("deletionTimestamp")]
    assert len(now) == 1 and now[0]["metadata"]["name"] not in before, now
    assert any(c["name"] == "asya-sidecar" for c in now[0]["spec"].get("initContainers", [])), now[0]["spec"]
    assert workload_condition(status(ns, name))["status"] == "True"
    send_all(ns, "rabbitmq", name, [{"id": "after", "payload": {"do": "echo"}}])
    sink, _ = ends(ns, "rabbitmq", ["after"], timeout=60)
    assert [e["id"] for e in sink] == ["after"]
