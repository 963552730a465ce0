# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Which pods hold each GPU, for the ``pod``, ``namespace`` and ``container`` labels of its series (private).

A thread of its own asks the kubelet's pod-resources API every ``interval_s`` seconds, each call
bounded by ``timeout_s``, so a missing or slow kubelet never holds up a tick or a scrape. While the
kubelet cannot be read, no series carries pod labels (stale ones would name a pod that has ended);
the reason is logged when it first appears and when it clears.

Device IDs are read as NVIDIA's device plugin hands them out: a GPU's UUID, its index (the
plugin's ``index`` strategy), a MIG device's UUID (``MIG-...``, counted on the GPU it is part of),
each possibly followed by ``::N``, the replica of a GPU shared by time-slicing. A GPU several
containers share has one series per container, each with the GPU's whole value, as NVML cannot
split a GPU's readings by process group.
"""

from __future__ import annotations

import logging
import threading

from ansible_collections.scv.gpu.plugins.module_utils.kube.podresources import (
    UNCHANGED,
    PodResourcesError,
    PodResourcesLister,
)

LOG = logging.getLogger("scv-gpu-agent")
# Resources of NVIDIA's device plugin: nvidia.com/gpu, its renamed shares and nvidia.com/mig-<profile>.
RESOURCE_PREFIX = "nvidia.com/"
MIG_PREFIX = "MIG-"


def device_holders(held):
    """{device id without its replica suffix: sorted [(pod, namespace, container)]} of NVIDIA's resources.
    Devices with the same holders share one list: a container holding thousands costs one."""
    holders = {}
    for entry in held:
        if not entry["resource"].startswith(RESOURCE_PREFIX):
            continue
        holder = (entry["pod"], entry["namespace"], entry["container"])
        for device in entry["device_ids"]:
            holders.setdefault(device.split("::", 1)[0], set()).add(holder)
    shared = {}
    return {device: shared.setdefault(frozenset(found), sorted(found)) for device, found in holders.items()}


class PodAttribution(threading.Thread):
    """Keeps ``holders`` (see ``device_holders``) current from the kubelet's pod-resources socket."""

    def __init__(self, socket_path, interval_s, stopping, timeout_s=2.0, lister=None):
        super().__init__(name="pod-resources", daemon=True)
        self.socket_path, self.interval_s, self.timeout_s = socket_path, interval_s, timeout_s
        self.stopping = stopping
        self.lister = PodResourcesLister() if lister is None else lister
        self.holders = {}
        self._worked = {}         # the holders of the last answer read whole, which UNCHANGED stands for
        self.refreshes, self.failures = 0, 0
        self.problem = None
        self._mig_parents = {}    # MIG device UUID: its GPU's UUID (None: not on this node, see resolve)
        self._resolved = None     # (holders, generation) that _mig_parents was worked out for
        self._lock = threading.Lock()

    def run(self):
        while not self.stopping.is_set():
            self.refresh()
            self.stopping.wait(self.interval_s)

    def refresh(self):
        """One question to the kubelet. Whatever goes wrong (an answer not even the decoder foresaw included)
        clears every pod label and is asked again at the next interval: the thread never ends early."""
        try:
            answer = self.lister(self.socket_path, self.timeout_s)
            # the same answer as the last one read whole: its holders, as they were worked out then
            holders = self._worked if answer is UNCHANGED else device_holders(answer)
            self._worked = holders
        except Exception as error:  # pylint: disable=broad-exception-caught
            holders = {}
            self.failures += 1
            problem = str(error) if isinstance(error, PodResourcesError) else (
                "the kubelet's pod-resources answer could not be read (%s: %s)" % (type(error).__name__, error))
            if problem != self.problem:
                LOG.warning("pod labels left off GPU series: %s", problem,
                            exc_info=not isinstance(error, PodResourcesError))
            self.problem = problem
        else:
            if self.problem is not None:
                LOG.info("pod labels back on GPU series: the kubelet's pod-resources API answers again")
            self.problem = None
        with self._lock:
            self.holders = holders
        self.refreshes += 1

    def resolve(self, parent_of, generation=0):
        """Learns the GPU of each MIG device a pod holds with ``parent_of(mig uuid)`` (a GPU UUID, or None),
        in the thread that reads NVML; forgets the devices no pod holds any more.

        A device NVML does not know here (another node's, or one of a layout not made yet) is remembered as
        foreign, and asked about again only when ``generation`` changes: the agent passes the count of its
        static reads, which a SIGHUP, a new NVML session and the static refresh interval move on. A busy
        kubelet naming thousands of such devices then costs NVML nothing at a tick."""
        with self._lock:
            holders = self.holders
            if self._resolved is not None and self._resolved[0] is holders and self._resolved[1] == generation:
                return
            fresh = self._resolved is None or self._resolved[1] != generation
            held = [device for device in holders if device.startswith(MIG_PREFIX)]
            known = {device: self._mig_parents[device] for device in held
                     if device in self._mig_parents and not (fresh and self._mig_parents[device] is None)}
        for device in held:
            if device not in known:
                known[device] = parent_of(device)
        with self._lock:
            self._mig_parents = known
            self._resolved = (holders, generation)

    def counters(self):
        return {"scv_agent_pod_resources_reads": self.refreshes, "scv_agent_pod_resources_failures": self.failures}

    def by_card(self, cards):
        """{card id: [(pod, namespace, container)]} for the cards some container holds."""
        with self._lock:
            holders, parents = self.holders, dict(self._mig_parents)
        found = {}
        for device, holding in holders.items():
            key = parents.get(device) if device.startswith(MIG_PREFIX) else device
            if key is not None:
                found.setdefault(key, set()).update(holding)
        result = {}
        for card in cards:
            holding = found.get(card.get("uuid"), set()) | found.get(str(card.get("id")), set())
            if holding:
                result[card.get("id")] = sorted(holding)
        return result
