# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What dpkg says is installed, against what a role asks for (private; pure, for check mode's probes)."""

from __future__ import annotations


def missing_packages(wanted, dpkg_lines):
    """The entries of ``wanted`` (``name`` or apt's ``name=version``) that dpkg does not have installed.

    ``dpkg_lines`` are dpkg-query's lines, ``name=version status`` (its ``--showformat``
    ``${Package}=${Version} ${db:Status-Status}``); a package dpkg does not know prints none.
    """
    installed = {}
    for line in dpkg_lines:
        spec, _sep, status = line.strip().rpartition(" ")
        name, sep, version = spec.partition("=")
        if sep and status == "installed":
            installed[name] = version
    missing = []
    for entry in wanted:
        name, sep, version = str(entry).partition("=")
        if name not in installed or (sep and installed[name] != version):
            missing.append(entry)
    return missing
