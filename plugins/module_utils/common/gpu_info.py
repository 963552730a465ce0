# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Pure helpers that turn NVML readings into SCV-compatible GPU facts.

This file is private to the collection (see docs/architecture.md): its
interface may change without notice. It imports no NVML so that it can be
unit-tested, and reused by the Scv agent, without a driver.
"""

from __future__ import annotations

# PCIe usable MB/s per lane, by link generation. SCV stops at gen4 (and then
# reports 0); gen5 and gen6 are the rates after 128b/130b encoding and FLIT
# overhead that the PCI-SIG publishes, rounded down as SCV rounds gen1-gen4.
PCIE_LANE_MBPS = {
    1: 250,
    2: 500,
    3: 985,
    4: 1969,
    5: 3938,
    6: 7877,
}

# GPU feature discovery's architecture family names, keyed by compute capability.
_FAMILY_BY_MAJOR = {
    1: "tesla",
    2: "fermi",
    3: "kepler",
    5: "maxwell",
    6: "pascal",
    9: "hopper",
    10: "blackwell",
    12: "blackwell",
}

GATHER_SUBSETS = ("telemetry", "counters", "fabric", "mig", "processes")
"""Optional parts of the facts; the SCV fields, identity and health are always gathered."""

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"

MIB = 1024 * 1024


def pcie_bandwidth(generation, width):
    """PCIe MB/s of a link: per-lane rate at ``generation`` times ``width`` lanes.

    Returns None for a generation this table does not know, so that callers
    leave the field out instead of publishing a wrong number.
    """
    lane = PCIE_LANE_MBPS.get(generation)
    if lane is None or not width:
        return None
    return lane * width


def gpu_family(major, minor):
    """Architecture family as GPU feature discovery names it (``nvidia.com/gpu.family``)."""
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ampere" if minor < 9 else "ada-lovelace"
    return _FAMILY_BY_MAJOR.get(major)


def bytes_to_mib(value):
    """MiB as SCV computes them: whole MiB, rounded down."""
    return value // MIB


def cuda_version_string(version):
    """NVML's integer CUDA version (e.g. 12040) as ``major.minor`` (``12.4``)."""
    return "%d.%d" % (version // 1000, (version % 1000) // 10)


def node_totals(cards):
    """SCV's node-level fields computed from the card list."""
    return {
        "cardNumber": len(cards),
        "totalMemorySum": sum(card.get("totalMemory", 0) for card in cards),
        "freeMemorySum": sum(card.get("freeMemory", 0) for card in cards),
    }


def parse_gather_subset(items):
    """Resolve a ``gather_subset`` list the way ``ansible.builtin.setup`` does.

    ``all`` selects every optional part, ``min`` none, ``!name`` excludes one.
    A list made only of exclusions starts from ``all``. Returns
    ``(selected, unknown)`` where ``unknown`` lists names that are not valid.
    """
    valid = set(GATHER_SUBSETS) | {"all", "min"}
    selected = set()
    excluded = set()
    unknown = []
    only_exclusions = True
    for item in items:
        negate = item.startswith("!")
        name = item[1:] if negate else item
        if name not in valid:
            unknown.append(item)
            continue
        if name == "all":
            names = set(GATHER_SUBSETS)
        elif name == "min":
            names = set()
        else:
            names = {name}
        if negate:
            excluded |= names
        else:
            only_exclusions = False
            selected |= names
    if only_exclusions:
        selected = set(GATHER_SUBSETS)
    return sorted(selected - excluded), unknown
