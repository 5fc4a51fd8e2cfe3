"""Unambiguous ownership (issue 26, findings 2 and 6): each test plays a tenant whose names
meet another's, with the API server's and the broker's own answers as evidence.

- `asya-{namespace}-{actor}` is not injective: namespace N's actor `a-x-sink` and namespace
  `N-a`'s end queue x-sink are both `asya-N-a-x-sink`. The webhook refuses the second of the
  two, in either order, naming both (webhook/src/admission/collision.rs).
- A Deployment the actor did not create, with the actor's name, is neither taken over nor
  deleted with the actor; the actor's `NameConflict` condition names it while it exists
  (queue-provisioner/src/reconcile/ownership.rs).
- An SQS queue tagged for another actor is neither adopted, purged nor deleted: its messages
  and tags survive the actor (queue-provisioner/src/queue/owner.rs).

Every wait polls a condition with a deadline.
"""

from __future__ import annotations

import json
from contextlib import contextmanager

import pytest

from asya_e2e.actors import FLAT, actor
from asya_e2e.brokers import sqs, sqs_queue_url
from asya_e2e.env import STATE, webhook_enabled
from asya_e2e.kube import apply, get, kubectl, kubectl_json, status
from asya_e2e.wait import wait_for


@pytest.fixture(scope="module", autouse=True)
def _provisioner_running():
    if not (STATE / "provisioner-url").exists():
        pytest.fail("the provisioner is not running: tests/e2e/up starts it")


def needs_webhook():
    if not webhook_enabled():
        pytest.skip("the webhook is not running in this environment")


@contextmanager
def extra_namespace(name: str):
    """Namespace `name` for the block, deleted after it (not waited for)."""
    kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        kubectl("delete", "namespace", name, "--wait=false", check=False)


def doc_in(ns: str, name: str, spec: dict | None = None) -> str:
    d = actor(name, spec or {**FLAT})
    d["metadata"]["namespace"] = ns
    return json.dumps(d)


def refusal(ns: str, name: str) -> str:
    """Waits until the webhook refuses AsyncActor ns/name (its AsyncActor cache follows the
    API server by a watch event: a server-side dry run shows when it has the other actor),
    then creates it for real and returns the API server's refusal."""
    doc = doc_in(ns, name)

    def refused():
        p = kubectl("apply", "--dry-run=server", "-f", "-", input=doc, check=False)
        return p.returncode != 0 and "must not be shared" in p.stderr

    wait_for(f"webhook refuses {ns}/{name}", refused, timeout=30)
    p = kubectl("apply", "-f", "-", input=doc, check=False)
    assert p.returncode != 0, f"{ns}/{name} was admitted: {p.stdout}"
    assert get("asyncactor", ns, name) is None
    return p.stderr


def admitted(ns: str, name: str) -> None:
    """Creates AsyncActor ns/name once the webhook admits it (after the actor it collided
    with is gone from the webhook's cache)."""
    doc = doc_in(ns, name)
    wait_for(f"webhook admits {ns}/{name}",
             lambda: kubectl("apply", "--dry-run=server", "-f", "-", input=doc, check=False).returncode == 0,
             timeout=30)
    kubectl("apply", "-f", "-", input=doc)


def test_an_actor_named_like_another_namespaces_end_queue_is_refused_naming_both(namespace):
    """`N-a` has actors (so its end queue `asya-N-a-x-sink`); `N/a-x-sink` would drain it."""
    needs_webhook()
    ns = namespace
    with extra_namespace(f"{ns}-a") as other:
        apply(other, actor("y", {**FLAT}))
        msg = refusal(ns, "a-x-sink")
        assert 'metadata.name: Invalid value: "a-x-sink"' in msg, msg
        assert f'"asya-{ns}-a-x-sink"' in msg, msg
        assert f"AsyncActor {ns}/a-x-sink" in msg, msg
        assert f'end queue x-sink of namespace "{other}"' in msg, msg
        # An unrelated name in the same namespace is admitted.
        apply(ns, actor("b", {**FLAT}))


def test_the_first_actor_of_a_namespace_whose_end_queue_is_taken_is_refused_naming_both(namespace):
    """The reverse order: `N/a-x-sink` exists; `N-a`'s first actor would create its end
    queue `asya-N-a-x-sink`, which is that actor's queue."""
    needs_webhook()
    ns = namespace
    apply(ns, actor("a-x-sink", {**FLAT}))
    with extra_namespace(f"{ns}-a") as other:
        msg = refusal(other, "y")
        assert 'metadata.name: Invalid value: "y"' in msg, msg
        assert f'"asya-{other}-x-sink"' in msg, msg
        assert f"AsyncActor {other}/y" in msg, msg
        assert f"AsyncActor {ns}/a-x-sink" in msg, msg


def test_an_actor_queue_of_another_namespace_is_refused_in_both_orders(namespace):
    """`N/a-x` and `N-a/x` share `asya-N-a-x`: whichever comes second is refused."""
    needs_webhook()
    ns = namespace
    with extra_namespace(f"{ns}-a") as other:
        apply(ns, actor("a-x", {**FLAT}))
        msg = refusal(other, "x")
        assert f"AsyncActor {other}/x" in msg and f"AsyncActor {ns}/a-x" in msg, msg
        kubectl("delete", "asyncactor", "a-x", "-n", ns, "--wait=true", timeout=120)
        admitted(other, "x")
        msg = refusal(ns, "a-x")
        assert f"AsyncActor {ns}/a-x" in msg and f"AsyncActor {other}/x" in msg, msg


def foreign_deployment(ns: str, name: str) -> dict:
    """A Deployment someone else created under `name` (no pods: replicas 0)."""
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": ns, "labels": {"team": "web"}},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]}}}}


def condition(ns: str, name: str, type_: str) -> dict | None:
    return next((c for c in status(ns, name).get("conditions", []) if c.get("type") == type_), None)


def events_about(ns: str, reason: str, text: str) -> list[dict]:
    return [e for e in kubectl_json("get", "events", "-n", ns)["items"]
            if e.get("reason") == reason and text in (e.get("message") or e.get("note") or "")]


def test_a_deployment_the_actor_did_not_create_survives_it_and_is_named_in_its_condition(namespace):
    ns = namespace
    kubectl("apply", "-f", "-", input=json.dumps(foreign_deployment(ns, "web")))
    before = get("deployment", ns, "web")
    apply(ns, actor("web", {**FLAT}))
    c = wait_for("NameConflict condition", lambda: condition(ns, "web", "NameConflict"), timeout=60)
    assert c["status"] == "True", c
    assert f"Deployment {ns}/web exists and is not this actor's" in c["message"], c
    wait_for("NameConflict event", lambda: events_about(ns, "NameConflict", f"Deployment {ns}/web"), timeout=30)
    d = get("deployment", ns, "web")
    assert d["metadata"]["uid"] == before["metadata"]["uid"]
    assert d["metadata"].get("labels") == {"team": "web"}, "not taken over"
    assert not d["metadata"].get("ownerReferences"), d["metadata"]
    assert d["spec"]["template"]["spec"]["containers"][0]["image"] == "nginx:1.27"
    assert d["spec"]["replicas"] == 0
    # Nor handed to KEDA: a ScaledObject targets the workload by name.
    assert get("scaledobject", ns, "web") is None

    kubectl("delete", "asyncactor", "web", "-n", ns, "--wait=false")
    wait_for("actor gone", lambda: get("asyncactor", ns, "web") is None, timeout=60)
    d = get("deployment", ns, "web")
    assert d is not None, "a Deployment the actor did not create was deleted with it"
    assert d["metadata"]["uid"] == before["metadata"]["uid"]
    assert d["spec"]["template"]["spec"]["containers"][0]["image"] == "nginx:1.27"


def test_an_sqs_queue_tagged_for_another_actor_is_not_adopted_purged_or_deleted(namespace):
    ns = namespace
    queue = f"asya-{ns}-q"
    client = sqs()
    tags = {"asya.sh/namespace": f"{ns}-other", "asya.sh/actor": "x"}
    url = client.create_queue(QueueName=queue, tags=tags)["QueueUrl"]
    try:
        client.send_message(QueueUrl=url, MessageBody=json.dumps({"id": "theirs"}))
        apply(ns, actor("q", {**FLAT, "transport": "sqs"}))
        st = wait_for("transport QueueNotOurs",
                      lambda: status(ns, "q").get("transportStatus") == "QueueNotOurs" and status(ns, "q"), timeout=60)
        c = next(c for c in st["conditions"] if c["type"] == "TransportReady")
        assert c["status"] == "False" and c["reason"] == "QueueNotOurs", c
        assert f"queue {queue} belongs to actor {ns}-other/x" in c["message"], c
        assert f"not to actor {ns}/q" in c["message"], c
        wait_for("QueueNotOurs event", lambda: events_about(ns, "QueueNotOurs", queue), timeout=30)
        assert get("deployment", ns, "q") is None, "nothing runs on another actor's queue"

        kubectl("delete", "asyncactor", "q", "-n", ns, "--wait=false")
        wait_for("actor gone", lambda: get("asyncactor", ns, "q") is None, timeout=60)
        assert sqs_queue_url(queue) == url, "deleted with the actor"
        assert client.list_queue_tags(QueueUrl=url).get("Tags", {}) == tags, "re-tagged"
        attrs = client.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
        assert attrs["Attributes"]["ApproximateNumberOfMessages"] == "1", "purged"
    finally:
        client.delete_queue(QueueUrl=url)
