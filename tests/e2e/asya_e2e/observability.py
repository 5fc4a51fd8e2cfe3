"""The test Prometheus (tests/services/prometheus) and what the observability tests give it:
the Prometheus Operator's CRDs in the test cluster (so the API server validates the chart's
monitors), the chart's alert rules rendered with test-sized durations, the addresses of
components that run as local processes. Queries go to Prometheus' HTTP API."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.parse
import urllib.request

import yaml

from asya_e2e.env import CHART, HELM, ROOT, STATE, components_in_pods, provisioner_url
from asya_e2e.kube import kubectl, kubectl_json, run
from asya_e2e.wait import wait_for

PROMETHEUS_URL = os.environ.get("ASYA_TEST_PROMETHEUS_URL", "http://127.0.0.1:9090")
PROMETHEUS_CTL = os.environ.get("ASYA_TEST_PROMETHEUS_CTL", str(ROOT / "tests" / "services" / "prometheus"))
# The Prometheus Operator release whose CRDs (example/prometheus-operator-crd) are installed;
# fetched as a Go module, cached by version in the module cache.
PROMETHEUS_OPERATOR_VERSION = "v0.85.0"
MONITORING_CRDS = ("podmonitors", "servicemonitors", "prometheusrules")
# Where tests/services/prometheus.yml reads rules and file-discovered targets.
RULES_DIR = STATE / "prometheus-rules"
TARGETS_DIR = STATE / "prometheus-targets"
# Alert durations short enough for a test, the chart's rules otherwise as shipped. Prometheus
# scrapes and evaluates every 5 s (tests/services/prometheus.yml): a 30 s rate window holds six
# samples, and 15 s of `for:` is three evaluations in a row.
E2E_THRESHOLDS = {
    "failureRatioWindow": "30s", "failureRatioFor": "0s", "stuckFor": "15s",
    "brokerDisconnectedFor": "10s", "poisonFor": "0s",
}
# The local webhook's metrics port (tests/e2e/up).
WEBHOOK_METRICS_PORT = int(os.environ.get("ASYA_E2E_WEBHOOK_METRICS_PORT", "9444"))


def _get(path: str, **params) -> dict:
    url = f"{PROMETHEUS_URL}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]


def query(expr: str) -> list[dict]:
    """An instant query's result vector."""
    return _get("/api/v1/query", query=expr)["result"]


def value(expr: str) -> float | None:
    """The single value of an instant query, or None while it has no result."""
    r = query(expr)
    assert len(r) <= 1, f"{expr} returned {len(r)} series: {r}"
    return float(r[0]["value"][1]) if r else None


def targets(job: str) -> list[dict]:
    return [t for t in _get("/api/v1/targets", state="active")["activeTargets"] if t["labels"].get("job") == job]


def alerts(name: str, **labels) -> list[dict]:
    """Alerts named `name` whose labels include `labels`, any state (pending, firing)."""
    return [a for a in _get("/api/v1/alerts")["alerts"]
            if a["labels"].get("alertname") == name and all(a["labels"].get(k) == v for k, v in labels.items())]


def firing(name: str, **labels) -> bool:
    return any(a["state"] == "firing" for a in alerts(name, **labels))


def restart_prometheus() -> None:
    """(Re)starts the test Prometheus, this suite's own server: its Kubernetes discovery reads
    the cluster's credentials when it starts, and tests/services/up may have started it
    before the cluster made them."""
    subprocess.run([PROMETHEUS_CTL, "restart"], check=True, timeout=1800)


def operator_crd_dir() -> str:
    out = subprocess.run(["go", "mod", "download", "-json",
                          f"github.com/prometheus-operator/prometheus-operator@{PROMETHEUS_OPERATOR_VERSION}"],
                         capture_output=True, text=True, timeout=600, cwd="/", check=True)
    return os.path.join(json.loads(out.stdout)["Dir"], "example", "prometheus-operator-crd")


def install_monitoring_crds() -> None:
    """The PodMonitor, ServiceMonitor and PrometheusRule CRDs, established."""
    d = operator_crd_dir()
    for plural in MONITORING_CRDS:
        kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=asya-e2e",
                "-f", os.path.join(d, f"monitoring.coreos.com_{plural}.yaml"))
    for plural in MONITORING_CRDS:
        wait_for(f"CRD {plural}.monitoring.coreos.com established", lambda p=plural: kubectl(
            "get", "crd", f"{p}.monitoring.coreos.com",
            "-o", "jsonpath={.status.conditions[?(@.type=='Established')].status}").stdout == "True")


def render_chart(*args: str) -> list[dict]:
    """`helm template` of the chart with the monitoring CRDs' API versions known."""
    api = [a for k in ("PodMonitor", "ServiceMonitor", "PrometheusRule")
           for a in ("--api-versions", f"monitoring.coreos.com/v1/{k}")]
    out = run([HELM, "template", "asya", CHART, "-n", "asya-system", *api, *args])
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def start_with_chart_rules() -> dict:
    """The chart's PrometheusRule with E2E_THRESHOLDS as Prometheus' rule file, the local
    components' addresses, and Prometheus (re)started on them. Returns the rules."""
    sets = [a for k, v in E2E_THRESHOLDS.items()
            for a in ("--set", f"monitoring.prometheusRule.thresholds.{k}={v}")]
    (rule,) = [d for d in render_chart("--set", "monitoring.prometheusRule.enabled=true", *sets)
               if d["kind"] == "PrometheusRule"]
    RULES_DIR.mkdir(parents=True, exist_ok=True)
    (RULES_DIR / "asya.yaml").write_text(yaml.safe_dump(rule["spec"], sort_keys=False))
    write_local_targets()
    restart_prometheus()
    wait_for("Prometheus to load the chart's alert rules",
             lambda: any(g["name"] == "asya-actors" for g in _get("/api/v1/rules")["groups"]))
    return rule["spec"]


def write_local_targets() -> None:
    """When the webhook and the provisioner run as local processes, their addresses for the
    asya-local-components job (in pods, the asya-control-plane job discovers them)."""
    TARGETS_DIR.mkdir(parents=True, exist_ok=True)
    f = TARGETS_DIR / "components.json"
    if components_in_pods():
        f.write_text("[]")
        return
    prov = urllib.parse.urlparse(provisioner_url()).netloc
    f.write_text(json.dumps([
        {"targets": [prov], "labels": {"component": "provisioner"}},
        {"targets": [f"127.0.0.1:{WEBHOOK_METRICS_PORT}"], "labels": {"component": "webhook"}},
    ]))


def chart_monitors_accepted(ns: str) -> list[str]:
    """Server-side dry runs of the chart's monitors in `ns`: the names the API server took."""
    docs = render_chart("--set", "monitoring.podMonitor.enabled=true",
                        "--set", "monitoring.serviceMonitor.enabled=true",
                        "--set", "monitoring.prometheusRule.enabled=true")
    accepted = []
    for d in docs:
        if d["apiVersion"] == "monitoring.coreos.com/v1":
            d["metadata"]["namespace"] = ns
            kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(d))
            accepted.append(d["kind"])
    return accepted


def dashboards() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted((CHART / "dashboards").glob("*.json"))}


def dashboard_queries(namespace: str) -> list[tuple[str, str, str]]:
    """(dashboard, panel, query) with Grafana's variables set to one namespace's actors."""
    out = []
    for name, d in dashboards().items():
        for p in d["panels"]:
            for t in p["targets"]:
                expr = (t["expr"].replace("$__rate_interval", "2m").replace("$namespace", namespace)
                        .replace("$actor", ".*"))
                out.append((name, p["title"], expr))
    return out


def release_has_gateway() -> bool:
    return bool(kubectl_json("get", "deployments", "-n", "asya-system",
                             "-l", "app.kubernetes.io/component=gateway")["items"])
