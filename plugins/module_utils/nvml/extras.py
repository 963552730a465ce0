# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The readings behind dcgm-exporter's default counters that gpu_facts's card did not have (private).

Memory temperature and the encoder and decoder utilization come with telemetry; energy, PCIe
replays, NVLink traffic and the vGPU licence make the ``counters`` subset. Each reader takes a
card reader (``card._CardReader``) and the card's dict.
"""

from __future__ import annotations

from ansible_collections.scv.gpu.plugins.module_utils.nvml.api import (
    FI_DEV_MEMORY_TEMP,
    FI_DEV_NVLINK_BANDWIDTH_C0_TOTAL,
    FI_DEV_PCIE_REPLAY_COUNTER,
    FI_DEV_TOTAL_ENERGY_CONSUMPTION,
    GPU_VIRTUALIZATION_MODE_VGPU,
    GRID_LICENSE_FEATURE_CODE_VGPU,
    pynvml,
)

# Field values read with the recovery action when telemetry is asked for: fact key, NVML field.
TELEMETRY_FIELDS = {"memoryTemperature": FI_DEV_MEMORY_TEMP}
# Field values of the counters subset: costly (4.3 ms for the energy on an H100), so an NVML session
# reads them on a cadence of their own.
COUNTER_FIELDS = {
    "energyConsumption": FI_DEV_TOTAL_ENERGY_CONSUMPTION,
    "pcieReplayCount": FI_DEV_PCIE_REPLAY_COUNTER,
    "nvlinkBandwidthTotal": FI_DEV_NVLINK_BANDWIDTH_C0_TOTAL,
}
COUNTER_KEYS = tuple(COUNTER_FIELDS) + ("vgpuLicenseStatus",)


def field_value(field):
    """A field value's number, whatever its type."""
    return {0: field.value.dVal, 1: field.value.uiVal, 2: field.value.ulVal, 3: field.value.ullVal,
            4: field.value.sllVal, 5: field.value.siVal, 6: field.value.usVal}.get(field.valueType, field.value.ullVal)


def read_codecs(reader, card):
    for key, what, function in (("encoderUtilization", "encoder utilization", pynvml.nvmlDeviceGetEncoderUtilization),
                                ("decoderUtilization", "decoder utilization", pynvml.nvmlDeviceGetDecoderUtilization)):
        value = reader.query(what, function)
        if value is not None:
            card[key] = value[0]


def read_virtualization(reader, card):
    mode = reader.query("virtualization mode", pynvml.nvmlDeviceGetVirtualizationMode)
    if mode is not None:
        card["virtualizationMode"] = mode


def read_counters(reader, card, wanted=None):
    """The costly counters into ``card``; with ``wanted`` (fact keys), only those (the energy field alone
    costs 4.3 ms on an H100, so a series nobody serves is not read)."""
    keys = [key for key in COUNTER_FIELDS if wanted is None or key in wanted]
    fields = reader.query("energy and PCIe counters", pynvml.nvmlDeviceGetFieldValues,
                          [COUNTER_FIELDS[key] for key in keys]) if keys else None
    for field, key in zip(fields or (), keys):
        if field.nvmlReturn == 0:
            card[key] = field_value(field)
    if card.get("virtualizationMode") == GPU_VIRTUALIZATION_MODE_VGPU and \
            (wanted is None or "vgpuLicenseStatus" in wanted):
        features = reader.query("vGPU licence", pynvml.nvmlDeviceGetGridLicensableFeatures)
        for feature in (features.gridLicensableFeatures[:features.licensableFeaturesCount] if features else ()):
            if feature.featureCode == GRID_LICENSE_FEATURE_CODE_VGPU:
                card["vgpuLicenseStatus"] = int(feature.featureState)
