# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""GPU performance monitoring (GPM, Hopper and later): engine activity between two reads (private)."""

from __future__ import annotations

from ansible_collections.scv.gpu.plugins.module_utils.nvml.api import (
    GPM_ANY_TENSOR_UTIL,
    GPM_DRAM_BW_UTIL,
    GPM_GRAPHICS_UTIL,
    GPM_PCIE_RX_PER_SEC,
    GPM_PCIE_TX_PER_SEC,
    pynvml,
)

# Fact key and GPM metric: percentages of time (tensor pipe, graphics engine, DRAM interface
# busy) and PCIe traffic in MiB per second, each the average between two samples.
METRICS = (
    ("tensorUtilization", GPM_ANY_TENSOR_UTIL),
    ("graphicsActivity", GPM_GRAPHICS_UTIL),
    ("dramActivity", GPM_DRAM_BW_UTIL),
    ("pcieTxMiBPerSecond", GPM_PCIE_TX_PER_SEC),
    ("pcieRxMiBPerSecond", GPM_PCIE_RX_PER_SEC),
)
KEYS = tuple(key for key, _metric in METRICS)


class GpmActivity:
    """The GPM metrics per card, averaged since the card's previous sample.

    GPM compares two samples, so a card's first read gives nothing; a card without GPM is asked
    once per session. Each read costs a sample (0.18 ms on an H100) and a metrics request, so a
    session reads it on the counters' cadence, not every tick. Not thread-safe: the reading
    thread alone calls it.
    """

    def __init__(self):
        self._cards = {}   # card index -> {"supported": bool, "previous": GPM sample}

    def read(self, index, handle, card):
        state = self._cards.get(index)
        if state is None:
            try:
                supported = bool(pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
            except pynvml.NVMLError:
                supported = False
            state = self._cards[index] = {"supported": supported, "previous": None}
        if not state["supported"]:
            return
        try:
            sample = pynvml.nvmlGpmSampleAlloc()
            pynvml.nvmlGpmSampleGet(handle, sample)
        except pynvml.NVMLError:
            return
        previous, state["previous"] = state["previous"], sample
        if previous is None:
            return
        try:
            request = pynvml.c_nvmlGpmMetricsGet_t()
            request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(METRICS)
            request.sample1, request.sample2 = previous, sample
            for position, (_key, metric) in enumerate(METRICS):
                request.metrics[position].metricId = metric
            pynvml.nvmlGpmMetricsGet(request)
            for position, (key, _metric) in enumerate(METRICS):
                if request.metrics[position].nvmlReturn == 0:
                    card[key] = round(request.metrics[position].value, 2)
        except pynvml.NVMLError:
            pass
        finally:
            _free(previous)

    def free(self):
        """Frees every sample kept (before NVML shuts down)."""
        for state in self._cards.values():
            if state.get("previous") is not None:
                _free(state["previous"])
        self._cards = {}


def _free(sample):
    try:
        pynvml.nvmlGpmSampleFree(sample)
    except pynvml.NVMLError:
        pass
