import json
import os
import socket
import struct
import subprocess
import sys
import time

import pytest

RUNTIME = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "asya_runtime.py")

HANDLERS = '''
import os, time

def echo(payload):
    return payload

def double(payload):
    return {"value": payload["value"] * 2}

def split(payload):
    return [{"part": i} for i in range(payload["n"])]

def gen(payload):
    for i in range(payload["n"]):
        yield i

def nothing(payload):
    return None

def boom(payload):
    raise ValueError("bad input: %s" % payload)

class PaymentError(ValueError):
    pass

class PaymentDeclined(PaymentError):
    pass

def declined(payload):
    raise PaymentDeclined("card declined")

def sleepy(payload):
    time.sleep(payload["seconds"])
    return payload

def errorish(payload):
    return {"error": "not really", "details": {}}

def unserializable(payload):
    return {"x": object()}

def reroute(envelope):
    envelope["route"]["actors"].append("extra")
    envelope["headers"]["seen"] = True
    return envelope

class Counter:
    def __init__(self):
        self.n = 0
    def process(self, payload):
        self.n += 1
        return {"count": self.n}

class NeedsArg:
    def __init__(self, model):
        self.model = model
    def process(self, payload):
        return payload

not_callable = 42
'''

# A handler that reads state when imported and writes it per call (state proxy tests).
STATE_HANDLERS = '''
import json, os

with open("/state/ckpt/config.json") as f:
    FACTOR = json.load(f)["factor"]

def handle(payload):
    os.makedirs("/state/ckpt/runs", exist_ok=True)
    key = "runs/%d.json" % payload["run"]
    with open("/state/ckpt/" + key, "w") as f:
        json.dump({"v": payload["v"] * FACTOR}, f)
    return {"v": payload["v"] * FACTOR, "saved": key}
'''


class Client:
    def __init__(self, path):
        self.path = path

    def call(self, envelope, timeout=10):
        """One request on a connection of its own (what a sidecar does with a runtime that
        closes connections)."""
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        s.connect(self.path)
        send_frame(s, envelope)
        answer, _ = read_answer(s)
        s.close()
        return answer


def send_frame(s, obj):
    data = json.dumps(obj).encode()
    s.sendall(struct.pack(">I", len(data)) + data)


def read_answer(s):
    """One answer frame: (the JSON, whether the runtime keeps the connection: bit 31)."""

    def exactly(n):
        buf = b""
        while len(buf) < n:
            chunk = s.recv(n - len(buf))
            assert chunk, "runtime closed the connection"
            buf += chunk
        return buf

    (head,) = struct.unpack(">I", exactly(4))
    return json.loads(exactly(head & 0x7FFFFFFF)), bool(head & 0x80000000)


def envelope(payload, actors=("a", "b"), current=0):
    return {"id": "e1", "route": {"actors": list(actors), "current": current}, "headers": {}, "payload": payload}


@pytest.fixture
def handler_dir(tmp_path):
    (tmp_path / "handlers_mod.py").write_text(HANDLERS)
    (tmp_path / "state_mod.py").write_text(STATE_HANDLERS)
    return tmp_path


@pytest.fixture
def start_runtime(start_runtime_with_env):
    def start(handler, mode="payload", wait=True):
        return start_runtime_with_env(handler, {"ASYA_HANDLER_MODE": mode}, wait)

    return start


@pytest.fixture
def start_runtime_with_env(handler_dir, tmp_path):
    procs = []

    def start(handler, extra_env, wait=True):
        sock_dir = tmp_path / ("sock%d" % len(procs))
        sock_dir.mkdir()
        env = dict(os.environ, ASYA_HANDLER=handler, ASYA_SOCKET_DIR=str(sock_dir), **extra_env)
        proc = subprocess.Popen(
            [sys.executable, RUNTIME], cwd=str(handler_dir), env=env, stderr=subprocess.PIPE, text=True
        )
        procs.append(proc)
        path = str(sock_dir / "asya-runtime.sock")
        if wait:
            deadline = time.monotonic() + 10
            while not os.path.exists(path):
                assert proc.poll() is None, proc.stderr.read()
                assert time.monotonic() < deadline, "runtime did not create its socket"
                time.sleep(0.02)
        return proc, Client(path)

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
