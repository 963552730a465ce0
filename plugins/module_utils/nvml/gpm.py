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
# What GPM gives per GPU instance: the engines' activity (PCIe traffic is the GPU's only)
INSTANCE_METRICS = METRICS[:3]


class GpmActivity:
    """The GPM metrics per card, averaged since the card's previous sample.

    GPM compares two samples, so a card's first read gives nothing; a card without GPM is asked
    once per session. Each read costs a sample (0.18 ms on an H100) and a metrics request, so a
    session reads it on the counters' cadence, not every tick. Each card keeps two sample buffers,
    used in turn. Not thread-safe: the reading
    thread alone calls it.
    """

    def __init__(self):
        # card index, or (card index, GPU instance ID) -> {"supported": bool, "previous": the last sample, "spare": a
        # sample buffer to take the next one in (two per card, used in turn: no allocation per read)}
        self._cards = {}

    def read(self, index, handle, card, instance=None):
        """Puts the metrics since the last read of card ``index`` (``handle``) in ``card``; with ``instance``, those
        of that GPU instance of the card (MIG on: ``card`` is then the instance's readings, and only the engines'
        activity is asked, GPM having no PCIe traffic per GPU instance)."""
        key = index if instance is None else (index, instance)
        state = self._cards.get(key)
        if state is None:
            try:
                supported = bool(pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
            except pynvml.NVMLError:
                supported = False
            state = self._cards[key] = {"supported": supported, "previous": None, "spare": None}
        if not state["supported"]:
            return
        try:
            sample = state["spare"] or pynvml.nvmlGpmSampleAlloc()
        except pynvml.NVMLError:
            return
        state["spare"] = None
        try:
            if instance is None:
                pynvml.nvmlGpmSampleGet(handle, sample)
            else:
                pynvml.nvmlGpmMigSampleGet(handle, instance, sample)
        except pynvml.NVMLError:
            state["spare"] = sample
            return
        previous, state["previous"] = state["previous"], sample
        if previous is None:
            return
        state["spare"] = previous
        _metrics(previous, sample, card, METRICS if instance is None else INSTANCE_METRICS)

    def forget(self, keep):
        """Frees the samples of the GPU instances not in ``keep`` ({(card index, GPU instance ID)}): destroyed."""
        for key in [key for key in self._cards if isinstance(key, tuple) and key not in keep]:
            _free_state(self._cards.pop(key))

    def free(self):
        """Frees every sample kept (before NVML shuts down)."""
        for state in self._cards.values():
            _free_state(state)
        self._cards = {}


def _metrics(first, second, card, metrics):
    """Puts ``metrics`` between samples ``first`` and ``second`` in ``card``."""
    try:
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(metrics)
        request.sample1, request.sample2 = first, second
        for position, (_key, metric) in enumerate(metrics):
            request.metrics[position].metricId = metric
        pynvml.nvmlGpmMetricsGet(request)
        for position, (key, _metric) in enumerate(metrics):
            if request.metrics[position].nvmlReturn == 0:
                card[key] = round(request.metrics[position].value, 2)
    except pynvml.NVMLError:
        pass


def _free_state(state):
    for sample in (state.get("previous"), state.get("spare")):
        if sample is not None:
            _free(sample)


def _free(sample):
    try:
        pynvml.nvmlGpmSampleFree(sample)
    except pynvml.NVMLError:
        pass
