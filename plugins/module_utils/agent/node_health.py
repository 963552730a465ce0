# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The agent's word on its own Node: the GPUHealthy condition, its Events, and the optional taint (private)."""

from __future__ import annotations

import logging
import time

from ansible_collections.scv.gpu.plugins.module_utils.agent.condition import (
    condition_patch,
    current_condition,
    gpu_condition,
)
from ansible_collections.scv.gpu.plugins.module_utils.agent.node_events import EventRecorder
from ansible_collections.scv.gpu.plugins.module_utils.kube.errors import ApiError, retry_on_conflict
from ansible_collections.scv.gpu.plugins.module_utils.scv.status import now_rfc3339

LOG = logging.getLogger("scv-gpu-agent")
CONDITION_HEARTBEAT_S = 300.0
# A missing Node (not registered yet, or deleted) is looked for this often: one GET, until it is there.
NODE_LOOKUP_S = 10.0
TAINT_KEY = "scv.gpu/gpu-unhealthy"
COMPONENT = "scv-gpu-agent"


class NodeCondition:
    """Sets GPUHealthy on the node's own Node when it changed (or every CONDITION_HEARTBEAT_S), with an
    Event on each change of status or reason. API errors are logged and tried again at the next tick."""

    def __init__(self, client, node, counters):
        self.client = client
        self.node = node
        self.counters = counters
        self.condition = None          # (status, reason, message) as last written or read from the Node
        self.condition_since = None    # its lastTransitionTime
        self.written_at = None
        self.node_missing_since = None   # when the Node was last found missing
        self.events = EventRecorder(client, node, counters, COMPONENT)

    def update(self, facts):
        wanted = gpu_condition(facts)
        now_s = time.monotonic()
        try:
            if self.condition is None and not self._read_current(now_s):
                return
            heartbeat_due = self.written_at is None or now_s - self.written_at >= CONDITION_HEARTBEAT_S
            if wanted == self.condition and not heartbeat_due:
                return
            self._write(wanted, now_s)
        except ApiError as error:
            self.counters.bump("errors")
            if error.status == 404:
                # The Node was deleted: look for it again (it may come back) instead of writing at every tick.
                self.condition, self.node_missing_since = None, None
                self._missing(now_s)
                return
            LOG.warning("%s", error)

    def _read_current(self, now_s):
        """Reads the condition as the Node has it; False when there is no Node (looked for again later)."""
        if self.node_missing_since is not None and now_s - self.node_missing_since < NODE_LOOKUP_S:
            return False   # no Node yet: look again later, not at every tick
        node = self.client.get_node(self.node)
        if node is None:
            self._missing(now_s)
            return False
        if self.node_missing_since is not None or self.written_at is not None:
            LOG.info("Node %s is there: setting its GPUHealthy condition", self.node)
        self.node_missing_since = None
        existing = current_condition(node)
        if existing:
            self.condition = (existing.get("status"), existing.get("reason"), existing.get("message"))
            self.condition_since = existing.get("lastTransitionTime")
        else:
            self.condition = (None, None, None)
        return True

    def _missing(self, now_s):
        if self.node_missing_since is None:
            LOG.warning("there is no Node %s: the GPUHealthy condition is not set; looking again every %d s",
                        self.node, NODE_LOOKUP_S)
        self.node_missing_since = now_s

    def _write(self, wanted, now_s):
        now = now_rfc3339()
        transition = wanted[:2] != self.condition[:2]
        since = now if wanted[0] != self.condition[0] or not self.condition_since else self.condition_since
        node = self.client.patch_node_status(self.node, condition_patch(*wanted, now=now, transition_time=since))
        self.counters.bump("condition_writes")
        previous, self.condition, self.condition_since = self.condition, wanted, since
        self.written_at = now_s
        if transition:
            LOG.info("Node %s: GPUHealthy is %s (%s): %s", self.node, *wanted)
            if previous[0] is not None or wanted[0] != "True":
                self.events.record(node, *wanted, now=now)


class NodeTaint:
    """Puts ``scv.gpu/gpu-unhealthy:NoSchedule`` on the Node while GPUHealthy is False, and takes it off after.

    NodeRestriction forbids a node's own identity to change its taints, so this runs with
    ``client``, another identity. Other taints are kept. The write carries the Node's
    resourceVersion; a conflict reads the Node again (``retry_on_conflict``), and any other
    failure is tried again at the next tick.
    """

    def __init__(self, client, node, counters):
        self.client = client
        self.node = node
        self.counters = counters
        self.tainted = None   # whether our taint is on the Node, None until known

    def update(self, facts):
        wanted = gpu_condition(facts)[0] == "False"
        if wanted == self.tainted:
            return
        try:
            if retry_on_conflict(lambda: self._set(wanted)):
                self.tainted = wanted
        except ApiError as error:
            self.counters.bump("errors")
            LOG.warning("%s", error)

    def _set(self, wanted):
        """One read-decide-patch cycle; False when there is no Node."""
        node = self.client.get_node(self.node)
        if node is None:
            return False
        taints = list((node.get("spec") or {}).get("taints") or [])
        ours = [taint for taint in taints if taint.get("key") == TAINT_KEY]
        others = [taint for taint in taints if taint.get("key") != TAINT_KEY]
        if bool(ours) != wanted:
            if wanted:
                others.append({"key": TAINT_KEY, "effect": "NoSchedule"})
            self.client.patch_node(self.node, {
                "metadata": {"resourceVersion": node["metadata"]["resourceVersion"]},
                "spec": {"taints": others or None}})
            self.counters.bump("taint_changes")
            LOG.info("Node %s: %s the taint %s:NoSchedule", self.node, "set" if wanted else "removed", TAINT_KEY)
        return True
