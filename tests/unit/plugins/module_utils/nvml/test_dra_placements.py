"""What NVIDIA's DRA driver names a device by, as the agent reads it from NVML (minor numbers, GPU instance profile
IDs and placements), held to the ResourceSlices the driver's own kubelet plugin published on the same scenarios
(tests/fixtures/dra): every device it named is found, on the right card and GPU instance."""

from __future__ import annotations

import json

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.agent import dra_claims as dra

from harness.common import replace_json
from harness.paths import ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "dra"
# the scenarios on which the plugin published devices (static MIG: the MIG devices made beforehand)
PUBLISHED = ("a100_mig", "gb200_nvl_x4", "h100_mig_all_1g", "h100_mig_mixed", "h100_real", "h100_sxm_x8",
             "rtx_pro_6000_mig", "titan_xp")


def _devices(name):
    data = json.loads((FIXTURES / ("%s.json" % name)).read_text())
    return [device for piece in data["resourceSlices"] for device in piece["spec"]["devices"]]


@pytest.mark.parametrize("name", PUBLISHED)
def test_each_device_the_dra_driver_published_is_found_on_its_card_and_gpu_instance(name, scenario_file, session):
    scenario_file(name)
    cards = session.read(["static"])["cardList"]
    layout = session.mig.placements(session, cards)
    uuids = {card["id"]: card["uuid"] for card in cards}
    devices = _devices(name)
    assert devices
    claims = {device["name"]: {("p", "ns", "c"): ["claim", "ns", dra.DRIVER, "gpu-node", device["name"]]}
              for device in devices}
    found = dra.units(claims, layout, cards)
    assert len(found) == len(devices)          # each device on a unit of its own
    by_name = {values[4]: (key, values) for key, held in found.items() for values in held.values()}
    for device in devices:
        attributes = {key: value["string"] for key, value in device["attributes"].items() if "string" in value}
        key, values = by_name[device["name"]]
        if attributes["type"] == "gpu":
            assert uuids[key] == attributes["uuid"] and values[5:] == ["", ""]
        else:
            card, instance = key
            assert uuids[card] == attributes["parentUUID"]
            assert values[5:] == [attributes["profile"], attributes["uuid"]]
            assert instance in [entry["id"] for entry in session.mig.read(session, cards)[card]]


def test_minor_numbers_are_the_drivers_not_the_nvml_index(scenario_file, session):
    path, data = scenario_file("h100_sxm_x8")
    for index, device in enumerate(data["devices"]):
        device["minorNumber"] = 7 - index                # device nodes numbered the other way round
    replace_json(path, data)
    cards = session.read(["static"])["cardList"]
    minors, placements = session.mig.placements(session, cards)
    assert minors == {7 - index: index for index in range(8)} and placements == {}


def test_a_gpu_whose_instances_or_minor_number_the_driver_will_not_tell_is_left_out_and_still_read(
        scenario_file, session):
    path, data = scenario_file("h100_mig_mixed")
    data["devices"][0]["errors"] = {"nvmlGpuInstanceGetInfo": "UNKNOWN"}
    data["devices"][1]["errors"] = {"nvmlDeviceGetMinorNumber": "UNKNOWN"}
    replace_json(path, data)
    cards = session.read(["static"])["cardList"]
    minors, placements = session.mig.placements(session, cards)
    whole = data["devices"][1]["migDevices"][0]["uuid"]
    assert minors == {0: 0} and placements == {0: {}, 1: {(0, 0): (1, "7g.80gb", whole)}}
    # the GPU instances are still read for their series
    assert [entry["id"] for entry in session.mig.read(session, cards)[0]] == [1, 2, 3, 4]
