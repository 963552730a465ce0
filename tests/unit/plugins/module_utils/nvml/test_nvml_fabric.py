"""A GPU's NVLinks and NVLink fabric through the real pynvml on the simulator: the facts, the health rule
and when a long-lived session asks them again."""

from __future__ import annotations

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.nvml import fabric as fabric_module
from ansible_collections.scv.gpu.plugins.module_utils.nvml.api import pynvml
from ansible_collections.scv.gpu.plugins.module_utils.nvml.collect import collect
from ansible_collections.scv.gpu.plugins.module_utils.nvml.fabric import (
    FABRIC_IN_PROGRESS,
    FABRIC_NOT_STARTED,
    FABRIC_UNHEALTHY,
)

from harness.common import replace_json as write

TRAINED = {"state": "completed", "status": "Success", "cliqueId": 0,
           "clusterUuid": "00000000-0000-0000-0000-000000000000", "healthSummary": "healthy"}
HGX_H100_LINKS = {"links": 18, "activeLinks": 18, "switchLinks": 18, "speedMBps": 26562, "version": "4.0"}


def test_an_hgx_h100_board_has_its_links_to_the_nvswitches_and_a_trained_fabric(nvml_simulator):
    nvml_simulator.use("h100_sxm_x8")
    cards = collect(["fabric"])["cardList"]
    assert [card["fabric"] for card in cards] == [TRAINED] * 8
    assert [card["nvlink"] for card in cards] == [HGX_H100_LINKS] * 8
    assert all(card["health"] == "Healthy" for card in cards)


@pytest.mark.parametrize("scenario, state, reason", [
    ("h100_sxm_x8_fabric_not_started", "not started", FABRIC_NOT_STARTED),
    ("h100_sxm_x8_fabric_in_progress", "in progress", FABRIC_IN_PROGRESS),
])
def test_a_gpu_whose_fabric_is_not_completed_is_unhealthy(nvml_simulator, scenario, state, reason):
    nvml_simulator.use(scenario)
    for card in collect(["fabric"])["cardList"]:
        assert card["fabric"]["state"] == state
        assert "status" not in card["fabric"]      # NVML's status means something only once completed
        assert (card["health"], card["healthReasons"]) == ("Unhealthy", [reason])
        assert card["nvlink"]["activeLinks"] == 18   # the links are up: it is the fabric that is not


def test_a_completed_fabric_with_a_failure_or_an_unhealthy_summary_is_unhealthy(scenario_file, nvml_simulator):
    path, data = scenario_file("h100_sxm_x8")
    data["devices"][1]["fabric"]["status"] = "UNKNOWN"
    data["devices"][2]["fabric"]["healthSummary"] = 2
    data["devices"][3]["fabric"]["healthSummary"] = 3           # limited capacity: degraded, still usable
    data["devices"][4]["nvlink"]["down"] = [0, 7]
    write(path, data)
    cards = collect(["fabric"])["cardList"]
    assert cards[1]["fabric"]["status"] == "Unknown Error"
    assert cards[1]["healthReasons"] == [fabric_module.FABRIC_FAILED % "Unknown Error"]
    assert cards[2]["healthReasons"] == [FABRIC_UNHEALTHY]
    assert cards[3]["fabric"]["healthSummary"] == "limited capacity"
    assert cards[3]["health"] == "Healthy"
    assert cards[4]["nvlink"] == dict(HGX_H100_LINKS, activeLinks=16, switchLinks=16)


def test_a_pcie_card_has_no_fabric_and_is_not_asked_again_in_a_session(nvml_simulator, session):
    nvml_simulator.use("titan_xp")
    card = collect(["fabric"])["cardList"][0]
    assert "fabric" not in card and "nvlink" not in card and card["health"] == "Healthy"
    session.read(["fabric"])
    session.clock_control.now += session.slow.interval_s   # the fabric is due again
    nvml_simulator.reset_calls()
    session.read(["fabric"])
    assert nvml_simulator.calls_of("nvmlDeviceGetGpuFabricInfoV") == 0   # NOT_SUPPORTED is remembered


def test_a_rack_gpu_has_a_clique_and_its_links_go_to_switch_trays(nvml_simulator):
    nvml_simulator.use("gb200_nvl_x4")
    cards = collect(["fabric"])["cardList"]
    assert {(card["fabric"]["clusterUuid"], card["fabric"]["cliqueId"]) for card in cards} == {
        ("7b968a6d-c8aa-45e1-9e07-e1e51be99c31", 32766)}
    assert cards[0]["nvlink"] == {"links": 18, "activeLinks": 18, "switchLinks": 18, "speedMBps": 53125,
                                  "version": "5.0"}
    assert cards[0]["family"] == "blackwell"


def test_a_session_asks_the_fabric_every_interval_and_after_an_xid_not_at_every_read(
        scenario_file, session, nvml_simulator):
    path, data = scenario_file("h100_sxm_x8")
    session.read(["fabric"])
    data["devices"][5]["fabric"]["state"] = 1       # Fabric Manager stopped
    write(path, data)
    nvml_simulator.reset_calls()
    card = session.read(["fabric"])["cardList"][5]
    assert nvml_simulator.calls_of("nvmlDeviceGetGpuFabricInfoV") == 0
    assert nvml_simulator.calls_of("nvmlDeviceGetNvLinkState") == 0
    assert card["fabric"] == TRAINED and card["health"] == "Healthy"     # as last read

    session.clock_control.now += session.slow.interval_s   # the fabric is due again
    card = session.read(["fabric"])["cardList"][5]
    assert nvml_simulator.calls_of("nvmlDeviceGetGpuFabricInfoV") == 8
    assert (card["health"], card["healthReasons"]) == ("Unhealthy", [FABRIC_NOT_STARTED])
    nvml_simulator.reset_calls()
    card = session.read(["fabric"])["cardList"][5]
    assert nvml_simulator.calls_of("nvmlDeviceGetGpuFabricInfoV") == 0
    assert card["healthReasons"] == [FABRIC_NOT_STARTED]                  # the kept reading keeps its reason

    data["devices"][5]["fabric"]["state"] = 3
    data["devices"][5]["xids"] = [{"xid": 145, "afterMs": 0}]            # an NVLink XID
    write(path, data)
    assert session.wait_event(1000) == (5, 145)
    nvml_simulator.reset_calls()
    card = session.read(["fabric"])["cardList"][5]
    assert nvml_simulator.calls_of("nvmlDeviceGetGpuFabricInfoV") == 8
    assert card["fabric"] == TRAINED and card["health"] == "Healthy"


def test_without_the_versioned_call_the_first_form_is_read(nvml_simulator, monkeypatch):
    """pynvml before the versioned structure (nvidia-ml-py 12.535, which the collection accepts)."""
    monkeypatch.delattr(pynvml, "c_nvmlGpuFabricInfo_v3_t")
    nvml_simulator.use("h100_sxm_x8_fabric_in_progress")
    nvml_simulator.reset_calls()
    card = collect(["fabric"])["cardList"][0]
    assert nvml_simulator.calls_of("nvmlDeviceGetGpuFabricInfo") == 8
    assert card["fabric"] == {"state": "in progress", "cliqueId": 0,
                              "clusterUuid": "00000000-0000-0000-0000-000000000000"}
    assert card["healthReasons"] == [FABRIC_IN_PROGRESS]
