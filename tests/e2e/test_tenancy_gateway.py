"""Issue 34, the gateway's report tokens outlive nothing of their namespace, played as the
tenant who kept one: the real asya-gateway binary, watching the test cluster's Namespaces
through its API server (`--namespace-uids kube`), and `asya-gateway report-token` reading the
namespace's uid from the cluster. The namespace is deleted and made again under the same
name (as another team would): the token of the first is refused with 403
`report_token_stale`, naming the namespace and never the token; the new namespace's token is
accepted.

The gateway runs as a local process with the test cluster's kubeconfig (the e2e values do
not install the chart's gateway), status in memory, no broker: no request here gets as far
as a send. Every wait is a bounded poll on a condition.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from asya_e2e.env import KUBECONFIG, bin_dir
from asya_e2e.kube import kubectl, run
from asya_e2e.wait import wait_for

GATEWAY = Path(bin_dir()) / "asya-gateway"
CLIENT = "tenancy-client-token-0123456789"
KEY = "tenancy-report-key-0123456789abcdef0123"
PROGRESS = {"actor": "a", "phase": "received", "current": 0, "total": 1}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, token: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    req.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        text = e.read()
        try:
            return e.code, json.loads(text)
        except ValueError:
            return e.code, {"raw": text.decode(errors="replace")}


def uid_of(ns: str) -> str:
    return kubectl("get", "namespace", ns, "-o", "jsonpath={.metadata.uid}").stdout.strip()


def report_token(key_file: Path, ns: str) -> str:
    """As an admin would make it by hand: the uid read from the cluster."""
    out = run([GATEWAY, "report-token", "--namespace", ns, "--key-file", key_file])
    return out.stdout.strip()


@pytest.fixture
def gateway(tmp_path):
    """A gateway on a free port watching the cluster's Namespaces; its URL and key file."""
    if not GATEWAY.exists():
        pytest.fail(f"{GATEWAY} is missing: build the binaries first (cargo build -p asya-gateway)")
    (tmp_path / "tools.yaml").write_text("tools: []\n")
    (tmp_path / "tokens").write_text(CLIENT + "\n")
    key = tmp_path / "key"
    key.write_text(KEY)
    port = free_port()
    log = open(tmp_path / "gateway.log", "wb")
    env = dict(os.environ, KUBECONFIG=str(KUBECONFIG), ASYA_LOG_FORMAT="text",
               AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test")
    proc = subprocess.Popen(
        [str(GATEWAY), "serve", "--addr", f"127.0.0.1:{port}", "--tools", str(tmp_path / "tools.yaml"),
         "--auth-tokens", str(tmp_path / "tokens"), "--report-key-file", str(key),
         "--namespace-uids", "kube", "--sqs-region", "us-east-1", "--sqs-endpoint", "http://127.0.0.1:9"],
        env=env, stdout=subprocess.DEVNULL, stderr=log)
    url = f"http://127.0.0.1:{port}"

    def healthy():
        assert proc.poll() is None, (tmp_path / "gateway.log").read_text()
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    wait_for("the gateway's /health", healthy, timeout=30)
    try:
        yield url, key
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_a_report_token_is_refused_once_its_namespace_is_made_again(gateway):
    url, key = gateway
    ns = f"e2e-gwtok-{uuid.uuid4().hex[:6]}"
    kubectl("create", "namespace", ns)
    try:
        first_uid = uid_of(ns)
        old = report_token(key, ns)
        assert old.startswith(f"asya-report.{ns}.{first_uid}."), old
        progress = f"{url}/envelopes/e/progress"

        # Accepted (the envelope is unknown: the token got past authentication), once the
        # watch has listed the namespaces (503 until then).
        wait_for("the first namespace's token accepted",
                 lambda: post(progress, old, PROGRESS)[1].get("error") == "unknown_envelope", timeout=30)

        # Another team deletes the namespace and makes one of the same name.
        kubectl("delete", "namespace", ns, "--wait=true", timeout=180)
        kubectl("create", "namespace", ns)
        second_uid = uid_of(ns)
        assert second_uid != first_uid

        def stale():
            status, body = post(progress, old, PROGRESS)
            return (status, body) if body.get("error") == "report_token_stale" else None

        status, body = wait_for("the old token refused as stale", stale, timeout=30)
        assert status == 403, body
        assert f'"{ns}"' in body["message"] and old not in json.dumps(body), body
        for path, payload in (("/envelopes", {"id": "c", "parent_id": "p"}),
                              ("/envelopes/e/final", {"status": "succeeded"})):
            status, body = post(url + path, old, payload)
            assert (status, body.get("error")) == (403, "report_token_stale"), (path, body)

        # The namespace as it is now has a token of its own, which is accepted.
        new = report_token(key, ns)
        assert new.startswith(f"asya-report.{ns}.{second_uid}."), new
        status, body = post(progress, new, PROGRESS)
        assert (status, body.get("error")) == (404, "unknown_envelope"), body
    finally:
        kubectl("delete", "namespace", ns, "--wait=false", check=False)
