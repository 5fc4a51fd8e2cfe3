"""The provisioner's HTTP endpoint (readyz, metrics) and the work counters read from it."""

from __future__ import annotations

import urllib.error
import urllib.request

from asya_e2e.env import provisioner_url
from asya_e2e.kube import kubectl_json


# The provisioner's API requests per new actor in a bulk apply, at most (issue 38, goal 10):
# the work test of the suite and the 1,000-actor bench fail above it (docs/benchmarks.md).
API_REQUESTS_PER_NEW_ACTOR = 10


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def metric_total(text: str, metric_name: str, /, **labels) -> float:
    """Sum of every sample of `metric_name` whose labels include `labels` (Prometheus text
    format). Positional-only, so a label may itself be called `name`."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(metric_name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        metric, _, rest = head.partition("{")
        if metric != metric_name:
            continue
        if all(f'{k}="{v}"' in rest for k, v in labels.items()):
            total += float(value)
    return total


def provisioner_metrics() -> str:
    code, text = http_get(f"{provisioner_url()}/metrics")
    assert code == 200, text
    return text


def work_counters() -> dict:
    """The provisioner's own counts: reconciles, requests its Kubernetes client sent (the
    test cluster runs without API priority and fairness, so the API server cannot count one
    client's requests apart), broker operations."""
    m = provisioner_metrics()
    return {"reconciles": metric_total(m, "asya_provisioner_reconciles_total"),
            "broker": metric_total(m, "asya_provisioner_queue_operations_total"),
            "api": metric_total(m, "asya_provisioner_api_requests_total")}


def all_converged(ns: str, n: int) -> bool:
    items = kubectl_json("get", "asyncactors", "-n", ns)["items"]
    return sum(1 for a in items if a.get("status", {}).get("transportStatus") == "Ready"
               and a["status"].get("workloadKind") and a["status"].get("scalingMode") == "KEDA") == n
