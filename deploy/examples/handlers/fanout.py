"""Handlers of the fan-out flow (flow/fixtures/fan_out.py, docs/flows.md § Fan-out).

Deterministic by the payload, so a test can tell each envelope's exact result:
* split: notes the first and last of `items`.
* double: a branch; twice its number; a negative one raises ValueError (the flow's `except`
  catches it), 13 raises KeyError (nothing catches it: x-sump).
"""


def split(state):
    items = state["items"]
    state["first"] = items[0] if items else 0
    state["last"] = items[-1] if items else 0
    return state


def double(x):
    if x < 0:
        raise ValueError("negative: %d" % x)
    if x == 13:
        raise KeyError("unlucky 13")
    return x * 2
