"""Commands against the test cluster: kubectl and helm with its kubeconfig, and the
object reads and writes the tests share."""

from __future__ import annotations

import json
import os
import subprocess

from asya_e2e.env import HELM, KUBECONFIG, KUBECTL


class CommandError(AssertionError):
    pass


def run(args, *, check=True, input=None, timeout=120, env=None):
    """Runs a command; returns CompletedProcess with text stdout/stderr."""
    full_env = dict(os.environ, KUBECONFIG=str(KUBECONFIG))
    if env:
        full_env.update(env)
    p = subprocess.run(
        [str(a) for a in args],
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )
    if check and p.returncode != 0:
        raise CommandError(
            f"command failed ({p.returncode}): {' '.join(map(str, args))}\n"
            f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}"
        )
    return p


def kubectl(*args, **kw):
    return run([KUBECTL, "--kubeconfig", KUBECONFIG, *args], **kw)


def kubectl_json(*args, **kw):
    return json.loads(kubectl(*args, "-o", "json", **kw).stdout)


def no_namespace_terminating() -> bool:
    """No namespace is being deleted: nothing an earlier test left is still being cleaned up
    (its actors' finalizer reconciles, its pods' termination)."""
    return not [n for n in kubectl_json("get", "namespaces")["items"] if n["status"].get("phase") == "Terminating"]


def helm(*args, **kw):
    return run([HELM, "--kubeconfig", KUBECONFIG, *args], **kw)


def keda_running() -> bool:
    """KEDA's operator runs in the test cluster (tests/cluster/up with the node, unless
    ASYA_TEST_KEDA=0): its HPAs really scale the workloads the provisioner renders."""
    out = run([KUBECTL, "get", "apiservice", "v1beta1.external.metrics.k8s.io", "-o",
               "jsonpath={.status.conditions[?(@.type=='Available')].status}"], check=False)
    return out.returncode == 0 and out.stdout.strip() == "True"


def get(kind: str, ns: str, name: str) -> dict | None:
    """The object, or None when it does not exist (or cannot be read right now)."""
    p = kubectl("get", kind, name, "-n", ns, "-o", "json", "--ignore-not-found", check=False)
    return json.loads(p.stdout) if p.returncode == 0 and p.stdout.strip() else None


def status(ns: str, name: str) -> dict:
    """The AsyncActor's status; {} while it has none or does not exist."""
    return (get("asyncactor", ns, name) or {}).get("status", {})


def apply(ns: str, doc: dict):
    """`kubectl apply` of `doc` in namespace `ns` (the caller's dict is left as it was)."""
    doc = json.loads(json.dumps(doc))
    doc.setdefault("metadata", {})["namespace"] = ns
    kubectl("apply", "-f", "-", input=json.dumps(doc))
