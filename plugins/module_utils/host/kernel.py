# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The kernel that will boot next, and whether it has the NVIDIA module (private to the collection).

A reboot into a kernel without the NVIDIA module strands the node: it comes back without a
driver, or with a module from another driver release ("Driver/library version mismatch").
These functions find the kernel GRUB (or grubby) will boot, and the nvidia module built for
it (by DKMS, Ubuntu's prebuilt linux-modules-nvidia packages, or the RHEL family's kmods),
with the module's version read from its ELF .modinfo section.
"""

from __future__ import annotations

import glob
import gzip
import lzma
import os
import re
import struct

# The names the nvidia module has: upstream and DKMS (nvidia.ko), Debian's DKMS package
# (nvidia-current.ko), each possibly compressed.
MODULE_NAMES = ("nvidia", "nvidia-current")
COMPRESSIONS = ("", ".xz", ".gz", ".zst")

_GRUB_DEFAULT = re.compile(r"""^\s*GRUB_DEFAULT\s*=\s*(["']?)(.*?)\1\s*$""", re.MULTILINE)
# The kernel release in a GRUB entry id or title: 'gnulinux-6.1.0-18-amd64-advanced-<uuid>',
# 'Debian GNU/Linux, with Linux 6.1.0-18-amd64', 'Ubuntu, with Linux 6.8.0-45-generic'.
_ENTRY_RELEASE = (re.compile(r"gnulinux-(\d[^\s>]*?)-(?:advanced|recovery)-"),
                  re.compile(r"with Linux (\d[^\s>()]*)"))


def _version_key(release):
    """A key that orders kernel releases as their packages do: '6.1.0-9' < '6.1.0-18' < '6.10.1'."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.findall(r"\d+|[A-Za-z]+", release)]


def installed_kernels(root="/"):
    """The kernel releases with an image in /boot, oldest first."""
    found = []
    for path in glob.glob(os.path.join(root, "boot", "vmlinuz-*")):
        release = os.path.basename(path)[len("vmlinuz-"):]
        if release and not release.endswith((".old", ".bak")) and "rescue" not in release:
            found.append(release)
    return sorted(set(found), key=_version_key)


def grub_default(root="/"):
    """(release, how) for the entry GRUB boots by default, when its configuration names one.

    GRUB_DEFAULT=saved reads saved_entry from grubenv; a title or entry id naming a kernel gives
    that kernel. 0 (the default) or an entry number is the first entry, the newest kernel, which
    this returns as None so that the caller takes the newest installed one.
    """
    try:
        with open(os.path.join(root, "etc", "default", "grub"), encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return None, None
    matches = _GRUB_DEFAULT.findall(text)
    if not matches:
        return None, None
    value = matches[-1][1].strip()
    how = "GRUB_DEFAULT in /etc/default/grub"
    if value == "saved":
        for env in ("boot/grub/grubenv", "boot/grub2/grubenv"):
            try:
                with open(os.path.join(root, env), encoding="utf-8", errors="replace") as handle:
                    saved = dict(line.split("=", 1) for line in handle.read().splitlines() if "=" in line)
            except OSError:
                continue
            value, how = saved.get("saved_entry", "").strip(), "saved_entry in /%s" % env
            break
    for pattern in _ENTRY_RELEASE:
        match = pattern.search(value)
        if match:
            return match.group(1), how
    return None, None


def next_kernel(root="/", running=None, grubby_default=None):
    """(release, how): the kernel the next boot starts, and how that was decided.

    ``grubby_default`` is what ``grubby --default-kernel`` printed (the RHEL family), if anything.
    """
    if grubby_default:
        name = os.path.basename(grubby_default.strip())
        if name.startswith("vmlinuz-"):
            return name[len("vmlinuz-"):], "grubby --default-kernel"
    release, how = grub_default(root)
    if release:
        return release, how
    kernels = installed_kernels(root)
    if kernels:
        return kernels[-1], "the newest kernel in /boot"
    return running, "the running kernel, as /boot has no kernel image"


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


def module_version(path, read_compressed=None):
    """The ``version=`` of a kernel module file, or None when it cannot be read.

    .xz and .gz are read here; ``read_compressed(path)`` (such as ``zstd -dc``) gives the bytes of
    other compressed files.
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
    except (OSError, lzma.LZMAError, EOFError):
        return None
    return _elf_modinfo(data).get("version") if data else None


def same_release(module, driver):
    """Whether a module's version and the installed driver's name the same release ('580.95.05')."""
    return bool(module and driver) and module.strip() == driver.strip()


def preflight(release, how, modules, installed_version, running):
    """{'ok', 'kernel', 'how', 'modules', 'running', 'message'} for a reboot into ``release``.

    ``modules``: [{'path', 'version'}] found for that kernel; ``installed_version``: the driver
    installed now (None when unknown). OK when a module exists whose version is the installed
    driver's, or cannot be read (or any module, when the installed version is unknown).
    """
    result = {"kernel": release, "how": how, "modules": modules, "running": running}
    where = "the kernel that boots next, %s (%s)," % (release, how)
    if not release:
        message = "cannot tell which kernel boots next: no kernel image in /boot and no running kernel release"
        return dict(result, ok=False, message=message)
    if not modules:
        message = "%s has no nvidia module under /lib/modules/%s" % (where, release)
        return dict(result, ok=False, message=message)
    # A module whose version cannot be read here (zstd-compressed, with no zstd) is given the benefit
    # of the doubt: it exists, and the packages that built it move with the driver.
    matching = [entry for entry in modules
                if not installed_version or entry.get("version") is None
                or same_release(entry["version"], installed_version)]
    if not matching:
        found = ", ".join("%s (%s)" % (entry["path"], entry["version"]) for entry in modules)
        message = ("%s has an nvidia module of another driver release than the installed %s: %s; it would fail "
                   "with a driver/library version mismatch" % (where, installed_version, found))
        return dict(result, ok=False, message=message)
    first = matching[0]
    version = first["version"] or "%s (version unreadable)" % first["path"]
    return dict(result, ok=True, message="%s has the nvidia module %s" % (where, version))
