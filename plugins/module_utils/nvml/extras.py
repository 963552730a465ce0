# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The readings behind dcgm-exporter's default counters that gpu_facts's card did not have (private).

Memory temperature and the encoder and decoder utilization come with telemetry; energy, PCIe
replays, NVLink traffic and the vGPU licence make the ``counters`` subset. Each reader takes a
card reader (``card._CardReader``) and the card's dict.
"""

from __future__ import annotations

from ansible_collections.scv.gpu.plugins.module_utils.nvml import series
from ansible_collections.scv.gpu.plugins.module_utils.nvml.api import (
    GPU_VIRTUALIZATION_MODE_VGPU,
    GRID_LICENSE_FEATURE_CODE_VGPU,
    pynvml,
)


def _field_ids(cadence):
    """{fact key: NVML field id} of the series table's fields of ``cadence``, in its order; a field that the
    installed pynvml does not name is left out (its series is absent, as one the card cannot give)."""
    names = series.field_names(cadence)
    return {key: getattr(pynvml, name) for key, name in names.items() if hasattr(pynvml, name)}


# Field values read with the recovery action when telemetry is asked for: fact key, NVML field.
TELEMETRY_FIELDS = _field_ids("scrape")
# Field values of the counters subset: costly (4.3 ms for the energy on an H100), so an NVML session
# reads them on a cadence of their own.
COUNTER_FIELDS = _field_ids("counters")
COUNTER_KEYS = series.fact_keys("counters")


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
    fields = reader.query("energy, PCIe and other counters", pynvml.nvmlDeviceGetFieldValues,
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
