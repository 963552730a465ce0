from __future__ import annotations

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.common.gpu_info import (
    bytes_to_mib,
    cuda_version_string,
    gpu_family,
    node_totals,
    parse_gather_subset,
    pcie_bandwidth,
)


@pytest.mark.parametrize(
    "generation, width, expected",
    [
        (3, 16, 15760),   # SCV's README: TITAN Xp
        (3, 8, 7880),
        (1, 16, 4000),
        (2, 16, 8000),
        (4, 16, 31504),
        (5, 16, 63008),   # SCV has no gen5 entry and would publish 0
        (6, 16, 126032),
        (4, 1, 1969),
    ],
)
def test_pcie_bandwidth_is_lane_rate_times_width(generation, width, expected):
    assert pcie_bandwidth(generation, width) == expected


@pytest.mark.parametrize("generation, width", [(7, 16), (0, 16), (3, 0)])
def test_pcie_bandwidth_unknown_is_none_not_zero(generation, width):
    assert pcie_bandwidth(generation, width) is None


@pytest.mark.parametrize(
    "major, minor, family",
    [
        (6, 1, "pascal"),
        (7, 0, "volta"),
        (7, 2, "volta"),
        (7, 5, "turing"),
        (8, 0, "ampere"),
        (8, 6, "ampere"),
        (8, 7, "ampere"),
        (8, 9, "ada-lovelace"),
        (9, 0, "hopper"),
        (10, 0, "blackwell"),
        (12, 0, "blackwell"),
        (5, 2, "maxwell"),
        (3, 7, "kepler"),
        (11, 0, None),
    ],
)
def test_gpu_family_follows_gfd(major, minor, family):
    assert gpu_family(major, minor) == family


def test_bytes_to_mib_rounds_down():
    assert bytes_to_mib(12194 * 1024 * 1024 + 1024 * 1024 - 1) == 12194
    assert bytes_to_mib(1024 * 1024 - 1) == 0


@pytest.mark.parametrize("value, text", [(12040, "12.4"), (12020, "12.2"), (11080, "11.8"), (13000, "13.0")])
def test_cuda_version_string(value, text):
    assert cuda_version_string(value) == text


def test_node_totals_count_cards_without_memory_but_not_their_memory():
    cards = [{"id": 0, "totalMemory": 100, "freeMemory": 40}, {"id": 1, "health": "Unhealthy"},
             {"id": 2, "totalMemory": 50, "freeMemory": 50}]
    assert node_totals(cards) == {"cardNumber": 3, "totalMemorySum": 150, "freeMemorySum": 90}
    assert node_totals([]) == {"cardNumber": 0, "totalMemorySum": 0, "freeMemorySum": 0}


@pytest.mark.parametrize(
    "items, selected",
    [
        (["all"], ["counters", "fabric", "mig", "processes", "telemetry"]),
        (["min"], []),
        (["!processes"], ["counters", "fabric", "mig", "telemetry"]),
        (["!all"], []),
        (["min", "mig"], ["mig"]),
        (["all", "!telemetry", "!mig", "!counters", "!fabric"], ["processes"]),
        (["telemetry", "!telemetry"], []),
    ],
)
def test_parse_gather_subset(items, selected):
    assert parse_gather_subset(items) == (selected, [])


def test_parse_gather_subset_reports_unknown_names():
    everything = ["counters", "fabric", "mig", "processes", "telemetry"]
    assert parse_gather_subset(["all", "ecc", "!nope"]) == (everything, ["ecc", "!nope"])
