"""Example handlers for the three-actor demo pipeline (scripts/demo.sh).

validate -> split -> shout. Plain Python: no Asya imports. Each handler gets the payload and
returns the next payload; `split` returns a list, which fans out into one envelope per item.
"""


class UpstreamBusy(Exception):
    """A transient failure: the actor's resiliency policy retries it."""


class ContentPolicyViolation(Exception):
    """A permanent failure: the actor's rules send it straight to x-sump."""


class Validator:
    """Class handler: instantiated once per runtime, so it can remember attempts."""

    def __init__(self):
        self.seen = {}

    def check(self, payload):
        text = payload.get("text")
        if not isinstance(text, str) or not text.strip():
            raise ValueError("payload needs a non-empty 'text'")
        if payload.get("flaky"):
            # Fails on the first attempt for this text, succeeds on the retry.
            n = self.seen.get(text, 0) + 1
            self.seen[text] = n
            if n == 1:
                raise UpstreamBusy("upstream busy, try again (attempt %d)" % n)
        if "forbidden" in text:
            raise ContentPolicyViolation("text contains a forbidden word")
        return {"text": text.strip(), "checked": True}


def split(payload):
    """Fan-out: one envelope per word."""
    return [{"word": w, "position": i} for i, w in enumerate(payload["text"].split())]


def shout(payload):
    return {"word": payload["word"].upper(), "position": payload["position"]}


def echo(payload):
    """Trivial handler used by the benchmark."""
    return payload
