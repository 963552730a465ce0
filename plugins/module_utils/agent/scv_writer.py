# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Writing this node's Scv: only what changed, and never against another writer (private).

``ScvWriter`` writes the status subresource only when SCV's compared data changed, from the object
last written or watched (an unchanged tick costs no request), and falls back to ``scv.publisher``'s
read-compare-write cycle when that object moved on (409) or went (404).

Two agents that publish under one node name (an inventory that names two hosts alike, a cloned VM)
each find the other's status wrong at every tick and write their own back. A status write that is
not the agent's own and differs from what the agent last wrote is counted; LIMIT of them within
WINDOW_S make the Scv contested. The agent then says so once (a warning naming the other writer, a
Warning Event on the Scv, ``scv_agent_scv_contested`` 1) and writes nothing for HOLD_S seconds.
A playbook's run of the scv module now and then is one write, and no contest.
"""

from __future__ import annotations

import collections
import logging
import time

from ansible_collections.scv.gpu.plugins.module_utils.agent.condition import core_event
from ansible_collections.scv.gpu.plugins.module_utils.agent.node_health import COMPONENT
from ansible_collections.scv.gpu.plugins.module_utils.kube.errors import ApiError
from ansible_collections.scv.gpu.plugins.module_utils.scv.publisher import publish, write_status
from ansible_collections.scv.gpu.plugins.module_utils.scv.status import desired_status, needs_update, now_rfc3339

LOG = logging.getLogger("scv-gpu-agent")
LIMIT = 3
WINDOW_S = 300.0
HOLD_S = 300.0


def _version(scv):
    return ((scv or {}).get("metadata") or {}).get("resourceVersion")


def last_status_writer(scv):
    """The field manager that last wrote the status of ``scv``, from its managedFields, or None."""
    entries = [entry for entry in ((scv or {}).get("metadata") or {}).get("managedFields") or []
               if isinstance(entry, dict) and entry.get("subresource") == "status"]
    entries.sort(key=lambda entry: str(entry.get("time") or ""))
    return entries[-1].get("manager") if entries else None


class Contest:
    """Whether the agent may write its Scv's status, given what others wrote to it."""

    def __init__(self, counters, clock=time.monotonic):
        self.counters = counters
        self._clock = clock
        self._known = None                   # (resourceVersion, status) written by the agent or already counted
        self._foreign = collections.deque()  # clock times of the other writes within WINDOW_S
        self.until = None                    # while contested: the clock time the agent writes again
        self.writer = None                   # the field manager of the last other write, when it names one

    def wrote(self, scv):
        """The agent's own write, as the API server answered it."""
        self._known = (_version(scv), (scv or {}).get("status"))

    def contested(self):
        return self.until is not None

    def may_write(self, current):
        """Whether a status write over ``current`` (the Scv as watched) may go out now. Returns
        (allowed, started): ``started`` is True once, when this call made the Scv contested."""
        now = self._clock()
        if self._known is not None and _version(current) != self._known[0] and \
                current.get("status") != self._known[1]:
            self._known = (_version(current), current.get("status"))
            self._foreign.append(now)
            self.writer = last_status_writer(current) or self.writer
            self.counters.bump("scv_foreign_writes")
        while self._foreign and self._foreign[0] < now - WINDOW_S:
            self._foreign.popleft()
        if self.until is not None and now >= self.until:
            self.until = None
            self._foreign.clear()
            LOG.info("writing the Scv status again after %.0f s held", HOLD_S)
        if self.until is None and len(self._foreign) >= LIMIT:
            self.until = now + HOLD_S
            return False, True
        return self.until is None, False

    def message(self, node):
        return ("another writer%s changed the status of Scv %s %d times in %.0f s, each time to other readings than "
                "this agent's: are two hosts publishing as node %s (a node name used twice in the inventory, a cloned "
                "machine)? This agent writes nothing for %.0f s" % (
                    " (%s)" % self.writer if self.writer else "", node, len(self._foreign), WINDOW_S, node, HOLD_S))


def contest_event(scv, node, message, now):
    """A core/v1 Warning Event on the Scv object for a contest that began."""
    involved = {"apiVersion": (scv or {}).get("apiVersion", "core.run-linux.com/v1"), "kind": "Scv", "name": node,
                "uid": ((scv or {}).get("metadata") or {}).get("uid")}
    return core_event(involved, "Warning", "ScvContested", message, now, COMPONENT)


class ScvWriter:
    """Keeps ``state`` (an ``agent.watch.ScvState``) and the Scv of ``node`` in step with the readings."""

    def __init__(self, client, node, state, counters):
        self.client, self.node, self.state, self.counters = client, node, state, counters
        self.contest = Contest(counters)
        self._unchanged = None        # (Scv object, cardList) of the last tick that found no write due

    def publish(self, facts, default_interval_ms):
        """Writes the status when it changed: from the object held when there is one, else by reading it
        (creating the Scv with ``default_interval_ms`` when there is none).

        A write that meets a changed (409) or deleted (404) object falls back to ``publish``,
        the read-compare-write cycle with the collection's one conflict policy.
        """
        current, recreate = self.state.get()
        if current is not None and not recreate:
            cards = facts.get("cardList")
            if self._unchanged is not None and self._unchanged[0] is current and self._unchanged[1] == cards:
                return   # the same readings against the same object: still nothing to write (most ticks)
            desired = desired_status(facts)
            if not needs_update(current.get("status"), desired):
                self._unchanged = (current, cards)
                return
            if not self._may_write(current):
                return
            try:
                written = write_status(self.client, current, dict(desired, updateTime=now_rfc3339()))
                self.state.set(written)
                self.contest.wrote(written)
                self.counters.bump("writes")
                LOG.info("wrote the status of Scv %s", self.node)
                return
            except ApiError as error:
                if error.status not in (404, 409):
                    raise
                LOG.info("%s; reading it again", error)
        result = publish(self.client, self.node, facts, default_interval_ms)
        self.state.set(result["scv"])
        self.contest.wrote(result["scv"])
        if result["created"]:
            self.counters.bump("creates")
            LOG.info("created Scv %s", self.node)
        if result["status_updated"]:
            self.counters.bump("writes")

    def _may_write(self, current):
        allowed, started = self.contest.may_write(current)
        if started:
            message = self.contest.message(self.node)
            LOG.warning("%s", message)
            try:
                self.client.create_event(contest_event(current, self.node, message, now_rfc3339()))
                self.counters.bump("events")
            except ApiError as error:
                LOG.warning("the Event saying so could not be created: %s", error)
        return allowed
