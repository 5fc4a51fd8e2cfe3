"""File operations under a state mount chosen by the payload (docs/DESIGN.md §9, §10): what a
handler, hostile or not, can do with plain open() and os there. The tenancy tests
(tests/e2e/test_tenancy_state.py) drive it as the tenant who tries another namespace's state."""

import os


def probe(payload):
    """`op` on `path`: write (`data`), read, list, delete, exists. A refusal is the handler's
    exception (FileNotFoundError, PermissionError, ...): the envelope ends in x-sump with it."""
    op, path = payload["op"], payload["path"]
    if op == "write":
        with open(path, "w") as f:
            f.write(payload["data"])
        return {"op": op, "path": path}
    if op == "read":
        with open(path) as f:
            return {"op": op, "path": path, "data": f.read()}
    if op == "list":
        return {"op": op, "path": path, "entries": sorted(os.listdir(path))}
    if op == "delete":
        os.remove(path)
        return {"op": op, "path": path}
    if op == "exists":
        return {"op": op, "path": path, "exists": os.path.exists(path)}
    raise ValueError("unknown op %r" % op)
