"""gpu_facts's main(), in-process, against the NVML simulator."""

from __future__ import annotations

import json
import pathlib

import pytest

from ansible_collections.scv.gpu.plugins.modules import gpu_facts

from harness import pci_sysfs
from harness import scenario_expectations as expected
from harness.in_process import run_module
from harness.paths import scenario_path
from harness.pci_sysfs import add_function as add_pci_function


TITAN_XP_PCI = [{"busId": "0000:01:00.0", "deviceId": "0x1b02", "class": "0x030000", "model": "TITAN Xp",
                 "driver": "nvidia", "vgpu": False}]


TITAN_XP_FACT = dict(expected.TITAN_XP, pci_gpus=TITAN_XP_PCI, pci_virtual_functions=[], pci_unreadable=[],
                     pci_nvswitches=[])


@pytest.fixture
def titan_sysfs(tmp_path):
    add_pci_function(tmp_path, "0000:01:00.0", 0x10DE, 0x1B02, 0x030000, "nvidia")
    add_pci_function(tmp_path, "0000:01:00.1", 0x10DE, 0x10EF, 0x040300, "snd_hda_intel")
    return str(tmp_path)


def test_returns_facts_and_never_changes(nvml_simulator, capsys, titan_sysfs):
    nvml_simulator.use("titan_xp")
    code, result = run_module(capsys, gpu_facts, {"sysfs": titan_sysfs})
    assert code == 0
    assert result["changed"] is False
    assert result["ansible_facts"]["nvidia_gpu"] == TITAN_XP_FACT


def test_check_mode_reports_the_same_facts(nvml_simulator, capsys, titan_sysfs):
    nvml_simulator.use("titan_xp")
    code, result = run_module(capsys, gpu_facts, {"_ansible_check_mode": True, "sysfs": titan_sysfs})
    assert code == 0 and result["changed"] is False
    assert result["ansible_facts"]["nvidia_gpu"] == TITAN_XP_FACT


def test_a_host_without_a_driver_still_lists_its_gpus(nvml_simulator, capsys, titan_sysfs):
    nvml_simulator.use("driver_not_loaded")
    code, result = run_module(capsys, gpu_facts, {"sysfs": titan_sysfs})
    fact = result["ansible_facts"]["nvidia_gpu"]
    assert code == 0 and fact["nvml_available"] is False and fact["cardList"] == []
    assert fact["pci_gpus"] == TITAN_XP_PCI


def test_virtual_functions_are_apart_and_an_unreadable_function_is_named_with_a_warning(
        nvml_simulator, capsys, tmp_path):
    nvml_simulator.use("titan_xp")
    add_pci_function(tmp_path, "0000:01:00.0", 0x10DE, 0x1B02, 0x030000, "nvidia")
    add_pci_function(tmp_path, "0000:01:00.4", 0x10DE, 0x1B02, 0x030000, "nvidia", physfn="0000:01:00.0")
    add_pci_function(tmp_path, "0000:02:00.0", 0x10DE, 0x1B02, 0x030000)
    (tmp_path / "devices" / "pci0000:00" / "0000:02:00.0" / "class").unlink()
    code, result = run_module(capsys, gpu_facts, {"sysfs": str(tmp_path)})
    fact = result["ansible_facts"]["nvidia_gpu"]
    assert code == 0 and fact["pci_gpus"] == TITAN_XP_PCI
    assert fact["pci_virtual_functions"] == [{"busId": "0000:01:00.4", "deviceId": "0x1b02", "physfn": "0000:01:00.0",
                                              "driver": "nvidia"}]
    assert [function["busId"] for function in fact["pci_unreadable"]] == ["0000:02:00.0"]
    # the warning: tests/integration/test_gpu_facts.py, through ansible itself


def test_an_hgx_board_lists_its_nvswitches_and_each_gpus_fabric(nvml_simulator, capsys, tmp_path):
    nvml_simulator.use("h100_sxm_x8")
    pci_sysfs.build(json.loads(scenario_path("h100_sxm_x8").read_text()), str(tmp_path))
    code, result = run_module(capsys, gpu_facts, {"sysfs": str(tmp_path), "gather_subset": ["fabric"]})
    fact = result["ansible_facts"]["nvidia_gpu"]
    assert code == 0 and len(fact["pci_gpus"]) == 8
    assert fact["pci_nvswitches"] == [{"busId": "0000:%02x:00.0" % bus, "deviceId": "0x22a3", "generation": "LS10",
                                       "driver": "nvidia-nvswitch"} for bus in (5, 6, 7, 8)]
    assert {card["fabric"]["state"] for card in fact["cardList"]} == {"completed"}


def test_unknown_gather_subset_fails_before_touching_nvml(nvml_simulator, capsys):
    nvml_simulator.use("titan_xp")
    nvml_simulator.reset_calls()
    code, result = run_module(capsys, gpu_facts, {"gather_subset": ["all", "ecc"]})
    assert code == 1 and result["failed"] is True
    assert "gather_subset: unknown value(s) ecc" in result["msg"]
    assert nvml_simulator.calls() == 0


def test_missing_python_library_fails_with_missing_required_lib(nvml_simulator, capsys, monkeypatch):
    monkeypatch.setattr(gpu_facts, "HAS_PYNVML", False)
    monkeypatch.setattr(gpu_facts, "PYNVML_IMPORT_ERROR", "ImportError: No module named 'pynvml'")
    code, result = run_module(capsys, gpu_facts, {})
    assert code == 1 and result["failed"] is True
    assert "Failed to import the required Python library (nvidia-ml-py)" in result["msg"]
    assert "ansible_facts" not in result


def test_a_failed_version_query_is_named_not_silently_left_out(nvml_simulator, capsys, tmp_path, titan_sysfs):
    scenario = json.loads((pathlib.Path(__file__).resolve().parents[3] / "nvml_simulator" / "scenarios" /
                           "titan_xp.json").read_text())
    scenario["errors"] = {"nvmlSystemGetDriverVersion": "UNKNOWN", "nvmlSystemGetCudaDriverVersion": "UNKNOWN"}
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(scenario))
    nvml_simulator.use(path)
    code, result = run_module(capsys, gpu_facts, {"sysfs": titan_sysfs})
    fact = result["ansible_facts"]["nvidia_gpu"]
    assert code == 0 and "driver_version" not in fact and "cuda_driver_version" not in fact
    assert fact["system_errors"] == {"driver_version": "Unknown Error", "cuda_driver_version": "Unknown Error"}
    assert fact["nvml_version"] and len(fact["cardList"]) == 1
