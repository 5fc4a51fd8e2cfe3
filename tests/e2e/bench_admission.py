"""Admission as the API server sees it (docs/benchmarks.md): not part of the suite; run against
the chart's webhook pods:

    make images IMAGE_PROFILE=ci && ASYA_CARGO_PROFILE=ci tests/e2e/up
    source tests/cluster/env
    python3 -m pytest -q -s -p no:cacheprovider tests/e2e/bench_admission.py

Pod creates by 50 concurrent creators (ASYA_BENCH_CREATORS) straight to the API server over
keep-alive HTTPS: labelled pods, which the API server sends to the webhook pods for injection,
against the very same injected pod created directly without the label (its spec taken from a
labelled one, so both store the same object), in alternating rounds of ASYA_BENCH_PODS (400)
each, ASYA_BENCH_ROUNDS (3) of each. The pods carry a scheduling gate, so nothing schedules or
runs them. Prints creates/s and latency p50/p99 per round, the webhook's own share
from the API server's apiserver_admission_webhook_admission_duration_seconds, and the CPU each
pod create costs the API server, etcd, the webhook pods and the machine.

Then the same two kinds paced at ASYA_BENCH_RATE creates/s (150), ASYA_BENCH_PACED_PODS (600) a
round: latency without a queue on the cores, so the difference is what the webhook adds.
"""

from __future__ import annotations

import copy
import json
import os
import queue
import threading
import time
import uuid

from asya_e2e.api import api_connection_factory
from asya_e2e.kube import kubectl, kubectl_json, no_namespace_terminating
from asya_e2e.wait import wait_for

CREATORS = int(os.environ.get("ASYA_BENCH_CREATORS", "50"))
PODS = int(os.environ.get("ASYA_BENCH_PODS", "400"))
ROUNDS = int(os.environ.get("ASYA_BENCH_ROUNDS", "3"))
# The paced phase: creates per second, well under what the machine sustains (about 600).
RATE = float(os.environ.get("ASYA_BENCH_RATE", "150"))
PACED_PODS = int(os.environ.get("ASYA_BENCH_PACED_PODS", "600"))


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


TICK = os.sysconf("SC_CLK_TCK")
# Host processes whose CPU a round reads: a substring of their command line each.
PROCESSES = {"apiserver": " kube-apiserver ", "etcd": " run --dir ", "webhook": "asya-webhook serve"}


def cpu_seconds() -> dict[str, float]:
    """CPU time so far (user + system) of the API server, etcd (in the cluster's `run`
    process), the webhook pods' processes (one pid namespace view from the host), this
    benchmark, and the whole machine."""
    out = dict.fromkeys(PROCESSES, 0.0)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
            stat = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        for group, needle in PROCESSES.items():
            if needle in f" {cmd}":
                out[group] += (int(stat[11]) + int(stat[12])) / TICK
    stat = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
    out["bench"] = (int(stat[11]) + int(stat[12])) / TICK
    fields = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    out["machine"] = (sum(fields[:8]) - fields[3] - fields[4]) / TICK  # all but idle and iowait
    return out


def create_round(connect, headers, ns: str, body: dict, n: int, tag: str,
                 rate: float | None = None) -> tuple[float, list[float]]:
    """n creates of `body` (names made unique) over CREATORS connections: (wall, latencies).
    With `rate`, create i is due at start + i/rate (an open loop: a slow answer does not slow
    the arrivals) and its latency counts from when it was due."""
    todo = queue.Queue()
    for i in range(n):
        todo.put(i)
    start = time.monotonic() + 0.05
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
                if rate:
                    due = start + i / rate
                    if due > t0:
                        time.sleep(due - t0)
                    t0 = due
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
    # A namespace being emptied (an earlier run's thousands of pods) loads the API server.
    wait_for("no namespace terminating", no_namespace_terminating, timeout=600, interval=2)
    ns = f"bench-adm-{uuid.uuid4().hex[:6]}"
    kubectl("create", "namespace", ns)
    try:
        wait_for(f"service account in {ns}", lambda: kubectl("get", "sa", "default", "-n", ns,
                                                             check=False).returncode == 0)
        labelled = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "x", "labels": {"asya.sh/inject": "true", "asya.sh/actor": "adm"},
                         "annotations": {"asya.sh/handler": "pipeline.shout", "asya.sh/transport": "rabbitmq"}},
            # Held by a scheduling gate: stored, never scheduled nor run, and left alone (a pod
            # bound to a missing node would be deleted by the pod GC in the middle of a later
            # round).
            "spec": {"schedulingGates": [{"name": "asya.sh/bench"}], "containers": [
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
        cpu = {"labelled": [], "direct": []}
        for r in range(ROUNDS):
            for kind, body in (("labelled", labelled), ("direct", direct)):
                s0, c0 = webhook_histogram(webhook)
                u0 = cpu_seconds()
                wall, lat = create_round(connect, headers, ns, body, PODS, f"{kind[0]}{r}")
                u1 = cpu_seconds()
                s1, c1 = webhook_histogram(webhook)
                results[kind].append((wall, lat))
                cpu[kind].append({g: (u1[g] - u0[g]) / PODS * 1e3 for g in u0})
                share = f" webhook_calls={c1 - c0:.0f} webhook_mean_ms={(s1 - s0) / (c1 - c0) * 1e3:.2f}" \
                    if c1 > c0 else ""
                per_pod = " ".join(f"{g}={v:.2f}" for g, v in cpu[kind][-1].items())
                print(f"\nADMISSION-BENCH round={r} {kind} pods={PODS} creators={CREATORS} "
                      f"creates_per_s={PODS / wall:.0f} p50_ms={pct(lat, 50) * 1e3:.1f} "
                      f"p99_ms={pct(lat, 99) * 1e3:.1f}{share} load1={os.getloadavg()[0]:.1f}"
                      f"\nADMISSION-BENCH round={r} {kind} cpu_ms_per_pod {per_pod}")
                assert (c1 > c0) == (kind == "labelled"), "the webhook was called for the wrong pods"
        for kind in results:
            rates = [PODS / w for w, _ in results[kind]]
            p99s = [pct(lat, 99) * 1e3 for _, lat in results[kind]]
            print(f"ADMISSION-BENCH {kind} creates_per_s={min(rates):.0f}-{max(rates):.0f} "
                  f"p99_ms={min(p99s):.1f}-{max(p99s):.1f}")
        lab = sum(PODS / w for w, _ in results["labelled"]) / ROUNDS
        dir_ = sum(PODS / w for w, _ in results["direct"]) / ROUNDS
        print(f"ADMISSION-BENCH labelled_vs_direct throughput={lab / dir_ * 100:.0f}%")
        # What admission costs, whatever else shares the cores: CPU per pod, labelled minus direct.
        mean = {k: {g: sum(c[g] for c in v) / len(v) for g in v[0]} for k, v in cpu.items()}
        print("ADMISSION-BENCH cpu_ms_per_pod labelled-direct " +
              " ".join(f"{g}={mean['labelled'][g] - mean['direct'][g]:+.2f}" for g in mean["direct"]) +
              f" (direct machine={mean['direct']['machine']:.2f})")
        assert mean["labelled"]["webhook"] > mean["direct"]["webhook"], "the webhook's CPU was not seen"

        # Latency at a sustainable rate: no queue on the cores, so the difference is the
        # webhook's own round trip.
        paced = {"labelled": [], "direct": []}
        for r in range(ROUNDS):
            for kind, body in (("labelled", labelled), ("direct", direct)):
                wall, lat = create_round(connect, headers, ns, body, PACED_PODS, f"p{kind[0]}{r}", rate=RATE)
                paced[kind].extend(lat)
                print(f"ADMISSION-BENCH paced round={r} {kind} rate={RATE:.0f}/s achieved={PACED_PODS / wall:.0f}/s "
                      f"p50_ms={pct(lat, 50) * 1e3:.1f} p99_ms={pct(lat, 99) * 1e3:.1f} load1={os.getloadavg()[0]:.1f}")
        lp, dp = paced["labelled"], paced["direct"]
        print(f"ADMISSION-BENCH paced rate={RATE:.0f}/s labelled p50_ms={pct(lp, 50) * 1e3:.1f} "
              f"p99_ms={pct(lp, 99) * 1e3:.1f} direct p50_ms={pct(dp, 50) * 1e3:.1f} p99_ms={pct(dp, 99) * 1e3:.1f} "
              f"added p50_ms={(pct(lp, 50) - pct(dp, 50)) * 1e3:+.1f} p99_ms={(pct(lp, 99) - pct(dp, 99)) * 1e3:+.1f}")
    finally:
        kubectl("delete", "namespace", ns, "--wait=false", check=False)
