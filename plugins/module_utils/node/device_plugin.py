# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What NVIDIA's device plugin will offer for a node's GPUs, or why it will not start (private).

The rules are the plugin's own, checked against what it served and refused on the NVML
simulator (tests/fixtures/device-plugin): it stops when NVML cannot start or any GPU cannot be
read; under the ``single`` MIG strategy it also stops when a GPU with MIG on has no MIG device,
when the MIG devices are of more than one type, or when GPUs with MIG off sit beside ones with it
on. ``laid_out`` gives the nvidia_gpu fact a mig_layout plan would leave, so that a node is
judged before it is cordoned, not after.
"""

from __future__ import annotations

import copy

from ansible_collections.scv.gpu.plugins.module_utils.node.labels import (
    config_sharing,
    mig_devices,
    mig_resource_name,
    single_strategy_faults,
)

PLUGIN = "NVIDIA's device plugin will not start on this node"


class PluginRefusal(ValueError):
    """The node's GPUs are such that NVIDIA's device plugin stops at start; the message says why."""


def laid_out(fact, gpus):
    """The nvidia_gpu ``fact`` as it will be once the GPUs of a mig_layout result (its ``gpus``, each with
    ``index`` and ``after``) are laid out; the GPUs it does not name keep their state."""
    after = copy.deepcopy(fact or {})
    cards = after.get("cardList") or []
    for gpu in gpus or []:
        state = gpu.get("after") if isinstance(gpu, dict) else None
        if not isinstance(state, dict) or not isinstance(gpu.get("index"), int) or gpu["index"] >= len(cards):
            continue
        card = cards[gpu["index"]]
        card["migEnabled"] = bool(state.get("mig-enabled"))
        card["migDevices"] = [{"profile": profile} for profile, count in sorted((state.get("mig-devices") or {}).items())
                              for _copy in range(count)] if card["migEnabled"] else []
    return after


def refusal(fact, mig_strategy, config=None):
    """Why NVIDIA's device plugin will not start with these GPUs under ``mig_strategy`` and ``config`` (its
    config file in NVIDIA's format; None for none), or None."""
    fact = fact or {}
    if config_sharing(config)[0] == "mps":
        if mig_strategy == "mixed":
            return ("%s: its config shares GPUs with MPS, which the plugin refuses under MIG strategy mixed ('using "
                    "--mig-strategy=mixed is not supported with MPS'). Use time-slicing, or MIG strategy none"
                    % PLUGIN)
        if mig_strategy == "single" and mig_devices(fact.get("cardList") or []):
            return ("%s: its config shares GPUs with MPS, and under MIG strategy single it would serve MIG devices "
                    "('sharing using MPS is not supported for MIG devices'). Use time-slicing, or turn MIG off"
                    % PLUGIN)
    if not fact.get("nvml_available", True):
        return "%s: NVML cannot be initialised (%s)" % (PLUGIN, fact.get("nvml_error") or "no driver")
    cards = fact.get("cardList") or []
    lost = [position for position, card in enumerate(cards) if not card.get("model")]
    if lost:
        return ("%s: GPU %s cannot be read, and the plugin stops at the first GPU it cannot read. Reset or replace "
                "the GPU" % (PLUGIN, ", ".join(map(str, lost))))
    if mig_strategy != "single":
        return None
    faults = single_strategy_faults(cards)
    if "empty" in faults:      # the plugin's own order of checks
        return ("%s under MIG strategy single: GPU %s has MIG on and no MIG device (the plugin's words: 'device %d "
                "has no MIG devices configured'). Give it MIG devices, or turn its MIG mode off"
                % (PLUGIN, ", ".join(map(str, faults["empty"])), faults["empty"][0]))
    if "profiles" in faults:
        return ("%s under MIG strategy single: its MIG devices are of %d profiles (%s), and single takes one ('more "
                "than one MIG device type present on node'). Use one profile on every GPU, or strategy mixed"
                % (PLUGIN, len(faults["profiles"]), ", ".join(faults["profiles"])))
    if "mig_off" in faults:
        return ("%s under MIG strategy single: GPU %s has MIG off beside GPUs with it on ('all devices on the node "
                "must be configured with the same migEnabled value'). Give every GPU the same MIG mode, or use "
                "strategy mixed" % (PLUGIN, ", ".join(map(str, faults["mig_off"]))))
    return None


def device_plugin_resources(fact, mig_strategy, config=None):
    """{resource: count} NVIDIA's device plugin offers for these GPUs under ``mig_strategy`` and ``config``:
    the number of device IDs :func:`offered_devices` gives each resource."""
    return {name: len(ids) for name, ids in offered_devices(fact, mig_strategy, config).items()}


def offered_devices(fact, mig_strategy, config=None):
    """{resource: [device ID, ...]} NVIDIA's device plugin offers for these GPUs under ``mig_strategy`` and
    ``config`` (its config file in NVIDIA's format; None for none).

    Whole GPUs are nvidia.com/gpu (strategy none: every GPU; mixed: those with MIG off), MIG devices
    nvidia.com/gpu (single) or nvidia.com/mig-<profile> (mixed), each by its UUID. A resource the config shares
    with N replicas offers ``<UUID>::0`` to ``<UUID>::N-1`` for each of its devices instead, under
    ``<resource>.shared`` when the config renames by default; a shared resource that has no device here is
    left as it is. PluginRefusal where the plugin will not start, so that nothing is promised that will never
    come."""
    reason = refusal(fact, mig_strategy, config)
    if reason:
        raise PluginRefusal(reason)
    cards = (fact or {}).get("cardList") or []
    devices = mig_devices(cards)
    if mig_strategy == "none" or (mig_strategy == "single" and not devices):
        resources = {"nvidia.com/gpu": [card.get("uuid") for card in cards]}
    elif mig_strategy == "single":
        resources = {"nvidia.com/gpu": [device.get("uuid") for _card, device in devices]}
    else:
        resources = {"nvidia.com/gpu": [card.get("uuid") for card in cards if not card.get("migEnabled")]}
        for _card, device in devices:
            resources.setdefault("nvidia.com/mig-" + mig_resource_name(device["profile"]), []).append(device.get("uuid"))
    _strategy, shared = config_sharing(config)
    for name, (replicas, renamed) in shared.items():
        if resources.get(name) and replicas > 1:
            ids = resources.pop(name)
            resources[name + ".shared" if renamed else name] = ["%s::%d" % (uuid, replica) for uuid in ids
                                                                for replica in range(replicas)]
    return resources
