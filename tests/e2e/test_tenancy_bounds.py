"""Bounded by construction (issue 26; docs/DESIGN.md §9): an actor in a namespace the webhook
excludes is not reconciled (a condition and an event say why), and flavor ConfigMaps, which
any namespace can label, are read only within the size and count bounds of the cluster
configuration's `flavorLimits`: an actor using one past a bound is refused at admission with
the reason, and one admitted before shows it in its status.

The API server's answers (the admission refusal, the objects that exist) and the
provisioner's writes (status, events) are the evidence."""

from __future__ import annotations

import json
import uuid

import pytest

from asya_e2e.actors import FLAT, actor
from asya_e2e.env import RELEASE_NS, cluster_config, webhook_enabled
from asya_e2e.kube import apply, get, kubectl, kubectl_json, status
from asya_e2e.wait import wait_for

needs_webhook = pytest.mark.skipif(not webhook_enabled(), reason="the admission webhook is not enabled")


def limits() -> dict:
    """flavorLimits of the configuration the components run with (the chart's defaults)."""
    defaults = {"maxBytes": 16384, "maxPerNamespace": 16, "maxTotal": 512}
    return {**defaults, **cluster_config().get("flavorLimits", {})}


def flavor_map(ns: str, name: str, flavor: str, text: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": ns, "labels": {"asya.sh/flavor": flavor}},
            "data": {"flavor.yaml": text}}


def oversized(n: int) -> str:
    """A valid flavor.yaml of exactly `n` bytes: one env value padded to size."""
    head = "env:\n- name: PAD\n  value: "
    return head + "x" * (n - len(head))


def dry_run(ns: str, doc: dict):
    doc = {**doc, "metadata": {**doc["metadata"], "namespace": ns}}
    return kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(doc), check=False)


def events_about(ns: str, reason: str, name: str) -> list[dict]:
    return [e for e in kubectl_json("get", "events", "-n", ns)["items"]
            if e.get("reason") == reason and (e.get("regarding") or e.get("involvedObject") or {}).get("name") == name]


# --- actors in excluded namespaces ---------------------------------------------------------


@pytest.fixture
def excluded_actor():
    """An AsyncActor in the release namespace, which the chart always excludes (with
    kube-system): the webhook never sees it. Deleted afterwards (it has no finalizer)."""
    excluded = cluster_config().get("excludedNamespaces")
    if not excluded:
        pytest.skip("the running configuration has no excludedNamespaces (components older than issue 26)")
    assert RELEASE_NS in excluded, excluded
    name = f"excluded-{uuid.uuid4().hex[:6]}"
    apply(RELEASE_NS, actor(name, FLAT))
    yield RELEASE_NS, name
    kubectl("delete", "asyncactor", name, "-n", RELEASE_NS, "--wait=false", check=False)


def test_an_actor_in_an_excluded_namespace_gets_a_condition_and_no_deployment(excluded_actor):
    ns, name = excluded_actor

    def excluded_condition():
        conds = {c["type"]: c for c in status(ns, name).get("conditions", [])}
        c = conds.get("Reconciled")
        return c if c and c["status"] == "False" and c["reason"] == "NamespaceExcluded" else None

    cond = wait_for(f"{ns}/{name} condition Reconciled=False NamespaceExcluded", excluded_condition, timeout=60)
    assert f"namespace {ns} is excluded from admission" in cond["message"], cond
    assert "webhook.excludeNamespaces" in cond["message"], cond
    assert status(ns, name)["phase"] == "Degraded"
    wait_for(f"Warning event NamespaceExcluded about {name}", lambda: events_about(ns, "NamespaceExcluded", name),
             timeout=30)
    # Nothing was created: no finalizer, no workload, no ServiceAccount of the actor.
    live = get("asyncactor", ns, name)
    assert "asya.sh/queue-provisioner" not in live["metadata"].get("finalizers", []), live["metadata"]
    for kind in ("deployment", "statefulset"):
        assert get(kind, ns, name) is None, f"{kind} {ns}/{name} exists"
    assert not kubectl_json("get", "deployments", "-n", ns, "-l", f"asya.sh/actor={name}")["items"]


# --- flavor ConfigMaps past the bounds -----------------------------------------------------


@needs_webhook
def test_an_oversized_flavor_config_map_is_refused_with_its_size_and_the_limit(namespace):
    max_bytes = limits()["maxBytes"]
    kubectl("apply", "-f", "-", input=json.dumps(flavor_map(namespace, "big", "big-env", oversized(max_bytes + 1))))
    user = actor("uses-big", {**FLAT, "flavors": ["big-env"]})

    def refused():
        p = dry_run(namespace, user)
        return p.returncode != 0 and p.stderr

    # Until the webhook's cache has it, the flavor is only "not found" (a warning).
    msg = wait_for("the oversized flavor refused by the webhook", refused, timeout=30)
    assert "spec.flavors[0]" in msg and "big-env" in msg, msg
    assert f"ConfigMap {namespace}/big" in msg, msg
    assert f"flavor.yaml is {max_bytes + 1} bytes, over the limit of {max_bytes}" in msg, msg
    assert "flavorLimits.maxBytes" in msg, msg
    # At the bound it is read and the same actor is admitted.
    kubectl("apply", "-f", "-", input=json.dumps(flavor_map(namespace, "big", "big-env", oversized(max_bytes))))
    wait_for("the flavor at the bound admitted", lambda: dry_run(namespace, user).returncode == 0, timeout=30)


@needs_webhook
def test_a_flavor_grown_past_the_bound_after_admission_shows_in_the_actors_status(namespace):
    max_bytes = limits()["maxBytes"]
    kubectl("apply", "-f", "-", input=json.dumps(flavor_map(namespace, "grows", "grows-env", "env: []\n")))
    user = actor("uses-grows", {**FLAT, "flavors": ["grows-env"]})
    wait_for("the small flavor admitted",
             lambda: (p := dry_run(namespace, user)).returncode == 0 and "not found" not in p.stderr, timeout=30)
    apply(namespace, user)
    wait_for("the actor reconciled", lambda: status(namespace, "uses-grows").get("phase"), timeout=60)
    kubectl("apply", "-f", "-", input=json.dumps(flavor_map(namespace, "grows", "grows-env", oversized(max_bytes + 1))))
    # The flavor watch triggers a reconcile; should it run before the catalog's cache has the
    # change, the periodic one (60 s + spread) sees it.
    st = wait_for("the status naming the bound",
                  lambda: "flavorLimits.maxBytes" in (s := status(namespace, "uses-grows")).get("message", "") and s,
                  timeout=120, interval=1.0)
    assert st["phase"] == "Degraded", st
    assert f"flavor.yaml is {max_bytes + 1} bytes" in st["message"], st
    cond = {c["type"]: c for c in st["conditions"]}["FlavorsResolved"]
    assert (cond["status"], cond["reason"]) == ("False", "FlavorUnusable"), cond
    assert f"ConfigMap {namespace}/grows is unusable" in cond["message"], cond


@needs_webhook
def test_flavor_config_maps_past_the_namespace_count_are_not_read(namespace):
    per_ns = limits()["maxPerNamespace"]
    if per_ns > 32:
        pytest.skip(f"flavorLimits.maxPerNamespace is {per_ns}: too many ConfigMaps for a test")
    # Created in name order, so a fresh list of the webhook's watch keeps the same ones.
    names = [f"f{i:03d}" for i in range(per_ns + 1)]
    for n in names:
        kubectl("apply", "-f", "-", input=json.dumps(flavor_map(namespace, n, f"flavor-{n}", "env: []\n")))
    last = names[-1]
    user = actor("uses-last", {**FLAT, "flavors": [f"flavor-{last}"]})

    def refused():
        p = dry_run(namespace, user)
        return p.returncode != 0 and p.stderr

    msg = wait_for("the ConfigMap past the count refused", refused, timeout=30)
    assert f"namespace {namespace} already has {per_ns} flavor ConfigMaps" in msg, msg
    assert "flavorLimits.maxPerNamespace" in msg, msg
    # Deleting one frees its place: the next change of the last one is read.
    kubectl("delete", "configmap", names[0], "-n", namespace)
    kubectl("label", "configmap", last, "-n", namespace, "touched=1")
    wait_for("the freed place taken", lambda: dry_run(namespace, user).returncode == 0, timeout=30)


# --- spec size and actors per namespace (issue 34) -----------------------------------------


def max_spec_bytes() -> int:
    """policy.maxSpecBytes of the configuration the components run with (64 KiB by default)."""
    return cluster_config().get("policy", {}).get("maxSpecBytes", 65536)


@needs_webhook
def test_a_spec_over_max_spec_bytes_is_refused_with_its_size_and_the_limit(namespace):
    """Every actor's spec is kept in the webhook's and the provisioner's caches: one namespace
    must not be able to grow them without bound. A spec just under the limit is admitted."""
    limit = max_spec_bytes()

    def with_padding(n: int) -> dict:
        return actor("big", {**FLAT, "env": [{"name": "PAD", "value": "x" * n}]})

    base = len(json.dumps(with_padding(0)["spec"], separators=(",", ":")))
    p = dry_run(namespace, with_padding(limit - base))
    assert p.returncode == 0, p.stderr
    p = dry_run(namespace, with_padding(limit - base + 1))
    assert p.returncode != 0, p.stdout
    assert f"spec: Too long: {limit + 1} bytes, over the limit of {limit} (policy.maxSpecBytes in the cluster configuration)" in p.stderr, p.stderr


def test_a_resource_quota_caps_the_actors_of_a_namespace(namespace):
    """The exact per-namespace cap is Kubernetes' own (deploy/examples/quotas/): the API
    server counts AsyncActors by `count/asyncactors.asya.sh` and refuses one past it."""
    kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "asyncactors", "namespace": namespace},
        "spec": {"hard": {"count/asyncactors.asya.sh": "1"}}}))
    # Enforced once the quota controller has counted the namespace.
    wait_for("the quota counted", lambda: "count/asyncactors.asya.sh" in
             (get("resourcequota", namespace, "asyncactors") or {}).get("status", {}).get("used", {}), timeout=60)
    apply(namespace, actor("first", {**FLAT}))
    p = kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(actor("second", {**FLAT})), check=False)
    assert p.returncode != 0, p.stdout
    assert "exceeded quota: asyncactors" in p.stderr and "count/asyncactors.asya.sh" in p.stderr, p.stderr
