# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The container-escape advisories a pinned NVIDIA Container Toolkit version predates."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.scv.gpu.plugins.module_utils.host.toolkit_advisories import (
    FIXED_RELEASE, ToolkitVersionError, exposures)


def scv_gpu_container_toolkit_exposures(version):
    """``version``'s advisories (see module_utils/host/toolkit_advisories.py); [] for an empty pin (the latest)."""
    if version in (None, ""):
        return []
    try:
        return exposures(version)
    except ToolkitVersionError as error:
        raise AnsibleFilterError("container_toolkit_version: %s; the oldest release without a known "
                                 "container-escape vulnerability is %s" % (error, FIXED_RELEASE)) from error


class FilterModule:
    def filters(self):
        return {"container_toolkit_exposures": scv_gpu_container_toolkit_exposures}
