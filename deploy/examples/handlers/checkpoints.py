"""State through a mounted path (docs/DESIGN.md §10): with the s3-checkpoints flavor, files
under /state/checkpoints are objects in S3. Plain open() and os; no SDK."""

import json
import os

ROOT = "/state/checkpoints"


def save(payload):
    """Writes one checkpoint per envelope: run-{run}.json."""
    path = os.path.join(ROOT, "run-%s.json" % payload["run"])
    with open(path, "w") as f:
        json.dump(payload, f)
    return {"run": payload["run"], "checkpoint": path}


def load(payload):
    """Reads a checkpoint back (FileNotFoundError when there is none) and lists the others."""
    with open(os.path.join(ROOT, "run-%s.json" % payload["run"])) as f:
        checkpoint = json.load(f)
    return {"checkpoint": checkpoint, "all": sorted(os.listdir(ROOT))}
