"""The apt pins the nvidia_driver role writes, read by their real reader: ``apt-cache policy`` of this Debian host,
pointed at a preferences folder of the test's own.

A package version that ends in a newline splits the pin's ``Pin: version`` line; apt then refuses every pin file
("No priority (or zero) specified for pin") and fails on the host for every package. The role's plan refuses such
a version before it writes anything; one as apt lists it is read back as the pin's version.
"""

from __future__ import annotations

import json
import subprocess

HGX_NVSWITCH = {"address": "0000:05:00.0", "vendorId": "0x10de", "deviceId": "0x22a3", "class": "0x068000"}


def policy(folder, pin):
    """apt-cache policy of Fabric Manager's package under a preferences folder holding ``pin`` alone."""
    folder.mkdir(exist_ok=True)
    (folder / "scv-gpu-nvidia-fabricmanager.pref").write_text(pin)
    return subprocess.run(["apt-cache", "-o", "Dir::Etc::preferencesparts=%s" % folder, "-o",
                           "Dir::Etc::preferences=%s" % (folder / "none"), "policy", "nvidia-fabricmanager-535"],
                          capture_output=True, text=True, check=False)


def pin_text(version):
    """The pin as the role's task (tasks/fabric-manager-apt.yml) writes it."""
    return ("# Managed by the scv.gpu.nvidia_driver role: Fabric Manager at nvidia_driver_version's driver.\n"
            "Package: nvidia-fabricmanager-535\nPin: version %s\nPin-Priority: 1001\n" % version)


def planned(ansible, tmp_path, fabric_manager_version):
    """The role's Fabric Manager plan (the filter plan.yml calls) for an HGX host pinned at 535.247.01-1:
    (ok, the pin it would write or the refusal)."""
    play = tmp_path / "plan.yml"
    play.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": [
        {"ansible.builtin.copy": {"dest": str(tmp_path / "answer.json"), "content": (
            "{{ {'distribution': 'Debian', 'os_family': 'Debian'} | scv.gpu.nvidia_driver_fabric_manager("
            "state, 'auto', '535.247.01-1', fm, []) | to_json }}")}}]}]))
    state = {"pci_nvswitches": [HGX_NVSWITCH], "pci_gpus": []}
    done = ansible.playbook(play, None, "-e", json.dumps({"state": state, "fm": fabric_manager_version}))
    if done.returncode != 0:
        return False, done.stdout
    return True, json.loads((tmp_path / "answer.json").read_text())


def test_a_pin_at_a_version_as_apt_lists_it_is_read_as_that_version(ansible, tmp_path):
    ok, answer = planned(ansible, tmp_path, "535.247.01-1")
    assert ok and answer["wanted"], answer
    done = policy(tmp_path / "pref", pin_text("535.247.01-1"))
    assert done.returncode == 0 and "E:" not in done.stderr, done.stderr


def test_a_version_that_would_split_the_pin_is_refused_before_it_is_written(ansible, tmp_path):
    # apt itself: the split pin fails apt-cache on the host
    done = policy(tmp_path / "pref", pin_text("535.247.01-1\n"))
    assert "No priority (or zero) specified for pin" in done.stderr, done.stderr
    ok, said = planned(ansible, tmp_path, "535.247.01-1\n")
    assert not ok and "nvidia_driver_fabric_manager_version" in said and "is not a package version" in said, said
    # a line of its own that apt would take quietly (another priority) is refused the same way
    ok, said = planned(ansible, tmp_path, "535.247.01-1\nPin-Priority: 1")
    assert not ok and "is not a package version" in said, said
