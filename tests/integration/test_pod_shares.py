"""Each pod's own memory and utilization on a GPU that pods share by time-slicing, from a real agent process.

The pods' processes are real: child processes of the test, each put in a cgroup whose path names its pod's
UID as the kubelet's cgroupfs driver does (``.../pod<uid>/<container>``), so the agent finds their pods through
``/proc/<pid>/cgroup`` as it would on a node. The scenario's ``processes`` name their PIDs, with the memory and
utilization samples NVML would give; the kubelet's pod logs directory names the pods; a stand-in kubelet says
which replica of the GPU each pod holds. A test with a real kubelet does the same with its pods' PIDs.
"""

from __future__ import annotations

import json
import uuid as uuids_module

import pytest

from harness.agent import AgentProcess
from harness.common import replace_json
from harness.kubelet_podresources import StandInKubelet, generate, pod
from harness.pod_cgroups import PodProcesses, cgroup_root
from harness.paths import scenario_uuids

GPU = "nvidia.com/gpu"
MIB = 1 << 20


@pytest.fixture
def pod_processes():
    root = cgroup_root()
    if root is None:
        pytest.skip("needs root and a writable cgroup hierarchy to put processes in a pod's cgroup")
    made = PodProcesses(root)
    try:
        yield made
    finally:
        made.stop()


@pytest.fixture
def kubelet(tmp_path):
    with StandInKubelet(generate(tmp_path / "podresources"), tmp_path / "kubelet.sock") as server:
        yield server


def shares_of(agent, gpu="1"):
    """{(metric, pod): (value, labels)} of the per-pod memory and utilization series of GPU ``gpu``."""
    from prometheus_client.parser import text_string_to_metric_families

    found = {}
    for family in text_string_to_metric_families(agent.metrics_text()):
        for sample in family.samples:
            if sample.name in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_UTIL") and sample.labels["gpu"] == gpu:
                found[(sample.name, sample.labels.get("pod", ""))] = (sample.value, sample.labels)
    return found


def test_each_pod_on_a_time_sliced_gpu_shows_its_own_memory_and_utilization(
        access, agent_command, node, tmp_path, kubelet, pod_processes):
    gpu = scenario_uuids("h100_sxm_x8")[1]
    uids = {name: str(uuids_module.uuid4()) for name in ("a", "b", "c", "d")}
    logs = tmp_path / "pod-logs"
    for name, uid in uids.items():
        (logs / ("ml_%s_%s" % (name, uid))).mkdir(parents=True)
    pids = {name: pod_processes.start(uids[name]) for name in ("a", "b", "c")}     # d holds a replica, runs nothing
    kubelet.pods = [pod(name, "ml", ("main", [(GPU, ["%s::%d" % (gpu, replica)])]))
                    for replica, name in enumerate(("a", "b", "c", "d"))]
    agent = AgentProcess(agent_command, access, node, tmp_path, scenario="h100_sxm_x8",
                         extra=("--pod-resources-socket", kubelet.socket, "--pod-resources-interval", "1",
                                "--pod-logs-dir", str(logs), "--pod-utilization", "true"))
    data = json.loads(agent.scenario.read_text())
    data["devices"][1]["utilization"]["gpu"] = 80
    data["devices"][1]["processes"] = [
        {"pid": pids["a"], "usedGpuMemory": 1024 * MIB, "smUtil": 30},
        {"pid": pids["b"], "usedGpuMemory": 2048 * MIB, "smUtil": 50},
        {"pid": pids["c"], "usedGpuMemory": 3072 * MIB},            # never sampled: utilization unknown
        {"pid": 4000, "usedGpuMemory": 512 * MIB, "smUtil": 5}]      # a process of no pod
    replace_json(agent.scenario, data)
    fb, util = "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_UTIL"
    try:
        agent.wait_for(lambda: shares_of(agent).get((fb, "b"), (None,))[0] == 2048, 20)
        shares = shares_of(agent)
        assert {key: value for key, (value, _labels) in shares.items()} == {
            (fb, ""): shares[(fb, "")][0], (fb, "a"): 1024, (fb, "b"): 2048, (fb, "c"): 3072, (fb, "d"): 0,
            (util, ""): 80, (util, "a"): 30, (util, "b"): 50, (util, "d"): 0}
        labels = shares[(fb, "c")][1]
        assert (labels["namespace"], labels["container"], labels["vgpu"], labels["pod_uid"]) == \
            ("ml", "main", "2", uids["c"])
        # a pod's process grows: the next scrape shows it
        data["devices"][1]["processes"][1]["usedGpuMemory"] = 4096 * MIB
        replace_json(agent.scenario, data)
        agent.wait_for(lambda: shares_of(agent)[(fb, "b")][0] == 4096, 10)
        assert agent.metrics()["scv_agent_shared_gpu_reads_total"] >= 2
    finally:
        agent.stop()
