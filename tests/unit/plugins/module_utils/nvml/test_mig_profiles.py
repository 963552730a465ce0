"""The collection's table of MIG profiles, which plans a layout while a GPU's MIG mode is off, against
what the driver (here the simulator, which tables them from NVIDIA's MIG user guide) lists once it is on."""

from __future__ import annotations

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.common.mig_profiles import KNOWN, known_profiles
from ansible_collections.scv.gpu.plugins.module_utils.nvml.api import pynvml
from ansible_collections.scv.gpu.plugins.module_utils.nvml.mig import MigGpu


@pytest.mark.parametrize("scenario", ["a100_mig", "h100_mig_empty"])
def test_the_table_is_what_the_driver_lists_once_mig_mode_is_on(nvml_simulator, scenario):
    nvml_simulator.use(scenario)
    pynvml.nvmlInit()
    try:
        gpu = MigGpu(0)
        assert gpu.mode()[0] is True
        listed = {name: {key: value for key, value in profile.items() if key != "id"}
                  for name, profile in gpu.profiles().items()}
    finally:
        pynvml.nvmlShutdown()
    assert listed and known_profiles(gpu.device_id) == listed


def test_every_table_fits_its_largest_profile_once_and_its_smallest_as_often_as_it_says():
    for device, (card, table) in KNOWN.items():
        slices = max(profile["slices"] for profile in table.values())
        for name, profile in table.items():
            assert all(start + profile["size"] <= 8 for start in profile["starts"]), (card, name)
            assert profile["slices"] * profile["instances"] <= slices, (card, name)
            assert name.startswith("%dg." % profile["slices"]), (card, name)
    assert known_profiles(0x1B0610DE) is None and known_profiles(None) is None
