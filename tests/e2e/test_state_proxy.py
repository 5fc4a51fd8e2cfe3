"""State proxies on the test node (issue 22, docs/DESIGN.md §10): seed 002's `s3-checkpoints`
flavor pointed at our connector image. A handler writes /state/checkpoints/run-N.json with
plain open(); the injected connector stores it in the S3 server of tests/services; a second
actor reads it back; the objects are checked in S3 directly; the pods are killed and the state
is still there for the pods that replace them."""

from __future__ import annotations

import json
import os

import pytest

from asya_e2e.actors import EXAMPLES_IMAGE, POD_TIMEOUT, apply_on_node, pods, running_ready, wait_running
from asya_e2e.brokers import TRANSPORTS, Collected
from asya_e2e.kube import kubectl
from asya_e2e.s3 import bucket, s3  # noqa: F401 (bucket: a fixture)
from asya_e2e.wait import wait_for

pytestmark = pytest.mark.skipif(os.environ.get("ASYA_TEST_NODE", "1") == "0",
                                reason="ASYA_TEST_NODE=0: the test cluster runs without a node")

HOST_IP = os.environ.get("ASYA_TEST_HOST_IP", "10.245.0.1")
# A bare name: the chart's stateProxy.image (tests/e2e/up: localhost/asya-rs, tag dev) runs.
CONNECTOR_IMAGE = "asya-state-proxy"
MOUNT = "/state/checkpoints"


def s3_checkpoints_flavor(name: str, ns: str, bucket: str) -> dict:
    """Seed 002's s3-checkpoints flavor (deploy/examples/flavors/002-s3-checkpoints.yaml) as a
    cluster Flavor (the platform's: namespaced flavors may not set stateProxy by default), with
    the test's bucket, and moto where the pods reach it."""
    entry = {
        "name": "checkpoints",
        "mount": {"path": MOUNT},
        "connector": {
            "image": CONNECTOR_IMAGE,
            "imagePullPolicy": "IfNotPresent",
            "env": [
                {"name": "ASYA_CONNECTOR", "value": "s3-buffered-lww"},
                {"name": "STATE_BUCKET", "value": bucket},
                # No STATE_PREFIX: the connector keeps every key under the pod's namespace.
                {"name": "AWS_REGION", "value": "us-east-1"},
                {"name": "AWS_ENDPOINT_URL", "value": f"http://{HOST_IP}:4566"},
                # moto takes any key (allowed by the test configuration's
                # stateProxy.allowStaticCredentials); a real cluster uses the pod's role.
                {"name": "AWS_ACCESS_KEY_ID", "value": "test"},
                {"name": "AWS_SECRET_ACCESS_KEY", "value": "test"},
            ],
        },
    }
    return {"apiVersion": "asya.sh/v1alpha1", "kind": "Flavor", "metadata": {"name": name},
            "spec": {"stateProxy": [entry]}}


@pytest.fixture
def checkpoints_flavor(namespace, bucket):
    """The flavor's name, applied for this test's namespace and bucket, deleted afterwards."""
    name = f"s3-checkpoints-{namespace}"
    kubectl("apply", "-f", "-", input=json.dumps(s3_checkpoints_flavor(name, namespace, bucket)))
    yield name
    kubectl("delete", "flavor.asya.sh", name, "--wait=false", check=False)


def objects(bucket: str, prefix: str) -> dict[str, dict]:
    client = s3()
    listed = client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return {o["Key"]: json.loads(client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read())
            for o in listed}


def test_checkpoints_land_in_s3_and_survive_the_pods(namespace, bucket, checkpoints_flavor):
    ns = namespace
    send, take = TRANSPORTS["rabbitmq"]
    spec = {"transport": "rabbitmq", "image": EXAMPLES_IMAGE, "imagePullPolicy": "IfNotPresent",
            "flavors": [checkpoints_flavor], "scaling": {"enabled": False}, "replicas": 1}
    apply_on_node(ns, "checkpointer", {**spec, "handler": "checkpoints.save"})
    apply_on_node(ns, "reader", {**spec, "handler": "checkpoints.load"})
    for name in ("checkpointer", "reader"):
        pod = wait_running(ns, name)[0]
        inits = {c["name"]: c for c in pod["spec"].get("initContainers", [])}
        connector = inits.get("asya-state-proxy-checkpoints")
        assert connector, f"{name}: no connector among the init containers: {list(inits)}"
        # A native sidecar, started before the runtime, hardened like our other containers.
        assert connector["restartPolicy"] == "Always"
        assert connector["image"] == "localhost/asya-rs/asya-state-proxy:dev", connector["image"]
        sc = connector["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False, sc
        runtime = next(c for c in pod["spec"]["containers"] if c["name"] == "asya-runtime")
        env = {e["name"]: e.get("value") for e in runtime.get("env", [])}
        assert env["ASYA_STATE_PROXY_MOUNTS"] == f"checkpoints:{MOUNT}:write=buffered", env

    route = {"actors": ["checkpointer", "reader"], "current": 0}
    runs = {f"r{i}": {"run": f"r{i}", "step": i, "loss": 1.0 / (i + 1)} for i in range(3)}
    for run, payload in runs.items():
        send(f"asya-{ns}-checkpointer", {"id": f"cp-{run}", "route": route, "payload": payload})

    sink = Collected(take, f"asya-{ns}-x-sink")
    got = wait_for("three checkpoints read back in x-sink", lambda: sink.at_least(3),
                   timeout=POD_TIMEOUT, interval=1.0)
    files = sorted(f"run-{r}.json" for r in runs)
    for env in got:
        out = env["payload"]
        run = out["checkpoint"]["run"]
        # What the reader opened is what the writer wrote, through S3.
        assert out["checkpoint"] == runs[run], out
        assert set(out["all"]) <= set(files) and f"run-{run}.json" in out["all"], out
    assert sorted(e["id"] for e in got) == sorted(f"cp-{r}" for r in runs)

    # In S3 itself: one object per checkpoint, under the namespace, with the handler's JSON.
    stored = objects(bucket, f"{ns}/")
    assert stored == {f"{ns}/run-{r}.json": p for r, p in runs.items()}, stored

    # Kill both pods without grace: the state is in S3, not in the pods.
    old = {p["metadata"]["name"] for name in ("checkpointer", "reader") for p in pods(ns, name)}
    kubectl("delete", "pods", "-n", ns, "--grace-period=0", "--force", *old)
    for name in ("checkpointer", "reader"):
        wait_for(f"a new running pod of {name}",
                 lambda n=name: [p for p in pods(ns, n) if running_ready(p) and p["metadata"]["name"] not in old],
                 timeout=POD_TIMEOUT, interval=1.0)
    send(f"asya-{ns}-reader", {"id": "after-kill", "route": {"actors": ["reader"], "current": 0},
                               "payload": {"run": "r1"}})
    after = Collected(take, f"asya-{ns}-x-sink")
    back = wait_for("the checkpoint read by the new pod", lambda: after.at_least(1),
                    timeout=POD_TIMEOUT, interval=1.0)
    assert back[0]["id"] == "after-kill"
    assert back[0]["payload"]["checkpoint"] == runs["r1"]
    assert back[0]["payload"]["all"] == files


def test_a_missing_checkpoint_is_a_file_not_found_in_x_sump(namespace, bucket, checkpoints_flavor):
    """The connector's 404 becomes the handler's FileNotFoundError (the original's mapping),
    and the envelope ends in x-sump with it, nothing written."""
    ns = namespace
    send, take = TRANSPORTS["rabbitmq"]
    apply_on_node(ns, "reader", {"transport": "rabbitmq", "image": EXAMPLES_IMAGE,
                                 "imagePullPolicy": "IfNotPresent", "flavors": [checkpoints_flavor],
                                 "handler": "checkpoints.load", "scaling": {"enabled": False},
                                 "replicas": 1})
    wait_running(ns, "reader")
    send(f"asya-{ns}-reader", {"id": "nothing", "route": {"actors": ["reader"], "current": 0},
                               "payload": {"run": "never-written"}})
    sump = Collected(take, f"asya-{ns}-x-sump")
    failed = wait_for("the envelope in x-sump", lambda: sump.at_least(1), timeout=POD_TIMEOUT, interval=1.0)
    assert failed[0]["id"] == "nothing"
    err = failed[0]["headers"]["x-asya-error"]
    assert err["type"] == "FileNotFoundError" and "run-never-written.json" in err["message"], err
    assert objects(bucket, f"{ns}/") == {}
