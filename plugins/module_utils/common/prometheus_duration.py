# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Prometheus's duration grammar, as its rule files read ``for:`` and range selectors (private to the collection).

Prometheus parses a duration (prometheus/common model.ParseDuration) as "0", or as units in a fixed order, each at
most once: years, weeks, days, hours, minutes, seconds, milliseconds ("1h30m", not "30m1h" nor "1m1m"); its whole
text must match, a trailing newline included. The total must fit a signed 64-bit count of nanoseconds.
"""

from __future__ import annotations

import re

_DURATION = re.compile(r"(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?")
_MS = 1000 * 1000                         # nanoseconds
_UNITS = (365 * 24 * 3600 * 1000 * _MS, 7 * 24 * 3600 * 1000 * _MS, 24 * 3600 * 1000 * _MS, 3600 * 1000 * _MS,
          60 * 1000 * _MS, 1000 * _MS, _MS)
_LIMIT = 2 ** 63 - 1


def duration_problem(text):
    """Why Prometheus refuses ``text`` as a duration; None when it takes it."""
    if not isinstance(text, str):
        return "%r is not a Prometheus duration, which is text such as 30s, 5m or 1h30m" % (text,)
    if text == "0":
        return None
    found = _DURATION.fullmatch(text)
    if not text or found is None or not any(found.groups()):
        return ("%r is not a Prometheus duration: units in the order y, w, d, h, m, s, ms, each at most once, each "
                "after a whole number (such as 30s, 5m or 1h30m)" % text)
    total = sum(int(count) * unit for count, unit in zip(found.groups(), _UNITS) if count)
    if total > _LIMIT:
        return "%r is out of Prometheus's duration range (at most about 292 years)" % text
    return None
