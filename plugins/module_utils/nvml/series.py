# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The DCGM series the agent serves, one row each: the one place to add a counter (private; data only).

Each row names the series as dcgm-exporter does, the card fact it is served from (a key, or a path into a nested
fact), where NVML gives it, when it is read, its help text, and the factor from the fact's unit to DCGM's. A row
of the ``scrape`` or ``counters`` cadence whose source is an NVML field (``NVML_FI_...``, pynvml's own constant,
looked up by name when read) is read by that subset's one field-values call: adding such a counter is one row here.
The ``tick`` rows are the health check's readings, which it reads itself. The agent's gauges, the NVML field
lists of the telemetry and counters subsets, the keys a scrape reads fresh, and the table in the ``scv_agent``
role's docs come from this table.

Cadences:

- ``scrape``: read fresh at each scrape (the telemetry subset); no tick reads them;
- ``tick``: read at every tick, since the Scv or the health check needs them;
- ``counters``: costly, read at most once per counters interval (the counters subset).
"""

from __future__ import annotations

from collections import namedtuple

Series = namedtuple("Series", "name fact source cadence help scale")
Series.__new__.__defaults__ = (None,)   # scale: (multiply by, divide by), from the fact's unit to DCGM's
CADENCES = {
    "scrape": "at each scrape, read fresh",
    "tick": "every tick",
    "counters": "at most once per counters interval",
}
FIELD_PREFIX = "NVML_FI_"
# GPM gives percentages and MiB per second; DCGM's profiling fields are ratios and bytes per second (a percentage is
# divided by 100, not multiplied by 0.01, so that 35 % reads 0.35, not 0.35000000000000003).
PERCENT = (1.0, 100.0)
MIB = (1048576.0, 1.0)

SERIES = (
    Series("DCGM_FI_DEV_GPU_UTIL", ("gpuUtilization",), "nvmlDeviceGetUtilizationRates", "scrape",
           "GPU utilization (in %)."),
    Series("DCGM_FI_DEV_MEM_COPY_UTIL", ("memoryUtilization",), "nvmlDeviceGetUtilizationRates", "scrape",
           "Memory utilization (in %)."),
    Series("DCGM_FI_DEV_FB_FREE", ("freeMemory",), "nvmlDeviceGetMemoryInfo", "tick",
           "Framebuffer memory free (in MiB)."),
    Series("DCGM_FI_DEV_FB_USED", ("usedMemory",), "nvmlDeviceGetMemoryInfo", "tick",
           "Framebuffer memory used (in MiB)."),
    Series("DCGM_FI_DEV_FB_RESERVED", ("reservedMemory",), "nvmlDeviceGetMemoryInfo", "tick",
           "Framebuffer memory reserved (in MiB)."),
    Series("DCGM_FI_DEV_GPU_TEMP", ("temperature",), "nvmlDeviceGetTemperature", "scrape", "GPU temperature (in C)."),
    Series("DCGM_FI_DEV_POWER_USAGE", ("powerDraw",), "nvmlDeviceGetPowerUsage", "scrape", "Power draw (in W)."),
    Series("DCGM_FI_DEV_SM_CLOCK", ("smClock",), "nvmlDeviceGetClockInfo", "scrape", "SM clock frequency (in MHz)."),
    Series("DCGM_FI_DEV_MEM_CLOCK", ("memClock",), "nvmlDeviceGetClockInfo", "scrape",
           "Memory clock frequency (in MHz)."),
    Series("DCGM_FI_DEV_MEMORY_TEMP", ("memoryTemperature",), "NVML_FI_DEV_MEMORY_TEMP", "scrape",
           "Memory temperature (in C)."),
    Series("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", ("energyConsumption",), "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
           "counters", "Total energy consumption since boot (in mJ)."),
    Series("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", ("pcieReplayCount",), "NVML_FI_DEV_PCIE_REPLAY_COUNTER", "counters",
           "Total number of PCIe retries."),
    Series("DCGM_FI_DEV_POWER_VIOLATION", ("powerCapThrottling",), "NVML_FI_DEV_PERF_POLICY_POWER", "counters",
           "Throttling duration due to power constraints (in us).", (1, 1000)),
    Series("DCGM_FI_DEV_ENC_UTIL", ("encoderUtilization",), "nvmlDeviceGetEncoderUtilization", "scrape",
           "Encoder utilization (in %)."),
    Series("DCGM_FI_DEV_DEC_UTIL", ("decoderUtilization",), "nvmlDeviceGetDecoderUtilization", "scrape",
           "Decoder utilization (in %)."),
    Series("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", ("nvlinkBandwidthTotal",), "NVML_FI_DEV_NVLINK_BANDWIDTH_C0_TOTAL",
           "counters", "Total number of NVLink bandwidth counters for all lanes."),
    Series("DCGM_FI_DEV_VGPU_LICENSE_STATUS", ("vgpuLicenseStatus",), "nvmlDeviceGetGridLicensableFeatures",
           "counters", "vGPU License status"),
    Series("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", ("tensorUtilization",), "nvmlGpmMetricsGet", "counters",
           "Ratio of cycles the tensor (HMMA / IMMA) pipe is active (from NVML GPM, Hopper and later).", PERCENT),
    Series("DCGM_FI_PROF_GR_ENGINE_ACTIVE", ("graphicsActivity",), "nvmlGpmMetricsGet", "counters",
           "Ratio of time the graphics engine is active.", PERCENT),
    Series("DCGM_FI_PROF_DRAM_ACTIVE", ("dramActivity",), "nvmlGpmMetricsGet", "counters",
           "Ratio of cycles the device memory interface is active sending or receiving data.", PERCENT),
    Series("DCGM_FI_PROF_PCIE_TX_BYTES", ("pcieTxMiBPerSecond",), "nvmlGpmMetricsGet", "counters",
           "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in "
           "bytes per second.", MIB),
    Series("DCGM_FI_PROF_PCIE_RX_BYTES", ("pcieRxMiBPerSecond",), "nvmlGpmMetricsGet", "counters",
           "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in "
           "bytes per second.", MIB),
    Series("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", ("eccErrors", "correctedVolatile"), "nvmlDeviceGetTotalEccErrors",
           "counters", "Total number of single-bit volatile ECC errors."),
    Series("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", ("eccErrors", "uncorrectedVolatile"), "nvmlDeviceGetTotalEccErrors",
           "tick", "Total number of double-bit volatile ECC errors."),
    Series("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", ("eccErrors", "correctedAggregate"), "nvmlDeviceGetTotalEccErrors",
           "counters", "Total number of single-bit persistent ECC errors."),
    Series("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", ("eccErrors", "uncorrectedAggregate"), "nvmlDeviceGetTotalEccErrors",
           "counters", "Total number of double-bit persistent ECC errors."),
    Series("DCGM_FI_DEV_RETIRED_PENDING", ("retiredPagesPending",), "nvmlDeviceGetRetiredPagesPendingStatus", "tick",
           "Pages pending retirement (1 when any)."),
    Series("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", ("remappedRows", "correctable"), "nvmlDeviceGetRemappedRows",
           "tick", "Number of remapped rows for correctable errors."),
    Series("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", ("remappedRows", "uncorrectable"), "nvmlDeviceGetRemappedRows",
           "tick", "Number of remapped rows for uncorrectable errors."),
    Series("DCGM_FI_DEV_ROW_REMAP_FAILURE", ("remappedRows", "failed"), "nvmlDeviceGetRemappedRows", "tick",
           "Whether remapping of rows has failed."),
    Series("DCGM_FI_DEV_ROW_REMAP_PENDING", ("remappedRows", "pending"), "nvmlDeviceGetRemappedRows", "tick",
           "Whether remapping of rows is pending."),
    Series("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", ("clockEventReasons",), "nvmlDeviceGetCurrentClocksEventReasons",
           "tick", "Current clock event reasons (bit mask of NVML's clock event reasons: 0x4 power cap, 0x8 hardware "
           "slowdown, 0x20 software thermal, 0x40 hardware thermal, 0x80 hardware power brake)."),
    Series("DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION", ("recoveryAction",), "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", "tick",
           "GPU recovery action the driver asks for (0 none, 1 GPU reset, 2 node reboot, 3 drain peer-to-peer, "
           "4 drain and reset)."),
    Series("DCGM_FI_DEV_FABRIC_MANAGER_STATUS", ("fabric",), "nvmlDeviceGetGpuFabricInfoV", "tick",
           "Fabric Manager status (0 not supported, 1 not started, 2 in progress, 3 success, 4 failure)."),
)


def field_names(cadence):
    """{fact key: pynvml's name of the NVML field} of the rows of ``cadence`` read as NVML fields."""
    return {row.fact[0]: row.source for row in SERIES if row.cadence == cadence and row.source.startswith(FIELD_PREFIX)}


def fact_keys(cadence):
    """The top-level fact keys of the rows of ``cadence``, in the table's order, each once."""
    return tuple(dict.fromkeys(row.fact[0] for row in SERIES if row.cadence == cadence))
