"""Every version of a namespace's objects, as the API server's watch delivers them: to prove
that no object was written twice with different content (e.g. by two provisioner leaders
rendering it differently during a failover)."""

from __future__ import annotations

import hashlib
import json
import threading
import urllib.parse

from asya_e2e.api import api_connection_factory


def _deployment_content(obj: dict) -> dict:
    # The replica count is the scaler's (KEDA, the HPA), not the provisioner's.
    spec = dict(obj.get("spec", {}))
    spec.pop("replicas", None)
    return spec


def _scaled_object_content(obj: dict) -> dict:
    # Only the spec: KEDA adds its own label to a ScaledObject, and status is the controllers'.
    # KEDA's operator also writes an empty `advanced.scalingModifiers` into the spec when it
    # first reconciles one (seen on the node: null -> {}): its default, not our content.
    spec = json.loads(json.dumps(obj.get("spec", {})))
    advanced = spec.get("advanced")
    if isinstance(advanced, dict) and advanced.get("scalingModifiers") == {}:
        del advanced["scalingModifiers"]
    return spec


# (API path of the namespaced collection, what of an object is the content its writer owns)
KINDS = {
    "Deployment": ("/apis/apps/v1/namespaces/{ns}/deployments", _deployment_content),
    "ScaledObject": ("/apis/keda.sh/v1alpha1/namespaces/{ns}/scaledobjects", _scaled_object_content),
}


class ContentHistory:
    """Watches KINDS in `ns` from now until `stop()`; `contents()` gives, per object, the
    distinct contents seen in order (a fingerprint each). A watch the server ends is resumed
    from the last resourceVersion seen, so no version is missed."""

    def __init__(self, ns: str, kinds: tuple[str, ...] = tuple(KINDS)):
        self.ns = ns
        self._connect, self._headers = api_connection_factory()
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, str], list[str]] = {}
        # The first two contents of each object, to say what differs.
        self._contents: dict[tuple[str, str], list[dict]] = {}
        self._versions = 0
        self._stopped = threading.Event()
        self._conns: list = []
        self.errors: list[str] = []
        self._threads = [threading.Thread(target=self._watch, args=(k,), daemon=True) for k in kinds]

    def __enter__(self) -> "ContentHistory":
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self._stopped.set()
        with self._lock:
            for c in self._conns:
                try:
                    c.sock and c.sock.shutdown(2)
                except OSError:
                    pass
        for t in self._threads:
            t.join(timeout=10)

    def _watch(self, kind: str) -> None:
        path, content = KINDS[kind]
        base = path.format(ns=urllib.parse.quote(self.ns))
        version = ""
        while not self._stopped.is_set():
            conn = self._connect()
            conn.timeout = None  # a watch is idle for as long as nothing changes
            with self._lock:
                self._conns.append(conn)
            query = {"watch": "1", "timeoutSeconds": "300"}
            if version:
                query["resourceVersion"] = version
            try:
                conn.request("GET", f"{base}?{urllib.parse.urlencode(query)}", headers=self._headers)
                resp = conn.getresponse()
                if resp.status != 200:
                    self.errors.append(f"{kind} watch: HTTP {resp.status} {resp.read()[:300]!r}")
                    return
                for line in resp:
                    event = json.loads(line)
                    obj = event.get("object", {})
                    if event.get("type") == "ERROR":
                        # 410 Gone: start over from the current state (its versions are new).
                        self.errors.append(f"{kind} watch: {obj.get('message')}")
                        version = ""
                        break
                    version = obj.get("metadata", {}).get("resourceVersion", version)
                    if event.get("type") not in ("ADDED", "MODIFIED"):
                        continue
                    fingerprint = hashlib.sha256(json.dumps(content(obj), sort_keys=True).encode()).hexdigest()[:16]
                    key = (kind, obj["metadata"]["name"])
                    with self._lock:
                        self._versions += 1
                        seen = self._seen.setdefault(key, [])
                        if fingerprint not in seen:
                            seen.append(fingerprint)
                            kept = self._contents.setdefault(key, [])
                            if len(kept) < 2:
                                kept.append(content(obj))
            except (OSError, ValueError) as e:
                if not self._stopped.is_set():
                    self.errors.append(f"{kind} watch: {e}")
            finally:
                conn.close()

    def versions(self) -> int:
        """How many object versions the watches delivered."""
        with self._lock:
            return self._versions

    def objects(self) -> int:
        with self._lock:
            return len(self._seen)

    def differences(self, limit: int = 3) -> list[str]:
        """For up to `limit` rewritten objects, the paths where their first two contents differ."""
        out = []
        with self._lock:
            for (k, n), kept in self._contents.items():
                if len(kept) == 2 and len(out) < limit:
                    out.append(f"{k}/{n}: " + "; ".join(_diff(kept[0], kept[1])))
        return out

    def rewritten(self) -> dict[str, int]:
        """The objects seen with more than one content: `Kind/name` -> distinct contents."""
        with self._lock:
            return {f"{k}/{n}": len(v) for (k, n), v in self._seen.items() if len(v) > 1}


def _diff(a, b, path: str = "") -> list[str]:
    """Where two JSON values differ: `path: before -> after` at each differing leaf."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += _diff(a.get(k), b.get(k), f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        out = []
        for i, (x, y) in enumerate(zip(a, b)):
            out += _diff(x, y, f"{path}[{i}]")
        return out
    return [] if a == b else [f"{path or '.'}: {json.dumps(a)[:120]} -> {json.dumps(b)[:120]}"]
