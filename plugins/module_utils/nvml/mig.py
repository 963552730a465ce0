# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A GPU's MIG state through NVML, and the calls that change it (private).

Reads the MIG mode, the GPU instance profiles the driver offers with their placements, the
GPU and compute instances there are, and the processes that hold the GPU; enables or disables
MIG mode, destroys instances and creates them where a plan put them. ``lay_out`` applies a
layout's entries (``common.mig_layout``) to the GPUs they name. NVML must be initialised.
"""

from __future__ import annotations

import ctypes
import json

from ansible_collections.scv.gpu.plugins.module_utils.common.mig_layout import (
    LayoutError,
    assign,
    counts,
    pci_id,
    place,
)
from ansible_collections.scv.gpu.plugins.module_utils.common.mig_profiles import known_profiles
from ansible_collections.scv.gpu.plugins.module_utils.nvml.api import (
    ABSENT,
    as_text,
    error_code,
    pynvml,
    text_call,
)

INVALID_ARGUMENT = 2
SUCCESS = 0
IN_USE = 19
RESET_REQUIRED = 16
MAX_PLACEMENTS = 8
MAX_INSTANCES = 8


class MigError(Exception):
    """An NVML call on a GPU's MIG state failed; the message says which and on which GPU.

    Raised part-way through a layout, it also carries ``report`` (every GPU named, as lay_out
    reports them, with ``failed`` on the GPU at fault) and ``restore`` (a layout that puts the GPUs
    that changed back as they were)."""

    def __init__(self, message, report=None, restore=None):
        super().__init__(message)
        self.report, self.restore = report, restore


def _call(what, index, function, *args):
    try:
        return function(*args)
    except pynvml.NVMLError as error:
        raise MigError("GPU %d: %s failed: %s" % (index, what, error)) from error


def mig_handles(handle):
    """The handles of the MIG devices of the GPU ``handle`` (none for a GPU without MIG)."""
    for position in range(optional(pynvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0):
        mig = optional(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, position)
        if mig is not None:
            yield mig


def optional(function, *args):
    """``function(*args)``, or None where the driver says it does not apply (an empty MIG slot included)."""
    try:
        return function(*args)
    except pynvml.NVMLError as error:
        if error_code(error) in ABSENT or error_code(error) == INVALID_ARGUMENT:
            return None
        raise


class MigGpu:
    """One GPU, by NVML index."""

    def __init__(self, index):
        self.index = index
        self.handle = _call("getting its handle", index, pynvml.nvmlDeviceGetHandleByIndex, index)
        self.name = as_text(text_call(pynvml.nvmlDeviceGetName, self.handle))
        self.uuid = as_text(text_call(pynvml.nvmlDeviceGetUUID, self.handle))
        pci = optional(pynvml.nvmlDeviceGetPciInfo, self.handle)
        self.device_id = pci.pciDeviceId if pci is not None else None

    def mode(self):
        """(current, pending) MIG mode as booleans, or None for a GPU without MIG."""
        mode = optional(pynvml.nvmlDeviceGetMigMode, self.handle)
        return None if mode is None else (bool(mode[0]), bool(mode[1]))

    def profiles(self):
        """{profile name: {"id", "size", "starts", "instances", "slices"}}: what the driver offers
        while MIG mode is on (nothing while it is off)."""
        table = {}
        for profile in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            info = optional(pynvml.nvmlDeviceGetGpuInstanceProfileInfo, self.handle, profile)
            if info is None:
                continue
            name = as_text(info.name).replace("MIG ", "", 1).strip()
            placements = (pynvml.c_nvmlGpuInstancePlacement_t * MAX_PLACEMENTS)()
            count = ctypes.c_uint(MAX_PLACEMENTS)
            _call("reading the placements of %s" % name, self.index, pynvml.nvmlDeviceGetGpuInstancePossiblePlacements,
                  self.handle, info.id, placements, ctypes.byref(count))
            starts = [placements[i].start for i in range(count.value)]
            table[name] = {"id": info.id, "size": placements[0].size if count.value else info.sliceCount,
                           "starts": starts, "instances": info.instanceCount, "slices": info.sliceCount}
        return table

    def instances(self, table):
        """[{"id", "profile", "start", "gpu_instance", "compute_instances"}], by GPU instance ID."""
        found = []
        for name, profile in table.items():
            handles = (pynvml.c_nvmlGpuInstance_t * MAX_INSTANCES)()
            count = ctypes.c_uint(MAX_INSTANCES)
            _call("listing its %s GPU instances" % name, self.index, pynvml.nvmlDeviceGetGpuInstances,
                  self.handle, profile["id"], handles, ctypes.byref(count))
            for position in range(count.value):
                gpu_instance = handles[position]
                info = _call("reading a GPU instance", self.index, pynvml.nvmlGpuInstanceGetInfo, gpu_instance)
                found.append({"id": info.id, "profile": name, "start": info.placement.start,
                              "gpu_instance": gpu_instance,
                              "compute_instances": self._compute_instances(gpu_instance)})
        return sorted(found, key=lambda instance: instance["id"])

    def _compute_instances(self, gpu_instance):
        found = []
        for profile in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            handles = (pynvml.c_nvmlComputeInstance_t * MAX_INSTANCES)()
            count = ctypes.c_uint(MAX_INSTANCES)
            if optional(pynvml.nvmlGpuInstanceGetComputeInstances, gpu_instance, profile, handles,
                        ctypes.byref(count)) is None:
                continue
            found.extend(handles[position] for position in range(count.value))
        return found

    def processes(self):
        """The PIDs running on the GPU or any of its MIG devices."""
        pids = set()
        for handle in [self.handle, *mig_handles(self.handle)]:
            for process in optional(pynvml.nvmlDeviceGetComputeRunningProcesses, handle) or []:
                pids.add(process.pid)
        return sorted(pids)

    def set_mode(self, enabled):
        """Asks for MIG mode on or off; the driver's activation status: SUCCESS when it applied,
        RESET_REQUIRED or IN_USE when it waits for a reset."""
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        return _call("setting MIG mode %s" % ("on" if enabled else "off"), self.index,
                     pynvml.nvmlDeviceSetMigMode, self.handle, mode)

    def destroy(self, instances):
        for instance in instances:
            for compute_instance in instance["compute_instances"]:
                _call("destroying a compute instance of GPU instance %d" % instance["id"], self.index,
                      pynvml.nvmlComputeInstanceDestroy, compute_instance)
            _call("destroying GPU instance %d (%s)" % (instance["id"], instance["profile"]), self.index,
                  pynvml.nvmlGpuInstanceDestroy, instance["gpu_instance"])

    def create(self, table, plan):
        """Creates each (profile, start) of ``plan``, each with one compute instance spanning it."""
        for name, start in plan:
            placement = pynvml.c_nvmlGpuInstancePlacement_t()
            placement.start, placement.size = start, table[name]["size"]
            gpu_instance = _call("creating a %s GPU instance at slice %d" % (name, start), self.index,
                                 pynvml.nvmlDeviceCreateGpuInstanceWithPlacement, self.handle, table[name]["id"],
                                 ctypes.byref(placement))
            profile_id = self._whole_compute_profile(gpu_instance, table[name]["slices"], name)
            _call("creating the compute instance of a %s GPU instance" % name, self.index,
                  pynvml.nvmlGpuInstanceCreateComputeInstance, gpu_instance, profile_id)

    def _whole_compute_profile(self, gpu_instance, slices, name):
        for profile in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            info = optional(pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo, gpu_instance, profile,
                            pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            if info is not None and info.sliceCount == slices:
                return info.id
        raise MigError("GPU %d: the driver offers no compute instance spanning a %s GPU instance" % (self.index, name))


def state_of(mode, table, instances):
    """A GPU's MIG state as a layout entry gives it: ``mig-enabled`` and ``mig-devices`` counted per profile."""
    return {"mig-enabled": bool(mode and mode[0]),
            "mig-devices": counts(instance["profile"] for instance in instances) if table else {}}


def plan_for(gpu, wanted, table):
    """Where ``wanted`` ({profile: count}) goes on ``gpu`` whose driver offers ``table``; LayoutError
    naming the GPU when a profile is unknown or they do not fit."""
    try:
        plan = place(wanted, table)
    except LayoutError as error:
        raise LayoutError("GPU %d (%s): %s" % (gpu.index, gpu.name, error))
    if plan is None:
        raise LayoutError("GPU %d (%s): %s do not fit on one GPU" % (
            gpu.index, gpu.name, ", ".join("%d x %s" % (n, p) for p, n in wanted.items())))
    return plan


def profiles_while_off(gpu):
    """The profiles ``gpu`` will offer once its MIG mode is on, from the collection's table of the
    card; LayoutError saying what to do for a card it does not know."""
    table = known_profiles(gpu.device_id)
    if table is None:
        raise LayoutError(
            "GPU %d (%s): its MIG mode is off, and the driver lists a card's MIG profiles only while MIG mode is "
            "on. The profiles of this card (PCI device %s) are not in the collection's table, so the layout cannot "
            "be checked before MIG mode changes. Turn MIG mode on first (an entry with mig-enabled: true and no "
            "mig-devices), then apply the layout." % (gpu.index, gpu.name, pci_id(gpu.device_id)))
    return table


def _read_state(gpu):
    """(MIG mode, the driver's profiles, the GPU instances) of ``gpu`` as it is now."""
    mode = gpu.mode()
    table = gpu.profiles() if mode and mode[0] else {}
    return mode, table, gpu.instances(table) if table else []


def survey(gpu, entry):
    """What this GPU is and what it should become, checked: raises LayoutError where it cannot.
    A GPU whose MIG mode is off is planned from the collection's table of its card."""
    mode, table, instances = _read_state(gpu)
    if mode is None and entry["mig-enabled"]:
        raise LayoutError("GPU %d (%s) cannot do MIG" % (gpu.index, gpu.name))
    plan = None
    if entry["mig-enabled"] and entry["mig-devices"]:
        plan = plan_for(gpu, entry["mig-devices"], table or profiles_while_off(gpu))
    before = state_of(mode, table, instances)
    after = {"mig-enabled": entry["mig-enabled"], "mig-devices": dict(sorted(entry["mig-devices"].items()))}
    return {"gpu": gpu, "mode": mode, "table": table, "instances": instances, "plan": plan,
            "before": before, "after": after, "changed": before != after or (mode and mode[0] != mode[1])}


def apply(work):
    """Changes one GPU; whether a MIG mode change is left pending for a reset."""
    gpu, entry_after = work["gpu"], work["after"]
    if work["instances"]:
        gpu.destroy(work["instances"])
    mode = work["mode"]
    if mode is not None and (mode[0] != entry_after["mig-enabled"] or mode[1] != entry_after["mig-enabled"]):
        if gpu.set_mode(entry_after["mig-enabled"]) != SUCCESS or gpu.mode()[0] != entry_after["mig-enabled"]:
            return True
    if entry_after["mig-enabled"] and entry_after["mig-devices"]:
        table, plan = work["table"], work["plan"]
        if not table:
            # planned from the collection's table while MIG mode was off: the driver's own now decides
            table = gpu.profiles()
            try:
                plan = plan_for(gpu, entry_after["mig-devices"], table)
            except LayoutError as error:
                raise MigError("%s (the driver's MIG profiles for this card differ from the collection's table)"
                               % error)
        gpu.create(table, plan)
    return False


def _state_now(gpu):
    """The GPU's MIG state read again after a failure, or None where it cannot be read."""
    try:
        return state_of(*_read_state(gpu))
    except (MigError, pynvml.NVMLError):
        return None


def _part_way(error, report, item):
    """The MigError for a failure on ``item``'s GPU after the GPUs of ``report`` were laid out."""
    gpu = item["gpu"]
    now = _state_now(gpu)
    report = report + [{"index": gpu.index, "uuid": gpu.uuid, "name": gpu.name, "before": item["before"],
                        "after": now, "changed": now != item["before"], "pending": False, "failed": str(error)}]
    touched = [gpu for gpu in report if gpu["changed"]]
    restore = [{"devices": [gpu["index"]], "mig-enabled": gpu["before"]["mig-enabled"],
                "mig-devices": gpu["before"]["mig-devices"]} for gpu in touched]
    changed = "; ".join("GPU %d from %s to %s" % (gpu["index"], _said(gpu["before"]), _said(gpu["after"]))
                        for gpu in touched) or "none"
    untouched = [gpu["index"] for gpu in report if not gpu["changed"]]
    message = ("The MIG layout stopped part-way: %s. GPUs changed: %s. Left as they were: %s.%s"
               % (error, changed, ", ".join(map(str, untouched)) or "none",
                  " To put the changed GPUs back, run scv.gpu.mig_layout with layout: %s" % json.dumps(restore)
                  if restore else ""))
    return MigError(message, report=report, restore=restore)


def _said(state):
    if state is None:
        return "a state that cannot be read"
    if not state["mig-enabled"]:
        return "MIG off"
    return "MIG on with %s" % (", ".join("%d x %s" % (n, p) for p, n in state["mig-devices"].items()) or "no instances")


def lay_out(entries, gpus, check_mode=False, warn=None):
    """Applies checked layout ``entries`` to ``gpus`` (MigGpu, by index); a report per GPU named, each with
    ``index``, ``uuid``, ``name``, ``before``, ``after``, ``changed`` and ``pending`` (a MIG mode change that
    waits for a reset). ``warn`` is told of each entry that names no GPU.

    Every GPU is surveyed and planned before any changes, its MIG mode included; a GPU that would change while
    processes use it raises MigError naming their PIDs, and nothing changes. In check mode nothing changes either.
    A failure part-way raises MigError naming the GPUs already changed and how to restore them.
    """
    chosen, idle = assign(entries, [{"index": gpu.index, "deviceId": gpu.device_id} for gpu in gpus])
    for position in idle:
        if warn:
            warn("layout[%d] names no GPU of this host (its devices or device-filter match none); it was skipped"
                 % position)
    work = [survey(gpus[index], entry) for index, entry in sorted(chosen.items())]
    busy = ["GPU %d (%s): PIDs %s" % (item["gpu"].index, item["gpu"].name, ", ".join(map(str, pids)))
            for item in work if item["changed"] for pids in [item["gpu"].processes()] if pids]
    if busy:
        raise MigError("The MIG layout was not applied: processes use %s. Stop them (drain the node) and run "
                       "again; nothing was changed." % "; ".join(busy))
    report = []
    for item in work:
        gpu = item["gpu"]
        try:
            pending = bool(item["changed"]) and not check_mode and apply(item)
        except MigError as error:
            raise _part_way(error, report, item) from error
        report.append({"index": gpu.index, "uuid": gpu.uuid, "name": gpu.name, "before": item["before"],
                       "after": item["after"], "changed": bool(item["changed"]), "pending": bool(pending)})
    return report
