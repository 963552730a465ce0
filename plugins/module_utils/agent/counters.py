# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The agent's own counters, bumped from its several threads (private)."""

from __future__ import annotations

import threading

# (name, help) of every counter, served as scv_agent_<name>_total.
COUNTERS = (
    ("ticks", "NVML reads."),
    ("writes", "Status writes."),
    ("creates", "Scv creations."),
    ("errors", "Failed reads or API calls."),
    ("condition_writes", "Writes of the GPUHealthy Node condition."),
    ("events", "Events emitted on GPUHealthy transitions (a repeated one counts once more on the existing Event)."),
    ("events_dropped", "Events not sent because the node's Event limit (25, then one per 5 minutes) was spent."),
    ("xid_events", "XID critical errors NVML reported."),
    ("taint_changes", "Times the unhealthy-GPU taint was set or removed."),
    ("reloads", "Times SIGHUP made the agent read its configuration again."),
    ("scv_foreign_writes", "Status writes to this node's Scv by another writer, with other readings than the agent's."),
)


class Counters:
    """Named counters; ``bump`` and ``values`` may be called from any thread."""

    def __init__(self):
        self._lock = threading.Lock()
        self._values = {name: 0 for name, _help in COUNTERS}

    def bump(self, name, amount=1):
        with self._lock:
            self._values[name] += amount

    def __getitem__(self, name):
        with self._lock:
            return self._values[name]

    def values(self):
        """{name: value}, read at one instant."""
        with self._lock:
            return dict(self._values)
