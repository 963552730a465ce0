"""scv.gpu.gpu_facts and playbooks/gpu_facts.yml through ansible, on every ansible-core line."""

from __future__ import annotations

import ctypes.util
import re
import subprocess

import pytest

from harness import scenario_expectations as expected
from ansible_collections.scv.gpu.plugins.module_utils.host.pci import nvidia_functions, nvswitches


def without_pci(fact):
    """The fact less its PCI lists, which must list this host's own bus (empty here, the H100 on a GPU machine)."""
    fact = dict(fact)
    host = nvidia_functions("/sys")
    assert fact.pop("pci_gpus") == host["gpus"]
    assert fact.pop("pci_virtual_functions") == host["virtual_functions"]
    assert fact.pop("pci_unreadable") == host["unreadable"]
    assert fact.pop("pci_nvswitches") == nvswitches("/sys")
    return fact


@pytest.mark.parametrize("scenario", sorted(expected.BY_SCENARIO))
def test_scenario(ansible, scenario):
    ok, result = ansible.module(scenario=scenario)
    assert ok, result
    assert result["changed"] is False
    assert without_pci(result["ansible_facts"]["nvidia_gpu"]) == expected.BY_SCENARIO[scenario]


def test_health_reasons(ansible):
    ok, result = ansible.module(scenario="health_reasons")
    assert ok, result
    cards = result["ansible_facts"]["nvidia_gpu"]["cardList"]
    assert [card["healthReasons"] for card in cards] == expected.HEALTH_REASONS


@pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None,
                    reason="this machine has a real libnvidia-ml, so its absence cannot be shown here")
def test_no_nvml_library_is_zero_gpus_with_the_reason(ansible):
    ok, result = ansible.module(simulator=False)
    assert ok, result
    assert result["changed"] is False
    facts = result["ansible_facts"]["nvidia_gpu"]
    assert without_pci(facts) == expected.NO_LIBRARY
    assert "Traceback" not in str(result)


@pytest.fixture(scope="session")
def bare_python(ansible, tmp_path_factory):
    """A Python without nvidia-ml-py: a new, empty virtual environment."""
    venv = tmp_path_factory.mktemp("bare-%s" % ansible.version) / "venv"
    base = subprocess.run([str(ansible.python), "-c", "import sys; print(sys._base_executable)"],
                          capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    assert subprocess.run([str(python), "-c", "import pynvml"], capture_output=True, check=False).returncode != 0
    return python


@pytest.mark.every_ansible_line
def test_without_nvidia_ml_py_fails_with_missing_required_lib(ansible, bare_python):
    ok, result = ansible.module(scenario="titan_xp", interpreter=bare_python)
    assert not ok
    assert "Failed to import the required Python library (nvidia-ml-py)" in result["msg"]
    assert "ansible_facts" not in result


@pytest.mark.every_ansible_line
def test_check_mode_returns_the_same_facts(ansible):
    ok, result = ansible.module(scenario="titan_xp", check=True)
    assert ok, result
    assert result["changed"] is False
    assert without_pci(result["ansible_facts"]["nvidia_gpu"]) == expected.TITAN_XP


@pytest.mark.every_ansible_line
def test_gather_subset_min(ansible):
    ok, result = ansible.module({"gather_subset": ["min"]}, scenario="a100_mig")
    assert ok, result
    card = result["ansible_facts"]["nvidia_gpu"]["cardList"][0]
    assert "migDevices" not in card and "temperature" not in card and "processCount" not in card
    assert card["bandwidth"] == 31504 and card["health"] == "Healthy"


@pytest.mark.every_ansible_line
def test_bad_gather_subset_is_rejected(ansible):
    ok, result = ansible.module({"gather_subset": ["everything"]}, scenario="titan_xp")
    assert not ok
    assert result["msg"].startswith("gather_subset: unknown value(s) everything;")


@pytest.mark.every_ansible_line
def test_bad_option_type_is_rejected(ansible):
    ok, result = ansible.module({"gather_subset": "all", "no_such_option": 1}, scenario="titan_xp")
    assert not ok
    assert "no_such_option" in result["msg"]


def _table(output):
    return re.findall(r'^\s+"(.*)",?$', output, re.MULTILINE)


@pytest.mark.every_ansible_line
def test_playbook_prints_the_table(ansible):
    done = ansible.playbook("playbooks/gpu_facts.yml", "titan_xp")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = _table(done.stdout)
    assert lines[0] == "driver 535.183.01, CUDA 12.2: 1 GPU(s), 11950 of 12194 MiB free"
    assert lines[1].split() == ["ID", "MODEL", "FREE/TOTAL", "MiB", "MEM", "MHz", "SM", "MHz", "W",
                                "PCIe", "MB/s", "HEALTH"]
    assert lines[2].split() == ["0", "TITAN", "Xp", "11950/12194", "5705", "1911", "250", "15760", "Healthy"]
    assert len(lines) == 3
    assert re.search(r"localhost\s+: ok=2\s+changed=0\s+unreachable=0\s+failed=0", done.stdout)


def test_playbook_shows_unhealthy_reasons(ansible):
    done = ansible.playbook("playbooks/gpu_facts.yml", "lost_card")
    assert done.returncode == 0, done.stdout + done.stderr
    rows = _table(done.stdout)[2:]
    assert rows[2].split()[:3] == ["2", "-", "-/-"]
    assert rows[2].endswith("Unhealthy: " + expected.LOST)
    assert [row.split()[-1] for row in (rows[0], rows[1], rows[3])] == ["Healthy"] * 3


def test_playbook_without_driver_says_why(ansible):
    done = ansible.playbook("playbooks/gpu_facts.yml", "driver_not_loaded")
    assert done.returncode == 0, done.stdout + done.stderr
    assert _table(done.stdout) == ["No GPUs readable: " + expected.DRIVER_NOT_LOADED["nvml_error"]]


def test_an_unreadable_pci_function_is_listed_with_a_warning(ansible, tmp_path):
    from harness.pci_sysfs import add_function

    add_function(tmp_path, "0000:01:00.0", 0x10DE, 0x1B02, 0x030000, "nvidia")
    add_function(tmp_path, "0000:01:00.4", 0x10DE, 0x1B02, 0x030000, "nvidia", physfn="0000:01:00.0")
    add_function(tmp_path, "0000:02:00.0", 0x10DE, 0x1B02, 0x030000)
    (tmp_path / "devices" / "pci0000:00" / "0000:02:00.0" / "class").unlink()
    ok, result = ansible.module({"sysfs": str(tmp_path)}, scenario="titan_xp")
    fact = result["ansible_facts"]["nvidia_gpu"]
    assert ok and [gpu["busId"] for gpu in fact["pci_gpus"]] == ["0000:01:00.0"]
    assert [function["busId"] for function in fact["pci_virtual_functions"]] == ["0000:01:00.4"]
    assert "PCI function 0000:02:00.0 of NVIDIA: cannot read %s/bus/pci/devices/0000:02:00.0/class, so whether it " \
           "is a GPU is not known" % tmp_path in ansible.last_output


def test_a_failed_driver_version_query_is_a_warning(ansible, tmp_path):
    import json

    from harness.paths import scenario_path

    scenario = json.loads(scenario_path("titan_xp").read_text())
    scenario["errors"] = {"nvmlSystemGetDriverVersion": "UNKNOWN"}
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(scenario))
    ok, result = ansible.module(scenario=path)
    assert ok and result["ansible_facts"]["nvidia_gpu"]["system_errors"] == {"driver_version": "Unknown Error"}
    assert "driver_version could not be read, so it is left out of the facts: NVML answered Unknown Error" in \
        " ".join(ansible.last_output.split())
