"""The small helpers the rest of the harness, the tests and the benchmarks share: waiting, a free port, a JSON
file replaced whole."""

from __future__ import annotations

import json

import socket
import time


def wait_until(predicate, timeout, what, step=0.05, ignore=(), gone=None, log=None):
    """Seconds until ``predicate()`` first held; AssertionError naming ``what`` once ``timeout`` seconds passed.

    ``ignore``: exceptions of the predicate that count as "not yet" (a server still starting, an object not
    there yet). ``gone``: called before each try, returns why waiting is pointless (the process waited on has
    ended) or None; the wait then fails at once with that reason. ``log``: called on failure, its text ends the
    message (the log of the process waited on).
    """
    start = time.monotonic()
    while True:
        ended = gone() if gone is not None else None
        if ended:
            raise AssertionError("%s while waiting for %s%s" % (ended, what, "\n" + log() if log else ""))
        try:
            if predicate():
                return time.monotonic() - start
        except ignore:
            pass
        if time.monotonic() - start >= timeout:
            raise AssertionError("%s: not within %.1f s%s" % (what, timeout, "\n" + log() if log else ""))
        time.sleep(step)


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def replace_json(path, data):
    """Writes ``data`` as JSON to ``path`` through a rename, as a reader that may look at any moment
    (the NVML simulator re-reading its scenario) needs: it sees the old file or the new, never half."""
    staged = path.with_suffix(".new")
    staged.write_text(json.dumps(data))
    staged.rename(path)


class Clock:
    """A clock a test moves by hand (``now``), for code that takes one."""

    def __init__(self, now=1000.0):
        self.now = now

    def __call__(self):
        return self.now
