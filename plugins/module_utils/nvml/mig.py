# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A GPU's MIG state through NVML, and the calls that change it (private).

Reads the MIG mode, the GPU instance profiles the driver offers with their placements, the
GPU and compute instances there are, and the processes that hold the GPU; enables or disables
MIG mode, destroys instances and creates them where a plan put them. NVML must be initialised.
"""

from __future__ import annotations

import ctypes

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
    """An NVML call on a GPU's MIG state failed; the message says which and on which GPU."""


def _call(what, index, function, *args):
    try:
        return function(*args)
    except pynvml.NVMLError as error:
        raise MigError("GPU %d: %s failed: %s" % (index, what, error)) from error


def mig_parent(uuid):
    """The UUID of the GPU the MIG device ``uuid`` is part of; None when NVML (initialised) does not know it."""
    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
        return as_text(text_call(pynvml.nvmlDeviceGetUUID, parent))
    except pynvml.NVMLError:
        return None


def _optional(function, *args):
    """``function(*args)``, or None where the driver says it does not apply."""
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
        pci = _optional(pynvml.nvmlDeviceGetPciInfo, self.handle)
        self.device_id = pci.pciDeviceId if pci is not None else None

    def mode(self):
        """(current, pending) MIG mode as booleans, or None for a GPU without MIG."""
        mode = _optional(pynvml.nvmlDeviceGetMigMode, self.handle)
        return None if mode is None else (bool(mode[0]), bool(mode[1]))

    def profiles(self):
        """{profile name: {"id", "size", "starts", "instances", "slices"}}: what the driver offers
        while MIG mode is on (nothing while it is off)."""
        table = {}
        for profile in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            info = _optional(pynvml.nvmlDeviceGetGpuInstanceProfileInfo, self.handle, profile)
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
            if _optional(pynvml.nvmlGpuInstanceGetComputeInstances, gpu_instance, profile, handles,
                         ctypes.byref(count)) is None:
                continue
            found.extend(handles[position] for position in range(count.value))
        return found

    def processes(self):
        """The PIDs running on the GPU or any of its MIG devices."""
        pids = set()
        handles = [self.handle]
        for position in range(_optional(pynvml.nvmlDeviceGetMaxMigDeviceCount, self.handle) or 0):
            mig = _optional(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, self.handle, position)
            if mig is not None:
                handles.append(mig)
        for handle in handles:
            for process in _optional(pynvml.nvmlDeviceGetComputeRunningProcesses, handle) or []:
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
            info = _optional(pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo, gpu_instance, profile,
                             pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            if info is not None and info.sliceCount == slices:
                return info.id
        raise MigError("GPU %d: the driver offers no compute instance spanning a %s GPU instance" % (self.index, name))
