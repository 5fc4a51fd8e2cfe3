"""The decisions of scripts/plot-actors-dashboard.py (the picture in docs/observability.md):
Grafana's variables and legends as the dashboard's template sets them, durations, and the
main panels found in the real dashboard JSON. Drawing and Prometheus are its edges."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("plot", ROOT / "scripts" / "plot-actors-dashboard.py")
plot = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(plot)


def test_variables_are_set_everywhere_they_occur():
    expr = 'rate(x{namespace=~"$namespace", actor=~"$actor"}[$__rate_interval]) / rate(y[$__rate_interval])'
    assert plot.substitute(expr, "demo-.*", "validate", "1m") == \
        'rate(x{namespace=~"demo-.*", actor=~"validate"}[1m]) / rate(y[1m])'


def test_legend_takes_the_series_labels_and_leaves_absent_ones_empty():
    assert plot.legend("{{namespace}}/{{actor}} {{ status }}", {"namespace": "n", "actor": "a", "status": "ok"}) == "n/a ok"
    assert plot.legend("{{namespace}} {{destination}}", {"namespace": "n"}) == "n"


def test_a_namespace_every_legend_shares_is_said_once():
    assert plot.shorten(["ns/a p50", "ns/b p95"]) == ["a p50", "b p95"]
    assert plot.shorten(["ns1/a", "ns2/a"]) == ["ns1/a", "ns2/a"]
    assert plot.shorten(["ns/a", "ns asya-ns-x-sink"]) == ["ns/a", "ns asya-ns-x-sink"]


def test_durations_are_refused_naming_the_value():
    assert plot.parse_duration("15m") == 900 and plot.parse_duration("5s") == 5 and plot.parse_duration("2h") == 7200
    with pytest.raises(plot.PlotError, match="'15 minutes'"):
        plot.parse_duration("15 minutes")


def test_the_main_panels_are_in_the_dashboard_with_queries():
    panels = plot.main_panels(json.loads(plot.DASHBOARD.read_text()))
    assert [p["title"] for p in panels] == plot.MAIN_PANELS
    assert all(p["targets"] and all(t["expr"] for t in p["targets"]) for p in panels)
    with pytest.raises(plot.PlotError, match="Failure ratio"):
        plot.main_panels({"panels": [p for p in panels if p["title"] != "Failure ratio"]})


def test_the_ui_link_holds_one_graph_per_query():
    from urllib.parse import parse_qs, urlparse

    url = plot.ui_url("http://127.0.0.1:9090", ['sum(rate(a{x="1"}[1m]))', "b"], "15m")
    u = urlparse(url)
    assert u.path == "/query"
    q = parse_qs(u.query)
    assert q["g0.expr"] == ['sum(rate(a{x="1"}[1m]))'] and q["g1.expr"] == ["b"]
    assert q["g0.tab"] == q["g1.tab"] == ["graph"] and q["g1.range_input"] == ["15m"]
