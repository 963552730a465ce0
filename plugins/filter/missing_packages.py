# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Check mode's package probes: which packages dpkg lacks (see module_utils/host/packages.py)."""

from __future__ import annotations

from ansible_collections.scv.gpu.plugins.module_utils.host.packages import missing_packages


def scv_gpu_missing_packages(dpkg_lines, wanted):
    """``wanted`` packages (``name`` or ``name=version``) that ``dpkg_lines`` do not show installed."""
    return missing_packages(list(wanted or []), list(dpkg_lines or []))


class FilterModule:
    def filters(self):
        return {"missing_packages": scv_gpu_missing_packages}
