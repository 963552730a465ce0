# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The /dev/char/<major>:<minor> links to the NVIDIA device nodes (private; nvidia_dev_char_links sets them).

runc, with systemd managing the containers' cgroups, names each device of a container to systemd by its
/dev/char/<major>:<minor> link. The driver's nodes (/dev/nvidia0, /dev/nvidiactl, /dev/nvidia-uvm, ...) are
made by nvidia-modprobe, not udev, so no link exists for them; the first systemctl daemon-reload then
rewrites the containers' device rules without the GPUs ("Failed to initialize NVML: Unknown Error").
"""

from __future__ import annotations

import os
import re
import stat

# The driver's character devices in /dev, and the capability nodes (MIG) in /dev/nvidia-caps.
NODE = re.compile(r"^nvidia(\d+|ctl|-uvm|-uvm-tools|-modeset|-nvswitch\d+|-nvswitchctl|-nvlink)$")
CAP = re.compile(r"^nvidia-cap\d+$")


class DevCharError(Exception):
    """A link that cannot be made; the message names it and what to do."""


def device_nodes(dev):
    """[(path, major, minor)] of the NVIDIA character devices under ``dev``, by path."""
    found = []
    for folder, pattern in ((dev, NODE), (os.path.join(dev, "nvidia-caps"), CAP)):
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            path = os.path.join(folder, name)
            try:
                info = os.lstat(path)
            except OSError:
                continue
            if pattern.match(name) and stat.S_ISCHR(info.st_mode):
                found.append((path, os.major(info.st_rdev), os.minor(info.st_rdev)))
    return sorted(found)


def link_states(dev):
    """One entry per node: {'link', 'target', 'device', 'state'}; state is 'ok' (the link reaches that node),
    'missing', or 'wrong' (dangling, or it reaches something else, as after the driver came back with another
    major number)."""
    char = os.path.join(dev, "char")
    states = []
    for path, major, minor in device_nodes(dev):
        link = os.path.join(char, "%d:%d" % (major, minor))
        entry = {"link": link, "target": os.path.relpath(path, char), "device": path, "state": "ok"}
        if not os.path.lexists(link):
            entry["state"] = "missing"
        elif not _reaches(link, major, minor):
            entry["state"] = "wrong"
        states.append(entry)
    return states


def _reaches(link, major, minor):
    try:
        info = os.stat(link)
    except OSError:
        return False
    return stat.S_ISCHR(info.st_mode) and (os.major(info.st_rdev), os.minor(info.st_rdev)) == (major, minor)


def make_links(states):
    """Makes each link that is not 'ok', replacing a wrong one in one rename; raises DevCharError."""
    for entry in states:
        if entry["state"] == "ok":
            continue
        link = entry["link"]
        folder = os.path.dirname(link)
        scratch = os.path.join(folder, ".%s.scv-gpu" % os.path.basename(link))
        try:
            os.makedirs(folder, mode=0o755, exist_ok=True)
            if os.path.lexists(scratch):
                os.unlink(scratch)
            os.symlink(entry["target"], scratch)
            os.replace(scratch, link)
        except OSError as error:
            raise DevCharError("cannot link %s to %s: %s; remove what is at %s, then run again"
                               % (link, entry["device"], error.strerror or error, link)) from None


def describe(states):
    """The lines of a diff: one 'major:minor -> target' per link that is right (before) or will be (after)."""
    before = "".join("%s -> %s\n" % (os.path.basename(e["link"]), e["target"]) for e in states if e["state"] == "ok")
    after = "".join("%s -> %s\n" % (os.path.basename(e["link"]), e["target"]) for e in states)
    return before, after


def summary(states, dev):
    """What the links need, for a message."""
    if not states:
        return ("no NVIDIA device node in %s yet: the udev rule links them when the driver binds" % dev)
    pending = [e for e in states if e["state"] != "ok"]
    if not pending:
        return "every NVIDIA device node has its /dev/char link"
    return "; ".join("%s %s for %s" % (os.path.basename(e["link"]), e["state"], e["device"]) for e in pending)
