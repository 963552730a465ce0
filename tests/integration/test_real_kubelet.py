"""Pods on GPU series from a real kubelet: a device plugin registers nvidia.com/gpu, a pod is given two GPUs,
and the agent names that pod on those two GPUs' series, from the kubelet's own pod-resources socket, until the
pod ends. The node is ``real_kubelet``'s: the kubelet built from the control plane's Go module on Debian's
containerd, joined to the test control plane."""

from __future__ import annotations

import json

import pytest

from harness.agent import AgentProcess, pods_on_gpus
from harness.common import wait_until
from harness.control_plane import read_object
from harness.paths import scenario_uuids
from harness.real_kubelet import Containerd, DevicePlugin, Kubelet, gpu_pod

NODE = "kubelet-gpu-node"
NAMESPACE = "ml"
GPU = "nvidia.com/gpu"


@pytest.fixture(scope="module")
def real_node(access, tmp_path_factory):
    work = tmp_path_factory.mktemp("real-node")
    containerd = Containerd(work)
    kubelet = Kubelet(access, work, NODE, containerd)
    plugin = DevicePlugin(work, GPU, scenario_uuids("h100_sxm_x8"))
    # Without kube-controller-manager nobody creates a namespace's default ServiceAccount.
    access.kubectl("create", "namespace", NAMESPACE, check=False)
    access.kubectl("create", "serviceaccount", "default", "-n", NAMESPACE, check=False)
    try:
        containerd.start()
        kubelet.start()
        plugin.start()
        yield kubelet, plugin
    finally:
        access.kubectl("delete", "pods", "--all", "-n", NAMESPACE, "--grace-period", "1", "--timeout", "60s",
                       check=False)
        plugin.stop()
        kubelet.stop()
        containerd.stop()
        access.kubectl("delete", "node", NODE, "--ignore-not-found", check=False)
        access.kubectl("delete", "scv", NODE, "--ignore-not-found", check=False)


def _pod_phase(plane, name):
    pod = read_object(plane, "pod", name, namespace=NAMESPACE, missing_ok=True)
    return pod["status"].get("phase") if pod else None


def _agent(agent_command, plane, kubelet, directory):
    """The agent for the real node, reading its kubelet's pod-resources socket every second."""
    return AgentProcess(agent_command, plane, NODE, directory, scenario="h100_sxm_x8",
                        extra=("--pod-resources-socket", str(kubelet.pod_resources_socket),
                               "--pod-resources-interval", "1"))


def test_a_pod_given_gpus_by_the_kubelet_is_named_on_their_series_until_it_ends(
        access, agent_command, real_node, tmp_path):
    kubelet, plugin = real_node
    uuids = scenario_uuids("h100_sxm_x8")
    plugin.set_devices(uuids)
    # The kubelet took the plugin's registration and its eight devices as the Node's allocatable GPUs.
    wait_until(lambda: kubelet.allocatable(GPU) == "8", 60, "nvidia.com/gpu: 8 allocatable on %s" % NODE, 0.2)

    agent = _agent(agent_command, access, kubelet, tmp_path)
    nobody = [("", "", "")]
    try:
        agent.wait_for(lambda: pods_on_gpus(agent).get(0) == nobody, 30)
        access.kubectl("create", "-f", "-", input_text=json.dumps(gpu_pod("train", NAMESPACE, NODE, 2)))
        wait_until(lambda: _pod_phase(access, "train") == "Running", 90, "pod train Running", 0.5)

        # The kubelet asked the plugin for two devices; the agent names the pod on exactly those two GPUs.
        assert len(plugin.allocated[-1]) == 2, plugin.allocated
        given = sorted(uuids.index(device) for device in plugin.allocated[-1])
        holder = [("train", NAMESPACE, "trainer")]
        agent.wait_for(lambda: all(pods_on_gpus(agent)[gpu] == holder for gpu in given), 10)
        held = pods_on_gpus(agent)
        assert all(held[gpu] == nobody for gpu in range(8) if gpu not in given), held

        access.kubectl("delete", "pod", "train", "-n", NAMESPACE, "--grace-period", "1", "--timeout", "60s")
        agent.wait_for(lambda: all(gpus == nobody for gpus in pods_on_gpus(agent).values()), 30)
    finally:
        agent.stop()


def test_pods_sharing_a_gpu_by_time_slicing_are_all_named_on_its_series(access, agent_command, real_node, tmp_path):
    kubelet, plugin = real_node
    shared = scenario_uuids("h100_sxm_x8")[5]
    # Time-slicing as NVIDIA's plugin advertises it: replicas of one GPU, its UUID with a suffix each.
    plugin.set_devices([shared + "::0", shared + "::1"])
    wait_until(lambda: kubelet.allocatable(GPU) == "2", 60, "nvidia.com/gpu: 2 allocatable on %s" % NODE, 0.2)
    agent = _agent(agent_command, access, kubelet, tmp_path)
    nobody = [("", "", "")]
    try:
        for name in ("notebook-a", "notebook-b"):
            access.kubectl("create", "-f", "-", input_text=json.dumps(gpu_pod(name, NAMESPACE, NODE, 1)))
        for name in ("notebook-a", "notebook-b"):
            wait_until(lambda name=name: _pod_phase(access, name) == "Running", 90, "pod %s Running" % name, 0.5)
        both = [("notebook-a", NAMESPACE, "trainer"), ("notebook-b", NAMESPACE, "trainer")]
        agent.wait_for(lambda: pods_on_gpus(agent).get(5) == both, 10)
        held = pods_on_gpus(agent)
        assert all(held[gpu] == nobody for gpu in range(8) if gpu != 5), held

        access.kubectl("delete", "pod", "notebook-a", "-n", NAMESPACE, "--grace-period", "1", "--timeout", "60s")
        agent.wait_for(lambda: pods_on_gpus(agent)[5] == both[1:], 30)
    finally:
        agent.stop()
