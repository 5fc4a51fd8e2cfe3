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
import uuid
from pathlib import Path

import pytest

from asya_e2e.gateway import GATEWAY, post, running_gateway
from asya_e2e.kube import kubectl, run
from asya_e2e.wait import wait_for

CLIENT = "tenancy-client-token-0123456789"
KEY = "tenancy-report-key-0123456789abcdef0123"
PROGRESS = {"actor": "a", "phase": "received", "current": 0, "total": 1}


def uid_of(ns: str) -> str:
    return kubectl("get", "namespace", ns, "-o", "jsonpath={.metadata.uid}").stdout.strip()


def report_token(key_file: Path, ns: str) -> str:
    """As an admin would make it by hand: the uid read from the cluster."""
    out = run([GATEWAY, "report-token", "--namespace", ns, "--key-file", key_file])
    return out.stdout.strip()


@pytest.fixture
def gateway(tmp_path):
    """A gateway on a free port watching the cluster's Namespaces; its URL and key file."""
    key = tmp_path / "key"
    key.write_text(KEY)
    args = ["--report-key-file", str(key), "--namespace-uids", "kube", "--sqs-region", "us-east-1",
            "--sqs-endpoint", "http://127.0.0.1:9"]
    with running_gateway(tmp_path, [CLIENT], args,
                         env={"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}) as url:
        yield url, key


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
