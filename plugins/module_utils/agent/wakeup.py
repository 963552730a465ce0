# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What wakes the agent's loop, safe to set from any thread and from a signal handler (private).

A ``threading.Event`` is not: a signal handler runs in the main thread between two of its
bytecodes, and ``Event.set`` takes the lock that the main thread may be holding at that instant
(inside ``Event.wait`` or ``Event.clear``), which blocks the main thread on itself for good. The
agent hung so after a SIGHUP, once in several runs, and SIGTERM could no longer stop it. A pipe
takes no lock: ``set`` writes a byte, ``wait`` waits until one can be read, ``clear`` reads them.
"""

from __future__ import annotations

import os
import select


class Wakeup:
    """The interface of ``threading.Event`` the agent uses (set, clear, is_set, wait), over a pipe."""

    def __init__(self):
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)

    def set(self):
        try:
            os.write(self._write, b"!")
        except BlockingIOError:
            pass   # the pipe is full: the loop has a wake-up waiting already
        except OSError:
            pass   # closed: the loop has ended

    def clear(self):
        while True:
            try:
                if not os.read(self._read, 4096):
                    return
            except BlockingIOError:
                return

    def is_set(self):
        return self.wait(0)

    def wait(self, timeout=None):
        """Whether it is set, after waiting up to ``timeout`` seconds (None: for as long as it takes)."""
        try:
            return bool(select.select([self._read], [], [], timeout)[0])
        except InterruptedError:   # pragma: no cover  (Python retries select after a signal: PEP 475)
            return self.is_set()

    def close(self):
        for descriptor in (self._read, self._write):
            try:
                os.close(descriptor)
            except OSError:
                pass
