"""The Python runtime (`asya_runtime.py`) on its Unix socket, without a sidecar: payload and
envelope modes, fan-out by list and generator, handler errors with their traceback, class
handlers, large payloads, refusals at start, SIGTERM (finishing or answering the calls in
flight), an abandoned call, connections served in order."""

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time

from conftest import RUNTIME, envelope, read_answer, send_frame


def test_payload_mode_returns_new_payload(start_runtime):
    _, client = start_runtime("handlers_mod.double")
    assert client.call(envelope({"value": 21})) == {"value": 42}


def test_connection_per_envelope_many_calls(start_runtime):
    _, client = start_runtime("handlers_mod.echo")
    for i in range(50):
        assert client.call(envelope({"i": i})) == {"i": i}


def test_list_fan_out(start_runtime):
    _, client = start_runtime("handlers_mod.split")
    assert client.call(envelope({"n": 3})) == [{"part": 0}, {"part": 1}, {"part": 2}]


def test_generator_fan_out(start_runtime):
    _, client = start_runtime("handlers_mod.gen")
    assert client.call(envelope({"n": 4})) == [0, 1, 2, 3]


def test_none_result(start_runtime):
    _, client = start_runtime("handlers_mod.nothing")
    assert client.call(envelope({})) is None


def test_exception_becomes_error_object_with_traceback(start_runtime):
    _, client = start_runtime("handlers_mod.boom")
    answer = client.call(envelope({"k": 1}))
    assert answer["error"] == "handler_error"
    assert answer["details"]["type"] == "ValueError"
    assert "bad input" in answer["details"]["message"]
    assert "Traceback" in answer["details"]["traceback"]
    assert "boom" in answer["details"]["traceback"]


def test_error_carries_its_class_hierarchy_for_flows(start_runtime):
    # A flow's `except PaymentError` / `except ValueError` matches by these names.
    _, client = start_runtime("handlers_mod.declined")
    answer = client.call(envelope({}))
    assert answer["details"]["type"] == "PaymentDeclined"
    assert answer["details"]["mro"] == [
        "PaymentDeclined", "PaymentError", "ValueError", "Exception", "BaseException"]


def test_result_shaped_like_error_is_wrapped(start_runtime):
    _, client = start_runtime("handlers_mod.errorish")
    assert client.call(envelope({})) == [{"error": "not really", "details": {}}]


def test_unserializable_result_is_error(start_runtime):
    _, client = start_runtime("handlers_mod.unserializable")
    answer = client.call(envelope({}))
    assert answer["error"] == "bad_result"
    assert answer["details"]["type"] == "TypeError"


def test_class_handler_instantiated_once(start_runtime):
    _, client = start_runtime("handlers_mod.Counter.process")
    assert client.call(envelope({})) == {"count": 1}
    assert client.call(envelope({})) == {"count": 2}


def test_envelope_mode_passes_whole_envelope(start_runtime):
    _, client = start_runtime("handlers_mod.reroute", mode="envelope")
    out = client.call(envelope({"x": 1}))
    assert out["route"]["actors"] == ["a", "b", "extra"]
    assert out["headers"] == {"seen": True}
    assert out["payload"] == {"x": 1}


def test_large_payload(start_runtime):
    _, client = start_runtime("handlers_mod.echo")
    big = "x" * (5 * 1024 * 1024)
    assert client.call(envelope({"blob": big}), timeout=30) == {"blob": big}


def _refused(start_runtime, handler, mode="payload"):
    proc, _ = start_runtime(handler, mode=mode, wait=False)
    assert proc.wait(timeout=10) == 2
    return proc.stderr.read()


def test_bad_handler_refused_at_start(start_runtime):
    assert "no importable module" in _refused(start_runtime, "nosuchmodule.fn")
    assert "has no attribute 'missing'" in _refused(start_runtime, "handlers_mod.missing")
    assert "not a handler path" in _refused(start_runtime, "justone")
    assert "not callable" in _refused(start_runtime, "handlers_mod.not_callable")
    assert "ASYA_HANDLER is not set" in _refused(start_runtime, "")
    assert "ASYA_HANDLER_MODE" in _refused(start_runtime, "handlers_mod.echo", mode="bogus")


def test_class_needing_arguments_refused_clearly(start_runtime):
    err = _refused(start_runtime, "handlers_mod.NeedsArg.process")
    assert "requires model" in err


def test_sigterm_exits_cleanly(start_runtime):
    proc, client = start_runtime("handlers_mod.echo")
    assert client.call(envelope(1)) == 1
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0


def test_sigterm_during_handler_finishes_it(start_runtime):
    import socket as s_
    import struct
    import json
    import time

    proc, client = start_runtime("handlers_mod.sleepy")
    conn = s_.socket(s_.AF_UNIX, s_.SOCK_STREAM)
    conn.connect(client.path)
    data = json.dumps(envelope({"seconds": 0.5})).encode()
    conn.sendall(struct.pack(">I", len(data)) + data)
    time.sleep(0.1)  # let the handler start; the assertion below does not depend on timing
    proc.send_signal(signal.SIGTERM)
    conn.settimeout(10)
    head = conn.recv(4)
    assert len(head) == 4
    assert proc.wait(timeout=10) == 0


def test_sigterm_leaves_a_stopping_mark_that_the_next_runtime_removes(start_runtime, handler_dir):
    import time

    proc, client = start_runtime("handlers_mod.sleepy")
    mark = os.path.join(os.path.dirname(client.path), "asya-runtime.stopping")
    assert not os.path.exists(mark)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(client.path)
    data = json.dumps(envelope({"seconds": 30})).encode()
    conn.sendall(struct.pack(">I", len(data)) + data)
    proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while not os.path.exists(mark):
        assert time.monotonic() < deadline, "no stopping mark after SIGTERM"
        time.sleep(0.02)
    # The kubelet's grace period ends: killed mid-handler, the mark stays for the sidecar.
    proc.kill()
    proc.wait(timeout=10)
    assert os.path.exists(mark)
    # The restarted runtime (same socket directory) removes it before it serves.
    env = dict(os.environ, ASYA_HANDLER="handlers_mod.echo", ASYA_HANDLER_MODE="payload",
               ASYA_SOCKET_DIR=os.path.dirname(client.path))
    again = subprocess.Popen([sys.executable, RUNTIME], cwd=str(handler_dir), env=env, stderr=subprocess.PIPE, text=True)
    try:
        # The killed runtime's socket file is still there: wait for an answer, not the file.
        deadline = time.monotonic() + 10
        while True:
            assert again.poll() is None, again.stderr.read()
            try:
                assert client.call(envelope(7), timeout=2) == 7
                break
            except (ConnectionRefusedError, FileNotFoundError):
                assert time.monotonic() < deadline, "the restarted runtime never answered"
                time.sleep(0.02)
        assert not os.path.exists(mark)
    finally:
        again.kill()
        again.wait()


def test_abandoned_call_exits_for_restart(start_runtime):
    import socket as s_
    import struct
    import json

    proc, client = start_runtime("handlers_mod.sleepy")
    conn = s_.socket(s_.AF_UNIX, s_.SOCK_STREAM)
    conn.connect(client.path)
    data = json.dumps(envelope({"seconds": 30})).encode()
    conn.sendall(struct.pack(">I", len(data)) + data)
    conn.close()
    assert proc.wait(timeout=10) == 3
    try:
        proc.wait(timeout=0)
    except subprocess.TimeoutExpired:
        raise AssertionError("still running")


def _send(path, env):
    import socket as s_
    import struct
    import json

    conn = s_.socket(s_.AF_UNIX, s_.SOCK_STREAM)
    conn.connect(path)
    data = json.dumps(env).encode()
    conn.sendall(struct.pack(">I", len(data)) + data)
    conn.settimeout(10)
    return conn


def _answer(conn):
    """The answer on a connection of its own; closing it lets the runtime take the next."""
    answer, keep = read_answer(conn)
    conn.close()
    assert keep, "the runtime did not offer to keep the connection"
    return answer


def test_queued_connections_are_served_in_order(start_runtime):
    # The sidecar pipelines: several connections wait in the backlog while one is served.
    proc, client = start_runtime("handlers_mod.Counter.process")
    conns = [_send(client.path, envelope(i)) for i in range(20)]
    assert [_answer(c) for c in conns] == [{"count": i + 1} for i in range(20)]


def test_sigterm_answers_calls_already_queued(start_runtime):
    proc, client = start_runtime("handlers_mod.sleepy")
    first = _send(client.path, envelope({"seconds": 0.5}))
    queued = [_send(client.path, envelope({"seconds": 0, "n": i})) for i in range(3)]
    # Whether SIGTERM lands while the first handler runs or while the runtime waits in accept,
    # every call already queued is answered before it exits.
    proc.send_signal(signal.SIGTERM)
    assert _answer(first) == {"seconds": 0.5}
    assert [_answer(c) for c in queued] == [{"seconds": 0, "n": i} for i in range(3)]
    assert proc.wait(timeout=10) == 0



def test_one_connection_carries_pipelined_requests_in_order(start_runtime):
    # The sidecar writes several requests before the first answer; they are answered in
    # order on the same connection, which stays open.
    proc, client = start_runtime("handlers_mod.Counter.process")
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(10)
    conn.connect(client.path)
    for i in range(10):
        send_frame(conn, envelope(i))
    assert [read_answer(conn) for _ in range(10)] == [({"count": i + 1}, True) for i in range(10)]
    send_frame(conn, envelope("again"))
    assert read_answer(conn) == ({"count": 11}, True)
    conn.close()
    # The next connection is served once the sidecar closed the first one.
    assert client.call(envelope("x")) == {"count": 12}


def test_probes_while_a_connection_is_held_neither_fill_the_backlog_nor_leak(start_runtime):
    # The sidecar's readiness probe connects and hangs up every 5 s while its persistent
    # connection stays open; more probes than the listen backlog (128) must still connect,
    # and the runtime must not keep them.
    proc, client = start_runtime("handlers_mod.echo")
    held = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    held.settimeout(10)
    held.connect(client.path)
    send_frame(held, envelope(1))
    assert read_answer(held) == (1, True)
    fds = lambda: len(os.listdir("/proc/%d/fd" % proc.pid))  # noqa: E731
    fds_before = fds()
    # 15 bursts of 20: 300 in all, more than the backlog (128) holds if they stayed there.
    for i in range(15):
        for _ in range(20):
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            probe.settimeout(5)
            probe.connect(client.path)
            probe.close()
        # Before it serves a request the runtime takes what waits in its backlog, and drops
        # the probes that hung up.
        send_frame(held, envelope(i))
        assert read_answer(held) == (i, True)
        assert fds() <= fds_before, "probe connections kept: %d fds, %d before" % (fds(), fds_before)


def test_abandoned_call_with_requests_queued_behind_it_exits(start_runtime):
    # Requests written behind the running one are unread data on the connection: the
    # hang-up must still be seen.
    proc, client = start_runtime("handlers_mod.sleepy")
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(client.path)
    send_frame(conn, envelope({"seconds": 30}))
    send_frame(conn, envelope({"seconds": 0}))
    conn.close()
    assert proc.wait(timeout=10) == 3


def test_sigterm_answers_requests_pipelined_on_the_connection(start_runtime):
    proc, client = start_runtime("handlers_mod.sleepy")
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(10)
    conn.connect(client.path)
    send_frame(conn, envelope({"seconds": 0.5}))
    for i in range(3):
        send_frame(conn, envelope({"seconds": 0, "n": i}))
    proc.send_signal(signal.SIGTERM)
    assert read_answer(conn)[0] == {"seconds": 0.5}
    assert [read_answer(conn)[0] for _ in range(3)] == [{"seconds": 0, "n": i} for i in range(3)]
    assert proc.wait(timeout=10) == 0
