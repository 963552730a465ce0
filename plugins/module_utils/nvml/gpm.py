# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""GPU performance monitoring (GPM, Hopper and later): tensor activity between two reads (private)."""

from __future__ import annotations

from ansible_collections.scv.gpu.plugins.module_utils.nvml.api import GPM_ANY_TENSOR_UTIL, pynvml


class TensorActivity:
    """``tensorUtilization`` per card: percent of time the SMs did tensor work since the last read.

    GPM compares two samples, so the first read of a session gives nothing; a card without
    GPM is asked once per session. Not thread-safe: the reading thread alone calls it.
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
            request.numMetrics = 1
            request.sample1, request.sample2 = previous, sample
            request.metrics[0].metricId = GPM_ANY_TENSOR_UTIL
            pynvml.nvmlGpmMetricsGet(request)
            if request.metrics[0].nvmlReturn == 0:
                card["tensorUtilization"] = round(request.metrics[0].value, 2)
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
