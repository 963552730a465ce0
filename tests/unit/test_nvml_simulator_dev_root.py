"""What the simulator lists when a dev root says which device nodes a process has (``NVMLSIM_DEV_ROOT``), as a
driver does in a container: the GPUs whose ``/dev/nvidia<minor>`` it was given, and under them the MIG devices
whose capability nodes it was given. The container tests tell what NVIDIA's runtime gave a container by this."""

from __future__ import annotations

import os
import shutil

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.nvml.api import pynvml

from harness.paths import scenario_path

GPU_MAJOR, CAPS_MAJOR = 195, 236
# h100_mig_mixed's first GPU: GPU instances 1 to 4, each with compute instance 0
MIG_3G, MIG_1G = "MIG-9cd6eff1-030e-57fd-8668-9b0ae20d03c1", "MIG-c050aa25-2120-5bba-8848-1e3cf7814a13"


def gi_minor(gpu, instance):
    """The minor of ``/dev/nvidia-caps/nvidia-cap<N>`` of a GPU instance, as the driver's mig-minors numbers it."""
    return 3 + gpu * 15 * 9 + instance * 9


@pytest.fixture
def listed(nvml_simulator, tmp_path, monkeypatch):
    """listed(nodes) -> (GPU UUIDs, {GPU UUID: MIG UUIDs}) that NVML answers with only ``nodes`` under dev/."""
    def run(nodes):
        root = tmp_path / ("root-%d" % len(list(tmp_path.glob("root-*"))))
        (root / "dev" / "nvidia-caps").mkdir(parents=True)
        for name, major, minor in nodes:
            os.mknod(root / "dev" / name, 0o666 | 0o020000, os.makedev(major, minor))
        scenario = root / "scenario.json"          # a file of its own: the simulator reloads on a new file
        shutil.copyfile(scenario_path("h100_mig_mixed"), scenario)
        nvml_simulator.use(scenario)
        monkeypatch.setenv("NVMLSIM_DEV_ROOT", str(root))
        pynvml.nvmlInit()
        try:
            gpus, migs = [], {}
            for index in range(pynvml.nvmlDeviceGetCount()):
                device = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid = pynvml.nvmlDeviceGetUUID(device)
                gpus.append(uuid)
                migs[uuid] = []
                for position in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(device)):
                    try:
                        mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(device, position)
                    except pynvml.NVMLError_NotFound:
                        continue
                    migs[uuid].append(pynvml.nvmlDeviceGetUUID(mig))
            return gpus, migs
        finally:
            pynvml.nvmlShutdown()

    return run


CONTROL = [("nvidiactl", GPU_MAJOR, 255)]
FIRST = "GPU-5a7c0000-1f2e-4d3c-8b4a-9e8d7c6b5a40"
SECOND = "GPU-5a7c0001-1f2e-4d3c-8b4a-9e8d7c6b5a41"


def caps(gpu, instance, compute=0):
    return [("nvidia-caps/nvidia-cap%d" % gi_minor(gpu, instance), CAPS_MAJOR, gi_minor(gpu, instance)),
            ("nvidia-caps/nvidia-cap%d" % (gi_minor(gpu, instance) + 1 + compute), CAPS_MAJOR,
             gi_minor(gpu, instance) + 1 + compute)]


def test_a_process_with_one_gpus_node_sees_that_gpu_and_none_of_its_mig_devices_without_their_caps(listed):
    assert listed(CONTROL + [("nvidia1", GPU_MAJOR, 1)]) == ([SECOND], {SECOND: []})


def test_a_process_with_one_mig_devices_caps_sees_that_mig_device_alone(listed):
    assert listed(CONTROL + [("nvidia0", GPU_MAJOR, 0)] + caps(0, 3)) == ([FIRST], {FIRST: [MIG_1G]})
    assert listed(CONTROL + [("nvidia0", GPU_MAJOR, 0)] + caps(0, 1)) == ([FIRST], {FIRST: [MIG_3G]})


def test_the_gpu_instances_node_alone_is_not_enough(listed):
    assert listed(CONTROL + [("nvidia0", GPU_MAJOR, 0)] + caps(0, 3)[:1]) == ([FIRST], {FIRST: []})


def test_another_gpus_caps_give_nothing_on_this_one(listed):
    assert listed(CONTROL + [("nvidia0", GPU_MAJOR, 0)] + caps(1, 3)) == ([FIRST], {FIRST: []})


def test_a_mig_device_out_of_reach_is_not_found_by_its_uuid(nvml_simulator, listed):
    listed(CONTROL + [("nvidia0", GPU_MAJOR, 0)] + caps(0, 3))
    pynvml.nvmlInit()
    try:
        assert pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByUUID(MIG_1G)) == MIG_1G
        with pytest.raises(pynvml.NVMLError_NotFound):
            pynvml.nvmlDeviceGetHandleByUUID(MIG_3G)
    finally:
        pynvml.nvmlShutdown()


def test_without_the_control_node_the_driver_is_out_of_reach(nvml_simulator, tmp_path, monkeypatch):
    (tmp_path / "dev").mkdir()
    scenario = tmp_path / "scenario.json"
    shutil.copyfile(scenario_path("h100_mig_mixed"), scenario)
    nvml_simulator.use(scenario)
    monkeypatch.setenv("NVMLSIM_DEV_ROOT", str(tmp_path))
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlInit()
