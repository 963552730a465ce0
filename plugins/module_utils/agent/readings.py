# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What the agent reads from NVML, and when (private to the collection).

A tick reads what the Scv and the health check need: memory, the health counters, the recovery
action. The series that only Prometheus reads are read when it asks for them, in the scrape's own
thread: the telemetry (temperature, utilization, power, clocks, codecs, memory temperature) at each
scrape, fresh, and the costly counters (energy, GPM, ...) at most once per counters interval as
well (``nvml.slow_readings.SlowReadings``). Between scrapes the last telemetry is kept on the cards, so
the metrics always show every series. One lock keeps the two threads' NVML reads apart.
"""

from __future__ import annotations

import logging
import threading
import time

from ansible_collections.scv.gpu.plugins.module_utils.agent.pod_attribution import NoPods
from ansible_collections.scv.gpu.plugins.module_utils.nvml.series import fact_keys

LOG = logging.getLogger("scv-gpu-agent")
# What the telemetry subset adds to a card: the series read fresh at each scrape.
TELEMETRY_KEYS = fact_keys("scrape")


class Readings:
    """The agent's reads of ``session``; ``metrics`` says whether anyone reads more than the Scv needs."""

    def __init__(self, session, xid_policy, metrics=False, pods=None, shares=None):
        self.session = session
        self.xid_policy = xid_policy
        self.metrics = metrics
        self.pods = pods or NoPods()   # an agent.pod_attribution.PodAttribution: its MIG devices are resolved here
        self.shares = shares       # an agent.shares.PodShares, or None: shared GPUs' processes are read at scrapes
        self.seconds = 0.0         # spent reading NVML, ticks and scrapes
        self.scrape_reads = 0
        self._facts = None
        self.instances = {}        # card index: its GPU instances' readings (MIG on), as the last scrape read them
        self._telemetry = {}       # card UUID: the telemetry last read
        self._lock = threading.Lock()

    def facts(self):
        return self._facts

    def tick(self):
        """A tick's read: the Scv's and the health check's, and the costly counters if a scrape left them due."""
        return self._read(["counters", "fabric"] if self.metrics else ["fabric"])

    def scrape(self):
        """A scrape's read: the telemetry, fresh, and the costly counters when due; errors are logged."""
        self.session.slow.ask()
        try:
            facts = self._read(["telemetry", "counters", "fabric"])
            self.scrape_reads += 1
            self._read_instances(facts.get("cardList") or [])
            if self.shares is not None:
                self._read_shares(facts.get("cardList") or [])
        except Exception as error:  # pylint: disable=broad-exception-caught
            LOG.error("reading NVML for a scrape failed (the last readings are served): %s", error)

    def _read_instances(self, cards):
        """The GPU instances of the GPUs with MIG on, for their own series (``nvml.mig_instances``)."""
        self.instances = self._timed(self.session.mig.read, self.session, cards)

    def _read_shares(self, cards):
        """Each pod's part of the shared GPUs, with the telemetry just read (an idle GPU needs no samples)."""
        self._timed(self.shares.read, self.session, cards)

    def _timed(self, read, *args):
        """``read(*args)`` under the reading lock, its time counted as NVML's."""
        with self._lock:
            started = time.perf_counter()
            try:
                return read(*args)
            finally:
                self.seconds += time.perf_counter() - started

    def close(self):
        """Shuts NVML down between reads (the next read starts it again)."""
        with self._lock:
            self.session.close()

    def _read(self, subsets):
        with self._lock:
            inits = self.session.inits
            started = time.perf_counter()
            try:
                facts = self.session.read(subsets)
            finally:
                self.seconds += time.perf_counter() - started
            if self.session.inits > inits > 0:
                LOG.warning("NVML initialised anew: %s", self.session.last_reinit_reason)
            self._keep_telemetry(facts.get("cardList") or [], "telemetry" in subsets)
            self.xid_policy.apply(facts, self.session.xids, self.session.clock())
            cards = facts.get("cardList") or []
            self.pods.learn(cards, lambda: self.session.mig.devices(self.session, cards), self.session.static_reads,
                            lambda: self.session.mig.placements(self.session, cards))
            self._facts = facts
            return facts

    def _keep_telemetry(self, cards, fresh):
        if fresh:
            self._telemetry = {card.get("uuid"): {key: card[key] for key in TELEMETRY_KEYS if key in card}
                               for card in cards}
            return
        for card in cards:
            card.update(self._telemetry.get(card.get("uuid"), {}))
