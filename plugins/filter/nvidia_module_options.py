# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The nvidia_driver role's module options, checked and spelt for modprobe.d (see module_utils/host/module_params.py)."""

from __future__ import annotations

from ansible_collections.scv.gpu.plugins.module_utils.host.module_params import check_options


def nvidia_module_options(params):
    """{'options', 'problems', 'content'} from nvidia_driver_module_params."""
    return check_options(params)


class FilterModule:
    def filters(self):
        return {"nvidia_module_options": nvidia_module_options}
