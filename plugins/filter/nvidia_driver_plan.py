# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The nvidia_driver role's install plan for a host (see module_utils/host/driver.py)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.scv.gpu.plugins.module_utils.host.driver import PlanError, plan


def nvidia_driver_plan(facts, branch="", version="", kernel_modules="auto", ubuntu_server=True,
                       secure_boot=False, secure_boot_key_enrolled=False, gpus=None):
    """The packages, pins, repository choices and commands for the host whose ansible_facts are given."""
    try:
        return plan(
            os_family=facts.get("os_family"),
            distribution=facts.get("distribution"),
            major_version=facts.get("distribution_major_version"),
            kernel=facts.get("kernel"),
            branch=str(branch or ""),
            version=str(version or ""),
            kernel_modules=kernel_modules,
            ubuntu_server=bool(ubuntu_server),
            secure_boot=bool(secure_boot),
            signing_key_enrolled=bool(secure_boot_key_enrolled),
            gpus=list(gpus or []),
            distribution_version=str(facts.get("distribution_version") or ""),
            architecture=facts.get("architecture") or "",
        )
    except PlanError as error:
        raise AnsibleFilterError(str(error)) from None


class FilterModule:
    def filters(self):
        return {"nvidia_driver_plan": nvidia_driver_plan}
