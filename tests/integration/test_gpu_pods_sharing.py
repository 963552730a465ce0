"""A GPU shared by time-slicing: the node offers each GPU as two replicas, and a pod given one sees exactly one GPU.

The node is test_gpu_pods's on containerd 2 (harness.gpu_node). The device_plugin role deploys NVIDIA's device plugin
with one config in device_plugin_configs, time-slicing nvidia.com/gpu into 2 replicas: it applies the configs'
ConfigMap, labels the node nvidia.com/device-plugin.config with the config's name, and renders the DaemonSet with
NVIDIA's config manager (an init container and a sidecar, from the plugin's image) writing /config/config.yaml, the
plugin's CONFIG_FILE. Only the image is replaced: the tests' plugin (tools/device-plugin-image) reads that file and
offers <UUID>::0 and <UUID>::1 for each GPU, as NVIDIA's does; run as config-manager, it links the DaemonSet's
DEFAULT_CONFIG (the pods cannot reach the API server to read the node's label, which names the same config here).
"""

from __future__ import annotations

import json

import pytest

from harness.control_plane import read_object
from harness.gpu_images import GPUS_IMAGE, container_log
from harness.gpu_node import PLUGIN_NAMESPACE, GpuNode, sharing_labels
from harness.nvidia_toolkit import CONTROL_NODES

NODE = "gpu-sharing-node"
NAMESPACE = "gpu-sharing"
CONFIG = "ts-2"
SLICING = {"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}}


@pytest.fixture(scope="module")
def gpu_node(access, ansible, tmp_path_factory):
    """h100_sxm_x8's node with the plugin deployed under the time-slicing config, its 16 replicas allocatable."""
    node = GpuNode(access, ansible, tmp_path_factory.mktemp("gpu-sharing"), NODE)
    with node.running(NAMESPACE):
        # the MPS root the DaemonSet mounts for every config, in the test's folder rather than the host's /run
        node.deploy_device_plugin({"device_plugin_configs": {CONFIG: SLICING},
                                   "device_plugin_mps_root": str(node.work / "mps")},
                                  {"nvidia.com/gpu": 2 * len(node.root.uuids)})
        yield node


def test_the_plugin_offers_two_replicas_of_every_gpu_from_the_chosen_config(access, gpu_node):
    assert read_object(access, "node", NODE)["metadata"]["labels"]["nvidia.com/device-plugin.config"] == CONFIG
    (plugin,) = json.loads(access.kubectl("get", "pods", "-n", PLUGIN_NAMESPACE, "-o", "json").stdout)["items"]
    lines = container_log(gpu_node.kubelet, PLUGIN_NAMESPACE, plugin["metadata"]["name"], "nvidia-device-plugin-ctr")
    assert "registered nvidia.com/gpu (16 devices, 2 replicas each)" in lines, lines
    assert gpu_node.kubelet.allocatable("nvidia.com/gpu") == "16"


def test_a_pod_given_one_replica_sees_exactly_one_gpu(gpu_node):
    views = gpu_node.views(gpu_node.pod(NAMESPACE, "one-replica", [("trainer", 1, {})]))
    devices, uuids = views["trainer"]
    gpus = sorted(device for device in devices if device not in CONTROL_NODES)
    assert len(gpus) == 1 and devices == set(gpus) | CONTROL_NODES, views
    assert uuids == [gpu_node.root.uuids[int(gpus[0][len("nvidia"):])]], views


def test_validation_runs_one_more_pod_than_gpus_at_once_on_the_shared_node(access, gpu_node):
    """scv.gpu.node_validate's sharing check: 9 pods, one replica each, all running at once on 8 GPUs."""
    access.kubectl("label", "node", NODE, *sharing_labels(2, len(gpu_node.root.uuids)), "--overwrite")
    try:
        ((succeeded, result),) = gpu_node.ansible.modules([("scv.gpu.node_validate", {
            "name": NODE, "kubeconfig": str(access.admin_kubeconfig), "namespace": "sharing-validation",
            "workload_image": GPUS_IMAGE, "workload_command": ["/usr/bin/gpus", "--require", "1"],
            "probe_image": GPUS_IMAGE, "probe_command": ["/usr/bin/gpus", "--require", "0"],
            "holder_command": ["/usr/bin/gpus", "--wait"], "image_pull_policy": "Never", "timeout": 60})],
            gpu_node.work)
        assert succeeded, result
        found = {item["check"]: (item["outcome"], item["reason"]) for item in result["checks"]}
        assert found == {"workload": ("passed", ""), "second_container": ("passed", ""),
                         "no_request": ("passed", ""), "sharing": ("passed", ""),
                         "metrics": ("skipped", "no metrics URL of the node's agent was given")}, found
        assert not access.kubectl("get", "pods", "-n", "sharing-validation", "-o", "name").stdout.strip()
    finally:
        access.kubectl("label", "node", NODE, "nvidia.com/gpu.replicas-", "nvidia.com/gpu.count-")
