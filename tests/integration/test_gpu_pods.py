"""A pod gets its GPU, and only its GPU, on a real node configured by the roles' defaults.

The node (harness.gpu_node): the real kubelet on containerd 2 with runc and NVIDIA's own runtime, nvidia-ctk and
CDI hook built from the Go module proxy, both configured by the container_toolkit role's own tasks with their
defaults, and a CDI specification written by NVIDIA's nvidia-ctk for h100_sxm_x8's GPUs. The device_plugin role
applies its RuntimeClass and NVIDIA's device plugin DaemonSet exactly as it renders them; only the image is
replaced (harness.gpu_images): one whose program loads NVML in its container and serves what it finds the way
NVIDIA's plugin does for the DaemonSet's device list strategy. Workload pods are off the host's network, run an
image that sets ``NVIDIA_VISIBLE_DEVICES=all``, as CUDA base images do, and print the device nodes and GPUs they
reach.

The cases are those of the secure accelerator access test of the Kubernetes AI conformance (a pod with a GPU
request finds its GPU, a pod without one finds none, a second container of the same pod without a request finds
none), and the variable in the pod's environment or a RuntimeClass naming NVIDIA's runtime without a request.
Under the settings before isolation (test_nvidia_runtime), the variable alone gives a container every GPU.
"""

from __future__ import annotations

import json

import pytest

from harness.containerd import containerd2, debian_containerd
from harness.gpu_images import container_log
from harness.gpu_node import PLUGIN_NAMESPACE, GpuNode

NODE = "gpu-pods-node"
NAMESPACE = "gpu-pods"
CONTROL = {"nvidiactl", "nvidia-uvm"}


@pytest.fixture(scope="module", params=["containerd-2", "containerd-1.7", "containerd-1.6"])
def gpu_node(request, access, ansible, tmp_path_factory):
    """The node, NVIDIA's device plugin DaemonSet running on it and its GPUs allocatable: on containerd 2 and 1.7
    (built from the proxy), and on Debian 12's containerd 1.6, which has no CDI of its own (NVIDIA's runtime injects
    the devices on each)."""
    binary = {"containerd-1.6": debian_containerd, "containerd-1.7": lambda: containerd2("1.7"),
              "containerd-2": lambda: None}[request.param]()
    node = GpuNode(access, ansible, tmp_path_factory.mktemp("gpu-pods"), NODE, containerd=binary)
    with node.running(NAMESPACE):
        node.deploy_device_plugin()
        yield node


def test_the_plugin_pod_loads_nvml_through_the_runtime_class_and_offers_every_gpu(access, gpu_node):
    (plugin,) = json.loads(access.kubectl("get", "pods", "-n", PLUGIN_NAMESPACE, "-o", "json").stdout)["items"]
    assert plugin["spec"]["runtimeClassName"] == "nvidia"
    assert plugin["spec"]["containers"][0]["securityContext"].get("privileged") is not True
    lines = container_log(gpu_node.kubelet, PLUGIN_NAMESPACE, plugin["metadata"]["name"], "nvidia-device-plugin-ctr")
    assert [line.split(" ", 1)[1] for line in lines if line.startswith("nvml ")] == gpu_node.root.uuids, lines
    assert "registered" in lines
    assert gpu_node.kubelet.allocatable("nvidia.com/gpu") == "8"


def test_a_pod_that_asks_for_one_gpu_sees_exactly_that_gpu(gpu_node):
    views = gpu_node.views(gpu_node.pod(NAMESPACE, "one-gpu", [("trainer", 1, {})]))
    devices, uuids = views["trainer"]
    gpus = sorted(device for device in devices if device not in CONTROL)
    assert len(gpus) == 1 and devices == set(gpus) | CONTROL, views
    assert uuids == [gpu_node.root.uuids[int(gpus[0][len("nvidia"):])]], views


def test_secure_access_a_pod_without_a_request_finds_no_gpu(gpu_node):
    views = gpu_node.views(gpu_node.pod(NAMESPACE, "no-gpu", [("worker", 0, {})]))
    assert views == {"worker": (set(), [])}


def test_secure_access_a_second_container_without_a_request_finds_no_gpu(gpu_node):
    views = gpu_node.views(gpu_node.pod(NAMESPACE, "two-containers", [("trainer", 1, {}), ("sidecar", 0, {})]))
    assert len(views["trainer"][1]) == 1 and views["trainer"][1][0] in gpu_node.root.uuids, views
    assert views["sidecar"] == (set(), []), views


@pytest.mark.parametrize("runtime_class, env", [
    (None, {"NVIDIA_VISIBLE_DEVICES": "all"}),
    ("nvidia", {}),
    ("nvidia", {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "all"}),
])
def test_the_variable_or_the_runtime_class_without_a_request_gives_no_gpu(gpu_node, runtime_class, env):
    views = gpu_node.views(gpu_node.pod(NAMESPACE, "asks-nothing", [("worker", 0, env)], runtime_class))
    assert views == {"worker": (set(), [])}
