"""A sysfs PCI tree laid out as the kernel lays it out: /sys/devices/pci0000:00/<address> with
/sys/bus/pci/devices/<address> a symlink to it. The tests point gpu_facts' ``sysfs`` option at
one; tools/gfd/make-fixtures mounts one over /sys for NVIDIA's GPU feature discovery, which reads
the real path.

For a simulator scenario, a device's PCI class is its ``pciClass`` (default 0x030200, a 3D
controller: a data centre GPU in compute mode; 0x030000 is a VGA controller, a GPU in graphics
mode), and ``"vgpu": 1`` gives its configuration space NVIDIA's vGPU capability.

A scenario's top-level ``"nvswitches"`` lists the host's NVSwitch chips, written as NVML writes a
device's PCI identity: ``{"pciBusId": "00000000:05:00.0", "pciDeviceId": 581112030}`` (0x22A310DE: device
0x22a3 in the high half, NVIDIA's vendor 0x10de in the low). Each becomes an NVIDIA function of class
0x068000 bound to nvidia-nvswitch; the NVML simulator makes them the far ends of the GPUs' NVLinks.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

NVIDIA = 0x10DE
COMPUTE_CLASS = 0x030200
NVSWITCH_CLASS = 0x068000
EMPTY_BAR = "0x0000000000000000 0x0000000000000000 0x0000000000000000"


def config_space(vendor, device, vgpu=False):
    """256 bytes of PCI configuration space: vendor and device IDs, and when ``vgpu``, a
    capability list holding one vendor-specific capability signed "VF"."""
    config = bytearray(256)
    config[0:2] = vendor.to_bytes(2, "little")
    config[2:4] = device.to_bytes(2, "little")
    if vgpu:
        config[0x06] = 0x10                      # status: capabilities list present
        config[0x34] = 0x60                      # first capability
        config[0x60:0x66] = bytes([0x09, 0x00, 0x14, ord("V"), ord("F"), 0x01])
    return bytes(config)


def add_function(sysfs, address, vendor, device, klass, driver=None, vgpu=False, physfn=None):
    """One PCI function, with the files the kernel gives it that the collection and GFD read.

    ``physfn``: the address of the physical function this one is an SR-IOV virtual function of (the
    kernel links the two both ways: ``physfn`` here, ``virtfnN`` there)."""
    sysfs = pathlib.Path(sysfs)
    real = sysfs / "devices" / "pci0000:00" / address
    real.mkdir(parents=True)
    for name, text in (("vendor", "0x%04x" % vendor), ("device", "0x%04x" % device), ("class", "0x%06x" % klass),
                       ("subsystem_vendor", "0x%04x" % vendor), ("subsystem_device", "0x0000"),
                       ("numa_node", "-1"), ("resource", "\n".join([EMPTY_BAR] * 13))):
        (real / name).write_text(text + "\n")
    (real / "config").write_bytes(config_space(vendor, device, vgpu))
    if driver:
        drivers = sysfs / "bus" / "pci" / "drivers" / driver
        drivers.mkdir(parents=True, exist_ok=True)
        (real / "driver").symlink_to(os.path.relpath(drivers, real))
    if physfn:
        parent = sysfs / "devices" / "pci0000:00" / physfn
        (real / "physfn").symlink_to(os.path.relpath(parent, real))
        number = len(list(parent.glob("virtfn*")))
        (parent / ("virtfn%d" % number)).symlink_to(os.path.relpath(real, parent))
    listing = sysfs / "bus" / "pci" / "devices"
    listing.mkdir(parents=True, exist_ok=True)
    (listing / address).symlink_to(os.path.relpath(real, listing))


def sysfs_address(nvml_bus_id):
    """NVML's '00000000:18:00.0' as sysfs names it, '0000:18:00.0'."""
    domain, bus, rest = nvml_bus_id.lower().split(":")
    return "%04x:%s:%s" % (int(domain, 16), bus, rest)


def build(scenario, root):
    """The tree of a host with the GPUs of ``scenario`` (a parsed scenario), bound to nvidia, and its
    NVSwitches, bound to nvidia-nvswitch; returns ``root``."""
    (pathlib.Path(root) / "bus" / "pci" / "devices").mkdir(parents=True, exist_ok=True)
    for gpu in scenario.get("devices", []):
        if isinstance(gpu.get("pciBusId"), str):
            add_function(root, sysfs_address(gpu["pciBusId"]), NVIDIA, (gpu.get("pciDeviceId", 0) >> 16) & 0xFFFF,
                         gpu.get("pciClass", COMPUTE_CLASS), "nvidia", bool(gpu.get("vgpu")))
    for switch in scenario.get("nvswitches", []):
        add_function(root, sysfs_address(switch["pciBusId"]), NVIDIA, (switch["pciDeviceId"] >> 16) & 0xFFFF,
                     NVSWITCH_CLASS, "nvidia-nvswitch")
    return root


if __name__ == "__main__":
    # python3 tests/harness/pci_sysfs.py SCENARIO.json ROOT (what tools/gfd/make-fixtures runs)
    with open(sys.argv[1], encoding="utf-8") as handle:
        build(json.load(handle), sys.argv[2])
