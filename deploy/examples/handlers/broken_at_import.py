"""A handler module that fails while it loads, as one does when a file it reads at import is
not in the image (model weights, a settings file). The runtime exits with the traceback and the
kubelet restarts it; the actor's phase becomes RuntimeError until the cause is fixed
(tests/e2e/test_node_failures.py)."""

import os

WEIGHTS = os.environ.get("MODEL_WEIGHTS", "/models/weights.bin")

# FileNotFoundError at import: nothing is at that path in the examples image.
with open(WEIGHTS, "rb") as f:
    MODEL = f.read()


def handle(payload):
    return {"model_bytes": len(MODEL), "payload": payload}
