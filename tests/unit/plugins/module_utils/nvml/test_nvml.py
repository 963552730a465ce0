"""The NVML reader, in-process, driven through the real pynvml and the NVML simulator."""

from __future__ import annotations

import json
import os

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.nvml.collect import collect
from ansible_collections.scv.gpu.plugins.module_utils.common.gpu_info import GATHER_SUBSETS

from harness import scenario_expectations as expected
from harness.paths import scenario_path

ALL = list(GATHER_SUBSETS)


@pytest.mark.parametrize("scenario", sorted(expected.BY_SCENARIO))
def test_scenario_field_by_field(nvml_simulator, scenario):
    nvml_simulator.use(scenario)
    facts = collect(ALL)
    want = expected.BY_SCENARIO[scenario]
    assert set(facts) == set(want)
    for key in want:
        if key != "cardList":
            assert facts[key] == want[key], key
    assert len(facts["cardList"]) == len(want["cardList"])
    for card, want_card in zip(facts["cardList"], want["cardList"]):
        assert card == want_card, "card %s" % want_card["id"]


def test_titan_xp_matches_scv_readme(nvml_simulator):
    nvml_simulator.use("titan_xp")
    card = collect(ALL)["cardList"][0]
    assert (card["bandwidth"], card["clock"], card["core"], card["power"]) == (15760, 5705, 1911, 250)
    assert (card["id"], card["model"], card["health"]) == (0, "TITAN Xp", "Healthy")


def test_every_health_reason_on_its_own_card(nvml_simulator):
    nvml_simulator.use("health_reasons")
    cards = collect(ALL)["cardList"]
    assert [card["healthReasons"] for card in cards] == expected.HEALTH_REASONS
    assert [card["health"] for card in cards] == [
        "Unhealthy" if reasons else "Healthy" for reasons in expected.HEALTH_REASONS
    ]


def test_failed_query_leaves_the_field_out_but_keeps_the_others(nvml_simulator):
    nvml_simulator.use("health_reasons")
    card = collect(ALL)["cardList"][5]   # memory info answers UNKNOWN
    assert "totalMemory" not in card and "freeMemory" not in card
    assert (card["clock"], card["core"], card["power"], card["bandwidth"]) == (1215, 1440, 165, 31504)


def test_card_needing_reset_is_not_queried_further(nvml_simulator):
    nvml_simulator.use("health_reasons")
    card = collect(ALL)["cardList"][6]   # max clock answers RESET_REQUIRED
    assert card["totalMemory"] == 24576
    assert "clock" not in card and "power" not in card and "temperature" not in card


def test_gather_subset_min_leaves_out_optional_parts(nvml_simulator):
    nvml_simulator.use("a100_mig")
    card = collect([])["cardList"][0]
    for key in ("temperature", "gpuUtilization", "memoryUtilization", "powerDraw",
                "migEnabled", "migPendingEnabled", "migDevices", "processCount"):
        assert key not in card
    # health and the SCV fields stay
    assert card["health"] == "Healthy" and card["bandwidth"] == 31504 and card["eccEnabled"] is True


def test_gather_subset_costs_fewer_nvml_calls(nvml_simulator):
    nvml_simulator.use("h100_sxm_x8")
    nvml_simulator.reset_calls()
    collect(ALL)
    everything = nvml_simulator.calls()
    nvml_simulator.reset_calls()
    collect([])
    minimum = nvml_simulator.calls()
    # Per card: temperature, utilization, power draw, the SM and memory clocks, the encoder and
    # decoder utilization, the counters' field values and the virtualization mode, MIG mode and
    # one process query, which takes a second call (count, then fill) on the 5 of the 8 cards that
    # run processes (card i runs i % 3). The memory temperature rides on the recovery action's call.
    # The fabric: its state, the NVLink count and speed (one field-values call), the links' version, and
    # each of the 18 links' state and far end.
    with_processes = sum(1 for i in range(8) if i % 3)
    assert everything - minimum == 8 * (11 + 3 + 2 * 18) + with_processes


def _write_scenario(path, devices):
    path.write_text(json.dumps({"driverVersion": "550.54.15", "devices": devices}))


def test_nvml_calls_grow_linearly_with_cards(nvml_simulator, tmp_path, monkeypatch):
    with open(scenario_path("h100_sxm_x8")) as f:
        h100 = json.load(f)["devices"][0]
    counts = {}
    for n in (0, 1, 8):
        scenario = tmp_path / ("n%d.json" % n)
        _write_scenario(scenario, [h100] * n)
        monkeypatch.setenv("NVMLSIM_CONFIG", str(scenario))
        nvml_simulator.reset_calls()
        facts = collect(ALL)
        counts[n] = nvml_simulator.calls()
        assert facts["cardNumber"] == n
    per_card = counts[1] - counts[0]
    assert per_card > 0
    assert counts[8] - counts[0] == 8 * per_card


def test_scenario_change_is_seen_by_a_running_process(nvml_simulator, tmp_path, monkeypatch):
    """The agent keeps NVML open; the simulator must serve changes without a new nvmlInit."""
    import pynvml

    with open(scenario_path("titan_xp")) as f:
        doc = json.load(f)
    scenario = tmp_path / "live.json"
    scenario.write_text(json.dumps(doc))
    monkeypatch.setenv("NVMLSIM_CONFIG", str(scenario))
    pynvml.nvmlInit()
    try:
        before = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).free
        doc["devices"][0]["memory"]["free"] -= 1024 * 1024 * 1024
        replacement = tmp_path / "live.json.new"
        replacement.write_text(json.dumps(doc))
        os.replace(replacement, scenario)
        after = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).free
    finally:
        pynvml.nvmlShutdown()
    assert before - after == 1024 * 1024 * 1024


def test_unreadable_scenario_makes_nvml_unavailable_not_a_crash(nvml_simulator, tmp_path, monkeypatch):
    broken = tmp_path / "broken.json"
    broken.write_text('{"devices": [ {"name": "x",, } ]}')
    monkeypatch.setenv("NVMLSIM_CONFIG", str(broken))
    facts = collect(ALL)
    assert facts["nvml_available"] is False
    assert facts["nvml_error"] == "NVML could not be initialised: Unknown Error"
    assert facts["cardList"] == []


# ------------------------------------------------------------ hostile and unlucky input

def _derived(tmp_path, monkeypatch, name, change):
    """A scenario derived from ``name`` by ``change(scenario)``, which may return raw bytes to write."""
    scenario = json.loads(scenario_path(name).read_text())
    written = change(scenario)
    path = tmp_path / ("%s-derived.json" % name)
    if isinstance(written, bytes):
        path.write_bytes(written)
    else:
        path.write_text(json.dumps(scenario))
    monkeypatch.setenv("NVMLSIM_CONFIG", str(path))


def test_non_utf8_names_and_uuids_are_made_safe_and_every_card_reported(nvml_simulator, tmp_path, monkeypatch):
    def change(scenario):
        scenario["devices"][2]["name"] = "NVIDIA H100 \u00a7BAD\u00a7"
        scenario["devices"][2]["uuid"] = "GPU-\u00a7BAD\u00a7"
        # the simulator copies the file's bytes as they are: put bytes that are not UTF-8 there
        return json.dumps(scenario, ensure_ascii=False).encode().replace("\u00a7".encode(), b"\xff")
    _derived(tmp_path, monkeypatch, "h100_sxm_x8", change)
    facts = collect(ALL)
    assert len(facts["cardList"]) == 8
    bad = facts["cardList"][2]
    assert bad["model"] == "NVIDIA H100 \ufffdBAD\ufffd" and bad["uuid"] == "GPU-\ufffdBAD\ufffd"
    json.dumps(facts).encode("utf-8")
    assert [card["model"] for i, card in enumerate(facts["cardList"]) if i != 2] == ["NVIDIA H100 80GB HBM3"] * 7
    assert all(card["health"] == "Healthy" for card in facts["cardList"])


HEALTH_QUERIES = ("nvmlDeviceGetEccMode", "nvmlDeviceGetRetiredPagesPendingStatus", "nvmlDeviceGetRemappedRows",
                  "nvmlDeviceGetFieldValues")


@pytest.mark.parametrize("function", HEALTH_QUERIES + ("nvmlDeviceGetTotalEccErrors",))
def test_health_that_could_not_be_checked_says_so(nvml_simulator, tmp_path, monkeypatch, function):
    def change(scenario):
        scenario["devices"][0].setdefault("errors", {})[function] = "NO_PERMISSION"
    # H100s remap rows and are not asked about retired pages; V100s retire pages.
    retires_pages = function == "nvmlDeviceGetRetiredPagesPendingStatus"
    _derived(tmp_path, monkeypatch, "lost_card" if retires_pages else "h100_sxm_x8", change)
    card = collect(ALL)["cardList"][0]
    assert len(card["healthUnchecked"]) == 1 and "no permission to read it" in card["healthUnchecked"][0]
    assert card["healthReasons"] == []
    assert "healthUnchecked" not in collect(ALL)["cardList"][1]


def test_cards_that_remap_rows_are_not_asked_about_retired_pages(nvml_simulator):
    nvml_simulator.use("h100_sxm_x8")
    nvml_simulator.reset_calls()
    collect([])
    assert nvml_simulator.calls_of("nvmlDeviceGetRemappedRows") == 8
    assert nvml_simulator.calls_of("nvmlDeviceGetRetiredPagesPendingStatus") == 0
    nvml_simulator.use("lost_card")
    nvml_simulator.reset_calls()
    assert collect([])["cardList"][0]["retiredPagesPending"] is False
    assert nvml_simulator.calls_of("nvmlDeviceGetRetiredPagesPendingStatus") == 3   # card 2 is lost


def test_mig_failures_are_one_reason_naming_the_devices(nvml_simulator, tmp_path, monkeypatch):
    def change(scenario):
        scenario["devices"][0].setdefault("errors", {})["nvmlDeviceGetMigDeviceHandleByIndex"] = "UNKNOWN"
    _derived(tmp_path, monkeypatch, "a100_mig", change)
    card = collect(ALL)["cardList"][0]
    mig_reasons = [reason for reason in card["healthReasons"] if "MIG" in reason]
    assert len(mig_reasons) == 1, card["healthReasons"]
    assert mig_reasons[0].startswith("MIG devices 0, 1, 2, 3, 4, 5, 6: reading the handle failed: ")


def test_more_free_memory_than_there_is_is_unhealthy(nvml_simulator, tmp_path, monkeypatch):
    def change(scenario):
        memory = scenario["devices"][0]["memory"]
        memory["free"] = memory["total"] + 2 ** 30
    _derived(tmp_path, monkeypatch, "titan_xp", change)
    card = collect(ALL)["cardList"][0]
    assert card["health"] == "Unhealthy"
    assert card["healthReasons"][0].startswith("the memory reading cannot be right: 13218 MiB free")
    assert card["usedMemory"] == 0


@pytest.mark.parametrize("parts, shown", [
    ({"free": 85269151744, "used": 0}, "81319 MiB free, 0 MiB used and 480 MiB reserved"),        # free + reserved
    ({"free": 0, "used": 85517493504}, "0 MiB free, 81555 MiB used and 480 MiB reserved"),        # used + reserved
    ({"free": 60000000000, "used": 26000000000, "reserved": 0}, "57220 MiB free, 24795 MiB used"),  # free + used
], ids=["free-and-reserved", "used-and-reserved", "free-and-used"])
def test_parts_of_memory_that_add_up_to_more_than_the_whole_are_unhealthy_and_never_negative(
        nvml_simulator, tmp_path, monkeypatch, parts, shown):
    """Each pair of the driver's three parts within the total, none over it alone: the sum gives it away."""
    def change(scenario):
        scenario["devices"][0]["memory"].update(parts)
    _derived(tmp_path, monkeypatch, "h100_real", change)
    card = collect(ALL)["cardList"][0]
    assert card["health"] == "Unhealthy" and card["usedMemory"] >= 0
    assert card["healthReasons"][0].startswith("the memory reading cannot be right: %s" % shown)


@pytest.mark.parametrize("scenario", ["titan_xp", "h100_sxm_x8", "a100_mig", "power_not_supported", "h100_real"])
def test_used_free_and_reserved_make_the_total(nvml_simulator, scenario):
    nvml_simulator.use(scenario)
    for card in collect(ALL)["cardList"]:
        assert card["usedMemory"] + card["freeMemory"] + card["reservedMemory"] == card["totalMemory"]


def test_used_memory_is_nvidia_smis_used_on_the_real_card(nvml_simulator):
    from xml.etree import ElementTree
    root = ElementTree.parse(expected.REAL_H100_DIR / "nvidia-smi-q.xml").getroot()
    usage = root.find("gpu/fb_memory_usage")
    nvml_simulator.use("h100_real")
    card = collect(ALL)["cardList"][0]
    assert "%d MiB" % card["usedMemory"] == usage.findtext("used")
    assert "%d MiB" % card["reservedMemory"] == usage.findtext("reserved")
