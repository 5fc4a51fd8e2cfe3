"""Handlers of the order-review flow (deploy/examples/flows/order_review.py, docs/flows.md).

Deterministic by the payload, so a test can tell each envelope's exact result:
* validate: the order needs `items` (a KeyError otherwise); sets `total`.
* charge: card "declined" always fails with PaymentDeclined (a PaymentError, a ValueError);
  "declined-once" fails on the first attempt only; otherwise records the charge.
* express_ship / standard_ship: set `shipping`; notify: sets `notified`.
"""


class PaymentError(ValueError):
    pass


class PaymentDeclined(PaymentError):
    pass


def validate(state):
    items = state["items"]
    state["total"] = sum(i["price"] for i in items)
    state.setdefault("trail", []).append("validate")
    return state


def charge(state):
    card = state.get("card", "ok")
    state.setdefault("trail", []).append("charge")
    if card == "declined" or (card == "declined-once" and state["attempt"] == 1):
        raise PaymentDeclined("card %s declined on attempt %d" % (card, state["attempt"]))
    state["charged"] = state["total"]
    return state


def express_ship(state):
    state["shipping"] = "express"
    state["trail"].append("express_ship")
    return state


def standard_ship(state):
    state["shipping"] = "standard"
    state["trail"].append("standard_ship")
    return state


def notify(state):
    state["notified"] = True
    state["trail"].append("notify")
    return state
