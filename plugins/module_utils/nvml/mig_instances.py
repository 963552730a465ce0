# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The GPU instances of the GPUs that have MIG on, and what each one uses, for per-instance series (private).

Which GPU instances there are (their ID, profile and MIG devices) is listed once per ``generation``: the
agent passes its session's count of static readings, which moves on with a new NVML session, the static
refresh interval and a SIGHUP (the mig_layout role sends one after it changes a layout). Each read also
asks each listed MIG device its GPU instance ID: an instance destroyed meanwhile, or a MIG device that
now belongs to another instance, has the instances listed again at once. An instance made by other
means than the role where none was appears at the next static refresh, or at once after a SIGHUP.

Each read then asks one MIG device of each instance its memory (the instance's own), and, when the
session read its costly counters since the last read, samples the instance's engine activity through
GPM; between those, the last activity is repeated, as the whole GPU's counters are. The caller keeps
reads apart from the session's own (the agent's reading lock).
"""

from __future__ import annotations

import re

from ansible_collections.scv.gpu.plugins.module_utils.nvml import gpm
from ansible_collections.scv.gpu.plugins.module_utils.nvml.api import ABSENT, as_text, error_code, pynvml, text_call
from ansible_collections.scv.gpu.plugins.module_utils.nvml.card import memory_mib, mig_profile
from ansible_collections.scv.gpu.plugins.module_utils.nvml.mig import mig_handles, optional

# A compute instance smaller than its GPU instance is named "<n>c.<GPU instance profile>".
_COMPUTE_PART = re.compile(r"^\d+c\.")


def gpu_instance_profile(name):
    """The GPU instance profile in a MIG device's name ('... MIG 1c.3g.40gb' -> '3g.40gb'), or None."""
    profile = mig_profile(name)
    return _COMPUTE_PART.sub("", profile) if profile else None


def list_instances(handle):
    """[{"id", "profile", "uuids", "handle"}] of the GPU ``handle``'s GPU instances, by ID; [] with MIG off.
    ``handle`` is the first MIG device of the instance; ``uuids`` every MIG device (compute instance) of it."""
    mode = optional(pynvml.nvmlDeviceGetMigMode, handle)
    if not mode or not mode[0]:
        return []
    instances = {}
    for mig in mig_handles(handle):
        gpu_instance = int(pynvml.nvmlDeviceGetGpuInstanceId(mig))
        uuid = as_text(text_call(pynvml.nvmlDeviceGetUUID, mig))
        entry = instances.get(gpu_instance)
        if entry is None:
            entry = instances[gpu_instance] = {"id": gpu_instance, "uuids": [], "handle": mig,
                                               "profile": gpu_instance_profile(as_text(text_call(
                                                   pynvml.nvmlDeviceGetName, mig)))}
        entry["uuids"].append(uuid)
    for entry in instances.values():
        entry["profile_id"], entry["start"] = _placement(handle, entry["id"])
    return [instances[key] for key in sorted(instances)]


def _placement(handle, gpu_instance):
    """(GPU instance profile ID, placement start) of the GPU ``handle``'s GPU instance ``gpu_instance``, as NVIDIA's
    DRA driver names a MIG device by them; (None, None) where the driver does not say."""
    try:
        info = pynvml.nvmlGpuInstanceGetInfo(pynvml.nvmlDeviceGetGpuInstanceById(handle, gpu_instance))
    except pynvml.NVMLError:
        return None, None
    return int(info.profileId), int(info.placement.start)


def _memory(handle, readings):
    try:
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle, pynvml.nvmlMemory_v2)
        reserved = memory.reserved
    except pynvml.NVMLError as error:
        if error_code(error) not in ABSENT:
            raise
        memory, reserved = pynvml.nvmlDeviceGetMemoryInfo(handle), 0
    readings.update(memory_mib(memory.total, memory.free, reserved))


class MigInstances:
    """The GPU instances of a session's GPUs (see the module's text); not thread-safe."""

    def __init__(self):
        self.lists = 0                # times the instances were listed
        self._generation = self._counter_reads = None
        self._layout = {}             # card index -> list_instances()
        self._kept = {}               # (card index, GPU instance ID) -> the GPM readings last read
        self._gpm = gpm.GpmActivity()

    def listed(self, index):
        """Whether card ``index`` had GPU instances when last listed (NVML refuses its whole GPU's GPM sample)."""
        return index in self._layout

    def devices(self, session, cards):
        """{MIG device UUID: (its GPU's UUID, its GPU instance ID)} of ``cards`` (see :meth:`read`)."""
        self._current(session, cards)
        uuids = {card["id"]: card.get("uuid") for card in cards}
        return {uuid: (uuids.get(index), entry["id"])
                for index, entries in self._layout.items() for entry in entries for uuid in entry["uuids"]}

    def placements(self, session, cards):
        """({minor number: card index}, {card index: {(GPU instance profile ID, placement start): (GPU instance ID,
        profile, its first MIG device's UUID)}}) of ``cards``: what NVIDIA's DRA driver names its devices by (the
        GPU instances of the cards that have them, see :meth:`read`)."""
        handles = self._current(session, cards)
        minors = {}
        for index, handle in handles.items():
            try:
                if handle is not None:
                    minors[int(pynvml.nvmlDeviceGetMinorNumber(handle))] = index
            except pynvml.NVMLError:
                continue   # a card the driver gives no device node
        return minors, {index: {(entry["profile_id"], entry["start"]): (entry["id"], entry["profile"] or "",
                                                                        (entry["uuids"] or [""])[0])
                                for entry in entries if entry.get("profile_id") is not None}
                        for index, entries in self._layout.items()}

    def _current(self, session, cards):
        """Each card's handle, with the instances listed for the session's present static readings."""
        handles = {card["id"]: session.handle(card["id"])[0] for card in cards}
        if not any(handle is not None for handle in handles.values()):
            self._generation, self._layout = None, {}
        elif session.static_reads != self._generation:
            self._list(handles)
            self._generation = session.static_reads
        return handles

    def read(self, session, cards):
        """{card index: [{"id", "profile", "uuids", memory and GPM readings}]} of those of ``cards`` (the facts of
        a read of ``session`` just made) that have GPU instances; {} while the session has no NVML open."""
        handles = self._current(session, cards)
        wanted = session.slow.wanted   # the costly readings someone serves (None: all)
        gpm_due = session.slow.reads != self._counter_reads and (wanted is None or bool(wanted & set(gpm.KEYS)))
        self._counter_reads = session.slow.reads
        if self._moved():
            self._list(handles)
        found = {}
        for index, entries in self._layout.items():
            rows = []
            for entry in entries:
                readings = {"id": entry["id"], "profile": entry["profile"], "uuids": list(entry["uuids"])}
                try:
                    _memory(entry["handle"], readings)
                except pynvml.NVMLError:
                    continue          # destroyed since the check above
                key = (index, entry["id"])
                if gpm_due and handles.get(index) is not None:
                    self._gpm.read(index, handles[index], readings, entry["id"])
                    self._kept[key] = {name: readings[name] for name in gpm.KEYS if name in readings}
                readings.update(self._kept.get(key, {}))
                rows.append(readings)
            found[index] = rows
        return found

    def _moved(self):
        """Whether a listed instance is gone, or its MIG device now belongs to another (destroyed and made again by
        other means than the role, which sends a SIGHUP): one GPU instance ID query per instance."""
        for entries in self._layout.values():
            for entry in entries:
                try:
                    if int(pynvml.nvmlDeviceGetGpuInstanceId(entry["handle"])) != entry["id"]:
                        return True
                except pynvml.NVMLError:
                    return True
        return False

    def _list(self, handles):
        self.lists += 1
        layout = {}
        for index, handle in handles.items():
            if handle is None:
                continue
            try:
                entries = list_instances(handle)
            except pynvml.NVMLError:
                continue
            if entries:
                layout[index] = entries
        self._layout = layout
        keep = {(index, entry["id"]) for index, entries in layout.items() for entry in entries}
        self._gpm.forget(keep)
        self._kept = {key: value for key, value in self._kept.items() if key in keep}

    def free(self):
        """Forgets everything (before NVML shuts down): the next read lists the instances again."""
        self._gpm.free()
        self._layout, self._kept, self._generation = {}, {}, None
