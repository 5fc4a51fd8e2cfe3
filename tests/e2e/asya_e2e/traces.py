"""The test trace backend (tests/services/jaeger, Jaeger v2) seen from the host: its query API
(`/api/traces/{traceId}`, Jaeger's JSON model) and what the tests ask of a trace."""

from __future__ import annotations

import json
import os
import secrets
import urllib.error
import urllib.request

JAEGER_QUERY_URL = os.environ.get("ASYA_TEST_JAEGER_QUERY_URL", "http://127.0.0.1:16686")


def jaeger_answers() -> bool:
    try:
        with urllib.request.urlopen(f"{JAEGER_QUERY_URL}/api/services", timeout=3) as r:
            return "data" in json.load(r)
    except (OSError, ValueError):
        return False


def fresh_traceparent() -> tuple[str, str, str]:
    """(trace id, caller span id, sampled W3C traceparent) of a trace no earlier run made."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def trace(trace_id: str) -> list[dict]:
    """The traces Jaeger holds under `trace_id` (one, once any span arrived; none before),
    each with its spans annotated by `service` (the process' service name)."""
    try:
        with urllib.request.urlopen(f"{JAEGER_QUERY_URL}/api/traces/{trace_id}", timeout=10) as r:
            body = json.load(r)
    except urllib.error.HTTPError as e:
        if e.code == 404:  # no span of it yet
            return []
        raise
    out = []
    for t in body.get("data") or []:
        procs = t.get("processes", {})
        for s in t["spans"]:
            s["service"] = procs.get(s.get("processID"), {}).get("serviceName")
        out.append(t)
    return out


def tag(span: dict, key: str):
    return next((t["value"] for t in span.get("tags", []) if t["key"] == key), None)


def parent_id(span: dict) -> str | None:
    """The span this one continues: its CHILD_OF reference, or for a consumer span (whose
    parent is also its link, which Jaeger's OTLP translator shows as one FOLLOWS_FROM
    reference) that reference."""
    refs = span.get("references", [])
    for kind in ("CHILD_OF", "FOLLOWS_FROM"):
        for r in refs:
            if r["refType"] == kind:
                return r["spanID"]
    return None
