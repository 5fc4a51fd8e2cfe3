"""An AsyncActor grants nothing its author does not have (issue 26, finding 3;
docs/DESIGN.md §9).

A platform team lets a data-science team create AsyncActors but not Pods or Deployments. The
webhook renders each actor's pod (flavors merged) and, when it has a privilege (a hostPath
volume, a privileged container, another ServiceAccount, …), asks the API server with a
SubjectAccessReview whether the user who wrote it may create the Deployment themselves. The
users are impersonated (`kubectl --as --as-group`), their rights are real RBAC in the test
namespace, and the API server's answer (the webhook's refusal as kubectl prints it) is the
evidence. The Pod Security level the rendered pod must meet is the namespace's `enforce`
label, else baseline, whoever writes the actor: so the tests of the SubjectAccessReview run
in a namespace labelled `privileged`, where only the permission decides.

Actors in a namespace that enforces `restricted` are covered by test_tenancy_restricted.py.
"""

from __future__ import annotations

import json
import os

import pytest

from asya_e2e.actors import EXAMPLES_IMAGE, ON_TEST_NODE, actor, wait_running
from asya_e2e.env import webhook_enabled
from asya_e2e.kube import kubectl
from asya_e2e.wait import wait_for

pytestmark = pytest.mark.skipif(not webhook_enabled(),
                                reason="the webhook is not running in this environment (see tests/e2e/up output)")

ENFORCE = "pod-security.kubernetes.io/enforce"
PLAIN = {"image": "python:3.12-slim", "handler": "handlers.pipeline.double"}
# What a user who may create AsyncActors (and read them, for kubectl apply) may do.
AUTHOR_RULES = [{"apiGroups": ["asya.sh"], "resources": ["asyncactors"],
                 "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}]
DEPLOYER_RULES = AUTHOR_RULES + [{"apiGroups": ["apps"], "resources": ["deployments"],
                                  "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}]


def grant(ns: str, role: str, rules: list[dict], group: str) -> None:
    """A Role in `ns` bound to `group` (so the groups the API server passes the webhook, and
    the webhook the SubjectAccessReview, are what grants)."""
    kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": role, "namespace": ns}, "rules": rules}))
    kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": role, "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}]}))


class User:
    """A user impersonated through kubectl, in one group."""

    def __init__(self, name: str, group: str):
        self.name, self.group = name, group

    def kubectl(self, *args, **kw):
        return kubectl(f"--as={self.name}", f"--as-group={self.group}", *args, **kw)

    def can(self, verb: str, resource: str, ns: str) -> bool:
        return self.kubectl("auth", "can-i", verb, resource, "-n", ns, check=False).stdout.strip() == "yes"

    def apply(self, ns: str, name: str, spec: dict, *extra):
        doc = actor(name, spec)
        doc["metadata"]["namespace"] = ns
        return self.kubectl("apply", "-f", "-", *extra, input=json.dumps(doc), check=False)


@pytest.fixture
def author(namespace) -> User:
    """alice: may create AsyncActors in the namespace, not Pods nor Deployments."""
    group = f"{namespace}-authors"
    grant(namespace, "actor-author", AUTHOR_RULES, group)
    u = User("alice", group)
    wait_for("alice's RBAC in effect", lambda: u.can("create", "asyncactors.asya.sh", namespace), timeout=30)
    assert not u.can("create", "pods", namespace)
    assert not u.can("create", "deployments.apps", namespace)
    return u


@pytest.fixture
def deployer(namespace) -> User:
    """bob: may create AsyncActors and Deployments in the namespace."""
    group = f"{namespace}-deployers"
    grant(namespace, "actor-deployer", DEPLOYER_RULES, group)
    u = User("bob", group)
    wait_for("bob's RBAC in effect", lambda: u.can("create", "deployments.apps", namespace), timeout=30)
    return u


def label(ns: str, level: str) -> str:
    kubectl("label", "namespace", ns, f"{ENFORCE}={level}", "--overwrite")
    return ns


def refused(p, *needles: str) -> str:
    assert p.returncode != 0, f"admitted:\n{p.stdout}"
    for n in needles:
        assert n in p.stderr, f"{n!r} not in:\n{p.stderr}"
    return p.stderr


def needs_permission(ns: str) -> str:
    return f"needs permission to create deployments.apps in namespace {ns}"


def host_path(path: str = "/") -> dict:
    return {**PLAIN, "volumes": [{"name": "host", "hostPath": {"path": path}}],
            "volumeMounts": [{"name": "host", "mountPath": "/host"}]}


def workload(pod: dict) -> dict:
    """The workload shape with `pod` as its template's spec (an asya-runtime container first)."""
    runtime = {"name": "asya-runtime", "image": "python:3.12-slim",
               "env": [{"name": "ASYA_HANDLER", "value": "handlers.pipeline.double"}]}
    return {"workload": {"template": {"spec": {**pod, "containers": [runtime, *pod.get("containers", [])]}}}}


def test_an_author_is_refused_a_host_path_volume_naming_the_missing_permission(namespace, author):
    ns = label(namespace, "privileged")
    err = refused(author.apply(ns, "hostpath", host_path("/")),
                  'spec.volumes[0].hostPath.path: "/"', needs_permission(ns), 'user "alice"')
    assert "AsyncActor \"hostpath\" is forbidden" in err, err
    assert kubectl("get", "asyncactor", "hostpath", "-n", ns, "--ignore-not-found").stdout.strip() == ""


def test_an_author_is_refused_a_privileged_container(namespace, author):
    ns = label(namespace, "privileged")
    spec = workload({"containers": [{"name": "tool", "image": "python:3.12-slim",
                                     "securityContext": {"privileged": True}}]})
    refused(author.apply(ns, "privileged", spec),
            "spec.workload.template.spec.containers[1].securityContext.privileged: true", needs_permission(ns))


def test_an_author_is_refused_another_service_account(namespace, author):
    ns = label(namespace, "privileged")
    spec = workload({"serviceAccountName": "default"})
    refused(author.apply(ns, "other-sa", spec),
            'spec.workload.template.spec.serviceAccountName: "default"',
            "a ServiceAccount other than the actor's own", needs_permission(ns))
    # The actor's own ServiceAccount, written out, is no privilege.
    p = author.apply(ns, "own-sa", workload({"serviceAccountName": "asya-own-sa"}), "--dry-run=server")
    assert p.returncode == 0, p.stderr


def test_generate_name_borrows_no_identity(namespace, author):
    """Issue 34, item 3: with `generateName: worker` the review used to take `worker` as the
    name, so a template running as `asya-worker` (worker's ServiceAccount) counted as "its
    own" (no SubjectAccessReview) and `spec.actor` defaulted to `worker` (a second consumer
    on worker's queue). A CREATE with generateName is refused now, before anything is
    derived from it, whoever writes it."""
    ns = label(namespace, "privileged")
    doc = actor("ignored", workload({"serviceAccountName": "asya-worker"}))
    doc["metadata"] = {"generateName": "worker", "namespace": ns}
    # `kubectl create` (apply needs a name); server dry run, then for real: neither creates.
    for extra in (["--dry-run=server"], []):
        p = author.kubectl("create", "-f", "-", *extra, input=json.dumps(doc), check=False)
        refused(p, 'metadata.generateName: Invalid value: "worker"', "set metadata.name instead")
    assert kubectl("get", "asyncactors", "-n", ns, "-o", "name").stdout.strip() == ""


def test_an_author_is_refused_a_host_path_that_a_flavor_brings(namespace, author):
    ns = label(namespace, "privileged")
    flavor = f"e2e-{ns[-8:]}-node-logs"
    kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "asya.sh/v1alpha1", "kind": "Flavor", "metadata": {"name": flavor},
        "spec": {"volumes": [{"name": "logs", "hostPath": {"path": "/var/log"}}]}}))
    try:
        spec = {**PLAIN, "flavors": [flavor]}
        probe = json.dumps({**actor("probe", spec), "metadata": {"name": "probe", "namespace": ns}})

        def cached():
            # The admin (who may create Deployments) is admitted once the webhook has the flavor.
            p = kubectl("apply", "--dry-run=server", "-f", "-", input=probe, check=False)
            return p.returncode == 0 and "not found" not in p.stderr

        wait_for(f"flavor {flavor} in the webhook's cache", cached, timeout=30)
        refused(author.apply(ns, "flavored", spec),
                f'spec.volumes[0].hostPath.path: "/var/log" (set by flavor "{flavor}")', needs_permission(ns))
    finally:
        kubectl("delete", "flavor", flavor, "--ignore-not-found", check=False)


@pytest.mark.skipif(os.environ.get("ASYA_TEST_NODE", "1") == "0",
                    reason="ASYA_TEST_NODE=0: the test cluster runs without a node")
def test_the_same_authors_plain_actor_is_accepted_and_runs(namespace, author):
    """No privilege, no question: the actor is admitted in the default (baseline) namespace
    and its pods, created by the provisioner, run."""
    ns = namespace
    p = author.apply(ns, "plain", {"tolerations": ON_TEST_NODE, "image": EXAMPLES_IMAGE,
                                   "imagePullPolicy": "IfNotPresent", "handler": "pipeline.shout",
                                   "scaling": {"enabled": False}, "replicas": 1})
    assert p.returncode == 0, p.stderr
    wait_running(ns, "plain")


def test_a_user_who_may_create_deployments_keeps_that_power(namespace, deployer):
    """bob, through his group, may create Deployments: the hostPath actor is admitted (a
    server dry run: nothing runs) in a namespace whose level allows host paths."""
    ns = label(namespace, "privileged")
    p = deployer.apply(ns, "hostpath", host_path("/var/log"), "--dry-run=server")
    assert p.returncode == 0, p.stderr
    p = deployer.apply(ns, "other-sa", workload({"serviceAccountName": "default"}), "--dry-run=server")
    assert p.returncode == 0, p.stderr


def test_a_baseline_namespace_refuses_a_privileged_actor_even_for_an_admin(namespace):
    """The level binds everybody: the test's own identity (cluster admin) is refused a
    privileged container where the namespace enforces baseline, the refusal naming the level."""
    ns = label(namespace, "baseline")
    spec = workload({"containers": [{"name": "tool", "image": "python:3.12-slim",
                                     "securityContext": {"privileged": True}}]})
    doc = {**actor("privileged", spec), "metadata": {"name": "privileged", "namespace": ns}}
    p = kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(doc), check=False)
    refused(p, f'PodSecurity "baseline:latest" of namespace {ns}',
            "spec.workload.template.spec.containers[1].securityContext.privileged: true",
            "Pod Security baseline: privileged containers")


def test_an_unlabelled_namespace_enforces_baseline(namespace, deployer):
    """Without the label the level is baseline: even bob, who may create Deployments, gets
    no hostPath there."""
    p = deployer.apply(namespace, "hostpath", host_path("/"), "--dry-run=server")
    refused(p, f'PodSecurity "baseline:latest" of namespace {namespace}', 'spec.volumes[0].hostPath.path: "/"')


def test_a_restricted_namespace_refuses_a_workload_template_that_is_not_hardened(namespace):
    """Flat actors are hardened by the platform and run under restricted
    (test_tenancy_restricted.py); a workload template is the user's, and is checked as written."""
    ns = label(namespace, "restricted")
    doc = {**actor("bare", workload({})), "metadata": {"name": "bare", "namespace": ns}}
    p = kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(doc), check=False)
    refused(p, f'PodSecurity "restricted:latest" of namespace {ns}',
            "spec.workload.template.spec.containers[asya-runtime].securityContext.allowPrivilegeEscalation")
    doc = {**actor("flat", PLAIN), "metadata": {"name": "flat", "namespace": ns}}
    p = kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(doc), check=False)
    assert p.returncode == 0, p.stderr


FORGE = r"""
import json, socket, ssl, sys
review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
    "uid": "forged", "kind": {"group": "asya.sh", "version": "v1alpha1", "kind": "AsyncActor"},
    "resource": {"group": "asya.sh", "version": "v1alpha1", "resource": "asyncactors"},
    "operation": "CREATE", "namespace": sys.argv[1], "name": "probe",
    "userInfo": {"username": "system:admin", "groups": ["system:masters"]},
    "object": {"apiVersion": "asya.sh/v1alpha1", "kind": "AsyncActor",
               "metadata": {"name": "probe", "namespace": sys.argv[1]},
               "spec": {"image": "python:3.12-slim", "handler": "m.f",
                        "volumes": [{"name": "root", "hostPath": {"path": "/"}}]}}}}
body = json.dumps(review).encode()
ctx = ssl.create_default_context()
ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
try:
    with socket.create_connection(("asya-webhook.asya-system.svc", 443), timeout=10) as raw:
        with ctx.wrap_socket(raw) as s:
            s.sendall(b"POST /mutate/asyncactors HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      + b"Content-Length: %d\r\n\r\n" % len(body) + body)
            print("ANSWERED", s.recv(200))
except (OSError, ssl.SSLError) as e:
    print("REFUSED", type(e).__name__, e)
"""


@pytest.mark.skipif(os.environ.get("ASYA_TEST_NODE", "1") == "0",
                    reason="ASYA_TEST_NODE=0: the webhook runs as a local process, not behind its Service")
def test_a_tenant_pod_cannot_post_a_forged_review_to_the_webhook(namespace):
    """A tenant's pod reaches the webhook's Service, but only the API server's address may talk
    to the admission port (webhook.apiServerCIDRs, --allowed-source-cidrs): its connection is
    closed before TLS, so it cannot use the webhook as a SubjectAccessReview oracle for a
    forged user (here system:masters, asking for a hostPath actor)."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "forger", "namespace": namespace},
           "spec": {"restartPolicy": "Never", "tolerations": ON_TEST_NODE,
                    "containers": [{"name": "forger", "image": EXAMPLES_IMAGE, "imagePullPolicy": "IfNotPresent",
                                    "command": ["python3", "-c", FORGE, namespace],
                                    "securityContext": {"runAsNonRoot": True, "runAsUser": 65532,
                                                        "allowPrivilegeEscalation": False,
                                                        "capabilities": {"drop": ["ALL"]},
                                                        "seccompProfile": {"type": "RuntimeDefault"}}}]}}
    kubectl("apply", "-f", "-", input=json.dumps(pod))
    wait_for("the forger pod to finish", lambda: kubectl(
        "get", "pod", "forger", "-n", namespace, "-o", "jsonpath={.status.phase}").stdout in ("Succeeded", "Failed"),
        timeout=180, interval=1.0)
    out = kubectl("logs", "forger", "-n", namespace).stdout
    assert out.startswith("REFUSED"), out
    pod_ip = kubectl("get", "pod", "forger", "-n", namespace, "-o", "jsonpath={.status.podIP}").stdout
    # The webhook says whom it refused (at most once a minute: any refusal line will do, and
    # the first one after this pod names it unless another refusal came within the minute).
    logs = kubectl("logs", "-n", "asya-system", "-l", "app.kubernetes.io/component=webhook",
                   "--tail=-1", "--prefix").stdout
    assert "connection to the admission port refused" in logs, logs[-2000:]
    assert pod_ip, "the pod has no IP"
    # The API server itself still gets answers: this actor is admitted and defaulted.
    kubectl("apply", "-f", "-", input=json.dumps(actor("after", PLAIN) | {"metadata": {"name": "after", "namespace": namespace}}))
    assert kubectl("get", "asyncactor", "after", "-n", namespace, "-o", "jsonpath={.spec.actor}").stdout == "after"
