"""Flows deployed as users deploy them (docs/flows.md): `asya flow compile` of the worked
example (sequence, mutations, if/elif/else, early return, `while True` with break, try/except
by type and by a base class, re-raise, a sub-flow) and of a second flow (a `while` with a
condition, continue, break, the iteration guard, `raise ValueError(...)` before any call); the
AsyncActors it writes completed for this cluster (transport, the test node, one pod each) and
applied with `kubectl apply -f DIR`; the webhook injects the sidecars, each entry reads its
program from the compiled ConfigMap. One envelope per path: its exact payload, path and
decisions in x-sink, or in x-sump with its original error; `asya trace` of one of them shows
the decisions each hop took (its sidecar's span attributes in the test Jaeger); the real
gateway (`--flows kube`, watching the entry AsyncActors) offers each flow as one tool to the
namespace's token only, and a call of it reaches x-sink with the flow's result. Both
transports. Fan-out is tests/e2e/test_flows_fanout.py's."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from asya_e2e.actors import EXAMPLES_IMAGE, ON_TEST_NODE, POD_TIMEOUT, wait_running
from asya_e2e.brokers import SQS_ENDPOINT, TRANSPORTS, Collected
from asya_e2e.cli import asya, asya_json
from asya_e2e.env import bin_dir
from asya_e2e.gateway import call, running_gateway
from asya_e2e.kube import kubectl
from asya_e2e.traces import JAEGER_QUERY_URL, fresh_traceparent, jaeger_answers, tag, trace
from asya_e2e.wait import wait_for

pytestmark = pytest.mark.skipif(os.environ.get("ASYA_TEST_NODE", "1") == "0",
                                reason="ASYA_TEST_NODE=0: the test cluster runs without a node")

ROOT = Path(__file__).resolve().parents[2]
ORDER_FLOW = ROOT / "deploy" / "examples" / "flows" / "order_review.py"

# The handler is pipeline.echo (returns its input): what this flow tests is the routing around it.
LOOP_FLOW = '''\
"""Loops: a while with a condition, continue, break, the guard; raise before any call."""


async def count_odd(state: dict) -> dict:
    if state["n"] < 0:
        raise ValueError("n must not be negative")
    state["i"] = 0
    state["calls"] = 0
    while state["i"] < state["n"]:
        state["i"] += 1
        if state["i"] % 2 == 0:
            continue
        state = await echo(state)
        state["calls"] += 1
        if state["i"] >= state.get("stop", 99):
            break
    return state
'''


def line_of(source: str, text: str) -> int:
    """The 1-based line of the first line holding `text` (the trail names source lines)."""
    for n, line in enumerate(source.splitlines(), 1):
        if text in line:
            return n
    raise AssertionError(f"{text!r} is not in the flow source")


def compile_flow(source: Path, out: Path, *args: str) -> list[Path]:
    """`asya flow compile`; returns the AsyncActor files it wrote."""
    r = subprocess.run([os.path.join(bin_dir(), "asya"), "flow", "compile", str(source), "-o", str(out),
                        "--image", EXAMPLES_IMAGE, *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return sorted(out.glob("actor-*.yaml"))


def complete_for_this_cluster(files: list[Path], transport: str) -> None:
    """What a user adds to the compiler's minimum: the transport, where the pods run, one pod."""
    for f in files:
        doc = yaml.safe_load(f.read_text())
        doc["spec"].update({"transport": transport, "imagePullPolicy": "IfNotPresent", "tolerations": ON_TEST_NODE,
                            "scaling": {"enabled": False}, "replicas": 1})
        f.write_text(yaml.safe_dump(doc))


@pytest.mark.parametrize("transport", ["rabbitmq", "sqs"])
def test_compiled_flows_run_on_the_node(namespace, transport, tmp_path):
    ns = namespace
    loop_src = tmp_path / "count_odd.py"
    loop_src.write_text(LOOP_FLOW)
    orders = compile_flow(ORDER_FLOW, tmp_path / "order-review", "--module", "orders")
    loops = compile_flow(loop_src, tmp_path / "count-odd", "--module", "pipeline", "--max-iterations", "4")
    assert [f.name for f in orders] == [f"actor-{a}.yaml" for a in
                                        ("charge", "express-ship", "notify", "standard-ship", "validate")]
    assert [f.name for f in loops] == ["actor-echo.yaml"]
    complete_for_this_cluster(orders + loops, transport)
    kubectl("apply", "-n", ns, "-f", str(tmp_path / "order-review"))
    kubectl("apply", "-n", ns, "-f", str(tmp_path / "count-odd"))
    for f in orders + loops:
        wait_running(ns, f.name[len("actor-"):-len(".yaml")])

    send, take = TRANSPORTS[transport]
    # A plain envelope to the flow's entry queue starts the flow.
    orders_in = {
        "big": {"items": [{"price": 60}, {"price": 50}]},
        "once": {"items": [{"price": 5}], "card": "declined-once", "country": "US"},
        "pickup": {"items": [{"price": 5}], "country": "DE"},
        "empty": {},
        "declined": {"items": [{"price": 5}], "card": "declined"},
    }
    loops_in = {"odd3": {"n": 3}, "stop3": {"n": 9, "stop": 3}, "none": {"n": 0}, "guard": {"n": 20},
                "negative": {"n": -1}}
    trace_id, _, traceparent = fresh_traceparent()
    for id_, payload in orders_in.items():
        headers = {"traceparent": traceparent} if id_ == "once" else {}
        send(f"asya-{ns}-validate", {"id": id_, "route": {"actors": ["validate"], "current": 0},
                                     "headers": headers, "payload": payload})
    for id_, payload in loops_in.items():
        send(f"asya-{ns}-echo", {"id": id_, "route": {"actors": ["echo"], "current": 0}, "payload": payload})

    sink = Collected(take, f"asya-{ns}-x-sink")
    sump = Collected(take, f"asya-{ns}-x-sump")
    wait_for("seven results in x-sink and three in x-sump",
             lambda: sink.at_least(7) and sump.at_least(3), timeout=POD_TIMEOUT, interval=0.5)
    got = {e["id"]: e for e in sink.items}
    failed = {e["id"]: e for e in sump.items}
    assert sorted(got) == ["big", "empty", "none", "odd3", "once", "pickup", "stop3"], sorted(got)
    assert sorted(failed) == ["declined", "guard", "negative"], sorted(failed)
    path = {k: e["route"]["actors"] for k, e in {**got, **failed}.items()}
    trail = {k: e.get("flow", {}).get("trail") for k, e in {**got, **failed}.items()}

    # --- the worked example --------------------------------------------------------------
    src = ORDER_FLOW.read_text()
    big_order, us = line_of(src, 'if state["total"] >= 100'), line_of(src, 'elif state.get("country")')
    except_payment, third = line_of(src, "except PaymentError"), line_of(src, 'if state["attempt"] >= 3')
    except_key = line_of(src, "except KeyError")
    assert got["big"]["payload"] == {
        "items": [{"price": 60}, {"price": 50}], "status": "done", "attempt": 1, "total": 110, "charged": 110,
        "shipping": "express", "notified": True, "trail": ["validate", "charge", "express_ship", "notify"]}
    assert path["big"] == ["validate", "charge", "express-ship", "notify"]
    assert trail["big"] == [f"{big_order}:if"]
    # Declined once: PaymentDeclined caught by `except PaymentError` (its base), charged again.
    assert got["once"]["payload"] == {
        "items": [{"price": 5}], "card": "declined-once", "country": "US", "status": "done", "attempt": 2,
        "total": 5, "charged": 5, "shipping": "standard", "notified": True,
        "trail": ["validate", "charge", "standard_ship", "notify"]}
    assert path["once"] == ["validate", "charge", "charge", "standard-ship", "notify"]
    assert trail["once"] == [f"{except_payment}:except PaymentDeclined", f"{third}:else", f"{big_order}:else",
                             f"{us}:if"]
    assert [a["type"] for a in got["once"]["headers"]["x-asya-attempts"]] == ["PaymentDeclined"]
    assert got["pickup"]["payload"] == {
        "items": [{"price": 5}], "country": "DE", "status": "done", "attempt": 1, "total": 5, "charged": 5,
        "shipping": "pickup", "notified": True, "trail": ["validate", "charge", "notify"]}
    assert path["pickup"] == ["validate", "charge", "notify"]
    assert trail["pickup"] == [f"{big_order}:else", f"{us}:else"]
    # No items: validate's KeyError caught by the flow, early return.
    assert got["empty"]["payload"] == {"status": "rejected", "attempt": 0}
    assert path["empty"] == ["validate"]
    assert trail["empty"] == [f"{except_key}:except KeyError"]
    # Declined three times: re-raised, in x-sump with charge's own error, as it reached charge.
    declined = failed["declined"]
    err = declined["headers"]["x-asya-error"]
    assert err["reason"] == "unhandled PaymentDeclined in flow review_order", err
    assert (err["type"], err["message"]) == ("PaymentDeclined", "card declined declined on attempt 3"), err
    assert "/app/orders.py" in err["traceback"] and "in charge" in err["traceback"], err
    assert path["declined"] == ["validate", "charge", "charge", "charge"]
    assert declined["payload"] == {"items": [{"price": 5}], "card": "declined", "status": "received", "attempt": 3,
                                   "total": 5, "trail": ["validate"]}
    assert trail["declined"] == [f"{except_payment}:except PaymentDeclined", f"{third}:else"] * 2

    # --- loops -----------------------------------------------------------------------------
    neg, loop = line_of(LOOP_FLOW, 'if state["n"] < 0'), line_of(LOOP_FLOW, "while state")
    even, stop = line_of(LOOP_FLOW, "% 2 == 0"), line_of(LOOP_FLOW, 'if state["i"] >= state.get')
    # n=3: calls at i=1 and 3, i=2 skipped by continue, the condition ends the loop.
    assert got["odd3"]["payload"] == {"n": 3, "i": 3, "calls": 2}
    assert path["odd3"] == ["echo", "echo"]
    assert trail["odd3"] == [f"{neg}:else", f"{loop}:while", f"{even}:else", f"{stop}:else", f"{loop}:while",
                             f"{even}:if", f"{loop}:while", f"{even}:else", f"{stop}:else", f"{loop}:exit"]
    # break at i=3.
    assert got["stop3"]["payload"] == {"n": 9, "stop": 3, "i": 3, "calls": 2}
    assert path["stop3"] == ["echo", "echo"]
    assert trail["stop3"][-2:] == [f"{even}:else", f"{stop}:if"] and trail["stop3"].count(f"{loop}:while") == 3
    # n=0: the flow ends without a call, where it entered.
    assert got["none"]["payload"] == {"n": 0, "i": 0, "calls": 0}
    assert trail["none"] == [f"{neg}:else", f"{loop}:exit"]
    # n=20: the fifth iteration passes the guard (--max-iterations 4), after the call at i=3.
    guard = failed["guard"]
    assert guard["headers"]["x-asya-error"]["reason"] == (
        f"flow count_odd: the loop at line {loop} ran 4 times, its guard (max iterations 4)"), guard["headers"]
    assert path["guard"] == ["echo", "echo"]
    assert guard["payload"] == {"n": 20, "i": 3, "calls": 1}
    # raise before any call: the flow's own error, with its line.
    err = failed["negative"]["headers"]["x-asya-error"]
    assert err["reason"] == f"unhandled ValueError in flow count_odd (line {neg + 1})", err
    assert (err["type"], err["message"]) == ("ValueError", "n must not be negative"), err

    # --- which way "once" went, from the trace backend --------------------------------------
    assert jaeger_answers(), f"the test Jaeger does not answer at {JAEGER_QUERY_URL} (tests/services/up starts it)"
    # The sidecars' batch processors export every 5 s.
    process = wait_for("the five process spans of 'once' in Jaeger", lambda: (
        p := sorted((s for t in trace(trace_id) for s in t["spans"] if s["operationName"].startswith("process ")),
                    key=lambda s: s["startTime"])) and len(p) >= 5 and p, timeout=60, interval=1.0)
    assert [(s["service"], tag(s, "asya.flow.name"), tag(s, "asya.flow.decisions")) for s in process] == [
        ("validate", "review_order", None),
        ("charge", "review_order", f"{except_payment}:except PaymentDeclined, {third}:else"),
        ("charge", "review_order", f"{big_order}:else, {us}:if"),
        ("standard-ship", "review_order", None),
        ("notify", "review_order", None)]
    # `asya trace` reads them back: one hop per actor called, with what its sidecar decided.
    hops = wait_for("asya trace once from the trace backend", lambda: (
        t := asya_json(ns, "trace", "once", check=False)) and "trace backend" in t.get("source", "")
        and len(t["hops"]) >= 5 and t["hops"], timeout=60, interval=1.0)
    assert [(h["actor"], h["outcome"]) for h in hops] == [
        ("validate", "completed"),
        ("charge", f"failed: PaymentDeclined: card declined-once declined on attempt 1 "
                   f"(decisions: {except_payment}:except PaymentDeclined, {third}:else)"),
        ("charge", f"completed (decisions: {big_order}:else, {us}:if)"),
        ("standard-ship", "completed"),
        ("notify", "completed")], hops
    tree = asya(ns, "trace", "once").stdout
    assert f"decisions: {big_order}:else, {us}:if" in tree, tree

    # --- the flow as a tool of the gateway ----------------------------------------------------
    mine, theirs = f"flows-{ns}-token-0123456789", "other-namespace-token-0123456789"
    args = ["--flows", "kube", "--rabbitmq-url", os.environ.get("ASYA_TEST_RABBITMQ_URL",
                                                               "amqp://guest:guest@127.0.0.1:5672/%2f"),
            "--sqs-region", "us-east-1", "--sqs-endpoint", SQS_ENDPOINT]
    tool = f"{ns}.review_order"
    with running_gateway(tmp_path / "gw", [f"{mine} namespaces={ns}", f"{theirs} namespaces=kube-system"], args,
                         env={"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}) as url:
        listed = wait_for(f"tool {tool} listed", lambda: (
            names := [t["name"] for t in call("GET", f"{url}/tools", mine)[1]["tools"]]) and names,
            timeout=30, interval=0.5)
        assert listed == [f"{ns}.count_odd", tool], listed
        assert call("GET", f"{url}/tools", theirs)[1]["tools"] == []
        status, body = call("POST", f"{url}/tools/call", theirs, {"name": tool, "arguments": {}})
        assert (status, body.get("error")) == (403, "namespace_not_allowed"), body
        status, body = call("POST", f"{url}/tools/call", mine,
                            {"name": tool, "arguments": {"items": [{"price": 5}], "country": "DE"}})
        assert status == 202, body
        eid = body["envelope_id"]
        done = wait_for("the tool call's result in x-sink",
                        lambda: sink.at_least(8) and [e for e in sink.items if e["id"] == eid], timeout=60, interval=0.5)
    assert done[0]["payload"] == {
        "items": [{"price": 5}], "country": "DE", "status": "done", "attempt": 1, "total": 5, "charged": 5,
        "shipping": "pickup", "notified": True, "trail": ["validate", "charge", "notify"]}
    assert done[0]["route"]["actors"] == ["validate", "charge", "notify"]
    assert done[0]["headers"]["x-asya-tool"] == tool
