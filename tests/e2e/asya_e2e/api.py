"""Straight to the API server over keep-alive HTTPS as the kubeconfig's user: for load and
for streams of creates whose every answer counts (kubectl's process per call is too slow)."""

from __future__ import annotations

import base64
import http.client
import os
import ssl
import tempfile

import yaml

from asya_e2e.env import KUBECONFIG


def api_connection_factory():
    """A function that opens one HTTPS connection to the API server as the kubeconfig's user."""
    cfg = yaml.safe_load(open(KUBECONFIG))
    cluster = cfg["clusters"][0]["cluster"]
    user = cfg["users"][0]["user"]
    tmp = tempfile.mkdtemp(prefix="asya-bench-admission-")

    def material(data_key, path_key, name):
        if user.get(path_key) or cluster.get(path_key):
            return user.get(path_key) or cluster.get(path_key)
        p = os.path.join(tmp, name)
        with open(p, "wb") as f:
            f.write(base64.b64decode(user.get(data_key) or cluster[data_key]))
        return p

    ctx = ssl.create_default_context(cafile=material("certificate-authority-data", "certificate-authority", "ca"))
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if user.get("token"):
        headers["Authorization"] = "Bearer " + user["token"]
    else:
        ctx.load_cert_chain(material("client-certificate-data", "client-certificate", "crt"),
                            material("client-key-data", "client-key", "key"))
    server = cluster["server"].removeprefix("https://")
    host, port = server.rsplit(":", 1)

    def connect():
        return http.client.HTTPSConnection(host, int(port), context=ctx, timeout=30)

    return connect, headers
