"""Deletion always completes (issue 26, finding 5): an AsyncActor goes within 60 s of its
deletion after a flavor it uses was edited into a conflict, with the webhook down, with the
broker stopped, and with `asya.sh/skip-cleanup: "true"`.

What makes it so: the chart's `matchConditions` (and the same rule in the webhook's code)
keep the AsyncActor webhooks out of UPDATEs that leave the spec unchanged, so the
provisioner's finalizer removal passes whatever the policy, the flavors or the webhook's
health (a spec change of an actor being deleted is sent, and refused: issue 34); and the provisioner's cleanup gives up on an unreachable broker after
a bounded time (queue-provisioner/src/reconcile/plan.rs, CLEANUP_GIVE_UP_AFTER), saying what
it left behind. Every wait polls a condition with a deadline.
"""

from __future__ import annotations

import json
import time

import pytest
import yaml

from asya_e2e.actors import FLAT, actor
from asya_e2e.brokers import rabbit_delete_queue, rabbit_queues, rabbit_stopped
from asya_e2e.components import process_stopped
from asya_e2e.env import CHART, STATE, webhook_enabled
from asya_e2e.kube import apply, get, helm, kubectl, kubectl_json, status
from asya_e2e.wait import wait_for

# The bound on a deletion, whatever is down.
DELETION_BOUND = 60


@pytest.fixture(scope="module", autouse=True)
def _provisioner_running():
    if not (STATE / "provisioner-url").exists():
        pytest.fail("the provisioner is not running: tests/e2e/up starts it")


def needs_webhook():
    if not webhook_enabled():
        pytest.skip("the webhook is not running in this environment")


def queue_of(ns: str, name: str) -> str:
    return f"asya-{ns}-{name}"


def provisioned(ns: str, name: str, spec: dict | None = None) -> str:
    """Applies the actor and waits until its queue is on the broker; returns the queue."""
    apply(ns, actor(name, spec or {**FLAT}))
    wait_for(f"{ns}/{name} transport Ready", lambda: status(ns, name).get("transportStatus") == "Ready", timeout=60)
    q = queue_of(ns, name)
    assert q in rabbit_queues()
    return q


def events_about(ns: str, reason: str, text: str) -> list[dict]:
    return [e for e in kubectl_json("get", "events", "-n", ns)["items"]
            if e.get("reason") == reason and text in (e.get("message") or e.get("note") or "")]


def event_text(ns: str, reason: str, text: str) -> str:
    """The message of the first event of `reason` that contains `text` (waited for)."""
    found = wait_for(f"event {reason} containing {text!r} in {ns}", lambda: events_about(ns, reason, text), timeout=30)
    e = found[0]
    return e.get("message") or e.get("note") or ""


def deleted_within(ns: str, name: str, bound: float = DELETION_BOUND) -> float:
    """Deletes the actor without waiting, then waits (at most `bound` s) until it is gone;
    returns how long that took."""
    t0 = time.monotonic()
    kubectl("delete", "asyncactor", name, "-n", ns, "--wait=false")

    try:
        wait_for(f"{ns}/{name} gone", lambda: get("asyncactor", ns, name) is None, timeout=bound)
    except AssertionError as e:
        left = get("asyncactor", ns, name) or {}
        meta = left.get("metadata", {})
        raise AssertionError(f"{e}\nfinalizers: {meta.get('finalizers')}; status: {json.dumps(left.get('status'))}"
                             f"\nevents: {kubectl('get', 'events', '-n', ns, check=False).stdout[-3000:]}") from None
    return time.monotonic() - t0


def flavor_doc(name: str, spec: dict) -> str:
    return json.dumps({"apiVersion": "asya.sh/v1alpha1", "kind": "Flavor", "metadata": {"name": name}, "spec": spec})


def test_actor_webhooks_skip_metadata_only_updates_and_see_every_spec_change():
    """The chart's contract (the pod webhook keeps being called for every labelled pod). An
    actor being deleted is no exception any more (issue 34): its spec changes are sent to the
    webhook, which refuses them; its metadata-only UPDATEs (the finalizer removal) are not."""
    # The validating webhook exists only with webhook.validateActorsSeparately (one call per
    # AsyncActor otherwise): both carry the conditions when it does.
    out = helm("template", "asya", CHART, "-n", "asya-system", "--set", "webhook.validateActorsSeparately=true",
               "--show-only", "templates/webhook-configurations.yaml").stdout
    hooks = {w["name"]: w for d in yaml.safe_load_all(out) if d for w in d["webhooks"]}
    for name in ["asyncactors.mutate.asya.sh", "asyncactors.validate.asya.sh"]:
        conds = {c["name"]: c["expression"] for c in hooks[name]["matchConditions"]}
        assert conds == {
            "spec-changed": "request.operation != 'UPDATE' || !has(object.spec) || !has(oldObject.spec)"
                            " || object.spec != oldObject.spec",
        }, name
    assert "matchConditions" not in hooks["pods.inject.asya.sh"]


def test_deletion_completes_after_a_flavor_turned_conflicting(namespace):
    """Both flavors resolve when the actor is admitted; one is then edited to set what the
    other sets. The webhook now refuses any spec change of the actor, yet its deletion (the
    provisioner's finalizer removal is an UPDATE) completes, and cleanup (which reads the
    retry policies of the resolved spec when it can, else the actor's own) deletes the queue."""
    needs_webhook()
    ns = namespace
    small, extra = f"e2e-{ns[-8:]}-small", f"e2e-{ns[-8:]}-extra"
    try:
        kubectl("apply", "-f", "-", input=flavor_doc(small, {"scaling": {"maxReplicaCount": 3}}))
        kubectl("apply", "-f", "-", input=flavor_doc(extra, {"env": [{"name": "FROM_FLAVOR", "value": "1"}]}))
        spec = {**FLAT, "flavors": [small, extra]}
        probe = json.dumps({**actor("probe", spec), "metadata": {"name": "probe", "namespace": ns}})

        def cached():
            p = kubectl("apply", "--dry-run=server", "-f", "-", input=probe, check=False)
            return p.returncode == 0 and "not found" not in p.stderr

        wait_for("both flavors in the webhook's cache", cached, timeout=30)
        q = provisioned(ns, "conflicted", spec)
        assert status(ns, "conflicted").get("resolvedFlavors") == [small, extra]

        kubectl("patch", "flavor", extra, "--type=merge", "-p", '{"spec":{"scaling":{"maxReplicaCount":5}}}')

        def refused_now():
            p = kubectl("patch", "asyncactor", "conflicted", "-n", ns, "--dry-run=server", "--type=merge",
                        "-p", '{"spec":{"image":"python:3.13-slim"}}', check=False)
            return p.returncode != 0 and small in p.stderr and extra in p.stderr and p.stderr

        wait_for("the webhook refuses a spec change naming both flavors", refused_now, timeout=30)

        took = deleted_within(ns, "conflicted")
        assert took < DELETION_BOUND
        text = event_text(ns, "QueueDeleted", q)
        assert f"queue {q} deleted" in text, text
        assert q not in rabbit_queues()
    finally:
        kubectl("delete", "flavor", small, extra, "--ignore-not-found", check=False)


def test_a_spec_change_of_an_actor_being_deleted_is_refused(namespace):
    """Issue 34: an UPDATE that changes the spec of a Terminating actor used to skip
    admission altogether (no policy, no privilege check). It is refused now, naming the field
    and the rule, while metadata-only UPDATEs of it (a label, the finalizer removal) pass."""
    needs_webhook()
    ns = namespace
    provisioned(ns, "leaving")
    # A finalizer nobody removes but this test holds the actor Terminating.
    kubectl("patch", "asyncactor", "leaving", "-n", ns, "--type=json",
            "-p", '[{"op": "add", "path": "/metadata/finalizers/-", "value": "e2e.asya.sh/hold"}]')
    try:
        kubectl("delete", "asyncactor", "leaving", "-n", ns, "--wait=false")
        wait_for("the actor is Terminating",
                 lambda: (get("asyncactor", ns, "leaving") or {}).get("metadata", {}).get("deletionTimestamp"),
                 timeout=30)
        # A privileged pod the author could not create otherwise: refused for the deletion
        # alone, before any other check.
        patch = {"spec": {"volumes": [{"name": "root", "hostPath": {"path": "/"}}],
                          "volumeMounts": [{"name": "root", "mountPath": "/host"}]}}
        p = kubectl("patch", "asyncactor", "leaving", "-n", ns, "--type=merge", "-p", json.dumps(patch), check=False)
        assert p.returncode != 0, p.stdout
        assert "spec: Forbidden: the AsyncActor is being deleted" in p.stderr, p.stderr
        # Metadata is still the writer's: a label passes.
        kubectl("label", "asyncactor", "leaving", "-n", ns, "e2e.asya.sh/touched=yes")
    finally:
        # Metadata only (the spec unchanged): admitted whatever the webhook says.
        left = (get("asyncactor", ns, "leaving") or {}).get("metadata", {}).get("finalizers") or []
        if "e2e.asya.sh/hold" in left:
            keep = [f for f in left if f != "e2e.asya.sh/hold"]
            kubectl("patch", "asyncactor", "leaving", "-n", ns, "--type=merge",
                    "-p", json.dumps({"metadata": {"finalizers": keep}}), check=False)
    wait_for("the actor is gone", lambda: get("asyncactor", ns, "leaving") is None, timeout=DELETION_BOUND)


@pytest.mark.disruptive
def test_deletion_completes_with_the_webhook_down(namespace):
    """With no webhook to answer and `failurePolicy: Fail`, a spec change is refused, but
    metadata-only UPDATEs and the finalizer removal of an actor being deleted are not sent to
    the webhook at all (the chart's matchConditions)."""
    needs_webhook()
    ns = namespace
    q = provisioned(ns, "orphaned")
    with process_stopped("webhook"):
        p = kubectl("patch", "asyncactor", "orphaned", "-n", ns, "--type=merge",
                    "-p", '{"spec":{"image":"python:3.13-slim"}}', check=False)
        assert p.returncode != 0, "a spec change needs the webhook, which is down"
        # A label is metadata: admitted without the webhook.
        kubectl("label", "asyncactor", "orphaned", "-n", ns, "e2e.asya.sh/touched=yes")

        took = deleted_within(ns, "orphaned")
        assert took < DELETION_BOUND
        text = event_text(ns, "QueueDeleted", q)
        assert f"queue {q} deleted" in text, text
    assert q not in rabbit_queues()


@pytest.mark.disruptive
def test_deletion_completes_with_the_broker_stopped_and_says_what_was_left(namespace):
    """The queue cannot be deleted: cleanup retries for a bounded time, then gives up with a
    Warning event naming the queue, deletes the actor's Kubernetes objects and releases it.
    (The CleanupIncomplete condition is written with the last status, but goes with the
    object a moment later: the provisioner's scenario tests check it.)"""
    ns = namespace
    q = provisioned(ns, "stranded")
    try:
        with rabbit_stopped():
            took = deleted_within(ns, "stranded")
            assert took < DELETION_BOUND
            text = event_text(ns, "CleanupIncomplete", q)
            assert f"queue {q} on rabbitmq" in text and "left behind" in text, text
            wait_for("the workload deleted anyway", lambda: get("deployment", ns, "stranded") is None, timeout=30)
            assert events_about(ns, "QueueDeleteFailed", q), "retried before giving up"
        assert q in rabbit_queues(), "the queue was left behind, as the event says"
    finally:
        rabbit_delete_queue(q)


def test_skip_cleanup_releases_the_actor_at_once(namespace):
    ns = namespace
    q = provisioned(ns, "released")
    try:
        kubectl("annotate", "asyncactor", "released", "-n", ns, "asya.sh/skip-cleanup=true")
        took = deleted_within(ns, "released")
        assert took < DELETION_BOUND
        text = event_text(ns, "CleanupSkipped", q)
        assert "asya.sh/skip-cleanup" in text and f"queue {q} on rabbitmq" in text, text
        assert not events_about(ns, "QueueDeleted", q)
        assert q in rabbit_queues(), "the broker was not asked"
    finally:
        rabbit_delete_queue(q)
