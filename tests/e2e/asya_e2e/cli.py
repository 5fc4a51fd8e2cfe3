"""The `asya` command as a user runs it: the binary of the profile `make` built, the test
cluster's kubeconfig, the release's ConfigMap in asya-system."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from asya_e2e.env import KUBECONFIG, RELEASE_NS, bin_dir


def asya_bin() -> str:
    return os.path.join(bin_dir(), "asya")


def asya(ns: str, *args, kubeconfig: Path | None = None, check: bool = True, timeout: int = 120):
    """Runs `asya -n NS ARGS...`; returns the CompletedProcess (stdout, stderr, returncode)."""
    cmd = [asya_bin(), "-n", ns, "--release-namespace", RELEASE_NS,
           "--kubeconfig", str(kubeconfig or KUBECONFIG), *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {out.returncode}\nstdout: {out.stdout}\nstderr: {out.stderr}")
    return out


def asya_json(ns: str, *args, **kw):
    return json.loads(asya(ns, *args, "-o", "json", **kw).stdout)
