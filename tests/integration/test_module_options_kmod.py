"""The modprobe.d line the nvidia_driver role writes for nvidia_driver_module_params, read by its real reader:
kmod's ``modprobe -c`` (Debian's kmod package), which prints the configuration it parsed.

The role's filter (scv.gpu.nvidia_module_options) renders the line in a play; kmod must read back every option
of it. What the filter refuses is what kmod would misread: a name or value ending in a newline ends the line, so
kmod drops the option after it ("ignoring bad line"), which these tests show with kmod itself.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

EDGES = {"NVreg_A": -1, "NVreg_B": 2 ** 31 - 1, "NVreg_C": -2 ** 31, "NVreg_D": "0x7fffffff", "NVreg_E": True,
         "NVreg_RegistryDwords": "RMIntrLockingMode=1;RmGpuCount=4294967296"}


def modprobe():
    found = shutil.which("modprobe", path="/usr/sbin:/sbin:/usr/bin:/bin")
    assert found, "no modprobe: install Debian's kmod (tests/molecule/prepare-host does)"
    return found


def kmod_reads(folder, text):
    """(the `options nvidia` lines kmod parsed from ``text`` as a modprobe.d file, kmod's complaints)."""
    folder.mkdir(exist_ok=True)
    (folder / "scv-gpu-nvidia.conf").write_text(text)
    done = subprocess.run([modprobe(), "-C", str(folder), "-c"], capture_output=True, text=True, check=True)
    return [line for line in done.stdout.splitlines() if line.startswith("options nvidia ")], done.stderr


def rendered(ansible, tmp_path, params):
    """The filter's answer for ``params``, as the role's play gets it."""
    play = tmp_path / "render.yml"
    play.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": [
        {"ansible.builtin.copy": {"dest": str(tmp_path / "answer.json"),
                                  "content": "{{ params | scv.gpu.nvidia_module_options | to_json }}"}}]}]))
    done = ansible.playbook(play, None, "-e", json.dumps({"params": params}))
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads((tmp_path / "answer.json").read_text())


def test_kmod_reads_back_every_option_the_role_writes(ansible, tmp_path):
    answer = rendered(ansible, tmp_path, EDGES)
    assert answer["problems"] == []
    lines, complaints = kmod_reads(tmp_path / "conf", answer["content"])
    assert complaints == ""
    assert lines == ["options nvidia NVreg_A=-1 NVreg_B=2147483647 NVreg_C=-2147483648 NVreg_D=0x7fffffff "
                     "NVreg_E=1 NVreg_RegistryDwords=RMIntrLockingMode=1;RmGpuCount=4294967296"]


@pytest.mark.parametrize("params, lost", [
    ({"NVreg_A": "1\n", "NVreg_B": 2}, "NVreg_B=2"),
    ({"NVreg_A\n": 1, "NVreg_B": 2}, "NVreg_B=2"),
])
def test_what_kmod_would_misread_is_refused(ansible, tmp_path, params, lost):
    # kmod itself: the line ends at the newline, and the option after it is dropped
    naive = "options nvidia %s\n" % " ".join("%s=%s" % item for item in sorted(params.items()))
    lines, complaints = kmod_reads(tmp_path / "naive", naive)
    assert "ignoring bad line" in complaints and not any(lost in line for line in lines), (lines, complaints)
    answer = rendered(ansible, tmp_path, params)
    assert answer["content"] == "" and len(answer["problems"]) == 1, answer
    assert "NVreg_A" in answer["problems"][0]
