"""Tenancy of state (issue 34, docs/DESIGN.md §9 "State"), played by the tenant who wants
another namespace's state, on the test node with the test Redis and S3 server:

- the platform's own flavors (one Redis, one bucket, no prefix, as seed 002's library has
  them): a handler of namespace B neither reads, lists, overwrites nor deletes what a handler
  of namespace A stored under the same path, with either backend; what each stored is under its
  own namespace in the backend itself;
- an inline `stateProxy` of B whose STATE_PREFIX names A's namespace stores under `B/A/`;
- B holding its own Redis Secret (every tenant holds its namespace's Secrets) and speaking
  Redis directly: every read, write, listing or server command beyond `B/*` is refused by
  Redis itself, and without credentials nothing at all;
- a namespace deleted and made again (by another team) gets no Redis user over its
  predecessor's state until the platform team releases it.
Before this issue, each of these reached A's state (the connectors used the pod's ambient
credentials and plain-env prefixes; the Redis had no ACL)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import uuid

import pytest

from asya_e2e.actors import EXAMPLES_IMAGE, POD_TIMEOUT, apply_on_node, wait_running
from asya_e2e.brokers import TRANSPORTS
from asya_e2e.kube import kubectl, kubectl_json
from asya_e2e.s3 import bucket, keys  # noqa: F401 (bucket: a fixture)
from asya_e2e.wait import wait_for

pytestmark = pytest.mark.skipif(os.environ.get("ASYA_TEST_NODE", "1") == "0",
                                reason="ASYA_TEST_NODE=0: the test cluster runs without a node")

HOST_IP = os.environ.get("ASYA_TEST_HOST_IP", "10.245.0.1")
REDIS_PORT = os.environ.get("ASYA_TEST_REDIS_PORT", "6379")
REDIS_ADMIN_PASSWORD = os.environ.get("ASYA_TEST_REDIS_PASSWORD", "asya-test-redis-admin")
CACHE, CKPT = "/state/cache", "/state/ckpt"


def redis_cli(*args: str, user: str | None = None, password: str | None = None) -> str:
    """One command on the test Redis, as `user` (the admin, `default`, when both are None; no
    credentials at all with password=""); its reply or error text."""
    cmd = ["redis-cli", "-h", "127.0.0.1", "-p", REDIS_PORT, "--no-auth-warning"]
    if password is None and user is None:
        cmd += ["-a", REDIS_ADMIN_PASSWORD]
    elif password:
        cmd += ["--user", user or "default", "--pass", password]
    p = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=30)
    return (p.stdout + p.stderr).strip()


def s3_connector(bucket: str, prefix: str | None = None) -> dict:
    env = [{"name": "ASYA_CONNECTOR", "value": "s3-buffered-cas"},
           {"name": "STATE_BUCKET", "value": bucket},
           {"name": "AWS_REGION", "value": "us-east-1"},
           {"name": "AWS_ENDPOINT_URL", "value": f"http://{HOST_IP}:4566"},
           # moto takes any key; allowed here by stateProxy.allowStaticCredentials (a Warning).
           {"name": "AWS_ACCESS_KEY_ID", "value": "test"},
           {"name": "AWS_SECRET_ACCESS_KEY", "value": "test"}]
    if prefix is not None:
        env.append({"name": "STATE_PREFIX", "value": prefix})
    return {"name": "ckpt", "mount": {"path": CKPT},
            "connector": {"image": "asya-state-proxy", "imagePullPolicy": "IfNotPresent", "env": env}}


# The platform's Redis: no REDIS_URL, so injection points the connector at stateProxy.redis
# with the namespace's own user.
REDIS_ENTRY = {"name": "cache", "mount": {"path": CACHE},
               "connector": {"image": "asya-state-proxy", "imagePullPolicy": "IfNotPresent",
                             "env": [{"name": "ASYA_CONNECTOR", "value": "redis-buffered-cas"}]}}


@pytest.fixture
def shared_flavor(bucket):
    """The platform's flavor every namespace uses: one Redis, one bucket, no prefix."""
    name = f"state-{uuid.uuid4().hex[:8]}"
    doc = {"apiVersion": "asya.sh/v1alpha1", "kind": "Flavor", "metadata": {"name": name},
           "spec": {"stateProxy": [REDIS_ENTRY, s3_connector(bucket)]}}
    kubectl("apply", "-f", "-", input=json.dumps(doc))
    yield name
    kubectl("delete", "flavor.asya.sh", name, "--wait=false", check=False)


def fresh_namespace() -> str:
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    kubectl("create", "namespace", name)
    return name


@pytest.fixture
def two_namespaces():
    a, b = fresh_namespace(), fresh_namespace()
    yield a, b
    for ns in (a, b):
        kubectl("delete", "namespace", ns, "--wait=false", check=False)


def probe_spec(**extra) -> dict:
    return {"transport": "rabbitmq", "image": EXAMPLES_IMAGE, "imagePullPolicy": "IfNotPresent",
            "handler": "state_probe.probe", "scaling": {"enabled": False}, "replicas": 1, **extra}


class Prober:
    """Sends one file operation to a namespace's probe actor and returns where the envelope
    ended: ("sink", payload) or ("sump", the error header)."""

    def __init__(self, ns: str, actor: str = "probe"):
        self.ns, self.actor = ns, actor
        self.send, self.take = TRANSPORTS["rabbitmq"]
        self.seen: dict[str, tuple[str, dict]] = {}

    def _collect(self):
        for end in ("sink", "sump"):
            for env in self.take(f"asya-{self.ns}-x-{end}", 10):
                self.seen[env["id"]] = (end, env)
        return self.seen

    def __call__(self, op: str, path: str, **kw) -> tuple[str, dict]:
        eid = f"{op}-{uuid.uuid4().hex[:8]}"
        self.send(f"asya-{self.ns}-{self.actor}",
                  {"id": eid, "route": {"actors": [self.actor], "current": 0},
                   "payload": {"op": op, "path": path, **kw}})
        wait_for(f"{op} {path} in {self.ns} to end", lambda: eid in self._collect(),
                 timeout=POD_TIMEOUT, interval=0.5)
        end, env = self.seen.pop(eid)
        return (end, env["payload"]) if end == "sink" else (end, env["headers"]["x-asya-error"])


def ok(result: tuple[str, dict]) -> dict:
    end, body = result
    assert end == "sink", f"expected success, got {end}: {body}"
    return body


def refused(result: tuple[str, dict], error_type: str) -> dict:
    end, body = result
    assert end == "sump" and body["type"] == error_type, f"expected {error_type}, got {end}: {body}"
    return body


def redis_value(key: str) -> str | None:
    """What the connector stored at `key` (its hash's data field), read as the admin."""
    out = redis_cli("HGET", key, "d")
    return out or None


def test_a_handler_reaches_only_its_own_namespaces_state_on_both_backends(two_namespaces, shared_flavor, bucket):
    a, b = two_namespaces
    for ns in (a, b):
        apply_on_node(ns, "probe", probe_spec(flavors=[shared_flavor]))
    for ns in (a, b):
        wait_running(ns, "probe")
    pa, pb = Prober(a), Prober(b)

    for mount in (CACHE, CKPT):
        secret = f"{mount}/secret.txt"
        ok(pa("write", secret, data=f"A's secret in {mount}"))
        # B, under the very same path: nothing there, nothing listed, nothing to delete.
        refused(pb("read", secret), "FileNotFoundError")
        assert ok(pb("exists", secret))["exists"] is False
        assert ok(pb("list", mount))["entries"] == []
        refused(pb("delete", secret), "FileNotFoundError")
        # B's write is B's own file: A's is unchanged.
        ok(pb("write", secret, data="B's overwrite"))
        assert ok(pa("read", secret))["data"] == f"A's secret in {mount}"
        assert ok(pb("read", secret))["data"] == "B's overwrite"
        assert ok(pa("list", mount))["entries"] == ["secret.txt"]

    # In the backends themselves, each namespace's file is under its own namespace.
    assert redis_value(f"{a}/secret.txt") == f"A's secret in {CACHE}"
    assert redis_value(f"{b}/secret.txt") == "B's overwrite"
    stored = keys(bucket)
    assert stored == sorted([f"{a}/secret.txt", f"{b}/secret.txt"]), stored

    # Each namespace's connector runs as its own Redis user, from its own Secret.
    for ns in (a, b):
        pod = wait_running(ns, "probe")[0]
        cache = next(c for c in pod["spec"]["initContainers"] if c["name"] == "asya-state-proxy-cache")
        env = {e["name"]: e for e in cache["env"]}
        assert env["ASYA_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
        assert env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "asya-state-redis"
        assert "@" not in env["REDIS_URL"]["value"], env["REDIS_URL"]


def test_an_inline_prefix_naming_another_namespace_stays_inside_its_own(two_namespaces, bucket):
    a, b = two_namespaces
    apply_on_node(a, "probe", probe_spec(stateProxy=[s3_connector(bucket)]))
    # B's own stateProxy entry, its STATE_PREFIX set to A's namespace.
    apply_on_node(b, "probe", probe_spec(stateProxy=[s3_connector(bucket, prefix=a)]))
    wait_running(a, "probe")
    wait_running(b, "probe")
    pa, pb = Prober(a), Prober(b)
    ok(pa("write", f"{CKPT}/model.bin", data="A's model"))
    refused(pb("read", f"{CKPT}/model.bin"), "FileNotFoundError")
    ok(pb("write", f"{CKPT}/model.bin", data="B's model"))
    assert ok(pa("read", f"{CKPT}/model.bin"))["data"] == "A's model"
    stored = keys(bucket)
    assert stored == sorted([f"{a}/model.bin", f"{b}/{a}/model.bin"]), stored


def namespace_redis_user(ns: str) -> tuple[str, str]:
    data = kubectl_json("get", "secret", "asya-state-redis", "-n", ns)["data"]
    return (base64.b64decode(data["username"]).decode(), base64.b64decode(data["password"]).decode())


def test_a_tenant_holding_its_redis_secret_reaches_no_other_namespace(two_namespaces, shared_flavor):
    a, b = two_namespaces
    for ns in (a, b):
        apply_on_node(ns, "probe", probe_spec(flavors=[shared_flavor]))
    wait_running(a, "probe")
    ok(Prober(a)("write", f"{CACHE}/secret.txt", data="A's secret"))
    wait_for("B's Redis Secret", lambda: kubectl("get", "secret", "asya-state-redis", "-n", b,
                                                 check=False).returncode == 0, timeout=POD_TIMEOUT)
    user, password = namespace_redis_user(b)
    assert user == f"asya-ns-{b}"
    as_b = lambda *cmd: redis_cli(*cmd, user=user, password=password)  # noqa: E731
    # The credentials are good: B's own keys.
    assert as_b("HSET", f"{b}/mine", "d", "x") in ("1", "0"), as_b("HSET", f"{b}/mine", "d", "x")
    assert as_b("HGET", f"{b}/mine", "d") == "x"
    # Everything else is Redis's own refusal.
    for cmd in (["HGETALL", f"{a}/secret.txt"], ["HGET", f"{a}/secret.txt", "d"],
                ["DEL", f"{a}/secret.txt"], ["HSET", f"{a}/secret.txt", "d", "forged"],
                ["RENAME", f"{a}/secret.txt", f"{b}/stolen"],
                ["EVAL", "return redis.call('HGET', KEYS[1], 'd')", "1", f"{a}/secret.txt"],
                ["KEYS", "*"], ["SCAN", "0"], ["RANDOMKEY"], ["FLUSHALL"], ["FLUSHDB"],
                ["CONFIG", "GET", "*"], ["ACL", "LIST"], ["MONITOR"],
                ["SUBSCRIBE", "x"], ["GET", "asya:owner:" + a], ["SET", "asya:owner:" + b, "x"]):
        out = as_b(*cmd)
        assert "NOPERM" in out, f"{cmd}: {out}"
    assert redis_value(f"{a}/secret.txt") == "A's secret"
    # The old shared way in: no credentials at all.
    out = redis_cli("HGET", f"{a}/secret.txt", "d", password="")
    assert "NOAUTH" in out, out


def test_a_namespace_made_again_does_not_inherit_its_predecessors_state(shared_flavor):
    ns = f"e2e-again-{uuid.uuid4().hex[:6]}"
    kubectl("create", "namespace", ns)
    try:
        apply_on_node(ns, "probe", probe_spec(flavors=[shared_flavor]))
        wait_running(ns, "probe")
        ok(Prober(ns)("write", f"{CACHE}/results.json", data="the first team's results"))
        kubectl("delete", "namespace", ns, "--timeout=240s")
        wait_for(f"namespace {ns} gone",
                 lambda: kubectl("get", "namespace", ns, check=False).returncode != 0,
                 timeout=POD_TIMEOUT)
        # The first team's Redis user went with its last actor; its state stays, marked.
        assert "asya-ns-" + ns not in redis_cli("ACL", "USERS").split()
        assert redis_value(f"{ns}/results.json") == "the first team's results"

        # Another team gets the namespace name.
        kubectl("create", "namespace", ns)
        apply_on_node(ns, "probe", probe_spec(flavors=[shared_flavor]))

        def told():
            events = kubectl_json("get", "events", "-n", ns, "--field-selector",
                                  "involvedObject.name=probe")["items"]
            return [e["message"] for e in events
                    if e.get("reason") == "StateIdentity" and "earlier namespace" in e.get("message", "")]
        said = wait_for("the actor told its state is an earlier namespace's", told, timeout=POD_TIMEOUT)
        assert f"asya:owner:{ns}" in said[0], said
        st = kubectl_json("get", "asyncactor", "probe", "-n", ns)["status"]
        assert any(c["type"] == "WorkloadReady" and c["status"] == "False" and "earlier namespace" in c["message"]
                   for c in st.get("conditions", [])), st
        # No Redis user, no Secret, no workload: nothing reads the first team's results.
        assert "asya-ns-" + ns not in redis_cli("ACL", "USERS").split()
        assert kubectl("get", "secret", "asya-state-redis", "-n", ns, check=False).returncode != 0
        assert kubectl("get", "deployment", "probe", "-n", ns, check=False).returncode != 0

        # The platform team releases it, discarding the old state: the actor comes up, empty.
        keys = redis_cli("--scan", "--pattern", f"{ns}/*").split()
        if keys:
            redis_cli("DEL", *keys)
        redis_cli("DEL", f"asya:owner:{ns}")
        wait_running(ns, "probe")
        refused(Prober(ns)("read", f"{CACHE}/results.json"), "FileNotFoundError")
    finally:
        kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_static_keys_in_a_connector_are_announced_where_the_platform_allows_them(two_namespaces, bucket):
    """The test configuration allows them (moto, no IRSA); each actor that has them is told
    why they weaken isolation. Without the setting they are refused (the api's unit tests and
    `asya-webhook validate`)."""
    a, _ = two_namespaces
    doc = {"apiVersion": "asya.sh/v1alpha1", "kind": "AsyncActor",
           "metadata": {"name": "keyed", "namespace": a},
           "spec": probe_spec(stateProxy=[s3_connector(bucket)])}
    out = kubectl("apply", "-f", "-", input=json.dumps(doc))
    assert "static AWS keys" in out.stderr and "allowStaticCredentials" in out.stderr, out.stderr
