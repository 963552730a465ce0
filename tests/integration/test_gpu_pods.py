"""A pod gets its GPU, and only its GPU, on a real node configured by the roles' defaults.

The node: the real kubelet on containerd 2 (tools/containerd/build) with runc, and NVIDIA's own
nvidia-container-runtime, nvidia-ctk and CDI hook built from the Go module proxy. The container_toolkit role's own
tasks, with their defaults, configure both: containerd's config.toml (the nvidia runtime, nvidia the default, CDI
on) and NVIDIA's config.toml (isolation, cdi mode), the host's own settings kept (the CDI folder, runc
underneath). The CDI specification is what NVIDIA's ``nvidia-ctk cdi generate`` writes for h100_sxm_x8 from a
driver root of the test's own (harness.nvidia_toolkit): inside a container, NVML answers for the GPUs whose device
nodes it was given. The real kube-scheduler and the controller manager's DaemonSet controller run.

The device_plugin role applies its RuntimeClass and NVIDIA's device plugin DaemonSet exactly as it renders them;
only the image is replaced (harness.gpu_images): one whose program loads NVML in its container and serves what it
finds the way NVIDIA's plugin does for the DaemonSet's device list strategy. Workload pods run an image that sets
``NVIDIA_VISIBLE_DEVICES=all``, as CUDA base images do, and print the device nodes and GPUs they reach.

The cases are those of the secure accelerator access test of the Kubernetes AI conformance (a pod with a GPU
request finds its GPU, a pod without one finds none, a second container of the same pod without a request finds
none), and the variable in the pod's environment or a RuntimeClass naming NVIDIA's runtime without a request.
Under the settings before isolation (test_nvidia_runtime), the variable alone gives a container every GPU.
"""

from __future__ import annotations

import json

import pytest

from harness.ansible import recap
from harness.common import wait_until
from harness.control_plane import read_object
from harness.containerd import containerd2
from harness.controller_manager import ControllerManager
from harness.gpu_images import DEVICE_PLUGIN_IMAGE, GPUS_IMAGE, container_log, gpu_images
from harness.nvidia_toolkit import DriverRoot, host_config, seen, toolkit
from harness.paths import scenario_path
from harness.real_kubelet import Containerd, Kubelet, running_node
from harness.scheduler import Scheduler

NODE = "gpu-pods-node"
NAMESPACE = "gpu-pods"
PLUGIN_NAMESPACE = "gpu-pods-plugin"
CONTROL = {"nvidiactl", "nvidia-uvm"}
TOOLKIT_PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Configure containerd as the role does
      ansible.builtin.include_role:
        name: scv.gpu.container_toolkit
        tasks_from: containerd.yml
    - name: Configure NVIDIA's runtime as the role does
      ansible.builtin.include_role:
        name: scv.gpu.container_toolkit
        tasks_from: runtime-config.yml
"""
PLUGIN_PLAY = "- hosts: localhost\n  gather_facts: false\n  roles:\n    - role: scv.gpu.device_plugin\n"


def configure(ansible, work, containerd, runtime_config, bin_dir):
    """The container_toolkit role's tasks for containerd and NVIDIA's runtime, with the role's defaults."""
    play = work / "toolkit.yml"
    play.write_text(TOOLKIT_PLAY)
    variables = {"container_toolkit_containerd_config": str(containerd.config),
                 "container_toolkit_runtime_config": str(runtime_config),
                 "container_toolkit_runtime_path": str(bin_dir / "nvidia-container-runtime"),
                 "container_toolkit_restart_runtime": False}
    done = ansible.playbook(play, None, "-e", json.dumps(variables))
    assert done.returncode == 0, done.stdout + done.stderr
    assert recap(done.stdout)["changed"] == 2, done.stdout


@pytest.fixture(scope="module")
def gpu_node(access, ansible, tmp_path_factory):
    """(kubelet, driver root) of the node, NVIDIA's device plugin DaemonSet running on it and its GPUs allocatable."""
    work = tmp_path_factory.mktemp("gpu-pods")
    bin_dir = toolkit()
    root = DriverRoot(work / "driver-root", scenario_path("h100_sxm_x8"))
    spec_dir = work / "cdi"
    root.generate(spec_dir / "nvidia.yaml", bin_dir)
    runtime_config = host_config(bin_dir, work / "nvidia-container-runtime.toml", spec_dir)
    containerd = Containerd(work, containerd2(), [spec_dir], gpu_images(work / "images"),
                            {"NVIDIA_CTK_CONFIG_FILE_PATH": str(runtime_config)}, pod_network=True)
    configure(ansible, work, containerd, runtime_config, bin_dir)
    kubelet = Kubelet(access, work, NODE, containerd)
    parts = [containerd, kubelet, Scheduler(access, work / "scheduler"),
             ControllerManager(access, work / "controller-manager", ["daemonset-controller"])]
    # what kube-controller-manager's ServiceAccount and root CA publisher would make: the plugin's pod mounts a token
    access.kubectl("create", "namespace", PLUGIN_NAMESPACE, check=False)
    access.kubectl("create", "serviceaccount", "default", "-n", PLUGIN_NAMESPACE, check=False)
    access.kubectl("create", "configmap", "kube-root-ca.crt", "-n", PLUGIN_NAMESPACE,
                   "--from-file=ca.crt=%s" % access.state["ca"], check=False)
    with running_node(access, NODE, NAMESPACE, parts):
        try:
            access.kubectl("label", "node", NODE, "gpu/nvidia=NVIDIA-H100-80GB-HBM3", "--overwrite")
            play = work / "device-plugin.yml"
            play.write_text(PLUGIN_PLAY)
            done = ansible.playbook(play, None, "-e", json.dumps({
                "device_plugin_kubeconfig": str(access.admin_kubeconfig), "device_plugin_node_name": NODE,
                "device_plugin_namespace": PLUGIN_NAMESPACE, "device_plugin_labels": False,
                "device_plugin_nvidia_image": DEVICE_PLUGIN_IMAGE}))
            assert done.returncode == 0, done.stdout + done.stderr
            wait_until(lambda: kubelet.allocatable("nvidia.com/gpu") == "8", 120,
                       "nvidia.com/gpu: 8 allocatable from the plugin's pod (kubelet log %s)" % kubelet.log, 0.5,
                       log=lambda: "the plugin's output:\n%s" % "\n".join(
                           line for log in kubelet.pod_logs.glob("%s_*/*/*.log" % PLUGIN_NAMESPACE)
                           for line in log.read_text().splitlines()))
            yield kubelet, root
        finally:
            access.kubectl("delete", "daemonset", "nvidia-device-plugin-daemonset", "-n", PLUGIN_NAMESPACE,
                           "--ignore-not-found", check=False)
            access.kubectl("delete", "pods", "--all", "-n", PLUGIN_NAMESPACE, "--grace-period", "1",
                           "--timeout", "60s", check=False)


def pod(name, containers, runtime_class=None):
    """A pod of GPUS_IMAGE containers: [(name, GPUs asked for, extra environment)]."""
    spec = {"hostNetwork": True, "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 1,
            "tolerations": [{"operator": "Exists"}], "nodeSelector": {"kubernetes.io/hostname": NODE},
            "containers": [{"name": container, "image": GPUS_IMAGE, "imagePullPolicy": "Never",
                            "env": [{"name": key, "value": value} for key, value in env.items()],
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}}
                           for container, gpus, env in containers]}
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}


def run_pod(access, kubelet, manifest):
    """{container: (device nodes, NVML's UUIDs)} of ``manifest`` once it runs and each container has printed."""
    name = manifest["metadata"]["name"]
    access.kubectl("create", "-f", "-", input_text=json.dumps(manifest))
    try:
        def running():
            found = read_object(access, "pod", name, namespace=NAMESPACE, missing_ok=True)
            return found and found["status"].get("phase") == "Running"

        wait_until(running, 90, "pod %s Running (kubelet log %s)" % (name, kubelet.log), 0.5)
        views = {}
        for container in manifest["spec"]["containers"]:
            wait_until(lambda c=container["name"]: container_log(kubelet, NAMESPACE, name, c), 30,
                       "the output of %s/%s" % (name, container["name"]), 0.2)
            views[container["name"]] = seen(container_log(kubelet, NAMESPACE, name, container["name"]))
        return views
    finally:
        access.kubectl("delete", "pod", name, "-n", NAMESPACE, "--grace-period", "1", "--timeout", "60s",
                       check=False)


def test_the_plugin_pod_loads_nvml_through_the_runtime_class_and_offers_every_gpu(access, gpu_node):
    kubelet, root = gpu_node
    (plugin,) = json.loads(access.kubectl("get", "pods", "-n", PLUGIN_NAMESPACE, "-o", "json").stdout)["items"]
    assert plugin["spec"]["runtimeClassName"] == "nvidia"
    assert plugin["spec"]["containers"][0]["securityContext"].get("privileged") is not True
    lines = container_log(kubelet, PLUGIN_NAMESPACE, plugin["metadata"]["name"], "nvidia-device-plugin-ctr")
    assert [line.split(" ", 1)[1] for line in lines if line.startswith("nvml ")] == root.uuids, lines
    assert "registered" in lines


def test_a_pod_that_asks_for_one_gpu_sees_exactly_that_gpu(access, gpu_node):
    kubelet, root = gpu_node
    views = run_pod(access, kubelet, pod("one-gpu", [("trainer", 1, {})]))
    devices, uuids = views["trainer"]
    gpus = sorted(device for device in devices if device not in CONTROL)
    assert len(gpus) == 1 and devices == set(gpus) | CONTROL, views
    assert uuids == [root.uuids[int(gpus[0][len("nvidia"):])]], views


def test_secure_access_a_pod_without_a_request_finds_no_gpu(access, gpu_node):
    kubelet, _root = gpu_node
    views = run_pod(access, kubelet, pod("no-gpu", [("worker", 0, {})]))
    assert views == {"worker": (set(), [])}


def test_secure_access_a_second_container_without_a_request_finds_no_gpu(access, gpu_node):
    kubelet, root = gpu_node
    views = run_pod(access, kubelet, pod("two-containers", [("trainer", 1, {}), ("sidecar", 0, {})]))
    assert len(views["trainer"][1]) == 1 and views["trainer"][1][0] in root.uuids, views
    assert views["sidecar"] == (set(), []), views


@pytest.mark.parametrize("runtime_class, env", [
    (None, {"NVIDIA_VISIBLE_DEVICES": "all"}),
    ("nvidia", {}),
    ("nvidia", {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "all"}),
])
def test_the_variable_or_the_runtime_class_without_a_request_gives_no_gpu(access, gpu_node, runtime_class, env):
    kubelet, _root = gpu_node
    views = run_pod(access, kubelet, pod("asks-nothing", [("worker", 0, env)], runtime_class))
    assert views == {"worker": (set(), [])}
