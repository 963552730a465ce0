# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What NVIDIA's device plugin offers for a node's GPUs under a MIG strategy (module_utils/node/labels.py)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.scv.gpu.plugins.module_utils.node.labels import MIG_STRATEGIES, device_plugin_resources


def scv_gpu_device_plugin_resources(fact, mig_strategy="none"):
    if mig_strategy not in MIG_STRATEGIES:
        raise AnsibleFilterError("device_plugin_resources: the MIG strategy is none, single or mixed, not %r"
                                 % (mig_strategy,))
    if not isinstance(fact, dict):
        raise AnsibleFilterError("device_plugin_resources: pass the nvidia_gpu fact of scv.gpu.gpu_facts")
    return device_plugin_resources(fact, mig_strategy)


class FilterModule:
    def filters(self):
        return {"device_plugin_resources": scv_gpu_device_plugin_resources}
