# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Pods that got a GPU or a MIG device through a Dynamic Resource Allocation claim (private to the collection).

The kubelet's pod-resources answer names, per container and claim, each device by its DRA driver, pool and
device name. NVIDIA's DRA driver (``gpu.nvidia.com``) names a whole GPU ``gpu-<minor number>`` and a MIG device
``gpu-<minor number>-mig-<profile>-<GPU instance profile ID>-<placement start>``; the agent finds the card by its
minor number and the GPU instance by its profile ID and placement, as NVML tells them, so it needs neither the
API server's ResourceSlices nor any right to read them. Devices of other drivers are left out.

Each holder (pod, namespace, container) of a device gets the labels dcgm-exporter gives a pod attributed through
DRA: ``dra_claim_name``, ``dra_claim_namespace``, ``dra_driver_name``, ``dra_pool_name``, ``dra_device_name``,
and on a MIG device ``dra_mig_profile`` and ``dra_mig_device_uuid``. A container holding one device through
several claims is labelled with the first, as the kubelet lists them.
"""

from __future__ import annotations

import re

DRIVER = "gpu.nvidia.com"
DRIVERS = frozenset((DRIVER.encode("ascii"),))
LABELS = ("dra_claim_name", "dra_claim_namespace", "dra_driver_name", "dra_pool_name", "dra_device_name")
MIG_LABELS = ("dra_mig_profile", "dra_mig_device_uuid")
WHOLE = re.compile(r"gpu-([0-9]+)$")
# the profile part has its dots left out and a "+" made "-" (1g.10gb+me: 1g10gb-me): the two numbers end it
MIG = re.compile(r"gpu-([0-9]+)-mig-(.+)-([0-9]+)-([0-9]+)$")


def device_name(name):
    """(minor number, None) of a whole GPU's DRA device name, (minor number, (GPU instance profile ID, placement
    start)) of a MIG device's; None for any other name."""
    found = WHOLE.match(name)
    if found:
        return int(found.group(1)), None
    found = MIG.match(name)
    if found:
        return int(found.group(1)), (int(found.group(3)), int(found.group(4)))
    return None


def claimed(held):
    """{DRA device name: {(pod, namespace, container): [claim name, claim namespace, driver, pool, device name]}} of
    the devices of NVIDIA's DRA driver in ``held`` (see kube.podresources.decode_list_response)."""
    found = {}
    for entry in held:
        holder = (entry["pod"], entry["namespace"], entry["container"])
        for device in entry.get("claim_devices", ()):
            if device["driver"] != DRIVER:
                continue
            found.setdefault(device["device"], {}).setdefault(holder, [
                entry["claim_name"], entry["claim_namespace"], device["driver"], device["pool"], device["device"]])
    return found


def units(claims, layout, cards):
    """{card id or (card id, GPU instance ID): {holder: label values (LABELS then MIG_LABELS)}} of ``claims`` (see
    ``claimed``) on this node's ``cards``, by ``layout`` (``MigInstances.placements``: minor numbers and GPU
    instance placements)."""
    minors, placements = layout
    present = {card.get("id") for card in cards}
    found = {}
    for name, holders in claims.items():
        parsed = device_name(name)
        card = minors.get(parsed[0]) if parsed else None
        if card is None or card not in present:
            continue
        if parsed[1] is None:
            key, mig = card, ["", ""]
        else:
            instance = placements.get(card, {}).get(parsed[1])
            if instance is None:
                continue
            key, mig = (card, instance[0]), [instance[1], instance[2]]
        table = found.setdefault(key, {})
        for holder, values in holders.items():
            table.setdefault(holder, values + mig)
    return found


def labels(table):
    """(label names, {unit: {holder: values}}) for the metrics: LABELS, and MIG_LABELS when a MIG device is held
    through a claim; no names when no device is."""
    if not any(table.values()):
        return (), {}
    if any(isinstance(key, tuple) for key, holders in table.items() if holders):
        return LABELS + MIG_LABELS, table
    width = len(LABELS)
    return LABELS, {key: {holder: values[:width] for holder, values in holders.items()}
                    for key, holders in table.items()}
