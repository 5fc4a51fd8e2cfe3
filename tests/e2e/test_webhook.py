"""The admission webhook against the real test cluster (issue 4).

The webhook runs as a local process started by tests/e2e/up; the API server calls it through
the chart's webhook configurations. Pods are never run (no kubelet): the tests read what the
API server stored.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from asya_e2e.components import process_stopped
from asya_e2e.env import ROOT, webhook_enabled
from asya_e2e.kube import kubectl, kubectl_json
from asya_e2e.wait import wait_for

EXAMPLES = ROOT / "deploy" / "examples"
INVALID = ROOT / "tests" / "fixtures" / "invalid"

pytestmark = pytest.mark.skipif(not webhook_enabled(), reason="the webhook is not running in this environment (see tests/e2e/up output)")


def docs(path: Path):
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def apply_doc(doc: dict, *extra, check=False):
    return kubectl("apply", "-f", "-", *extra, input=yaml.safe_dump(doc), check=check)


def ensure_namespace(name: str):
    kubectl("create", "namespace", name, check=False)


@pytest.fixture(scope="module")
def flavors():
    """The example flavors, applied once; waits until the webhook's cache serves them."""
    for f in sorted((EXAMPLES / "flavors").glob("*.yaml")):
        for d in docs(f):
            ns = d.get("metadata", {}).get("namespace")
            if ns:
                ensure_namespace(ns)
            # EnvironmentConfigs need Crossplane's CRD, which this cluster may not have.
            apply_doc(d)
    names = [d["metadata"]["name"] for f in (EXAMPLES / "flavors").glob("*.yaml") for d in docs(f) if d.get("kind") == "Flavor"]
    probe_ns = "default"
    for name in names:
        # A dry-run actor using the flavor is admitted without a "not found" warning once the
        # cache has it.
        actor = {"apiVersion": "asya.sh/v1alpha1", "kind": "AsyncActor",
                 "metadata": {"name": "flavor-probe", "namespace": probe_ns},
                 "spec": {"image": "python:3.13", "handler": "m.f", "flavors": [name]}}
        wait_for(f"flavor {name} in the webhook cache",
                 lambda: "not found" not in apply_doc(actor, "--dry-run=server").stderr, timeout=30)
    return names


def example_actor_files():
    return sorted((EXAMPLES / "actors").glob("*.yaml"))


# One xdist worker (tests/e2e/conftest.py) for every test that applies deploy/examples or
# cluster-scoped flavors of the same names, in the serial suite's order: the examples' flavors,
# then the invalid fixtures' (flavor-conflict-gpu-a100-scale-aggressive.yaml makes gpu-a100 the
# seed's other definition, which an examples apply on another worker put back mid-test once),
# and test_provisioner.py's examples test, which creates and deletes these actors for real.
examples_group = pytest.mark.xdist_group("examples")


@examples_group
@pytest.mark.parametrize("path", example_actor_files(), ids=lambda p: p.name)
def test_example_actor_is_admitted(path, flavors):
    for d in docs(path):
        ns = d.get("metadata", {}).get("namespace", "default")
        ensure_namespace(ns)
        p = apply_doc(d, "--dry-run=server", "-n", ns)
        assert p.returncode == 0, f"{path.name} refused:\n{p.stderr}"
        assert "created (server dry run)" in p.stdout or "configured (server dry run)" in p.stdout or "unchanged" in p.stdout, p.stdout


def crossplane_crd() -> bool:
    return kubectl("get", "crd", "environmentconfigs.apiextensions.crossplane.io", check=False).returncode == 0


def invalid_fixtures():
    out = []
    for f in sorted(INVALID.glob("*.yaml")):
        text = f.read_text()
        expects = re.findall(r"^# expect: (.+)$", text, re.M)
        if "# config:" in text:
            continue  # needs a cluster configuration other than the e2e one
        out.append((f, expects))
    return out


@examples_group
@pytest.mark.parametrize("path,expects", invalid_fixtures(), ids=lambda x: x.name if isinstance(x, Path) else "")
def test_invalid_example_is_refused_with_its_message(path, expects, flavors):
    if "kind: EnvironmentConfig" in path.read_text() and not crossplane_crd():
        pytest.skip("needs Crossplane's EnvironmentConfig CRD, not installed in the test cluster")
    for d in docs(path):
        ns = d.get("metadata", {}).get("namespace")
        if ns:
            ensure_namespace(ns)
    # Flavors the fixture brings are created for real (a dry run would not reach the cache);
    # the AsyncActors only in a server dry run.
    actors = []
    for d in docs(path):
        if d.get("kind") == "AsyncActor":
            actors.append(d)
        else:
            apply_doc(d, check=True)
    body = yaml.safe_dump_all(actors)

    def refused():
        p = kubectl("apply", "--dry-run=server", "-f", "-", input=body, check=False)
        return p if p.returncode != 0 else None

    p = wait_for(f"{path.name} to be refused", refused, timeout=30)
    if "strict decoding error: unknown field" in p.stderr:
        # The CRD's structural schema refuses the field before any webhook is called; the
        # refusal names the field all the same.
        field = re.search(r'^(spec\.[A-Za-z.]+): ', expects[0]).group(1)
        assert f'unknown field "{field}"' in p.stderr, p.stderr
        return
    for e in expects:
        if e.startswith("data.") and "kind: EnvironmentConfig" in path.read_text():
            # The EnvironmentConfig's own error: Crossplane's object, not sent to this webhook
            # (`asya-webhook validate` reports it); the actor using it is refused, checked here.
            continue
        # kubectl prints the webhook's message; quotes may be escaped in its output.
        assert e in p.stderr or e.replace('"', '\\"') in p.stderr, f"{path.name}: missing {e!r} in:\n{p.stderr}"


def test_alias_warning_is_shown_and_object_stored_canonical(namespace):
    actor = {"apiVersion": "asya.sh/v1alpha1", "kind": "AsyncActor",
             "metadata": {"name": "alias", "namespace": namespace},
             "spec": {"image": "python:3.13", "handler": "m.f", "scaling": {"minReplicas": 1, "maxReplicas": 3}}}
    p = apply_doc(actor, check=True)
    assert "Warning:" in p.stderr and "minReplicas" in p.stderr, p.stderr
    stored = kubectl_json("get", "asyncactor", "alias", "-n", namespace)
    assert stored["spec"]["scaling"] == {"minReplicaCount": 1, "maxReplicaCount": 3}
    assert stored["spec"]["actor"] == "alias"
    assert stored["spec"]["transport"] == "rabbitmq"


def test_update_may_not_change_transport(namespace):
    actor = {"apiVersion": "asya.sh/v1alpha1", "kind": "AsyncActor",
             "metadata": {"name": "imm", "namespace": namespace},
             "spec": {"image": "python:3.13", "handler": "m.f", "transport": "rabbitmq"}}
    apply_doc(actor, check=True)
    actor["spec"]["transport"] = "sqs"
    p = apply_doc(actor)
    assert p.returncode != 0
    assert "spec.transport" in p.stderr and "immutable" in p.stderr, p.stderr


def test_missing_flavor_is_a_warning(namespace):
    actor = {"apiVersion": "asya.sh/v1alpha1", "kind": "AsyncActor",
             "metadata": {"name": "waiting", "namespace": namespace},
             "spec": {"image": "python:3.13", "handler": "m.f", "flavors": ["does-not-exist-yet"]}}
    p = apply_doc(actor, check=True)
    assert "Warning:" in p.stderr and "does-not-exist-yet" in p.stderr, p.stderr


def test_deleted_namespaced_flavor_leaves_the_catalog(namespace):
    """A flavor ConfigMap's deletion reaches the webhook's catalog like its creation does."""
    cm = {"apiVersion": "v1", "kind": "ConfigMap",
          "metadata": {"name": "team-flavor", "namespace": namespace, "labels": {"asya.sh/flavor": "team-env"}},
          "data": {"flavor.yaml": "env:\n- name: TEAM\n  value: a\n"}}
    actor = {"apiVersion": "asya.sh/v1alpha1", "kind": "AsyncActor",
             "metadata": {"name": "teamed", "namespace": namespace},
             "spec": {"image": "python:3.13", "handler": "m.f", "flavors": ["team-env"]}}

    def warns_missing():
        p = apply_doc(actor, "--dry-run=server", check=True)
        return 'flavor "team-env" not found' in p.stderr

    apply_doc(cm, check=True)
    wait_for("the flavor in the webhook's catalog", lambda: not warns_missing(), timeout=30)
    kubectl("delete", "configmap", "team-flavor", "-n", namespace)
    wait_for("the deleted flavor gone from the catalog", warns_missing, timeout=30)


def pod_doc(ns, name, labels, annotations=None):
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": labels, "annotations": annotations or {}},
            "spec": {"containers": [{"name": "asya-runtime", "image": "python:3.13-slim"}]}}


def container_names(spec):
    return [c["name"] for c in spec.get("containers", [])], [c["name"] for c in spec.get("initContainers", [])]


def test_labelled_deployment_creates_injected_pods(namespace):
    actor = {"apiVersion": "asya.sh/v1alpha1", "kind": "AsyncActor",
             "metadata": {"name": "echo", "namespace": namespace},
             "spec": {"image": "python:3.13-slim", "handler": "echo.handle", "transport": "sqs"}}
    apply_doc(actor, check=True)
    labels = {"app": "echo", "asya.sh/inject": "true", "asya.sh/actor": "echo"}
    dep = {"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": "echo-e2e", "namespace": namespace},
           "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "echo"}},
                    "template": {"metadata": {"labels": labels},
                                 "spec": {"containers": [{"name": "asya-runtime", "image": "python:3.13-slim"}]}}}}
    apply_doc(dep, check=True)
    pods = wait_for("a pod of the Deployment",
                    lambda: kubectl_json("get", "pods", "-n", namespace, "-l", "app=echo")["items"], timeout=60)
    pod = pods[0]
    _, inits = container_names(pod["spec"])
    assert "asya-sidecar" in inits and "asya-install-runtime" in inits, inits
    sidecar = next(c for c in pod["spec"]["initContainers"] if c["name"] == "asya-sidecar")
    assert sidecar["restartPolicy"] == "Always"
    env = {e["name"]: e for e in sidecar["env"]}
    assert env["ASYA_TRANSPORT"]["value"] == "sqs"
    assert env["ASYA_ACTOR_NAME"]["value"] == "echo"
    assert env["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"]["name"] == "sqs-credentials"
    rt = pod["spec"]["containers"][0]
    assert rt["command"] == ["python3", "/opt/asya/asya_runtime.py"]
    # The API server's ServiceAccount plugin gave the runtime the pod's token; the containers
    # injected after it carry an empty mount at that path instead (they never call the API).
    token_path = "/var/run/secrets/kubernetes.io/serviceaccount"
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mount = {c["name"]: next((m for m in c.get("volumeMounts", []) if m["mountPath"] == token_path), None)
             for c in pod["spec"]["initContainers"] + pod["spec"]["containers"]}
    assert "projected" in volumes[mount["asya-runtime"]["name"]], mount
    for c in ("asya-sidecar", "asya-install-runtime"):
        assert mount[c] and mount[c]["readOnly"], (c, mount[c])
        assert volumes[mount[c]["name"]].get("emptyDir") == {}, volumes[mount[c]["name"]]
    assert {"name": "ASYA_HANDLER", "value": "echo.handle"} in rt["env"]
    assert "asya.sh/injected" in pod["metadata"]["annotations"]


def test_annotated_pod_without_asyncactor_is_injected(namespace):
    p = pod_doc(namespace, "annotated", {"asya.sh/inject": "true", "asya.sh/actor": "solo"},
                {"asya.sh/handler": "solo.handle"})
    apply_doc(p, check=True)
    stored = kubectl_json("get", "pod", "annotated", "-n", namespace)
    _, inits = container_names(stored["spec"])
    assert "asya-sidecar" in inits


def test_labelled_pod_without_configuration_is_refused(namespace):
    p = apply_doc(pod_doc(namespace, "lost", {"asya.sh/inject": "true", "asya.sh/actor": "nobody"}))
    assert p.returncode != 0
    assert "asya.sh/handler" in p.stderr and "AsyncActor" in p.stderr, p.stderr


def test_unlabelled_pod_is_untouched(namespace):
    apply_doc(pod_doc(namespace, "plain", {"app": "plain"}), check=True)
    stored = kubectl_json("get", "pod", "plain", "-n", namespace)
    containers, inits = container_names(stored["spec"])
    assert containers == ["asya-runtime"] and inits == []
    assert "asya.sh/injected" not in (stored["metadata"].get("annotations") or {})
    assert "command" not in stored["spec"]["containers"][0]


@pytest.mark.disruptive
def test_webhook_stopped_unlabelled_pods_still_admitted(namespace):
    """Stops the webhook, then starts it again through tests/e2e/up."""
    with process_stopped("webhook"):
        apply_doc(pod_doc(namespace, "while-down", {"app": "x"}), check=True)
        assert kubectl_json("get", "pod", "while-down", "-n", namespace)["metadata"]["name"] == "while-down"
        # A labelled pod is refused (failurePolicy Fail): never created without its sidecar.
        p = apply_doc(pod_doc(namespace, "labelled-while-down", {"asya.sh/inject": "true", "asya.sh/actor": "a"},
                              {"asya.sh/handler": "m.f"}))
        assert p.returncode != 0, p.stdout
