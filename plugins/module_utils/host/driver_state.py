# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What a host says of its NVIDIA driver: the driver loaded and the package installed, Secure Boot, and
the kernel that boots next with its nvidia module (private; nvidia_driver_info reports it).

The functions that run a command take the AnsibleModule, for its ``get_bin_path`` and ``run_command``.
"""

from __future__ import annotations

import glob
import os

from ansible_collections.scv.gpu.plugins.module_utils.host.bootloader import next_boot
from ansible_collections.scv.gpu.plugins.module_utils.host.kernel import module_entry, module_files, preflight


def loaded_version(sysfs):
    """The version of the nvidia kernel module loaded now; None when none is."""
    try:
        with open(os.path.join(sysfs, "module", "nvidia", "version"), encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return None


def loaded_kernel_modules(procfs):
    """The flavour of the nvidia module loaded now, from the first line of /proc/driver/nvidia/version: "open"
    ("NVIDIA UNIX Open Kernel Module for x86_64 ..."), "proprietary" ("NVIDIA UNIX x86_64 Kernel Module ...");
    None when none is loaded or the line says neither."""
    try:
        with open(os.path.join(procfs, "driver", "nvidia", "version"), encoding="utf-8", errors="replace") as handle:
            first = handle.readline()
    except OSError:
        return None
    if not first.startswith("NVRM version:"):
        return None
    if "Open Kernel Module" in first:
        return "open"
    return "proprietary" if "Kernel Module" in first else None


def nouveau_loaded(sysfs):
    return os.path.isdir(os.path.join(sysfs, "module", "nouveau"))


# Linux's own driver for NVIDIA GPUs (6.15 and later): nova_core binds Turing and newer GPUs before NVIDIA's module
NOVA_MODULES = ("nova_core", "nova_drm", "nova")


def nova_loaded(sysfs):
    """The nova modules loaded in the running kernel, in NOVA_MODULES' order."""
    return [name for name in NOVA_MODULES if os.path.isdir(os.path.join(sysfs, "module", name))]


def installed_version(module, package):
    """The installed version of ``package`` as dpkg or rpm gives it; None when it is not installed."""
    dpkg, rpm = module.get_bin_path("dpkg-query"), module.get_bin_path("rpm")
    if dpkg:
        command = [dpkg, "-W", "-f=${db:Status-Abbrev} ${Version}", package]
    elif rpm:
        command = [rpm, "-q", "--qf", "ii %{VERSION}-%{RELEASE}", package]
    else:
        module.fail_json(msg="neither dpkg-query nor rpm is on this host: cannot read the version of %s" % package)
    rc, out, _err = module.run_command(command)
    # The abbreviated status is the wanted state (i install, h hold, ...) then the current one.
    status, _sep, version = out.strip().partition(" ")
    if rc != 0 or status[1:2] != "i" or not version.strip():
        return None
    return version.strip()


def secure_boot(module, sysfs):
    """(enabled, source): what mokutil says, else the SecureBoot EFI variable, else no EFI at all."""
    mokutil = module.get_bin_path("mokutil")
    if mokutil:
        _rc, out, err = module.run_command([mokutil, "--sb-state"])
        text = (out + err).lower()
        if "secureboot enabled" in text:
            return True, "mokutil"
        if "secureboot disabled" in text or "not supported" in text:
            return False, "mokutil"
    variables = glob.glob(os.path.join(sysfs, "firmware", "efi", "efivars", "SecureBoot-*"))
    if variables:
        try:
            with open(variables[0], "rb") as handle:
                data = handle.read()
        except OSError:
            data = b""
        # 4 bytes of attributes, then the value.
        return len(data) >= 5 and data[4] == 1, "efivars"
    if os.path.isdir(os.path.join(sysfs, "firmware", "efi")):
        return False, "efivars"
    return False, "no EFI"


def next_kernel(module, root, sysfs, release, installed):
    """``kernel.preflight``'s verdict on the kernel that boots next: ``release`` when the site names it,
    else what the boot loader (or grubby, on the real root) will start; ``installed`` is the driver's version."""
    if release:
        how = "nvidia_driver_next_kernel"
    else:
        grubby = module.get_bin_path("grubby")
        grubby_default = None
        if grubby and root == "/":
            rc, out, _err = module.run_command([grubby, "--default-kernel"])
            grubby_default = out.strip() if rc == 0 else None
        release, how = next_boot(root, grubby_default, os.path.join(sysfs, "firmware", "efi", "efivars"))
    zstd = module.get_bin_path("zstd")

    def read_compressed(path):
        if not zstd:
            return None
        rc, out, _err = module.run_command([zstd, "-dc", path], binary_data=True, encoding=None)
        return out if rc == 0 else None

    modules = [module_entry(path, release, read_compressed) for path in (module_files(release, root) if release else [])]
    return preflight(release, how, modules, installed, os.uname().release)
