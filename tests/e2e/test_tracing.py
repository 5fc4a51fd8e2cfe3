"""Traces across hops on the node, against the real trace backend (docs/observability.md
"Tracing"): tests/e2e/up installs the chart with `tracing.enabled` and `tracing.otlpEndpoint`
at the test Jaeger (tests/services/jaeger, reached from pods as jaeger.default.svc), so the
webhook gives every sidecar the OTEL_* variables. One envelope sent with a known
`traceparent` through validate (fails once, retried) -> split (fans out to three) -> shout is
found in Jaeger's query API as ONE trace holding every hop's CONSUMER `process`, INTERNAL
`runtime call` and PRODUCER `send` spans, chained parent to child from the caller's span, the
fan-out's three sends and the ERROR span of the attempt that failed. Both transports."""

from __future__ import annotations

import os
import uuid
from collections import Counter

import pytest

from asya_e2e.actors import EXAMPLES_IMAGE, POD_TIMEOUT, apply_on_node, pods, wait_running
from asya_e2e.brokers import TRANSPORTS, Collected
from asya_e2e.traces import fresh_traceparent, jaeger_answers, parent_id, tag, trace
from asya_e2e.wait import wait_for

pytestmark = pytest.mark.skipif(os.environ.get("ASYA_TEST_NODE", "1") == "0",
                                reason="ASYA_TEST_NODE=0: the test cluster runs without a node")

HANDLERS = {"validate": "pipeline.Validator.check", "split": "pipeline.split", "shout": "pipeline.shout"}
WORDS = ["hello", "brave", "world"]
# validate: 2 attempts x (process, runtime call, send: the retry, then to split);
# split: process, runtime call, 3 sends; shout x3: process, runtime call, send to x-sink.
EXPECTED_SPANS = 2 * 3 + (2 + len(WORDS)) + 3 * len(WORDS)
# The sidecar's batch processor exports every 5 s (the SDK's default), Jaeger batches 200 ms.
TRACE_TIMEOUT = 60


@pytest.fixture(scope="module", autouse=True)
def _jaeger():
    if not jaeger_answers():
        pytest.skip("the test Jaeger does not answer (tests/services/up starts it)")


def _deploy(ns: str, transport: str) -> None:
    for name, handler in HANDLERS.items():
        spec = {"transport": transport, "image": EXAMPLES_IMAGE, "imagePullPolicy": "IfNotPresent",
                "handler": handler, "scaling": {"enabled": False}, "replicas": 1}
        if name == "validate":
            # UpstreamBusy (the payload's `flaky`) is retried once, through a delayed send.
            spec["resiliency"] = {"policies": {"default": {"maxAttempts": 3, "backoff": "constant",
                                                           "initialInterval": "1s", "maxInterval": "1s"}}}
        apply_on_node(ns, name, spec)
    for name in HANDLERS:
        wait_running(ns, name)


def _sidecar_env(ns: str, actor: str) -> dict:
    pod = pods(ns, actor)[0]
    containers = pod["spec"].get("initContainers", []) + pod["spec"]["containers"]
    (sidecar,) = [c for c in containers if c["name"] == "asya-sidecar"]
    return {e["name"]: e.get("value") for e in sidecar.get("env", [])}


@pytest.mark.parametrize("transport", ["rabbitmq", "sqs"])
def test_one_envelope_is_one_trace_with_every_hop_the_fan_out_and_the_error(namespace, transport):
    ns = namespace
    send, take = TRANSPORTS[transport]
    _deploy(ns, transport)
    env = _sidecar_env(ns, "validate")
    assert env.get("OTEL_EXPORTER_OTLP_ENDPOINT"), (
        f"the release does not trace: the sidecar of {ns}/validate has no OTEL_EXPORTER_OTLP_ENDPOINT "
        f"(tests/e2e/up sets tracing.enabled and tracing.otlpEndpoint); its env: {env}")
    assert env["OTEL_SERVICE_NAME"] == "validate", env

    trace_id, caller, traceparent = fresh_traceparent()
    eid = f"trc-{uuid.uuid4().hex[:8]}"
    send(f"asya-{ns}-validate", {"id": eid, "route": {"actors": list(HANDLERS), "current": 0},
                                 "headers": {"traceparent": traceparent, "tracestate": "e2e=1"},
                                 "payload": {"text": " ".join(WORDS), "flaky": True}})
    sink = Collected(take, f"asya-{ns}-x-sink")
    done = wait_for("the three words in x-sink", lambda: sink.at_least(len(WORDS)), timeout=POD_TIMEOUT, interval=1.0)
    assert sorted(e["payload"]["word"] for e in done) == sorted(w.upper() for w in WORDS), done
    for e in done:
        # The chain is the platform's: every result carries the caller's trace, its own span.
        assert e["headers"]["traceparent"].startswith(f"00-{trace_id}-"), e["headers"]
        assert e["headers"]["tracestate"] == "e2e=1", e["headers"]
    assert len({e["headers"]["traceparent"] for e in done}) == len(WORDS)

    def all_spans():
        t = trace(trace_id)
        return t and len(t[0]["spans"]) >= EXPECTED_SPANS and t

    try:
        traces = wait_for(f"{EXPECTED_SPANS} spans of trace {trace_id} in Jaeger", all_spans,
                          timeout=TRACE_TIMEOUT, interval=1.0)
    except AssertionError as e:
        got = trace(trace_id)
        names = Counter(f"{s['service']}: {s['operationName']}" for t in got for s in t["spans"])
        raise AssertionError(f"{e}\nspans so far: {dict(names)}") from None
    assert len(traces) == 1, f"{len(traces)} traces under {trace_id}"
    spans = traces[0]["spans"]
    assert len(spans) == EXPECTED_SPANS, Counter(f"{s['service']}: {s['operationName']}" for s in spans)
    assert {s["traceID"] for s in spans} == {trace_id}
    by_id = {s["spanID"]: s for s in spans}

    def named(service: str, name: str) -> list[dict]:
        return [s for s in spans if s["service"] == service and s["operationName"] == name]

    def children(span: dict, name: str) -> list[dict]:
        return [s for s in spans if parent_id(s) == span["spanID"] and s["operationName"] == name]

    q = {a: f"asya-{ns}-{a}" for a in [*HANDLERS, "x-sink"]}
    for s in spans:
        kind = tag(s, "span.kind")
        if s["operationName"].startswith("process "):
            assert kind == "consumer", s
            assert tag(s, "messaging.message.id") in {eid, *(f"{eid}-{i}" for i in range(1, len(WORDS)))}, s
        elif s["operationName"].startswith("send "):
            assert kind == "producer", s
        else:
            assert s["operationName"] == "runtime call" and kind in ("internal", None), s
            # Every span but the first hop's consumer continues a span of this trace.
            assert parent_id(s) in by_id, s

    # validate: the caller's span -> process (ERROR runtime call, the retry's send) -> process
    # of the retry (runtime call, the send to split).
    first = [p for p in named("validate", f"process {q['validate']}") if parent_id(p) == caller]
    assert len(first) == 1, [parent_id(p) for p in named("validate", f"process {q['validate']}")]
    (failed_call,) = children(first[0], "runtime call")
    assert tag(failed_call, "error") is True, failed_call
    assert tag(failed_call, "error.type") == "UpstreamBusy", failed_call
    assert tag(failed_call, "otel.status_code") == "ERROR", failed_call
    (retry_send,) = children(first[0], f"send {q['validate']}")
    (retried,) = children(retry_send, f"process {q['validate']}")
    (ok_call,) = children(retried, "runtime call")
    assert tag(ok_call, "error") in (None, False) and tag(ok_call, "error.type") is None, ok_call
    (to_split,) = children(retried, f"send {q['split']}")
    # split: its one hop fans out into three sends, each continued by one shout hop.
    (split,) = children(to_split, f"process {q['split']}")
    assert split["service"] == "split"
    assert len(children(split, "runtime call")) == 1
    fan_out = children(split, f"send {q['shout']}")
    assert len(fan_out) == len(WORDS), fan_out
    for send_span in fan_out:
        (shout,) = children(send_span, f"process {q['shout']}")
        assert shout["service"] == "shout"
        assert len(children(shout, "runtime call")) == 1
        assert len(children(shout, f"send {q['x-sink']}")) == 1
    # Exactly one ERROR span in the trace: the attempt that failed.
    assert [s["spanID"] for s in spans if tag(s, "error") is True] == [failed_call["spanID"]]
