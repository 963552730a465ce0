# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Kubernetes names checked in playbooks with the rule the modules apply (module_utils/common/names.py)."""

from __future__ import annotations

from ansible_collections.scv.gpu.plugins.module_utils.common.names import node_name_problem


def scv_gpu_node_name_problem(name):
    """Why ``name`` cannot be a Kubernetes node's name, or None when it can."""
    return node_name_problem(name)


class FilterModule:
    def filters(self):
        return {"node_name_problem": scv_gpu_node_name_problem}
