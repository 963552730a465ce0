# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A GPU's architecture from its PCI device ID, and the kernel module flavour its driver needs (private; pure).

NVIDIA numbers its GPUs' PCI device IDs by chip family, so a range of IDs names an architecture. The table is
data: its Turing-and-later part agrees with every device ID of the "Compatible GPUs" table in the README of
NVIDIA's open-gpu-kernel-modules (595.45.04), which lists the GPUs the open modules run on, all of them from
0x1E02 on ("any Turing or later GPU"); its older part follows the chip families' published IDs (GM107 0x1380,
GP100 0x15F7, GP102 0x1B00, GV100 0x1DB1, and so on).

What each flavour runs on, from NVIDIA's driver documentation:
- the open modules need Turing or newer; from branch 560 they are NVIDIA's default;
- Blackwell and Grace Hopper run with the open modules only;
- Maxwell, Pascal and Volta run with the proprietary modules only, and branch 580 is the last that supports
  them; Kepler's last branch is 470.
"""

from __future__ import annotations

# (first device ID, last device ID, architecture), for vendor 0x10de's display controllers
RANGES = (
    (0x0FC0, 0x12FF, "Kepler"),
    (0x1340, 0x13FF, "Maxwell"),
    (0x1400, 0x14FF, "Maxwell"),
    (0x15F0, 0x15FF, "Pascal"),         # GP100
    (0x1600, 0x17FF, "Maxwell"),        # GM204 mobile, GM200
    (0x1B00, 0x1D7F, "Pascal"),         # GP102, GP104, GP106, GP107, GP108
    (0x1D80, 0x1DFF, "Volta"),          # GV100
    (0x1E00, 0x1FFF, "Turing"),         # TU102, TU104, TU106, TU117
    (0x2000, 0x217F, "Ampere"),         # GA100
    (0x2180, 0x21FF, "Turing"),         # TU116
    (0x2200, 0x22FF, "Ampere"),         # GA102
    (0x2300, 0x23FF, "Hopper"),         # GH100; GH200 is Grace Hopper (below)
    (0x2400, 0x25FF, "Ampere"),         # GA103, GA104, GA106, GA107
    (0x2600, 0x28FF, "Ada Lovelace"),   # AD102, AD103, AD104, AD106, AD107
    (0x2900, 0x31FF, "Blackwell"),      # GB100, GB110, GB202, GB203, GB205, GB206, GB207, GB10, GB300
)
# Grace Hopper superchips: Hopper GPUs that, beside a Grace CPU, run with the open modules only
GRACE_HOPPER = frozenset((0x2342, 0x2348))

ORDER = ("Kepler", "Maxwell", "Pascal", "Volta", "Turing", "Ampere", "Ada Lovelace", "Hopper", "Blackwell")
OPEN_ONLY = frozenset(("Blackwell", "Grace Hopper"))
PROPRIETARY_ONLY = frozenset(("Kepler", "Maxwell", "Pascal", "Volta"))
# the last driver branch that supports an architecture, where one is known
LAST_BRANCH = {"Kepler": 470, "Maxwell": 580, "Pascal": 580, "Volta": 580}


def architecture(device_id):
    """The architecture of a GPU with PCI ``device_id`` (an int, or text such as '0x2330'), or None when the
    table does not know it."""
    try:
        number = int(device_id, 16) if isinstance(device_id, str) else int(device_id)
    except (TypeError, ValueError):
        return None
    if number in GRACE_HOPPER:
        return "Grace Hopper"
    for first, last, name in RANGES:
        if first <= number <= last:
            return name
    return None


def kernel_modules(gpus, setting, branch=None):
    """(the flavour to install, [problems]) for a host whose GPUs on the PCI bus are ``gpus`` ([{"busId",
    "deviceId", "model"}], as nvidia_driver_info's pci_gpus), with ``setting`` (auto, open or proprietary) and
    the driver ``branch`` it gets (an int, or None when unknown). Problems refuse the plan; each names the GPU."""
    known = []
    problems = []
    for gpu in gpus:
        name = architecture(gpu.get("deviceId"))
        if name is None:
            continue    # a device ID newer than the table: it decides nothing
        known.append((gpu, name))

    def named(gpu, name):
        model = gpu.get("model") or "unknown model"
        return "GPU %s (%s, device %s, %s)" % (gpu.get("busId"), model, gpu.get("deviceId"), name)
    needs_open = [(gpu, name) for gpu, name in known if name in OPEN_ONLY]
    needs_proprietary = [(gpu, name) for gpu, name in known if name in PROPRIETARY_ONLY]
    if needs_open and needs_proprietary:
        problems.append("this host mixes GPUs that need different kernel modules: %s run with the open modules "
                        "only, %s with the proprietary ones only; give them hosts of their own" % (
                            ", ".join(named(*item) for item in needs_open),
                            ", ".join(named(*item) for item in needs_proprietary)))
    if setting == "auto":
        flavour = "proprietary" if needs_proprietary else "open"
    else:
        flavour = setting
        wrong = needs_proprietary if setting == "open" else needs_open
        if wrong and not problems:
            problems.append("nvidia_driver_kernel_modules is %s, and %s cannot run with the %s modules: set it to "
                            "auto (or %s)" % (setting, ", ".join(named(*item) for item in wrong), setting,
                                              "proprietary" if setting == "open" else "open"))
    if branch is not None:
        for gpu, name in known:
            last = LAST_BRANCH.get(name)
            if last is not None and branch > last:
                problems.append("driver branch %d no longer supports %s: branch %d is the last for %s GPUs; set "
                                "nvidia_driver_branch to %d" % (branch, named(gpu, name), last, name, last))
    return flavour, problems
