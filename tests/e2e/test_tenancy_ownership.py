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
- A queue keeps its owner whatever happens to its actors, its namespace or the namespace's
  exchange (issue 34 item 2): its `QueueClaim` stays as long as the queue. A namespace's end
  queue left after its last actor, or a `skip-cleanup` leftover, is refused at admission to
  an actor named after it; a namespace deleted and created again does not get its
  predecessor's queues, and its actor's status says why (webhook/src/admission/collision.rs,
  queue-provisioner/src/reconcile/claims.rs).

Every wait polls a condition with a deadline.
"""

from __future__ import annotations

import json
from contextlib import contextmanager

import pytest

from asya_e2e.actors import FLAT, actor
from asya_e2e.brokers import management, rabbit_delete_queue, rabbit_publish, rabbit_queues, sqs, sqs_queue_url
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


# --- issue 34 item 2: the QueueClaim record -----------------------------------------------


def claim(queue: str) -> dict | None:
    """The QueueClaim of `queue` (cluster-scoped, named after the queue), or None."""
    p = kubectl("get", "queueclaim", queue, "-o", "json", check=False)
    return json.loads(p.stdout) if p.returncode == 0 else None


def namespace_uid(ns: str) -> str:
    return kubectl_json("get", "namespace", ns)["metadata"]["uid"]


def rabbit_messages(queue: str) -> int:
    """Messages in `queue`, counted by taking them and putting them back."""
    msgs = management("POST", f"/api/queues/%2F/{queue}/get",
                      {"count": 100, "ackmode": "ack_requeue_true", "encoding": "auto"})
    return len(msgs)


def released(queue: str) -> None:
    """What the platform team does to release a name: the queue, then its claim."""
    rabbit_delete_queue(queue)
    kubectl("delete", "queueclaim", queue, "--ignore-not-found")


def test_a_namespaces_results_queue_stays_its_own_after_its_last_actor_is_deleted(namespace):
    """`N-a` had an actor and has none now: its exchange `asya.N-a` is gone, its results
    queue `asya-N-a-x-sink` stays (with the results). `N` names an actor `a-x-sink` to read
    them: refused at admission by the queue's claim, naming both owners; the queue, its
    results and its claim are untouched."""
    needs_webhook()
    ns = namespace
    with extra_namespace(f"{ns}-a") as other:
        sink = f"asya-{other}-x-sink"
        apply(other, actor("y", {**FLAT}))
        c = wait_for(f"QueueClaim {sink}", lambda: claim(sink), timeout=60)
        assert c["spec"]["namespace"] == other and c["spec"]["actor"] == "x-sink", c
        assert c["spec"]["namespaceUid"] == namespace_uid(other), c
        rabbit_publish(sink, 2)  # team-a's results, not read yet
        kubectl("delete", "asyncactor", "y", "-n", other, "--wait=true", timeout=120)
        wait_for(f"queue asya-{other}-y and its claim gone",
                 lambda: claim(f"asya-{other}-y") is None and f"asya-{other}-y" not in rabbit_queues(), timeout=60)
        # Before issue 34: the end queue, bound to no tenant exchange, counted as adoptable
        # and the namespace (without actors) as having no end queues.
        msg = refusal(ns, "a-x-sink")
        assert 'metadata.name: Invalid value: "a-x-sink"' in msg, msg
        assert f'"{sink}"' in msg and f"AsyncActor {ns}/a-x-sink" in msg, msg
        assert f'the end queue x-sink of namespace "{other}" (QueueClaim {sink}' in msg, msg
        assert get("asyncactor", ns, "a-x-sink") is None
        assert sink in rabbit_queues(), "the results queue stays"
        assert rabbit_messages(sink) == 2, "the results stay"
        after = claim(sink)
        assert after["metadata"]["uid"] == c["metadata"]["uid"] and after["spec"] == c["spec"], after


def test_a_namespace_created_again_does_not_get_its_predecessors_queues_and_says_why(namespace):
    """`N-re` has an actor deleted with skip-cleanup (its queue is left) and results in its
    end queue; the namespace is deleted and created again by another team (same name, new
    uid). Its first actor is admitted (admission knows the name, not the uid) and gets no
    queue: its status names the earlier namespace's uid, its own, and how the platform team
    releases the queue. The predecessor's end queues go as after any namespace (empty at
    once, with results after endQueueRetention, 20 s here), then the new namespace gets its
    own; the skip-cleanup leftover stays the predecessor's until released."""
    needs_webhook()
    other = f"{namespace}-re"
    sink, left = f"asya-{other}-x-sink", f"asya-{other}-y"
    kubectl("create", "namespace", other)
    try:
        uid1 = namespace_uid(other)
        doc = actor("y", {**FLAT})
        doc["metadata"]["annotations"] = {"asya.sh/skip-cleanup": "true"}
        apply(other, doc)
        wait_for("the actor's queue claimed", lambda: claim(left) and claim(sink), timeout=60)
        rabbit_publish(sink, 1)
        kubectl("delete", "namespace", other, "--wait=true", timeout=180)
        kubectl("create", "namespace", other)
        uid2 = namespace_uid(other)
        assert uid2 != uid1
        assert claim(sink)["spec"]["namespaceUid"] == uid1, "the leftover keeps its owner"

        apply(other, actor("z", {**FLAT}))
        st = wait_for("z refused its predecessor's end queues",
                      lambda: status(other, "z").get("transportStatus") == "QueueNotOurs" and status(other, "z"),
                      timeout=60)
        c = next(c for c in st["conditions"] if c["type"] == "TransportReady")
        assert c["status"] == "False" and c["reason"] == "QueueNotOurs", c
        m = c["message"]
        assert f"belongs to an earlier namespace {other} (uid {uid1}), deleted since" in m, m
        assert f"this namespace {other} is uid {uid2}" in m, m
        assert "kubectl delete queueclaim" in m and f"kubectl patch queueclaim asya-{other}-x-s" in m, m
        wait_for("QueueNotOurs event", lambda: events_about(other, "QueueNotOurs", "earlier namespace"), timeout=30)
        assert get("deployment", other, "z") is None, "nothing runs on the predecessor's queues"
        assert claim(sink)["spec"]["namespaceUid"] == uid1
        # The predecessor's end queues go as after any deleted namespace; then z gets its own.
        wait_for("z on its own end queues",
                 lambda: status(other, "z").get("transportStatus") == "Ready"
                 and (claim(sink) or {}).get("spec", {}).get("namespaceUid") == uid2, timeout=180)
        assert rabbit_messages(sink) == 0, "a fresh queue, not the predecessor's"

        # The skip-cleanup leftover is not an end queue: it stays the predecessor's.
        assert left in rabbit_queues() and claim(left)["spec"]["namespaceUid"] == uid1
        apply(other, actor("y", {**FLAT}))
        st = wait_for("y refused its predecessor's leftover",
                      lambda: status(other, "y").get("transportStatus") == "QueueNotOurs" and status(other, "y"),
                      timeout=60)
        m = next(c for c in st["conditions"] if c["type"] == "TransportReady")["message"]
        assert f"queue {left} belongs to an earlier namespace {other} (uid {uid1})" in m, m
    finally:
        kubectl("delete", "namespace", other, "--wait=false", check=False)
        released(left)


def test_a_skip_cleanup_leftover_stays_its_namespaces(namespace):
    """`N/a-x` is deleted with skip-cleanup: its queue `asya-N-a-x` (with messages) and its
    claim stay. `N-a/x`, whose queue has the same name, is refused at admission; `N/a-x`
    created again gets its queue back (the same claim: nothing was released)."""
    needs_webhook()
    ns = namespace
    queue = f"asya-{ns}-a-x"
    doc = actor("a-x", {**FLAT})
    doc["metadata"]["annotations"] = {"asya.sh/skip-cleanup": "true"}
    apply(ns, doc)
    try:
        wait_for(f"QueueClaim {queue}", lambda: claim(queue), timeout=60)
        rabbit_publish(queue, 3)
        kubectl("delete", "asyncactor", "a-x", "-n", ns, "--wait=true", timeout=120)
        before = claim(queue)
        assert queue in rabbit_queues() and before["spec"]["actor"] == "a-x", before
        assert rabbit_messages(queue) == 3
        with extra_namespace(f"{ns}-a") as other:
            msg = refusal(other, "x")
            assert f'the queue of actor "a-x" of namespace "{ns}" (QueueClaim {queue}' in msg, msg
            assert f"AsyncActor {other}/x" in msg, msg
        assert rabbit_messages(queue) == 3, "the leftover's messages stay"
        apply(ns, actor("a-x", {**FLAT}))
        wait_for("a-x on its queue again", lambda: status(ns, "a-x").get("transportStatus") == "Ready", timeout=60)
        assert claim(queue)["metadata"]["uid"] == before["metadata"]["uid"], "its own claim, kept"
    finally:
        kubectl("delete", "asyncactor", "a-x", "-n", ns, "--wait=false", check=False)
