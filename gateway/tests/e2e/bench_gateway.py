"""Gateway benchmark (docs/benchmarks.md): not part of the suite (the file name does not match
test_*.py); run explicitly against the servers of tests/services, with release binaries:

    cargo build --release -p asya-gateway -p asya-sidecar --bins
    source tests/services/env
    ASYA_BIN_DIR=$CARGO_TARGET_DIR/release python3 -m pytest -q -s -p no:cacheprovider \\
        gateway/tests/e2e/bench_gateway.py

One echo actor (`testing.act`, sidecar + Python runtime) on RabbitMQ, measured two ways with
the same number of clients, each doing one envelope after another:

- through the gateway: `POST /tools/call` of a one-actor tool, then the envelope's SSE stream
  until its final status; the end actor on x-sink (the same handler, envelope mode) reports
  it, and the gateway keeps every status in PostgreSQL;
- straight to the queue: the envelope published (with confirm) to the actor's queue, and
  taken from x-sink by the benchmark itself; no gateway, no reports, no end actor.

Prints `GATEWAY-BENCH` lines: calls per second, and latency p50/p99 from the call (or the
publish) to the final status (or the arrival in x-sink). The difference is what a client
pays for the gateway: the status row, the progress and final reports, the end actor's hop.
ASYA_BENCH_CALLS (1000) and ASYA_BENCH_CLIENTS (16) set the size.
"""

from __future__ import annotations

import json
import os
import queue
import statistics
import threading
import time
import urllib.request
import uuid

import pika
import pytest

from conftest import TOKEN, http, need, psql, unique

CALLS = int(os.environ.get("ASYA_BENCH_CALLS", "1000"))
CLIENTS = int(os.environ.get("ASYA_BENCH_CLIENTS", "16"))
WARMUP = 50
TOOLS = """
routes:
  tools:
  - name: echo
    description: Says it back
    parameters:
      text: {type: string, required: true}
    route: [echo]
"""
EXCHANGE = "asya"


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def report(what: str, wall: float, lat: list[float]) -> dict:
    fig = {"calls_per_s": len(lat) / wall, "p50_ms": pct(lat, 50) * 1e3, "p99_ms": pct(lat, 99) * 1e3,
           "mean_ms": statistics.mean(lat) * 1e3}
    print(f"GATEWAY-BENCH {what} calls={len(lat)} clients={CLIENTS} calls_per_s={fig['calls_per_s']:.1f} "
          f"p50_ms={fig['p50_ms']:.1f} p99_ms={fig['p99_ms']:.1f} mean_ms={fig['mean_ms']:.1f}")
    return fig


TICKS = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int) -> float:
    """CPU seconds of one process so far."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def machine_busy() -> float:
    """CPU seconds the whole machine spent not idle so far (all cores)."""
    cols = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return (sum(cols) - cols[3] - cols[4]) / TICKS


def cpu_by_command() -> dict[str, float]:
    """CPU seconds so far of every process on the machine, summed by command name."""
    out: dict[str, float] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = open(f"/proc/{d}/stat").read()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        out[comm] = out.get(comm, 0.0) + (int(fields[11]) + int(fields[12])) / TICKS
    return out


def top_consumers(before: dict[str, float], calls: int, n: int = 6) -> str:
    after = cpu_by_command()
    diff = sorted(((after[k] - before.get(k, 0.0), k) for k in after), reverse=True)[:n]
    return " ".join(f"{k}={v / calls * 1e3:.2f}" for v, k in diff if v > 0)


def run_clients(n: int, one) -> tuple[float, list[float]]:
    """n calls of `one()` (which returns its own latency) over CLIENTS threads: (wall, latencies)."""
    todo = queue.Queue()
    for _ in range(n):
        todo.put(None)
    lat, errors, lock = [], [], threading.Lock()

    def worker():
        ctx = {}
        while True:
            try:
                todo.get_nowait()
            except queue.Empty:
                return
            try:
                took = one(ctx)
            except Exception as e:  # noqa: BLE001 - reported below, with the count
                with lock:
                    errors.append(repr(e))
                return
            with lock:
                lat.append(took)

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    assert not errors, f"{len(errors)} calls failed, first: {errors[0]}"
    assert len(lat) == n, f"{len(lat)} of {n} calls finished"
    return wall, lat


def final_via_stream(gw_url: str, id: str) -> dict:
    """Reads the envelope's SSE stream until its `final` event."""
    req = urllib.request.Request(f"{gw_url}/envelopes/{id}/stream", headers={"Authorization": "Bearer " + TOKEN})
    with urllib.request.urlopen(req, timeout=60) as r:
        event = None
        for raw in r:
            line = raw.decode().rstrip("\r\n")
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
            elif line.startswith("data:") and event == "final":
                return json.loads(line.split(":", 1)[1])
    raise AssertionError(f"the stream of {id} ended without a final event")


def test_gateway_calls_against_straight_sends(world, database):
    rabbit_url = need("ASYA_TEST_RABBITMQ_URL")

    # --- through the gateway ---
    ns = unique("bench")
    gw = world.gateway("rabbitmq", TOOLS, database, ns, extra_args=["--rate-limit", "0"])
    world.actor("rabbitmq", ns, "echo", "testing.act", gw.url)
    world.actor("rabbitmq", ns, "x-sink", "testing.act", gw.url, mode="envelope")

    def call(_ctx) -> float:
        t0 = time.monotonic()
        status, body = http("POST", gw.url + "/tools/call", {"name": "echo", "arguments": {"text": "hi"}})
        assert status == 202, body
        rec = final_via_stream(gw.url, body["envelope_id"])
        assert rec["status"] == "succeeded", rec
        return time.monotonic() - t0

    run_clients(WARMUP, call)
    gw_cpu, busy, by_cmd = proc_cpu(gw.proc.pid), machine_busy(), cpu_by_command()
    wall, lat = run_clients(CALLS, call)
    via_gateway = report("via_gateway", wall, lat)
    # Where the time goes: the gateway's own CPU, and the whole machine's (2 cores here: when
    # it is near 2 s per second, every process of the path competes for them).
    print(f"GATEWAY-BENCH via_gateway gateway_cpu_ms_per_call={(proc_cpu(gw.proc.pid) - gw_cpu) / CALLS * 1e3:.2f} "
          f"machine_cpu_ms_per_call={(machine_busy() - busy) / CALLS * 1e3:.2f} "
          f"machine_busy_cores={(machine_busy() - busy) / wall:.2f}")
    print(f"GATEWAY-BENCH via_gateway cpu_ms_per_call_by_command {top_consumers(by_cmd, CALLS)}")

    # --- straight to the queue, the same actor without a gateway ---
    ns = unique("bench")
    world.actor("rabbitmq", ns, "echo", "testing.act", "")
    sink = f"asya-{ns}-x-sink"
    arrived: dict[str, threading.Event] = {}
    arrived_lock = threading.Lock()
    stop = threading.Event()
    params = pika.URLParameters(rabbit_url)

    def consume():
        conn = pika.BlockingConnection(params)
        ch = conn.channel()
        ch.queue_declare(sink, durable=True)
        ch.queue_bind(sink, EXCHANGE, routing_key=sink)
        ready.set()
        for method, _props, body in ch.consume(sink, auto_ack=True, inactivity_timeout=0.2):
            if stop.is_set():
                break
            if method is None:
                continue
            id = json.loads(body)["id"]
            with arrived_lock:
                ev = arrived.setdefault(id, threading.Event())
            ev.set()
        ch.cancel()
        conn.close()

    ready = threading.Event()
    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    assert ready.wait(30), "the x-sink consumer did not start"

    def send(ctx) -> float:
        if "ch" not in ctx:
            ctx["conn"] = pika.BlockingConnection(params)
            ctx["ch"] = ctx["conn"].channel()
            ctx["ch"].confirm_delivery()
        id = uuid.uuid4().hex
        with arrived_lock:
            ev = arrived.setdefault(id, threading.Event())
        envelope = {"id": id, "route": {"actors": ["echo"], "current": 0}, "headers": {},
                    "payload": {"do": "echo", "text": "hi"}}
        t0 = time.monotonic()
        ctx["ch"].basic_publish(EXCHANGE, f"asya-{ns}-echo", json.dumps(envelope).encode(),
                                pika.BasicProperties(delivery_mode=2, content_type="application/json"),
                                mandatory=True)
        assert ev.wait(60), f"{id} never reached x-sink"
        return time.monotonic() - t0

    try:
        run_clients(WARMUP, send)
        busy, by_cmd = machine_busy(), cpu_by_command()
        wall, lat = run_clients(CALLS, send)
        busy = machine_busy() - busy
        by_cmd_line = top_consumers(by_cmd, CALLS)
    finally:
        stop.set()
        consumer.join(10)
    straight = report("straight_to_queue", wall, lat)
    print(f"GATEWAY-BENCH straight_to_queue machine_cpu_ms_per_call={busy / CALLS * 1e3:.2f} "
          f"machine_busy_cores={busy / wall:.2f}")
    print(f"GATEWAY-BENCH straight_to_queue cpu_ms_per_call_by_command {by_cmd_line}")

    added_p50 = via_gateway["p50_ms"] - straight["p50_ms"]
    added_p99 = via_gateway["p99_ms"] - straight["p99_ms"]
    print(f"GATEWAY-BENCH added_by_gateway p50_ms={added_p50:.1f} p99_ms={added_p99:.1f} "
          f"throughput_ratio={via_gateway['calls_per_s'] / straight['calls_per_s']:.2f}")
    # Every call through the gateway left its final status in PostgreSQL.
    assert psql(database, "SELECT count(*) FROM envelopes WHERE status = 'succeeded'") == str(WARMUP + CALLS)


if __name__ == "__main__":
    raise SystemExit(pytest.main(["-q", "-s", __file__]))
