"""A GPU's architecture from its PCI device ID, checked against the device IDs NVIDIA lists for its open kernel
modules and against the simulator's scenarios; and the kernel module flavour the driver plan chooses from them."""

from __future__ import annotations

import json

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.host.driver import PlanError, blacklist, plan, reboot_reasons
from ansible_collections.scv.gpu.plugins.module_utils.host.gpu_architecture import (
    OPEN_ONLY, ORDER, PROPRIETARY_ONLY, architecture, kernel_modules)
from harness.paths import ROOT, SCENARIOS

OPEN_IDS = ROOT / "tests" / "fixtures" / "open-kernel-modules-device-ids.txt"
# NVML's nvmlDeviceArchitecture_t, as the scenarios give it
NVML_ARCHITECTURES = {2: "Kepler", 3: "Maxwell", 4: "Pascal", 5: "Volta", 6: "Turing", 7: "Ampere",
                      8: "Ada Lovelace", 9: "Hopper", 10: "Blackwell"}
# data centre and workstation GPUs older than Turing, by their published device IDs
OLDER = {"0x102d": "Kepler", "0x13f2": "Maxwell", "0x17fd": "Maxwell", "0x15f7": "Pascal", "0x15f8": "Pascal",
         "0x1b38": "Pascal", "0x1bb3": "Pascal", "0x1b02": "Pascal", "0x1db1": "Volta", "0x1db4": "Volta",
         "0x1db5": "Volta", "0x1db6": "Volta", "0x1d81": "Volta"}
DEBIAN = {"os_family": "Debian", "distribution": "Debian", "major_version": "12", "kernel": "6.1.0-26-amd64"}
UBUNTU = {"os_family": "Debian", "distribution": "Ubuntu", "major_version": "24", "kernel": "6.8.0-45-generic"}
TITAN_XP = {"busId": "0000:01:00.0", "deviceId": "0x1b02", "model": "TITAN Xp"}
B200 = {"busId": "0000:1b:00.0", "deviceId": "0x2901", "model": None}
H100 = {"busId": "0000:18:00.0", "deviceId": "0x2330", "model": "NVIDIA H100 80GB HBM3"}


def test_every_gpu_nvidias_open_modules_run_on_is_turing_or_newer_here():
    ids = [line for line in OPEN_IDS.read_text().splitlines() if line and not line.startswith("#")]
    assert len(ids) > 250
    found = {device: architecture("0x" + device) for device in ids}
    assert not [device for device, name in found.items() if name is None or name in PROPRIETARY_ONLY], found
    assert found["2330"] == "Hopper" and found["2342"] == "Grace Hopper" and found["2BB1"] == "Blackwell"


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.json")), ids=lambda path: path.stem)
def test_each_scenarios_gpus_are_of_the_architecture_nvml_says(path):
    for device in json.loads(path.read_text()).get("devices", []):
        assert architecture(device["pciDeviceId"] >> 16) == NVML_ARCHITECTURES[device["architecture"]], device


def test_older_gpus_by_their_published_ids_and_unknown_ids():
    assert {device: architecture(device) for device in OLDER} == OLDER
    assert architecture("0x0040") is None and architecture("0xffff") is None and architecture("not hex") is None
    assert set(PROPRIETARY_ONLY) | {"Turing", "Ampere", "Ada Lovelace", "Hopper", "Blackwell"} == set(ORDER)
    assert OPEN_ONLY == {"Blackwell", "Grace Hopper"}


def test_auto_takes_open_on_blackwell_and_hopper_and_proprietary_on_pascal():
    assert kernel_modules([B200], "auto", 580) == ("open", [])
    assert kernel_modules([H100, H100], "auto", 580) == ("open", [])
    assert kernel_modules([TITAN_XP], "auto", 580) == ("proprietary", [])
    assert kernel_modules([], "auto", 580) == ("open", [])


def test_a_host_mixing_gpus_that_need_different_modules_is_refused_naming_both():
    flavour, problems = kernel_modules([B200, TITAN_XP, H100], "auto", 580)
    assert len(problems) == 1, problems
    assert "GPU 0000:1b:00.0 (unknown model, device 0x2901, Blackwell) run with the open modules only" in problems[0]
    assert "GPU 0000:01:00.0 (TITAN Xp, device 0x1b02, Pascal) with the proprietary ones only" in problems[0]
    assert "0000:18:00.0" not in problems[0]


@pytest.mark.parametrize("gpu, setting, other", [(B200, "proprietary", "open"), (TITAN_XP, "open", "proprietary")])
def test_a_forced_flavour_the_gpus_cannot_run_is_refused(gpu, setting, other):
    flavour, problems = kernel_modules([gpu], setting, 580)
    assert flavour == setting and len(problems) == 1
    assert problems[0].startswith("nvidia_driver_kernel_modules is %s, and GPU %s" % (setting, gpu["busId"]))
    assert "set it to auto (or %s)" % other in problems[0]
    assert kernel_modules([H100], setting, 580) == (setting, [])


def test_a_branch_past_the_last_for_pascal_is_refused_and_580_is_not():
    assert kernel_modules([TITAN_XP], "auto", 580) == ("proprietary", [])
    flavour, problems = kernel_modules([TITAN_XP], "auto", 590)
    assert problems == ["driver branch 590 no longer supports GPU 0000:01:00.0 (TITAN Xp, device 0x1b02, Pascal): "
                        "branch 580 is the last for Pascal GPUs; set nvidia_driver_branch to 580"]
    assert kernel_modules([B200], "auto", 595) == ("open", [])
    assert kernel_modules([TITAN_XP], "auto", None) == ("proprietary", [])


def test_the_plan_installs_the_flavour_auto_chose_and_says_why():
    blackwell = plan(**UBUNTU, branch="580", gpus=[B200])
    assert blackwell["kernel_modules"] == "open" and blackwell["driver_package"] == "nvidia-driver-580-server-open"
    assert blackwell["kernel_modules_why"] == "auto: every GPU is Turing or newer (Blackwell)"
    pascal = plan(**DEBIAN, gpus=[TITAN_XP])
    assert pascal["kernel_modules"] == "proprietary" and "nvidia-kernel-dkms" in pascal["packages"]
    assert pascal["kernel_modules_why"] == "auto: a GPU older than Turing (Pascal) runs with the proprietary modules only"
    assert plan(**DEBIAN, gpus=[])["kernel_modules_why"].startswith("auto: no NVIDIA GPU on the PCI bus")


@pytest.mark.parametrize("settings, said", [
    ({"gpus": [B200, TITAN_XP]}, "mixes GPUs"),
    ({"gpus": [TITAN_XP], "kernel_modules": "open"}, "cannot run with the open modules"),
    ({"gpus": [B200], "kernel_modules": "proprietary"}, "cannot run with the proprietary modules"),
    ({"gpus": [TITAN_XP], "branch": "590"}, "driver branch 590 no longer supports"),
    ({"gpus": [TITAN_XP], "version": "595.45.04-0ubuntu1"}, "driver branch 595 no longer supports"),
])
def test_the_plan_refuses_before_anything_changes(settings, said):
    with pytest.raises(PlanError, match=said) as refused:
        plan(**UBUNTU, **settings)
    assert str(refused.value).endswith("Nothing has been changed.")


UBUNTU_2604 = {"os_family": "Debian", "distribution": "Ubuntu", "major_version": "26", "kernel": "7.0.0-14-generic"}


def test_ubuntu_2604s_plan_keeps_nova_out_of_the_boot_with_its_open_server_packages():
    got = plan(**UBUNTU_2604, gpus=[B200])
    assert got["blacklist"] == ["nouveau", "nova_core", "nova_drm", "nova"]
    assert got["driver_package"] == "nvidia-driver-580-server-open"
    assert "linux-modules-nvidia-580-server-open-7.0.0-14-generic" in got["packages"]
    assert plan(**UBUNTU_2604, ubuntu_server=False, gpus=[B200])["driver_package"] == "nvidia-driver-580-open"


@pytest.mark.parametrize("kernel, nova", [("6.1.0-26-amd64", False), ("6.12.48+deb13-amd64", False),
                                          ("6.14.0-37-generic", False), ("6.15.2-arch1-1", True),
                                          ("7.0.0-14-generic", True), ("", False)])
def test_nova_is_blacklisted_on_kernels_that_have_it(kernel, nova):
    assert blacklist(kernel) == (["nouveau", "nova_core", "nova_drm", "nova"] if nova else ["nouveau"])


def test_a_loaded_nova_core_is_a_reason_to_reboot_once_the_driver_is_installed():
    reasons = reboot_reasons(None, "580.95.05", False, ["nova_core", "nova_drm"])
    assert reasons == ["nova_core, nova_drm is loaded and binds the GPUs before NVIDIA's module can; the blacklist "
                       "takes effect at boot"]
    assert reboot_reasons(None, None, False, ["nova_core"]) == []
    assert reboot_reasons(None, "580.95.05", False, []) == []
