"""Example handlers for the three-actor demo pipeline (scripts/demo.sh).

validate -> split -> shout. Plain Python: no Asya imports. Each handler gets the payload and
returns the next payload; `split` returns a list, which fans out into one envelope per item.
"""

import os


class UpstreamBusy(Exception):
    """A transient failure: the actor's resiliency policy retries it."""


class ContentPolicyViolation(Exception):
    """A permanent failure: the actor's rules send it straight to x-sump."""


def blocked_words():
    """The content policy: words refused, from ASYA_DEMO_BLOCKED_WORDS (comma-separated;
    "forbidden" when unset). Read per call, so the cluster demo can fix a too strict policy in
    the actor's env (scripts/demo-cluster.sh) and redrive what it refused."""
    return [w for w in os.environ.get("ASYA_DEMO_BLOCKED_WORDS", "forbidden").split(",") if w.strip()]


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
        for word in blocked_words():
            if word.strip() in text.split():
                raise ContentPolicyViolation("text contains the blocked word %r" % word.strip())
        return {"text": text.strip(), "checked": True}


def split(payload):
    """Fan-out: one envelope per word."""
    return [{"word": w, "position": i} for i, w in enumerate(payload["text"].split())]


def shout(payload):
    return {"word": payload["word"].upper(), "position": payload["position"]}


def echo(payload):
    """Trivial handler used by the benchmark."""
    return payload
