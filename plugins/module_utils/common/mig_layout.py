# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""MIG layouts as declared, matched to GPUs and laid out on them (private; pure functions).

A layout is a list of entries, each naming GPUs and what they should be:

    - devices: all            # or a list of GPU indexes
      device-filter: ["0x233010DE"]   # optional: only GPUs with these PCI device IDs
      mig-enabled: true
      mig-devices: {"1g.10gb": 7}

the form nvidia-mig-parted's configuration files use (its ``mig-configs`` map names to such
lists), with ``_`` accepted for ``-`` in the keys. Only GPU instances are declared: each gets one
compute instance that spans it, which is what the device plugin offers.
"""

from __future__ import annotations

import re

from ansible_collections.scv.gpu.plugins.module_utils.common.value_kinds import json_kind

ENTRY_KEYS = ("devices", "device-filter", "mig-enabled", "mig-devices")
PROFILE_SYNTAX = re.compile(r"^[1-8]g\.[0-9]+gb(\+[a-z]+)*$")
MEMORY_SLICES = 8


class LayoutError(Exception):
    """A layout that cannot be applied; the message names where and why."""


def _key(name):
    return name.replace("_", "-")


def _device_ids(value, where):
    """PCI device IDs as nvidia-mig-parted takes them: one, or a list, each a string such as
    0x233010DE (or a whole number)."""
    values = value if isinstance(value, list) else [value]
    if not values:
        raise LayoutError("%s.device-filter: an empty list matches no GPU; leave device-filter out to match "
                          "every GPU, or name PCI device IDs such as 0x233010DE" % where)
    ids = []
    for item in values:
        if isinstance(item, bool) or not isinstance(item, (str, int)):
            kind = json_kind(item)
            raise LayoutError("%s.device-filter: %r is %s %s, not a PCI device ID; give a string such as 0x233010DE, "
                              "or a list of them" % (where, item, "an" if kind[0] in "aeiou" else "a", kind))
        try:
            ids.append(int(item, 16) if isinstance(item, str) else item)
        except ValueError:
            raise LayoutError("%s.device-filter: %r is not a PCI device ID such as 0x233010DE" % (where, item))
    return ids


def _spelled_once(raw, where):
    """The entry with its keys spelt with '-'; LayoutError when one key is given in both spellings."""
    entry = {}
    for key, value in raw.items():
        name = _key(str(key))
        if name in entry:
            raise LayoutError("%s: %s is given twice (as %s and %s); give it once" % (
                where, name, name, name.replace("-", "_")))
        entry[name] = value
    return entry


def _entry(raw, where):
    if not isinstance(raw, dict):
        raise LayoutError("%s: an entry must be a mapping with %s" % (where, ", ".join(ENTRY_KEYS)))
    entry = _spelled_once(raw, where)
    unknown = sorted(set(entry) - set(ENTRY_KEYS))
    if unknown:
        raise LayoutError("%s: unknown key(s) %s; an entry has %s" % (where, ", ".join(unknown), ", ".join(ENTRY_KEYS)))
    devices = entry.get("devices", "all")
    if devices != "all" and not (isinstance(devices, list) and devices
                                 and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in devices)):
        raise LayoutError("%s.devices: %r is neither 'all' nor a list of GPU indexes" % (where, devices))
    enabled = entry.get("mig-enabled")
    if not isinstance(enabled, bool):
        raise LayoutError("%s.mig-enabled: true or false is needed, got %r" % (where, enabled))
    profiles = entry.get("mig-devices") or {}
    if not isinstance(profiles, dict):
        raise LayoutError("%s.mig-devices: a mapping of MIG profile to count is needed, got %r" % (where, profiles))
    for name, count in profiles.items():
        if not PROFILE_SYNTAX.match(str(name)):
            raise LayoutError("%s.mig-devices: %r is not a MIG GPU instance profile such as 1g.10gb or 3g.40gb"
                              % (where, name))
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise LayoutError("%s.mig-devices.%s: the count must be a whole number, got %r" % (where, name, count))
    if profiles and not enabled:
        raise LayoutError("%s: mig-devices are given but mig-enabled is false" % where)
    return {
        "devices": devices,
        "device-filter": _device_ids(entry["device-filter"], where) if entry.get("device-filter") is not None else None,
        "mig-enabled": enabled,
        "mig-devices": {str(name): count for name, count in profiles.items() if count},
    }


def normalise(entries, where="layout"):
    """The entries of a layout, checked; raises LayoutError naming the entry and key at fault."""
    if not isinstance(entries, list) or not entries:
        raise LayoutError("%s: a non-empty list of entries is needed" % where)
    return [_entry(raw, "%s[%d]" % (where, position)) for position, raw in enumerate(entries)]


def from_config(config, name, source):
    """The entries of layout ``name`` in an nvidia-mig-parted style configuration
    ({"version": "v1", "mig-configs": {name: [entries]}}) read from ``source``."""
    if not isinstance(config, dict) or not isinstance(config.get("mig-configs"), dict):
        raise LayoutError("%s: a 'mig-configs' mapping of layout names to entries is needed" % source)
    if config.get("version", "v1") != "v1":
        raise LayoutError("%s: version %r is not supported; v1 is" % (source, config.get("version")))
    layouts = config["mig-configs"]
    not_names = [name for name in layouts if not isinstance(name, str)]
    if not_names:
        first = not_names[0]
        raise LayoutError("%s: mig-configs: the layout name %s is not text (YAML reads it as %s); quote every such "
                          "name, as in '%s':" % (source, first, type(first).__name__, first))
    if not isinstance(name, str) or name not in layouts:
        raise LayoutError("%s has no layout %r; it has %s" % (source, name, ", ".join(sorted(layouts)) or "none"))
    return normalise(layouts[name], "%s: mig-configs.%s" % (source, name))


def assign(entries, gpus):
    """({GPU index: entry} for every GPU an entry names, [positions of the entries that name none]);
    the GPUs no entry names are left as they are. ``gpus`` are dicts with ``index`` and ``deviceId``
    (NVML's PCI device ID, an int). LayoutError when no entry names any GPU."""
    chosen, by_index, idle = {}, {gpu["index"]: gpu for gpu in gpus}, []
    for position, entry in enumerate(entries):
        if entry["devices"] != "all":
            missing = [index for index in entry["devices"] if index not in by_index]
            if missing:
                raise LayoutError("layout[%d].devices: no GPU %s on this host (it has %d)"
                                  % (position, ", ".join(map(str, missing)), len(gpus)))
        named = False
        for gpu in gpus:
            if entry["devices"] != "all" and gpu["index"] not in entry["devices"]:
                continue
            if entry["device-filter"] is not None and gpu.get("deviceId") not in entry["device-filter"]:
                continue
            if gpu["index"] in chosen:
                raise LayoutError("GPU %d is named by layout[%d] and layout[%d]: name each GPU once"
                                  % (gpu["index"], chosen[gpu["index"]][0], position))
            chosen[gpu["index"]], named = (position, entry), True
        if not named:
            idle.append(position)
    if not chosen:
        raise LayoutError("The layout names no GPU of this host, so nothing would be laid out: %s" % _no_match(
            entries, gpus))
    return {index: entry for index, (_position, entry) in chosen.items()}, idle


def _no_match(entries, gpus):
    if not gpus:
        return "the host has no GPUs."
    filters = sorted({device_id for entry in entries for device_id in entry["device-filter"] or []})
    return "its device-filter names %s; this host's GPUs are %s. Add their IDs, or name another layout." % (
        ", ".join(pci_id(device_id) for device_id in filters),
        ", ".join("%d (%s)" % (gpu["index"], pci_id(gpu.get("deviceId"))) for gpu in gpus))


def pci_id(device_id):
    """NVML's PCI device ID as nvidia-mig-parted's device-filter writes it: 0x233010DE."""
    return "0x%08X" % device_id if isinstance(device_id, int) else "unknown"


def counts(profiles):
    """{profile: count} of a list of profile names."""
    found = {}
    for name in profiles:
        found[name] = found.get(name, 0) + 1
    return dict(sorted(found.items()))


def place(wanted, table):
    """Where each wanted GPU instance goes: [(profile, start)], or None when they do not fit.

    ``wanted`` is {profile: count}; ``table`` is {profile: {"size", "starts", "instances",
    "slices"}} as the driver gives them (memory slices taken, allowed starts, the most of that
    profile, compute slices). The largest go first; a backtracking search tries every start.
    """
    unknown = sorted(set(wanted) - set(table))
    if unknown:
        raise LayoutError("%s: not a MIG profile of this GPU; it has %s"
                          % (", ".join(unknown), ", ".join(sorted(table, key=_profile_order))))
    for name, count in wanted.items():
        if count > table[name]["instances"]:
            return None
    compute = max((profile["slices"] for profile in table.values()), default=0)
    if sum(table[name]["slices"] * count for name, count in wanted.items()) > compute:
        return None
    order = sorted((name for name, count in wanted.items() for _copy in range(count)),
                   key=lambda name: (-table[name]["size"], _profile_order(name)))
    used = [False] * MEMORY_SLICES
    chosen = []

    def search(position):
        if position == len(order):
            return True
        name = order[position]
        size = table[name]["size"]
        previous = chosen[-1][1] if chosen and chosen[-1][0] == name else -1
        for start in table[name]["starts"]:
            # instances of one profile are interchangeable: try their starts in rising order only
            if start <= previous or start + size > MEMORY_SLICES or any(used[start:start + size]):
                continue
            used[start:start + size] = [True] * size
            chosen.append((name, start))
            if search(position + 1):
                return True
            chosen.pop()
            used[start:start + size] = [False] * size
        return False

    return list(chosen) if search(0) else None


def _profile_order(name):
    match = re.match(r"^(\d+)g\.(\d+)gb(.*)$", name)
    return (int(match.group(1)), int(match.group(2)), match.group(3)) if match else (99, 0, name)
