"""KEDA reads queue depth with a credential no tenant holds (issue 26, finding 1, its KEDA and
SQS parts), with the broker's and the API server's own answers as evidence.

RabbitMQ: every actor's ScaledObject refers to the ClusterTriggerAuthentication
`asya-{transport}`, whose Secret `asya-keda-{transport}` lives in KEDA's namespace and names
the broker user `asya-keda-monitor` (tag `monitoring`, `^$` permissions: statistics, no
messages); nothing of KEDA's is copied into actor namespaces (queue-provisioner/src/
keda_identity). SQS: the platform's static keys reach an actor namespace only with
`shareStaticCredentials: true` (the suite's `sqs` transport, for the test SQS server), announced by a
`SharedStaticCredentials` Warning on each actor; the `sqs-irsa` transport of
tests/e2e/values.yaml shares nothing and the suite configures no IRSA role, so its actors
say they cannot authenticate. Every wait polls a condition with a deadline.
"""

from __future__ import annotations

import base64
import json
import os
import urllib.error
import urllib.request

import pytest

from asya_e2e.actors import EXAMPLES_IMAGE, FLAT, POD_TIMEOUT, actor, apply_on_node, pods
from asya_e2e.brokers import RABBIT_MANAGEMENT, TRANSPORTS, Collected, management
from asya_e2e.env import RELEASE_NS, STATE
from asya_e2e.kube import apply, get, keda_running, kubectl_json, status
from asya_e2e.wait import wait_for

KEDA_NS = "keda"
MONITOR = "asya-keda-monitor"
CTA = "asya-rabbitmq"
KEDA_SECRET = "asya-keda-rabbitmq"
NO_IDENTITY = "NeitherShareStaticCredentialsNorRoleArn"


@pytest.fixture(scope="module", autouse=True)
def _provisioner_running():
    if not (STATE / "provisioner-url").exists():
        pytest.fail("the provisioner is not running: tests/e2e/up starts it")


def needs_keda():
    if not keda_running():
        pytest.skip("KEDA does not run in this cluster (ASYA_TEST_KEDA=0 or no node)")


def secret_values(ns: str, name: str) -> dict[str, str]:
    s = kubectl_json("get", "secret", name, "-n", ns)
    return {k: base64.b64decode(v).decode(errors="replace") for k, v in (s.get("data") or {}).items()}


def all_secret_values(ns: str) -> dict[str, dict[str, str]]:
    out = {}
    for s in kubectl_json("get", "secrets", "-n", ns)["items"]:
        out[s["metadata"]["name"]] = {k: base64.b64decode(v).decode(errors="replace")
                                      for k, v in (s.get("data") or {}).items()}
    return out


def holding(secrets: dict[str, dict[str, str]], credential: str) -> list[str]:
    """`secret/key` of every value that is the credential or carries it in a URL."""
    return [f"{name}/{k}" for name, data in secrets.items() for k, v in data.items()
            if v == credential or f":{credential}@" in v]


def monitor_identity() -> str:
    """The monitor's password, once the provisioner put its Secret in KEDA's namespace."""
    wait_for(f"Secret {KEDA_NS}/{KEDA_SECRET}", lambda: get("secret", KEDA_NS, KEDA_SECRET), timeout=60)
    return secret_values(KEDA_NS, KEDA_SECRET)["password"]


def as_monitor(method: str, path: str, password: str, body: dict | None = None) -> tuple[int, str]:
    """The management API's answer to the monitor user."""
    token = base64.b64encode(f"{MONITOR}:{password}".encode()).decode()
    req = urllib.request.Request(f"{RABBIT_MANAGEMENT}{path}", method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json", "Authorization": f"Basic {token}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def scaled(ns: str, name: str) -> bool:
    return status(ns, name).get("scalingMode") == "KEDA" and get("scaledobject", ns, name) is not None


def condition(ns: str, name: str, type_: str) -> dict:
    return next((c for c in status(ns, name).get("conditions", []) if c["type"] == type_), {})


def events_about(ns: str, name: str, reason: str) -> list[dict]:
    return [e for e in kubectl_json("get", "events", "-n", ns)["items"]
            if e.get("reason") == reason
            and (e.get("regarding") or e.get("involvedObject") or {}).get("name") == name]


# --- RabbitMQ ----------------------------------------------------------------------------------


def test_no_secret_in_an_actor_namespace_holds_kedas_or_the_platforms_broker_credential(namespace):
    needs_keda()
    ns = namespace
    apply(ns, actor("depth", {**FLAT, "transport": "rabbitmq"}))
    wait_for(f"{ns}/depth scaled by KEDA", lambda: scaled(ns, "depth"), timeout=60)
    trigger = get("scaledobject", ns, "depth")["spec"]["triggers"][0]
    assert trigger["authenticationRef"] == {"name": CTA, "kind": "ClusterTriggerAuthentication"}, trigger
    assert get("triggerauthentication", ns, "depth-trigger-auth") is None

    monitor = monitor_identity()
    platform = secret_values(RELEASE_NS, "rabbitmq-secret")["password"]
    secrets = all_secret_values(ns)
    assert "asya-transport-rabbitmq" not in secrets, sorted(secrets)
    assert holding(secrets, monitor) == [], "KEDA's credential is in the tenant's namespace"
    assert holding(secrets, platform) == [], "the platform's broker password is in the tenant's namespace"

    # The cluster object KEDA resolves: its Secret in KEDA's namespace, with the monitor's URL.
    cta = kubectl_json("get", "clustertriggerauthentication", CTA)
    assert cta["spec"]["secretTargetRef"] == [{"parameter": "host", "name": KEDA_SECRET, "key": "host"}]
    assert f"//{MONITOR}:" in secret_values(KEDA_NS, KEDA_SECRET)["host"]


def test_the_monitor_user_reads_statistics_and_the_broker_refuses_it_messages(namespace):
    needs_keda()  # the provisioner ensures the monitor only where KEDA's CRDs are
    ns = namespace
    apply(ns, actor("depth", {**FLAT, "transport": "rabbitmq"}))
    wait_for(f"{ns}/depth transport Ready", lambda: status(ns, "depth").get("transportStatus") == "Ready", timeout=60)
    password = monitor_identity()
    user = management("GET", f"/api/users/{MONITOR}")
    assert user["tags"] in (["monitoring"], "monitoring"), user
    perms = management("GET", f"/api/permissions/%2F/{MONITOR}")
    assert (perms["configure"], perms["write"], perms["read"]) == ("^$", "^$", "^$"), perms

    queue = f"asya-{ns}-depth"
    code, body = as_monitor("GET", f"/api/queues/%2F/{queue}", password)
    assert code == 200 and json.loads(body)["name"] == queue, (code, body)
    # Reading messages needs `read` on the queue: the broker says no.
    code, body = as_monitor("POST", f"/api/queues/%2F/{queue}/get", password,
                            {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"})
    assert code in (401, 403), (code, body)
    code, body = as_monitor("DELETE", f"/api/queues/%2F/{queue}/contents", password)
    assert code in (401, 403), (code, body)
    code, body = as_monitor("PUT", f"/api/users/{MONITOR}-2", password, {"password": "x", "tags": ""})
    assert code in (401, 403), (code, body)


@pytest.mark.skipif(os.environ.get("ASYA_TEST_NODE", "1") == "0",
                    reason="ASYA_TEST_NODE=0: the test cluster runs without a node")
def test_an_actor_still_scales_from_zero_through_the_cluster_trigger_authentication(namespace):
    needs_keda()
    ns = namespace
    send, take = TRANSPORTS["rabbitmq"]
    apply_on_node(ns, "wake", {"transport": "rabbitmq", "image": EXAMPLES_IMAGE, "imagePullPolicy": "IfNotPresent",
                               "handler": "testing.act",
                               "scaling": {"enabled": True, "minReplicaCount": 0, "maxReplicaCount": 2,
                                           "queueLength": 2, "pollingInterval": 1, "cooldownPeriod": 10}})
    wait_for("the ScaledObject ready", lambda: any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in (get("scaledobject", ns, "wake") or {}).get("status", {}).get("conditions", [])),
        timeout=POD_TIMEOUT, interval=1.0)
    wait_for("no pods before any work", lambda: pods(ns, "wake") == [], timeout=POD_TIMEOUT, interval=1.0)

    route = {"actors": ["wake"], "current": 0}
    for i in range(3):
        send(f"asya-{ns}-wake", {"id": f"w{i}", "route": route, "headers": {}, "payload": {"i": i}})
    sink = Collected(take, f"asya-{ns}-x-sink")
    got = wait_for("all 3 processed after scaling from zero", lambda: sink.at_least(3),
                   timeout=POD_TIMEOUT, interval=1.0)
    assert sorted(e["payload"]["i"] for e in got) == [0, 1, 2]
    assert get("triggerauthentication", ns, "wake-trigger-auth") is None


# --- SQS ---------------------------------------------------------------------------------------


def static_keys() -> set[str]:
    return set(secret_values(RELEASE_NS, "sqs-credentials").values())


def test_sqs_without_shared_keys_copies_none_and_the_actor_says_why(namespace):
    ns = namespace
    apply(ns, actor("private", {**FLAT, "transport": "sqs-irsa"}))
    cond = wait_for(f"{ns}/private says it has no AWS identity",
                    lambda: (c := condition(ns, "private", "TransportReady")).get("reason") == NO_IDENTITY and c,
                    timeout=60)
    assert cond["status"] == "False"
    assert "transports.sqs-irsa.config.shareStaticCredentials" in cond["message"], cond
    assert "actorServiceAccount.roleArn" in cond["message"], cond
    secrets = all_secret_values(ns)
    leaked = [f"{name}/{k}" for name, data in secrets.items() for k, v in data.items() if v in static_keys()]
    assert leaked == [], "the platform's static keys are in the tenant's namespace"
    assert events_about(ns, "private", "SharedStaticCredentials") == []
    if not keda_running():
        return
    # KEDA would read as the actor's own role, not with keys.
    wait_for("its TriggerAuthentication", lambda: get("triggerauthentication", ns, "private-trigger-auth"), timeout=60)
    ta = get("triggerauthentication", ns, "private-trigger-auth")
    assert ta["spec"] == {"podIdentity": {"provider": "aws", "identityOwner": "workload"}}, ta["spec"]


def test_sqs_shared_keys_are_announced_on_the_actor(namespace):
    needs_keda()  # announced when its TriggerAuthentication (with the keys) is applied
    ns = namespace
    apply(ns, actor("shared", {**FLAT, "transport": "sqs"}))
    found = wait_for(f"a SharedStaticCredentials Warning on {ns}/shared",
                     lambda: events_about(ns, "shared", "SharedStaticCredentials"), timeout=60)
    e = found[0]
    assert e["type"] == "Warning", e
    text = e.get("note") or e.get("message") or ""
    assert "shareStaticCredentials" in text and "sqs-credentials" in text, text
    assert condition(ns, "shared", "TransportReady").get("status") == "True"
