# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A GPU's NVLinks and its place in the NVLink fabric, and what they mean for its health (private).

On an HGX board the GPUs talk through NVSwitch chips, and CUDA does not start on a GPU until NVIDIA
Fabric Manager has brought it into the NVLink fabric: until then CUDA programs fail with "system not
yet initialized" (error 802) while NVML and nvidia-smi still list the GPU. NVML tells the GPU's fabric
state on Hopper and later (``nvmlDeviceGetGpuFabricInfoV``): not started, in progress, or completed with a
status. A card without NVLink or fabric answers NOT_SUPPORTED and has neither fact.

The fabric changes when Fabric Manager starts, stops or loses a GPU, which the driver reports with an
XID, so a long-lived session reads it every counters interval and after an XID (``FabricChecks``), not at
every read.
"""

from __future__ import annotations

from ansible_collections.scv.gpu.plugins.module_utils.nvml.api import (
    FUNCTION_NOT_FOUND,
    as_text,
    error_code,
    pynvml,
)

FI_DEV_NVLINK_LINK_COUNT = 91
FI_DEV_NVLINK_SPEED_MBPS_COMMON = 90
NVLINK_DEVICE_TYPE_SWITCH = 2
# nvmlNvlinkVersion_t: the enum's value -> the NVLink generation it names.
NVLINK_VERSIONS = {1: "1.0", 2: "2.0", 3: "2.2", 4: "3.0", 5: "3.1", 6: "4.0", 7: "5.0", 8: "6.0"}
FABRIC_STATES = {1: "not started", 2: "in progress", 3: "completed"}   # 0: the GPU has no fabric
HEALTH_SUMMARIES = {1: "healthy", 2: "unhealthy", 3: "limited capacity"}   # 0: not reported
# Fact keys this file adds to a card.
KEYS = ("fabric", "nvlink")

FABRIC_NOT_STARTED = (
    "the NVLink fabric has not started: Fabric Manager has not brought this GPU into it, so CUDA programs fail "
    "with \"system not yet initialized\"; start nvidia-fabricmanager (its version must equal the driver's)")
FABRIC_IN_PROGRESS = (
    "Fabric Manager is still bringing this GPU into the NVLink fabric: CUDA programs cannot start until it "
    "completes; if it stays so, read nvidia-fabricmanager's log")
FABRIC_FAILED = ("Fabric Manager could not bring this GPU into the NVLink fabric (%s): CUDA programs cannot use "
                 "it; read nvidia-fabricmanager's log")
FABRIC_UNHEALTHY = "the NVLink fabric reports this GPU unhealthy: read nvidia-fabricmanager's log"


def _cluster_uuid(raw):
    text = bytes(bytearray(raw)).hex()
    return "%s-%s-%s-%s-%s" % (text[:8], text[8:12], text[12:16], text[16:20], text[20:])


def _fabric_info(handle):
    """The fabric info in its newest form the library knows: version 3 (with the health summary), else
    the first form (drivers and pynvml before r550)."""
    newest = getattr(pynvml, "c_nvmlGpuFabricInfo_v3_t", None)
    if newest is not None:
        info = newest()
        try:
            pynvml.nvmlDeviceGetGpuFabricInfoV(handle, pynvml.byref(info))
            return info
        except pynvml.NVMLError as error:
            if error_code(error) not in (FUNCTION_NOT_FOUND, 25):   # 25: ARGUMENT_VERSION_MISMATCH
                raise
    info = pynvml.c_nvmlGpuFabricInfo_t()
    pynvml.nvmlDeviceGetGpuFabricInfo(handle, pynvml.byref(info))
    return info


def read_fabric(reader, card):
    """The card's ``fabric`` and ``nvlink`` facts (``reader`` is a ``card._CardReader``)."""
    info = reader.query("NVLink fabric state", _fabric_info, health=True)
    state = FABRIC_STATES.get(getattr(info, "state", 0))
    if state is not None:
        fabric = {"state": state, "cliqueId": int(info.cliqueId), "clusterUuid": _cluster_uuid(info.clusterUuid)}
        if state == "completed":
            fabric["status"] = "Success" if info.status == 0 else as_text(pynvml.nvmlErrorString(info.status))
        summary = HEALTH_SUMMARIES.get(getattr(info, "healthSummary", 0))
        if summary is not None:
            fabric["healthSummary"] = summary
        card["fabric"] = fabric
    _read_nvlink(reader, card)


def _read_nvlink(reader, card):
    fields = reader.query("NVLink count", pynvml.nvmlDeviceGetFieldValues,
                          [FI_DEV_NVLINK_LINK_COUNT, FI_DEV_NVLINK_SPEED_MBPS_COMMON])
    if not fields or fields[0].nvmlReturn != 0 or not fields[0].value.uiVal:
        return
    links = int(fields[0].value.uiVal)
    nvlink = {"links": links, "activeLinks": 0, "switchLinks": 0}
    if fields[1].nvmlReturn == 0:
        nvlink["speedMBps"] = int(fields[1].value.uiVal)
    version = reader.query("NVLink version", pynvml.nvmlDeviceGetNvLinkVersion, 0)
    if version in NVLINK_VERSIONS:
        nvlink["version"] = NVLINK_VERSIONS[version]
    for link in range(links):
        if reader.query("NVLink %d state" % link, pynvml.nvmlDeviceGetNvLinkState, link) != 1:
            continue
        nvlink["activeLinks"] += 1
        if reader.query("NVLink %d far end" % link, pynvml.nvmlDeviceGetNvLinkRemoteDeviceType,
                        link) == NVLINK_DEVICE_TYPE_SWITCH:
            nvlink["switchLinks"] += 1
    card["nvlink"] = nvlink


def fabric_reasons(card):
    """Why the card cannot run CUDA programs as its fabric stands: a fabric that is not completed (the
    rule of NVIDIA's own libraries, which take a GPU as attached to the fabric only once its state is
    completed with a success status), or one that reports the GPU unhealthy."""
    fabric = card.get("fabric")
    if not fabric:
        return []
    if fabric["state"] == "not started":
        return [FABRIC_NOT_STARTED]
    if fabric["state"] == "in progress":
        return [FABRIC_IN_PROGRESS]
    if fabric.get("status", "Success") != "Success":
        return [FABRIC_FAILED % fabric["status"]]
    return [FABRIC_UNHEALTHY] if fabric.get("healthSummary") == "unhealthy" else []


class FabricChecks:
    """When a long-lived session asks each card's fabric again: every ``interval()`` seconds (the costly
    counters' interval, as it is now) and after an XID of any card; between, it reuses what it read (a fabric
    read is an NVML call per NVLink). Used as the session's ``SettledChecks`` is: ``start`` at each read,
    then ``reuse`` and ``read`` per card."""

    def __init__(self, interval):
        self.interval = interval
        self._kept = {}   # card index -> (clock, XIDs seen, the fabric facts)
        self._now = self._xids = None

    def start(self, now, xids):
        self._now, self._xids = now, xids

    def reuse(self, index):
        """Card ``index``'s fabric facts to reuse, or None: ask them."""
        kept = self._kept.get(index)
        if kept is None or kept[1] != self._xids or self._now - kept[0] >= self.interval():
            return None
        return kept[2]

    def read(self, index, card):
        """After card ``index``'s fabric was asked."""
        self._kept[index] = (self._now, self._xids, {key: dict(card[key]) for key in KEYS if key in card})

    def forget(self):
        self._kept.clear()
