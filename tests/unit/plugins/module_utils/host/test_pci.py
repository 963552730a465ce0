"""NVIDIA GPUs read from a sysfs tree laid out as the kernel lays it out, with no driver needed."""

from __future__ import annotations

import json

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.node.labels import desired_labels, pci_labels, sanitise_product
from ansible_collections.scv.gpu.plugins.module_utils.host.pci import (
    MODELS,
    bus_key,
    missing_from_nvml,
    nvidia_gpus,
    nvswitches,
    pci_facts,
)
from harness.pci_sysfs import add_function
from harness.paths import scenario_path


@pytest.fixture
def sysfs(tmp_path):
    root = tmp_path / "sys"
    # the readings of the real H100 (a VM with the card at 0000:00:06.0, bound to nvidia)
    add_function(root, "0000:00:06.0", 0x10DE, 0x2330, 0x030200, "nvidia")
    add_function(root, "0000:00:00.0", 0x8086, 0x1237, 0x060000)               # host bridge
    add_function(root, "0000:18:00.0", 0x10DE, 0x20B2, 0x030200)               # no driver bound
    add_function(root, "0000:19:00.0", 0x10DE, 0x27B8, 0x030200, "vfio-pci")   # passed through
    add_function(root, "0000:1a:00.0", 0x10DE, 0x1B02, 0x030000, "nouveau")    # VGA class
    add_function(root, "0000:1a:00.1", 0x10DE, 0x10EF, 0x040300, "snd_hda_intel")   # the card's audio
    add_function(root, "0000:c5:00.0", 0x10DE, 0x22A3, 0x068000)               # NVSwitch (bridge class)
    add_function(root, "0000:d0:00.0", 0x10DE, 0x9999, 0x030200)               # a device the table lacks
    return root


def test_gpus_are_listed_in_bus_order_with_model_and_driver(sysfs):
    assert nvidia_gpus(str(sysfs)) == [
        {"busId": "0000:00:06.0", "deviceId": "0x2330", "class": "0x030200", "model": "NVIDIA H100 80GB HBM3",
         "driver": "nvidia", "vgpu": False},
        {"busId": "0000:18:00.0", "deviceId": "0x20b2", "class": "0x030200", "model": "NVIDIA A100-SXM4-80GB",
         "driver": None, "vgpu": False},
        {"busId": "0000:19:00.0", "deviceId": "0x27b8", "class": "0x030200", "model": "NVIDIA L4",
         "driver": "vfio-pci", "vgpu": False},
        {"busId": "0000:1a:00.0", "deviceId": "0x1b02", "class": "0x030000", "model": "TITAN Xp",
         "driver": "nouveau", "vgpu": False},
        {"busId": "0000:d0:00.0", "deviceId": "0x9999", "class": "0x030200", "model": None, "driver": None,
         "vgpu": False},
    ]


def test_a_vgpu_is_told_by_its_vendor_capability(tmp_path):
    from harness import pci_sysfs
    scenario = {"devices": [{"pciBusId": "00000000:3B:00.0", "pciDeviceId": 0x233010DE, "vgpu": 1},
                            {"pciBusId": "00000000:3C:00.0", "pciDeviceId": 0x233010DE}]}
    gpus = nvidia_gpus(pci_sysfs.build(scenario, str(tmp_path)))
    assert [(gpu["busId"], gpu["vgpu"]) for gpu in gpus] == [("0000:3b:00.0", True), ("0000:3c:00.0", False)]


@pytest.mark.parametrize("config", [
    b"",                                                  # unreadable
    bytes(64),                                            # no capability list
    bytes(6) + b"\x10" + bytes(45) + b"\x40" + bytes(11) + b"\x40\x40" + bytes(2),   # a capability pointing at itself
])
def test_odd_configuration_spaces_are_not_vgpus(config):
    from ansible_collections.scv.gpu.plugins.module_utils.host.pci import is_vgpu
    assert is_vgpu(config) is False


def test_no_pci_tree_is_no_gpus(tmp_path):
    assert nvidia_gpus(str(tmp_path / "absent")) == []


def test_an_unreadable_function_is_skipped_not_fatal(sysfs):
    (sysfs / "devices" / "pci0000:00" / "0000:18:00.0" / "class").unlink()
    assert "0000:18:00.0" not in [gpu["busId"] for gpu in nvidia_gpus(str(sysfs))]


@pytest.mark.parametrize("name", ["h100_real", "h100_sxm_x8", "a100_mig", "titan_xp", "lost_card",
                                  "health_reasons", "power_not_supported"])
def test_the_table_names_each_card_as_nvml_does(name):
    """The label a driverless node gets must not change when the driver comes up; h100_real is the
    real card's nvidia-smi reading."""
    with open(scenario_path(name), encoding="utf-8") as handle:
        scenario = json.load(handle)
    for device in scenario["devices"]:
        if "pciDeviceId" in device and "name" in device:
            assert MODELS[device["pciDeviceId"] >> 16] == device["name"], name


@pytest.mark.parametrize("nvml, pci, same", [
    ("00000000:18:00.0", "0000:18:00.0", True),
    ("00000000:18:00.0", "0000:18:00.1", False),
    ("00000001:18:00.0", "0000:18:00.0", False),
    ("0000:1A:00.0", "0000:1a:00.0", True),
    ("garbage", "0000:1a:00.0", False),
])
def test_bus_ids_compare_across_spellings(nvml, pci, same):
    assert (bus_key(nvml) == bus_key(pci)) is same
    assert bus_key("garbage") is None


def test_missing_from_nvml_names_the_cards_nvml_did_not_answer_for(sysfs):
    gpus = nvidia_gpus(str(sysfs))
    missing = missing_from_nvml(gpus, ["00000000:00:06.0", "00000000:18:00.0", "00000000:19:00.0", "00000000:D0:00.0"])
    assert [gpu["busId"] for gpu in missing] == ["0000:1a:00.0"]


def test_a_driverless_node_gets_present_and_the_sites_key(sysfs):
    fact = {"nvml_available": False, "nvml_error": "driver not loaded", "cardList": [],
            "pci_gpus": nvidia_gpus(str(sysfs))}
    expected = {"nvidia.com/gpu.present": "true", "gpu/nvidia": "NVIDIA-H100-80GB-HBM3"}
    assert desired_labels(fact, "gpu/nvidia") == expected
    # the value is what NVML's name gives once the driver runs
    assert sanitise_product("NVIDIA H100 80GB HBM3") == "NVIDIA-H100-80GB-HBM3"


def test_an_unknown_device_is_labelled_by_its_id():
    assert pci_labels([{"busId": "0000:d0:00.0", "deviceId": "0x9999", "model": None, "driver": None}],
                      "example.com/gpu") == {"nvidia.com/gpu.present": "true", "example.com/gpu": "pci-10de-9999"}


def test_no_gpus_on_the_bus_no_labels():
    assert desired_labels({"nvml_available": False, "cardList": [], "pci_gpus": []}, "gpu/nvidia") == {}
    assert desired_labels({"nvml_available": False, "cardList": []}, "gpu/nvidia") == {}


@pytest.mark.parametrize("pci_gpus", ["0000:18:00.0", [None, 3, {"deviceId": 7}], {"deviceId": "0x2330"}])
def test_hand_made_pci_lists_of_the_wrong_shape_give_no_labels(pci_gpus):
    assert desired_labels({"nvml_available": False, "cardList": [], "pci_gpus": pci_gpus}, "gpu/nvidia") == {}


def test_sr_iov_virtual_functions_are_listed_apart_and_not_counted_as_gpus(tmp_path):
    from ansible_collections.scv.gpu.plugins.module_utils.host.pci import nvidia_functions

    root = tmp_path / "sys"
    add_function(root, "0000:3b:00.0", 0x10DE, 0x2330, 0x030200, "nvidia")     # one H100 with SR-IOV on
    for number in range(4):
        add_function(root, "0000:3b:00.%d" % (number + 4), 0x10DE, 0x2330, 0x030200, "nvidia",
                     physfn="0000:3b:00.0")
    found = nvidia_functions(str(root))
    assert [gpu["busId"] for gpu in found["gpus"]] == ["0000:3b:00.0"]
    assert nvidia_gpus(str(root)) == found["gpus"]
    assert found["virtual_functions"] == [
        {"busId": "0000:3b:00.%d" % (number + 4), "deviceId": "0x2330", "physfn": "0000:3b:00.0", "driver": "nvidia"}
        for number in range(4)]
    assert found["unreadable"] == []


def test_a_function_whose_class_cannot_be_read_is_listed_as_unreadable_not_dropped(tmp_path):
    from ansible_collections.scv.gpu.plugins.module_utils.host.pci import nvidia_functions

    root = tmp_path / "sys"
    add_function(root, "0000:18:00.0", 0x10DE, 0x2330, 0x030200, "nvidia")
    add_function(root, "0000:19:00.0", 0x10DE, 0x2330, 0x030200, "nvidia")
    add_function(root, "0000:20:00.0", 0x8086, 0x1237, 0x060000)
    (root / "devices" / "pci0000:00" / "0000:19:00.0" / "class").unlink()
    (root / "devices" / "pci0000:00" / "0000:20:00.0" / "class").unlink()   # not NVIDIA's: not ours to report
    found = nvidia_functions(str(root))
    assert [gpu["busId"] for gpu in found["gpus"]] == ["0000:18:00.0"]
    assert found["unreadable"] == [{"busId": "0000:19:00.0", "vendor": "0x10de", "problem": "cannot read %s" % (
        root / "bus" / "pci" / "devices" / "0000:19:00.0" / "class")}]


def test_a_gpu_passed_through_to_a_vm_is_not_missing_from_nvml(sysfs):
    """0000:19:00.0 is bound to vfio-pci: a VM has it, and the host's NVML is not meant to see it."""
    missing = missing_from_nvml(nvidia_gpus(str(sysfs)), ["00000000:00:06.0", "00000000:18:00.0",
                                                          "00000000:1A:00.0", "00000000:D0:00.0"])
    assert missing == []
    vfio = next(gpu for gpu in nvidia_gpus(str(sysfs)) if gpu["busId"] == "0000:19:00.0")
    assert vfio["driver"] == "vfio-pci"          # still listed on the bus, with the driver that holds it


def test_a_broken_link_is_listed_as_unreadable_with_a_warning(sysfs):
    listing = sysfs / "bus" / "pci" / "devices"
    (listing / "0000:3b:00.0").symlink_to("../../../devices/pci0000:3a/0000:3b:00.0")   # nothing there
    facts, warnings = pci_facts(str(sysfs))
    assert facts["pci_unreadable"] == [{"busId": "0000:3b:00.0", "vendor": None, "problem": "%s is a broken link, "
                                        "so even its vendor cannot be read" % (listing / "0000:3b:00.0")}]
    assert warnings == ["PCI function 0000:3b:00.0: %s is a broken link, so even its vendor cannot be read, so whether "
                        "it is an NVIDIA GPU is not known" % (listing / "0000:3b:00.0")]
    assert [gpu["busId"] for gpu in facts["pci_gpus"]][0] == "0000:00:06.0"     # the others are read as before


def test_nvswitches_are_the_nvidia_bridge_functions_with_their_generation(sysfs, tmp_path):
    assert nvswitches(str(sysfs)) == [{"busId": "0000:c5:00.0", "deviceId": "0x22a3", "generation": "LS10",
                                       "driver": None}]
    add_function(sysfs, "0000:c6:00.0", 0x10DE, 0x1AF1, 0x068000, "nvidia-nvswitch")   # an A100 board's
    add_function(sysfs, "0000:c7:00.0", 0x10DE, 0x2999, 0x068000)                      # an ID the table lacks
    add_function(sysfs, "0000:c8:00.0", 0x15B3, 0x1021, 0x068000)                      # not NVIDIA's
    add_function(sysfs, "0000:c9:00.0", 0x10DE, 0x22A8, 0x060400)                      # a PCI-PCI bridge
    assert [(switch["busId"], switch["generation"], switch["driver"]) for switch in nvswitches(str(sysfs))] == [
        ("0000:c5:00.0", "LS10", None), ("0000:c6:00.0", "LR10", "nvidia-nvswitch"), ("0000:c7:00.0", None, None)]
    assert pci_facts(str(sysfs))[0]["pci_nvswitches"] == nvswitches(str(sysfs))   # what both modules return
    assert nvswitches(str(tmp_path / "nothing")) == []


@pytest.mark.parametrize("device, generation", [(0x1AE7, None), (0x1AE8, "LR10"), (0x1AFF, "LR10"), (0x1B00, None),
                                                (0x229F, None), (0x22A0, "LS10"), (0x22A7, "LS10"), (0x22A8, None)])
def test_the_generation_table_ends_where_the_driver_s_id_ranges_end(tmp_path, device, generation):
    add_function(tmp_path, "0000:05:00.0", 0x10DE, device, 0x068000)
    assert nvswitches(str(tmp_path))[0]["generation"] == generation


def test_a_scenario_s_nvswitches_become_bridge_functions_bound_to_nvswitch_not_gpus(tmp_path):
    from harness import pci_sysfs
    scenario = {"devices": [{"pciBusId": "00000000:18:00.0", "pciDeviceId": 0x233010DE}],
                "nvswitches": [{"pciBusId": "00000000:%02X:00.0" % bus, "pciDeviceId": 0x22A310DE}
                               for bus in (0x05, 0x06, 0x07, 0x08)]}
    root = pci_sysfs.build(scenario, str(tmp_path))
    assert [gpu["busId"] for gpu in nvidia_gpus(root)] == ["0000:18:00.0"]
    assert nvswitches(root) == [{"busId": "0000:%02x:00.0" % bus, "deviceId": "0x22a3", "generation": "LS10",
                                 "driver": "nvidia-nvswitch"} for bus in (0x05, 0x06, 0x07, 0x08)]
    assert (tmp_path / "bus" / "pci" / "devices" / "0000:05:00.0" / "class").read_text() == "0x068000\n"
