"""The NVML calls the simulator answers for NVIDIA's DRA kubelet plugin, through the real pynvml, as NVML
documents them: a board's brand and a GPU's addressing mode (tests/fixtures/dra/ holds what the plugin
made of them)."""

from __future__ import annotations

import ctypes
import json

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.nvml.api import pynvml

from harness.common import replace_json
from harness.paths import scenario_path


@pytest.fixture
def nvml(nvml_simulator):
    """pynvml initialised on the scenario given to ``nvml(name_or_path)``; shut down after the test."""
    started = []

    def use(scenario):
        nvml_simulator.use(scenario)
        pynvml.nvmlInit()
        started.append(scenario)
        return pynvml

    yield use
    while started:
        started.pop()
        pynvml.nvmlShutdown()


def handle(nvml_module, index):
    return nvml_module.nvmlDeviceGetHandleByIndex(index)


@pytest.mark.parametrize("scenario, index, brand", [
    ("h100_sxm_x8", 0, pynvml.NVML_BRAND_NVIDIA),            # nvidia-smi on a real H100: "NVIDIA"
    ("a100_mig", 1, pynvml.NVML_BRAND_NVIDIA),
    ("lost_card", 0, pynvml.NVML_BRAND_TESLA),               # Tesla V100-SXM2-16GB
    ("titan_xp", 0, pynvml.NVML_BRAND_TITAN),
    ("power_not_supported", 0, pynvml.NVML_BRAND_GEFORCE),   # NVIDIA GeForce RTX 3090
    ("rtx_pro_6000_mig", 0, pynvml.NVML_BRAND_NVIDIA_RTX),
])
def test_a_boards_brand_follows_its_product_name(nvml, scenario, index, brand):
    assert nvml(scenario).nvmlDeviceGetBrand(handle(pynvml, index)) == brand


def test_a_scenario_may_name_the_brand_and_a_mig_device_answers_its_gpus(nvml, tmp_path):
    data = json.loads(scenario_path("h100_mig_mixed").read_text(encoding="utf-8"))
    data["devices"][0]["brand"] = pynvml.NVML_BRAND_NVIDIA_VCS
    path = tmp_path / "scenario.json"
    replace_json(path, data)
    module = nvml(path)
    gpu = handle(module, 0)
    assert module.nvmlDeviceGetBrand(gpu) == pynvml.NVML_BRAND_NVIDIA_VCS
    assert module.nvmlDeviceGetBrand(module.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)) == pynvml.NVML_BRAND_NVIDIA_VCS


def test_brand_answers_the_errors_nvml_documents(nvml, tmp_path):
    data = json.loads(scenario_path("h100_sxm_x8").read_text(encoding="utf-8"))
    data["devices"][3]["errors"] = {"nvmlDeviceGetBrand": "GPU_IS_LOST"}
    path = tmp_path / "scenario.json"
    replace_json(path, data)
    module = nvml(path)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        module.nvmlDeviceGetBrand(handle(module, 3))
    library = ctypes.CDLL("libnvidia-ml.so.1")
    assert library.nvmlDeviceGetBrand(handle(module, 0), None) == pynvml.NVML_ERROR_INVALID_ARGUMENT


def test_the_real_h100_has_no_addressing_mode_active(nvml):
    module = nvml("h100_real")
    assert module.nvmlDeviceGetAddressingMode(handle(module, 0)) == pynvml.NVML_DEVICE_ADDRESSING_MODE_NONE


def test_a_gpu_without_an_addressing_mode_answers_not_supported(nvml):
    module = nvml("h100_sxm_x8")
    with pytest.raises(pynvml.NVMLError_NotSupported):
        module.nvmlDeviceGetAddressingMode(handle(module, 0))


def test_addressing_mode_checks_the_structure_version(nvml):
    module = nvml("h100_real")
    library = ctypes.CDLL("libnvidia-ml.so.1")
    answer = pynvml.c_nvmlDeviceAddressingMode_t()
    answer.version = 0
    assert (library.nvmlDeviceGetAddressingMode(handle(module, 0), ctypes.byref(answer))
            == pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
    assert library.nvmlDeviceGetAddressingMode(handle(module, 0), None) == pynvml.NVML_ERROR_INVALID_ARGUMENT
