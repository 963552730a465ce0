# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The kernel that will boot next, and whether it has the NVIDIA module (private to the collection).

A reboot into a kernel without the NVIDIA module strands the node: it comes back without a
driver, or with a module from another driver release ("Driver/library version mismatch").
``bootloader`` finds the kernel the boot loader starts next; these functions find the nvidia
module built for it (by DKMS, Ubuntu's prebuilt linux-modules-nvidia packages, or the RHEL
family's kmods) and read its version and vermagic from its ELF .modinfo section.
"""

from __future__ import annotations

import gzip
import lzma
import os
import struct

# The names the nvidia module has: upstream and DKMS (nvidia.ko), Debian's DKMS package
# (nvidia-current.ko), each possibly compressed.
MODULE_NAMES = ("nvidia", "nvidia-current")
COMPRESSIONS = ("", ".xz", ".gz", ".zst")


def module_files(release, root="/"):
    """The nvidia module files built for ``release``, under /lib/modules/<release> and
    /usr/lib/modules/<release> (one folder on merged-/usr systems; each file is listed once)."""
    found = set()
    names = {stem + ".ko" + ext for stem in MODULE_NAMES for ext in COMPRESSIONS}
    for base in ("lib/modules", "usr/lib/modules"):
        for folder, _dirs, files in os.walk(os.path.join(root, base, release)):
            found.update(os.path.realpath(os.path.join(folder, name)) for name in files if name in names)
    return sorted(found)


def _elf_modinfo(data):
    """{key: value} from an ELF object's .modinfo section; {} when ``data`` is not ELF or has none."""
    if data[:4] != b"\x7fELF" or data[4] not in (1, 2):
        return {}
    wide, order = data[4] == 2, "<" if data[5] == 1 else ">"
    try:
        if wide:
            shoff, = struct.unpack_from(order + "Q", data, 0x28)
            shentsize, shnum, shstrndx = struct.unpack_from(order + "HHH", data, 0x3A)
            header = order + "IIQQQQIIQQ"
        else:
            shoff, = struct.unpack_from(order + "I", data, 0x20)
            shentsize, shnum, shstrndx = struct.unpack_from(order + "HHH", data, 0x2E)
            header = order + "IIIIIIIIII"
        sections = [struct.unpack_from(header, data, shoff + index * shentsize) for index in range(shnum)]
        names_offset = sections[shstrndx][4]
        for section in sections:
            name_start = names_offset + section[0]
            name = data[name_start:data.index(b"\x00", name_start)]
            if name == b".modinfo":
                body = data[section[4]:section[4] + section[5]]
                pairs = (item.decode("utf-8", "replace").partition("=") for item in body.split(b"\x00") if b"=" in item)
                return {key: value for key, _sep, value in pairs}
    except (struct.error, IndexError, ValueError):
        return {}
    return {}


def module_info(path, read_compressed=None):
    """(modinfo, problem) of a kernel module file: its .modinfo fields, or ({}, why they cannot be read).

    .xz and .gz are read here; ``read_compressed(path)`` (such as ``zstd -dc``) gives the bytes of
    other compressed files, or None.
    """
    try:
        if path.endswith(".xz"):
            with lzma.open(path) as handle:
                data = handle.read()
        elif path.endswith(".gz"):
            with gzip.open(path) as handle:
                data = handle.read()
        elif path.endswith(".ko"):
            with open(path, "rb") as handle:
                data = handle.read()
        else:
            data = read_compressed(path) if read_compressed else None
            if data is None:
                return {}, "it cannot be decompressed here (install zstd)"
    except (OSError, lzma.LZMAError, EOFError) as error:
        return {}, "it cannot be read (%s)" % (getattr(error, "strerror", None) or error)
    if data[:4] != b"\x7fELF":
        return {}, "it is not an ELF object"
    info = _elf_modinfo(data)
    if not info:
        return {}, "it has no readable .modinfo section (cut short, or not a kernel module)"
    return info, None


def module_entry(path, release, read_compressed=None):
    """{'path', 'version', 'vermagic', 'problem'} of an nvidia module found for ``release``; 'problem'
    is None only when its .modinfo parses and its vermagic names that kernel, as modprobe requires."""
    info, problem = module_info(path, read_compressed)
    vermagic = info.get("vermagic")
    if problem is None:
        built_for = vermagic.split()[0] if vermagic and vermagic.split() else None
        if not built_for:
            problem = "its .modinfo has no vermagic"
        elif built_for != release:
            problem = "it was built for the kernel %s (vermagic), and modprobe refuses it on %s" % (built_for, release)
        elif not info.get("version"):
            problem = "its .modinfo has no version"
    return {"path": path, "version": info.get("version"), "vermagic": vermagic, "problem": problem}


def same_release(module, driver):
    """Whether a module's version and the installed driver's name the same release ('580.95.05')."""
    return bool(module and driver) and module.strip() == driver.strip()


def preflight(release, how, modules, installed_version, running):
    """{'ok', 'kernel', 'how', 'modules', 'running', 'message'} for a reboot into ``release``.

    ``release`` is None when the boot loader's answer is not certain, and ``how`` then says why.
    ``modules``: module_entry() of each nvidia module found for that kernel; ``installed_version``:
    the driver installed now (None when unknown). OK only when a module has no problem and its
    version is the installed driver's (any version, when that is unknown).
    """
    result = {"kernel": release, "how": how, "modules": modules, "running": running}
    if not release:
        message = ("cannot tell which kernel boots next: %s. Name it with nvidia_driver_next_kernel (the module's "
                   "next_kernel_release) to check that kernel" % how)
        return dict(result, ok=False, message=message)
    where = "the kernel that boots next, %s (%s)," % (release, how)
    if not modules:
        message = "%s has no nvidia module under /lib/modules/%s" % (where, release)
        return dict(result, ok=False, message=message)
    usable = [entry for entry in modules if entry["problem"] is None]
    if not usable:
        found = "; ".join("%s: %s" % (entry["path"], entry["problem"]) for entry in modules)
        message = "%s has no nvidia module that modprobe would load: %s" % (where, found)
        return dict(result, ok=False, message=message)
    matching = [entry for entry in usable
                if not installed_version or same_release(entry["version"], installed_version)]
    if not matching:
        found = ", ".join("%s (%s)" % (entry["path"], entry["version"]) for entry in usable)
        message = ("%s has an nvidia module of another driver release than the installed %s: %s; it would fail "
                   "with a driver/library version mismatch" % (where, installed_version, found))
        return dict(result, ok=False, message=message)
    chosen = matching[0]
    return dict(result, ok=True, message="%s has the nvidia module %s (%s)" % (where, chosen["version"], chosen["path"]))
