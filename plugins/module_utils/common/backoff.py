# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Pauses between tries, and a bound on how fast one process may ask (private to the collection).

Every retry in the collection pauses with ``pause``: a ceiling that doubles with each failure, up
to a cap, and a pause drawn at random from its upper half. Clients that failed together (an API
server restart meets a whole fleet) then come back spread over half the ceiling, not in step,
and none comes back sooner than half of it.
"""

from __future__ import annotations

import random
import threading
import time


def pause(failures, base_s, cap_s, rand=random.random):
    """Seconds to wait after ``failures`` (1 or more) failures in a row: from half to all of
    ``min(cap_s, base_s * 2 ** (failures - 1))``."""
    ceiling = min(cap_s, base_s * 2.0 ** min(max(failures - 1, 0), 30))
    return ceiling / 2 + rand() * ceiling / 2


class TokenBucket:
    """At most ``burst`` calls at once, then ``qps`` a second: client-go's client-side rate limit.

    ``take()`` returns at once while tokens are left, and otherwise waits for the next one; the
    bucket fills again at ``qps`` tokens a second up to ``burst``. Threads share it fairly: each
    reserves its token under the lock and waits outside it.
    """

    def __init__(self, qps, burst, clock=time.monotonic, sleep=time.sleep):
        if qps <= 0 or burst < 1:
            raise ValueError("a rate limit needs qps > 0 and burst >= 1 (got qps %r, burst %r)" % (qps, burst))
        self.qps, self.burst = float(qps), int(burst)
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()
        self._tokens = float(self.burst)
        self._at = clock()
        self.waited_s = 0.0      # time callers spent waiting, in all
        self.throttled = 0       # calls that had to wait

    def _refill(self):
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.qps)
        self._at = now

    def try_take(self):
        """Takes one token when one is left, without waiting; whether it did."""
        with self._lock:
            self._refill()
            if self._tokens < 1.0:
                return False
            self._tokens -= 1.0
            return True

    def take(self):
        """Takes one token, waiting for it when none is left; the seconds waited."""
        with self._lock:
            self._refill()
            self._tokens -= 1.0   # below 0: reserved ahead, paid for by the wait
            wait = -self._tokens / self.qps if self._tokens < 0 else 0.0
            if wait:
                self.throttled += 1
                self.waited_s += wait
        if wait:
            self._sleep(wait)
        return wait
