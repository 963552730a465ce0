"""Pods on GPU series from a real kubelet: a device plugin registers nvidia.com/gpu, a pod is given two GPUs,
and the agent names that pod on those two GPUs' series, from the kubelet's own pod-resources socket, until the
pod ends. The node is ``real_kubelet``'s: the kubelet built from the control plane's Go module on Debian's
containerd, joined to the test control plane."""

from __future__ import annotations

import json
import pathlib

import pytest

from harness.agent import AgentProcess, pods_on_gpus
from harness.common import replace_json, wait_until
from harness.control_plane import read_object
from harness.paths import scenario_path, scenario_uuids
from harness.ansible import Ansible, venvs
from harness.real_kubelet import ConfigFollower, Containerd, DevicePlugin, Kubelet, gpu_pod, running_node

NODE = "kubelet-gpu-node"
NAMESPACE = "ml"
GPU = "nvidia.com/gpu"


@pytest.fixture(scope="module")
def real_node(access, tmp_path_factory):
    work = tmp_path_factory.mktemp("real-node")
    containerd = Containerd(work)
    kubelet = Kubelet(access, work, NODE, containerd)
    plugin = DevicePlugin(work, GPU, scenario_uuids("h100_sxm_x8"))
    with running_node(access, NODE, NAMESPACE, [containerd, kubelet, plugin]):
        yield kubelet, plugin


def _pod_phase(plane, name):
    pod = read_object(plane, "pod", name, namespace=NAMESPACE, missing_ok=True)
    return pod["status"].get("phase") if pod else None


def _agent(agent_command, plane, kubelet, directory):
    """The agent for the real node, reading its kubelet's pod-resources socket every second."""
    return AgentProcess(agent_command, plane, NODE, directory, scenario="h100_sxm_x8",
                        extra=("--pod-resources-socket", str(kubelet.pod_resources_socket),
                               "--pod-resources-interval", "1"))


def _eight_gpus(kubelet, plugin):
    """The plugin offers the eight GPUs of h100_sxm_x8, and the kubelet has them as the Node's allocatable GPUs."""
    uuids = scenario_uuids("h100_sxm_x8")
    plugin.set_devices(uuids)
    wait_until(lambda: kubelet.allocatable(GPU) == "8", 60, "nvidia.com/gpu: 8 allocatable on %s" % NODE, 0.2)
    return uuids


def test_a_pod_given_gpus_by_the_kubelet_is_named_on_their_series_until_it_ends(
        access, agent_command, real_node, tmp_path):
    kubelet, plugin = real_node
    uuids = _eight_gpus(kubelet, plugin)

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


def _uid_and_app(agent, gpu):
    """The pod_uid and app labels of GPU ``gpu``'s temperature series (those present)."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(agent.metrics_text()):
        for sample in family.samples:
            if sample.name == "DCGM_FI_DEV_GPU_TEMP" and sample.labels["gpu"] == str(gpu):
                return {key: sample.labels[key] for key in ("pod_uid", "app", "tier") if sample.labels.get(key)}
    return None


def test_a_pods_uid_and_labels_are_read_as_the_node_and_follow_the_pod_made_again_under_its_name(
        access, agent_command, real_node, tmp_path):
    kubelet, plugin = real_node
    uuids = _eight_gpus(kubelet, plugin)
    # the kubelet's own identity (system:node:<node>), its pod logs directory and its pod-resources socket
    agent = AgentProcess(agent_command, access, NODE, tmp_path, scenario="h100_sxm_x8", extra=(
        "--pod-resources-socket", str(kubelet.pod_resources_socket), "--pod-resources-interval", "1",
        "--pod-logs-dir", str(kubelet.pod_logs), "--kubernetes-enable-pod-uid", "--kubernetes-enable-pod-labels",
        "--kubernetes-pod-label-allowlist-regex", "^app$"))
    uids = []
    try:
        for app in ("trainer", "trainer-2"):
            body = gpu_pod("train", NAMESPACE, NODE, 1)
            body["metadata"]["labels"] = {"app": app, "tier": "gold"}
            access.kubectl("create", "-f", "-", input_text=json.dumps(body))
            wait_until(lambda: _pod_phase(access, "train") == "Running", 90, "pod train Running", 0.5)
            uids.append(read_object(access, "pod", "train", namespace=NAMESPACE)["metadata"]["uid"])
            gpu = uuids.index(plugin.allocated[-1][0])
            agent.wait_for(lambda gpu=gpu, app=app: _uid_and_app(agent, gpu) == {"pod_uid": uids[-1], "app": app}, 20)
            access.kubectl("delete", "pod", "train", "-n", NAMESPACE, "--grace-period", "1", "--timeout", "60s")
        assert uids[0] != uids[1] and agent.metrics()["scv_agent_pod_metadata_failures_total"] == 0
        agent.wait_for(lambda: not any(_uid_and_app(agent, gpu) for gpu in range(8)), 30)
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


# The device plugin configs the role deploys for the sharing tests, in NVIDIA's format.
CONFIGS = {
    "time-slicing-4": {"version": "v1", "sharing": {"timeSlicing": {
        "resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}},
    "time-slicing-4-strict": {"version": "v1", "sharing": {"timeSlicing": {
        "failRequestsGreaterThanOne": True, "resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}},
    "mps-2": {"version": "v1", "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}},
    "time-slicing-4-renamed": {"version": "v1", "sharing": {"timeSlicing": {
        "renameByDefault": True, "resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}},
}
SHARING_NAMESPACE = "dp-sharing"
SHARED_SCENARIO = "h100_real"     # one H100: every replica is of the same GPU


def _device_plugin_role(tmp_path, plane, choice, **settings):
    """The device_plugin role for the real node, with CONFIGS, the node choosing ``choice``."""
    play = tmp_path / "device-plugin.yml"
    play.write_text("- hosts: localhost\n  gather_facts: false\n  roles:\n    - role: scv.gpu.device_plugin\n")
    no_pci = tmp_path / "sys-without-gpus"
    no_pci.mkdir(exist_ok=True)
    variables = {"device_plugin_kubeconfig": str(plane.admin_kubeconfig), "device_plugin_sysfs": str(no_pci),
                 "device_plugin_node_name": NODE, "device_plugin_namespace": SHARING_NAMESPACE,
                 "device_plugin_nvidia_image": "registry.example.com/k8s-device-plugin:v0.20.0",
                 "device_plugin_configs": CONFIGS, "device_plugin_default_config": "time-slicing-4",
                 "device_plugin_config": choice}
    variables.update(settings)
    done = Ansible(venvs()[-1]).playbook(str(play), SHARED_SCENARIO, "-e", json.dumps(variables))
    assert done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.fixture
def follower(access, real_node, tmp_path):
    """NVIDIA's plugin as the node's config makes it (harness.real_kubelet.ConfigFollower), in place of the
    module's plugin, which gets its eight GPUs back afterwards."""
    kubelet, plugin = real_node
    access.kubectl("create", "namespace", SHARING_NAMESPACE, check=False)
    # whole GPUs without MIG: their UUIDs are all offered_devices reads
    fact = {"nvml_available": True, "cardList": [{"uuid": uuid, "model": "NVIDIA H100 80GB HBM3"}
                                                 for uuid in scenario_uuids(SHARED_SCENARIO)]}
    follower = ConfigFollower(access, tmp_path, NODE, fact, "nvidia-device-plugin-configs", SHARING_NAMESPACE,
                              plugins={GPU: plugin})
    try:
        yield follower
    finally:
        access.kubectl("delete", "pods", "--all", "-n", NAMESPACE, "--grace-period", "1", "--timeout", "60s",
                       check=False)
        follower.stop(keep=[GPU])
        plugin.one_replica_each = False
        plugin.set_devices(scenario_uuids("h100_sxm_x8"))


def test_moving_a_node_to_another_config_changes_what_it_offers(access, real_node, follower, tmp_path):
    """Two configs deployed by the role; the node's label moves from time-slicing x4 to MPS x2 by a rerun with
    another choice, and the kubelet's allocatable follows, with GFD's sharing labels."""
    kubelet, _plugin = real_node
    _device_plugin_role(tmp_path, access, "time-slicing-4")
    assert follower.sync() == {GPU: [scenario_uuids(SHARED_SCENARIO)[0] + "::%d" % n for n in range(4)]}
    wait_until(lambda: kubelet.allocatable(GPU) == "4", 60, "4 replicas allocatable on %s" % NODE, 0.2)
    labels = read_object(access, "node", NODE)["metadata"]["labels"]
    assert (labels["nvidia.com/gpu.replicas"], labels["nvidia.com/gpu.sharing-strategy"],
            labels["nvidia.com/mps.capable"]) == ("4", "time-slicing", "false")
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-SHARED"

    _device_plugin_role(tmp_path, access, "mps-2")
    assert follower.config_name == "time-slicing-4"
    follower.sync()
    assert follower.config_name == "mps-2"
    wait_until(lambda: kubelet.allocatable(GPU) == "2", 60, "2 replicas allocatable on %s" % NODE, 0.2)
    labels = read_object(access, "node", NODE)["metadata"]["labels"]
    assert (labels["nvidia.com/gpu.replicas"], labels["nvidia.com/gpu.sharing-strategy"],
            labels["nvidia.com/mps.capable"]) == ("2", "mps", "true")


def test_renamed_shares_are_offered_as_their_own_resource_and_the_role_waits_for_them(
        access, real_node, follower, tmp_path):
    """renameByDefault: the replicas are nvidia.com/gpu.shared, nvidia.com/gpu is offered no more, the product has
    no -SHARED; device_plugin_verify_allocatable counts the renamed resource as the node's offer."""
    kubelet, _plugin = real_node
    access.kubectl("label", "node", NODE, "--overwrite", "nvidia.com/device-plugin.config=time-slicing-4-renamed")
    # the role's own ConfigMap first, then the node's plugin follows its label, then the role checks the offer
    _device_plugin_role(tmp_path, access, "time-slicing-4-renamed")
    follower.sync()
    wait_until(lambda: kubelet.allocatable(GPU + ".shared") == "4", 60, "4 shares allocatable on %s" % NODE, 0.2)
    wait_until(lambda: kubelet.allocatable(GPU) == "0", 60, "no whole GPU allocatable on %s" % NODE, 0.2)
    _device_plugin_role(tmp_path, access, "time-slicing-4-renamed", device_plugin_verify_allocatable=True,
                        device_plugin_wait_timeout=20, device_plugin_gpu_label_key="scv.test/shared-gpu")
    labels = read_object(access, "node", NODE)["metadata"]["labels"]
    assert (labels["nvidia.com/gpu.product"], labels["nvidia.com/gpu.replicas"]) == ("NVIDIA-H100-80GB-HBM3", "4")
    access.kubectl("label", "node", NODE, "scv.test/shared-gpu-")


def test_a_pod_asking_for_two_replicas_is_refused_under_fail_requests_greater_than_one(
        access, real_node, follower, tmp_path):
    kubelet, _plugin = real_node
    _device_plugin_role(tmp_path, access, "time-slicing-4-strict")
    follower.sync()
    wait_until(lambda: kubelet.allocatable(GPU) == "4", 60, "4 replicas allocatable on %s" % NODE, 0.2)
    access.kubectl("create", "-f", "-", input_text=json.dumps(gpu_pod("greedy", NAMESPACE, NODE, 2)))
    access.kubectl("create", "-f", "-", input_text=json.dumps(gpu_pod("modest", NAMESPACE, NODE, 1)))
    wait_until(lambda: _pod_phase(access, "greedy") == "Failed", 60, "pod greedy refused", 0.5)
    wait_until(lambda: _pod_phase(access, "modest") == "Running", 90, "pod modest Running", 0.5)
    status = read_object(access, "pod", "greedy", namespace=NAMESPACE)["status"]
    assert status["reason"] == "UnexpectedAdmissionError", status
    assert "maximum request size for shared resources is 1; found 2" in status["message"], status


def _container_pid(plane, name):
    """The PID of pod ``name``'s container, found as the agent finds pods: by its cgroup, which names it."""
    pod = read_object(plane, "pod", name, namespace=NAMESPACE)
    container = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    for entry in pathlib.Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and container in (entry / "cgroup").read_text():
                return int(entry.name)
        except OSError:
            continue
    raise AssertionError("no process in a cgroup of container %s (pod %s)" % (container, name))


def _memory_by_pod(agent):
    """{pod: (MiB, vgpu)} of GPU 0's per-pod DCGM_FI_DEV_FB_USED series ('' for the whole GPU's)."""
    from prometheus_client.parser import text_string_to_metric_families

    return {sample.labels.get("pod", ""): (sample.value, sample.labels.get("vgpu", ""))
            for family in text_string_to_metric_families(agent.metrics_text()) for sample in family.samples
            if sample.name == "DCGM_FI_DEV_FB_USED" and sample.labels["gpu"] == "0"}


def test_four_pods_time_slicing_one_gpu_each_show_their_own_memory(
        access, agent_command, real_node, follower, tmp_path):
    """Four pods on one GPU of four replicas run on the real kubelet; the agent names each on that GPU's
    memory series with its own figure, from its container's processes, and none once they end."""
    kubelet, _plugin = real_node
    _device_plugin_role(tmp_path, access, "time-slicing-4")
    follower.sync()
    wait_until(lambda: kubelet.allocatable(GPU) == "4", 60, "4 replicas allocatable on %s" % NODE, 0.2)
    names = ["infer-%d" % n for n in range(4)]
    for name in names:
        access.kubectl("create", "-f", "-", input_text=json.dumps(gpu_pod(name, NAMESPACE, NODE, 1)))
    for name in names:
        wait_until(lambda name=name: _pod_phase(access, name) == "Running", 90, "pod %s Running" % name, 0.5)
    agent = AgentProcess(agent_command, access, NODE, tmp_path, scenario=SHARED_SCENARIO,
                         extra=("--pod-resources-socket", str(kubelet.pod_resources_socket),
                                "--pod-resources-interval", "1", "--pod-logs-dir", str(kubelet.pod_logs)))
    try:
        data = json.loads(agent.scenario.read_text())
        # what NVML lists for the GPU: each pod's process with memory of its own (1 to 4 GiB)
        data["devices"][0]["processes"] = [{"pid": _container_pid(access, name), "usedGpuMemory": (n + 1) << 30}
                                           for n, name in enumerate(names)]
        replace_json(agent.scenario, data)
        want = {name: 1024.0 * (n + 1) for n, name in enumerate(names)}
        agent.wait_for(lambda: {pod: mib for pod, (mib, _vgpu) in _memory_by_pod(agent).items() if pod} == want, 20)
        assert sorted(vgpu for pod, (_mib, vgpu) in _memory_by_pod(agent).items() if pod) == ["0", "1", "2", "3"]

        for name in names:
            access.kubectl("delete", "pod", name, "-n", NAMESPACE, "--grace-period", "1", "--timeout", "60s")
        data["devices"][0]["processes"] = []        # their processes are gone, and NVML lists none
        replace_json(agent.scenario, data)
        agent.wait_for(lambda: list(_memory_by_pod(agent)) == [""], 30)
    finally:
        agent.stop()


MIG_SCENARIO = "h100_mig_mixed"   # GPU 0: a 3g.40gb, a 2g.20gb and two 1g.10gb; GPU 1: a 7g.80gb
SMALL = "nvidia.com/mig-1g.10gb"


def _mig_fact():
    """The scenario's GPUs as gpu_facts gives them, as far as offered_devices reads them."""
    data = json.loads(pathlib.Path(scenario_path(MIG_SCENARIO)).read_text())
    return {"nvml_available": True, "cardList": [
        {"uuid": device["uuid"], "model": device["name"], "migEnabled": True,
         "migDevices": [{"uuid": entry["uuid"], "profile": entry["name"].rsplit(" MIG ", 1)[1]}
                        for entry in device["migDevices"]]} for device in data["devices"]]}


def _instance_holders(agent):
    """{(gpu, GPU_I_ID): pod or ''} of the agent's FB_USED series."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(sample.labels["gpu"], sample.labels.get("GPU_I_ID")): sample.labels.get("pod", "")
            for family in text_string_to_metric_families(agent.metrics_text()) for sample in family.samples
            if sample.name == "DCGM_FI_DEV_FB_USED"}


def test_a_pod_given_a_mig_device_is_named_on_that_instance_under_the_mixed_strategy(
        access, agent_command, real_node, tmp_path):
    """NVIDIA's plugin under MIG strategy mixed offers each MIG device by its UUID as nvidia.com/mig-<profile>; the
    kubelet gives a pod one of the two 1g.10gb devices, and the agent names the pod on exactly that GPU instance's
    series, and on no other, until it ends."""
    from ansible_collections.scv.gpu.plugins.module_utils.node.device_plugin import offered_devices

    kubelet, _plugin = real_node
    offered = offered_devices(_mig_fact(), "mixed")
    plugins = {resource: DevicePlugin(tmp_path, resource, ids).start() for resource, ids in offered.items() if ids}
    instance_of = {entry["uuid"]: (str(index), str(entry["gpuInstanceId"]))
                   for index, device in enumerate(json.loads(pathlib.Path(scenario_path(MIG_SCENARIO)).read_text())[
                       "devices"]) for entry in device["migDevices"]}
    agent = AgentProcess(agent_command, access, NODE, tmp_path, scenario=MIG_SCENARIO,
                         extra=("--pod-resources-socket", str(kubelet.pod_resources_socket),
                                "--pod-resources-interval", "1"))
    try:
        wait_until(lambda: kubelet.allocatable(SMALL) == "2", 60, "%s: 2 allocatable on %s" % (SMALL, NODE), 0.2)
        agent.wait_for(lambda: len(_instance_holders(agent)) == 5, 30)
        access.kubectl("create", "-f", "-", input_text=json.dumps(gpu_pod("infer", NAMESPACE, NODE, 1, SMALL)))
        wait_until(lambda: _pod_phase(access, "infer") == "Running", 90, "pod infer Running", 0.5)
        (given,) = plugins[SMALL].allocated[-1]
        want = {key: ("infer" if key == instance_of[given] else "") for key in instance_of.values()}
        agent.wait_for(lambda: _instance_holders(agent) == want, 15)

        access.kubectl("delete", "pod", "infer", "-n", NAMESPACE, "--grace-period", "1", "--timeout", "60s")
        agent.wait_for(lambda: set(_instance_holders(agent).values()) == {""}, 30)
    finally:
        agent.stop()
        for plugin in plugins.values():
            plugin.set_devices([])
            plugin.stop()
