# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The Scv agent's loop: keeps one node's Scv current between playbook runs (private to the collection).

Every ``spec.updateInterval`` milliseconds it reads NVML through an ``nvml.session.Session`` (the
code behind gpu_facts, with NVML kept initialised and each card's static readings read once) and
writes the status subresource only when SCV's compared data changed (``agent.scv_writer``, which
also stops writing against another writer). The last object written is kept in memory, so an
unchanged tick costs no API request. A watch on the node's own Scv
brings spec changes and deletions; a deleted Scv is created again at the next tick. API errors
back off and retry; GPU errors become Unhealthy cards; XIDs wake the loop at once.
"""

from __future__ import annotations

import logging
import threading
import time

from ansible_collections.scv.gpu.plugins.module_utils.agent import metrics
from ansible_collections.scv.gpu.plugins.module_utils.agent.counters import Counters
from ansible_collections.scv.gpu.plugins.module_utils.agent.node_health import NodeCondition, NodeTaint
from ansible_collections.scv.gpu.plugins.module_utils.agent.pod_attribution import NoPods
from ansible_collections.scv.gpu.plugins.module_utils.agent.readings import Readings
from ansible_collections.scv.gpu.plugins.module_utils.agent.scv_writer import ScvWriter
from ansible_collections.scv.gpu.plugins.module_utils.agent.wakeup import Wakeup
from ansible_collections.scv.gpu.plugins.module_utils.agent.watch import MAX_BACKOFF_S, ScvState, ScvWatch
from ansible_collections.scv.gpu.plugins.module_utils.agent.xid import XidPolicy
from ansible_collections.scv.gpu.plugins.module_utils.common.backoff import pause
from ansible_collections.scv.gpu.plugins.module_utils.kube.errors import ApiError
from ansible_collections.scv.gpu.plugins.module_utils.scv.resource import DEFAULT_UPDATE_INTERVAL_MS

LOG = logging.getLogger("scv-gpu-agent")
MIN_INTERVAL_MS = 100
# How long one wait for NVML's events lasts. An XID ends it at once, so this bounds only how soon a new
# NVML session gets the lock the wait holds: after a new driver, or a card lost without an XID (the main
# loop waits for it then). Each wait that ends empty costs about 0.2 ms of CPU: 0.02 % of a core at 1 s,
# 0.01 % at 2 s. NVIDIA's device plugin waits 5 s, which would hold a new session up to 5 s.
XID_WAIT_MS = 2000


class XidWaiter(threading.Thread):
    """Blocks on NVML's events; an XID wakes the loop at once, so it reaches the Scv and the Node within a tick."""

    def __init__(self, session, counters, wake, stopping):
        super().__init__(name="nvml-events", daemon=True)
        self.session, self.counters, self.wake, self.stopping = session, counters, wake, stopping

    def run(self):
        while not self.stopping.is_set():
            try:
                event = self.session.wait_event(XID_WAIT_MS)
            except Exception as error:  # pylint: disable=broad-exception-caught
                LOG.warning("waiting for NVML events failed: %s", error)
                self.stopping.wait(1)
                continue
            if event is not None:
                index, xid = event
                self.counters.bump("xid_events")
                LOG.warning("XID %d on GPU %s", xid, index)
                self.wake.set()


def chosen_series(config):
    """The DCGM series the configuration's counters file chose (None: every one is served); its names that this
    agent does not serve are warned about."""
    if config.counters is None:   # read and checked once, by configuration.load
        return None
    series, unknown = config.counters
    if unknown:
        LOG.warning("%s names series this agent does not serve (left out): %s", config["counters-file"],
                    ", ".join(unknown))
    if not series:
        LOG.warning("%s names no series this agent serves: no DCGM series is served (name some, or leave "
                    "counters-file empty to serve every one)", config["counters-file"])
    return series


class Agent:
    """One node's publishing loop.

    ``client`` is a ``kube.rest_client.RestClient`` for Scv objects (or has its methods, ``contact``,
    ``limiter``, ``requests`` and ``reloads``); ``taint_client`` one allowed to taint Nodes, or None; ``notify``
    takes systemd's notification words (``agent.sdnotify``). ``pods`` (an ``agent.pod_attribution``; NoPods:
    none named), ``pod_metadata`` (None: no pod UID or labels) and ``shares`` (None: no GPU split per pod) take
    ``stopping``, the event that ends the agent, made here when not given.
    """

    def __init__(self, client, node, session, default_interval_ms=DEFAULT_UPDATE_INTERVAL_MS, watch_timeout=300,
                 metrics=False, xid_policy=None, node_condition=True, taint_client=None, notify=None,
                 pods=None, pod_metadata=None, shares=None, stopping=None):
        self.client = client
        self.node = node
        self.session = session
        self.default_interval_ms = default_interval_ms
        self.pods = pods or NoPods()
        self.pod_metadata = pod_metadata
        self.readings = Readings(session, xid_policy or XidPolicy(), metrics, pods=self.pods, shares=shares)
        self.dcgm_series = None        # the DCGM series a counters file chose (None: every one served)
        self.xid_policy = self.readings.xid_policy
        self.counters = Counters()
        self.notify = notify or (lambda *_words: None)
        self.failures = 0
        self.published_at = None      # time.time() of the last tick that wrote the Scv or found it current
        self.state = ScvState()
        self.wake = Wakeup()              # set from other threads and from signal handlers
        self.stopping = stopping or threading.Event()
        self.watch = ScvWatch(client, node, self.state, self.wake, self.stopping, watch_timeout)
        self.writer = ScvWriter(client, node, self.state, self.counters)
        self.condition = NodeCondition(client, node, self.counters) if node_condition else None
        self.taint = NodeTaint(taint_client, node, self.counters) if taint_client is not None else None
        self.last_tick_at = None      # time.monotonic() of the last tick that ended
        self._reload = None           # a function that applies a new configuration, set by SIGHUP
        self._xid_waiter = None

    def configure(self, config):
        """The reloadable settings of ``config`` (an agent.config.Config), into each part: at start and at SIGHUP."""
        self.default_interval_ms = config["default-interval"]
        self.dcgm_series = chosen_series(config)
        # What no series serves is not read: the energy alone costs 4.3 ms a GPU on an H100.
        self.session.static_refresh_s = config["static-refresh"]
        self.session.slow.configure(config["counters-interval"], metrics.served_fields(self.dcgm_series))
        self.watch.configure(config["watch-timeout"])
        self.xid_policy.configure(config["xid-actions"], config["xid-hold"])
        self.pods.configure(config["pod-resources-interval"])
        if self.readings.shares is not None:
            self.readings.shares.configure(config["pod-utilization"])

    # ------------------------------------------------------------------ loop

    def interval_s(self):
        interval = self.state.interval()
        if not isinstance(interval, int) or isinstance(interval, bool):
            interval = self.default_interval_ms
        return max(interval, MIN_INTERVAL_MS) / 1000.0

    def run(self, watchdog_s=None):
        """Ticks until stopped; tells systemd it is ready after the first tick, and pings its watchdog.

        ``watchdog_s`` (systemd's WatchdogSec) bounds every wait to half of it, so a tick that
        hangs is the only thing that keeps the watchdog from being fed.
        """
        LOG.info("publishing Scv %s to %s", self.node, self.client.server)
        self._xid_waiter = XidWaiter(self.session, self.counters, self.wake, self.stopping)
        self._xid_waiter.start()
        self.pods.start()
        if self.pod_metadata is not None:
            self.pod_metadata.start()
        ready = False
        while not self.stopping.is_set():
            self.wake.clear()
            reload = self._reload
            if reload is not None:
                self._reload = None
                reload()
                self.notify("READY=1")
            delay = self.tick()
            if not ready:
                self.notify("READY=1", "STATUS=publishing Scv %s" % self.node)
                ready = True
            self._sleep(delay, watchdog_s)
        self.notify("STOPPING=1")
        if self._xid_waiter is None or not self._xid_waiter.is_alive():
            self.readings.close()
        # else the waiter is inside a wait of up to XID_WAIT_MS, holding NVML: the process's exit releases it,
        # where shutting NVML down first would keep systemd waiting for the wait to end.
        LOG.info("stopped")

    def _sleep(self, delay, watchdog_s):
        deadline = time.monotonic() + delay
        while True:
            self.notify("WATCHDOG=1")
            left = deadline - time.monotonic()
            if left <= 0 or self.stopping.is_set():
                return
            if self.wake.wait(min(left, watchdog_s / 2.0) if watchdog_s else left):
                return

    def stop(self, *_args):
        """Ends the loop; SIGTERM's handler. It takes no lock the main thread may hold (``stopping`` is
        only ever looked at, never waited on, in the main thread)."""
        self.stopping.set()
        self.wake.set()

    def request_reload(self, apply):
        """Runs ``apply()`` in the loop's thread before its next tick, which comes at once."""
        self._reload = apply
        self.notify("RELOADING=1")
        self.wake.set()

    def tick(self):
        """One round; returns the seconds until the next."""
        self.counters.bump("ticks")
        try:
            facts = self.readings.tick()
        except Exception as error:  # pylint: disable=broad-exception-caught
            # nvml turns GPU errors into Unhealthy cards; anything else must not end the agent.
            LOG.error("reading NVML failed: %s", error)
            self.counters.bump("errors")
            self.readings.close()
            return self._ticked(self.interval_s())
        # Each step may wait out a request timeout: systemd hears that the agent is alive between them.
        for step in (self.condition, self.taint):
            if step is not None:
                self.notify("WATCHDOG=1")
                step.update(facts)
        self.notify("WATCHDOG=1")
        try:
            self.writer.publish(facts, self.default_interval_ms)
        except ApiError as error:
            self.counters.bump("errors")
            self.failures += 1
            # Agents that lost the API server together come back spread over the pause, not in step.
            backoff = pause(self.failures + 1, self.interval_s(), MAX_BACKOFF_S)
            LOG.warning("%s; trying again in %.1f s", error, backoff)
            return self._ticked(backoff)
        if self.failures:
            LOG.info("the API server answers again")
        self.failures = 0
        # The Scv was written, or found current: the held object is current only while the watch reaches the server.
        if self.client.contact.failing_since is None:
            self.published_at = time.time()
        self.watch.ensure()
        return self._ticked(self.interval_s())

    def _ticked(self, delay):
        self.last_tick_at = time.monotonic()
        return delay

    # ------------------------------------------------------- what others read

    def snapshot(self):
        """What the metrics serve, read at one instant: facts, last XIDs and every counter."""
        facts, now = self.readings.facts(), self.session.clock()
        values = {"scv_agent_%s" % name: value for name, value in self.counters.values().items()}
        values.update(
            scv_agent_api_requests=self.client.requests,
            scv_agent_api_throttled=self.client.limiter.throttled,
            scv_agent_api_throttled_seconds=self.client.limiter.waited_s,
            scv_agent_credential_reloads=self.client.reloads,
            scv_agent_nvml_inits=self.session.inits,
            scv_agent_nvml_static_reads=self.session.static_reads,
            scv_agent_nvml_counter_reads=self.session.slow.reads,
            scv_agent_nvml_seconds=self.readings.seconds,
            scv_agent_nvml_scrape_reads=self.readings.scrape_reads,
            scv_agent_api_failures=self.client.contact.failed_total,
        )
        cards = (facts or {}).get("cardList") or []
        pods, instance_pods = self.pods.by_card(cards), self.pods.by_instance(cards)
        values.update(self.pods.counters())
        metadata = self.pod_metadata if pods is not None else None
        values.update({} if metadata is None else metadata.counters())
        shares = self.readings.shares
        if shares is not None:
            values["scv_agent_shared_gpu_reads"] = shares.reads
        return {"node": self.node, "facts": facts, "last_xids": self.session.xids.last(), "counters": values,
                "served": self.dcgm_series, "pods": pods, "contested": self.writer.contest.contested(),
                "shares": None if shares is None else shares.last, "instances": self.readings.instances,
                "instance_pods": instance_pods,
                "instance_replicas": self.pods.replicas_by_instance(cards),
                "dra": self.pods.dra_labels(cards),
                "pod_extra": None if metadata is None else metadata.extra(pods, instance_pods),
                "lost": self.session.lost.last, "published_at": self.published_at,
                "api_failures_in_a_row": self.client.contact.failures,
                "critical_xids": {card.get("id"): self.xid_policy.critical(self.session.xids, card.get("id"), now)
                                  for card in cards}}

    def healthz(self, now=None):
        """(healthy, detail): healthy while ticks keep coming, at most max(60 s, 3 intervals) apart."""
        now = time.monotonic() if now is None else now
        grace = max(2 * MAX_BACKOFF_S, 3 * self.interval_s())   # twice the longest backoff
        if self.last_tick_at is None:
            return True, "starting"
        age = now - self.last_tick_at
        if age > grace:
            return False, "no tick for %.0f s (more than %.0f s)" % (age, grace)
        # A tick writes only what changed: the API server's state comes from every request, the watch's too.
        return True, "last tick %.1f s ago; %s" % (age, self.client.contact.describe())
