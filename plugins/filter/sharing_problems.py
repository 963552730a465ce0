# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""NVIDIA device plugin configs (time-slicing, MPS) checked and completed in playbooks, with the rules of
module_utils/node/sharing.py."""

from __future__ import annotations

from ansible_collections.scv.gpu.plugins.module_utils.node import sharing


def scv_gpu_sharing_problems(configs, mig_strategy="none", default="", choice="", flavor="nvidia"):
    """What is wrong with the configs, the default config and one host's choice; empty when all is well."""
    return sharing.config_problems(configs, mig_strategy, default or "", choice or "", flavor)


def scv_gpu_sharing_host_problems(configs, choice, fact, node):
    """Why the host's chosen config cannot run on its GPUs (MPS on MIG, too many MPS clients)."""
    return sharing.host_problems(configs or {}, choice or "", fact, node)


def scv_gpu_sharing_configs(configs, mig_strategy="none"):
    """The configs as the ConfigMap holds them: version v1 and flags.migStrategy filled in."""
    return {name: sharing.completed(config, mig_strategy) for name, config in (configs or {}).items()}


def scv_gpu_sharing_default(configs, default=""):
    """The config a node without a choice gets, or '' where there is none."""
    return sharing.default_config(configs or {}, default or "")


def scv_gpu_sharing_mps(configs, choices):
    """Whether any of the chosen config names shares GPUs with MPS."""
    return any(sharing.uses_mps(configs or {}, choice) for choice in choices or [])


class FilterModule:
    def filters(self):
        return {"sharing_problems": scv_gpu_sharing_problems,
                "sharing_host_problems": scv_gpu_sharing_host_problems,
                "sharing_configs": scv_gpu_sharing_configs,
                "sharing_default": scv_gpu_sharing_default,
                "sharing_mps": scv_gpu_sharing_mps}
