"""Bounded polling: no test sleeps in place of waiting for a condition."""

from __future__ import annotations

import time

from asya_e2e.kube import CommandError


def wait_for(what, fn, timeout=60.0, interval=0.2):
    """Polls fn until it returns a truthy value; fails naming `what` and the last result."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            last = fn()
            if last:
                return last
        except CommandError as e:  # not there yet
            last = e
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last}")
        time.sleep(interval)
