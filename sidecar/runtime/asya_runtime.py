#!/usr/bin/env python3
"""Asya runtime: serves the user's handler on a Unix socket for the asya-sidecar.

Standard library only, Python 3.8+. The sidecar sends each envelope as one frame (4-byte
big-endian length, then JSON) and the runtime answers each with one frame, in order, on the
same connection. Connections are persistent: bit 31 of every answer's length is set, which
tells the sidecar the connection stays open for its next request (it may write several
before the first answer: they are served one at a time, in order). The runtime serves one
connection at a time, the others in the order they connected, each until the sidecar
closes it. An answer is:

* the handler's result: a payload (payload mode) or an envelope (envelope mode);
* a list: fan-out, one outgoing envelope per item (a generator is collected into a list);
* null or []: nothing to pass on;
* an error object {"error": code, "details": {"message", "type", "traceback", "mro"}}.

A result that would itself look like an error object is wrapped in a one-item list, which
means the same thing (fan-out of one) and cannot be mistaken for an error.

Environment: ASYA_HANDLER (module.function or module.Class.method), ASYA_HANDLER_MODE
(payload | envelope), ASYA_SOCKET_DIR (default /var/run/asya). State proxies (docs/DESIGN.md
§10): ASYA_STATE_PROXY_MOUNTS ({name}:{path}:write={mode} joined by ;),
ASYA_STATE_PROXY_TIMEOUT (seconds per socket operation, 30), ASYA_STATE_PROXY_STARTUP_TIMEOUT
(seconds to wait for the connectors at start, 60), ASYA_STATE_SOCKET_DIR (/var/run/asya/state).

If the sidecar closes the connection while its handler still runs (its timeout fired), the
runtime exits with status 3 so that its supervisor (the kubelet) starts a fresh one: a
handler thread stuck in user code cannot be cancelled from Python.

On SIGTERM the runtime leaves a file, asya-runtime.stopping, beside its socket (a fresh
runtime removes it). A call cut short after that (the kubelet's grace period ended, or a
forced pod deletion) was stopped by the platform, not by its envelope: the sidecar returns
the message to the queue instead of charging it with a crash.
"""

import builtins
import collections
import errno
import importlib
import inspect
import io
import json
import logging
import os
import select
import signal
import socket
import stat
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


KEEP_ALIVE = 1 << 31


class Connection:
    """One sidecar connection: its requests are read in order; several may come in one read."""

    __slots__ = ("sock", "buf")

    def __init__(self, sock):
        self.sock = sock
        self.buf = bytearray()

    def frame(self):
        """The next whole frame already read, or None."""
        if len(self.buf) < 4:
            return None
        (length,) = struct.unpack_from(">I", self.buf)
        if length > MAX_FRAME:
            raise ValueError("frame of %d bytes exceeds the %d byte limit" % (length, MAX_FRAME))
        end = 4 + length
        if len(self.buf) < end:
            return None
        body = bytes(self.buf[4:end])
        del self.buf[:end]
        return body

    def fill(self):
        """Reads what is there, waiting for something; False when the sidecar hung up."""
        want = 65536
        if len(self.buf) >= 4:
            (length,) = struct.unpack_from(">I", self.buf)
            want = max(want, min(4 + length - len(self.buf), 1 << 20))
        chunk = self.sock.recv(want)
        if not chunk:
            return False
        self.buf += chunk
        return True

    def read_frame(self):
        """The next request, waiting for it; None when the sidecar closed the connection."""
        while True:
            body = self.frame()
            if body is not None:
                return body
            if not self.fill():
                return None

    def close(self):
        self.sock.close()


def hung_up(sock):
    """The peer closed its end (data it sent and we did not read yet does not hide that)."""
    p = select.poll()
    p.register(sock, select.POLLHUP)
    return any(ev & (select.POLLHUP | select.POLLERR | select.POLLNVAL) for _, ev in p.poll(0))


def sent_nothing(sock):
    """Nothing unread from the peer (call only when it hung up: then this never waits)."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return True


def readable_now(sock):
    p = select.poll()
    p.register(sock, select.POLLIN)
    return bool(p.poll(0))


_encode = json.JSONEncoder(separators=(",", ":")).encode


def write_frame(conn, obj):
    data = _encode(obj).encode("utf-8")
    # The bit says the connection stays open for the sidecar's next request.
    conn.sendall(struct.pack(">I", len(data) | KEEP_ALIVE) + data)


def error_object(code, exc, tb=None):
    return {
        "error": code,
        "details": {
            "message": str(exc),
            "type": type(exc).__name__,
            "traceback": tb if tb is not None else traceback.format_exc(),
            # A flow's `except` matches by class and bases, as Python does (docs/flows.md).
            "mro": [c.__name__ for c in type(exc).__mro__ if c is not object],
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
    the sidecar (POLLHUP: requests queued behind the running one do not hide it) (every IDLE_POLL seconds while no call runs). The per-call cost is one
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
                gone = hung_up(conn)
            except (OSError, ValueError):
                continue
            if gone and self._current is conn:
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

    def serve_request(self, conn, body):
        """Answers one request; False when the connection is unusable after it."""
        try:
            try:
                request = json.loads(body)
            except ValueError as e:
                write_frame(conn.sock, error_object("bad_request", e, ""))
                return True
            self.watcher.watch(conn.sock)
            try:
                answer = call_handler(self.handler, self.mode, request)
            finally:
                self.watcher.done()
            try:
                write_frame(conn.sock, answer)
            except (TypeError, ValueError) as e:
                write_frame(conn.sock, error_object("bad_result", e))
            return True
        except (BrokenPipeError, ConnectionResetError):
            log.warning("sidecar went away before the answer was sent")
            return False

    def accept_waiting(self, queue, serving):
        """Takes every connection waiting to be accepted (so probes never fill the backlog)
        and, while one is being served, drops the queued ones that hung up unused."""
        took = False
        while True:
            try:
                sock, _ = self.server.accept()
            except (BlockingIOError, InterruptedError):
                break
            sock.setblocking(True)
            queue.append(Connection(sock))
            took = True
        if took and serving:
            for c in [c for c in queue if hung_up(c.sock) and sent_nothing(c.sock)]:
                queue.remove(c)
                c.close()

    def wait(self, socks, wake_r):
        """Waits for one of `socks` or a signal; returns the ready ones."""
        p = select.poll()
        for s in socks:
            p.register(s, select.POLLIN)
        p.register(wake_r, select.POLLIN)
        try:
            ready = {fd for fd, _ in p.poll()}
        except InterruptedError:
            return []
        if wake_r in ready:
            try:
                os.read(wake_r, 512)
            except BlockingIOError:
                pass
        return [s for s in socks if s.fileno() in ready]

    def serve(self):
        """Serves one connection at a time, its requests in order, until the sidecar closes
        it; then the next connection in arrival order. After SIGTERM it still answers every
        request already sent (the sidecar pipelines several), then returns."""
        log.info("serving %s (mode=%s) on %s", os.environ.get("ASYA_HANDLER"), self.mode, self.socket_path)
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        self.server.setblocking(False)
        queue = collections.deque()
        conn = None
        while True:
            self.accept_waiting(queue, conn is not None)
            if conn is None:
                if queue:
                    conn = queue.popleft()
                elif self.stopping:
                    break
                else:
                    self.wait([self.server], wake_r)
                    continue
            try:
                body = conn.frame()
            except ValueError as e:
                log.error("closing the connection: %s", e)
                conn.close()
                conn = None
                continue
            if body is not None:
                if not self.serve_request(conn, body):
                    conn.close()
                    conn = None
                continue
            # No whole request yet: wait for the next one on this connection (or a new
            # connection to take into the queue, or SIGTERM). Once stopping, only what was
            # already sent is answered.
            if self.stopping:
                if not readable_now(conn.sock):
                    conn.close()
                    conn = None
                    continue
            elif conn.sock not in self.wait([self.server, conn.sock], wake_r):
                continue
            try:
                more = conn.fill()
            except (ConnectionResetError, OSError):
                more = False
            if not more:
                conn.close()
                conn = None

    def close(self):
        if self.server is not None:
            self.server.close()
        try:
            os.unlink(self.socket_path)
        except OSError:
            pass


# ---------------------------------------------------------------------------------------------
# State proxies (docs/DESIGN.md §10). With ASYA_STATE_PROXY_MOUNTS set, file calls on paths
# under a mount go, before the handler is imported, to that mount's connector: HTTP/1.1 on
# the Unix socket {ASYA_STATE_SOCKET_DIR}/{name}.sock (the original Asya's contract). Paths
# outside every mount reach the real functions unchanged.
# ---------------------------------------------------------------------------------------------

STATE_SOCKET_DIR = "/var/run/asya/state"
STATE_WRITE_MODES = ("buffered", "passthrough")
XATTR_PREFIX = "user.asya."
# Buffered reads and writes stay in memory up to this size, then spool to a temp file.
SPOOL_MAX = 8 * 1024 * 1024
CHUNK = 1024 * 1024


class StateMount(object):
    __slots__ = ("name", "path", "mode", "socket")

    def __init__(self, name, path, mode, socket_path):
        self.name, self.path, self.mode, self.socket = name, path, mode, socket_path


def parse_state_mounts(text, socket_dir=STATE_SOCKET_DIR):
    """`{name}:{path}:write={mode}` entries joined by `;`, longest path first (the most
    specific mount wins where the original took the first in list order)."""
    mounts = []
    for entry in text.split(";"):
        entry = entry.strip()
        if not entry:
            continue
        parts = entry.split(":", 2)
        if len(parts) != 3:
            raise ConfigError("ASYA_STATE_PROXY_MOUNTS entry %r: expected name:path:write=MODE" % entry)
        name, path, opts = parts
        options = dict(o.strip().split("=", 1) for o in opts.split(",") if "=" in o)
        mode = options.get("write", "buffered")
        if mode not in STATE_WRITE_MODES:
            raise ConfigError("ASYA_STATE_PROXY_MOUNTS entry %r: write=%s, expected buffered or passthrough" % (entry, mode))
        if not name or path == "/" or not path.startswith("/") or os.path.normpath(path) != path:
            raise ConfigError("ASYA_STATE_PROXY_MOUNTS entry %r: a name and a normalised absolute path other than /" % entry)
        mounts.append(StateMount(name, path, mode, os.path.join(socket_dir, name + ".sock")))
    mounts.sort(key=lambda m: len(m.path), reverse=True)
    return mounts


def resolve_state_path(path, mounts):
    """(mount, key) for a path under a mount, else (None, None). Relative paths are taken
    from the working directory; `..` is resolved first, so a key never leaves its mount."""
    if isinstance(path, int):
        return None, None
    try:
        p = os.fsdecode(os.fspath(path))
    except TypeError:
        return None, None
    p = os.path.normpath(p if p.startswith("/") else os.path.join(os.getcwd(), p))
    for m in mounts:
        if p == m.path:
            return m, ""
        if p.startswith(m.path) and p[len(m.path)] == "/":
            return m, p[len(m.path) + 1 :]
    return None, None


def quote_key(key):
    return "/".join(urllib.parse.quote(seg, safe="") for seg in key.split("/"))


def _import_state_modules():
    """The modules only state proxies use, imported once a mount is configured: http.client
    alone would add some 15 ms to the start of every runtime."""
    global email, http, shutil, tempfile, urllib
    import email.utils
    import http.client
    import shutil
    import tempfile
    import urllib.parse


def _unix_connection(mount, timeout):
    """An HTTPConnection already connected to the mount's socket (it sends on that one)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(mount.socket)
    except socket.timeout:
        s.close()
        raise TimeoutError("state proxy %r: no answer on %s within %ss" % (mount.name, mount.socket, timeout))
    except OSError as e:
        s.close()
        # A missing socket is the connector's absence, not a missing state file.
        raise ConnectionError("state proxy %r does not answer on %s: %s" % (mount.name, mount.socket, e))
    conn = http.client.HTTPConnection("localhost", timeout=timeout)
    conn.sock = s
    return conn


def _hung_up(conn, mount, key, op, err):
    """Raises for a connector that hung up while a request was being sent: it refused before
    reading the whole body (a buffered file over its limit: 413), and its answer, when there
    is one to read, is the error; otherwise the hang-up itself is."""
    try:
        _raise_for_status(conn.getresponse(), mount, key, op)
    except (http.client.HTTPException, BrokenPipeError, ConnectionResetError, socket.timeout):
        pass
    raise ConnectionError("state proxy %r: %s %r: the connector hung up: %s" % (mount.name, op, key, err))


def _raise_for_status(resp, mount, key, op):
    if resp.status < 400:
        return
    body = resp.read(65536)
    try:
        msg = json.loads(body).get("message") or body.decode("utf-8", "replace")
    except (ValueError, AttributeError):
        msg = body.decode("utf-8", "replace")[:300]
    text = "state proxy %r: %s %r: HTTP %d: %s" % (mount.name, op, key, resp.status, msg)
    path = mount.path + ("/" + key if key else "")
    st = resp.status
    if st == 404:
        raise FileNotFoundError(errno.ENOENT, text, path)
    if st in (409, 412):
        raise FileExistsError(errno.EEXIST, text, path)
    if st == 400:
        raise ValueError(text)
    if st == 403:
        raise PermissionError(errno.EACCES, text, path)
    if st == 413:
        raise OSError(errno.EFBIG, text, path)
    if st == 503:
        raise ConnectionError(text)
    if st == 504:
        raise TimeoutError(text)
    raise OSError(errno.EIO, text, path)


class StateClient(object):
    """One request per connection (the connector may be restarted between calls)."""

    def __init__(self, timeout):
        _import_state_modules()
        self.timeout = timeout

    def connection(self, mount):
        return _unix_connection(mount, self.timeout)

    def request(self, mount, method, target, key, op, body=None, headers=None):
        """The response of a completed request (the caller reads and closes it), errors raised."""
        conn = self.connection(mount)
        try:
            try:
                conn.request(method, target, body=body, headers=headers or {})
            except socket.timeout:
                raise TimeoutError("state proxy %r: %s %r: no progress within %ss" % (mount.name, op, key, self.timeout))
            except (BrokenPipeError, ConnectionResetError) as e:
                _hung_up(conn, mount, key, op, e)
            return conn, self.response(conn, mount, key, op)
        except BaseException:
            conn.close()
            raise

    def response(self, conn, mount, key, op):
        """The answer on `conn`, its error status raised. (socket.timeout is TimeoutError
        since Python 3.10: the status check stays outside the handler of the wait.)"""
        try:
            resp = conn.getresponse()
        except socket.timeout:
            conn.close()
            raise TimeoutError("state proxy %r: %s %r: no answer within %ss" % (mount.name, op, key, self.timeout))
        except http.client.HTTPException as e:
            conn.close()
            raise ConnectionError("state proxy %r: %s %r: %s" % (mount.name, op, key, e))
        _raise_for_status(resp, mount, key, op)
        return resp

    def call(self, mount, method, target, key, op, body=None, headers=None):
        conn, resp = self.request(mount, method, target, key, op, body, headers)
        try:
            return resp, resp.read()
        except socket.timeout:
            raise TimeoutError("state proxy %r: %s %r: no answer within %ss" % (mount.name, op, key, self.timeout))
        finally:
            conn.close()

    def wait_ready(self, mounts, deadline):
        """Until every connector answers GET /healthz, or ConfigError after `deadline`."""
        for m in mounts:
            while True:
                try:
                    resp, _ = self.call(m, "GET", "/healthz", "", "healthz")
                    if resp.status == 200:
                        break
                except (OSError, ValueError) as e:
                    err = e
                if time.monotonic() > deadline:
                    raise ConfigError("state proxy %r at %s is not ready: %s" % (m.name, m.socket, err))
                time.sleep(0.2)


class _ResponseRaw(io.RawIOBase):
    """A GET's body as a raw stream: bounded memory, timeouts and cut-offs as OSErrors."""

    def __init__(self, conn, resp, what):
        self._conn, self._resp, self._what = conn, resp, what

    def readable(self):
        return True

    def readinto(self, b):
        try:
            return self._resp.readinto(b)
        except socket.timeout:
            raise TimeoutError("%s: no data within %ss" % (self._what, self._conn.timeout))
        except http.client.HTTPException as e:
            raise OSError(errno.EIO, "%s: the connector cut the body short: %r" % (self._what, e))

    def close(self):
        if not self.closed:
            self._resp.close()
            self._conn.close()
        io.RawIOBase.close(self)


class _SpoolRaw(io.RawIOBase):
    """A read-only, seekable view of a spooled body (buffered mode)."""

    def __init__(self, spool):
        self._f = spool

    def readable(self):
        return True

    def seekable(self):
        return True

    def readinto(self, b):
        data = self._f.read(len(b))
        b[: len(data)] = data
        return len(data)

    def seek(self, pos, whence=0):
        return self._f.seek(pos, whence)

    def tell(self):
        return self._f.tell()

    def close(self):
        if not self.closed:
            self._f.close()
        io.RawIOBase.close(self)


class _UploadRaw(io.RawIOBase):
    """The body of one PUT /keys/{key}. Buffered: spooled, sent with Content-Length on
    close. Passthrough: sent as chunks while the handler writes. The connector's answer
    (and its error) comes on close."""

    def __init__(self, client, mount, key, exclusive):
        self._client, self._m, self._key = client, mount, key
        self._headers = {"If-None-Match": "*"} if exclusive else {}
        self._target = "/keys/" + quote_key(key)
        self._conn = self._spool = None
        if mount.mode == "passthrough":
            self._conn = client.connection(mount)
            self._conn.putrequest("PUT", self._target)
            self._conn.putheader("Transfer-Encoding", "chunked")
            for k, v in self._headers.items():
                self._conn.putheader(k, v)
            self._guard(self._conn.endheaders)
        else:
            self._spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_MAX)

    def writable(self):
        return True

    def _guard(self, fn, *args):
        try:
            fn(*args)
        except socket.timeout:
            self._abort()
            raise TimeoutError("state proxy %r: write %r: no progress within %ss" % (self._m.name, self._key, self._client.timeout))
        except (BrokenPipeError, ConnectionResetError) as e:
            try:
                _hung_up(self._conn, self._m, self._key, "write", e)
            finally:
                self._abort()

    def _abort(self):
        if self._conn is not None:
            self._conn.close()
        io.RawIOBase.close(self)

    def write(self, b):
        n = len(b)
        if self._spool is not None:
            self._spool.write(b)
        elif n:
            self._guard(self._conn.send, b"%x\r\n" % n)
            self._guard(self._conn.send, b)
            self._guard(self._conn.send, b"\r\n")
        return n

    def close(self):
        if self.closed:
            return
        try:
            if self._spool is not None:
                size = self._spool.tell()
                self._spool.seek(0)
                headers = dict(self._headers, **{"Content-Length": str(size)})
                self._client.call(self._m, "PUT", self._target, self._key, "write", body=self._spool, headers=headers)
            else:
                self._guard(self._conn.send, b"0\r\n\r\n")
                self._client.response(self._conn, self._m, self._key, "write").read()
        finally:
            if self._spool is not None:
                self._spool.close()
            if self._conn is not None:
                self._conn.close()
            io.RawIOBase.close(self)


class StateHooks(object):
    """The patched functions; `install()` puts them in place and returns the undo."""

    def __init__(self, mounts, timeout):
        self.mounts = mounts
        self.client = StateClient(timeout)
        self.real = {}

    def resolve(self, path):
        return resolve_state_path(path, self.mounts)

    # -- open ----------------------------------------------------------------------------------
    def open(self, file, mode="r", buffering=-1, encoding=None, errors=None, newline=None, closefd=True, opener=None):
        m, key = self.resolve(file)
        if m is None:
            return self.real["open"](file, mode, buffering, encoding, errors, newline, closefd, opener)
        kinds = [c for c in mode if c in "rwax"]
        if "+" in mode or len(kinds) != 1 or set(mode) - set("rwaxbt"):
            raise ValueError("open(%r, %r): a state mount supports r, w, a and x (text or binary), not %r" % (file, mode, mode))
        if not key or os.fspath(file)[-1:] in ("/", b"/"):
            raise IsADirectoryError(errno.EISDIR, "a state mount's directory is not a file", os.fsdecode(os.fspath(file)))
        kind, binary = kinds[0], "b" in mode
        if kind == "r":
            f = self._open_read(m, key)
        else:
            f = self._open_write(m, key, kind)
        if binary:
            return f
        return io.TextIOWrapper(f, encoding=encoding or "utf-8", errors=errors, newline=newline)

    def _open_read(self, m, key):
        conn, resp = self.client.request(m, "GET", "/keys/" + quote_key(key), key, "read")
        raw = _ResponseRaw(conn, resp, "state proxy %r: read %r" % (m.name, key))
        if m.mode == "passthrough":
            return io.BufferedReader(raw, CHUNK)
        # Buffered: the whole body first (seekable, like a real file), then the socket closes.
        with raw:
            spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_MAX)
            shutil.copyfileobj(raw, spool, CHUNK)
        spool.seek(0)
        return io.BufferedReader(_SpoolRaw(spool), CHUNK)

    def _open_write(self, m, key, kind):
        if kind == "x":
            # Early refusal for the common case; If-None-Match: * decides any race.
            try:
                self._head(m, key)
            except FileNotFoundError:
                pass
            else:
                raise FileExistsError(errno.EEXIST, "state proxy %r: %r exists" % (m.name, key), m.path + "/" + key)
        raw = _UploadRaw(self.client, m, key, exclusive=kind == "x")
        f = io.BufferedWriter(raw, CHUNK)
        if kind == "a":
            # Append: the stored bytes first (streamed), then the handler's.
            try:
                src = self._open_read(m, key)
            except FileNotFoundError:
                return f
            with src:
                shutil.copyfileobj(src, f, CHUNK)
        return f

    # -- os ------------------------------------------------------------------------------------
    def _head(self, m, key):
        conn = None
        try:
            conn, resp = self.client.request(m, "HEAD", "/keys/" + quote_key(key), key, "stat")
            return resp
        finally:
            if conn is not None:
                conn.close()

    def stat(self, path, *args, **kwargs):
        m, key = self.resolve(path)
        if m is None or args or kwargs.get("dir_fd") is not None:
            return self.real["stat"](path, *args, **kwargs)
        size, is_file, mtime = 0, False, 0.0
        if key:
            resp = self._head(m, key)
            size = int(resp.getheader("Content-Length") or 0)
            is_file = (resp.getheader("X-Is-File") or "true").lower() == "true"
            lm = resp.getheader("Last-Modified")
            if lm:
                try:
                    mtime = email.utils.parsedate_to_datetime(lm).timestamp()
                except (TypeError, ValueError):
                    pass
        mode = (stat.S_IFREG | 0o644) if is_file else (stat.S_IFDIR | 0o755)
        return os.stat_result((mode, 0, 0, 1, os.getuid(), os.getgid(), size, mtime, mtime, mtime))

    def listdir(self, path="."):
        m, key = self.resolve(path)
        if m is None:
            return self.real["listdir"](path)
        prefix = key + "/" if key else ""
        target = "/keys/?prefix=%s&delimiter=/" % urllib.parse.quote(prefix, safe="")
        _, body = self.client.call(m, "GET", target, key, "list")
        listing = json.loads(body)
        names = []
        for k in listing.get("keys", []):
            names.append(k[len(prefix) :] if k.startswith(prefix) else k)
        for p in listing.get("prefixes", []):
            p = p[len(prefix) :] if p.startswith(prefix) else p
            names.append(p.rstrip("/"))
        names = [n for n in names if n]
        if isinstance(path, bytes):
            return [os.fsencode(n) for n in names]
        return names

    def remove(self, path, *args, **kwargs):
        m, key = self.resolve(path)
        if m is None or args or kwargs.get("dir_fd") is not None:
            return self.real["remove"](path, *args, **kwargs)
        if not key:
            raise IsADirectoryError(errno.EISDIR, "a state mount's directory cannot be removed", m.path)
        self.client.call(m, "DELETE", "/keys/" + quote_key(key), key, "remove")

    def makedirs(self, name, mode=0o777, exist_ok=False):
        if self.resolve(name)[0] is None:
            return self.real["makedirs"](name, mode, exist_ok)
        # Directories under a mount are prefixes of keys: nothing to create.

    def _xattr(self, path, attribute):
        m, key = self.resolve(path)
        if m is None:
            return None, None, None
        a = os.fsdecode(attribute)
        if not a.startswith(XATTR_PREFIX):
            raise OSError(errno.ENODATA, "only %s* attributes exist under a state mount" % XATTR_PREFIX, os.fsdecode(os.fspath(path)))
        return m, key, a[len(XATTR_PREFIX) :]

    def _meta_target(self, key, attr=None):
        t = "/meta/" + quote_key(key)
        return t + "?attr=" + urllib.parse.quote(attr, safe="") if attr is not None else t

    def getxattr(self, path, attribute, *args, **kwargs):
        if self.resolve(path)[0] is None:
            return self.real["getxattr"](path, attribute, *args, **kwargs)
        m, key, a = self._xattr(path, attribute)
        try:
            _, body = self.client.call(m, "GET", self._meta_target(key, a), key, "getxattr " + a)
        except ValueError as e:
            raise OSError(errno.ENODATA, str(e), m.path + "/" + key)
        return json.loads(body)["value"].encode("utf-8")

    def listxattr(self, path=None, *args, **kwargs):
        m, key = self.resolve(path) if path is not None else (None, None)
        if m is None:
            return self.real["listxattr"](path, *args, **kwargs)
        _, body = self.client.call(m, "GET", self._meta_target(key), key, "listxattr")
        return [XATTR_PREFIX + a for a in json.loads(body).get("attrs", [])]

    def setxattr(self, path, attribute, value, *args, **kwargs):
        if self.resolve(path)[0] is None:
            return self.real["setxattr"](path, attribute, value, *args, **kwargs)
        m, key, a = self._xattr(path, attribute)
        try:
            self.client.call(m, "PUT", self._meta_target(key, a), key, "setxattr " + a, body=bytes(value))
        except ValueError as e:
            raise OSError(errno.ENOTSUP, str(e), m.path + "/" + key)

    def install(self):
        """Patches builtins.open/io.open and the os functions; returns a function that undoes it."""
        targets = [(builtins, "open", self.open), (io, "open", self.open)]
        for name, fn in (("stat", self.stat), ("listdir", self.listdir), ("remove", self.remove),
                         ("unlink", self.remove), ("makedirs", self.makedirs), ("getxattr", self.getxattr),
                         ("listxattr", self.listxattr), ("setxattr", self.setxattr)):
            if hasattr(os, name):
                targets.append((os, name, fn))
        saved = []
        for mod, name, fn in targets:
            saved.append((mod, name, getattr(mod, name)))
            self.real.setdefault("remove" if name == "unlink" else name, getattr(mod, name))
            setattr(mod, name, fn)

        def restore():
            for mod, name, fn in saved:
                setattr(mod, name, fn)

        return restore


def install_state_proxies(environ):
    """Reads ASYA_STATE_PROXY_MOUNTS (nothing to do when unset), waits for every connector's
    /healthz and installs the hooks. ConfigError when a setting is wrong or a connector is
    not up within ASYA_STATE_PROXY_STARTUP_TIMEOUT seconds (default 60)."""
    text = environ.get("ASYA_STATE_PROXY_MOUNTS", "").strip()
    if not text:
        return None
    try:
        timeout = float(environ.get("ASYA_STATE_PROXY_TIMEOUT", "30"))
        startup = float(environ.get("ASYA_STATE_PROXY_STARTUP_TIMEOUT", "60"))
    except ValueError as e:
        raise ConfigError("ASYA_STATE_PROXY_TIMEOUT / ASYA_STATE_PROXY_STARTUP_TIMEOUT: %s" % e)
    mounts = parse_state_mounts(text, environ.get("ASYA_STATE_SOCKET_DIR", STATE_SOCKET_DIR))
    hooks = StateHooks(mounts, timeout)
    hooks.client.wait_ready(mounts, time.monotonic() + startup)
    log.info("state proxies: %s", ", ".join("%s at %s (%s)" % (m.name, m.path, m.mode) for m in mounts))
    return hooks.install()


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
        # The hooks are in place before the handler's module is imported: it may read state
        # at import time.
        install_state_proxies(os.environ)
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
