"""tests/e2e/up's wiring: the local webhook answers the real API server through the chart's
webhook configurations (by clientConfig.url + caBundle), with the cluster configuration the
chart renders from tests/e2e/values.yaml."""

from __future__ import annotations

import base64
import json

import pytest

from conftest import CLUSTER, crds_generated, kubectl, kubectl_json, webhook_enabled

pytestmark = pytest.mark.skipif(
    not (webhook_enabled() and crds_generated()),
    reason="tests/e2e/up ran without the webhook or without deploy/crds (see its output)",
)


def test_webhook_configurations_point_at_the_local_webhook():
    ca = (CLUSTER / "e2e" / "certs" / "ca.crt").read_bytes()
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        cfg = kubectl_json("get", kind, "asya-webhook")
        for w in cfg["webhooks"]:
            assert w["clientConfig"]["url"].startswith("https://127.0.0.1:"), w["clientConfig"]
            assert base64.b64decode(w["clientConfig"]["caBundle"]) == ca


def test_transport_not_in_cluster_config_is_refused_by_the_webhook(namespace):
    # The CRD schema cannot know which transports the cluster enables: only the webhook, with
    # the config the chart rendered (rabbitmq and sqs), refuses this one.
    actor = {
        "apiVersion": "asya.sh/v1alpha1",
        "kind": "AsyncActor",
        "metadata": {"name": "wired", "namespace": namespace},
        "spec": {"image": "python:3.12-slim", "handler": "echo.handler", "transport": "kafka"},
    }
    out = kubectl("apply", "-f", "-", input=json.dumps(actor), check=False)
    assert out.returncode != 0, out.stdout
    assert "spec.transport" in out.stderr and "kafka" in out.stderr, out.stderr
    assert "rabbitmq" in out.stderr and "sqs" in out.stderr, out.stderr

    actor["spec"]["transport"] = "sqs"
    kubectl("apply", "-f", "-", input=json.dumps(actor))
    stored = kubectl_json("get", "asyncactor", "wired", "-n", namespace)
    assert stored["spec"]["transport"] == "sqs"
