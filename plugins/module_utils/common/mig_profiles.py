# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The MIG GPU instance profiles of the cards whose tables NVIDIA publishes (private; data only).

The driver lists a GPU's profiles only while its MIG mode is on. A layout for a GPU whose mode
is still off is planned from this table instead, so that a layout that cannot finish is refused
before MIG mode changes. Once the mode is on, the driver's own table is the one used.

Each table has the form ``nvml.mig.MigGpu.profiles`` returns (without the driver's profile IDs):
{profile: {"size": memory slices, "starts": allowed first slices, "instances": the most of that
profile, "slices": compute slices}}, as NVIDIA's MIG user guide tables them.
"""

from __future__ import annotations


def _seven_slices(small, half, whole):
    """The profiles of the 7-compute-slice, 8-memory-slice parts (A100, H100, H200); ``small``,
    ``half`` and ``whole`` are the memory in the names of the 1-, 4- and 7-slice profiles."""
    one = {"size": 1, "starts": [0, 1, 2, 3, 4, 5, 6], "slices": 1}
    return {
        "1g.%s" % small: dict(one, instances=7),
        "1g.%s+me" % small: dict(one, instances=1),
        "1g.%s" % half[1]: {"size": 2, "starts": [0, 2, 4, 6], "instances": 4, "slices": 1},
        "2g.%s" % half[1]: {"size": 2, "starts": [0, 2, 4], "instances": 3, "slices": 2},
        "3g.%s" % half[0]: {"size": 4, "starts": [0, 4], "instances": 2, "slices": 3},
        "4g.%s" % half[0]: {"size": 4, "starts": [0], "instances": 1, "slices": 4},
        "7g.%s" % whole: {"size": 8, "starts": [0], "instances": 1, "slices": 7},
    }


A30 = {
    "1g.6gb": {"size": 1, "starts": [0, 1, 2, 3], "instances": 4, "slices": 1},
    "1g.6gb+me": {"size": 1, "starts": [0, 1, 2, 3], "instances": 1, "slices": 1},
    "2g.12gb": {"size": 2, "starts": [0, 2], "instances": 2, "slices": 2},
    "2g.12gb+me": {"size": 2, "starts": [0, 2], "instances": 1, "slices": 2},
    "4g.24gb": {"size": 4, "starts": [0], "instances": 1, "slices": 4},
}
A100_40GB = _seven_slices("5gb", ("20gb", "10gb"), "40gb")
EIGHTY_GB = _seven_slices("10gb", ("40gb", "20gb"), "80gb")
H100_NVL = _seven_slices("12gb", ("47gb", "24gb"), "94gb")
H200 = _seven_slices("18gb", ("71gb", "35gb"), "141gb")

# PCI device ID (the upper 16 bits of NVML's pciDeviceId) -> (the card, its profiles)
KNOWN = {
    0x20B0: ("A100-SXM4-40GB", A100_40GB),
    0x20F1: ("A100-PCIE-40GB", A100_40GB),
    0x20B2: ("A100-SXM4-80GB", EIGHTY_GB),
    0x20B5: ("A100 80GB PCIe", EIGHTY_GB),
    0x20B7: ("A30", A30),
    0x2330: ("H100 80GB HBM3 (SXM5)", EIGHTY_GB),
    0x2331: ("H100 PCIe", EIGHTY_GB),
    0x2321: ("H100 NVL", H100_NVL),
    0x2335: ("H200", H200),
}


def known_profiles(pci_device_id):
    """The profile table of the card with NVML's ``pci_device_id`` (such as 0x233010DE), or None."""
    if not isinstance(pci_device_id, int):
        return None
    card = KNOWN.get(pci_device_id >> 16)
    return None if card is None else {name: dict(profile) for name, profile in card[1].items()}
