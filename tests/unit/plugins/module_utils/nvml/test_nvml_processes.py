"""Per-process reads of a GPU (nvml.processes), through the real pynvml and the simulator.

A shared GPU's processes come from the scenario's "processes" entries; their utilization samples
carry timestamps, and each read must ask only for samples newer than the last one it saw.
"""

from __future__ import annotations

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.nvml.processes import ProcessUse

from harness.common import replace_json

GIB = 1 << 30


@pytest.fixture
def reader(session):
    """Reads card ``index`` of the session as the agent does: through its open handle, None without one."""
    use = ProcessUse()

    def read(index, **options):
        handle, uuid = session.handle(index)
        return None if handle is None else use.read(uuid, handle, session=session.inits, **options)
    read.use = use
    return read


def shared(data, processes, index=0):
    data["devices"][index]["processes"] = processes
    return data


def test_a_read_names_each_process_memory_and_its_samples(scenario_file, session, reader, nvml_simulator):
    path, data = scenario_file("h100_sxm_x8")
    replace_json(path, shared(data, [{"pid": 101, "usedGpuMemory": 2 * GIB, "smUtil": 30, "memUtil": 4},
                                     {"pid": 102, "usedGpuMemory": 3 * GIB},
                                     {"pid": 103, "usedGpuMemory": GIB, "smUtil": 50, "encUtil": 7}]))
    session.read(["telemetry"])
    use = reader(0)
    assert use["memory"] == {101: 2 * GIB, 102: 3 * GIB, 103: GIB}
    # 102 has no sample: NVML knows nothing of its utilization, which is not the same as idle
    assert use["utilization"] == {101: {"smUtil": 30, "memUtil": 4, "encUtil": 0, "decUtil": 0},
                                  103: {"smUtil": 50, "memUtil": 0, "encUtil": 7, "decUtil": 0}}
    # another card's process has no sample either: NVML answers NOT_FOUND
    assert reader(1) == {"memory": {4000: 512 << 20}, "utilization": {}}


def test_each_read_asks_only_for_samples_newer_than_the_last_seen(scenario_file, session, reader):
    path, data = scenario_file("h100_sxm_x8")
    replace_json(path, shared(data, [{"pid": 101, "usedGpuMemory": GIB, "smUtil": 20, "utilTimestamp": 1000},
                                     {"pid": 101, "usedGpuMemory": 0, "smUtil": 40, "utilTimestamp": 2000},
                                     {"pid": 102, "usedGpuMemory": GIB, "smUtil": 10, "utilTimestamp": 1500}]))
    session.read(["telemetry"])
    # two samples of one process: their mean
    assert reader(0)["utilization"] == {101: {"smUtil": 30, "memUtil": 0, "encUtil": 0, "decUtil": 0},
                                        102: {"smUtil": 10, "memUtil": 0, "encUtil": 0, "decUtil": 0}}
    # nothing newer than 2000: NVML answers NOT_FOUND, read as "no process sampled since"
    assert reader(0)["utilization"] == {}
    replace_json(path, shared(data, [{"pid": 101, "usedGpuMemory": GIB, "smUtil": 90, "utilTimestamp": 1999},
                                     {"pid": 102, "usedGpuMemory": GIB, "smUtil": 60, "utilTimestamp": 2500}]))
    session.read(["telemetry"])
    assert reader(0)["utilization"] == {102: {"smUtil": 60, "memUtil": 0, "encUtil": 0, "decUtil": 0}}
    # each GPU keeps its own timestamp, and a new session starts from the driver's whole buffer again
    session.close()
    session.read(["telemetry"])
    assert set(reader(0)["utilization"]) == {101, 102}


def test_a_busy_process_has_a_new_sample_at_every_read(scenario_file, session, reader):
    path, data = scenario_file("h100_sxm_x8")
    replace_json(path, shared(data, [{"pid": 101, "usedGpuMemory": GIB, "smUtil": 25}]))
    session.read(["telemetry"])
    for _read in range(3):
        assert reader(0)["utilization"][101]["smUtil"] == 25


def test_without_utilization_only_the_cheap_query_is_made(scenario_file, session, reader, nvml_simulator):
    path, data = scenario_file("h100_sxm_x8")
    replace_json(path, shared(data, [{"pid": 101, "usedGpuMemory": GIB, "smUtil": 25}]))
    session.read(["telemetry"])
    nvml_simulator.reset_calls()
    assert reader(0, utilization=False) == {"memory": {101: GIB}, "utilization": None}
    assert nvml_simulator.calls_of("nvmlDeviceGetProcessUtilization") == 0
    assert reader.use.reads == 0
    reader(0)
    assert nvml_simulator.calls_of("nvmlDeviceGetProcessUtilization") == 2   # the size, then the samples
    assert reader.use.reads == 1


def test_a_card_that_cannot_tell_gives_none(scenario_file, session, reader):
    path, data = scenario_file("h100_sxm_x8")
    del data["devices"][0]["processes"]
    data["devices"][1]["errors"] = {"nvmlDeviceGetComputeRunningProcesses_v3": "UNKNOWN",
                                    "nvmlDeviceGetProcessUtilization": "UNKNOWN"}
    replace_json(path, data)
    session.read(["telemetry"])
    assert reader(0) == {"memory": None, "utilization": None}
    assert reader(1) == {"memory": None, "utilization": None}
    assert reader(99) is None   # no such card
    session.close()
    assert reader(0) is None    # no session: nothing is opened behind the reader's back


def test_a_mig_gpu_counts_its_mig_devices_processes_and_has_no_samples(scenario_file, session, reader, nvml_simulator):
    path, data = scenario_file("h100_mig_mixed")
    migs = data["devices"][0]["migDevices"]
    migs[0]["processes"] = [{"pid": 201, "usedGpuMemory": GIB, "smUtil": 10}]
    migs[1]["processes"] = [{"pid": 202, "usedGpuMemory": 2 * GIB}]
    replace_json(path, data)
    session.read(["telemetry"])
    nvml_simulator.reset_calls()
    assert reader(0, mig=True) == {"memory": {201: GIB, 202: 2 * GIB}, "utilization": None}
    assert nvml_simulator.calls_of("nvmlDeviceGetProcessUtilization") == 0
