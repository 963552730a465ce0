"""The NVML simulator against the real H100 (tests/fixtures/real-h100 readings): its cost model, a scenario's own
costs, and the h100_real scenario's values, through the real pynvml and gpu_facts' reader."""

from __future__ import annotations

import json
from xml.etree import ElementTree

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.common.gpu_info import GATHER_SUBSETS
from ansible_collections.scv.gpu.plugins.module_utils.nvml.collect import collect

from harness import scenario_expectations as expected
from harness.paths import scenario_path

ALL = list(GATHER_SUBSETS)


def test_the_cost_model_matches_the_real_h100(nvml_simulator):
    """One collection with init and shutdown: 26.87 ms on the real card; the model must agree."""
    nvml_simulator.use("h100_real")
    nvml_simulator.latency("real")
    nvml_simulator.reset_calls()
    collect(["telemetry", "mig", "processes"])     # gather_subset all when the card was measured
    assert 26.0 < nvml_simulator.spent_ms() < 28.0, nvml_simulator.spent_ms()
    # the counters subset reads the energy and PCIe replay fields: 4.49 ms in one call on the card
    nvml_simulator.reset_calls()
    collect(ALL)
    assert 26.0 + 4.4 < nvml_simulator.spent_ms() < 28.0 + 4.6, nvml_simulator.spent_ms()
    nvml_simulator.latency("none")
    nvml_simulator.reset_calls()
    collect(ALL)
    assert nvml_simulator.spent_ms() == 0


def test_a_scenario_sets_its_own_costs(tmp_path, nvml_simulator):
    data = json.loads(scenario_path("titan_xp").read_text())
    data["latency"] = {"model": "none", "attach": 0, "calls": {"nvmlDeviceGetMemoryInfo_v2": 700}}
    path = tmp_path / "costly.json"
    path.write_text(json.dumps(data))
    nvml_simulator.use(path)
    nvml_simulator.reset_calls()
    collect([])
    assert nvml_simulator.spent_ms() == pytest.approx(0.7)


def test_h100_real_scenario_holds_the_cards_values():
    """Each value of h100_real.json against nvidia-smi -q -x on the real card."""
    root = ElementTree.parse(expected.REAL_H100_DIR / "nvidia-smi-q.xml").getroot()
    gpu = root.find("gpu")
    scenario = json.loads(scenario_path("h100_real").read_text())
    card = scenario["devices"][0]
    mib = 2 ** 20

    def number(path):
        return int(gpu.findtext(path).split()[0].rstrip("x").split(".")[0])

    assert scenario["driverVersion"] == root.findtext("driver_version")
    assert "%d.%d" % divmod(scenario["cudaDriverVersion"] // 10, 100) == root.findtext("cuda_version")
    assert (card["name"], card["uuid"], card["pciBusId"]) == (
        gpu.findtext("product_name"), gpu.findtext("uuid"), gpu.findtext("pci/pci_bus_id"))
    assert card["pciDeviceId"] == int(gpu.findtext("pci/pci_device_id"), 16)
    assert card["memory"]["total"] == number("fb_memory_usage/total") * mib
    assert card["memory"]["free"] == number("fb_memory_usage/free") * mib
    assert card["memory"]["reserved"] == number("fb_memory_usage/reserved") * mib
    assert card["memory"]["used"] == number("fb_memory_usage/used") * mib
    assert card["maxClocks"] == {"graphics": number("max_clocks/graphics_clock"), "sm": number("max_clocks/sm_clock"),
                                 "memory": number("max_clocks/mem_clock"), "video": number("max_clocks/video_clock")}
    assert card["powerLimit"] == number("gpu_power_readings/current_power_limit") * 1000
    assert card["powerUsage"] == round(float(gpu.findtext("gpu_power_readings/instant_power_draw").split()[0]) * 1000)
    assert card["maxPcieGeneration"] == number("pci/pci_gpu_link_info/pcie_gen/max_link_gen")
    assert card["maxPcieWidth"] == number("pci/pci_gpu_link_info/link_widths/max_link_width")
    assert card["temperature"] == number("temperature/gpu_temp")
    assert card["utilization"] == {"gpu": number("utilization/gpu_util"), "memory": number("utilization/memory_util")}
    assert card["persistenceMode"] == (gpu.findtext("persistence_mode") == "Enabled")
    assert card["ecc"]["enabled"] == (gpu.findtext("ecc_mode/current_ecc") == "Enabled")
    assert [card["ecc"][key] for key in ("correctedVolatile", "uncorrectedVolatile")] == [
        number("ecc_errors/volatile/dram_correctable"), number("ecc_errors/volatile/dram_uncorrectable")]
    assert "retiredPagesPending" not in card and gpu.findtext("retired_pages/pending_retirement") == "N/A"
    assert card["remappedRows"] == {
        "correctable": number("remapped_rows/remapped_row_corr"), "uncorrectable": number("remapped_rows/remapped_row_unc"),
        "pending": int(gpu.findtext("remapped_rows/remapped_row_pending") == "Yes"),
        "failed": int(gpu.findtext("remapped_rows/remapped_row_failure") == "Yes")}
    assert card["recoveryAction"] == 0 and gpu.findtext("gpu_recovery_action") == "None"
    assert card["clocksEventReasons"] == 1 and gpu.findtext("clocks_event_reasons/clocks_event_reason_gpu_idle") == "Active"
    assert card["migMode"] == {"current": int(gpu.findtext("mig_mode/current_mig") == "Enabled"),
                               "pending": int(gpu.findtext("mig_mode/pending_mig") == "Enabled")}
    assert card["processes"] == [] and not list(gpu.find("processes"))
