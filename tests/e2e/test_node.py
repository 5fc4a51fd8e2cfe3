"""Pods of this project on the test cluster's real node (kubelet + containerd + runc, bridge
CNI, kube-proxy, CoreDNS, KEDA's operator): AsyncActors become running pods with the injected
sidecar and the image of `make images`, envelopes go through them, KEDA scales from zero."""

from __future__ import annotations

import base64
import json
import os
import urllib.request
import uuid

import pytest

from conftest import kubectl, kubectl_json, wait_for

RABBIT_MANAGEMENT = os.environ.get("ASYA_TEST_RABBITMQ_MANAGEMENT_URL", "http://127.0.0.1:15672")
SQS_ENDPOINT = os.environ.get("ASYA_TEST_SQS_ENDPOINT", "http://127.0.0.1:4566")
EXAMPLES_IMAGE = "localhost/asya-rs/asya-examples:dev"
NODE = "asya-test-node"
# The test node is dedicated (tests/cluster/node.go): pods that should run there say so.
ON_TEST_NODE = [{"key": "asya.sh/test-node", "operator": "Exists", "effect": "NoSchedule"}]
# Pod start on this 2-core machine shares the cores with everything else the suite runs.
POD_TIMEOUT = 180

pytestmark = pytest.mark.skipif(os.environ.get("ASYA_TEST_NODE", "1") == "0",
                                reason="ASYA_TEST_NODE=0: the test cluster runs without a node")


# --- brokers, from the host --------------------------------------------------------------


def management(method: str, path: str, body: dict | None = None):
    req = urllib.request.Request(f"{RABBIT_MANAGEMENT}{path}", method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json",
                                          "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)


def rabbit_send(queue: str, envelope: dict) -> None:
    out = management("POST", "/api/exchanges/%2F/asya/publish", {
        "properties": {"delivery_mode": 2, "content_type": "application/json"},
        "routing_key": queue, "payload": json.dumps(envelope), "payload_encoding": "string"})
    assert out["routed"] is True, f"nothing bound to {queue}"


def rabbit_take(queue: str, n: int) -> list[dict]:
    msgs = management("POST", f"/api/queues/%2F/{queue}/get",
                      {"count": n, "ackmode": "ack_requeue_false", "encoding": "auto"})
    return [json.loads(m["payload"]) for m in msgs]


def sqs():
    import boto3

    return boto3.client("sqs", endpoint_url=SQS_ENDPOINT, region_name="us-east-1",
                        aws_access_key_id=os.environ.get("AWS_ACCESS_KEY_ID", "test"),
                        aws_secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY", "test"))


def sqs_send(queue: str, envelope: dict) -> None:
    url = sqs().get_queue_url(QueueName=queue)["QueueUrl"]
    sqs().send_message(QueueUrl=url, MessageBody=json.dumps(envelope))


def sqs_take(queue: str, n: int) -> list[dict]:
    client = sqs()
    try:
        url = client.get_queue_url(QueueName=queue)["QueueUrl"]
    except client.exceptions.QueueDoesNotExist:
        return []
    out = client.receive_message(QueueUrl=url, MaxNumberOfMessages=min(n, 10), WaitTimeSeconds=1)
    msgs = out.get("Messages", [])
    for m in msgs:
        client.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    return [json.loads(m["Body"]) for m in msgs]


class Collected:
    """Envelopes taken from an end queue so far (taking removes them from the queue)."""

    def __init__(self, take, queue: str):
        self.take, self.queue, self.items = take, queue, []

    def at_least(self, n: int):
        self.items += self.take(self.queue, max(1, n - len(self.items)))
        return len(self.items) >= n and self.items


TRANSPORTS = {"rabbitmq": (rabbit_send, rabbit_take), "sqs": (sqs_send, sqs_take)}


# --- actors --------------------------------------------------------------------------------


def apply(ns: str, name: str, spec: dict) -> None:
    doc = {"apiVersion": "asya.sh/v1alpha1", "kind": "AsyncActor",
           "metadata": {"name": name, "namespace": ns}, "spec": {"tolerations": ON_TEST_NODE, **spec}}
    kubectl("apply", "-f", "-", input=json.dumps(doc))


def pods(ns: str, actor: str) -> list[dict]:
    return kubectl_json("get", "pods", "-n", ns, "-l", f"asya.sh/actor={actor}")["items"]


def running_ready(pod: dict) -> bool:
    st = pod.get("status", {})
    return st.get("phase") == "Running" and any(
        c["type"] == "Ready" and c["status"] == "True" for c in st.get("conditions", []))


def pod_story(ns: str) -> str:
    """What went wrong, for a failed wait: pods, their container states, recent events."""
    out = kubectl("get", "pods", "-n", ns, "-o", "wide", check=False).stdout
    events = kubectl("get", "events", "-n", ns, "--sort-by=.lastTimestamp", check=False).stdout
    return f"{out}\n{events[-4000:]}"


def wait_running(ns: str, actor: str, count: int = 1) -> list[dict]:
    try:
        return wait_for(f"{count} running, ready pod(s) of {ns}/{actor}",
                        lambda: (p := [x for x in pods(ns, actor) if running_ready(x)]) and len(p) >= count and p,
                        timeout=POD_TIMEOUT, interval=1.0)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{pod_story(ns)}") from None


# --- the node --------------------------------------------------------------------------------


def test_node_is_ready_on_containerd():
    node = kubectl_json("get", "node", NODE)
    ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}
    assert ready["Ready"] == "True", node["status"]["conditions"]
    info = node["status"]["nodeInfo"]
    assert info["containerRuntimeVersion"].startswith("containerd://"), info
    assert info["kubeletVersion"].startswith("v1.35."), info
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addresses["InternalIP"] == os.environ.get("ASYA_TEST_HOST_IP", "10.245.0.1")


def test_keda_serves_the_external_metrics_api():
    svc = kubectl_json("get", "apiservice", "v1beta1.external.metrics.k8s.io")
    assert {c["type"]: c["status"] for c in svc["status"]["conditions"]}["Available"] == "True"
    assert svc["spec"]["service"] == {"name": "keda-metrics-apiserver", "namespace": "keda", "port": 443}
    for deploy in ("keda-operator", "keda-metrics-apiserver"):
        d = kubectl_json("get", "deployment", deploy, "-n", "keda")
        assert d["status"].get("readyReplicas") == 1, d["status"]


@pytest.mark.parametrize("transport", ["rabbitmq", "sqs"])
def test_three_actor_pipeline_runs_in_pods(namespace, transport):
    """validate -> split (fan-out) -> shout, each an AsyncActor of the examples image with the
    sidecar injected by the webhook: envelopes sent to the first queue end in x-sink with the
    expected payloads, trace headers kept; a bad one ends in x-sump with its traceback."""
    ns = namespace
    send, take = TRANSPORTS[transport]
    handlers = {"validate": "pipeline.Validator.check", "split": "pipeline.split", "shout": "pipeline.shout"}
    for name, handler in handlers.items():
        apply(ns, name, {"transport": transport, "image": EXAMPLES_IMAGE, "imagePullPolicy": "IfNotPresent",
                         "handler": handler, "scaling": {"enabled": False}, "replicas": 1})
    for name in handlers:
        pod = wait_running(ns, name)[0]
        spec = pod["spec"]
        names = [c["name"] for c in spec.get("initContainers", []) + spec["containers"]]
        assert "asya-sidecar" in names and "asya-runtime" in [c["name"] for c in spec["containers"]], names

    route = {"actors": list(handlers), "current": 0}
    trace = uuid.uuid4().hex
    send(f"asya-{ns}-validate", {"id": "ok-1", "route": route, "headers": {"trace_id": trace},
                                 "payload": {"text": "hello brave world"}})
    send(f"asya-{ns}-validate", {"id": "bad-1", "route": route, "headers": {"trace_id": trace},
                                 "payload": {"text": "   "}})

    sink = Collected(take, f"asya-{ns}-x-sink")
    got = wait_for("three results in x-sink", lambda: sink.at_least(3), timeout=POD_TIMEOUT, interval=1.0)
    assert sorted((e["payload"]["position"], e["payload"]["word"]) for e in got) == [
        (0, "HELLO"), (1, "BRAVE"), (2, "WORLD")]
    # Fan-out: the first keeps the id, the others get {id}-{i} and the parent's id.
    assert sorted(e["id"] for e in got) == ["ok-1", "ok-1-1", "ok-1-2"]
    assert all(e.get("parent_id") == "ok-1" for e in got if e["id"] != "ok-1")
    assert all(e["headers"]["trace_id"] == trace for e in got)
    assert all(e["route"]["current"] == 3 for e in got), [e["route"] for e in got]

    sump = Collected(take, f"asya-{ns}-x-sump")
    failed = wait_for("the bad envelope in x-sump", lambda: sump.at_least(1), timeout=POD_TIMEOUT, interval=1.0)
    assert [e["id"] for e in failed] == ["bad-1"]
    err = failed[0]["headers"]["x-asya-error"]
    assert err["type"] == "ValueError" and "non-empty 'text'" in err["message"], err
    assert "/app/pipeline.py" in err["traceback"] and "in check" in err["traceback"], err
    assert failed[0]["headers"]["trace_id"] == trace


def get(kind: str, ns: str, name: str) -> dict | None:
    out = kubectl("get", kind, name, "-n", ns, "-o", "json", "--ignore-not-found", check=False).stdout
    return json.loads(out) if out.strip() else None


def deployment_replicas(ns: str, name: str) -> int | None:
    d = get("deployment", ns, name)
    return d["spec"].get("replicas") if d else None


def status(ns: str, name: str) -> dict:
    return kubectl_json("get", "asyncactor", name, "-n", ns).get("status", {})


@pytest.mark.parametrize("transport", ["rabbitmq", "sqs"])
def test_keda_scales_an_actor_from_zero_and_back(namespace, transport):
    """minReplicaCount 0: no pods; a burst brings pods up in proportion to queueLength (KEDA
    for 0 -> 1, the HPA on KEDA's external metric beyond), every envelope is processed, and
    the pods go back to zero after the cooldown; status tells the last scale."""
    ns = namespace
    send, take = TRANSPORTS[transport]
    apply(ns, "burst", {"transport": transport, "image": EXAMPLES_IMAGE, "imagePullPolicy": "IfNotPresent",
                        "handler": "testing.act",
                        "scaling": {"enabled": True, "minReplicaCount": 0, "maxReplicaCount": 3, "queueLength": 2,
                                    "pollingInterval": 1, "cooldownPeriod": 10}})
    wait_for("the ScaledObject ready", lambda: any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in (get("scaledobject", ns, "burst") or {}).get("status", {}).get("conditions", [])),
        timeout=POD_TIMEOUT, interval=1.0)
    wait_for("zero replicas before any work", lambda: deployment_replicas(ns, "burst") == 0, timeout=60)
    # The Deployment's first pod (made before KEDA took over) goes away.
    wait_for("no pods before any work", lambda: pods(ns, "burst") == [], timeout=POD_TIMEOUT, interval=1.0)
    wait_for("phase Napping at zero", lambda: status(ns, "burst").get("phase") == "Napping", timeout=60, interval=1.0)

    route = {"actors": ["burst"], "current": 0}
    for i in range(12):
        send(f"asya-{ns}-burst", {"id": f"b{i}", "route": route, "headers": {},
                                  "payload": {"do": "sleep", "seconds": 2, "i": i}})
    # 12 queued at 2 per pod: the maximum, 3 pods, all running the examples image.
    wait_for("3 replicas for 12 queued envelopes", lambda: deployment_replicas(ns, "burst") == 3,
             timeout=POD_TIMEOUT, interval=1.0)
    wait_running(ns, "burst", count=2)

    sink = Collected(take, f"asya-{ns}-x-sink")
    got = wait_for("all 12 processed", lambda: sink.at_least(12), timeout=POD_TIMEOUT, interval=1.0)
    assert sorted(e["payload"]["i"] for e in got) == list(range(12))
    st = status(ns, "burst")
    assert st.get("lastScaleTime") and st.get("lastScale"), st

    wait_for("back to zero replicas after the cooldown", lambda: deployment_replicas(ns, "burst") == 0,
             timeout=POD_TIMEOUT, interval=1.0)
    wait_for("no pods left", lambda: pods(ns, "burst") == [], timeout=POD_TIMEOUT, interval=1.0)
    wait_for("phase Napping again", lambda: status(ns, "burst").get("phase") == "Napping", timeout=120, interval=1.0)


def test_an_image_that_was_never_loaded_fails_to_pull_without_leaving_the_machine(namespace):
    """The test node asks no registry: containerd sends every well-known registry to a closed
    port on loopback, so the pull fails at once and says where it tried."""
    ns = namespace
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "nopull", "namespace": ns},
           "spec": {"tolerations": ON_TEST_NODE, "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": "ghcr.io/asya-rs/does-not-exist:1"}]}}
    kubectl("apply", "-f", "-", input=json.dumps(pod))

    def pull_failed():
        ev = kubectl_json("get", "events", "-n", ns, "--field-selector", "involvedObject.name=nopull")["items"]
        return [e["message"] for e in ev if e["reason"] == "Failed" and "127.0.0.1:9" in e["message"]]

    msgs = wait_for("the pull to fail against the loopback registry", pull_failed, timeout=120, interval=1.0)
    assert "does-not-exist" in msgs[0], msgs
