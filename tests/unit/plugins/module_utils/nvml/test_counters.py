"""The counters (nvml.extras): a field value's number is read from the member of NVML's value union that its type
names, and a vGPU guest's licence state is read only where there is one and someone wants it."""

from __future__ import annotations

import json

import pynvml
import pytest

from ansible_collections.scv.gpu.plugins.module_utils.nvml.card import _CardReader
from ansible_collections.scv.gpu.plugins.module_utils.nvml.collect import collect
from ansible_collections.scv.gpu.plugins.module_utils.nvml.extras import field_value, read_counters

from harness.common import replace_json
from harness.paths import scenario_path

LICENCE = "nvmlDeviceGetGridLicensableFeatures_v4"

# Every bit of the union set, then the member the type names written: reading any other member gives another number.
HIGH_BITS = 0xA5A5A5A5A5A5A5A5


@pytest.mark.parametrize("value_type, member, written, expected", [
    (pynvml.NVML_VALUE_TYPE_DOUBLE, "dVal", 1.5, 1.5),
    (pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, "uiVal", 7, 7),
    (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, "ullVal", 2 ** 63 + 5, 2 ** 63 + 5),
    (pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG, "sllVal", -5, -5),
    (pynvml.NVML_VALUE_TYPE_SIGNED_INT, "siVal", -7, -7),
    (pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT, "usVal", 9, 9),
], ids=["double", "unsigned int", "unsigned long long", "signed long long", "signed int", "unsigned short"])
def test_each_type_is_read_from_its_own_member(value_type, member, written, expected):
    field = pynvml.c_nvmlFieldValue_t()
    field.value.ullVal = HIGH_BITS
    setattr(field.value, member, written)
    field.valueType = value_type
    assert field_value(field) == expected


def test_an_unsigned_long_is_read_whole():
    # On the 64-bit hosts NVML ships for, an unsigned long and an unsigned long long are the same eight bytes.
    field = pynvml.c_nvmlFieldValue_t()
    field.value.ulVal = 2 ** 40 + 3
    field.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG
    assert field_value(field) == 2 ** 40 + 3


def test_a_type_newer_than_the_table_is_read_as_an_unsigned_long_long():
    field = pynvml.c_nvmlFieldValue_t()
    field.value.ullVal = 2 ** 50 + 1
    field.valueType = pynvml.NVML_VALUE_TYPE_COUNT
    assert field_value(field) == 2 ** 50 + 1


def guests(tmp_path, **device):
    """h100_sxm_x8 with ``device`` set on every GPU, as a scenario file of the test's."""
    scenario = json.loads(scenario_path("h100_sxm_x8").read_text(encoding="utf-8"))
    for gpu in scenario["devices"]:
        gpu.update(device)
    path = tmp_path / "scenario.json"
    replace_json(path, scenario)
    return path


@pytest.mark.parametrize("licensed", [1, 0])
def test_a_vgpu_guest_gives_its_licence_state(nvml_simulator, tmp_path, licensed):
    nvml_simulator.use(guests(tmp_path, virtualizationMode=pynvml.NVML_GPU_VIRTUALIZATION_MODE_VGPU,
                              vgpuLicensed=licensed))
    cards = collect(["counters"])["cardList"]
    assert [card["vgpuLicenseStatus"] for card in cards] == [licensed] * 8


def test_a_card_that_is_no_vgpu_guest_is_not_asked_for_a_licence(nvml_simulator, tmp_path):
    nvml_simulator.use(guests(tmp_path, virtualizationMode=pynvml.NVML_GPU_VIRTUALIZATION_MODE_PASSTHROUGH,
                              vgpuLicensed=1))
    before = nvml_simulator.calls_of(LICENCE)
    cards = collect(["counters"])["cardList"]
    assert all("vgpuLicenseStatus" not in card for card in cards)
    assert nvml_simulator.calls_of(LICENCE) == before


@pytest.mark.parametrize("wanted, asked", [(None, 1), (["vgpuLicenseStatus"], 1), (["energyConsumption"], 0), ([], 0)])
def test_the_licence_is_asked_only_when_wanted(nvml_simulator, tmp_path, wanted, asked):
    nvml_simulator.use(guests(tmp_path, virtualizationMode=pynvml.NVML_GPU_VIRTUALIZATION_MODE_VGPU, vgpuLicensed=1))
    pynvml.nvmlInit()
    try:
        card = {"virtualizationMode": pynvml.NVML_GPU_VIRTUALIZATION_MODE_VGPU}
        before = nvml_simulator.calls_of(LICENCE)
        read_counters(_CardReader(pynvml.nvmlDeviceGetHandleByIndex(0), []), card, wanted)
        assert nvml_simulator.calls_of(LICENCE) - before == asked
        assert ("vgpuLicenseStatus" in card) == bool(asked)
    finally:
        pynvml.nvmlShutdown()
