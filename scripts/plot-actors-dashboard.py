#!/usr/bin/env python3
"""Draws the main panels of the Actors dashboard (deploy/chart/dashboards/actors.json) from a
real Prometheus, with matplotlib, into a PNG: Grafana is AGPL and not an option here, so this
is how docs/observability.md shows what the dashboard shows. The queries are the dashboard's
own `expr`s, with Grafana's variables set ($namespace, $actor, $__rate_interval), run as range
queries over the last --since.

    scripts/plot-actors-dashboard.py --namespace 'asya-demo-.*' --since 15m
    scripts/plot-actors-dashboard.py --prometheus http://127.0.0.1:9090 --out docs/img/actors-dashboard.png
    scripts/plot-actors-dashboard.py --namespace my-ns --print-queries   # the queries and a UI link, no picture

After traffic: `make demo` (it runs this at its end into target/demo/) or an e2e run.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "deploy" / "chart" / "dashboards" / "actors.json"
# The dashboard's main panels, in the picture's order (KEDA's value is KEDA's own metric, which
# a Prometheus without KEDA's scrape has not).
MAIN_PANELS = [
    "Throughput by status", "Failure ratio", "Processing time p50 / p95 / p99",
    "Queue wait p50 / p95", "Queued vs in flight", "x-sink / x-sump arrivals",
]
UNITS = {"reqps": "per second", "percentunit": "ratio", "s": "seconds", "short": ""}


class PlotError(Exception):
    pass


def parse_duration(text: str) -> int:
    """Seconds of '90s', '15m', '2h'; refuses anything else, naming the value."""
    m = re.fullmatch(r"(\d+)([smh])", text.strip())
    if not m:
        raise PlotError(f"duration {text!r}: expected a number and s, m or h (e.g. 15m)")
    return int(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2)]


def substitute(expr: str, namespace: str, actor: str, rate_interval: str) -> str:
    """The dashboard's expression with Grafana's variables set as its template would."""
    return (expr.replace("$__rate_interval", rate_interval)
            .replace("$namespace", namespace).replace("$actor", actor))


def legend(fmt: str, labels: dict) -> str:
    """Grafana's legendFormat: {{label}} replaced by the series' label (empty when absent)."""
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt).strip()


def shorten(names: list[str]) -> list[str]:
    """Drops a namespace prefix ('ns/') every legend shares: one namespace says it once, in
    the title."""
    prefixes = {n.split("/", 1)[0] + "/" for n in names if "/" in n}
    if len(prefixes) == 1 and all("/" in n for n in names):
        (p,) = prefixes
        return [n[len(p):] for n in names]
    return names


def ui_url(prometheus: str, exprs: list[str], range_: str) -> str:
    """A link to Prometheus' own UI with one graph panel per expression."""
    params = {}
    for i, e in enumerate(exprs):
        params.update({f"g{i}.expr": e, f"g{i}.tab": "graph", f"g{i}.range_input": range_})
    return f"{prometheus}/query?{urllib.parse.urlencode(params)}"


def main_panels(dashboard: dict) -> list[dict]:
    by_title = {p["title"]: p for p in dashboard["panels"]}
    missing = [t for t in MAIN_PANELS if t not in by_title]
    if missing:
        raise PlotError(f"{DASHBOARD}: no panel titled {missing} (panels: {sorted(by_title)})")
    return [by_title[t] for t in MAIN_PANELS]


def query_range(prometheus: str, expr: str, start: float, end: float, step: int) -> list[dict]:
    url = f"{prometheus}/api/v1/query_range?" + urllib.parse.urlencode(
        {"query": expr, "start": start, "end": end, "step": step})
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            body = json.load(r)
    except urllib.error.HTTPError as e:
        raise PlotError(f"Prometheus refused {expr!r}: {e.code} {e.read()[:300]!r}") from None
    except OSError as e:
        raise PlotError(f"Prometheus at {prometheus} does not answer: {e}") from None
    if body.get("status") != "success":
        raise PlotError(f"Prometheus failed {expr!r}: {body}")
    return body["data"]["result"]


def draw(panels, series, title: str, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt
    from datetime import datetime
    from matplotlib.ticker import PercentFormatter

    fig, axes = plt.subplots(3, 2, figsize=(13, 11), dpi=80)
    for ax, panel, lines in zip(axes.flat, panels, series):
        names = shorten([name for name, _, _ in lines])
        for name, (ts, vs) in zip(names, ((t, v) for _, t, v in lines)):
            ax.plot([datetime.fromtimestamp(t) for t in ts], vs, label=name, linewidth=1.4)
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
        ax.set_title(panel["title"], fontsize=11, loc="left")
        ax.set_ylabel(UNITS.get(unit, unit), fontsize=9)
        if unit == "percentunit":
            ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=8)
        if lines:
            ax.legend(fontsize=7, loc="upper left", ncol=2 if len(lines) > 6 else 1, framealpha=0.8)
        else:
            ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", color="grey")
    fig.suptitle(title, fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)


def print_queries(args, panels) -> int:
    exprs = []
    for p in panels:
        print(f"{p['title']}:")
        for t in p["targets"]:
            e = substitute(t["expr"], args.namespace, args.actor, args.rate_interval)
            exprs.append(e)
            print(f"  {e}")
    print("All of them as graphs in Prometheus' UI:")
    print(f"  {ui_url(args.prometheus, exprs, args.since)}")
    return 0


def run(args) -> int:
    if args.print_queries:
        return print_queries(args, main_panels(json.loads(DASHBOARD.read_text())))
    since = parse_duration(args.since)
    step = parse_duration(args.step)
    end = time.time()
    start = end - since
    panels = main_panels(json.loads(DASHBOARD.read_text()))
    series, points = [], 0
    for p in panels:
        lines = []
        for t in p["targets"]:
            expr = substitute(t["expr"], args.namespace, args.actor, args.rate_interval)
            for r in query_range(args.prometheus, expr, start, end, step):
                ts = [float(x[0]) for x in r["values"]]
                vs = [float(x[1]) for x in r["values"]]
                lines.append((legend(t.get("legendFormat", ""), r["metric"]), ts, vs))
                points += len(ts)
        series.append(lines)
    if points == 0:
        raise PlotError(f"no data for namespace {args.namespace!r} in the last {args.since} at {args.prometheus} "
                        "(send some traffic first: make demo, or an e2e run)")
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(end))
    title = (f"Asya / Actors — namespace {args.namespace}, last {args.since} to {when} "
             f"(Prometheus, rate over {args.rate_interval})")
    draw(panels, series, title, Path(args.out))
    print(f"{args.out}: {sum(len(s) for s in series)} series, {points} points, "
          f"{Path(args.out).stat().st_size // 1024} KB")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prometheus", default="http://127.0.0.1:9090", help="the Prometheus base URL")
    ap.add_argument("--namespace", default=".*", help="the dashboard's $namespace (a regex)")
    ap.add_argument("--actor", default=".*", help="the dashboard's $actor (a regex)")
    ap.add_argument("--since", default="15m", help="the range drawn, up to now (e.g. 15m, 1h)")
    ap.add_argument("--step", default="5s", help="the range queries' step")
    ap.add_argument("--rate-interval", default="1m", help="Grafana's $__rate_interval")
    ap.add_argument("--out", default=str(ROOT / "docs" / "img" / "actors-dashboard.png"))
    ap.add_argument("--print-queries", action="store_true",
                    help="print the panels' queries and a link to them in Prometheus' UI instead of drawing")
    args = ap.parse_args(argv)
    try:
        return run(args)
    except PlotError as e:
        print(f"plot-actors-dashboard: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
