# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""NVIDIA GPUs as the PCI bus sees them, from sysfs (private to the collection).

This needs no driver: the kernel lists every PCI function under ``/sys/bus/pci/devices``
with its vendor, device and class, whether or not a driver is bound. It is how a node
without a working driver still says that it has GPUs, and how the driver's verification
checks that NVML sees every GPU the bus has.
"""

from __future__ import annotations

import os

NVIDIA_VENDOR = 0x10DE
# PCI base class 03 (display), subclasses 00 (VGA compatible: GeForce, older Tesla) and
# 02 (3D controller: the data centre GPUs). NVSwitches (class 0680) and the GPUs' own audio
# functions (0403) are not GPUs.
GPU_CLASSES = (0x0300, 0x0302)
# PCI class 0680 (bridge, other): the NVSwitch chips of the HGX A100 and HGX H100/H200 baseboards,
# each one NVIDIA function the nvidia-nvswitch part of the driver binds. Their device IDs name
# the generation, as the open kernel modules' nvswitch tables list them. The fourth generation
# (HGX B200/B300) is not an NVIDIA PCI function on the host: it is reached through ConnectX
# bridges, so it does not show here.
NVSWITCH_CLASS = 0x0680
NVSWITCH_GENERATIONS = (
    (0x1AE8, 0x1AFF, "LR10"),   # second generation: HGX A100 (6 chips, 0x1af1)
    (0x22A0, 0x22A7, "LS10"),   # third generation: HGX H100/H200 (4 chips, 0x22a3)
)

# PCI device ID -> the name NVML gives the card, for the cards a cluster usually holds. A device
# not listed here is still found and counted; its model is then unknown (None).
MODELS = {
    0x1B02: "TITAN Xp",
    0x1B06: "NVIDIA GeForce GTX 1080 Ti",
    0x15F8: "Tesla P100-PCIE-16GB",
    0x1DB1: "Tesla V100-SXM2-16GB",
    0x1DB4: "Tesla V100-PCIE-16GB",
    0x1DB5: "Tesla V100-SXM2-32GB",
    0x1DB6: "Tesla V100-PCIE-32GB",
    0x1EB8: "Tesla T4",
    0x20B0: "NVIDIA A100-SXM4-40GB",
    0x20B2: "NVIDIA A100-SXM4-80GB",
    0x20B5: "NVIDIA A100 80GB PCIe",
    0x20B7: "NVIDIA A30",
    0x20F1: "NVIDIA A100-PCIE-40GB",
    0x2204: "NVIDIA GeForce RTX 3090",
    0x2235: "NVIDIA A40",
    0x2236: "NVIDIA A10",
    0x2321: "NVIDIA H100 NVL",
    0x2330: "NVIDIA H100 80GB HBM3",
    0x2331: "NVIDIA H100 PCIe",
    0x2335: "NVIDIA H200",
    0x26B5: "NVIDIA L40",
    0x26B9: "NVIDIA L40S",
    0x27B8: "NVIDIA L4",
}


def _read(path):
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().strip()
    except (OSError, ValueError):
        return None


def _hex(text):
    try:
        return int(text, 16)
    except (TypeError, ValueError):
        return None


def _pci_entries(sysfs):
    """(address, path) of every entry of the PCI bus in sysfs, in bus order; none when the tree cannot be read."""
    root = os.path.join(sysfs, "bus", "pci", "devices")
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    return [(name, os.path.join(root, name)) for name in names]


def nvidia_functions(sysfs="/sys"):
    """Every NVIDIA GPU function on the PCI bus, sorted into three lists (each in bus order):

    - ``gpus``: the physical GPUs (and a VM's passed-through or vGPU functions), dicts with ``busId``
      ('0000:18:00.0'), ``deviceId`` ('0x2330'), ``class``, ``model`` (NVML's name for the device, or
      None when the table does not know it), ``driver`` (the bound kernel driver, such as 'nvidia',
      'nouveau' or 'vfio-pci', or None) and ``vgpu``;
    - ``virtual_functions``: SR-IOV virtual functions (a ``physfn`` link to their GPU), which are
      slices of a GPU handed to VMs, not GPUs of this host: ``busId``, ``deviceId``, ``physfn`` (the
      GPU's address) and ``driver``;
    - ``unreadable``: functions that may be NVIDIA GPUs and cannot be read: NVIDIA functions whose
      class cannot be read, and entries that are broken links (their vendor unknown): ``busId``,
      ``vendor`` ('0x10de', or None when unknown) and ``problem``.

    - ``nvswitches``: an HGX board's NVSwitch chips (NVIDIA functions of class 0680): ``busId``,
      ``deviceId`` ('0x22a3'), ``generation`` ('LR10', 'LS10', or None for an ID the table does not know)
      and ``driver`` ('nvidia-nvswitch' once the driver runs, or None).

    An unreadable or absent tree gives empty lists: a host without PCI has no GPUs on it.
    """
    found = {"gpus": [], "virtual_functions": [], "unreadable": [], "nvswitches": []}
    for name, path in _pci_entries(sysfs):
        if os.path.islink(path) and not os.path.exists(path):
            found["unreadable"].append({"busId": name, "vendor": None,
                                        "problem": "%s is a broken link, so even its vendor cannot be read" % path})
            continue
        if _hex(_read(os.path.join(path, "vendor"))) != NVIDIA_VENDOR:
            continue
        klass, device = _hex(_read(os.path.join(path, "class"))), _hex(_read(os.path.join(path, "device")))
        if klass is None:
            found["unreadable"].append({"busId": name, "vendor": "0x%04x" % NVIDIA_VENDOR,
                                        "problem": "cannot read %s" % os.path.join(path, "class")})
            continue
        device_id = "0x%04x" % device if device is not None else None
        if klass >> 8 not in GPU_CLASSES + (NVSWITCH_CLASS,):
            continue
        driver = os.path.join(path, "driver")
        driver = os.path.basename(os.readlink(driver)) if os.path.islink(driver) else None
        if klass >> 8 == NVSWITCH_CLASS:
            found["nvswitches"].append({
                "busId": name, "deviceId": device_id, "driver": driver,
                "generation": next((label for low, high, label in NVSWITCH_GENERATIONS
                                    if device is not None and low <= device <= high), None)})
            continue
        physfn = os.path.join(path, "physfn")
        if os.path.islink(physfn):
            found["virtual_functions"].append({"busId": name, "deviceId": device_id,
                                               "physfn": os.path.basename(os.readlink(physfn)), "driver": driver})
            continue
        found["gpus"].append({
            "busId": name,
            "deviceId": device_id,
            "class": "0x%06x" % klass,
            "model": MODELS.get(device),
            "driver": driver,
            "vgpu": is_vgpu(_read_bytes(os.path.join(path, "config"))),
        })
    return found


def nvswitches(sysfs="/sys"):
    """The NVSwitch chips on the PCI bus, in bus order: ``nvidia_functions(sysfs)["nvswitches"]``."""
    return nvidia_functions(sysfs)["nvswitches"]


def pci_facts(sysfs="/sys"):
    """The modules' ``pci_gpus``, ``pci_virtual_functions``, ``pci_unreadable`` and ``pci_nvswitches``, and a
    warning for each unreadable function: (facts, warnings)."""
    functions = nvidia_functions(sysfs)
    facts = {"pci_gpus": functions["gpus"], "pci_virtual_functions": functions["virtual_functions"],
             "pci_unreadable": functions["unreadable"], "pci_nvswitches": functions["nvswitches"]}
    warnings = ["PCI function %s%s: %s, so whether it is %s GPU is not known" % (
        function["busId"], " of NVIDIA" if function["vendor"] else "", function["problem"],
        "a" if function["vendor"] else "an NVIDIA") for function in functions["unreadable"]]
    return facts, warnings


def nvidia_gpus(sysfs="/sys"):
    """The NVIDIA GPUs on the PCI bus, in bus order: ``nvidia_functions(sysfs)["gpus"]``."""
    return nvidia_functions(sysfs)["gpus"]


def _read_bytes(path):
    try:
        with open(path, "rb") as handle:
            return handle.read(4096)
    except OSError:
        return b""


# PCI configuration space: the status register's "capabilities list" bit, the pointer to the
# first capability, and the ID of a vendor-specific capability.
_STATUS, _CAPABILITIES_BIT, _CAPABILITIES_POINTER, _VENDOR_SPECIFIC = 0x06, 0x10, 0x34, 0x09


def is_vgpu(config):
    """Whether a PCI function is an NVIDIA vGPU: its configuration space has a vendor-specific
    capability whose signature (bytes 3 and 4 of the capability) reads "VF"."""
    if len(config) <= _CAPABILITIES_POINTER or not config[_STATUS] & _CAPABILITIES_BIT:
        return False
    position, visited = config[_CAPABILITIES_POINTER], set()
    while position and position not in visited and position + 5 <= len(config):
        visited.add(position)
        if config[position] == 0xFF:
            return False
        if config[position] == _VENDOR_SPECIFIC and config[position + 3:position + 5] == b"VF":
            return True
        position = config[position + 1]
    return False


def bus_key(bus_id):
    """A PCI address made comparable across spellings: NVML's '00000000:18:00.0' and sysfs's
    '0000:18:00.0' both give (0, 0x18, '00.0'). None for anything else."""
    parts = (bus_id or "").lower().split(":")
    if len(parts) != 3:
        return None
    try:
        return int(parts[0], 16), int(parts[1], 16), parts[2]
    except ValueError:
        return None


# Drivers that hold a GPU for a VM: NVML on the host is not meant to see it.
PASSTHROUGH_DRIVERS = ("vfio-pci", "pci-stub")


def missing_from_nvml(pci_gpus, nvml_bus_ids):
    """The PCI GPUs (dicts from :func:`nvidia_gpus`) whose address is not among NVML's; a GPU bound to
    vfio-pci or pci-stub (passed through to a VM) is not missing."""
    seen = {bus_key(bus_id) for bus_id in nvml_bus_ids}
    return [gpu for gpu in pci_gpus
            if bus_key(gpu["busId"]) not in seen and gpu.get("driver") not in PASSTHROUGH_DRIVERS]
