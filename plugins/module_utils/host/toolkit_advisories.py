# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""NVIDIA Container Toolkit releases with known container-escape vulnerabilities (private; pure).

Each entry is a CVE from one of NVIDIA's security bulletins for the toolkit, and the first release that fixes
it. A toolkit version before a fix is exposed to that CVE. Bulletins are at
https://nvidia.custhelp.com/app/answers/detail/a_id/<answer>.
"""

from __future__ import annotations

import re

# (CVE, first fixed release, bulletin answer ID, bulletin month, what an attacker gains)
ADVISORIES = (
    ("CVE-2024-0132", "1.16.2", 5582, "September 2024", "host file system access from a crafted image"),
    ("CVE-2024-0134", "1.17.0", 5585, "November 2024", "files created on the host by a crafted image"),
    ("CVE-2024-0135", "1.17.3", 5599, "January 2025", "host binaries modified by a crafted image"),
    ("CVE-2024-0136", "1.17.3", 5599, "January 2025", "host device access (non-default configurations)"),
    ("CVE-2025-23359", "1.17.4", 5616, "February 2025", "host file system access (bypass of CVE-2024-0132's fix)"),
    ("CVE-2025-23266", "1.17.8", 5659, "July 2025", "code run as root on the host through a hook's environment"),
    ("CVE-2025-23267", "1.17.8", 5659, "July 2025", "host files changed through the update-ldcache hook"),
    ("CVE-2026-24260", "1.19.1", 5850, "June 2026", "code run on the host through a race in a CDI hook"),
)

# The first release past every fix above: the oldest a role installs without being told to accept the risk.
FIXED_RELEASE = max((fixed for _cve, fixed, *_rest in ADVISORIES), key=lambda text: tuple(map(int, text.split("."))))

# apt's and dnf's spellings: an optional epoch, the upstream version (a pre-release after "~" or "-rc"), and an
# optional package revision ("-1", "-1.el9").
_VERSION = re.compile(r"^(?:\d+:)?(\d+)\.(\d+)\.(\d+)(~[0-9A-Za-z.~+]*|-rc\.?\d+)?(?:-[0-9A-Za-z.+~]+)?\Z")


class ToolkitVersionError(ValueError):
    """The version is not one of NVIDIA's toolkit releases as apt or dnf spells it."""


def release(version):
    """(major, minor, patch, is a pre-release) of ``version``: ``1.17.8``, ``1.17.8-1``, ``1.18.0~rc.2-1``."""
    match = _VERSION.match(str(version))
    if not match:
        raise ToolkitVersionError(
            "%r is not a toolkit version as apt or dnf spells it (1.20.2-1, 1.20.2-1 on RPM hosts, or 1.20.2)"
            % (version,))
    return int(match.group(1)), int(match.group(2)), int(match.group(3)), match.group(4) is not None


def exposures(version):
    """The advisories ``version`` predates: [{cve, fixed, bulletin, url, impact}], in the order of their fixes
    (the last names the release that fixes them all).

    A pre-release of a fixed release (1.19.1~rc.1) predates that fix.
    """
    major, minor, patch, pre = release(version)
    found = []
    for cve, fixed, answer, month, impact in ADVISORIES:
        fix = tuple(map(int, fixed.split(".")))
        if (major, minor, patch) < fix or ((major, minor, patch) == fix and pre):
            found.append({"cve": cve, "fixed": fixed, "bulletin": "NVIDIA security bulletin, %s" % month,
                          "url": "https://nvidia.custhelp.com/app/answers/detail/a_id/%d" % answer,
                          "impact": impact})
    return found
