# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The one-shot reading behind ``gpu_facts``: initialise NVML, read every card, shut it down (private)."""

from __future__ import annotations

from ansible_collections.scv.gpu.plugins.module_utils.common.gpu_info import cuda_version_string, node_totals
from ansible_collections.scv.gpu.plugins.module_utils.nvml.api import (
    UNAVAILABLE_REASONS,
    as_text,
    describe,
    error_code,
    pynvml,
    text_call,
)
from ansible_collections.scv.gpu.plugins.module_utils.nvml.card import read_card


def unavailable(reason):
    facts = {"nvml_available": False, "nvml_error": reason, "cardList": []}
    facts.update(node_totals([]))
    return facts


def init_failure_reason(error):
    code = error_code(error)
    return UNAVAILABLE_REASONS.get(code, "NVML could not be initialised: %s" % describe(error))


def system_facts():
    """The driver's, NVML's and CUDA's versions; a query that fails leaves its key out and says why in
    ``system_errors`` ({key: NVML's answer}), so that a missing version is never silent."""
    facts = {"nvml_available": True, "nvml_error": None}
    for key, function, convert in (
        ("driver_version", pynvml.nvmlSystemGetDriverVersion, as_text),
        ("nvml_version", pynvml.nvmlSystemGetNVMLVersion, as_text),
        ("cuda_driver_version", pynvml.nvmlSystemGetCudaDriverVersion, cuda_version_string),
    ):
        try:
            facts[key] = convert(text_call(function))
        except pynvml.NVMLError as error:
            facts.setdefault("system_errors", {})[key] = describe(error)
    return facts


def collect(subsets):
    """Every GPU's facts, as the ``nvidia_gpu`` fact of ``gpu_facts``.

    ``subsets`` names the optional parts to read (see ``GATHER_SUBSETS``).
    Never raises for a missing driver or a failing card: the driver's absence
    is reported in ``nvml_available``/``nvml_error``, a failing card as
    Unhealthy with its reasons. Initialises NVML and shuts it down again: for
    repeated reads, a :class:`Session` costs far less.
    """
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        return unavailable(init_failure_reason(error))
    try:
        facts = system_facts()
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as error:
            facts.update(unavailable("NVML cannot count the GPUs: %s" % describe(error)))
            return facts
        cards = [read_card(index, subsets) for index in range(count)]
        facts["cardList"] = cards
        facts.update(node_totals(cards))
        return facts
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
