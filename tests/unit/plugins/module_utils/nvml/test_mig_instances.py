"""Each GPU instance of a GPU with MIG on, as the agent reads it for its per-instance series: listed once per static
generation, its memory at each read, its engine activity through GPM per GPU instance on the counters' cadence;
and the simulator's answers to those GPM calls, held to what a real H200 answered (real-h200/mig-check.json)."""

from __future__ import annotations

import json

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.nvml.api import pynvml
from ansible_collections.scv.gpu.plugins.module_utils.nvml.mig_instances import gpu_instance_profile

from harness.common import replace_json
from harness.paths import ROOT

REAL = json.loads((ROOT / "tests" / "nvml_simulator" / "real-h200" / "mig-check.json").read_text())


def _read(session, rounds=1, due=True):
    """What the instances read after ``rounds`` of the session's reads; ``due``: the counters due at each."""
    for _round in range(rounds):
        if due:
            session.clock_control.now += session.slow.interval_s + 1
        session.slow.ask()                  # as a scrape does
        facts = session.read(["telemetry", "counters"])
        found = session.mig.read(session, facts["cardList"])
    return found


def test_each_instance_is_read_with_its_own_memory_and_engine_activity(scenario_file, session, nvml_simulator):
    scenario_file("h100_mig_mixed")
    first = _read(session)
    assert {index: [(entry["id"], entry["profile"]) for entry in entries] for index, entries in first.items()} == {
        0: [(1, "3g.40gb"), (2, "2g.20gb"), (3, "1g.10gb"), (4, "1g.10gb")], 1: [(1, "7g.80gb")]}
    assert first[0][0]["totalMemory"] == 40448 and "tensorUtilization" not in first[0][0]   # GPM: one sample yet
    second = _read(session)
    assert (second[0][0]["tensorUtilization"], second[0][0]["dramActivity"]) == (35.0, 24.0)
    assert second[0][1]["tensorUtilization"] == 0.0     # an instance the scenario says nothing of is idle
    nvml_simulator.reset_calls()
    again = _read(session, due=False)                   # the counters are not due: GPM is not sampled again
    assert again[0][0]["tensorUtilization"] == 35.0
    assert nvml_simulator.calls_of("nvmlGpmMigSampleGet") == 0
    assert nvml_simulator.calls_of("nvmlDeviceGetMemoryInfo_v2") == 2 + 5   # each GPU's, then each instance's
    assert session.mig.lists == 1


def test_instances_are_listed_again_with_the_static_readings(scenario_file, session):
    path, data = scenario_file("h100_mig_mixed")
    _read(session)
    data["devices"][0]["migDevices"].pop()
    replace_json(path, data)
    assert [entry["id"] for entry in _read(session)[0]] == [1, 2, 3]   # the destroyed one is left out at once
    data["devices"][0]["migDevices"].append(dict(data["devices"][0]["migDevices"][2], gpuInstanceId=9,
                                                 uuid="MIG-c050aa25-2120-5bba-8848-1e3cf7814a99"))
    replace_json(path, data)
    assert [entry["id"] for entry in _read(session)[0]] == [1, 2, 3]   # a new one waits for the static readings
    session.refresh_static()                                           # as a SIGHUP does
    assert [entry["id"] for entry in _read(session)[0]] == [1, 2, 3, 9]
    assert session.mig.devices(session, session.read([])["cardList"])["MIG-c050aa25-2120-5bba-8848-1e3cf7814a99"] == (
        data["devices"][0]["uuid"], 9)
    data["devices"][0]["migDevices"][3]["gpuInstanceId"] = 11    # destroyed and made again between two reads
    replace_json(path, data)
    assert [entry["id"] for entry in _read(session)[0]] == [1, 2, 3, 11]


def test_gpus_without_mig_have_no_instances_and_cost_one_mode_query(scenario_file, session, nvml_simulator):
    scenario_file("h100_sxm_x8")
    nvml_simulator.reset_calls()
    assert _read(session, rounds=3) == {}
    assert nvml_simulator.calls_of("nvmlDeviceGetMigMode") == 8   # one listing: a query per GPU, once


@pytest.mark.parametrize("mig_on", [False, True], ids=["mig-off", "mig-on"])
def test_the_gpm_calls_answer_as_the_real_gpu(scenario_file, mig_on):
    path, data = scenario_file("h100_real")
    data["devices"][0]["gpm"] = {"anyTensorUtil": 1}
    if mig_on:
        data["devices"][0].update(migMode={"current": 1, "pending": 1}, migDevices=[])
    replace_json(path, data)
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        sample = pynvml.nvmlGpmSampleAlloc()
        with pytest.raises(pynvml.NVMLError) as raised:
            pynvml.nvmlGpmMigSampleGet(handle, 0, sample)
        if mig_on:   # no instance 0; and the whole GPU is sampled per instance only
            assert raised.value.value == pynvml.NVML_ERROR_NOT_FOUND
            with pytest.raises(pynvml.NVMLError_NotSupported):
                pynvml.nvmlGpmSampleGet(handle, sample)
        else:
            assert "%s (%d)" % (raised.value, raised.value.value) == REAL["calls"][0]["nvmlGpmMigSampleGet(gi 0)"]
            pynvml.nvmlGpmSampleGet(handle, sample)
        pynvml.nvmlGpmSampleFree(sample)
    finally:
        pynvml.nvmlShutdown()


def test_the_gpu_instance_profile_is_read_from_the_mig_device_name():
    assert gpu_instance_profile("NVIDIA H100 80GB HBM3 MIG 1g.10gb") == "1g.10gb"
    assert gpu_instance_profile("NVIDIA H100 80GB HBM3 MIG 1c.3g.40gb") == "3g.40gb"
    assert gpu_instance_profile("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me") == "1g.10gb+me"
    assert gpu_instance_profile("NVIDIA H100 80GB HBM3") is None


def test_each_instance_takes_its_samples_in_two_buffers_and_asks_only_the_engines(
        scenario_file, session, nvml_simulator, monkeypatch):
    counted = {"alloc": 0, "free": 0}

    def counting(name, function):
        def call(*args):
            counted[name] += 1
            return function(*args)
        return call

    monkeypatch.setattr(pynvml, "nvmlGpmSampleAlloc", counting("alloc", pynvml.nvmlGpmSampleAlloc))
    monkeypatch.setattr(pynvml, "nvmlGpmSampleFree", counting("free", pynvml.nvmlGpmSampleFree))
    scenario_file("h100_mig_mixed")
    nvml_simulator.reset_calls()
    found = _read(session, rounds=6)
    assert nvml_simulator.calls_of("nvmlGpmMigSampleGet") == 6 * 5
    # two buffers per instance, used in turn; one for each GPU, whose whole-GPU sample MIG refuses, kept for the next
    assert counted == {"alloc": 2 * 5 + 2, "free": 0}
    assert "pcieTxMiBPerSecond" not in found[0][0] and found[0][0]["graphicsActivity"] == 62.0
    session.close()
    assert counted == {"alloc": 2 * 5 + 2, "free": 2 * 5 + 2}


def test_a_gpu_with_instances_is_not_sampled_whole(scenario_file, session, nvml_simulator):
    """NVML refuses it: a refused call is still a call."""
    path, data = scenario_file("h100_mig_mixed")
    _read(session)
    nvml_simulator.reset_calls()
    _read(session, rounds=3)
    assert nvml_simulator.calls_of("nvmlGpmSampleGet") == 0 and nvml_simulator.calls_of("nvmlGpmMigSampleGet") == 15
    for device in data["devices"]:           # MIG off again, as after a reset: the GPUs are sampled whole again
        device.update(migMode={"current": 0, "pending": 0}, migDevices=[])
    replace_json(path, data)
    session.refresh_static()
    nvml_simulator.reset_calls()
    _read(session, rounds=3)   # the first read's counters come before the instances are listed again
    assert nvml_simulator.calls_of("nvmlGpmSampleGet") == 2 * 2 and nvml_simulator.calls_of("nvmlGpmMigSampleGet") == 0


def test_this_nodes_mig_devices_are_listed_with_their_gpus(nvml_simulator, session):
    nvml_simulator.use("h100_mig_mixed")
    found = session.mig.devices(session, session.read([])["cardList"])
    parents = sorted({gpu for gpu, _instance in found.values()})
    assert len(found) == 5 and len(parents) == 2
    assert sorted([gpu for gpu, _instance in found.values()].count(parent) for parent in parents) == [1, 4]
    assert all(uuid.startswith("MIG-") for uuid in found)
    session.close()
    nvml_simulator.use("h100_sxm_x8")           # MIG off: none
    assert session.mig.devices(session, session.read([])["cardList"]) == {}
