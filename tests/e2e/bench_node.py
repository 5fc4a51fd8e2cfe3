"""Node benchmarks (docs/benchmarks.md): not part of the e2e suite (the file name does not match
test_*.py); run explicitly against the chart's pods on the test node:

    make images IMAGE_PROFILE=ci && ASYA_CARGO_PROFILE=ci tests/e2e/up
    source tests/cluster/env
    python3 -m pytest -q -s -p no:cacheprovider tests/e2e/bench_node.py

Scale from zero: one actor at `minReplicaCount: 0` with `pollingInterval: 5`, idle with no pod;
one envelope sent; the time until its result is in x-sink (KEDA polls the queue, the
Deployment scales, the pod is scheduled, its init containers run, the runtime loads the
handler, the sidecar consumes). Each round waits for the actor to be back at zero pods first.
Prints one `SCALE-FROM-ZERO` line per round with where the time went, from the pod's own
timestamps. ASYA_BENCH_ROUNDS (3) sets the rounds.
"""

from __future__ import annotations

import datetime
import os
import time
import uuid

import pytest

from asya_e2e.actors import EXAMPLES_IMAGE, POD_TIMEOUT, apply_on_node, pods, wait_running
from asya_e2e.brokers import Collected, rabbit_send, rabbit_take
from asya_e2e.kube import kubectl_json, status
from asya_e2e.wait import wait_for

ROUNDS = int(os.environ.get("ASYA_BENCH_ROUNDS", "3"))


def ts(s: str) -> float:
    return datetime.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def test_scale_from_zero(namespace):
    ns = namespace
    apply_on_node(ns, "cold", {"transport": "rabbitmq", "image": EXAMPLES_IMAGE, "imagePullPolicy": "IfNotPresent",
                               "handler": "testing.act",
                               "scaling": {"enabled": True, "minReplicaCount": 0, "maxReplicaCount": 1, "queueLength": 1,
                                           "pollingInterval": 5, "cooldownPeriod": 10}})
    sink = Collected(rabbit_take, f"asya-{ns}-x-sink")
    took = []
    for r in range(ROUNDS):
        wait_for("the actor at zero pods, napping",
                 lambda: pods(ns, "cold") == [] and status(ns, "cold").get("phase") == "Napping",
                 timeout=POD_TIMEOUT, interval=0.5)
        id = f"z{r}-{uuid.uuid4().hex[:6]}"
        t0 = time.time()
        rabbit_send(f"asya-{ns}-cold", {"id": id, "route": {"actors": ["cold"], "current": 0}, "headers": {},
                                        "payload": {"do": "echo", "round": r}})
        got = wait_for(f"round {r}'s result in x-sink", lambda: sink.at_least(r + 1), timeout=POD_TIMEOUT,
                       interval=0.1)
        t1 = time.time()
        assert got[-1]["id"] == id, got
        pod = kubectl_json("get", "pods", "-n", ns, "-l", "asya.sh/actor=cold")["items"][0]
        created = ts(pod["metadata"]["creationTimestamp"])
        ready = next((ts(c["lastTransitionTime"]) for c in pod["status"].get("conditions", [])
                      if c["type"] == "Ready" and c["status"] == "True"), None)
        took.append(t1 - t0)
        # Kubernetes' timestamps have one-second resolution: the split is to the second.
        print(f"\nSCALE-FROM-ZERO round={r} seconds={t1 - t0:.1f} "
              f"to_pod_created_s={created - t0:.0f} pod_created_to_ready_s={(ready or t1) - created:.0f} "
              f"ready_to_result_s={t1 - (ready or t1):.0f}")
    print(f"SCALE-FROM-ZERO rounds={ROUNDS} min_s={min(took):.1f} max_s={max(took):.1f}")
    assert len(took) == ROUNDS


N_THROUGHPUT = int(os.environ.get("ASYA_BENCH_ENVELOPES", "5000"))


@pytest.mark.parametrize("replicas", [1, 4])
def test_actor_pod_throughput(namespace, replicas):
    """One actor (`testing.act` echo, the examples image) at fixed replicas on RabbitMQ: its
    queue is filled as fast as the broker confirms while the pods drain it into x-sink;
    envelopes/s from the first to the last arrival in x-sink, as `asya-sidecar-bench` measures
    the same actor as host processes."""
    import json
    import threading

    import pika

    ns = namespace
    apply_on_node(ns, "tput", {"transport": "rabbitmq", "image": EXAMPLES_IMAGE, "imagePullPolicy": "IfNotPresent",
                               "handler": "testing.act", "scaling": {"enabled": False}, "replicas": replicas})
    wait_running(ns, "tput", count=replicas)
    params = pika.URLParameters(os.environ.get("ASYA_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2f"))
    sink = f"asya-{ns}-x-sink"
    arrivals: list[float] = []
    ready, done = threading.Event(), threading.Event()

    def consume():
        conn = pika.BlockingConnection(params)
        ch = conn.channel()
        ch.basic_qos(prefetch_count=500)
        ready.set()
        for method, _props, _body in ch.consume(sink, inactivity_timeout=1.0):
            if method is None:
                if done.is_set():
                    break
                continue
            arrivals.append(time.monotonic())
            ch.basic_ack(method.delivery_tag)
            if len(arrivals) >= N_THROUGHPUT:
                break
        ch.cancel()
        conn.close()

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    assert ready.wait(30)
    # No publisher confirms here: waiting for each would make the benchmark's own publisher the
    # bottleneck (about 1,200/s from Python). Every envelope is counted in x-sink below.
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    props = pika.BasicProperties(delivery_mode=2, content_type="application/json")
    payload = {"do": "echo", "text": "x" * 200}
    for i in range(N_THROUGHPUT):
        body = json.dumps({"id": f"t{i}", "route": {"actors": ["tput"], "current": 0}, "headers": {},
                           "payload": payload})
        ch.basic_publish("asya", f"asya-{ns}-tput", body.encode(), props)
    published = time.monotonic()
    conn.close()
    deadline = time.monotonic() + 600
    while len(arrivals) < N_THROUGHPUT and time.monotonic() < deadline and consumer.is_alive():
        time.sleep(0.2)
    done.set()
    consumer.join(10)
    assert len(arrivals) == N_THROUGHPUT, f"{len(arrivals)} of {N_THROUGHPUT} reached x-sink"
    rate = (N_THROUGHPUT - 1) / (arrivals[-1] - arrivals[0])
    print(f"\nPOD-THROUGHPUT replicas={replicas} envelopes={N_THROUGHPUT} envelopes_per_s={rate:.0f} "
          f"arrived_after_publish_end={sum(a > published for a in arrivals)} load1={os.getloadavg()[0]:.1f}")
