# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What NVIDIA's device plugin offers for a node's GPUs under a MIG strategy, and why it would not
start (module_utils/node/device_plugin.py)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.scv.gpu.plugins.module_utils.node.device_plugin import (
    PluginRefusal,
    device_plugin_resources,
    laid_out,
    refusal,
)
from ansible_collections.scv.gpu.plugins.module_utils.node.labels import MIG_STRATEGIES


def _checked(name, fact, mig_strategy, layout):
    if mig_strategy not in MIG_STRATEGIES:
        raise AnsibleFilterError("%s: the MIG strategy is none, single or mixed, not %r" % (name, mig_strategy))
    if not isinstance(fact, dict):
        raise AnsibleFilterError("%s: pass the nvidia_gpu fact of scv.gpu.gpu_facts" % name)
    if layout is not None and not isinstance(layout, list):
        raise AnsibleFilterError("%s: layout is the gpus list of a scv.gpu.mig_layout result, not %r" % (name, layout))
    return laid_out(fact, layout) if layout else fact


def scv_gpu_device_plugin_resources(fact, mig_strategy="none", layout=None):
    fact = _checked("device_plugin_resources", fact, mig_strategy, layout)
    try:
        return device_plugin_resources(fact, mig_strategy)
    except PluginRefusal as error:
        raise AnsibleFilterError("device_plugin_resources: %s" % error)


def scv_gpu_device_plugin_refusal(fact, mig_strategy="none", layout=None):
    return refusal(_checked("device_plugin_refusal", fact, mig_strategy, layout), mig_strategy) or ""


class FilterModule:
    def filters(self):
        return {"device_plugin_resources": scv_gpu_device_plugin_resources,
                "device_plugin_refusal": scv_gpu_device_plugin_refusal}
