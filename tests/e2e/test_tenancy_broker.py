"""Namespaces are tenants at the broker (issue 26, finding 1; docs/DESIGN.md §9).

Each test plays a tenant trying to cross the line with the credentials its namespace really
holds (read from its Secret `asya-broker-rabbitmq` with kubectl), and takes RabbitMQ's own
answer as the evidence: 403 ACCESS_REFUSED on AMQP, 401 from the management API. The same
credentials still carry the namespace's own envelopes end to end.

The upgrade test moves an installed release from `shareAdminCredentials: true` (the platform's
password copied into actor namespaces) to the scoped default with envelopes in flight, and
counts them in x-sink afterwards; it restarts the webhook and the provisioner, so it is
`disruptive`."""

from __future__ import annotations

import base64
import json
import os
import urllib.error
import urllib.request
import uuid
from contextlib import contextmanager

import pytest

from asya_e2e.actors import EXAMPLES_IMAGE, POD_TIMEOUT, apply_on_node, pods, running_ready, wait_running
from asya_e2e.brokers import RABBIT_MANAGEMENT, RABBIT_PORT, Collected, management, rabbit_send, rabbit_take
from asya_e2e.components import e2e_up
from asya_e2e.env import CHART, RELEASE, RELEASE_NS
from asya_e2e.kube import helm, kubectl, kubectl_json
from asya_e2e.wait import wait_for

pika = pytest.importorskip("pika")

pytestmark = pytest.mark.skipif(os.environ.get("ASYA_TEST_NODE", "1") == "0",
                                reason="ASYA_TEST_NODE=0: the test cluster runs without a node")

SECRET = "asya-broker-rabbitmq"
ROTATE = "asya.sh/rotate"
VERSION = "asya.sh/broker-credential-version"
# The platform's own password (tests/e2e/up: Secret asya-system/rabbitmq-secret).
PLATFORM_PASSWORD = "guest"
# Rotation is acted on by the periodic reconcile (plan::PERIOD + SPREAD), then pods roll.
ROTATION_TIMEOUT = 150


def shout(ns: str, name: str = "shout") -> None:
    apply_on_node(ns, name, {"transport": "rabbitmq", "image": EXAMPLES_IMAGE, "imagePullPolicy": "IfNotPresent",
                             "handler": "pipeline.shout", "scaling": {"enabled": False}, "replicas": 1})


def make_namespace(name: str) -> str:
    kubectl("create", "namespace", name)
    wait_for(f"service account in {name}",
             lambda: kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0)
    return name


def identity(ns: str) -> tuple[str, str]:
    """The namespace's broker user and password, as a tenant reads them from its Secret."""
    s = wait_for(f"Secret {ns}/{SECRET}", lambda: kubectl_json("get", "secret", SECRET, "-n", ns, check=False)
                 if kubectl("get", "secret", SECRET, "-n", ns, check=False).returncode == 0 else None,
                 timeout=POD_TIMEOUT, interval=1.0)
    data = {k: base64.b64decode(v).decode() for k, v in s["data"].items()}
    return data["username"], data["password"]


def secret_version(ns: str) -> str | None:
    p = kubectl("get", "secret", SECRET, "-n", ns, "-o", "json", check=False)
    if p.returncode != 0:
        return None
    return json.loads(p.stdout)["metadata"].get("annotations", {}).get(VERSION)


@contextmanager
def channel_as(user: str, password: str):
    params = pika.ConnectionParameters(host="127.0.0.1", port=RABBIT_PORT, virtual_host="/",
                                       credentials=pika.PlainCredentials(user, password),
                                       connection_attempts=1, blocked_connection_timeout=10)
    conn = pika.BlockingConnection(params)
    try:
        yield conn
    finally:
        if conn.is_open:
            conn.close()


def refused(conn, action) -> str:
    """Runs `action(channel)` on a fresh channel of `conn` and returns the broker's refusal:
    the channel closed with 403 ACCESS_REFUSED (anything else fails the test)."""
    ch = conn.channel()
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        action(ch)
        # A refused publish closes the channel asynchronously: a round trip surfaces it.
        ch.queue_declare(queue="", passive=True)
    assert e.value.reply_code == 403 and "ACCESS_REFUSED" in e.value.reply_text, e.value
    return e.value.reply_text


def publish(exchange: str, key: str):
    return lambda ch: ch.basic_publish(exchange, key, json.dumps({"id": "forged"}).encode(), mandatory=True)


def envelope(ns: str, i: int, trace: str) -> dict:
    return {"id": f"t{i}", "route": {"actors": ["shout"], "current": 0}, "headers": {"trace_id": trace},
            "payload": {"word": f"w{i}", "position": i}}


# The tests of the `tenants` fixture stay on one xdist worker (tests/e2e/conftest.py), so its
# two namespaces and actors are made once; its names are fresh, so nothing else is shared.
shares_tenants = pytest.mark.xdist_group("tenancy_broker_tenants")


@pytest.fixture(scope="module")
def tenants():
    """Two namespaces, A and B, each with a running `shout` actor."""
    a = make_namespace(f"e2e-a-{uuid.uuid4().hex[:6]}")
    b = make_namespace(f"e2e-b-{uuid.uuid4().hex[:6]}")
    try:
        for ns in (a, b):
            shout(ns)
        for ns in (a, b):
            wait_running(ns, "shout")
        yield a, b
    finally:
        for ns in (a, b):
            kubectl("delete", "namespace", ns, "--wait=false", check=False)


@shares_tenants
def test_a_tenant_is_refused_everything_on_another_namespaces_queues(tenants):
    a, b = tenants
    user, password = identity(a)
    assert user == f"asya-ns-{a}"
    theirs = f"asya-{b}-shout"
    with channel_as(user, password) as conn:
        # Consuming, basic.get, purging, deleting B's queue.
        refused(conn, lambda ch: ch.basic_consume(theirs, lambda *_: None))
        refused(conn, lambda ch: ch.basic_get(theirs))
        refused(conn, lambda ch: ch.queue_purge(theirs))
        refused(conn, lambda ch: ch.queue_delete(theirs))
        refused(conn, lambda ch: ch.basic_get(f"asya-{b}-x-sink"))
        # Publishing into it through the platform's exchange, B's exchange, the default one.
        for exchange in ("asya", f"asya.{b}", ""):
            refused(conn, publish(exchange, theirs))
        # Declaring queues: a new one, and B's (a non-passive declare needs configure).
        refused(conn, lambda ch: ch.queue_declare(f"asya-{a}-new", durable=True))
        refused(conn, lambda ch: ch.queue_declare(theirs, durable=True))
        # Its own queue cannot be deleted or purged either (the provisioner owns it).
        refused(conn, lambda ch: ch.queue_delete(f"asya-{a}-shout"))
    # The management API: no tags, no access.
    req = urllib.request.Request(f"{RABBIT_MANAGEMENT}/api/queues", headers={
        "Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 401, e.value


@shares_tenants
def test_a_tenants_own_envelopes_still_go_end_to_end(tenants):
    """Through the platform's exchange (the gateway's way) and through the namespace's own
    exchange with its own credentials (the sidecar's way): all reach A's x-sink."""
    a, _ = tenants
    trace = uuid.uuid4().hex
    for i in range(2):
        rabbit_send(f"asya-{a}-shout", envelope(a, i, trace))
    user, password = identity(a)
    with channel_as(user, password) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(2, 4):
            ch.basic_publish(f"asya.{a}", f"asya-{a}-shout", json.dumps(envelope(a, i, trace)).encode(),
                             properties=pika.BasicProperties(delivery_mode=2, content_type="application/json"),
                             mandatory=True)
    sink = Collected(rabbit_take, f"asya-{a}-x-sink")
    got = wait_for("four results in A's x-sink", lambda: sink.at_least(4), timeout=POD_TIMEOUT, interval=1.0)
    assert sorted(e["payload"]["position"] for e in got) == [0, 1, 2, 3]
    assert all(e["headers"]["trace_id"] == trace for e in got)


@shares_tenants
def test_no_secret_in_a_tenant_namespace_holds_the_platforms_password(tenants):
    a, _ = tenants
    leaks = []
    for s in kubectl_json("get", "secrets", "-n", a)["items"]:
        for key, value in (s.get("data") or {}).items():
            text = base64.b64decode(value).decode(errors="replace")
            if text == PLATFORM_PASSWORD or f":{PLATFORM_PASSWORD}@" in text:
                leaks.append(f"{s['metadata']['name']}/{key}")
    assert leaks == [], leaks
    names = {s["metadata"]["name"] for s in kubectl_json("get", "secrets", "-n", a)["items"]}
    assert SECRET in names and "rabbitmq-secret" not in names, names


def test_a_namespace_never_reaches_the_queues_of_one_whose_name_extends_it():
    """`team` and `team-a`: the exact permissions of `team` do not match `asya-team-a-x-sink`,
    which a prefix regex `^asya-team-.*` would."""
    base = f"e2e-t{uuid.uuid4().hex[:5]}"
    team, team_a = make_namespace(base), make_namespace(f"{base}-a")
    try:
        shout(team)
        shout(team_a)
        wait_running(team, "shout")
        wait_running(team_a, "shout")
        rabbit_send(f"asya-{team_a}-shout", envelope(team_a, 0, "x"))
        wait_for("team-a's result waiting in its x-sink",
                 # A queue's counts appear in the management API after its first statistics
                 # sample (collect_statistics_interval): absent until then.
                 lambda: management("GET", f"/api/queues/%2F/asya-{team_a}-x-sink").get("messages", 0) >= 1,
                 timeout=POD_TIMEOUT, interval=1.0)
        user, password = identity(team)
        with channel_as(user, password) as conn:
            refused(conn, lambda ch: ch.basic_get(f"asya-{team_a}-x-sink"))
            refused(conn, lambda ch: ch.basic_get(f"asya-{team_a}-shout"))
            refused(conn, publish(f"asya.{team_a}", f"asya-{team_a}-shout"))
            # Its own x-sink it may read.
            ch = conn.channel()
            ch.basic_get(f"asya-{team}-x-sink")
        assert rabbit_take(f"asya-{team_a}-x-sink", 1), "team-a's result is still there"
    finally:
        for ns in (team, team_a):
            kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_rotation_refuses_the_old_password_and_the_actors_keep_working(namespace):
    ns = namespace
    shout(ns)
    wait_running(ns, "shout")
    user, old = identity(ns)
    before = secret_version(ns)
    kubectl("annotate", "secret", SECRET, "-n", ns, f"{ROTATE}=now")
    new_version = wait_for("a new credential version", lambda: (v := secret_version(ns)) and v != before and v,
                           timeout=ROTATION_TIMEOUT, interval=1.0)
    _, new = identity(ns)
    assert new != old
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        with channel_as(user, old):
            pass
    with channel_as(user, new):
        pass
    # The workload rolled: its pods carry the new version and run.
    wait_for("pods of the new credential version running", lambda: (p := pods(ns, "shout")) and all(
        x["metadata"].get("annotations", {}).get(VERSION) == new_version and running_ready(x) for x in p),
        timeout=POD_TIMEOUT, interval=1.0)
    trace = uuid.uuid4().hex
    for i in range(3):
        rabbit_send(f"asya-{ns}-shout", envelope(ns, i, trace))
    sink = Collected(rabbit_take, f"asya-{ns}-x-sink")
    got = wait_for("three results after the rotation", lambda: sink.at_least(3), timeout=POD_TIMEOUT, interval=1.0)
    assert sorted(e["payload"]["position"] for e in got) == [0, 1, 2]


def user_exists(user: str) -> bool:
    try:
        management("GET", f"/api/users/{user}")
        return True
    except urllib.error.HTTPError as e:
        assert e.code == 404, e
        return False


def test_the_namespaces_last_actor_takes_its_user_and_secret_with_it(namespace):
    ns = namespace
    shout(ns, "one")
    shout(ns, "two")
    identity(ns)
    user = f"asya-ns-{ns}"
    assert user_exists(user)
    kubectl("delete", "asyncactor", "one", "-n", ns)
    wait_for("actor one gone", lambda: kubectl("get", "asyncactor", "one", "-n", ns, check=False).returncode != 0,
             timeout=60)
    assert user_exists(user), "another actor remains"
    kubectl("delete", "asyncactor", "two", "-n", ns)
    wait_for("the broker user gone", lambda: not user_exists(user), timeout=60)
    wait_for("the Secret gone", lambda: kubectl("get", "secret", SECRET, "-n", ns, check=False).returncode != 0,
             timeout=60)


def helm_set_shared(on: bool) -> None:
    """`helm upgrade` of the installed release, values kept, with shareAdminCredentials `on`;
    returns once the webhook and provisioner run the new configuration."""
    helm("upgrade", RELEASE, CHART, "-n", RELEASE_NS, "--reuse-values",
         "--set", f"transports.rabbitmq.config.shareAdminCredentials={'true' if on else 'false'}",
         "--wait", "--timeout", "3m", timeout=300)
    for c in ("webhook", "provisioner"):
        kubectl("rollout", "status", f"deployment/{RELEASE}-{c}", "-n", RELEASE_NS, "--timeout=180s", timeout=200)
    # A replaced pod serves reviews through its preStop delay (webhook.shutdownDelaySeconds):
    # an actor's pod admitted meanwhile would be injected with the old configuration.
    wait_for("the replaced webhook and provisioner pods gone", lambda: not any(
        p["metadata"].get("deletionTimestamp") for p in kubectl_json(
            "get", "pods", "-n", RELEASE_NS, "-l", f"app.kubernetes.io/instance={RELEASE}")["items"]),
        timeout=120, interval=0.5)


@pytest.mark.disruptive
def test_upgrading_to_scoped_identities_loses_no_envelope(namespace):
    """Installed with shareAdminCredentials, envelopes in flight through a slow actor, `helm
    upgrade` to the scoped default: every envelope reaches x-sink, and the namespace ends with
    its own identity only (the copied platform password removed once every pod rolled)."""
    ns = namespace
    try:
        helm_set_shared(True)
        apply_on_node(ns, "slow", {"transport": "rabbitmq", "image": EXAMPLES_IMAGE, "imagePullPolicy": "IfNotPresent",
                                   "handler": "testing.act", "scaling": {"enabled": False}, "replicas": 1})
        wait_running(ns, "slow")
        names = {s["metadata"]["name"] for s in kubectl_json("get", "secrets", "-n", ns)["items"]}
        assert "rabbitmq-secret" in names, f"shared mode copies the platform's password: {names}"
        route = {"actors": ["slow"], "current": 0}
        n = 30
        for i in range(n):
            rabbit_send(f"asya-{ns}-slow", {"id": f"u{i}", "route": route, "headers": {},
                                            "payload": {"do": "sleep", "seconds": 1, "i": i}})
        sink = Collected(rabbit_take, f"asya-{ns}-x-sink")
        wait_for("the first result (work in flight)", lambda: sink.at_least(1), timeout=POD_TIMEOUT, interval=0.5)
        helm_set_shared(False)
        got = wait_for(f"all {n} envelopes in x-sink", lambda: sink.at_least(n), timeout=POD_TIMEOUT, interval=1.0)
        assert sorted(e["payload"]["i"] for e in got) == list(range(n))
        assert len(got) == n, "none twice"
        wait_for("the copied platform password removed", lambda: "rabbitmq-secret" not in {
            s["metadata"]["name"] for s in kubectl_json("get", "secrets", "-n", ns)["items"]},
            timeout=POD_TIMEOUT, interval=1.0)
        names = {s["metadata"]["name"] for s in kubectl_json("get", "secrets", "-n", ns)["items"]}
        assert SECRET in names, names
        user, password = identity(ns)
        with channel_as(user, password) as conn:
            refused(conn, lambda ch: ch.queue_delete(f"asya-{ns}-slow"))
    finally:
        # The environment as tests/e2e/up leaves it (its values, and the provisioner's new
        # pod address for the tests that read its metrics).
        e2e_up()
