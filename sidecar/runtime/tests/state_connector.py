"""A state proxy connector for the runtime's tests: the wire contract of docs/DESIGN.md §10
(the original Asya's), served over HTTP/1.1 on a Unix socket, storing keys as files under a
directory. It is a real process speaking the wire; the Rust connector can take its place.

    python3 state_connector.py SOCKET ROOT

Test hooks (not part of the contract): a key whose first segment is `_status` and second a
number NNN is answered with that HTTP status and an error body; `_sleep/S/...` waits S
seconds before answering; `_early/NNN/...` answers NNN before reading the body and hangs
up. Attributes: `url` (read-only) and `content_type`, `ttl`
(writable) exist; any other is 400 (unsupported).
"""

import http.server
import json
import os
import socket
import socketserver
import sys
import tempfile
import time
import urllib.parse

ATTRS = ("url", "content_type", "ttl")
WRITABLE = ("content_type", "ttl")


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    address_family = socket.AF_UNIX
    daemon_threads = True

    def server_bind(self):
        try:
            os.unlink(self.server_address)
        except FileNotFoundError:
            pass
        self.socket.bind(self.server_address)
        self.server_name, self.server_port = "connector", 0


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def address_string(self):
        return "unix"

    # -- plumbing ------------------------------------------------------------------------------
    def send(self, status, body=b"", headers=None, head=False):
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if "Content-Length" not in (headers or {}):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and not head:
            self.wfile.write(body)

    def error(self, status, code, message):
        self.send(status, json.dumps({"error": code, "message": message}).encode(), {"Content-Type": "application/json"})

    def body_chunks(self):
        """The request body, in pieces (Content-Length or chunked)."""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return
                left = size
                while left:
                    piece = self.rfile.read(min(left, 1 << 20))
                    if not piece:
                        raise ConnectionError("body cut short")
                    left -= len(piece)
                    yield piece
                self.rfile.readline()
        else:
            left = int(self.headers.get("Content-Length") or 0)
            while left:
                piece = self.rfile.read(min(left, 1 << 20))
                if not piece:
                    raise ConnectionError("body cut short")
                left -= len(piece)
                yield piece

    def route(self):
        """(kind, key, query) with kind keys | list | meta | healthz, or None."""
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
        if url.path == "/healthz":
            return "healthz", "", query
        for kind in ("keys", "meta"):
            if url.path.startswith("/%s/" % kind):
                raw = url.path[len(kind) + 2 :]
                key = "/".join(urllib.parse.unquote(s) for s in raw.split("/"))
                if kind == "keys" and key == "" and "prefix" in query:
                    return "list", "", query
                return kind, key, query
        return None

    def file(self, key):
        if not key or key.startswith("/") or any(s in ("", ".", "..") for s in key.split("/")):
            return None
        return os.path.join(self.server.root, "data", key)

    def hooks(self, key):
        """Answers the test hooks; True when the request was answered."""
        parts = key.split("/")
        if parts[0] == "_sleep" and len(parts) > 1:
            time.sleep(float(parts[1]))
        if parts[0] == "_early" and len(parts) > 1:
            # A refusal before the body is read, then the connection closes (a size limit).
            self.close_connection = True
            self.error(int(parts[1]), "test", "refused before the body")
            return True
        if parts[0] == "_status" and len(parts) > 1:
            for _ in self.body_chunks():
                pass
            self.error(int(parts[1]), "test", "status %s asked for" % parts[1])
            return True
        return False

    # -- methods -------------------------------------------------------------------------------
    def do_GET(self):
        r = self.route()
        if r is None:
            return self.error(404, "no_route", self.path)
        kind, key, query = r
        if kind == "healthz":
            return self.send(200, b'{"status": "ready"}', {"Content-Type": "application/json"})
        if self.hooks(query.get("prefix", "") if kind == "list" else key):
            return
        if kind == "list":
            return self.list(query.get("prefix", ""), query.get("delimiter", ""))
        path = self.file(key)
        if path is None:
            return self.error(400, "bad_key", key)
        if kind == "meta":
            return self.get_meta(key, path, query.get("attr"))
        if not os.path.isfile(path):
            return self.error(404, "key_not_found", key)
        size = os.path.getsize(path)
        self.send_response(200)
        self.send_header("Content-Length", str(size))
        self.end_headers()
        with open(path, "rb") as f:
            while True:
                piece = f.read(1 << 20)
                if not piece:
                    break
                self.wfile.write(piece)

    def do_HEAD(self):
        r = self.route()
        if r is None or r[0] != "keys":
            return self.send(404, head=True)
        key = r[1]
        if self.hooks(key):
            return
        path = self.file(key)
        if path is None:
            return self.send(400, head=True)
        if os.path.isfile(path):
            mtime = self.date_time_string(os.path.getmtime(path))
            headers = {"Content-Length": str(os.path.getsize(path)), "X-Is-File": "true", "Last-Modified": mtime}
            return self.send(200, headers=headers, head=True)
        if os.path.isdir(path):
            return self.send(200, headers={"Content-Length": "0", "X-Is-File": "false"}, head=True)
        return self.send(404, head=True)

    def do_PUT(self):
        r = self.route()
        if r is None:
            return self.error(404, "no_route", self.path)
        kind, key, query = r
        if self.hooks(key):
            return
        path = self.file(key)
        if path is None:
            return self.error(400, "bad_key", key)
        if kind == "meta":
            return self.put_meta(key, path, query.get("attr"))
        if self.headers.get("If-None-Match") == "*" and os.path.exists(path):
            for _ in self.body_chunks():
                pass
            return self.error(412, "exists", key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        # Written aside and renamed: a reader never sees a partial object.
        fd, tmp = tempfile.mkstemp(dir=os.path.join(self.server.root, "tmp"))
        try:
            with os.fdopen(fd, "wb") as f:
                for piece in self.body_chunks():
                    f.write(piece)
            if self.headers.get("If-None-Match") == "*":
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    return self.error(412, "exists", key)
            else:
                os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        self.send(204)

    def do_DELETE(self):
        r = self.route()
        if r is None or r[0] != "keys":
            return self.error(404, "no_route", self.path)
        key = r[1]
        if self.hooks(key):
            return
        path = self.file(key)
        if path is None:
            return self.error(400, "bad_key", key)
        if not os.path.isfile(path):
            return self.error(404, "key_not_found", key)
        os.unlink(path)
        self.send(204)

    # -- listing and attributes ----------------------------------------------------------------
    def list(self, prefix, delimiter):
        data = os.path.join(self.server.root, "data")
        keys, prefixes = [], set()
        for dirpath, _, files in os.walk(data):
            for name in files:
                k = os.path.relpath(os.path.join(dirpath, name), data)
                if not k.startswith(prefix):
                    continue
                rest = k[len(prefix) :]
                if delimiter and delimiter in rest:
                    prefixes.add(prefix + rest.split(delimiter)[0] + delimiter)
                else:
                    keys.append(k)
        body = json.dumps({"keys": sorted(keys), "prefixes": sorted(prefixes)}).encode()
        self.send(200, body, {"Content-Type": "application/json"})

    def meta_file(self, path):
        data = os.path.join(self.server.root, "data")
        return os.path.join(self.server.root, "meta", os.path.relpath(path, data) + ".json")

    def load_meta(self, path):
        try:
            with open(self.meta_file(path)) as f:
                return json.load(f)
        except FileNotFoundError:
            return {}

    def get_meta(self, key, path, attr):
        if not os.path.isfile(path):
            return self.error(404, "key_not_found", key)
        if attr is None:
            return self.send(200, json.dumps({"attrs": list(ATTRS)}).encode(), {"Content-Type": "application/json"})
        if attr not in ATTRS:
            return self.error(400, "unsupported_attribute", attr)
        value = "file://" + key if attr == "url" else self.load_meta(path).get(attr, "")
        self.send(200, json.dumps({"attr": attr, "value": value}).encode(), {"Content-Type": "application/json"})

    def put_meta(self, key, path, attr):
        value = b"".join(self.body_chunks()).decode("utf-8")
        if not os.path.isfile(path):
            return self.error(404, "key_not_found", key)
        if attr not in ATTRS:
            return self.error(400, "unsupported_attribute", str(attr))
        if attr not in WRITABLE:
            return self.error(403, "read_only", attr)
        meta = self.load_meta(path)
        meta[attr] = value
        os.makedirs(os.path.dirname(self.meta_file(path)), exist_ok=True)
        with open(self.meta_file(path), "w") as f:
            json.dump(meta, f)
        self.send(204)


def main(argv):
    sock, root = argv[1], argv[2]
    for d in ("data", "tmp", "meta"):
        os.makedirs(os.path.join(root, d), exist_ok=True)
    server = Server(sock, Handler)
    server.root = root
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv)
