# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""NVIDIA Fabric Manager for the nvidia_driver role, as pure functions (private to the collection).

On an HGX board the GPUs reach each other through NVSwitch chips, and CUDA does not start (error
802, "system not yet initialized") until Fabric Manager has trained that fabric. Fabric Manager
refuses to start unless its version is exactly the loaded driver's, so the role installs it at the
driver's version, pins and holds it as it pins and holds the driver, and moves both together.
Whether a host needs it, which package carries it, and which plans would part it from the driver
are decided here, before anything changes, so that each choice can be tested without an HGX board.
"""

from __future__ import annotations

import fnmatch
import re

from ansible_collections.scv.gpu.plugins.module_utils.host.driver import (
    PlanError, same_version, upstream_version, version_problem)

SETTINGS = ("auto", "true", "false")
SERVICE = "nvidia-fabricmanager"

# The branch from which NVIDIA's CUDA repositories name the package without its branch.
UNBRANCHED_FROM = 580

# GPUs of HGX boards with fourth-generation NVSwitches (NVLink 5): their fabric needs NVIDIA's NVLink
# Subnet Manager (nvlsm) and the ib_umad module besides Fabric Manager, which this role does not
# install. Their switches are not NVIDIA PCI functions, so the GPUs are what tells such a board.
NVLINK5_GPUS = {"0x2901": "NVIDIA B200"}

# Installed Fabric Manager packages (not their -dev/-devel companions), as dpkg-query or rpm lists them.
_PACKAGE = re.compile(r"^nvidia-fabric-?manager(-\d+)?$")


def package_name(distribution, os_family, branch):
    """The Fabric Manager package for a driver branch.

    - Ubuntu: the archive's multiverse component, nvidia-fabricmanager-<branch> (source
      fabric-manager-<branch>), in every branch it packages, as the driver comes from the archive too.
    - Debian: Debian's archive has none; NVIDIA's CUDA repository for Debian names it
      nvidia-fabricmanager-<branch> up to branch 575 and nvidia-fabricmanager from 580.
    - The RHEL family: NVIDIA's CUDA repository, where the driver comes from too, names it
      nvidia-fabric-manager up to branch 575 and nvidia-fabricmanager from 580.
    """
    branch = int(branch)
    if distribution == "Ubuntu":
        return "nvidia-fabricmanager-%d" % branch
    if distribution == "Debian":
        return "nvidia-fabricmanager" if branch >= UNBRANCHED_FROM else "nvidia-fabricmanager-%d" % branch
    if os_family == "RedHat":
        return "nvidia-fabricmanager" if branch >= UNBRANCHED_FROM else "nvidia-fabric-manager"
    raise PlanError("Fabric Manager is packaged for Debian, Ubuntu and the RHEL family, not %s (%s)"
                    % (distribution, os_family))


# Where each distribution's Fabric Manager comes from, for the message when a host's sources lack it.
SOURCES = {
    "Ubuntu": "Ubuntu's multiverse component (enable it in the host's apt sources)",
    "Debian": "NVIDIA's CUDA repository for Debian (Debian's archive has none: add "
              "https://developer.download.nvidia.com/compute/cuda/repos/debian<release>/<arch>/, or a mirror of it)",
}


def availability_problem(distribution, install, madison_lines):
    """Why apt cannot install ``install`` ('name=version-pattern'), from ``apt-cache madison name``'s lines
    ('name | version | source'); None when a version it offers matches."""
    name, _sep, pattern = install.partition("=")
    offered = _offered(name, madison_lines)
    if any(fnmatch.fnmatchcase(version, pattern) for version in offered):
        return None
    return ("%s %s is not in this host's apt sources (%s). Fabric Manager must be the driver's exact version, so "
            "the driver is not changed without it: it comes from %s. Add it, or set nvidia_driver_fabric_manager: "
            "false. No package has been changed." % (
                name, pattern, "they offer %s" % ", ".join(offered) if offered else "they offer no version of it",
                SOURCES.get(distribution, "the distribution's repositories")))


def _offered(name, madison_lines):
    """The versions of ``name`` that ``apt-cache madison``'s lines ('name | version | source') offer, in their order."""
    offered = []
    for line in madison_lines or []:
        fields = [part.strip() for part in line.split("|")]
        if len(fields) >= 3 and fields[0] == name and fields[1] not in offered:
            offered.append(fields[1])
    return offered


_POLICY_VERSION = re.compile(r"^\s+(?:\*\*\*\s+)?(\S+)\s+-?\d+$")


def apt_candidate(policy_lines):
    """From ``apt-cache policy <package>``'s lines: (the candidate apt would install, or '' when it names none;
    the versions its table lists)."""
    candidate, versions = "", []
    for line in policy_lines or []:
        if line.strip().startswith("Candidate:"):
            candidate = line.split(":", 1)[1].strip()
        match = _POLICY_VERSION.match(line)
        if match:    # each version once: its sources follow it on lines of their own
            versions.append(match.group(1))
    return ("" if candidate == "(none)" else candidate), versions


def candidate_problem(distribution, driver_package, policy_lines, install, madison_lines):
    """Why the unpinned driver apt would install (``apt-cache policy driver_package``'s candidate) cannot have
    Fabric Manager ``install`` ('name=<upstream>-*', from packages()) beside it; None when the sources offer it."""
    candidate, driver_versions = apt_candidate(policy_lines)
    name, _sep, pattern = install.partition("=")
    offered = _offered(name, madison_lines)
    if not candidate or any(fnmatch.fnmatchcase(version, pattern) for version in offered):
        return None
    both = [version for version in driver_versions
            if any(same_version(version, fabric_manager) for fabric_manager in offered)]
    return ("nvidia_driver_version is empty, so apt would install the branch's newest driver, %s %s, but this "
            "host's apt sources offer %s, not %s %s, and Fabric Manager starts only at the driver's exact "
            "version, so the driver is not changed without it. Set nvidia_driver_version to a driver version the "
            "sources offer Fabric Manager at too (%s), add %s %s from %s, or set nvidia_driver_fabric_manager: "
            "false. No package has been changed." % (
                driver_package, candidate,
                "%s only at %s" % (name, ", ".join(offered)) if offered else "no version of %s" % name,
                name, upstream_version(candidate),
                ", ".join(both) if both else "they offer none now", name, upstream_version(candidate),
                SOURCES.get(distribution, "the distribution's repositories")))


def installed_packages(lines):
    """The installed Fabric Manager packages from lines '<status> <package> <version>' (dpkg-query's
    ${db:Status-Abbrev}, where 'hi' is held; the role writes rpm's as 'ii', with 'hi' for a versionlocked
    one): dicts with ``package``, ``version`` and ``held``."""
    found = []
    for line in lines or []:
        fields = line.split()
        if len(fields) == 3 and fields[0][1:2] == "i" and _PACKAGE.match(fields[1]):
            found.append({"package": fields[1], "version": fields[2], "held": fields[0][0] == "h"})
    return found


def decide(setting, nvswitches, pci_gpus):
    """Whether this host gets Fabric Manager: (wanted, why). Raises PlanError for a board whose fabric
    needs more than Fabric Manager."""
    setting = str(setting).lower()
    if setting not in SETTINGS:
        raise PlanError("nvidia_driver_fabric_manager must be one of %s, not %r" % (", ".join(SETTINGS), setting))
    blackwell = sorted({NVLINK5_GPUS[gpu.get("deviceId")] for gpu in pci_gpus or []
                        if gpu.get("deviceId") in NVLINK5_GPUS})
    if blackwell and setting != "false":
        raise PlanError(
            "this host's GPUs (%s) sit on an HGX board with fourth-generation NVSwitches (NVLink 5), whose fabric "
            "needs NVIDIA's NVLink Subnet Manager (package nvlsm) and the ib_umad kernel module besides Fabric "
            "Manager; this role does not install those. Install the driver's Fabric Manager and nvlsm and load "
            "ib_umad as NVIDIA's Fabric Manager user guide says, then set nvidia_driver_fabric_manager: false to "
            "have this role manage the driver alone. Nothing has been changed." % ", ".join(blackwell))
    if setting == "false":
        return False, "nvidia_driver_fabric_manager is false"
    if nvswitches:
        generations = sorted({switch.get("generation") or "unknown generation" for switch in nvswitches})
        return True, "the PCI bus has %d NVSwitch chip(s) (%s)" % (len(nvswitches), ", ".join(generations))
    if setting == "true":
        return True, "nvidia_driver_fabric_manager is true"
    return False, "no NVSwitch on the PCI bus"


def version_problems(wanted, driver_version, fabric_manager_version, installed):
    """Why a plan would leave the driver and Fabric Manager on different versions; empty when it would not.

    ``driver_version``: nvidia_driver_version (empty: the branch's newest, known only once installed);
    ``fabric_manager_version``: nvidia_driver_fabric_manager_version; ``installed``: from installed_packages.
    """
    problems = [problem for problem in (version_problem("nvidia_driver_version", driver_version),
                                        version_problem("nvidia_driver_fabric_manager_version", fabric_manager_version))
                if problem]
    if problems:
        return problems
    if wanted and fabric_manager_version:
        if not driver_version:
            problems.append("nvidia_driver_fabric_manager_version is %s and nvidia_driver_version is empty, so the "
                            "driver would be the branch's newest, whatever that is: set nvidia_driver_version to the "
                            "same driver version, or leave nvidia_driver_fabric_manager_version empty (Fabric "
                            "Manager then follows the driver)" % fabric_manager_version)
        elif not same_version(driver_version, fabric_manager_version):
            problems.append("nvidia_driver_fabric_manager_version %s is not the driver version %s of "
                            "nvidia_driver_version %s, and Fabric Manager starts only at the driver's exact version: "
                            "make them name the same driver version, or leave nvidia_driver_fabric_manager_version "
                            "empty" % (fabric_manager_version, upstream_version(driver_version), driver_version))
    if not wanted and driver_version:
        for package in installed or []:
            if not same_version(package["version"], driver_version):
                problems.append(
                    "%s %s is installed%s and this role, which does not manage Fabric Manager on this host, would "
                    "leave it there while the driver moves to %s: set nvidia_driver_fabric_manager: true to move "
                    "both, or remove %s" % (package["package"], package["version"],
                                            " and held" if package["held"] else "",
                                            upstream_version(driver_version), package["package"]))
    return problems


def plan(distribution, os_family, setting, nvswitches, pci_gpus, driver_version="", fabric_manager_version="",
         installed_lines=None):
    """Fabric Manager's part of the role's plan for one host, decided before any package changes.

    Returns ``wanted`` and ``why`` (whether the host gets it, and the reason), ``service`` and ``installed``
    (the Fabric Manager packages installed now). Raises PlanError, naming both versions, for a plan that
    would leave the driver and Fabric Manager on different versions, and for NVLink 5 boards.
    """
    wanted, why = decide(setting, nvswitches, pci_gpus)
    installed = installed_packages(installed_lines)
    problems = version_problems(wanted, str(driver_version or ""), str(fabric_manager_version or ""), installed)
    if problems:
        raise PlanError("%s. Nothing has been changed." % "; ".join(problems))
    return {"wanted": wanted, "why": why, "service": SERVICE, "installed": installed}


def packages(distribution, os_family, driver_version, fabric_manager_version="", pinned=False):
    """What to install for the driver at ``driver_version`` (the version installed, or about to be).

    ``package``: the package name; ``install``: its install spec at the driver's exact version (apt:
    name=<version>, or name=<upstream>-* to match any packaging revision; dnf: name-<version>);
    ``hold``: what to hold or versionlock (only when ``pinned``, as the driver's packages are);
    ``apt_pin``: the package and version pattern of an apt preferences pin, or None.
    """
    upstream = upstream_version(driver_version)
    if upstream is None:
        raise PlanError("cannot tell which Fabric Manager to install: %r is not a driver version" % (driver_version,))
    name = package_name(distribution, os_family, upstream.split(".")[0])
    if os_family == "RedHat":
        spec = "%s-%s" % (name, fabric_manager_version or upstream)
        return {"package": name, "install": spec, "hold": [spec] if pinned else [], "apt_pin": None,
                "version": upstream}
    version = fabric_manager_version or "%s-*" % upstream
    return {"package": name, "install": "%s=%s" % (name, version), "hold": [name] if pinned else [],
            "apt_pin": {"package": name, "version": version} if pinned else None, "version": upstream}
