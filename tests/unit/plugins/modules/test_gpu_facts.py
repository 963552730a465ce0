"""gpu_facts's main(), in-process, against the NVML simulator."""

from __future__ import annotations

import json

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.scv.gpu.plugins.modules import gpu_facts

import scenario_expectations as expected


def run_module(capsys, args):
    with patch_module_args(args), pytest.raises(SystemExit) as exit_info:
        gpu_facts.main()
    result = json.loads(capsys.readouterr().out)
    return exit_info.value.code, result


def test_returns_facts_and_never_changes(nvml_simulator, capsys):
    nvml_simulator.use("titan_xp")
    code, result = run_module(capsys, {})
    assert code == 0
    assert result["changed"] is False
    assert result["ansible_facts"]["nvidia_gpu"] == expected.TITAN_XP


def test_check_mode_reports_the_same_facts(nvml_simulator, capsys):
    nvml_simulator.use("titan_xp")
    code, result = run_module(capsys, {"_ansible_check_mode": True})
    assert code == 0 and result["changed"] is False
    assert result["ansible_facts"]["nvidia_gpu"] == expected.TITAN_XP


def test_unknown_gather_subset_fails_before_touching_nvml(nvml_simulator, capsys):
    nvml_simulator.use("titan_xp")
    nvml_simulator.reset_calls()
    code, result = run_module(capsys, {"gather_subset": ["all", "ecc"]})
    assert code == 1 and result["failed"] is True
    assert "gather_subset: unknown value(s) ecc" in result["msg"]
    assert nvml_simulator.calls() == 0


def test_missing_python_library_fails_with_missing_required_lib(nvml_simulator, capsys, monkeypatch):
    monkeypatch.setattr(gpu_facts, "HAS_PYNVML", False)
    monkeypatch.setattr(gpu_facts, "PYNVML_IMPORT_ERROR", "ImportError: No module named 'pynvml'")
    code, result = run_module(capsys, {})
    assert code == 1 and result["failed"] is True
    assert "Failed to import the required Python library (nvidia-ml-py)" in result["msg"]
    assert "ansible_facts" not in result
