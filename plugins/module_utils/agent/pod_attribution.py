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
each possibly followed by ``::N``, the replica of a GPU shared by time-slicing or MPS. A GPU several
containers share has one series per container, each with the GPU's whole value, as NVML cannot
split most of a GPU's readings by process group; the replica numbers become the ``vgpu`` label, and
memory and utilization are split per pod by ``agent.shares``. With ``id_type`` device-name (the agent's
``kubernetes-gpu-id-type``, as dcgm-exporter's) GPUs are named as GKE's device plugin names them instead:
``nvidia<index>``, a replica ``/vgpu<n>``; a MIG device is found by its UUID or as ``nvidia<index>/gi<id>``
either way.

Pods that got a GPU or a MIG device through a Dynamic Resource Allocation claim of NVIDIA's DRA driver are named
the same way, with the claim's labels besides (see ``agent.dra_claims``).

Only this node's devices are kept: the thread that reads NVML tells (``learn``) which IDs those are,
its GPUs and their MIG devices, and the answer is decoded for those alone. A kubelet naming thousands
of devices of no GPU here (a busy node, another node's MIG devices) costs neither NVML calls nor memory.
"""

from __future__ import annotations

import logging
import re
import threading

from ansible_collections.scv.gpu.plugins.module_utils.agent import dra_claims as dra
from ansible_collections.scv.gpu.plugins.module_utils.kube.podresources import (
    UNCHANGED,
    PodResourcesError,
    PodResourcesLister,
)

LOG = logging.getLogger("scv-gpu-agent")
# Resources of NVIDIA's device plugin: nvidia.com/gpu, its renamed shares and nvidia.com/mig-<profile>.
RESOURCE_PREFIX = "nvidia.com/"
MIG_PREFIX = "MIG-"
# kubernetes-gpu-id-type device-name: a GPU named by its device node (nvidia0), as GKE's device plugin names them;
# a MIG device there is nvidia<GPU index>/gi<GPU instance ID>, found in either ID type, as dcgm-exporter does.
DEVICE_NAME = re.compile(r"nvidia([0-9]+)$")
GKE_MIG = re.compile(r"nvidia([0-9]+)/gi([0-9]+)$")


def split_replica(device):
    """(the device ID without its replica, the replica number or None): ``<id>::<n>`` (NVIDIA's device plugin
    sharing a GPU) or ``<id>/vgpu<n>`` (GKE's)."""
    if "/vgpu" in device:
        base, _sep, number = device.partition("/vgpu")
        return base, number
    base, sep, number = device.partition("::")
    return base, number if sep else None


def device_holders(held):
    """{device id without its replica suffix: sorted [(pod, namespace, container)]} of NVIDIA's resources.
    Devices with the same holders share one list: a container holding thousands costs one."""
    holders = {}
    for entry in held:
        if not entry["resource"].startswith(RESOURCE_PREFIX):
            continue
        holder = (entry["pod"], entry["namespace"], entry["container"])
        for device in entry["device_ids"]:
            holders.setdefault(split_replica(device)[0], set()).add(holder)
    shared = {}
    return {device: shared.setdefault(frozenset(found), sorted(found)) for device, found in holders.items()}


def device_replicas(held):
    """{device id without its replica suffix: {(pod, namespace, container): {replica numbers}}} of the device IDs
    of NVIDIA's resources that carry one (``<id>::<n>``: a GPU shared by time-slicing or MPS)."""
    replicas = {}
    for entry in held:
        if not entry["resource"].startswith(RESOURCE_PREFIX):
            continue
        holder = (entry["pod"], entry["namespace"], entry["container"])
        for device in entry["device_ids"]:
            base, number = split_replica(device)
            if number is not None:
                replicas.setdefault(base, {}).setdefault(holder, set()).add(number)
    return replicas


def _sort_key(number):
    return (0, int(number), "") if number.isdigit() else (1, 0, number)


class NoPods:
    """The pod attribution of an agent without the kubelet's pod-resources socket: no pod is known to hold a GPU,
    so no series names one (``None`` where a PodAttribution answers what it knows)."""

    def start(self):
        """Nothing to follow."""

    def configure(self, interval_s):
        """Nothing to ask the kubelet, at any interval."""

    def learn(self, cards, mig_devices, generation=0, placements=None):
        """Nothing to resolve."""

    def counters(self):
        return {}

    def by_card(self, cards):
        return None

    def by_instance(self, cards):
        return None

    def dra_labels(self, cards):
        return None

    def replicas_by_instance(self, cards):
        return None


class PodAttribution(threading.Thread):
    """Keeps ``holders`` (see ``device_holders``) current from the kubelet's pod-resources socket."""

    def __init__(self, socket_path, interval_s, stopping, timeout_s=2.0, lister=None, id_type="uid"):
        super().__init__(name="pod-resources", daemon=True)
        self.socket_path, self.interval_s, self.timeout_s = socket_path, interval_s, timeout_s
        self.id_type = id_type    # kubernetes-gpu-id-type: uid or device-name
        self.refreshed = threading.Event()   # set after each question to the kubelet (agent.pod_metadata waits on it)
        self.stopping = stopping
        self.lister = PodResourcesLister() if lister is None else lister
        self.holders = {}
        self.replicas = {}        # see device_replicas
        self.claims = {}          # see dra.claimed
        self._worked = ({}, {}, {})   # the holders, replicas and claims of the last answer read whole (UNCHANGED's)
        self.refreshes, self.failures = 0, 0
        self.problem = None
        self._local = None        # this node's device IDs, as bytes (None: not learnt yet)
        self._mig_instances = {}  # this node's MIG device UUIDs: (their GPU's UUID, their GPU instance ID)
        self._placements = ({}, {})   # minor numbers and GPU instance placements (MigInstances.placements)
        self._learnt = None       # what the local IDs were learnt from (see learn)
        self._learn_problem = None
        self._lock = threading.Lock()

    def configure(self, interval_s):
        """How often the kubelet is asked, from the next question on."""
        self.interval_s = interval_s

    def run(self):
        # the first answer waits for this node's device IDs (up to an interval), so that it is never read whole
        waited = 0.0
        while self._local is None and waited < self.interval_s and not self.stopping.wait(0.2):
            waited += 0.2
        while not self.stopping.is_set():
            self.refresh()
            self.stopping.wait(self.interval_s)

    def refresh(self):
        """One question to the kubelet. Whatever goes wrong (an answer not even the decoder foresaw included)
        clears every pod label and is asked again at the next interval: the thread never ends early."""
        with self._lock:
            local = self._local
        try:
            answer = self.lister(self.socket_path, self.timeout_s, local, dra.DRIVERS)
            # the same answer as the last one read whole: its holders, as they were worked out then
            worked = self._worked if answer is UNCHANGED else (device_holders(answer), device_replicas(answer),
                                                               dra.claimed(answer))
            self._worked = worked
        except Exception as error:  # pylint: disable=broad-exception-caught
            worked = ({}, {}, {})
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
            self.holders, self.replicas, self.claims = worked
        self.refreshes += 1
        self.refreshed.set()

    def learn(self, cards, mig_devices, generation=0, placements=None):
        """Learns this node's device IDs, in the thread that reads NVML: the ``id`` and ``uuid`` of each card, and
        the MIG devices ``mig_devices()`` gives ({MIG UUID: (GPU UUID, GPU instance ID)}); and what ``placements()``
        gives (``MigInstances.placements``), to find the devices of DRA claims. Those calls are made again
        only when the cards or ``generation`` change: the agent passes the count of its static readings, which a
        SIGHUP (the mig_layout role sends one), a new NVML session and the static refresh interval move on."""
        key = (generation, tuple((card.get("id"), card.get("uuid")) for card in cards))
        if key == self._learnt:
            return
        try:
            instances = dict(mig_devices())
            layout = ({}, {}) if placements is None else placements()
        except Exception as error:  # pylint: disable=broad-exception-caught
            if str(error) != self._learn_problem:
                LOG.warning("this node's MIG devices could not be listed (pods holding them are left off for now): "
                            "%s", error)
            self._learn_problem = str(error)
            return
        self._learn_problem = None
        local = {str(value).encode("utf-8") for card in cards for value in (card.get("id"), card.get("uuid"))
                 if value is not None}
        local.update(b"nvidia%d" % card["id"] for card in cards if isinstance(card.get("id"), int))
        local.update(uuid.encode("utf-8") for uuid in instances)
        with self._lock:
            self._local, self._mig_instances, self._learnt = frozenset(local), instances, key
            self._placements = layout

    def mig_gpus(self):
        """The UUIDs of this node's GPUs that have MIG devices (as last learnt)."""
        with self._lock:
            return {gpu for gpu, _instance in self._mig_instances.values()}

    def counters(self):
        return {"scv_agent_pod_resources_reads": self.refreshes, "scv_agent_pod_resources_failures": self.failures}

    def by_card(self, cards):
        """{card id: [(pod, namespace, container)]} for the cards some container holds whole (a MIG device's holders
        are its GPU instance's: :meth:`by_instance`)."""
        with self._lock:
            holders = self.holders
        found = {card: set().union(*held) for card, held in _per_card(holders, cards, self.id_type).items()}
        for key, held in self.dra_units(cards).items():
            if not isinstance(key, tuple):
                found.setdefault(key, set()).update(held)
        return {card: sorted(held) for card, held in found.items()}

    def by_instance(self, cards):
        """{(card id, GPU instance ID): [(pod, namespace, container)]} for the GPU instances (MIG) some container
        holds, through any of the instance's MIG devices."""
        with self._lock:
            holders, instances = self.holders, self._mig_instances
        found = {key: set().union(*held) for key, held in _per_instance(holders, instances, cards).items()}
        for key, held in self.dra_units(cards).items():
            if isinstance(key, tuple):
                found.setdefault(key, set()).update(held)
        return {key: sorted(held) for key, held in found.items()}

    def dra_units(self, cards):
        """{card id or (card id, GPU instance ID): {(pod, namespace, container): DRA label values}} of the devices
        held through claims of NVIDIA's DRA driver (see ``dra.units``)."""
        with self._lock:
            claims, layout = self.claims, self._placements
        return dra.units(claims, layout, cards)

    def dra_labels(self, cards):
        """(DRA label names, {unit: {holder: values}}) for the metrics (see ``dra.labels``)."""
        return dra.labels(self.dra_units(cards))

    def replicas_by_instance(self, cards):
        """{(card id, GPU instance ID): {(pod, namespace, container): "n"}}: as :meth:`replicas_by_card`, for the
        GPU instances shared by time-slicing or MPS."""
        with self._lock:
            replicas, instances = self.replicas, self._mig_instances
        return {key: _numbers(found) for key, found in _per_instance(replicas, instances, cards).items()}

    def replicas_by_card(self, cards):
        """{card id: {(pod, namespace, container): "n"}} for the cards shared by time-slicing or MPS: the replica
        numbers each container holds, as the ``vgpu`` label shows them (several joined by commas, in order)."""
        with self._lock:
            replicas = self.replicas
        return {card: _numbers(found) for card, found in _per_card(replicas, cards, self.id_type).items()}


def _numbers(found):
    """{holder: "n,m"} from [{holder: {replica numbers}}]: each holder's replicas, in order, joined by commas."""
    numbers = {}
    for holding in found:
        for holder, held in holding.items():
            numbers.setdefault(holder, set()).update(held)
    return {holder: ",".join(sorted(held, key=_sort_key)) for holder, held in numbers.items()}


def _per_instance(table, instances, cards):
    """{(card id, GPU instance ID): [the values of ``table`` (keyed by device ID) of the instance's MIG devices]}:
    by their UUIDs, or as GKE names an instance (nvidia<index>/gi<GPU instance ID>)."""
    ids = {card.get("uuid"): card.get("id") for card in cards}
    found = {}
    for device, value in table.items():
        instance = instances.get(device) if device.startswith(MIG_PREFIX) else None
        if instance is not None and instance[0] in ids:
            found.setdefault((ids[instance[0]], instance[1]), []).append(value)
        named = GKE_MIG.match(device) if instance is None else None
        if named:
            found.setdefault((int(named.group(1)), int(named.group(2))), []).append(value)
    return found


def _card_key(device, id_type):
    """The UUID or index (as text) of the whole card a device ID names, by ``id_type``; None: none of this node's,
    or a MIG device, whose holders are its GPU instance's (see _per_instance)."""
    if device.startswith(MIG_PREFIX) or GKE_MIG.match(device):
        return None
    found = DEVICE_NAME.match(device) if id_type == "device-name" else None
    if found:
        return found.group(1)
    return device if id_type == "uid" else None


def _per_card(table, cards, id_type="uid"):
    """{card id: [the values of ``table`` (keyed by device ID) that name the whole card]}: with ``id_type`` uid its
    UUID or index, with device-name its device name (nvidia0)."""
    found = {}
    for device, value in table.items():
        key = _card_key(device, id_type)
        if key is not None:
            found.setdefault(key, []).append(value)
    result = {}
    for card in cards:
        values = found.get(card.get("uuid"), []) + found.get(str(card.get("id")), [])
        if values:
            result[card.get("id")] = values
    return result
