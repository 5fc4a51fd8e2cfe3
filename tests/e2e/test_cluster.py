"""The test cluster itself (issue 3): a real API server with etcd, the controller manager,
RBAC, service-account tokens, admission webhooks, and KEDA's CRDs."""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from asya_e2e.kube import kubectl, kubectl_json
from asya_e2e.wait import wait_for


def test_readyz_ok():
    assert kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"


def test_server_version_is_1_35():
    v = kubectl_json("version")
    assert v["serverVersion"]["gitVersion"].startswith("v1.35."), v
    assert (v["serverVersion"]["major"], v["serverVersion"]["minor"]) == ("1", "35"), v
    assert v["clientVersion"]["gitVersion"] == v["serverVersion"]["gitVersion"], v


def test_admission_plugins_and_rbac_enabled():
    # The webhook admission plugins register these API resources' admission paths; RBAC
    # registers its API group. Both must be served.
    groups = {g["name"] for g in json.loads(kubectl("get", "--raw", "/apis").stdout)["groups"]}
    assert "admissionregistration.k8s.io" in groups
    assert "rbac.authorization.k8s.io" in groups
    # RBAC really decides: an unbound service account may not list secrets.
    out = kubectl("auth", "can-i", "list", "secrets", "--as=system:serviceaccount:default:nobody", check=False)
    assert out.stdout.strip() == "no", out.stdout + out.stderr
    assert kubectl("auth", "can-i", "list", "secrets").stdout.strip() == "yes"


def test_keda_crds_installed_and_enforce_their_schema(namespace):
    for crd in ("scaledobjects.keda.sh", "triggerauthentications.keda.sh", "scaledjobs.keda.sh"):
        obj = kubectl_json("get", "crd", crd)
        established = [c for c in obj["status"]["conditions"] if c["type"] == "Established"]
        assert established and established[0]["status"] == "True", obj["status"]
    good = {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": "so", "namespace": namespace},
        "spec": {
            "scaleTargetRef": {"name": "x"},
            "minReplicaCount": 0,
            "maxReplicaCount": 3,
            "triggers": [{"type": "rabbitmq", "metadata": {"queueName": "q", "mode": "QueueLength", "value": "5"}}],
        },
    }
    kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(good))
    bad = json.loads(json.dumps(good))
    bad["spec"]["maxReplicaCount"] = "three"
    out = kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(bad), check=False)
    assert out.returncode != 0 and "maxReplicaCount" in out.stderr, out.stderr


def test_controller_manager_creates_pods_with_service_account_tokens(namespace):
    deploy = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": namespace},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "c", "image": "registry.invalid/none:1"}]},
            },
        },
    }
    kubectl("apply", "-f", "-", input=json.dumps(deploy))
    pods = wait_for(
        "2 pods created by the ReplicaSet controller",
        lambda: (lambda items: items if len(items) == 2 else None)(
            kubectl_json("get", "pods", "-n", namespace, "-l", "app=web")["items"]
        ),
    )
    for pod in pods:
        # No scheduler or kubelet: pods stay Pending, but admission (ServiceAccount plugin) ran.
        assert pod["status"]["phase"] == "Pending"
        vols = [v for v in pod["spec"]["volumes"] if v["name"].startswith("kube-api-access-")]
        assert vols, f"no projected service-account token volume in {pod['metadata']['name']}"
    # Token signing: a token can be requested for the namespace's service account.
    token = kubectl("create", "token", "default", "-n", namespace).stdout.strip()
    assert token.count(".") == 2
    review = kubectl_json(
        "create", "-f", "-",
        input=json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}),
    )
    assert review["status"]["authenticated"] is True
    assert review["status"]["user"]["username"] == f"system:serviceaccount:{namespace}:default"


def _make_certs(tmp_path):
    ca_key, ca_crt = tmp_path / "ca.key", tmp_path / "ca.crt"
    key, csr, crt, ext = (tmp_path / n for n in ("tls.key", "tls.csr", "tls.crt", "ext"))
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    subprocess.run(["openssl", "req", "-x509", *ec, "-days", "1", "-subj", "/CN=test-ca",
                    "-keyout", ca_key, "-out", ca_crt], check=True, capture_output=True)
    subprocess.run(["openssl", "req", *ec, "-subj", "/CN=127.0.0.1", "-keyout", key, "-out", csr],
                   check=True, capture_output=True)
    ext.write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    subprocess.run(["openssl", "x509", "-req", "-in", csr, "-CA", ca_crt, "-CAkey", ca_key,
                    "-CAcreateserial", "-days", "1", "-extfile", ext, "-out", crt],
                   check=True, capture_output=True)
    return ca_crt, crt, key


def test_mutating_webhook_by_url_is_called(namespace, tmp_path):
    """The API server calls a webhook registered by clientConfig.url with a caBundle — the way
    tests/e2e/up wires the project's webhook — and applies its JSONPatch."""
    ca_crt, crt, key = _make_certs(tmp_path)
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(review["request"]["name"])
            patch = [{"op": "add", "path": "/data/touched", "value": "yes"}]
            body = json.dumps({
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": {
                    "uid": review["request"]["uid"],
                    "allowed": True,
                    "patchType": "JSONPatch",
                    "patch": base64.b64encode(json.dumps(patch).encode()).decode(),
                },
            }).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(crt, key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    name = f"e2e-url-{uuid.uuid4().hex[:6]}"
    cfg = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": "touch.e2e.asya.sh",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "timeoutSeconds": 5,
            "clientConfig": {
                "url": f"https://127.0.0.1:{server.server_address[1]}/mutate",
                "caBundle": base64.b64encode(ca_crt.read_bytes()).decode(),
            },
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"],
                       "operations": ["CREATE"]}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "objectSelector": {"matchLabels": {"e2e-touch": "true"}},
        }],
    }
    try:
        kubectl("apply", "-f", "-", input=json.dumps(cfg))
        # The API server picks new webhook configurations up asynchronously: poll with fresh
        # objects until one is mutated.
        def try_create():
            obj = {"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": f"cm-{uuid.uuid4().hex[:6]}", "namespace": namespace,
                                "labels": {"e2e-touch": "true"}},
                   "data": {"a": "b"}}
            made = kubectl_json("create", "-f", "-", input=json.dumps(obj))
            return made if made.get("data", {}).get("touched") == "yes" else None
        made = wait_for("the URL webhook to mutate a ConfigMap", try_create, timeout=30)
        assert made["data"] == {"a": "b", "touched": "yes"}
        assert made["metadata"]["name"] in seen
    finally:
        kubectl("delete", "mutatingwebhookconfiguration", name, "--ignore-not-found", check=False)
        server.shutdown()
