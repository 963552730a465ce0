# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The nvidia_driver role's reboot decision (see module_utils/host/driver.py)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.scv.gpu.plugins.module_utils.host.driver import PlanError, reboot_decision, reboot_reasons


def nvidia_driver_reboot(state, policy, connection, driver_changed=False, pending=None, kernel_modules=None):
    """{'reboot': bool, 'reasons': [...], 'message': str} from nvidia_driver_info's result; ``pending`` adds
    reasons found elsewhere (the module options that wait for a reboot); ``kernel_modules``: the flavour installed
    (the plan's), compared with the loaded module's (``loaded_kernel_modules``)."""
    reasons = reboot_reasons(state.get("loaded_version"), state.get("installed_version"), state.get("nouveau_loaded"),
                             state.get("nova_loaded"), state.get("loaded_kernel_modules"), kernel_modules)
    reasons += [reason for reason in (pending or []) if reason]
    try:
        reboot, message = reboot_decision(policy, reasons, connection, bool(driver_changed))
    except PlanError as error:
        raise AnsibleFilterError(str(error)) from None
    return {"reboot": reboot, "reasons": reasons, "message": message}


class FilterModule:
    def filters(self):
        return {"nvidia_driver_reboot": nvidia_driver_reboot}
