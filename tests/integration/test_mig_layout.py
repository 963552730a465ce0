"""scv.gpu.mig_layout on the NVML simulator, which keeps MIG instances in its scenario file as a
driver keeps them in the GPU: each test works on its own copy of a scenario."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import yaml

from harness.mig_placement import placed_in
from harness.nvidia_toolkit import DriverRoot, host_bin
from harness.paths import ROOT, scenario_path

ALL_1G = [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}]


def copy(tmp_path, name, change=None):
    path = tmp_path / ("%s.json" % name)
    shutil.copy(scenario_path(name), path)
    if change:
        document = json.loads(path.read_text())
        change(document)
        path.write_text(json.dumps(document))
    return path


def layout_of(path):
    """{GPU index: {profile: count}} of the MIG devices in a scenario file, as the driver keeps them."""
    found = {}
    for index, gpu in enumerate(json.loads(path.read_text())["devices"]):
        profiles = {}
        for entry in gpu.get("migDevices") or []:
            if "computeInstanceId" in entry:
                profile = entry["name"].rpartition(" MIG ")[2]
                profiles[profile] = profiles.get(profile, 0) + 1
        found[index] = profiles
    return found


@pytest.mark.every_ansible_line
def test_applies_reruns_unchanged_and_the_facts_follow(ansible, tmp_path):
    path = copy(tmp_path, "h100_mig_empty")
    ok, result = ansible.module({"layout": ALL_1G}, scenario=path, name="scv.gpu.mig_layout")
    assert ok and result["changed"] is True and result["reboot_required"] is False, result
    assert layout_of(path) == {0: {"1g.10gb": 7}, 1: {"1g.10gb": 7}}
    assert [gpu["after"] for gpu in result["gpus"]] == [{"mig-enabled": True, "mig-devices": {"1g.10gb": 7}}] * 2

    ok, again = ansible.module({"layout": ALL_1G}, scenario=path, name="scv.gpu.mig_layout")
    assert ok and again["changed"] is False, again

    ok, facts = ansible.module(scenario=path)
    devices = facts["ansible_facts"]["nvidia_gpu"]["cardList"][0]["migDevices"]
    assert [device["profile"] for device in devices] == ["1g.10gb"] * 7
    assert len({device["uuid"] for device in devices}) == 7


@pytest.mark.every_ansible_line
def test_check_mode_and_diff_show_the_change_and_write_nothing(ansible, tmp_path):
    path = copy(tmp_path, "h100_mig_mixed")
    before = path.read_text()
    ok, result = ansible.module({"layout": ALL_1G}, scenario=path, name="scv.gpu.mig_layout", check=True, diff=True)
    assert ok and result["changed"] is True, result
    assert path.read_text() == before
    gpu0 = result["gpus"][0]
    assert gpu0["before"] == {"mig-enabled": True, "mig-devices": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}}
    assert gpu0["after"] == {"mig-enabled": True, "mig-devices": {"1g.10gb": 7}}
    assert '-            "2g.20gb": 1,' in ansible.last_output and '+            "1g.10gb": 7' in ansible.last_output


def test_a_layout_per_gpu_and_a_mixed_one(ansible, tmp_path):
    path = copy(tmp_path, "h100_mig_mixed")
    layout = [{"devices": [0], "mig_enabled": True, "mig_devices": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}},
              {"devices": [1], "mig-enabled": True, "mig-devices": {"4g.40gb": 1, "3g.40gb": 1}}]
    ok, result = ansible.module({"layout": layout}, scenario=path, name="scv.gpu.mig_layout")
    assert ok, result
    assert [gpu["changed"] for gpu in result["gpus"]] == [False, True]     # GPU 0 already has that layout
    assert layout_of(path) == {0: {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}, 1: {"4g.40gb": 1, "3g.40gb": 1}}


def test_mig_mode_is_enabled_first_and_disabled_again(ansible, tmp_path):
    path = copy(tmp_path, "h100_sxm_x8")            # GPUs 1 and 2 run processes; 3 is idle
    layout = [{"devices": [3], "mig-enabled": True, "mig-devices": {"3g.40gb": 2}}]
    ok, result = ansible.module({"layout": layout}, scenario=path, name="scv.gpu.mig_layout")
    assert ok and result["changed"] and not result["reboot_required"], result
    gpu = json.loads(path.read_text())["devices"][3]
    assert gpu["migMode"] == {"current": 1, "pending": 1}
    assert layout_of(path)[3] == {"3g.40gb": 2}
    ok, result = ansible.module({"layout": [{"devices": [3], "mig-enabled": False}]}, scenario=path,
                                name="scv.gpu.mig_layout")
    assert ok and result["changed"], result
    gpu = json.loads(path.read_text())["devices"][3]
    assert gpu["migMode"] == {"current": 0, "pending": 0} and not gpu.get("migDevices")


def test_a_busy_gpu_is_refused_naming_the_pids_and_nothing_changes(ansible, tmp_path):
    def busy(document):
        document["devices"][1]["migDevices"][0]["processes"] = [{"pid": 4242, "usedGpuMemory": 1 << 30}]
    path = copy(tmp_path, "h100_mig_mixed", busy)
    before = path.read_text()
    ok, result = ansible.module({"layout": ALL_1G}, scenario=path, name="scv.gpu.mig_layout")
    assert not ok
    assert "processes use GPU 1 (NVIDIA H100 80GB HBM3): PIDs 4242" in result["msg"], result
    assert "nothing was changed" in result["msg"]
    assert path.read_text() == before            # GPU 0, which is idle, was not changed either


def test_a_mode_change_the_driver_cannot_apply_says_reboot(ansible, tmp_path):
    def needs_reset(document):
        document["devices"][0]["migResetRequired"] = 1
    path = copy(tmp_path, "h100_sxm_x8", needs_reset)
    layout = [{"devices": [0], "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}]
    ok, result = ansible.module({"layout": layout}, scenario=path, name="scv.gpu.mig_layout")
    assert ok and result["changed"] and result["reboot_required"] is True, result
    assert result["gpus"][0]["pending"] is True
    assert "MIG mode of GPU 0 waits for a reset" in ansible.last_output
    gpu = json.loads(path.read_text())["devices"][0]
    assert gpu["migMode"] == {"current": 0, "pending": 1} and not gpu.get("migDevices")


@pytest.mark.parametrize("layout, says", [
    ([{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.5gb": 7}}],
     "GPU 0 (NVIDIA H100 80GB HBM3): 1g.5gb: not a MIG profile of this GPU; it has 1g.10gb, 1g.10gb+me, 1g.20gb"),
    ([{"devices": "all", "mig-enabled": True, "mig-devices": {"4g.40gb": 2}}],
     "GPU 0 (NVIDIA H100 80GB HBM3): 2 x 4g.40gb do not fit on one GPU"),
    ([{"devices": "all", "mig-enabled": True, "mig-devices": {"3g.40gb": 2, "1g.10gb": 2}}],
     "do not fit on one GPU"),
    ([{"devices": [0, 5], "mig-enabled": True}], "layout[0].devices: no GPU 5 on this host (it has 2)"),
    ([{"devices": "all", "mig-enabled": True}, {"devices": [1], "mig-enabled": False}],
     "GPU 1 is named by layout[0] and layout[1]: name each GPU once"),
    ([{"devices": "all", "mig-enabled": "yes"}], "layout[0].mig-enabled: true or false is needed, got 'yes'"),
    ([{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": -1}}],
     "layout[0].mig-devices.1g.10gb: the count must be a whole number, got -1"),
    ([{"devices": "all", "mig-enabled": True, "gpus": [0]}], "layout[0]: unknown key(s) gpus"),
])
def test_a_bad_layout_is_refused_before_any_gpu_changes(ansible, tmp_path, layout, says):
    path = copy(tmp_path, "h100_mig_mixed")
    before = path.read_text()
    ok, result = ansible.module({"layout": layout}, scenario=path, name="scv.gpu.mig_layout")
    assert not ok and says in result["msg"], result
    assert path.read_text() == before


def test_a_named_layout_from_a_mig_parted_file(ansible, tmp_path):
    path = copy(tmp_path, "h100_mig_empty")
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nmig-configs:\n  all-disabled:\n    - devices: all\n      mig-enabled: false\n"
                      "  all-3g.40gb:\n    - devices: all\n      device-filter: [\"0x233010DE\"]\n"
                      "      mig-enabled: true\n      mig-devices:\n        \"3g.40gb\": 2\n")
    ok, result = ansible.module({"config_file": str(config), "config_name": "all-3g.40gb"}, scenario=path,
                                name="scv.gpu.mig_layout")
    assert ok and result["changed"], result
    assert layout_of(path) == {0: {"3g.40gb": 2}, 1: {"3g.40gb": 2}}
    ok, result = ansible.module({"config_file": str(config), "config_name": "all-1g"}, scenario=path,
                                name="scv.gpu.mig_layout")
    assert not ok and "has no layout 'all-1g'; it has all-3g.40gb, all-disabled" in result["msg"], result


def test_a_gpu_without_mig_is_named(ansible, tmp_path):
    path = copy(tmp_path, "titan_xp")
    ok, result = ansible.module({"layout": ALL_1G}, scenario=path, name="scv.gpu.mig_layout")
    assert not ok and "GPU 0 (TITAN Xp) cannot do MIG" in result["msg"], result


@pytest.mark.parametrize("check", [True, False], ids=["check", "apply"])
@pytest.mark.parametrize("wanted, says", [
    ({"4g.40gb": 2}, "GPU 3 (NVIDIA H100 80GB HBM3): 2 x 4g.40gb do not fit on one GPU"),
    ({"1g.5gb": 7}, "GPU 3 (NVIDIA H100 80GB HBM3): 1g.5gb: not a MIG profile of this GPU; it has 1g.10gb,"),
    ({"3g.40gb": 2, "1g.10gb": 2}, "do not fit on one GPU"),
], ids=["too-many", "unknown-profile", "too-much"])
def test_a_layout_that_cannot_finish_leaves_mig_mode_off_and_the_scenario_file_byte_identical(
        ansible, tmp_path, wanted, says, check):
    path = copy(tmp_path, "h100_sxm_x8")            # MIG mode off on every GPU; GPU 3 is idle
    before = path.read_bytes()
    layout = [{"devices": [3], "mig-enabled": True, "mig-devices": wanted}]
    ok, result = ansible.module({"layout": layout}, scenario=path, name="scv.gpu.mig_layout", check=check)
    assert not ok and says in result["msg"], result
    assert path.read_bytes() == before


@pytest.mark.parametrize("text, says", [
    (b"version: v1\nmig-configs:\n  all-1g\xff:\n    - {devices: all, mig-enabled: false}\n", "is not UTF-8 text"),
    (b"version: v1\nmig-configs:\n  7:\n    - {devices: all, mig-enabled: false}\n", "the layout name 7 is not text"),
    (b"version: v1\nmig-configs:\n  all-1g:\n    - {devices: all, device-filter: {a: 1}, mig-enabled: false}\n",
     "device-filter: {'a': 1} is an object, not a PCI device ID"),
    (b"version: v1\nmig-configs:\n  all-1g:\n    - {device-filter: [0x20B010DE], mig-enabled: true}\n",
     "The layout names no GPU of this host"),
    (b"version: v1\nmig-configs:\n  all-1g:\n    - {mig-enabled: true, mig_enabled: false}\n", "given twice"),
], ids=["not-utf8", "number-name", "filter-mapping", "filter-matches-none", "both-spellings"])
def test_a_mig_parted_file_that_cannot_be_used_is_refused_naming_it(ansible, tmp_path, text, says):
    path = copy(tmp_path, "h100_mig_empty")
    before = path.read_bytes()
    config = tmp_path / "config.yaml"
    config.write_bytes(text)
    ok, result = ansible.module({"config_file": str(config), "config_name": "all-1g"}, scenario=path,
                                name="scv.gpu.mig_layout")
    assert not ok and str(config) in result["msg"], result
    assert says in result["msg"] and "Traceback" not in ansible.last_output, result
    assert path.read_bytes() == before


ROLE_PLAY = """
- hosts: localhost
  gather_facts: false
  roles:
    - role: scv.gpu.mig_layout
"""


def test_the_role_regenerates_the_cdi_spec_so_that_it_names_the_new_mig_devices(ansible, tmp_path, monkeypatch):
    """The container_toolkit role's scv-gpu-cdi-refresh, with NVIDIA's nvidia-ctk, from a driver root whose NVML is
    the GPUs' scenario file, which the layout changes."""
    path = copy(tmp_path, "h100_mig_empty")
    root = DriverRoot(tmp_path / "driver-root", path)
    bin_dir = host_bin(tmp_path / "bin")
    for key, value in root.env({}).items():
        if key != "NVMLSIM_CONFIG":            # the role's GPUs are the scenario file the layout changes
            monkeypatch.setenv(key, value)
    monkeypatch.setenv("PATH", "%s:%s" % (bin_dir, os.environ["PATH"]))
    spec, state = tmp_path / "cdi" / "nvidia.yaml", tmp_path / "cdi.fingerprint"
    play = tmp_path / "mig.yml"
    play.write_text(ROLE_PLAY)
    done = ansible.playbook(play, path, "-e", json.dumps({
        "mig_layout_entries": ALL_1G, "mig_layout_kubernetes": False,
        "mig_layout_cdi_refresh": str(ROOT / "roles" / "container_toolkit" / "files" / "scv-gpu-cdi-refresh"),
        "mig_layout_cdi_spec": str(spec), "mig_layout_cdi_state": str(state)}), wrap=root.namespaced)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Regenerate the CDI specification for the new MIG devices] ***\nchanged" in done.stdout, done.stdout
    named = {device["name"] for device in yaml.safe_load(spec.read_text())["devices"]}
    migs = {entry["uuid"] for gpu in json.loads(path.read_text())["devices"] for entry in gpu["migDevices"]
            if "computeInstanceId" in entry}
    assert len(migs) == 14 and migs <= named, (migs, named)


MIG_PARTED = ROOT / "tests" / "fixtures" / "mig-parted"


@pytest.mark.parametrize("fixture", sorted(MIG_PARTED.glob("*.json")), ids=lambda fixture: fixture.stem)
def test_a_layout_lands_on_the_slices_nvidia_mig_parted_chooses(ansible, tmp_path, fixture):
    """The same configuration file and layout name that NVIDIA's nvidia-mig-parted applied to the same scenario
    (tools/mig-parted/make-fixtures): the same profiles at the same slices of every GPU."""
    expected = json.loads(fixture.read_text())
    assert expected["exitStatus"] == 0 and expected["lastLine"] == "MIG configuration applied successfully"
    path = copy(tmp_path, expected["scenario"])
    ok, result = ansible.module({"config_file": str(MIG_PARTED / "configs.yaml"), "config_name": expected["layout"]},
                                scenario=path, name="scv.gpu.mig_layout")
    assert ok and result["changed"], result
    assert placed_in(path) == [[(entry["profile"], entry["start"]) for entry in gpu] for gpu in expected["gpuInstances"]]


@pytest.mark.parametrize("export", sorted(MIG_PARTED.glob("*-export.yaml")), ids=lambda export: export.stem)
def test_the_layout_nvidia_mig_parted_exports_is_the_one_the_module_reads(ansible, tmp_path, export):
    """nvidia-mig-parted's ``export`` of a scenario, applied to that scenario, changes nothing, and each GPU's
    ``before`` is its exported entry."""
    path = copy(tmp_path, export.stem[:-len("-export")])
    before = path.read_bytes()
    ok, result = ansible.module({"config_file": str(export), "config_name": "current"}, scenario=path,
                                name="scv.gpu.mig_layout")
    assert ok and result["changed"] is False, result
    indexes = [gpu["index"] for gpu in result["gpus"]]
    exported = {index: {"mig-enabled": entry["mig-enabled"], "mig-devices": entry.get("mig-devices") or {}}
                for entry in yaml.safe_load(export.read_text())["mig-configs"]["current"]
                for index in (indexes if entry["devices"] == "all" else entry["devices"])}
    assert indexes == [0, 1] and {gpu["index"]: gpu["before"] for gpu in result["gpus"]} == exported
    assert path.read_bytes() == before
