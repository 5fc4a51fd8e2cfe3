"""The gateway end to end: an MCP client (the `mcp` SDK from PyPI) and plain HTTP clients
against the real asya-gateway, real sidecars and runtimes, the crew's end actors storing to
S3, PostgreSQL, and RabbitMQ or the SQS server."""

import asyncio
import datetime
import json
import os
import urllib.request
import uuid

import boto3
import pytest
from botocore.config import Config
from mcp.client.session import ClientSession
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

from conftest import CREW, ELSEWHERE_TOKEN, TOKEN, http, need, psql, report_token, unique, wait_until

TRANSPORTS = ["rabbitmq", "sqs"]

TOOLS = """
routes:
  tools:
  - name: triple-double
    description: Doubles a value in three actors
    parameters:
      do: {type: string, default: double}
      value: {type: integer, required: true}
    route: [a, b, c]
  - name: breaks
    description: Always fails
    parameters:
      do: {type: string, default: raise}
      key: {type: string}
    route: [a]
  - name: splits
    description: Fans out into n envelopes
    parameters:
      do: {type: string, default: fanout}
      n: {type: integer, required: true}
    route: [a, b]
  - name: slow
    parameters:
      do: {type: string, default: sleep}
      seconds: {type: number, required: true}
    route: [a]
"""


def s3():
    return boto3.client(
        "s3",
        endpoint_url=os.environ["ASYA_TEST_S3_ENDPOINT"],
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}),
    )


def crew(world, kind, ns, gw, bucket):
    env = {"ASYA_S3_BUCKET": bucket, "ASYA_S3_ENDPOINT": os.environ["ASYA_TEST_S3_ENDPOINT"]}
    world.actor(kind, ns, "x-sink", "handlers.end_handlers.happy_end_handler", gw.url,
                mode="envelope", cwd=CREW, env=env)
    world.actor(kind, ns, "x-sump", "handlers.end_handlers.error_end_handler", gw.url,
                mode="envelope", cwd=CREW, env=env)


def pipeline(world, kind, database, actors=("a", "b", "c")):
    ns = unique(kind[:3])
    bucket = "asya-" + ns
    gw = world.gateway(kind, TOOLS, database, ns)
    for a in actors:
        world.actor(kind, ns, a, "testing.act", gw.url)
    crew(world, kind, ns, gw, bucket)
    return ns, bucket, gw


async def mcp_call(gw, name, arguments, token=TOKEN):
    """Lists the tools and calls one with a progress callback: (tools, result, progress)."""
    progress = []

    async def on_progress(p, total, message):
        progress.append((p, total, message))

    client = create_mcp_http_client(headers={"Authorization": "Bearer " + token})
    async with client:
        async with streamable_http_client(gw.url + "/mcp", http_client=client) as streams:
            read, write = streams[0], streams[1]
            async with ClientSession(read, write) as session:
                await session.initialize()
                tools = await session.list_tools()
                result = await session.call_tool(name, arguments, progress_callback=on_progress)
                return tools, result, progress


def stored(bucket, prefix):
    try:
        out = s3().list_objects_v2(Bucket=bucket, Prefix=prefix)
    except Exception:
        return []
    return [o["Key"] for o in out.get("Contents", [])]


def today():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_mcp_lists_tools_and_runs_a_three_actor_pipeline(world, database, kind):
    ns, bucket, gw = pipeline(world, kind, database)
    tools, result, progress = asyncio.run(mcp_call(gw, "triple-double", {"value": 3}))

    by_name = {t.name: t for t in tools.tools}
    assert set(by_name) == {"triple-double", "breaks", "splits", "slow"}
    schema = by_name["triple-double"].input_schema
    assert schema["properties"]["value"]["type"] == "integer"
    assert schema["properties"]["do"]["default"] == "double"
    assert schema["required"] == ["value"]

    assert not result.is_error, result
    out = result.structured_content
    assert out["status"] == "succeeded"
    assert out["result"]["value"] == 24, out

    values = [p for p, _, _ in progress]
    assert values, "no progress notifications"
    assert values == sorted(values), "progress in order: %r" % progress
    assert values[-1] == 100, progress
    assert len(values) >= 4, "a notification per hop at least: %r" % progress

    id = out["envelope_id"]
    row = psql(database, "SELECT status, progress, result->>'value' FROM envelopes WHERE id = '%s'" % id)
    assert row == "succeeded|100|24", row
    hops = psql(database, "SELECT count(*) FROM envelope_events WHERE envelope_id = '%s'" % id)
    assert int(hops) >= 7, "received/processing/completed at 3 actors + final: %s" % hops
    key = "results/%s/c/%s.json" % (today(), id)
    assert wait_until("the result in S3", lambda: key in stored(bucket, "results/"), within=30)
    body = json.loads(s3().get_object(Bucket=bucket, Key=key)["Body"].read())
    assert body["id"] == id and body["payload"]["value"] == 24


def jaeger_spans(trace_id, at_least):
    """The spans of `trace_id` in the test Jaeger once it has `at_least` of them, else None."""
    url = "%s/api/traces/%s" % (need("ASYA_TEST_JAEGER_QUERY_URL"), trace_id)
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            data = json.loads(r.read().decode())["data"]
    except (OSError, ValueError, KeyError):
        return None
    spans = data[0]["spans"] if data else []
    return spans if len(spans) >= at_least else None


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_rest_call_continues_the_callers_trace_through_every_hop(world, database, kind):
    ns = unique(kind[:3])
    bucket = "asya-" + ns
    gw = world.gateway(kind, TOOLS, database, ns)
    otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": need("ASYA_TEST_JAEGER_OTLP_ENDPOINT"), "OTEL_BSP_SCHEDULE_DELAY": "200"}
    for a in ("a", "b", "c"):
        world.actor(kind, ns, a, "testing.act", gw.url, env=dict(otel, OTEL_SERVICE_NAME=a))
    crew(world, kind, ns, gw, bucket)
    trace_id, caller = uuid.uuid4().hex, "00f067aa0ba902b7"
    status, body = http("POST", gw.url + "/tools/call", {"name": "triple-double", "arguments": {"value": 3}},
                        headers={"traceparent": "00-%s-%s-01" % (trace_id, caller)})
    assert status == 202, body
    assert gw.wait_final(body["envelope_id"])["status"] == "succeeded"

    # a, b, c: each a process, a runtime call and a send span (the crew does not record).
    spans = wait_until("trace %s in Jaeger" % trace_id, lambda: jaeger_spans(trace_id, 9), within=60)
    by_id = {s["spanID"]: s for s in spans}
    process = {s["operationName"].rsplit("-", 1)[1]: s for s in spans if s["operationName"].startswith("process ")}
    assert set(process) == {"a", "b", "c"}, [s["operationName"] for s in spans]
    # a consumed the gateway's send, itself a child of the caller's span: not the caller's.
    first = process["a"]["references"]
    assert len(first) == 1 and first[0]["spanID"] != caller and first[0]["spanID"] not in by_id, first
    for prev, actor in (("a", "b"), ("b", "c")):
        sent_by = by_id[process[actor]["references"][0]["spanID"]]
        assert sent_by["operationName"] == "send asya-%s-%s" % (ns, actor), sent_by
        assert sent_by["references"][0]["spanID"] == process[prev]["spanID"]


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_failing_tool_ends_failed_with_the_error_under_the_errors_prefix(world, database, kind):
    ns, bucket, gw = pipeline(world, kind, database, actors=("a",))
    _, result, _ = asyncio.run(mcp_call(gw, "breaks", {"key": "k1"}))
    assert result.is_error
    text = json.loads(result.content[0].text)
    assert text["status"] == "failed"
    assert "handler failed on purpose: k1" in json.dumps(text["error"]), text
    id = text["envelope_id"]
    rec = gw.envelope(id)
    assert rec["status"] == "failed" and rec["progress"] == 100
    assert rec["error"]["actor"] == "a"
    key = "errors/%s/a/%s.json" % (today(), id)
    assert wait_until("the failed envelope in S3", lambda: key in stored(bucket, "errors/"), within=30)


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_fan_out_children_are_tracked(world, database, kind):
    ns, bucket, gw = pipeline(world, kind, database, actors=("a", "b"))
    status, body = http("POST", gw.url + "/tools/call", {"name": "splits", "arguments": {"n": 3}})
    assert status == 202, body
    id = body["envelope_id"]
    assert gw.wait_final(id)["status"] == "succeeded"
    children = wait_until(
        "both children reported",
        lambda: (lambda c: c if len(c) == 2 else None)(gw.envelope(id)["children"]),
    )
    assert children == ["%s-1" % id, "%s-2" % id]
    for c in children:
        rec = gw.wait_final(c)
        assert rec["status"] == "succeeded" and rec["parent_id"] == id
        assert rec["tool"] == "splits"
    row = psql(database, "SELECT count(*) FROM envelopes WHERE parent_id = '%s'" % id)
    assert row == "2"


def test_finished_envelopes_are_deleted_after_the_retention_time(world, database):
    """Issue 34: a finished envelope, its history and its fan-out children go from
    PostgreSQL once their final status is older than --retention-finished (8 s here, long
    enough for the children to be reported first); one still running stays
    (--retention-unfinished is far off), and the pass is counted."""
    ns = unique("ret")
    gw = world.gateway("rabbitmq", TOOLS, database, ns,
                       extra_args=["--retention-finished", "8s", "--retention-interval", "1s"])
    for a in ("a", "b"):
        world.actor("rabbitmq", ns, a, "testing.act", gw.url)
    crew(world, "rabbitmq", ns, gw, "asya-" + ns)
    # n=3: the envelope goes on and two children are made (as in the fan-out test above).
    status, body = http("POST", gw.url + "/tools/call", {"name": "splits", "arguments": {"n": 3}})
    assert status == 202, body
    done = body["envelope_id"]
    family = "id = '{0}' OR parent_id = '{0}'".format(done)
    wait_until("the envelope and its two children stored and finished",
               lambda: psql(database, "SELECT count(*) FROM envelopes WHERE (%s) AND finished_at IS NOT NULL"
                            % family) == "3", within=30)
    events = "SELECT count(*) FROM envelope_events WHERE envelope_id IN (SELECT id FROM envelopes WHERE %s)" % family
    assert int(psql(database, events)) > 0
    status, body = http("POST", gw.url + "/tools/call", {"name": "slow", "arguments": {"seconds": 30}})
    assert status == 202, body
    running = body["envelope_id"]

    wait_until("the finished envelopes deleted",
               lambda: psql(database, "SELECT count(*) FROM envelopes WHERE %s" % family) == "0", within=40)
    assert psql(database, "SELECT count(*) FROM envelope_events WHERE envelope_id LIKE '%s%%'" % done) == "0"
    status, body = http("GET", gw.url + "/envelopes/" + done)
    assert status == 404 and body["error"] == "unknown_envelope", body
    assert http("GET", gw.url + "/envelopes/" + running)[0] == 200, "the running one stays"
    status, metrics = http("GET", gw.url + "/metrics", token=None)
    deleted = [line for line in metrics.splitlines()
               if line.startswith("asya_gateway_retention_deleted_envelopes_total ")]
    assert deleted and float(deleted[0].split()[1]) >= 3, deleted


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_gateway_restarted_mid_pipeline_loses_no_status(world, database, kind):
    ns, bucket, gw = pipeline(world, kind, database, actors=("a",))
    status, body = http("POST", gw.url + "/tools/call", {"name": "slow", "arguments": {"seconds": 3}})
    assert status == 202, body
    id = body["envelope_id"]
    wait_until("the envelope at actor a", lambda: gw.envelope(id)["status"] == "running", within=30)
    gw.kill()
    gw.start()  # same port and database: the sidecars' reports resume
    assert gw.envelope(id)["status"] == "running", "status survived the restart"
    rec = gw.wait_final(id)
    assert rec["status"] == "succeeded" and rec["progress"] == 100
    assert rec["result"]["seconds"] == 3


def test_refusals_are_clear(world, database):
    gw = world.gateway("rabbitmq", TOOLS, database, unique("ref"), extra_args=["--max-body-bytes", "2048"])
    url = gw.url + "/tools/call"

    status, body = http("POST", url, {"name": "nope", "arguments": {}})
    assert status == 404 and body["error"] == "unknown_tool", body
    assert "triple-double" in body["message"]

    status, body = http("POST", url, {"name": "triple-double", "arguments": {}})
    assert status == 400 and body["details"][0]["field"] == "value", body
    assert "required" in body["details"][0]["rule"]

    status, body = http("POST", url, {"name": "triple-double", "arguments": {"value": "three"}})
    assert status == 400, body
    assert body["details"][0] == {"field": "value", "value": '"three"', "rule": "must be of type integer"}

    status, body = http("POST", url, {"name": "triple-double", "arguments": {"value": 1, "x": "y" * 4096}})
    assert status == 413 and body["error"] == "too_large", body
    assert "2048" in body["message"]

    status, body = http("POST", url, {"name": "triple-double", "arguments": {"value": 1}}, token="wrong-token-0000000000")
    assert status == 401 and body["error"] == "unauthorized", body
    status, body = http("POST", url, {"name": "triple-double", "arguments": {"value": 1}}, token=None)
    assert status == 401 and "Authorization: Bearer" in body["message"], body

    status, body = http("POST", url, raw=b"{not json")
    assert status == 400 and body["error"] == "invalid_body", body

    # The same checks through MCP: JSON-RPC errors naming field, value and rule.
    async def mcp_errors():
        client = create_mcp_http_client(headers={"Authorization": "Bearer " + TOKEN})
        async with client:
            async with streamable_http_client(gw.url + "/mcp", http_client=client) as streams:
                async with ClientSession(streams[0], streams[1]) as session:
                    await session.initialize()
                    errs = []
                    for name, args in [("nope", {}), ("triple-double", {}), ("triple-double", {"value": "three"})]:
                        try:
                            await session.call_tool(name, args)
                            errs.append(None)
                        except Exception as e:  # McpError
                            errs.append(e)
                    return errs

    unknown, missing, wrong = asyncio.run(mcp_errors())
    assert unknown is not None and "unknown tool" in str(unknown), unknown
    assert missing is not None and "arguments.value: (missing): is required" in str(missing), missing
    assert wrong is not None and 'arguments.value: "three": must be of type integer' in str(wrong), wrong
    assert getattr(getattr(wrong, "error", None), "code", None) == -32602

    status, _ = http("POST", gw.url + "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, token="bad-token-000000000000")
    assert status == 401


def test_report_tokens_only_report_and_only_their_namespace(world, database):
    """Issue 26: the sidecars report with their namespace's report token (the pipeline ends);
    that token is refused a tool call and an envelope read, another namespace's report token
    is refused the envelope, and a client token limited to another namespace does not see it."""
    ns, _bucket, gw = pipeline(world, "rabbitmq", database)
    status, body = http("POST", gw.url + "/tools/call", {"name": "triple-double", "arguments": {"value": 1}})
    assert status == 202, body
    id = body["envelope_id"]
    rec = gw.wait_final(id)
    assert rec["status"] == "succeeded" and rec["namespace"] == ns, rec

    mine = report_token(ns)
    status, body = http("POST", gw.url + "/tools/call", {"name": "triple-double", "arguments": {"value": 1}}, token=mine)
    assert status == 403 and body["error"] == "report_token_not_allowed", body
    assert "may only report" in body["message"] and mine not in body["message"]
    status, body = http("GET", gw.url + "/envelopes/" + id, token=mine)
    assert status == 403 and body["error"] == "report_token_not_allowed", body
    status, _ = http("POST", gw.url + "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, token=mine)
    assert status == 403

    theirs = report_token(ns + "-x")
    progress = {"actor": "a", "phase": "received", "current": 0, "total": 3}
    status, body = http("POST", gw.url + "/envelopes/%s/progress" % id, progress, token=theirs)
    assert status == 403 and body["error"] == "envelope_of_another_namespace", body
    assert '"%s"' % ns in body["message"], body
    status, body = http("POST", gw.url + "/envelopes/%s/final" % id, {"status": "failed"}, token=theirs)
    assert status == 403, body
    status, body = http("POST", gw.url + "/envelopes/%s/final" % id, {"status": "failed"}, token=TOKEN)
    assert status == 403 and body["error"] == "client_token_not_allowed", body
    assert gw.envelope(id)["status"] == "succeeded", "nothing changed"

    status, body = http("GET", gw.url + "/envelopes/" + id, token=ELSEWHERE_TOKEN)
    assert status == 404 and body["error"] == "unknown_envelope", body
    status, body = http("GET", gw.url + "/tools", token=ELSEWHERE_TOKEN)
    assert status == 200 and body["tools"] == [], body
    status, body = http("POST", gw.url + "/tools/call", {"name": "triple-double", "arguments": {"value": 1}},
                        token=ELSEWHERE_TOKEN)
    assert status == 403 and body["error"] == "namespace_not_allowed", body

    # The same limits over MCP: no tool listed, the call refused naming the rule.
    async def mcp_elsewhere():
        client = create_mcp_http_client(headers={"Authorization": "Bearer " + ELSEWHERE_TOKEN})
        async with client:
            async with streamable_http_client(gw.url + "/mcp", http_client=client) as streams:
                async with ClientSession(streams[0], streams[1]) as session:
                    await session.initialize()
                    tools = await session.list_tools()
                    try:
                        await session.call_tool("triple-double", {"value": 1})
                        refused = None
                    except Exception as e:  # McpError
                        refused = e
                    return tools, refused

    tools, refused = asyncio.run(mcp_elsewhere())
    assert tools.tools == [], tools
    assert refused is not None and "may use only the namespaces elsewhere" in str(refused), refused


def test_postgres_down_refuses_with_503_and_accepts_again(world, database):
    ns = unique("pgd")
    gw = world.gateway("rabbitmq", TOOLS, database, ns)
    world.actor("rabbitmq", ns, "a", "testing.act", gw.url)  # declares the first actor's queue
    name = database.rsplit("/", 1)[1]
    base = os.environ["ASYA_TEST_POSTGRES_URL"]
    # This gateway's database goes away (connections refused and cut); others are untouched.
    psql(base, "ALTER DATABASE %s WITH ALLOW_CONNECTIONS false" % name)
    psql(base, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '%s'" % name)
    try:
        status, body = http("POST", gw.url + "/tools/call", {"name": "triple-double", "arguments": {"value": 1}})
        assert status == 503 and body["error"] == "storage_unavailable", body
        assert "nothing was accepted" in body["message"]
        status, body = http("GET", gw.url + "/health", token=None)
        assert status == 503 and body["status"] == "degraded", body
    finally:
        psql(base, "ALTER DATABASE %s WITH ALLOW_CONNECTIONS true" % name)
    status, body = http("POST", gw.url + "/tools/call", {"name": "triple-double", "arguments": {"value": 1}})
    assert status == 202, body
    assert psql(database, "SELECT count(*) FROM envelopes WHERE id = '%s'" % body["envelope_id"]) == "1"


def test_validate_refuses_empty_routes_and_unknown_types(tmp_path):
    import subprocess

    from conftest import GATEWAY

    bad = tmp_path / "bad.yaml"
    bad.write_text("tools:\n- name: t\n  parameters: {x: {type: float}}\n  route: []\n")
    out = subprocess.run([str(GATEWAY), "validate", "--tools", str(bad)], capture_output=True, text=True)
    assert out.returncode == 1
    assert 'tool "t": route: []: must name at least one actor' in out.stderr, out.stderr
    assert 'tool "t": parameters.x.type: "float": must be one of' in out.stderr, out.stderr
    good = tmp_path / "good.yaml"
    good.write_text(TOOLS)
    out = subprocess.run([str(GATEWAY), "validate", "--tools", str(good)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "triple-double -> a -> b -> c" in out.stdout
