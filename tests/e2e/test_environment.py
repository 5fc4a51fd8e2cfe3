"""tests/e2e/up's wiring: the webhook answers the real API server through the chart's webhook
configurations, with the cluster configuration the chart renders from tests/e2e/values.yaml.
With the test node the chart is installed and the webhook runs as its pods (reached through
their Service, with the CA they published); without it, as a local process (by
clientConfig.url and the caBundle of the certificates tests/e2e/up generated)."""

from __future__ import annotations

import base64
import json

import pytest

from asya_e2e.env import CLUSTER, RELEASE, RELEASE_NS, components_in_pods, crds_generated, provisioner_url, webhook_enabled
from asya_e2e.kube import kubectl, kubectl_json

pytestmark = pytest.mark.skipif(
    not (webhook_enabled() and crds_generated()),
    reason="tests/e2e/up ran without the webhook or without deploy/crds (see its output)",
)


def test_webhook_configurations_point_at_the_running_webhook():
    if components_in_pods():
        secret = kubectl_json("get", "secret", f"{RELEASE}-webhook-tls", "-n", RELEASE_NS)
        ca = base64.b64decode(secret["data"]["ca.crt"]).strip()
    else:
        ca = (CLUSTER / "e2e" / "certs" / "ca.crt").read_bytes().strip()
    # One webhook call per AsyncActor: no validating configuration unless
    # webhook.validateActorsSeparately (tests/e2e/values.yaml leaves it off).
    gone = kubectl("get", "validatingwebhookconfiguration", "asya-webhook", check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr, gone.stdout
    for kind in ("mutatingwebhookconfiguration",):
        cfg = kubectl_json("get", kind, "asya-webhook")
        for w in cfg["webhooks"]:
            cc = w["clientConfig"]
            if components_in_pods():
                assert cc["service"]["name"] == f"{RELEASE}-webhook", cc
                assert cc["service"]["namespace"] == RELEASE_NS, cc
                assert "url" not in cc, cc
            else:
                assert cc["url"].startswith("https://127.0.0.1:"), cc
            assert ca in base64.b64decode(cc["caBundle"]), "the caBundle trusts the webhook's CA"


@pytest.mark.skipif(not components_in_pods(), reason="the webhook and provisioner run as local processes")
def test_chart_pods_ready_with_their_service_accounts():
    """The chart's webhook (its default 2 replicas) and provisioner run as Ready pods of the
    images `make images` built, as their own ServiceAccounts, non-root."""
    for component, replicas in (("webhook", 2), ("provisioner", 1)):
        pods = kubectl_json("get", "pods", "-n", RELEASE_NS, "-l",
                            f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component={component}")["items"]
        ready = [p for p in pods if any(c["type"] == "Ready" and c["status"] == "True"
                                        for c in p["status"].get("conditions", []))]
        assert len(ready) == replicas, [(p["metadata"]["name"], p["status"].get("phase")) for p in pods]
        for p in ready:
            assert p["spec"]["serviceAccountName"] == f"{RELEASE}-{component}"
            assert p["spec"]["securityContext"]["runAsNonRoot"] is True
            image = p["spec"]["containers"][0]["image"]
            assert image.startswith("localhost/asya-rs/"), image
            assert p["spec"]["nodeName"] == "asya-test-node"
    assert provisioner_url().startswith("http://10.244."), provisioner_url()


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
