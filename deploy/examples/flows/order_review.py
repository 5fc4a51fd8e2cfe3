"""Order review: the worked example of docs/flows.md, in the original Asya's flow language.

Each `await` is an actor call (the handlers are in deploy/examples/handlers/orders.py); the
rest (mutations, the branch, the retry loop, the except paths, the sub-flow) is evaluated by
the sidecars between the calls, without a hop of its own.

    asya flow compile deploy/examples/flows/order_review.py -o build/order-review \
        --module orders --image asya-examples:latest
"""


async def ship(state: dict) -> dict:
    """A sub-flow: inlined where it is called."""
    if state["total"] >= 100:
        state = await express_ship(state)
        return state
    elif state.get("country") == "US":
        state = await standard_ship(state)
    else:
        state["shipping"] = "pickup"
    return state


async def review_order(state: dict) -> dict:
    state["status"] = "received"
    state["attempt"] = 0
    try:
        state = await validate(state)
    except KeyError:
        state["status"] = "rejected"
        return state
    while True:
        state["attempt"] += 1
        try:
            state = await charge(state)
            break
        except PaymentError:
            if state["attempt"] >= 3:
                raise
    state = await ship(state)
    state = await notify(state)
    state["status"] = "done"
    return state
