#!/usr/bin/env python3
"""Asya runtime: serves the user's handler on a Unix socket for the asya-sidecar.

Standard library only, Python 3.8+. The sidecar connects once per envelope and sends one
frame (4-byte big-endian length, then JSON); the runtime answers with one frame:

* the handler's result: a payload (payload mode) or an envelope (envelope mode);
* a list: fan-out, one outgoing envelope per item (a generator is collected into a list);
* null or []: nothing to pass on;
* an error object {"error": code, "details": {"message", "type", "traceback"}}.

A result that would itself look like an error object is wrapped in a one-item list, which
means the same thing (fan-out of one) and cannot be mistaken for an error.

Environment: ASYA_HANDLER (module.function or module.Class.method), ASYA_HANDLER_MODE
(payload | envelope), ASYA_SOCKET_DIR (default /var/run/asya).

If the sidecar closes the connection while the handler still runs (its timeout fired), the
runtime exits with status 3 so that its supervisor (the kubelet) starts a fresh one: a
handler thread stuck in user code cannot be cancelled from Python.

On SIGTERM the runtime leaves a file, asya-runtime.stopping, beside its socket (a fresh
runtime removes it). A call cut short after that (the kubelet's grace period ended, or a
forced pod deletion) was stopped by the platform, not by its envelope: the sidecar returns
the message to the queue instead of charging it with a crash.
"""

import importlib
import inspect
import json
import logging
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
import traceback

SOCKET_NAME = "asya-runtime.sock"
STOPPING_NAME = "asya-runtime.stopping"
MAX_FRAME = 256 * 1024 * 1024
EXIT_ABANDONED = 3
EXIT_BAD_CONFIG = 2

log = logging.getLogger("asya.runtime")


class ConfigError(Exception):
    """A setting that makes the runtime unable to start."""


def load_handler(spec):
    """Resolve 'pkg.module.function' or 'pkg.module.Class.method' to a callable.

    Tries the longest importable module prefix first, then walks attributes. A class on the
    way is instantiated once, with no arguments.
    """
    if not spec or not isinstance(spec, str):
        raise ConfigError("ASYA_HANDLER is not set: expected module.function or module.Class.method")
    parts = spec.split(".")
    if len(parts) < 2 or not all(p.isidentifier() for p in parts):
        raise ConfigError(
            "ASYA_HANDLER=%r is not a handler path: expected module.function or module.Class.method" % spec
        )
    if os.getcwd() not in sys.path:
        # Handlers live in the user's working directory; python puts only this file's dir on the path.
        sys.path.insert(0, os.getcwd())
    module = None
    import_error = None
    split_at = 0
    for i in range(len(parts) - 1, 0, -1):
        name = ".".join(parts[:i])
        try:
            module = importlib.import_module(name)
            split_at = i
            break
        except ModuleNotFoundError as e:
            # Only "this very module is missing" means: try a shorter prefix.
            if e.name is not None and not (name == e.name or name.startswith(e.name + ".")):
                raise ConfigError("ASYA_HANDLER=%r: importing %s failed: %s" % (spec, name, e))
            import_error = e
        except Exception as e:  # noqa: BLE001 - any import-time failure is a config error
            raise ConfigError(
                "ASYA_HANDLER=%r: importing %s failed: %s: %s\n%s"
                % (spec, name, type(e).__name__, e, traceback.format_exc())
            )
    if module is None:
        raise ConfigError("ASYA_HANDLER=%r: no importable module (%s)" % (spec, import_error))

    obj = module
    path = parts[:split_at]
    rest = parts[split_at:]
    for idx, attr in enumerate(rest):
        try:
            obj = getattr(obj, attr)
        except AttributeError:
            raise ConfigError("ASYA_HANDLER=%r: %s has no attribute %r" % (spec, ".".join(path), attr))
        path.append(attr)
        if inspect.isclass(obj) and idx < len(rest) - 1:
            obj = instantiate(spec, obj)
    if inspect.isclass(obj):
        raise ConfigError(
            "ASYA_HANDLER=%r names a class; name its method too (module.Class.method)" % spec
        )
    if not callable(obj):
        raise ConfigError("ASYA_HANDLER=%r is not callable (%s)" % (spec, type(obj).__name__))
    return obj


def instantiate(spec, cls):
    try:
        sig = inspect.signature(cls)
        required = [
            p.name
            for p in sig.parameters.values()
            if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        ]
    except (TypeError, ValueError):
        required = []
    if required:
        raise ConfigError(
            "ASYA_HANDLER=%r: class %s is instantiated with no arguments, but its __init__ requires %s; "
            "give them defaults" % (spec, cls.__name__, ", ".join(required))
        )
    try:
        return cls()
    except Exception as e:  # noqa: BLE001
        raise ConfigError(
            "ASYA_HANDLER=%r: %s() raised %s: %s\n%s"
            % (spec, cls.__name__, type(e).__name__, e, traceback.format_exc())
        )


def recv_exact(conn, n, chunks=None):
    chunks = [] if chunks is None else chunks
    while n > 0:
        chunk = conn.recv(min(n, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(conn):
    # One recv usually holds the whole (small) request: header and body in one system call.
    first = conn.recv(65536)
    if not first:
        return None
    if len(first) < 4:
        rest = recv_exact(conn, 4 - len(first))
        if rest is None:
            return None
        first += rest
    (length,) = struct.unpack(">I", first[:4])
    if length > MAX_FRAME:
        raise ValueError("frame of %d bytes exceeds the %d byte limit" % (length, MAX_FRAME))
    have = len(first) - 4
    if have >= length:
        return first[4 : 4 + length]
    return recv_exact(conn, length - have, [first[4:]])


_encode = json.JSONEncoder(separators=(",", ":")).encode


def write_frame(conn, obj):
    data = _encode(obj).encode("utf-8")
    conn.sendall(struct.pack(">I", len(data)) + data)


def error_object(code, exc, tb=None):
    return {
        "error": code,
        "details": {
            "message": str(exc),
            "type": type(exc).__name__,
            "traceback": tb if tb is not None else traceback.format_exc(),
        },
    }


def looks_like_error(value):
    return isinstance(value, dict) and "error" in value and "details" in value


def call_handler(handler, mode, request):
    """Run the handler on one decoded request; returns the JSON-able answer."""
    if mode == "envelope":
        arg = request
    else:
        if not isinstance(request, dict) or "payload" not in request:
            return error_object("bad_request", ValueError("request has no payload"), "")
        arg = request["payload"]
    try:
        result = handler(arg)
        if inspect.isgenerator(result) or isinstance(result, tuple):
            result = list(result)
    except Exception as e:  # noqa: BLE001 - the handler's failure is reported, not fatal
        return error_object("handler_error", e)
    if looks_like_error(result):
        result = [result]
    return result


class Abandonment:
    """Exits the process when the sidecar hangs up while a handler is still running.

    A thread looks every POLL seconds whether the running call's connection was closed by
    the sidecar (every IDLE_POLL seconds while no call runs). The per-call cost is one
    attribute store each way: no lock and no wake-up of the thread per call (that used to
    double the runtime's CPU per envelope). POLL is short so that a dead call is noticed
    before a restarted sidecar can queue a new one on this runtime.
    """

    POLL = 0.01
    IDLE_POLL = 0.1

    def __init__(self):
        self._current = None  # the running call's connection; replaced atomically
        t = threading.Thread(target=self._run, name="asya-watch", daemon=True)
        t.start()

    def watch(self, conn):
        self._current = conn

    def done(self):
        self._current = None

    def _run(self):
        while True:
            time.sleep(self.POLL if self._current is not None else self.IDLE_POLL)
            conn = self._current
            if conn is None:
                continue
            try:
                readable, _, _ = select.select([conn], [], [], 0)
                if not readable:
                    continue
                peeked = conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except (OSError, ValueError):
                continue
            if peeked == b"" and self._current is conn:
                log.error("sidecar closed the connection while the handler ran (timeout); exiting for a restart")
                sys.stderr.flush()
                os._exit(EXIT_ABANDONED)


class Runtime:
    def __init__(self, handler, mode, socket_path):
        self.handler = handler
        self.mode = mode
        self.socket_path = socket_path
        self.stopping_path = os.path.join(os.path.dirname(socket_path), STOPPING_NAME)
        self.stopping = False
        self.server = None
        self.watcher = Abandonment()

    def bind(self):
        # Bound and listening under a temporary name, then renamed: the socket path never
        # exists without a listener behind it (a connect there would be refused).
        tmp = "%s.%d.tmp" % (self.socket_path, os.getpid())
        # A predecessor's stopping mark goes before the socket exists: calls to this runtime
        # are judged on their own.
        for stale in (tmp, self.socket_path, self.stopping_path):
            try:
                os.unlink(stale)
            except FileNotFoundError:
                pass
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(tmp)
        # The sidecar may run as another user in its own container.
        os.chmod(tmp, 0o666)
        # The sidecar keeps several calls queued here (its pipeline); they are served in order.
        server.listen(128)
        os.rename(tmp, self.socket_path)
        self.server = server

    def on_sigterm(self, signum, frame):
        # A flag (the wake-up fd ends a wait in serve(); a running handler finishes) and the
        # mark the sidecar reads if this process is killed before it answers. It runs
        # between two Python bytecodes of the main thread: a handler inside one long C call
        # that holds the GIL delays it.
        self.stopping = True
        try:
            os.close(os.open(self.stopping_path, os.O_WRONLY | os.O_CREAT, 0o644))
        except OSError as e:
            log.warning("could not leave the stopping mark %s: %s", self.stopping_path, e)

    def serve_one(self, conn):
        try:
            body = read_frame(conn)
            if body is None:
                return
            try:
                request = json.loads(body)
            except ValueError as e:
                write_frame(conn, error_object("bad_request", e, ""))
                return
            self.watcher.watch(conn)
            try:
                answer = call_handler(self.handler, self.mode, request)
            finally:
                self.watcher.done()
            try:
                write_frame(conn, answer)
            except (TypeError, ValueError) as e:
                write_frame(conn, error_object("bad_result", e))
        except (BrokenPipeError, ConnectionResetError):
            log.warning("sidecar went away before the answer was sent")
        finally:
            conn.close()

    def serve(self):
        """Serves queued connections one at a time, in arrival order. After SIGTERM it still
        answers every call already queued (the sidecar pipelines several), then returns."""
        log.info("serving %s (mode=%s) on %s", os.environ.get("ASYA_HANDLER"), self.mode, self.socket_path)
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        self.server.setblocking(False)
        while True:
            try:
                conn, _ = self.server.accept()
            except BlockingIOError:
                if self.stopping:
                    break
                select.select([self.server, wake_r], [], [])
                try:
                    os.read(wake_r, 512)
                except BlockingIOError:
                    pass
                continue
            except InterruptedError:
                continue
            conn.setblocking(True)
            self.serve_one(conn)

    def close(self):
        if self.server is not None:
            self.server.close()
        try:
            os.unlink(self.socket_path)
        except OSError:
            pass


def main():
    logging.basicConfig(
        level=os.environ.get("ASYA_LOG_LEVEL", "INFO").upper(),
        format="%(asctime)s %(levelname)s asya-runtime %(message)s",
        stream=sys.stderr,
    )
    mode = os.environ.get("ASYA_HANDLER_MODE", "payload").strip() or "payload"
    try:
        if mode not in ("payload", "envelope"):
            raise ConfigError("ASYA_HANDLER_MODE=%r: expected payload or envelope" % mode)
        handler = load_handler(os.environ.get("ASYA_HANDLER", "").strip())
    except ConfigError as e:
        sys.stderr.write("asya-runtime: %s\n" % e)
        return EXIT_BAD_CONFIG
    socket_dir = os.environ.get("ASYA_SOCKET_DIR", "/var/run/asya")
    if not os.path.isdir(socket_dir):
        sys.stderr.write("asya-runtime: ASYA_SOCKET_DIR=%r is not a directory\n" % socket_dir)
        return EXIT_BAD_CONFIG
    runtime = Runtime(handler, mode, os.path.join(socket_dir, SOCKET_NAME))
    # The handler is in place before the socket exists: a SIGTERM right after start is clean.
    signal.signal(signal.SIGTERM, runtime.on_sigterm)
    runtime.bind()
    try:
        runtime.serve()
    except (SystemExit, KeyboardInterrupt):
        pass
    finally:
        runtime.close()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
