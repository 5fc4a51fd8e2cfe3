"""Harness for the gateway's end-to-end tests: the real asya-gateway binary on a real
PostgreSQL database, real sidecars (asya-sidecar binary) with the real Python runtime, the
crew's end actors storing to the S3 server, RabbitMQ or the SQS server: everything from
tests/services. Every wait is a bounded poll on a condition.

Needs the binaries built (`cargo build --bins`; `make unit` does it) and
`source tests/services/env`.
"""

import hashlib
import hmac
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
# The binaries of the profile `make` built (ASYA_BIN_DIR), else the dev build.
TARGET = pathlib.Path(os.environ.get("ASYA_BIN_DIR") or pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "debug")
GATEWAY = TARGET / "asya-gateway"
SIDECAR = TARGET / "asya-sidecar"
RUNTIME = ROOT / "sidecar" / "runtime" / "asya_runtime.py"
HANDLERS = ROOT / "deploy" / "examples" / "handlers"
CREW = ROOT / "deploy" / "crew"
TOKEN = "test-token-" + "0123456789abcdef"
# A client token limited to a namespace no test uses (gateway/src/access/tokens.rs).
ELSEWHERE_TOKEN = "elsewhere-token-" + "0123456789abcdef"
# The key report tokens are derived from (api/src/report_token.rs, shared by the gateway and the provisioner).
REPORT_KEY = b"test-report-key-" + b"0123456789abcdef"


# These runs have no cluster: the gateway checks report tokens' signatures only
# (`--namespace-uids off`), and every namespace has this uid.
NAMESPACE_UID = "00000000-0000-4000-8000-00000000e2e0"


def report_token(namespace, uid=NAMESPACE_UID):
    """The sidecars' token for `namespace`, as `asya-gateway report-token` makes it (bound to
    the namespace's uid)."""
    msg = b"asya-report/v2\0" + namespace.encode() + b"\0" + uid.encode()
    sig = hmac.new(REPORT_KEY, msg, hashlib.sha256).hexdigest()
    return "asya-report.%s.%s.%s" % (namespace, uid, sig)


def need(var):
    v = os.environ.get(var)
    if not v:
        pytest.fail("%s is not set: run tests/services/up, then `source tests/services/env`" % var)
    return v


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(what, cond, within=60.0, every=0.05):
    deadline = time.monotonic() + within
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %.0fs waiting for %s" % (within, what))
        time.sleep(every)


def http(method, url, body=None, token=TOKEN, raw=None, headers=None):
    """(status, parsed JSON or text) of one request."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", "Bearer " + token)
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            text = r.read().decode()
            status = r.status
    except urllib.error.HTTPError as e:
        text = e.read().decode()
        status = e.code
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def unique(tag):
    return "g%s-%s" % (tag, uuid.uuid4().hex[:10])


def psql(url, sql):
    out = subprocess.run(["psql", url, "-tAc", sql], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise AssertionError("psql failed: %s" % out.stderr)
    return out.stdout.strip()


@pytest.fixture
def database():
    """A database of its own on the test PostgreSQL server; dropped afterwards."""
    base = need("ASYA_TEST_POSTGRES_URL")
    name = "gw_" + uuid.uuid4().hex[:12]
    psql(base, "CREATE DATABASE %s" % name)
    url = base.rsplit("/", 1)[0] + "/" + name
    yield url
    psql(base, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '%s'" % name)
    psql(base, "DROP DATABASE IF EXISTS %s" % name)


def transport_env(kind):
    if kind == "rabbitmq":
        return {"ASYA_TRANSPORT": "rabbitmq", "ASYA_RABBITMQ_URL": need("ASYA_TEST_RABBITMQ_URL")}
    return {
        "ASYA_TRANSPORT": "sqs",
        "ASYA_SQS_ENDPOINT": need("ASYA_TEST_SQS_ENDPOINT"),
        "ASYA_SQS_REGION": "us-east-1",
        "ASYA_SQS_WAIT_SECONDS": "1",
        "ASYA_SQS_VISIBILITY_TIMEOUT": "10s",
    }


def base_env():
    return {
        "PATH": os.environ.get("PATH", ""),
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_REGION": "us-east-1",
    }


class Gateway:
    def __init__(self, kind, tools_yaml, database_url, namespace, extra_args=(), port=None):
        for b in (GATEWAY, SIDECAR):
            if not b.exists():
                pytest.fail("%s is missing: build the binaries first (cargo build --bins)" % b)
        self.kind = kind
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="asya-gw-"))
        self.tools = self.dir / "tools.yaml"
        self.tools.write_text(tools_yaml)
        (self.dir / "tokens").write_text(TOKEN + "\n" + ELSEWHERE_TOKEN + " namespaces=elsewhere\n")
        (self.dir / "report-key").write_bytes(REPORT_KEY)
        self.database_url = database_url
        self.namespace = namespace
        self.extra_args = list(extra_args)
        self.port = port or free_port()
        self.proc = None
        self.start()

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.port

    def start(self):
        env = base_env()
        env.update({"ASYA_LOG_FORMAT": "text", "ASYA_LOG_LEVEL": "info,asya_gateway=debug"})
        if self.kind == "rabbitmq":
            env["ASYA_RABBITMQ_URL"] = need("ASYA_TEST_RABBITMQ_URL")
        else:
            env["ASYA_SQS_REGION"] = "us-east-1"
            env["ASYA_SQS_ENDPOINT"] = need("ASYA_TEST_SQS_ENDPOINT")
        args = [
            str(GATEWAY), "serve",
            "--addr", "127.0.0.1:%d" % self.port,
            "--tools", str(self.tools),
            "--auth-tokens", str(self.dir / "tokens"),
            "--report-key-file", str(self.dir / "report-key"),
            "--namespace-uids", "off",
            "--namespace", self.namespace,
            "--reload-interval", "1",
        ] + self.extra_args
        if self.database_url:
            args += ["--database-url", self.database_url]
        log = open(self.dir / "gateway.log", "ab")
        self.proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=log)
        wait_until("the gateway's /health", self._healthy, within=30)

    def _healthy(self):
        if self.proc.poll() is not None:
            raise AssertionError("gateway exited (%s):\n%s" % (self.proc.returncode, self.logs()))
        try:
            return http("GET", self.url + "/health", token=None)[0] == 200
        except OSError:
            return False

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def logs(self):
        try:
            return (self.dir / "gateway.log").read_text()
        except OSError:
            return ""

    def close(self):
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def envelope(self, id):
        status, body = http("GET", "%s/envelopes/%s" % (self.url, id))
        assert status == 200, body
        return body

    def wait_final(self, id, within=60):
        return wait_until(
            "envelope %s to reach a final status" % id,
            lambda: (lambda e: e if e["status"] in ("succeeded", "failed") else None)(self.envelope(id)),
            within=within,
        )


class Actor:
    """Sidecar + runtime as local processes, the way the injected pod runs them."""

    def __init__(self, kind, ns, name, handler, gateway_url, mode="payload", cwd=HANDLERS, env=None):
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="asya-actor-"))
        self.name = name
        self.metrics_port = free_port()
        renv = base_env()
        renv.update({"ASYA_HANDLER": handler, "ASYA_HANDLER_MODE": mode, "ASYA_SOCKET_DIR": str(self.dir)})
        renv.update(env or {})
        self.runtime = subprocess.Popen(
            ["python3", str(RUNTIME)], cwd=str(cwd), env=renv,
            stdout=subprocess.DEVNULL, stderr=open(self.dir / "runtime.log", "ab"),
        )
        senv = base_env()
        senv.update(transport_env(kind))
        senv.update({
            "ASYA_ACTOR_NAME": name,
            "ASYA_NAMESPACE": ns,
            "ASYA_SOCKET_DIR": str(self.dir),
            "ASYA_QUEUE_AUTO_CREATE": "true",
            "ASYA_METRICS_ADDR": "127.0.0.1:%d" % self.metrics_port,
            "ASYA_HANDLER_MODE": mode,
            "ASYA_LOG_FORMAT": "text",
            "ASYA_LOG_LEVEL": "info,asya_sidecar=debug",
            "ASYA_GATEWAY_URL": gateway_url,
            # Sidecars report with their namespace's report token, never a client token.
            "ASYA_GATEWAY_TOKEN": report_token(ns),
        })
        senv.update(env or {})
        self.sidecar = subprocess.Popen(
            [str(SIDECAR)], env=senv, stdout=subprocess.DEVNULL,
            stderr=open(self.dir / "sidecar.log", "ab"),
        )
        wait_until("actor %s ready" % name, self._ready, within=60)

    def _ready(self):
        if self.sidecar.poll() is not None:
            raise AssertionError("sidecar %s exited:\n%s" % (self.name, self.logs()))
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/readyz" % self.metrics_port, timeout=2) as r:
                return r.status == 200
        except (OSError, urllib.error.HTTPError):
            return False

    def metrics(self):
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.metrics_port, timeout=5) as r:
            return r.read().decode()

    def logs(self):
        out = []
        for f in ("sidecar.log", "runtime.log"):
            try:
                out.append("--- %s ---\n%s" % (f, (self.dir / f).read_text()))
            except OSError:
                pass
        return "\n".join(out)

    def close(self):
        for p in (self.sidecar, self.runtime):
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def world(request):
    """Creates gateways and actors; closes them (printing their logs on failure)."""
    made = []

    class World:
        def gateway(self, *a, **kw):
            g = Gateway(*a, **kw)
            made.append(g)
            return g

        def actor(self, *a, **kw):
            x = Actor(*a, **kw)
            made.append(x)
            return x

    yield World()
    failed = getattr(request.node, "rep_call", None)
    for m in reversed(made):
        if failed is not None and failed.failed:
            print("=== logs of %r ===\n%s" % (getattr(m, "name", "gateway"), m.logs()))
        m.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)
