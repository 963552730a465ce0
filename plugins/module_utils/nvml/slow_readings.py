# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The costly readings of a long-lived NVML session, read on a cadence of their own (private).

The ``counters`` subset (energy, PCIe replays, NVLink traffic, vGPU licence) and GPM cost far more
than a tick's other readings: on an H100 the energy field alone takes 4.3 ms, a GPM sample 0.18 ms.
Their consumers are Prometheus scrapes, every 15 to 60 s. So a session reads them every ``interval_s``
seconds (60 by default: dcgm-exporter collects every 30 s, but on 8 H100s the energy alone is then
0.115 % of a core, and with 56 MIG instances the NVML reads alone at a 30 s cadence reach the agent's
0.3 % budget) and repeats the last values between.

With ``on_demand`` (the agent serving metrics), they are read at most once per scrape as well: after
the first read, only when someone asked for them (``ask()``, at each scrape) since the last. At a
30 s interval, a Prometheus that scrapes every 60 s costs half the reads of one scraping every 30 s;
nobody scraping costs none; a scrape sees what the tick after the previous scrape read.
"""

from __future__ import annotations

from ansible_collections.scv.gpu.plugins.module_utils.nvml import gpm
from ansible_collections.scv.gpu.plugins.module_utils.nvml.extras import COUNTER_KEYS

DEFAULT_INTERVAL_S = 60.0


class SlowReadings:
    """When the counters and GPM are due, and what they last gave per card."""

    def __init__(self, clock, interval_s=DEFAULT_INTERVAL_S, on_demand=False):
        self.clock = clock
        self.interval_s = interval_s
        self.on_demand = on_demand
        self.reads = 0
        self.wanted = None         # the counters' and GPM's fact keys someone serves (None: all)
        self._at = None
        self._asked = False
        self._kept = {}
        self._gpm = gpm.GpmActivity()

    def configure(self, interval_s, wanted=None):
        """How often they are read (the fabric follows), and which of their fact keys someone serves (None: all)."""
        self.interval_s, self.wanted = interval_s, wanted

    def due(self):
        """Whether this read takes them (and starts a new interval if so)."""
        now = self.clock()
        if self._at is not None and (now - self._at < self.interval_s or (self.on_demand and not self._asked)):
            return False
        self._at = now
        self._asked = False
        self.reads += 1
        return True

    def ask(self):
        """Someone (a scrape) read the values: with ``on_demand``, the next due read may take them."""
        self._asked = True

    def fill(self, index, handle, card, due, whole=True):
        """After ``card`` was read: GPM read and both kept when due, else the last values put in. ``whole``: the
        card may be sampled whole by GPM (not once it has GPU instances, each sampled on its own)."""
        if due:
            if handle is not None and whole and (self.wanted is None or self.wanted & set(gpm.KEYS)):
                self._gpm.read(index, handle, card)
            self._kept[index] = {key: card[key] for key in COUNTER_KEYS + gpm.KEYS if key in card}
            if "eccErrors" in card:
                self._kept[index]["eccErrors"] = dict(card["eccErrors"])
        else:
            kept = dict(self._kept.get(index, {}))
            if "eccErrors" in card and "eccErrors" in kept:
                # the health check read the uncorrected volatile count just now; the rest are the counters'
                kept["eccErrors"] = dict(kept["eccErrors"], **card["eccErrors"])
            card.update(kept)

    def free(self):
        """Forgets everything (before NVML shuts down): the next read takes them again."""
        self._gpm.free()
        self._kept = {}
        self._at = None
