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
from harness.control_plane import read_object
from harness.gpu_images import container_log
from harness.gpu_node import CRIO, PLUGIN_NAMESPACE, GpuNode
from harness.nvidia_toolkit import seen

NODE = "gpu-pods-node"
NAMESPACE = "gpu-pods"


@pytest.fixture(scope="module", params=["containerd-2", "containerd-1.7", "containerd-1.6", "cri-o"])
def gpu_node(request, access, ansible, tmp_path_factory):
    """The node, NVIDIA's device plugin DaemonSet running on it and its GPUs allocatable: on containerd 2 and 1.7
    (built from the proxy), on Debian 12's containerd 1.6, which has no CDI of its own, and on CRI-O (built from the
    proxy; NVIDIA's runtime injects the devices on each)."""
    binary = {"containerd-1.6": debian_containerd, "containerd-1.7": lambda: containerd2("1.7"),
              "containerd-2": lambda: None, "cri-o": lambda: CRIO}[request.param]()
    node = GpuNode(access, ansible, tmp_path_factory.mktemp("gpu-pods"), NODE, containerd=binary)
    node.release = request.param
    with node.running(NAMESPACE):
        node.deploy_device_plugin()
        yield node


def test_the_plugin_pod_loads_nvml_through_the_runtime_class_and_offers_every_gpu(access, gpu_node):
    (plugin,) = json.loads(access.kubectl("get", "pods", "-n", PLUGIN_NAMESPACE, "-o", "json").stdout)["items"]
    assert plugin["spec"]["runtimeClassName"] == "nvidia"
    assert plugin["spec"]["containers"][0]["securityContext"].get("privileged") is not True
    lines = container_log(gpu_node.kubelet, PLUGIN_NAMESPACE, plugin["metadata"]["name"], "nvidia-device-plugin-ctr")
    assert [line.split(" ", 1)[1] for line in lines if line.startswith("nvml ")] == gpu_node.root.uuids, lines
    assert "registered nvidia.com/gpu" in lines
    assert gpu_node.kubelet.allocatable("nvidia.com/gpu") == "8"


def test_a_pod_that_asks_for_one_gpu_sees_exactly_that_gpu(gpu_node):
    views = gpu_node.views(gpu_node.pod(NAMESPACE, "one-gpu", [("trainer", 1, {})]))
    gpu_node.only_gpu(views["trainer"])


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


def test_a_pod_whose_claim_the_dra_driver_prepared_sees_exactly_that_gpu(access, gpu_node):
    """The claim's CDI devices reach the container through the runtime's own CDI (containerd 1.7 and later), with
    NVIDIA's runtime as the default in front of runc: the container sees the one GPU the scheduler allocated."""
    if gpu_node.release == "containerd-1.6":
        pytest.skip("containerd 1.6 has no CDI of its own, and DRA hands a container its devices only through CDI")
    plugin = gpu_node.dra_plugin().start()
    try:
        access.kubectl("create", "-f", "-", input_text=json.dumps({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "one-gpu", "namespace": NAMESPACE},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1}}]}}}))
        pod = gpu_node.pod(NAMESPACE, "claimed", [("trainer", "claim", {}), ("sidecar", 0, {})], claim="one-gpu")
        views = {name: seen(lines) for name, lines in gpu_node.run_pod(pod, keep=True).items()}
        claim = read_object(access, "resourceclaim", "one-gpu", namespace=NAMESPACE)
        prepared = [result["device"] for result in claim["status"]["allocation"]["devices"]["results"]]
        minor = gpu_node.only_gpu(views["trainer"])
        assert prepared == ["gpu-%d" % minor], (prepared, views)
        assert views["sidecar"] == (set(), []), views
    finally:
        for kind, name in (("pod", "claimed"), ("resourceclaim", "one-gpu")):
            access.kubectl("delete", kind, name, "-n", NAMESPACE, "--ignore-not-found", "--grace-period", "1",
                           check=False)
        plugin.stop()
