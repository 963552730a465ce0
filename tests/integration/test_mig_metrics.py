"""A MIG node's series, as dcgm-exporter serves them by default: one set per GPU instance, labelled GPU_I_PROFILE and
GPU_I_ID beside its GPU's labels, with the instance's own memory and engine activity, the GPU's other readings
repeated, and the pods holding the instance's MIG devices. A real agent process against the real kube-apiserver, the
kubelet's pod-resources API from a stand-in, GPUs from the simulator."""

from __future__ import annotations

import json
import os
import signal

import pytest

from harness.agent import AgentProcess, change_scenario, node_for
from harness.kubelet_podresources import StandInKubelet, generate, pod
from harness.paths import scenario_path

MIXED = json.loads(scenario_path("h100_mig_mixed").read_text())
GPU0, GPU1 = (device["uuid"] for device in MIXED["devices"])
INSTANCES0 = [(entry["uuid"], entry["gpuInstanceId"]) for entry in MIXED["devices"][0]["migDevices"]]


def series(agent, name):
    """{(gpu, GPU_I_ID): labels} of the samples of ``name`` on the agent's /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(sample.labels["gpu"], sample.labels.get("GPU_I_ID")): dict(sample.labels, value=sample.value)
            for family in text_string_to_metric_families(agent.metrics_text())
            for sample in family.samples if sample.name == name}


@pytest.fixture
def mig_agent(access, agent_command, tmp_path, request):
    """An agent on two H100s with MIG on (four GPU instances and one), pods from a stand-in kubelet."""
    node = node_for(request)
    access.kubectl("delete", "scv", node, "--ignore-not-found")
    with StandInKubelet(generate(tmp_path / "generated"), tmp_path / "kubelet.sock") as kubelet:
        agent = AgentProcess(agent_command, access, node, tmp_path, scenario="h100_mig_mixed",
                             extra=("--counters-interval", "1", "--pod-resources-socket", kubelet.socket,
                                    "--pod-resources-interval", "1"))
        try:
            yield agent, kubelet
        finally:
            agent.stop()
            access.kubectl("delete", "scv", node, "--ignore-not-found")


def test_each_gpu_instance_has_series_of_its_own_and_its_gpu_none(mig_agent):
    agent, _kubelet = mig_agent
    agent.wait_for(lambda: series(agent, "DCGM_FI_PROF_GR_ENGINE_ACTIVE")[("0", "1")]["value"] == 0.62, 20)
    used = series(agent, "DCGM_FI_DEV_FB_USED")
    assert sorted(used) == [("0", "1"), ("0", "2"), ("0", "3"), ("0", "4"), ("1", "1")]   # no GPU-wide series
    first = used[("0", "1")]
    assert (first["GPU_I_PROFILE"], first["UUID"], first["device"], first["modelName"]) == (
        "3g.40gb", GPU0, "nvidia0", "NVIDIA H100 80GB HBM3")
    assert used[("1", "1")]["GPU_I_PROFILE"] == "7g.80gb"
    # each instance's own memory: the 3g.40gb has 40448 MiB in all, the 1g.10gb 9984
    free, reserved = series(agent, "DCGM_FI_DEV_FB_FREE"), series(agent, "DCGM_FI_DEV_FB_RESERVED")
    assert free[("0", "1")]["value"] + used[("0", "1")]["value"] + reserved[("0", "1")]["value"] == 40448
    assert free[("0", "3")]["value"] + used[("0", "3")]["value"] + reserved[("0", "3")]["value"] == 9984
    # the GPU's readings, repeated on each of its instances
    temperature = series(agent, "DCGM_FI_DEV_GPU_TEMP")
    assert sorted(temperature) == sorted(used)
    assert len({temperature[key]["value"] for key in temperature if key[0] == "0"}) == 1
    # each instance's own engine activity: only the 3g.40gb is busy
    tensor = series(agent, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")
    assert tensor[("0", "1")]["value"] == 0.35 and tensor[("0", "2")]["value"] == 0
    assert series(agent, "DCGM_FI_PROF_DRAM_ACTIVE")[("0", "1")]["value"] == 0.24
    # what NVML cannot give with MIG on, and what GPM gives only per GPU, is not served
    for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_PROF_PCIE_TX_BYTES",
                 "DCGM_FI_DEV_XID_ERRORS"):
        assert series(agent, name) == {}, name
    # the agent's own gauges stay per GPU
    assert len(series(agent, "scv_gpu_memory_total_mib")) == 2


def test_pods_are_named_on_the_instance_whose_mig_device_they_hold_and_leave_when_they_end(mig_agent):
    agent, kubelet = mig_agent
    (small, small_id), (twin, twin_id) = INSTANCES0[2], INSTANCES0[3]
    kubelet.pods = [pod("infer", "ml", ("server", [("nvidia.com/mig-1g.10gb", [small])])),
                    pod("batch", "ml", ("worker", [("nvidia.com/mig-1g.10gb", [twin + "::1"])]))]
    agent.wait_for(lambda: series(agent, "DCGM_FI_DEV_FB_USED")[("0", str(small_id))]["pod"] == "infer", 20)
    used = series(agent, "DCGM_FI_DEV_FB_USED")
    named = {key: (labels["pod"], labels["namespace"], labels["container"], labels["vgpu"])
             for key, labels in used.items() if labels.get("pod")}
    assert named == {("0", str(small_id)): ("infer", "ml", "server", ""),
                     ("0", str(twin_id)): ("batch", "ml", "worker", "1")}
    kubelet.pods = []
    agent.wait_for(lambda: not any(labels.get("pod") for labels in series(agent, "DCGM_FI_DEV_FB_USED").values()), 20)


def test_instances_made_and_destroyed_appear_and_leave_without_a_restart(mig_agent):
    agent, _kubelet = mig_agent
    agent.wait_for(lambda: ("1", "1") in series(agent, "DCGM_FI_DEV_FB_USED"), 20)
    pid = agent.process.pid

    def one_instance_less(scenario):   # as nvidia-smi mig -dci -dgi would leave GPU 0
        scenario["devices"][0]["migDevices"].pop()

    change_scenario(agent, one_instance_less)
    agent.wait_for(lambda: ("0", str(INSTANCES0[3][1])) not in series(agent, "DCGM_FI_DEV_FB_USED"), 20)

    def split_the_whole_gpu(scenario):   # GPU 1's 7g.80gb made into a 4g.40gb and a 3g.40gb
        whole = scenario["devices"][1]["migDevices"][0]
        halves = [dict(whole, uuid=whole["uuid"][:-4] + "4g00", gpuInstanceId=1, placement=0,
                       name=whole["name"].replace("7g.80gb", "4g.40gb")),
                  dict(whole, uuid=whole["uuid"][:-4] + "3g00", gpuInstanceId=2, placement=4,
                       name=whole["name"].replace("7g.80gb", "3g.40gb"))]
        scenario["devices"][1]["migDevices"] = halves

    change_scenario(agent, split_the_whole_gpu)
    os.kill(pid, signal.SIGHUP)   # as the mig_layout role does after it changes a layout
    agent.wait_for(lambda: {key: labels["GPU_I_PROFILE"] for key, labels in series(agent, "DCGM_FI_DEV_FB_USED").items()
                            if key[0] == "1"} == {("1", "1"): "4g.40gb", ("1", "2"): "3g.40gb"}, 20)
    assert agent.process.poll() is None and agent.process.pid == pid
