"""The real asya-gateway binary as a local process beside the test cluster (the e2e values do
not install the chart's gateway): started on a free port with the test cluster's kubeconfig,
ready when /health answers, stopped with SIGTERM."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from asya_e2e.env import KUBECONFIG, bin_dir
from asya_e2e.wait import wait_for

GATEWAY = Path(bin_dir()) / "asya-gateway"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(method: str, url: str, token: str, body: dict | None = None) -> tuple[int, dict]:
    """One request with `token`; the status and the JSON answer (errors included)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    req.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        text = e.read()
        try:
            return e.code, json.loads(text)
        except ValueError:
            return e.code, {"raw": text.decode(errors="replace")}


def post(url: str, token: str, body: dict) -> tuple[int, dict]:
    return call("POST", url, token, body)


@contextlib.contextmanager
def running_gateway(tmp_path: Path, tokens: list[str], args: list[str], env: dict | None = None):
    """A gateway serving `tools: []` to `tokens` with the extra `args`; yields its URL."""
    if not GATEWAY.exists():
        pytest.fail(f"{GATEWAY} is missing: build the binaries first (cargo build -p asya-gateway)")
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "tools.yaml").write_text("tools: []\n")
    (tmp_path / "tokens").write_text("".join(t + "\n" for t in tokens))
    port = free_port()
    log_path = tmp_path / "gateway.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        [str(GATEWAY), "serve", "--addr", f"127.0.0.1:{port}", "--tools", str(tmp_path / "tools.yaml"),
         "--auth-tokens", str(tmp_path / "tokens"), *args],
        env=dict(os.environ, KUBECONFIG=str(KUBECONFIG), ASYA_LOG_FORMAT="text", **(env or {})),
        stdout=subprocess.DEVNULL, stderr=log)
    url = f"http://127.0.0.1:{port}"

    def healthy():
        assert proc.poll() is None, log_path.read_text()
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    try:
        wait_for("the gateway's /health", healthy, timeout=30)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
