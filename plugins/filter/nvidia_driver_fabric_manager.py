# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The nvidia_driver role's Fabric Manager plan and packages (see module_utils/host/fabric_manager.py)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.scv.gpu.plugins.module_utils.host import fabric_manager
from ansible_collections.scv.gpu.plugins.module_utils.host.driver import PlanError


def nvidia_driver_fabric_manager(facts, driver_info, setting="auto", driver_version="", fabric_manager_version="",
                                 installed_lines=None):
    """Whether the host whose ansible_facts are given gets Fabric Manager, from nvidia_driver_info's PCI reading."""
    try:
        return fabric_manager.plan(
            distribution=facts.get("distribution"), os_family=facts.get("os_family"), setting=setting,
            nvswitches=driver_info.get("pci_nvswitches") or [], pci_gpus=driver_info.get("pci_gpus") or [],
            driver_version=driver_version, fabric_manager_version=fabric_manager_version,
            installed_lines=installed_lines)
    except PlanError as error:
        raise AnsibleFilterError(str(error)) from None


def nvidia_driver_fabric_manager_packages(facts, driver_version, fabric_manager_version="", pinned=False):
    """The Fabric Manager package, install spec, pin and hold for the driver at ``driver_version``."""
    try:
        return fabric_manager.packages(facts.get("distribution"), facts.get("os_family"), driver_version,
                                       str(fabric_manager_version or ""), bool(pinned))
    except PlanError as error:
        raise AnsibleFilterError(str(error)) from None


def nvidia_driver_fabric_manager_unavailable(madison_lines, distribution, install, driver_package="", policy_lines=None):
    """Why apt cannot install Fabric Manager's ``install`` spec, from ``apt-cache madison``'s lines; '' when it can.

    With ``policy_lines`` (``apt-cache policy driver_package``, for an unpinned driver), ``install`` is the
    Fabric Manager of the driver apt would install, and the answer names that driver too.
    """
    if policy_lines is not None:
        return fabric_manager.candidate_problem(distribution, driver_package, policy_lines, install, madison_lines) or ""
    return fabric_manager.availability_problem(distribution, install, madison_lines) or ""


def nvidia_driver_fabric_manager_candidate(policy_lines, facts, fabric_manager_version=""):
    """The Fabric Manager install spec for the driver ``apt-cache policy``'s lines name as the candidate;
    '' when apt names none (the driver's own install then says why)."""
    candidate, _versions = fabric_manager.apt_candidate(policy_lines)
    if not candidate:
        return ""
    return nvidia_driver_fabric_manager_packages(facts, candidate, fabric_manager_version)["install"]


class FilterModule:
    def filters(self):
        return {"nvidia_driver_fabric_manager": nvidia_driver_fabric_manager,
                "nvidia_driver_fabric_manager_packages": nvidia_driver_fabric_manager_packages,
                "nvidia_driver_fabric_manager_unavailable": nvidia_driver_fabric_manager_unavailable,
                "nvidia_driver_fabric_manager_candidate": nvidia_driver_fabric_manager_candidate}
