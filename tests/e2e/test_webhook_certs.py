"""Self-managed certificates against the real API server: the webhook creates its CA and
serving certificate in a Secret, publishes the CA as caBundle, serves with it, and reuses
them on restart (issue 4, certificates)."""

from __future__ import annotations

import base64
import os
import socket
import ssl
import subprocess
import urllib.request

import pytest
import yaml

from asya_e2e.env import KUBECONFIG, ROOT, bin_dir
from asya_e2e.kube import kubectl, kubectl_json
from asya_e2e.wait import wait_for

BIN = os.path.join(bin_dir(), "asya-webhook")

pytestmark = pytest.mark.skipif(not os.path.exists(BIN), reason="asya-webhook is not built")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(ns, port, mport, config_name, *extra):
    log = open(ROOT / "target" / "test-cluster" / "e2e" / f"selfmanaged-{ns}.log", "a")
    return subprocess.Popen(
        [BIN, "serve", "--addr", f"127.0.0.1:{port}", "--metrics-addr", f"127.0.0.1:{mport}",
         "--kubeconfig", str(KUBECONFIG), "--self-managed-secret", f"{ns}/webhook-certs",
         "--service-dns", "localhost", "--validating-webhook-config", config_name, *extra],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def ready_with(ca_pem: str, port: int) -> bool:
    ctx = ssl.create_default_context(cadata=ca_pem)
    try:
        with urllib.request.urlopen(f"https://localhost:{port}/readyz", context=ctx, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def ca_bundle(name: str) -> str:
    cfg = kubectl_json("get", "validatingwebhookconfiguration", name)
    b = cfg["webhooks"][0]["clientConfig"].get("caBundle")
    return base64.b64decode(b).decode() if b else ""


def test_self_managed_certificates_published_and_reused(namespace):
    name = f"asya-selfmanaged-{namespace}"
    port, mport = free_port(), free_port()
    cfg = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
           "metadata": {"name": name},
           "webhooks": [{"name": "probe.asya.sh", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                         "failurePolicy": "Ignore",
                         "clientConfig": {"url": f"https://127.0.0.1:{port}/validate/asyncactors"},
                         # Matches nothing real: the test must not affect other tests.
                         "rules": [{"apiGroups": ["example.invalid"], "apiVersions": ["v1"],
                                    "resources": ["nothings"], "operations": ["CREATE"]}]}]}
    kubectl("apply", "-f", "-", input=yaml.safe_dump(cfg))
    procs = []
    try:
        procs.append(start(namespace, port, mport, name))
        bundle = wait_for("caBundle published", lambda: ca_bundle(name), timeout=60)
        wait_for("the webhook serving with a certificate from that CA", lambda: ready_with(bundle, port), timeout=60)
        secret = kubectl_json("get", "secret", "webhook-certs", "-n", namespace)
        assert {"ca.crt", "ca.key", "tls.crt", "tls.key"} <= set(secret["data"])
        assert base64.b64decode(secret["data"]["ca.crt"]).decode().strip() in bundle
        rv = secret["metadata"]["resourceVersion"]

        procs[0].terminate()
        procs[0].wait(timeout=20)
        procs.append(start(namespace, port, mport, name))
        wait_for("the restarted webhook ready with the same CA", lambda: ready_with(bundle, port), timeout=60)
        # Reused, not regenerated: neither the Secret nor the bundle changed.
        assert kubectl_json("get", "secret", "webhook-certs", "-n", namespace)["metadata"]["resourceVersion"] == rv
        assert ca_bundle(name) == bundle

        # Running (checked every second here, every minute by default): a configuration whose
        # caBundle was lost gets it back, and a deleted Secret (an admin forcing a rotation)
        # is made again with a new CA, published and served.
        procs[-1].terminate()
        procs[-1].wait(timeout=20)
        procs.append(start(namespace, port, mport, name, "--self-managed-check-interval", "1s"))
        wait_for("ready again", lambda: ready_with(bundle, port), timeout=60)
        kubectl("patch", "validatingwebhookconfiguration", name, "--type=json",
                "-p", '[{"op": "remove", "path": "/webhooks/0/clientConfig/caBundle"}]')
        wait_for("caBundle published again", lambda: ca_bundle(name) == bundle, timeout=30)
        kubectl("delete", "secret", "webhook-certs", "-n", namespace)
        fresh = wait_for("a new CA published", lambda: (b := ca_bundle(name)) != bundle and b, timeout=30)
        wait_for("the webhook serving a certificate from the new CA", lambda: ready_with(fresh, port), timeout=30)
        regenerated = kubectl_json("get", "secret", "webhook-certs", "-n", namespace)
        assert base64.b64decode(regenerated["data"]["ca.crt"]).decode().strip() in fresh
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=20)
        kubectl("delete", "validatingwebhookconfiguration", name, check=False)
