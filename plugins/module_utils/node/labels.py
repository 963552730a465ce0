# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""GPU node labels from the nvidia_gpu fact (private to the collection; pure functions).

The names and value formats are those of NVIDIA's GPU feature discovery (GFD), which
manifests and schedulers already select on, plus one key of the site's choosing
(``gpu/nvidia=<model>`` by default) for DaemonSets that select on a key of their own. The labels in
:data:`GFD_KEYS` and the site's key are ours: they are set, changed and removed to match
the facts. Every other label of a Node is left alone.
"""

from __future__ import annotations

import re

PREFIX = "nvidia.com/"
GFD_KEYS = tuple(PREFIX + name for name in (
    "gpu.present",
    "gpu.product",
    "gpu.count",
    "gpu.memory",
    "gpu.family",
    "gpu.compute.major",
    "gpu.compute.minor",
    "cuda.driver-version.major",
    "cuda.driver-version.minor",
    "cuda.driver-version.revision",
    "cuda.driver-version.full",
    "cuda.runtime-version.major",
    "cuda.runtime-version.minor",
    "cuda.runtime-version.full",
    "mig.capable",
))

_NOT_GFD_CHARACTERS = re.compile(r"[^A-Za-z0-9\-_. ]")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def sanitise_product(name):
    """A GPU name as GFD writes it in a label: characters outside [A-Za-z0-9-_. ] removed, spaces
    turned into '-', cut to the 63 characters a label value may have ('NVIDIA H100 80GB HBM3' ->
    'NVIDIA-H100-80GB-HBM3')."""
    value = _NOT_GFD_CHARACTERS.sub("", name or "").strip().replace(" ", "-")
    value = value[:63]
    return value.strip("-_.")


def valid_label_key(key):
    """Whether ``key`` is a valid Kubernetes label key (optional DNS prefix, then a name)."""
    prefix, _sep, name = key.rpartition("/")
    return bool(_LABEL_KEY.match(key)) and len(name) <= 63 and len(prefix) <= 253


def _version_parts(version):
    parts = (version or "").split(".")
    return parts if all(part.isdigit() for part in parts) and parts != [""] else []


def desired_labels(fact, gpu_label_key):
    """The labels a node with this nvidia_gpu fact should carry (ours only).

    A node with no GPUs gets none of ours; one whose driver cannot be read gets those
    :func:`pci_labels` gives from its PCI bus. With several
    models, ``gpu.product`` names the first GPU's (GFD does the same); select mixed nodes by
    ``gpu.count`` and the Scv's card list instead.
    """
    cards = [card for card in (fact or {}).get("cardList") or [] if card.get("model")]
    if not (fact or {}).get("nvml_available"):
        return pci_labels((fact or {}).get("pci_gpus"), gpu_label_key)
    if not cards:
        return {}
    first = cards[0]
    product = sanitise_product(first["model"])
    labels = {
        PREFIX + "gpu.present": "true",
        PREFIX + "gpu.product": product,
        PREFIX + "gpu.count": str(len(cards)),
        PREFIX + "mig.capable": "true" if any("migEnabled" in card for card in cards) else "false",
        gpu_label_key: product,
    }
    if first.get("totalMemory") is not None:
        labels[PREFIX + "gpu.memory"] = str(first["totalMemory"])
    if first.get("family"):
        labels[PREFIX + "gpu.family"] = first["family"]
    compute = _version_parts(first.get("computeCapability"))
    if len(compute) == 2:
        labels[PREFIX + "gpu.compute.major"], labels[PREFIX + "gpu.compute.minor"] = compute
    driver = _version_parts(fact.get("driver_version"))
    if driver:
        labels[PREFIX + "cuda.driver-version.full"] = fact["driver_version"]
        for name, part in zip(("major", "minor", "revision"), driver):
            labels[PREFIX + "cuda.driver-version." + name] = part
    runtime = _version_parts(fact.get("cuda_driver_version"))
    if len(runtime) >= 2:
        labels[PREFIX + "cuda.runtime-version.full"] = fact["cuda_driver_version"]
        labels[PREFIX + "cuda.runtime-version.major"], labels[PREFIX + "cuda.runtime-version.minor"] = runtime[:2]
    return {key: value for key, value in labels.items() if _LABEL_VALUE.match(value)}


def pci_labels(pci_gpus, gpu_label_key):
    """The labels of a node whose driver does not answer, from the GPUs its PCI bus has.

    ``gpu.present`` and the site's key, so that a driver-installer DaemonSet selecting on either
    reaches the node before any driver runs. The key's value is the model NVML will report
    (from the device ID), so it does not change when the driver comes up, or ``pci-10de-<device>``
    for a device the table does not know. Nothing for a node without NVIDIA GPUs.
    """
    gpus = [gpu for gpu in pci_gpus if isinstance(gpu, dict) and isinstance(gpu.get("deviceId"), str)
            and gpu["deviceId"].startswith("0x")] if isinstance(pci_gpus, list) else []
    if not gpus:
        return {}
    first = gpus[0]
    model = first.get("model") if isinstance(first.get("model"), str) else None
    value = sanitise_product(model) if model else "pci-10de-%s" % first["deviceId"][2:]
    labels = {PREFIX + "gpu.present": "true", gpu_label_key: value}
    return {key: value for key, value in labels.items() if _LABEL_VALUE.match(value)}


def label_changes(current, desired, gpu_label_key):
    """The merge patch that takes a Node's labels from ``current`` to ``desired`` for the keys we
    own: {key: value} to set, {key: None} to remove. Empty when nothing changes."""
    current = current or {}
    owned = set(GFD_KEYS) | {gpu_label_key}
    changes = {key: value for key, value in desired.items() if current.get(key) != value}
    changes.update({key: None for key in current if key in owned and key not in desired})
    return changes
