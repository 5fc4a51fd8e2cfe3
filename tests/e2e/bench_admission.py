"""Admission as the API server sees it (docs/benchmarks.md): not part of the suite; run against
the chart's webhook pods:

    make images IMAGE_PROFILE=ci && ASYA_CARGO_PROFILE=ci tests/e2e/up
    source tests/cluster/env
    python3 -m pytest -q -s -p no:cacheprovider tests/e2e/bench_admission.py

Pod creates by 50 concurrent creators (ASYA_BENCH_CREATORS) straight to the API server over
keep-alive HTTPS: labelled pods, which the API server sends to the webhook pods for injection,
against the very same injected pod created directly without the label (its spec taken from a
labelled one, so both store the same object), in alternating rounds of ASYA_BENCH_PODS (400)
each, ASYA_BENCH_ROUNDS (3) of each. The pods are bound to a node that does not exist, so
nothing runs them. Prints creates/s and latency p50/p99 per round, and the webhook's own share
from the API server's apiserver_admission_webhook_admission_duration_seconds.
"""

from __future__ import annotations

import base64
import copy
import http.client
import json
import os
import queue
import ssl
import tempfile
import threading
import time
import uuid

import yaml

from conftest import KUBECONFIG, kubectl, kubectl_json, wait_for

CREATORS = int(os.environ.get("ASYA_BENCH_CREATORS", "50"))
PODS = int(os.environ.get("ASYA_BENCH_PODS", "400"))
ROUNDS = int(os.environ.get("ASYA_BENCH_ROUNDS", "3"))


def api_connection_factory():
    """A function that opens one HTTPS connection to the API server as the kubeconfig's user."""
    cfg = yaml.safe_load(open(KUBECONFIG))
    cluster = cfg["clusters"][0]["cluster"]
    user = cfg["users"][0]["user"]
    tmp = tempfile.mkdtemp(prefix="asya-bench-admission-")

    def material(data_key, path_key, name):
        if user.get(path_key) or cluster.get(path_key):
            return user.get(path_key) or cluster.get(path_key)
        p = os.path.join(tmp, name)
        with open(p, "wb") as f:
            f.write(base64.b64decode(user.get(data_key) or cluster[data_key]))
        return p

    ctx = ssl.create_default_context(cafile=material("certificate-authority-data", "certificate-authority", "ca"))
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if user.get("token"):
        headers["Authorization"] = "Bearer " + user["token"]
    else:
        ctx.load_cert_chain(material("client-certificate-data", "client-certificate", "crt"),
                            material("client-key-data", "client-key", "key"))
    server = cluster["server"].removeprefix("https://")
    host, port = server.rsplit(":", 1)

    def connect():
        return http.client.HTTPSConnection(host, int(port), context=ctx, timeout=30)

    return connect, headers


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def webhook_histogram(name: str) -> tuple[float, float]:
    """(sum, count) of the API server's admission duration for the webhook NAME, all operations."""
    total = count = 0.0
    for line in kubectl("get", "--raw", "/metrics").stdout.splitlines():
        if line.startswith("apiserver_admission_webhook_admission_duration_seconds_") and f'name="{name}"' in line:
            v = float(line.rsplit(" ", 1)[1])
            if line.startswith("apiserver_admission_webhook_admission_duration_seconds_sum"):
                total += v
            elif line.startswith("apiserver_admission_webhook_admission_duration_seconds_count"):
                count += v
    return total, count


def create_round(connect, headers, ns: str, body: dict, n: int, tag: str) -> tuple[float, list[float]]:
    """n creates of `body` (names made unique) over CREATORS connections: (wall, latencies)."""
    todo = queue.Queue()
    for i in range(n):
        todo.put(i)
    lat, errors, lock = [], [], threading.Lock()
    path = f"/api/v1/namespaces/{ns}/pods"

    def worker():
        conn = connect()
        try:
            while True:
                try:
                    i = todo.get_nowait()
                except queue.Empty:
                    return
                doc = copy.deepcopy(body)
                doc["metadata"]["name"] = f"{tag}-{i}"
                data = json.dumps(doc)
                t0 = time.monotonic()
                conn.request("POST", path, body=data, headers=headers)
                resp = conn.getresponse()
                out = resp.read()
                took = time.monotonic() - t0
                with lock:
                    if resp.status == 201:
                        lat.append(took)
                    else:
                        errors.append(f"{resp.status}: {out[:300]!r}")
        finally:
            conn.close()

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(CREATORS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    assert not errors, f"{len(errors)} creates failed, first: {errors[0]}"
    return wall, lat


def test_admission_labelled_against_direct():
    ns = f"bench-adm-{uuid.uuid4().hex[:6]}"
    kubectl("create", "namespace", ns)
    try:
        wait_for(f"service account in {ns}", lambda: kubectl("get", "sa", "default", "-n", ns,
                                                             check=False).returncode == 0)
        labelled = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "x", "labels": {"asya.sh/inject": "true", "asya.sh/actor": "adm"},
                         "annotations": {"asya.sh/handler": "pipeline.shout", "asya.sh/transport": "rabbitmq"}},
            # Bound to a node that does not exist: stored, never run.
            "spec": {"nodeName": "asya-bench-nowhere", "containers": [
                {"name": "asya-runtime", "image": "localhost/asya-rs/asya-examples:dev"}]},
        }
        kubectl("apply", "-f", "-", input=json.dumps({**labelled, "metadata": {**labelled["metadata"],
                                                                               "name": "template", "namespace": ns}}))
        injected = kubectl_json("get", "pod", "template", "-n", ns)
        assert any(c["name"] == "asya-sidecar" for c in
                   injected["spec"].get("initContainers", []) + injected["spec"]["containers"]), "not injected"
        # The same object, created directly: the webhook's objectSelector does not match it.
        meta = injected["metadata"]
        labels = {k: v for k, v in meta["labels"].items() if k != "asya.sh/inject"}
        spec = {k: v for k, v in injected["spec"].items()}
        direct = {"apiVersion": "v1", "kind": "Pod",
                  "metadata": {"name": "x", "labels": labels, "annotations": meta.get("annotations", {})},
                  "spec": spec}

        connect, headers = api_connection_factory()
        webhook = next(w["name"] for w in kubectl_json("get", "mutatingwebhookconfigurations",
                                                       "-l", "app.kubernetes.io/instance=asya")["items"][0]["webhooks"]
                       if w.get("objectSelector"))
        create_round(connect, headers, ns, labelled, 50, "warm-l")
        create_round(connect, headers, ns, direct, 50, "warm-d")
        results = {"labelled": [], "direct": []}
        for r in range(ROUNDS):
            for kind, body in (("labelled", labelled), ("direct", direct)):
                s0, c0 = webhook_histogram(webhook)
                wall, lat = create_round(connect, headers, ns, body, PODS, f"{kind[0]}{r}")
                s1, c1 = webhook_histogram(webhook)
                results[kind].append((wall, lat))
                share = f" webhook_calls={c1 - c0:.0f} webhook_mean_ms={(s1 - s0) / (c1 - c0) * 1e3:.2f}" \
                    if c1 > c0 else ""
                print(f"\nADMISSION-BENCH round={r} {kind} pods={PODS} creators={CREATORS} "
                      f"creates_per_s={PODS / wall:.0f} p50_ms={pct(lat, 50) * 1e3:.1f} "
                      f"p99_ms={pct(lat, 99) * 1e3:.1f}{share} load1={os.getloadavg()[0]:.1f}")
                assert (c1 > c0) == (kind == "labelled"), "the webhook was called for the wrong pods"
        for kind in results:
            rates = [PODS / w for w, _ in results[kind]]
            p99s = [pct(lat, 99) * 1e3 for _, lat in results[kind]]
            print(f"ADMISSION-BENCH {kind} creates_per_s={min(rates):.0f}-{max(rates):.0f} "
                  f"p99_ms={min(p99s):.1f}-{max(p99s):.1f}")
        lab = sum(PODS / w for w, _ in results["labelled"]) / ROUNDS
        dir_ = sum(PODS / w for w, _ in results["direct"]) / ROUNDS
        print(f"ADMISSION-BENCH labelled_vs_direct throughput={lab / dir_ * 100:.0f}%")
    finally:
        kubectl("delete", "namespace", ns, "--wait=false", check=False)
