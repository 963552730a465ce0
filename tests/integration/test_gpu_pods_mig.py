"""A pod that asks for a MIG device gets exactly that MIG device, on a real node configured by the roles' defaults.

The node is harness.gpu_node's (the real kubelet on containerd 2, runc and NVIDIA's own runtime, configured by the
container_toolkit role's defaults) with h100_mig_mixed's GPUs: the first H100 cut into 3g.40gb, 2g.20gb and two
1g.10gb, the second into one 7g.80gb. NVIDIA's ``nvidia-ctk cdi generate`` writes the spec from the driver root's
mig-minors, naming each MIG device by its UUID with its GPU's node and its two capability nodes. The device_plugin
role deploys NVIDIA's plugin DaemonSet with ``device_plugin_mig_strategy: mixed``; the tests' plugin image serves
each profile as ``nvidia.com/mig-<profile>`` by the MIG devices' UUIDs under the role's volume-mount device lists.

Inside a container, the NVML simulator lists a MIG device only where the container has its capability nodes, as the
driver does: what the container sees is what NVIDIA's runtime gave it.
"""

from __future__ import annotations

import json

import pytest

from harness.gpu_node import GpuNode
from harness.nvidia_toolkit import CONTROL_NODES
from harness.paths import scenario_path

NODE = "gpu-pods-mig-node"
NAMESPACE = "gpu-pods-mig"
CONTROL = CONTROL_NODES
SCENARIO = "h100_mig_mixed"
GPUS = json.loads(scenario_path(SCENARIO).read_text())["devices"]
ONE_G = [mig for mig in GPUS[0]["migDevices"] if mig["name"].endswith(" 1g.10gb")]


def capability_nodes(gpu, mig):
    """The nvidia-caps nodes of MIG device ``mig`` of GPU ``gpu``, numbered as the driver's mig-minors file."""
    instance = 3 + gpu * 15 * 9 + mig["gpuInstanceId"] * 9
    return {"nvidia-caps", "nvidia-caps/nvidia-cap%d" % instance,
            "nvidia-caps/nvidia-cap%d" % (instance + 1 + mig["computeInstanceId"])}


@pytest.fixture(scope="module")
def mig_node(access, ansible, tmp_path_factory):
    node = GpuNode(access, ansible, tmp_path_factory.mktemp("gpu-pods-mig"), NODE, scenario=SCENARIO)
    with node.running(NAMESPACE):
        node.deploy_device_plugin({"device_plugin_mig_strategy": "mixed"}, {
            "nvidia.com/mig-1g.10gb": 2, "nvidia.com/mig-2g.20gb": 1, "nvidia.com/mig-3g.40gb": 1,
            "nvidia.com/mig-7g.80gb": 1})
        yield node


def test_the_plugin_offers_each_mig_profile_and_no_whole_gpu(mig_node):
    assert mig_node.kubelet.allocatable("nvidia.com/gpu") in (None, "0")


def test_a_pod_that_asks_for_one_mig_device_sees_exactly_that_mig_device(mig_node):
    views = mig_node.views(mig_node.pod(NAMESPACE, "one-mig", [("trainer", {"nvidia.com/mig-1g.10gb": 1}, {})]))
    devices, uuids = views["trainer"]
    assert uuids[0] == GPUS[0]["uuid"] and len(uuids) == 2, views
    (mig,) = [item for item in ONE_G if item["uuid"] == uuids[1]]
    assert devices == {"nvidia0"} | CONTROL | capability_nodes(0, mig), views


def test_a_pod_that_asks_for_the_other_gpus_mig_device_sees_only_that_gpu(mig_node):
    views = mig_node.views(mig_node.pod(NAMESPACE, "whole-7g", [("trainer", {"nvidia.com/mig-7g.80gb": 1}, {})]))
    (mig,) = GPUS[1]["migDevices"]
    assert views["trainer"] == ({"nvidia1"} | CONTROL | capability_nodes(1, mig), [GPUS[1]["uuid"], mig["uuid"]])


def test_a_second_container_without_a_request_finds_no_gpu_and_no_mig_device(mig_node):
    views = mig_node.views(mig_node.pod(NAMESPACE, "two-containers", [
        ("trainer", {"nvidia.com/mig-2g.20gb": 1}, {}), ("sidecar", 0, {"NVIDIA_VISIBLE_DEVICES": "all"})]))
    assert len(views["trainer"][1]) == 2, views
    assert views["sidecar"] == (set(), []), views
