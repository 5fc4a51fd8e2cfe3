"""A faulty state proxy connector for the runtime's tests: the wire of docs/DESIGN.md §10 over
HTTP/1.1 on a Unix socket, answering only with the faults the Rust connector cannot be made to
produce. The runtime's hooks are tested against the Rust connector (test_state_proxy.py); this
stores nothing.

    python3 state_connector.py SOCKET

A key (or listing prefix) `_status/NNN/...` is answered with HTTP status NNN and an error body,
after the request's body is read; `_early/NNN/...` answers NNN before reading the body and
hangs up (a size limit); `_sleep/S/...` waits S seconds, then answers 404. Any other key is
501: nothing else is served. `GET /healthz` answers 200.
"""

import http.server
import json
import os
import socket
import socketserver
import sys
import time
import urllib.parse

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

    def key(self):
        """The key (or listing prefix) of a /keys/ or /meta/ request, or None (healthz)."""
        url = urllib.parse.urlsplit(self.path)
        if url.path == "/healthz":
            return None
        query = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
        raw = url.path.split("/", 2)[2] if url.path.count("/") >= 2 else ""
        key = "/".join(urllib.parse.unquote(s) for s in raw.split("/"))
        return query.get("prefix", "") if key == "" and "prefix" in query else key

    def answer(self, head=False):
        key = self.key()
        if key is None:
            return self.send(200, b'{"status": "ready"}', {"Content-Type": "application/json"}, head=head)
        parts = key.split("/")
        if parts[0] == "_early" and len(parts) > 1:
            self.close_connection = True
            return self.error(int(parts[1]), "test", "refused before the body")
        for _ in self.body_chunks():
            pass
        if parts[0] == "_status" and len(parts) > 1:
            return self.error(int(parts[1]), "test", "status %s asked for" % parts[1])
        if parts[0] == "_sleep" and len(parts) > 1:
            time.sleep(float(parts[1]))
            return self.error(404, "key_not_found", key)
        return self.error(501, "not_served", "this test connector serves only _status, _early and _sleep keys")

    def do_GET(self):
        self.answer()

    def do_HEAD(self):
        self.answer(head=True)

    def do_PUT(self):
        self.answer()

    def do_DELETE(self):
        self.answer()


def main(argv):
    server = Server(argv[1], Handler)
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv)
