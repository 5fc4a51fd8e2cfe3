"""End-actor handlers for x-sink and x-sump (envelope mode): record where each envelope
ended. The demo reads the file; a real deployment would store results or alert instead."""

import json
import os


def record(envelope):
    path = os.environ.get("ASYA_DEMO_RESULTS")
    if path:
        line = json.dumps({"end": os.environ.get("ASYA_DEMO_END", "?"), "envelope": envelope})
        with open(path, "a") as f:
            f.write(line + "\n")
    return None
