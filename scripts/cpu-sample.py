#!/usr/bin/env python3
"""Runs a command and prints, every 0.5 s, how many of the machine's cores were busy and each
process group's share of a core (docs/benchmarks.md § Sidecar: where the CPU goes on two
shared cores). Groups: RabbitMQ (beam.smp), ElasticMQ (java), asya-sidecar-bench, asya-sidecar,
the Python runtime (python3).

    scripts/cpu-sample.py $CARGO_TARGET_DIR/release/asya-sidecar-bench --transport rabbitmq --rabbit-count 40000
"""
import os
import subprocess
import sys
import time

HZ = os.sysconf("SC_CLK_TCK")
CORES = os.cpu_count() or 1
# /proc/PID/comm is cut at 15 characters.
GROUPS = {"beam.smp": "rabbitmq", "java": "elasticmq", "asya-sidecar-be": "bench", "asya-sidecar": "sidecar",
          "python3": "python"}


def machine() -> tuple[int, int]:
    """Busy and total jiffies of all CPUs so far."""
    v = list(map(int, open("/proc/stat").readline().split()[1:]))
    return sum(v) - v[3] - v[4], sum(v)


def processes() -> dict:
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            comm = open(f"/proc/{pid}/comm").read().strip()
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        out[(pid, comm)] = int(fields[11]) + int(fields[12])
    return out


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    child = subprocess.Popen(sys.argv[1:])
    (b0, t0), p0, start = machine(), processes(), time.monotonic()
    while child.poll() is None:
        time.sleep(0.5)
        (b1, t1), p1 = machine(), processes()
        shares: dict = {}
        for key, ticks in p1.items():
            group = GROUPS.get(key[1])
            if group:
                shares[group] = shares.get(group, 0) + ticks - p0.get(key, ticks)
        busy = CORES * (b1 - b0) / max(t1 - t0, 1)
        print(f"cpu t={time.monotonic() - start:6.1f}s machine={busy:4.2f} cores "
              + " ".join(f"{g}={100 * d / HZ / 0.5:4.0f}%" for g, d in sorted(shares.items())), flush=True)
        (b0, t0), p0 = (b1, t1), p1
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
