"""The monitoring fast tier (`make unit`): the chart's monitors, alerts and dashboards checked
without a cluster, with the real helm and promtool.

- `helm template` with every toggle on renders each object, and each Prometheus Operator
  object without its CRD fails with a message naming the value;
- the PodMonitor's relabelings are the docs' scrape config (tests/services/prometheus.yml);
- `promtool check rules` and `promtool test rules` (alerts_test.yaml) on the rules the chart
  renders; every alert has a test case and a runbook anchor in docs/observability.md;
- every metric a rule or a dashboard uses is in some component's output (the dumps the
  components' unit tests write to ASYA_METRICS_DUMP_DIR, so the list comes from the code);
- dashboards: valid JSON, a templated datasource everywhere, unique uids, queries that parse.

helm comes from the test cluster's tools (tests/cluster/up), promtool from
tests/services/prometheus (built once from Prometheus' Go module). Without them the tests
skip, unless ASYA_REQUIRE_SERVICES=1 (as under `make unit`), where that is a failure.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "chart"
DOCS = ROOT / "docs" / "observability.md"
SCRAPE_CONFIG = ROOT / "tests" / "services" / "prometheus.yml"
ALERT_TESTS = Path(__file__).with_name("alerts_test.yaml")
MONITORING_KINDS = ("PodMonitor", "ServiceMonitor", "PrometheusRule")
ALL_ON = [
    "--set", "monitoring.podMonitor.enabled=true",
    "--set", "monitoring.serviceMonitor.enabled=true",
    "--set", "monitoring.prometheusRule.enabled=true",
    "--set", "monitoring.dashboards.enabled=true",
    "--set", "monitoring.annotations.enabled=true",
    "--set", "tracing.enabled=true",
    "--set", "tracing.otlpEndpoint=http://jaeger.default.svc:4318",
    "--set-json", "tracing.samplingRatio=0.5",
    "--set", "gateway.enabled=true",
]
CRDS = [a for k in MONITORING_KINDS for a in ("--api-versions", f"monitoring.coreos.com/v1/{k}")]
# Metrics that other programs export (KEDA's operator): not in our components' dumps.
FOREIGN_PREFIXES = ("keda_",)
# Grafana's variables, replaced by values Prometheus accepts before a query is parsed or run.
GRAFANA_VARS = {"$__rate_interval": "5m", "$namespace": ".*", "$actor": ".*"}


def _missing(what: str):
    if os.environ.get("ASYA_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{what} (ASYA_REQUIRE_SERVICES=1)")
    pytest.skip(what)


@pytest.fixture(scope="session")
def helm() -> str:
    candidates = [os.environ.get("ASYA_TEST_HELM", ""), str(ROOT / "target" / "test-cluster" / "bin" / "helm")]
    candidates += sorted(glob.glob(os.path.expanduser("~/.cache/asya-rs/test-cluster/bin/helm-*")))
    candidates.append(shutil.which("helm") or "")
    for c in candidates:
        if c and os.access(c, os.X_OK):
            return c
    _missing("no helm: run tests/cluster/up (it builds helm)")


@pytest.fixture(scope="session")
def promtool() -> str:
    out = subprocess.run([str(ROOT / "tests" / "services" / "prometheus"), "build"],
                         capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        _missing(f"no promtool: tests/services/prometheus build failed:\n{out.stderr}")
    return str(Path(out.stdout.strip().splitlines()[-1]) / "promtool")


def render(helm: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run([helm, "template", "t", str(CHART), "-n", "asya-system", *args],
                         capture_output=True, text=True, timeout=120)
    if check:
        assert out.returncode == 0, out.stderr
    return out


def docs_of(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d]


@pytest.fixture(scope="session")
def all_on(helm) -> list[dict]:
    return docs_of(render(helm, *ALL_ON, *CRDS).stdout)


@pytest.fixture(scope="session")
def rules(helm) -> dict:
    docs = docs_of(render(helm, "--set", "monitoring.prometheusRule.enabled=true", *CRDS).stdout)
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    return rule["spec"]


def dashboards() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted((CHART / "dashboards").glob("*.json"))}


def dashboard_queries() -> list[tuple[str, str, str]]:
    out = []
    for name, d in dashboards().items():
        for p in d["panels"]:
            for t in p.get("targets", []):
                out.append((name, p["title"], t["expr"]))
    return out


def for_prometheus(expr: str) -> str:
    for var, value in GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    return expr


# --- the chart -------------------------------------------------------------------------------

def test_every_toggle_renders_its_objects(all_on):
    kinds = [d["kind"] for d in all_on]
    for k in MONITORING_KINDS:
        assert kinds.count(k) == 1, (k, kinds)
    maps = {d["metadata"]["name"]: d for d in all_on if d["kind"] == "ConfigMap"}
    for name in ("t-dashboard-actors", "t-dashboard-control-plane"):
        assert maps[name]["metadata"]["labels"]["grafana_dashboard"] == "1"
        (text,) = maps[name]["data"].values()
        json.loads(text)
    cfg = yaml.safe_load(maps["asya-config"]["data"]["config.yaml"])
    assert cfg["tracing"] == {"enabled": True, "otlpEndpoint": "http://jaeger.default.svc:4318",
                              "samplingRatio": 0.5, "resourceAttributes": {}}
    assert cfg["monitoring"] == {"annotations": True}
    for d in all_on:
        if d["kind"] == "Deployment":
            ann = d["spec"]["template"]["metadata"]["annotations"]
            assert ann.get("prometheus.io/scrape") == "true", d["metadata"]["name"]
    services = {d["metadata"]["name"]: d for d in all_on if d["kind"] == "Service"}
    for name, port in [("t-webhook", "metrics"), ("t-provisioner", "metrics"), ("t-gateway", "http")]:
        assert port in [p["name"] for p in services[name]["spec"]["ports"]], name


def test_the_control_plane_gets_the_sidecars_otel_variables_with_its_own_service_name(helm, all_on):
    # The set api/src/telemetry.rs (TracingConfig::sidecar_env) gives injected sidecars, the
    # namespace known at render time, the service name each part's.
    names = {"t-webhook": "asya-webhook", "t-provisioner": "asya-queue-provisioner",
             "t-gateway": "asya-gateway"}
    deployments = {d["metadata"]["name"]: d for d in all_on if d["kind"] == "Deployment"}
    for name, service in names.items():
        (c,) = [c for c in deployments[name]["spec"]["template"]["spec"]["containers"]]
        env = {e["name"]: e.get("value") for e in c["env"] if e["name"].startswith("OTEL_")}
        assert env == {
            "OTEL_SDK_DISABLED": "false",
            "OTEL_SERVICE_NAME": service,
            "OTEL_RESOURCE_ATTRIBUTES": "k8s.namespace.name=asya-system",
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://jaeger.default.svc:4318",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json",
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "0.5",
            "OTEL_PROPAGATORS": "tracecontext",
        }, name
    docs = docs_of(render(helm, "--set", "gateway.enabled=true").stdout)
    for d in docs:
        if d["kind"] == "Deployment":
            for c in d["spec"]["template"]["spec"]["containers"]:
                assert not [e for e in c.get("env", []) if e["name"].startswith("OTEL_")], d["metadata"]["name"]
    # Attribute values are percent-encoded, as the SDK's list format asks.
    docs = docs_of(render(helm, *ALL_ON, *CRDS, "--set-string",
                          "tracing.resourceAttributes.deployment\\.environment=prod\\, eu+1").stdout)
    (wh,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "t-webhook"]
    env = {e["name"]: e.get("value") for e in wh["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["OTEL_RESOURCE_ATTRIBUTES"] == (
        "k8s.namespace.name=asya-system,deployment.environment=prod%2C%20eu%2B1")


def test_defaults_render_no_monitoring_object(helm):
    docs = docs_of(render(helm).stdout)
    kinds = {d["kind"] for d in docs}
    assert not kinds & set(MONITORING_KINDS), kinds
    cfg = yaml.safe_load(next(d for d in docs if d["metadata"]["name"] == "asya-config")["data"]["config.yaml"])
    assert "tracing" not in cfg and "monitoring" not in cfg


@pytest.mark.parametrize("kind,value", [
    ("PodMonitor", "monitoring.podMonitor.enabled"),
    ("ServiceMonitor", "monitoring.serviceMonitor.enabled"),
    ("PrometheusRule", "monitoring.prometheusRule.enabled"),
])
def test_a_monitor_without_its_crd_fails_naming_the_value(helm, kind, value):
    out = render(helm, "--set", f"{value}=true", check=False)
    assert out.returncode != 0
    assert f"{value} is true but the cluster does not serve monitoring.coreos.com/v1 {kind}" in out.stderr, out.stderr
    assert f"set {value}=false" in out.stderr


def test_tracing_on_without_an_endpoint_is_refused_by_the_schema(helm):
    out = render(helm, "--set", "tracing.enabled=true", check=False)
    assert out.returncode != 0
    assert "otlpEndpoint" in out.stderr, out.stderr
    out = render(helm, "--set", "tracing.enabled=true", "--set", "tracing.otlpEndpoint=http://c:4318",
                 "--set-string", "tracing.resourceAttributes.a\\,b=c", check=False)
    assert out.returncode != 0
    assert "'a,b' does not match pattern" in out.stderr, out.stderr


def _snake(rule: dict) -> dict:
    names = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    return {names.get(k, k): v for k, v in rule.items()}


def test_the_pod_monitor_relabels_like_the_documented_scrape_config(all_on):
    (pm,) = [d for d in all_on if d["kind"] == "PodMonitor"]
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics"
    chart = [_snake(r) for r in endpoint["relabelings"]]
    scrape = yaml.safe_load(SCRAPE_CONFIG.read_text())
    (job,) = [j for j in scrape["scrape_configs"] if j["job_name"] == "asya-actors"]
    assert chart == job["relabel_configs"]
    # docs/observability.md shows the same relabelling for plain Prometheus.
    block = re.search(r"```yaml\n(scrape_configs:\n.*?)```", DOCS.read_text(), re.S)
    assert block, "docs/observability.md has no scrape_configs block"
    (doc_job,) = [j for j in yaml.safe_load(block.group(1))["scrape_configs"] if j["job_name"] == "asya-actors"]
    assert doc_job["relabel_configs"] == job["relabel_configs"]


# --- alerts ----------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def rules_dir(rules, tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("rules")
    (d / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
    shutil.copy(ALERT_TESTS, d / ALERT_TESTS.name)
    return d


def test_promtool_check_rules(promtool, rules_dir):
    out = subprocess.run([promtool, "check", "rules", str(rules_dir / "rules.yaml")], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_promtool_test_rules(promtool, rules_dir):
    out = subprocess.run([promtool, "test", "rules", str(rules_dir / ALERT_TESTS.name)],
                         capture_output=True, text=True, cwd=rules_dir)
    assert out.returncode == 0, out.stdout + out.stderr


def _alerts(rules: dict) -> list[dict]:
    return [r for g in rules["groups"] for r in g["rules"] if "alert" in r]


def test_every_alert_has_a_promtool_case_and_a_runbook(rules):
    cases = yaml.safe_load(ALERT_TESTS.read_text())["tests"]
    firing = {t["alertname"] for c in cases for t in c["alert_rule_test"] if t["exp_alerts"]}
    anchors = {re.sub(r"[^a-z0-9-]", "", h.strip().lower().replace(" ", "-"))
               for h in re.findall(r"^#+ (.+)$", DOCS.read_text(), re.M)}
    for a in _alerts(rules):
        assert a["alert"] in firing, f"{a['alert']} has no promtool case where it fires"
        url = a["annotations"]["runbook_url"]
        assert url.split("#")[1] in anchors, f"{a['alert']}: no heading for {url} in docs/observability.md"


# --- metrics used exist ----------------------------------------------------------------------

def exported_names() -> set[str]:
    d = os.environ.get("ASYA_METRICS_DUMP_DIR")
    dumps = sorted(Path(d).glob("*.prom")) if d else []
    if len(dumps) < 4:
        _missing("no metrics dumps of the four components: run `cargo test` with ASYA_METRICS_DUMP_DIR set "
                 "(make unit does)")
    names = set()
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "gauge": [""], "info": ["_info"]}
    for f in dumps:
        for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", f.read_text(), re.M):
            names.update(name + s for s in suffixes.get(kind, [""]))
    return names


METRIC = re.compile(r"\b((?:asya_|controller_runtime_|keda_)[a-zA-Z0-9_:]*)")


def used_metrics(rules: dict) -> dict[str, str]:
    used = {}
    for a in [r for g in rules["groups"] for r in g["rules"]]:
        for m in METRIC.findall(a["expr"]):
            used.setdefault(m, f"alert {a.get('alert') or a.get('record')}")
    for name, title, expr in dashboard_queries():
        for m in METRIC.findall(expr):
            used.setdefault(m, f"dashboard {name} panel {title!r}")
    return used


def test_every_metric_a_rule_or_dashboard_uses_is_exported(rules):
    exported = exported_names()
    missing = {m: where for m, where in used_metrics(rules).items()
               if not m.startswith(FOREIGN_PREFIXES) and m not in exported}
    assert not missing, f"used but exported by no component: {missing}"


# --- dashboards ------------------------------------------------------------------------------

def test_dashboards_are_valid_with_a_templated_datasource_and_unique_uids():
    uids = []
    for name, d in dashboards().items():
        uids.append(d["uid"])
        variables = {v["name"]: v for v in d["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource", name
        assert variables["datasource"]["query"] == "prometheus", name
        ids = [p["id"] for p in d["panels"]]
        assert len(ids) == len(set(ids)), f"{name}: panel ids repeat"
        for p in d["panels"]:
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, (name, p["title"])
            assert p["targets"], (name, p["title"])
            for t in p["targets"]:
                assert t["datasource"]["uid"] == "${datasource}", (name, p["title"])
    assert len(uids) == len(set(uids)), uids


def test_every_dashboard_query_parses(promtool, tmp_path):
    # promtool parses each query as a recording rule's expression.
    rules = [{"record": f"asya:dashboard_query_{i}", "expr": for_prometheus(expr)}
             for i, (_, _, expr) in enumerate(dashboard_queries())]
    f = tmp_path / "queries.yaml"
    f.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    out = subprocess.run([promtool, "check", "rules", str(f)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
