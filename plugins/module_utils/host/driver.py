# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Choices of the nvidia_driver role, as pure functions (private to the collection).

Which packages, repository, module stream and pins a host gets, and whether a reboot
must follow an install. The role calls these through the ``scv.gpu.nvidia_driver_plan``
filter and the ``scv.gpu.nvidia_driver_info`` module, so that every choice can be tested
without the distribution that makes it.
"""

from __future__ import annotations

import re

from ansible_collections.scv.gpu.plugins.module_utils.host import gpu_architecture

KERNEL_MODULES = ("auto", "proprietary", "open")
# The one branch each Debian release packages, as nvidia-driver in non-free.
DEBIAN_BRANCHES = {"12": 535, "13": 550}

# The RHEL family releases whose CUDA repository offers the nvidia-driver dnf module.
EL_MODULE_RELEASES = ("8", "9")
# From RHEL 10.1 on x86_64, Red Hat ships NVIDIA's open kernel modules built and signed by Red Hat (kmod-nvidia,
# with the user-space driver nvidia-open) in this repository; Secure Boot trusts them without a MOK.
EL_SIGNED_KMODS_SINCE = (10, 1)
EL_EXTENSIONS_REPOSITORY = "rhel-10-for-x86_64-extensions-rpms"

_EPOCH = re.compile(r"^\d+:")
_UPSTREAM = re.compile(r"^(\d+(?:\.\d+)*)")


class PlanError(ValueError):
    """A combination of settings this role cannot install; the message says what to set."""


# A package version as apt and dnf take it, whole: an optional epoch, then a digit and the characters Debian and RPM
# allow. No whitespace: a newline would end the line of the apt pin or the versionlock entry it is written into.
_PACKAGE_VERSION = re.compile(r"(?:\d+:)?\d[A-Za-z0-9.+~^_-]*")


def version_problem(variable, version):
    """Why ``version`` (the value of ``variable``) is not a package version; None when it is one or is empty."""
    if version in (None, ""):
        return None
    if not isinstance(version, str) or not _PACKAGE_VERSION.fullmatch(version):
        return ("%s %r is not a package version: write it as the package manager lists it (such as 580.95.05-1), "
                "with no whitespace or newline" % (variable, version))
    return None


def upstream_version(version):
    """The driver's own version from a package version: '1:535.247.01-1~deb12u1' -> '535.247.01'.

    Returns None for None, an empty string, or a version without a leading number.
    """
    if not version:
        return None
    match = _UPSTREAM.match(_EPOCH.sub("", str(version).strip()))
    return match.group(1) if match else None


def version_key(version):
    """A tuple that orders driver versions numerically: '535.54.03' < '535.104.05' < '550.54'.

    String comparison gets these wrong ('10' < '8'); this does not.
    """
    upstream = upstream_version(version)
    if upstream is None:
        raise ValueError("not a driver version: %r" % (version,))
    return tuple(int(part) for part in upstream.split("."))


def same_version(left, right):
    """True when two versions name the same driver (packaging suffixes and trailing zeros aside)."""
    try:
        a, b = list(version_key(left)), list(version_key(right))
    except ValueError:
        return False
    width = max(len(a), len(b))
    return a + [0] * (width - len(a)) == b + [0] * (width - len(b))


def kernel_flavour(kernel):
    """Ubuntu's kernel flavour from a kernel release: '6.8.0-45-generic' -> 'generic'."""
    match = re.match(r"^\d+\.\d+\.\d+-\d+-(.+)$", kernel or "")
    return match.group(1) if match else None


# The branch for Ubuntu and the RHEL family when nvidia_driver_branch is empty and no version
# names one: NVIDIA's current long-term production branch.
DEFAULT_BRANCH = "580"


def plan(os_family, distribution, major_version, kernel, branch="", version="",
         kernel_modules="auto", ubuntu_server=True, secure_boot=False,
         signing_key_enrolled=False, gpus=(), distribution_version="", architecture=""):
    """Everything the role installs on one host, as a dict.

    ``packages``: what apt or dnf installs (pinned where a version is set);
    ``hold``: what apt-mark holds or dnf versionlock locks (only with a version);
    ``replaces``: the packages of the other kernel module flavour, which the install removes in its own
    transaction where they are installed (held or not): a change of flavour (apt);
    ``apt_pin``: the source packages (``sources``) and ``version`` of an apt preferences pin, or None;
    ``dnf_module``: the module stream to enable, or None;
    ``dnf_repository``: ``cuda`` (NVIDIA's CUDA repository) or the Red Hat repository to enable
    (RHEL 10's extensions), on the RHEL family;
    ``headers``: the kernel headers package for the running kernel;
    ``driver_package``: the package whose version is the installed driver's.
    ``blacklist``: the modules kept out of the boot (nouveau, and nova on kernels that have it);
    ``kernel_modules``: the flavour that installs, and ``kernel_modules_why``: how auto chose it from ``gpus``
    (the GPUs on the PCI bus, as nvidia_driver_info's pci_gpus).
    An empty ``branch`` is the distribution's default: Debian's one packaged branch, and
    elsewhere the version's branch, else DEFAULT_BRANCH.
    Raises PlanError for a combination that cannot work, before anything changes: among them a flavour or a
    branch the host's GPUs cannot run with.
    """
    if kernel_modules not in KERNEL_MODULES:
        raise PlanError("nvidia_driver_kernel_modules must be one of %s, not %r" % (", ".join(KERNEL_MODULES), kernel_modules))
    if version_problem("nvidia_driver_version", version):
        raise PlanError(version_problem("nvidia_driver_version", version))
    if version:
        upstream = upstream_version(version)
        if upstream is None:
            raise PlanError("nvidia_driver_version %r is not a driver version (such as 580.95.05)" % version)
        if branch and upstream.split(".")[0] != str(branch):
            raise PlanError("nvidia_driver_version %s is not on nvidia_driver_branch %s: set one of them, "
                            "or make them agree" % (version, branch))
    wanted_branch = _branch(distribution, major_version, branch, version)
    flavour, problems = gpu_architecture.kernel_modules(list(gpus or ()), kernel_modules, wanted_branch)
    if problems:
        raise PlanError("%s. Nothing has been changed." % "; ".join(problems))
    opened, why = flavour == "open", _why(kernel_modules, flavour, gpus or ())
    if distribution == "Debian":
        result = _debian(kernel, branch, version, opened)
    elif distribution == "Ubuntu":
        result = _ubuntu(kernel, branch, version, opened, ubuntu_server)
    elif os_family == "RedHat" and str(major_version) in EL_MODULE_RELEASES:
        result = _redhat(str(major_version), kernel, branch, version, opened)
    elif os_family == "RedHat":
        result = _rhel_signed(distribution, distribution_version or str(major_version), architecture,
                              branch, version, flavour, why)
    else:
        raise PlanError("nvidia_driver supports Debian, Ubuntu and the RHEL family, not %s (%s)"
                        % (distribution, os_family))
    if secure_boot and not result["signed_modules"] and not signing_key_enrolled:
        raise PlanError(
            "Secure Boot is enabled on this host, and %s builds the NVIDIA kernel modules with DKMS, "
            "so they are signed with the host's own machine owner key (MOK), which the firmware does not "
            "trust yet. Enrol that key first: 'mokutil --import %s', reboot, and confirm the "
            "enrolment in the MOK manager at the console. Then set "
            "nvidia_driver_secure_boot_key_enrolled: true. Nothing has been changed."
            % (distribution, result["mok_public_key"]))
    result["blacklist"] = blacklist(kernel)
    result["kernel_modules"] = flavour
    result["kernel_modules_why"] = why
    return result


# Linux's own NVIDIA driver, nova (nova_core from 6.15, nova_drm from 6.16), binds Turing and newer GPUs first
NOVA_SINCE = (6, 15)
NOVA_MODULES = ("nova_core", "nova_drm", "nova")


def blacklist(kernel):
    """The modules to keep out of the boot so that NVIDIA's module gets the GPUs: nouveau, and on kernels that
    have them (6.15 and later, such as Ubuntu 26.04's 7.0) the nova modules."""
    found = re.match(r"^(\d+)\.(\d+)", kernel or "")
    newer = found is not None and (int(found.group(1)), int(found.group(2))) >= NOVA_SINCE
    return ["nouveau"] + (list(NOVA_MODULES) if newer else [])


def _branch(distribution, major_version, branch, version):
    """The driver branch a host gets, as an int; None where it cannot be told before the install."""
    named = str(branch or "") or (upstream_version(version) or "").split(".")[0]
    if named.isdigit():
        return int(named)
    if distribution == "Debian":
        return DEBIAN_BRANCHES.get(str(major_version))
    return int(DEFAULT_BRANCH)


def _why(setting, flavour, gpus):
    if setting != "auto":
        return "nvidia_driver_kernel_modules is %s" % setting
    found = sorted({gpu_architecture.architecture(gpu.get("deviceId")) or "unknown" for gpu in gpus},
                   key=lambda name: (name not in gpu_architecture.ORDER, name))
    if not found:
        return "auto: no NVIDIA GPU on the PCI bus, and the open modules are NVIDIA's default"
    if flavour == "proprietary":
        return "auto: a GPU older than Turing (%s) runs with the proprietary modules only" % ", ".join(found)
    return "auto: every GPU is Turing or newer (%s)" % ", ".join(found)


def _debian(kernel, branch, version, opened):
    if branch:
        raise PlanError("Debian ships one driver branch, as nvidia-driver in non-free: leave "
                        "nvidia_driver_branch empty, and set nvidia_driver_version to pin a version")
    dkms = "nvidia-open-kernel-dkms" if opened else "nvidia-kernel-dkms"
    names = ["nvidia-driver", dkms]
    # Both module packages depend on the GSP firmware of their upstream version (non-free-firmware); named, it
    # moves with a pin in the same transaction. The open modules come from a source of their own, in contrib.
    return {
        "manager": "apt",
        "packages": _apt_pinned(names + ["firmware-nvidia-gsp"], version) + ["linux-headers-%s" % kernel],
        "hold": names if version else [],
        "replaces": ["nvidia-kernel-dkms" if opened else "nvidia-open-kernel-dkms"],
        "apt_pin": {"sources": ["nvidia-graphics-drivers"] + (["nvidia-open-gpu-kernel-modules"] if opened else []),
                    "version": version} if version else None,
        "dnf_module": None,
        "dnf_repository": None,
        "headers": "linux-headers-%s" % kernel,
        "driver_package": "nvidia-driver",
        "signed_modules": False,
        "mok_public_key": "/var/lib/dkms/mok.pub",
        "initramfs_command": ["update-initramfs", "-u", "-k", "all"],
        "kernel_module_source": "linux-headers-{kernel} (with the headers installed, DKMS builds %s for that "
                                "kernel; if they already are, run dkms autoinstall -k {kernel})" % dkms,
        "kernel_hold_patterns": ["linux-image-*", "linux-headers-*"],
    }


def _ubuntu(kernel, branch, version, opened, server):
    branch = branch or (upstream_version(version) or "").split(".")[0] or DEFAULT_BRANCH
    suffix = ("-server" if server else "") + ("-open" if opened else "")
    driver = "nvidia-driver-%s%s" % (branch, suffix)
    flavour = kernel_flavour(kernel)
    if flavour is None:
        raise PlanError("cannot tell the Ubuntu kernel flavour of %r (expected a release such as 6.8.0-45-generic)" % kernel)
    # Canonical's prebuilt modules are signed with its key, which Secure Boot already trusts:
    # those for the running kernel, and the flavour's package that follows kernel upgrades.
    modules = ["linux-modules-nvidia-%s%s-%s" % (branch, suffix, name) for name in (kernel, flavour)]
    source = "nvidia-graphics-drivers-%s%s" % (branch, "-server" if server else "")
    return {
        "manager": "apt",
        "packages": _apt_pinned([driver], version) + modules + ["linux-headers-%s" % kernel],
        "hold": [driver] if version else [],
        "replaces": ["nvidia-driver-%s%s%s" % (branch, "-server" if server else "", "" if opened else "-open")],
        "apt_pin": {"sources": [source], "version": version} if version else None,
        "dnf_module": None,
        "dnf_repository": None,
        "headers": "linux-headers-%s" % kernel,
        "driver_package": driver,
        "signed_modules": True,
        "mok_public_key": "/var/lib/shim-signed/mok/MOK.der",
        "initramfs_command": ["update-initramfs", "-u", "-k", "all"],
        "kernel_module_source": "linux-modules-nvidia-%s%s-{kernel} (Canonical's prebuilt, signed modules for "
                                "that kernel)" % (branch, suffix),
        "kernel_hold_patterns": ["linux-image-*", "linux-headers-*", "linux-modules-*", "linux-generic*",
                                 "linux-virtual*", "linux-aws*", "linux-gcp*", "linux-azure*", "linux-oracle*"],
    }


def _redhat(major, kernel, branch, version, opened):
    branch = branch or (upstream_version(version) or "").split(".")[0] or DEFAULT_BRANCH
    stream = "%s-%s" % (branch, "open" if opened else "dkms")
    dkms = "kmod-nvidia-open-dkms" if opened else "kmod-nvidia-latest-dkms"
    names = ["nvidia-driver", "nvidia-driver-cuda", dkms]
    # A module profile installs the stream's newest build; an exact version names packages
    # (EL8's 'module install nvidia-driver:<branch>-dkms/<version>' is not a thing).
    packages = ["%s-%s" % (name, version) for name in names] if version else ["@nvidia-driver:%s/default" % stream]
    return {
        "manager": "dnf",
        "packages": packages + ["kernel-devel-%s" % kernel, "kernel-headers-%s" % kernel],
        "hold": ["%s-%s" % (name, version) for name in names] if version else [],
        "replaces": [],
        "apt_pin": None,
        "dnf_module": "nvidia-driver:%s" % stream,
        "dnf_repository": "cuda",
        "headers": "kernel-devel-%s" % kernel,
        "driver_package": "nvidia-driver",
        "signed_modules": False,
        "mok_public_key": "/var/lib/dkms/mok.pub",
        "initramfs_command": ["dracut", "--force", "--regenerate-all"],
        "kernel_module_source": "kernel-devel-{kernel} (with it installed, DKMS builds the nvidia module for that "
                                "kernel; if it already is, run dkms autoinstall -k {kernel})",
        "kernel_hold_patterns": ["kernel", "kernel-core", "kernel-modules", "kernel-modules-core", "kernel-devel"],
    }


def _release(text):
    found = re.match(r"^(\d+)(?:\.(\d+))?", str(text or ""))
    return (int(found.group(1)), int(found.group(2) or 0)) if found else None


def _rhel_signed(distribution, release, architecture, branch, version, flavour, why):
    """RHEL 10.1 and later: Red Hat's signed build of NVIDIA's open modules, from its extensions repository."""
    if distribution != "RedHat" or (_release(release) or (0, 0)) < EL_SIGNED_KMODS_SINCE or architecture != "x86_64":
        raise PlanError("on EL 10 this role installs Red Hat's signed NVIDIA kernel modules (kmod-nvidia, from "
                        "%s), which RHEL %d.%d and later ship for x86_64; this host is %s %s on %s, and EL %s "
                        "has no nvidia-driver module stream in NVIDIA's CUDA repository. Install the driver "
                        "another way, or run RHEL %d.%d or later. Nothing has been changed."
                        % ((EL_EXTENSIONS_REPOSITORY,) + EL_SIGNED_KMODS_SINCE
                           + (distribution, release, architecture or "an unknown architecture",
                              str(release).split(".", maxsplit=1)[0]) + EL_SIGNED_KMODS_SINCE))
    if flavour != "open":
        raise PlanError("Red Hat's signed kmod-nvidia on RHEL 10 is NVIDIA's open kernel modules only, and this "
                        "host gets the proprietary ones (%s): %s. Nothing has been changed."
                        % (why, "GPUs older than Turing need an EL 9 host (the CUDA repository's DKMS modules)"
                           if why.startswith("auto") else "set nvidia_driver_kernel_modules to auto or open"))
    names = ["nvidia-open", "kmod-nvidia"]
    # EL 10 has no module streams: a branch is the newest version of it (a NEVRA glob), locked with
    # versionlock as NVIDIA advises for EL 10; no branch and no version follows Red Hat's newest.
    wanted = (["%s-%s" % (name, version) for name in names] if version else
              ["%s-%s.*" % (name, branch) for name in names] if branch else names)
    return {
        "manager": "dnf",
        "packages": wanted,
        "hold": wanted if version or branch else [],
        "replaces": [],
        "apt_pin": None,
        "dnf_module": None,
        "dnf_repository": EL_EXTENSIONS_REPOSITORY,
        "headers": None,
        "driver_package": "nvidia-driver",
        "signed_modules": True,
        "mok_public_key": None,
        "initramfs_command": ["dracut", "--force", "--regenerate-all"],
        "kernel_module_source": "kmod-nvidia for {kernel} (Red Hat's signed build; dnf upgrade kmod-nvidia, and if "
                                "none is there for that kernel yet, keep booting the current one)",
        "kernel_hold_patterns": ["kernel", "kernel-core", "kernel-modules", "kernel-modules-core"],
    }


def _apt_pinned(names, version):
    return ["%s=%s" % (name, version) for name in names] if version else list(names)


def reboot_reasons(loaded_version, installed_version, nouveau_loaded, nova_loaded=(), loaded_modules=None,
                   installed_modules=None):
    """Why the host must reboot before the installed driver runs; an empty list when it need not.

    ``loaded_version``: the nvidia module in the running kernel (None when none is loaded);
    ``installed_version``: the driver now installed (None when none is);
    ``nouveau_loaded``: whether nouveau holds the GPUs; ``nova_loaded``: the nova modules loaded (nova_core binds
    the GPUs before NVIDIA's module can);
    ``loaded_modules``, ``installed_modules``: the flavour (open, proprietary) of the loaded module and of the
    installed one, where known: a change of flavour at the same version runs only after a reload or a reboot.
    With nothing loaded and nouveau absent, the module is simply loaded: no reboot.
    """
    reasons = []
    if nouveau_loaded and installed_version:
        reasons.append("nouveau is loaded and holds the GPUs; the blacklist takes effect at boot")
    if nova_loaded and installed_version:
        reasons.append("%s is loaded and binds the GPUs before NVIDIA's module can; the blacklist takes effect "
                       "at boot" % ", ".join(nova_loaded))
    if loaded_version and installed_version and not same_version(loaded_version, installed_version):
        reasons.append("the running kernel has driver %s loaded, and %s is installed"
                       % (upstream_version(loaded_version) or loaded_version,
                          upstream_version(installed_version) or installed_version))
    elif loaded_version and installed_version and loaded_modules and installed_modules \
            and loaded_modules != installed_modules:
        reasons.append("the running kernel has the %s nvidia module loaded, and the %s one is installed"
                       % (loaded_modules, installed_modules))
    return reasons


def reboot_decision(policy, reasons, connection, driver_changed=False):
    """Whether to reboot now, given the policy (auto, never, always) and the connection type.

    ``always`` reboots after every run that changed the driver (so a rerun does not reboot).
    Returns (reboot, message): ``message`` tells the user what happens or what to do.
    """
    if policy not in ("auto", "never", "always"):
        raise PlanError("nvidia_driver_reboot must be auto, never or always, not %r" % (policy,))
    wanted = (policy == "always" and driver_changed) or (policy in ("auto", "always") and bool(reasons))
    why = "; ".join(reasons) if reasons else "no reboot is needed"
    if not wanted:
        if reasons:
            return False, "a reboot is needed (%s), and nvidia_driver_reboot is never: reboot this host yourself" % why
        return False, why
    if connection == "local":
        return False, ("a reboot is needed (%s), but this play runs over a local connection, which a reboot "
                       "would cut: reboot this host yourself" % (why if reasons else "nvidia_driver_reboot is always"))
    return True, "rebooting: %s" % (why if reasons else "nvidia_driver_reboot is always")
