#!/usr/bin/env python3
"""The state proxy's overhead, as a handler sees it (docs/benchmarks.md § State proxy).

One Python process plays the handler: the same operations go (a) through the runtime's hooks
(plain open(), docs/DESIGN.md §10) to our Rust connector over its Unix socket, and (b) straight
to S3 with boto3, against the same S3 server, in alternating rounds so both see the same load:

- small files: N writes of SIZE bytes, then N reads (files/s);
- one large file: written and read back (MiB/s), buffered and passthrough.

    source tests/services/env
    cargo build --profile ci -p asya-state-proxy
    python3 state-proxy/bench/vs_boto3.py --bin ~/.cache/asya-rs/target/ci/asya-state-proxy

Prints one table; the ratio is proxy / boto3 (1.0: no overhead; above 1: the proxy is faster).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUNTIME = os.path.join(ROOT, "sidecar", "runtime", "asya_runtime.py")


def load_runtime():
    spec = importlib.util.spec_from_file_location("asya_runtime_bench", RUNTIME)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def start_connector(binary, sock, connector, bucket, prefix, endpoint):
    env = dict(os.environ, CONNECTOR_SOCKET=sock, ASYA_NAMESPACE="bench", STATE_BUCKET=bucket, STATE_PREFIX=prefix,
               AWS_ENDPOINT_URL=endpoint, AWS_REGION="us-east-1", ASYA_LOG_LEVEL="warn")
    env.pop("ASYA_METRICS_ADDR", None)
    proc = subprocess.Popen([binary, connector], env=env)
    deadline = time.monotonic() + 10
    while not os.path.exists(sock):
        if proc.poll() is not None or time.monotonic() > deadline:
            sys.exit("the connector did not start (%s)" % binary)
        time.sleep(0.02)
    return proc


def rss_mib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", required=True, help="the asya-state-proxy binary")
    ap.add_argument("--files", type=int, default=300, help="small files per round")
    ap.add_argument("--size", type=int, default=1024, help="bytes per small file")
    ap.add_argument("--large-mib", type=int, default=64, help="size of the large file")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    endpoint = os.environ.get("ASYA_TEST_S3_ENDPOINT")
    if not endpoint:
        sys.exit("ASYA_TEST_S3_ENDPOINT is not set: source tests/services/env")

    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    bucket = "asya-bench-%s" % os.urandom(4).hex()
    s3.create_bucket(Bucket=bucket)
    work = tempfile.mkdtemp(prefix="asya-bench-")
    procs = [start_connector(args.bin, os.path.join(work, "ckpt.sock"), "s3-buffered-lww", bucket, "ckpt", endpoint),
             start_connector(args.bin, os.path.join(work, "media.sock"), "s3-passthrough", bucket, "media", endpoint)]
    rt = load_runtime()
    restore = rt.install_state_proxies({
        "ASYA_STATE_PROXY_MOUNTS": "ckpt:/state/ckpt:write=buffered;media:/state/media:write=passthrough",
        "ASYA_STATE_SOCKET_DIR": work,
    })
    small = os.urandom(args.size)
    piece = os.urandom(1024 * 1024)
    load_before = os.getloadavg()[0]
    results: dict[str, list[float]] = {}

    def add(name, value):
        results.setdefault(name, []).append(value)

    try:
        for r in range(args.rounds):
            n = args.files
            # Small files: write then read, through the proxy and with boto3.
            def write_small():
                for i in range(n):
                    with open("/state/ckpt/s/%d-%d" % (r, i), "wb") as f:
                        f.write(small)

            def read_small():
                for i in range(n):
                    with open("/state/ckpt/s/%d-%d" % (r, i), "rb") as f:
                        f.read()

            add("small write proxy", n / timed(write_small))
            add("small write boto3", n / timed(lambda: [s3.put_object(Bucket=bucket, Key="direct/s/%d-%d" % (r, i), Body=small)
                                                        for i in range(n)]))
            add("small read proxy", n / timed(read_small))
            add("small read boto3", n / timed(lambda: [s3.get_object(Bucket=bucket, Key="direct/s/%d-%d" % (r, i))["Body"].read()
                                                       for i in range(n)]))
            mib = args.large_mib

            def write_through(mount):
                with open("/state/%s/large-%d" % (mount, r), "wb") as f:
                    for _ in range(mib):
                        f.write(piece)

            def read_through(mount):
                with open("/state/%s/large-%d" % (mount, r), "rb") as f:
                    while f.read(1024 * 1024):
                        pass

            def write_direct():
                with tempfile.TemporaryFile() as f:  # what a handler without the proxy spools
                    for _ in range(mib):
                        f.write(piece)
                    f.seek(0)
                    s3.upload_fileobj(f, bucket, "direct/large-%d" % r)

            def read_direct():
                body = s3.get_object(Bucket=bucket, Key="direct/large-%d" % r)["Body"]
                while body.read(1024 * 1024):
                    pass

            add("large write proxy buffered", mib / timed(lambda: write_through("ckpt")))
            add("large write proxy passthrough", mib / timed(lambda: write_through("media")))
            add("large write boto3", mib / timed(write_direct))
            add("large read proxy buffered", mib / timed(lambda: read_through("ckpt")))
            add("large read proxy passthrough", mib / timed(lambda: read_through("media")))
            add("large read boto3", mib / timed(read_direct))
    finally:
        restore()
        rss = [rss_mib(p.pid) for p in procs]
        for p in procs:
            p.terminate()
            p.wait()
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for obj in page.get("Contents", []):
                s3.delete_object(Bucket=bucket, Key=obj["Key"])
        s3.delete_bucket(Bucket=bucket)

    med = {k: statistics.median(v) for k, v in results.items()}
    print("state proxy vs boto3: %d rounds, %d small files of %d B, a %d MiB file; S3 at %s"
          % (args.rounds, args.files, args.size, args.large_mib, endpoint))
    print("load average %.2f before, %.2f after; connector peak RSS %s MiB (buffered, passthrough)"
          % (load_before, os.getloadavg()[0], ", ".join("%.1f" % x for x in rss)))
    print("%-32s %12s %12s %8s" % ("operation (median)", "proxy", "boto3", "ratio"))
    for op, unit in (("small write", "files/s"), ("small read", "files/s")):
        p, b = med[op + " proxy"], med[op + " boto3"]
        print("%-32s %12.1f %12.1f %8.2f" % ("%s (%s)" % (op, unit), p, b, p / b))
    for op in ("large write", "large read"):
        b = med[op + " boto3"]
        for mode in ("buffered", "passthrough"):
            p = med["%s proxy %s" % (op, mode)]
            print("%-32s %12.1f %12.1f %8.2f" % ("%s %s (MiB/s)" % (op, mode), p, b, p / b))
    print("peak RSS of this process (the handler): %.0f MiB"
          % (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))


if __name__ == "__main__":
    main()
