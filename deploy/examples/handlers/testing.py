"""Handlers the sidecar's integration tests drive (sidecar/tests). Behaviour is chosen by the
payload, so one runtime serves every case."""

import os
import signal
import time


class RateLimitError(Exception):
    pass


class ContentPolicyViolation(Exception):
    pass


class NotFixedYet(Exception):
    pass


_attempts = {}


def act(payload):
    if not isinstance(payload, dict):
        return payload
    kind = payload.get("do", "echo")
    key = payload.get("key", "")
    if kind == "echo":
        return payload
    if kind == "double":
        return dict(payload, value=payload["value"] * 2)
    if kind == "fanout":
        return [dict(payload, do="echo", part=i) for i in range(payload["n"])]
    if kind == "empty":
        return None
    if kind == "raise":
        raise ValueError("handler failed on purpose: %s" % key)
    if kind == "flaky":
        # Fails `fails` times for this key (per runtime process), then succeeds.
        n = _attempts.get(key, 0) + 1
        _attempts[key] = n
        if n <= payload.get("fails", 1):
            raise RateLimitError("rate limited (attempt %d)" % n)
        return dict(payload, attempts=n)
    if kind == "until_fixed":
        # Fails until the file `flag` (a mounted ConfigMap key) says "fixed": a handler whose
        # cause is fixed by flipping a ConfigMap (tests/e2e/test_cli.py redrives after it).
        try:
            with open(payload["flag"]) as f:
                fixed = f.read().strip() == "fixed"
        except OSError:
            fixed = False
        if not fixed:
            raise NotFixedYet("not fixed yet: %s" % key)
        return dict(payload, fixed=True)
    if kind == "forbidden":
        raise ContentPolicyViolation("not allowed: %s" % key)
    if kind == "sleep":
        if payload.get("started"):
            # Lets a test see that the handler is running before it kills something.
            open(payload["started"], "w").close()
        time.sleep(payload["seconds"])
        return payload
    if kind == "die_once":
        # Kills the runtime the first time it sees `marker` missing: "runtime killed mid-message".
        marker = payload["marker"]
        if not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(9)
        return payload
    if kind == "stopped_once":
        # The first time: what the kubelet does to a pod going away while this handler runs,
        # SIGTERM and, the grace period over, SIGKILL.
        marker = payload["marker"]
        if not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGTERM)
            mark = os.path.join(os.environ.get("ASYA_SOCKET_DIR", "/var/run/asya"), "asya-runtime.stopping")
            while not os.path.exists(mark):
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGKILL)
        return payload
    if kind == "big":
        return dict(payload, blob="x" * payload["size"])
    raise ValueError("unknown test action %r" % kind)


def reroute(envelope):
    """Envelope mode: appends the actors named in the payload to the route (dynamic routing)
    and tags the headers. `bad_cursor` tries to move the cursor, which the sidecar refuses."""
    payload = envelope["payload"]
    envelope["route"]["actors"].extend(payload.get("then", []))
    envelope["headers"]["rerouted"] = True
    if payload.get("bad_cursor"):
        envelope["route"]["current"] += 1
    return envelope
