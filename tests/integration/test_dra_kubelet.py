"""GPUs given through Dynamic Resource Allocation, end to end on a real node that the playbook moved to DRA.

The node starts as a device plugin node: the device_plugin role labels it from its GPUs and deploys NVIDIA's
device plugin DaemonSet, and the node offers ``nvidia.com/gpu``. ``playbooks/gpu_stack.yml`` then moves it to DRA
(cordon, drain, label, wait for its ResourceSlices, uncordon), and later back. The real kube-controller-manager's
DaemonSet controller places each stack's plugin pod by the label, and ``harness.gpu_stack_node.StackFollower`` runs
the tests' stand-in for the plugin whose pod is on the node (NVIDIA's images cannot run here): a device plugin, or
the DRA kubelet plugin ``harness.dra_plugin`` publishing what NVIDIA's plugin publishes for ``h100_real``
(tests/fixtures/dra).

On DRA, the real kube-scheduler allocates a ResourceClaim from the ResourceSlices of driver ``gpu.nvidia.com``, the
real kubelet has the claim prepared by the plugin and hands its CDI devices to containerd 2 (CDI enabled), whose
container gets the device's environment, and the agent names the pod on the GPU it got, with the claim's DRA
labels, until the pod ends. The controller manager's ResourceClaim controller makes a pod's claims from their
templates and deletes them once the pod ends. One containerd, kubelet, scheduler, controller manager and follower
serve the whole module; the tests run in the order written (to DRA, claims, back).
"""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from harness.agent import AgentProcess, pods_on_gpus
from harness.ansible import recap
from harness.common import wait_until
from harness.control_plane import read_object
from harness.containerd import containerd2
from harness.controller_manager import ControllerManager
from harness.dra_host import IMAGE, DraHost
from harness.dra_plugin import DRIVER, node_slices
from harness.gpu_stack_node import DEVICE_PLUGIN_DAEMONSET, DRA_DAEMONSET, StackFollower
from harness.paths import ROOT, scenario_uuids
from harness.real_kubelet import WORKLOAD_IMAGE, Containerd, Kubelet, gpu_pod, running_node
from harness.scheduler import Scheduler

NODE = "dra-gpu-node"
NAMESPACE = "dra-ml"
PLUGIN_NAMESPACES = {DEVICE_PLUGIN_DAEMONSET: "stack-device-plugin", DRA_DAEMONSET: "stack-dra-driver"}
# the H100 whose readings were taken on a real card: its driver (580) is new enough for NVIDIA's DRA driver
SCENARIO = "h100_real"
GPUS = len(scenario_uuids(SCENARIO))
MARK = "scv.gpu/cordoned-by"
# one H100 with at least 40 GiB, read from what the driver publishes
H100_40GIB = ("device.attributes['gpu.nvidia.com'].productName.matches('H100') && "
              "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0")


def play(ansible, host, playbook, variables, *extra):
    """``playbook`` run for the node's host (localhost, the simulated GPUs of SCENARIO, the host's stand-in
    nvidia-smi and nvidia-ctk first on PATH)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PATH", "%s:%s" % (host.bin, os.environ["PATH"]))
        return ansible.playbook(str(playbook), SCENARIO, "-e", json.dumps(variables), *extra)


def deploy_device_plugin(ansible, plane, host, work):
    """The device_plugin role as a site runs it for the node: labels from its GPUs, NVIDIA's DaemonSet (whose
    container runs the tests' idle image)."""
    playbook = work / "device-plugin.yml"
    playbook.write_text("- hosts: localhost\n  gather_facts: false\n  roles:\n    - role: scv.gpu.device_plugin\n")
    done = play(ansible, host, playbook, {
        "device_plugin_kubeconfig": str(plane.admin_kubeconfig), "device_plugin_node_name": NODE,
        "device_plugin_namespace": PLUGIN_NAMESPACES[DEVICE_PLUGIN_DAEMONSET],
        "device_plugin_nvidia_image": WORKLOAD_IMAGE})
    assert done.returncode == 0, done.stdout + done.stderr


def switch(ansible, plane, host, stack):
    """playbooks/gpu_stack.yml moving the node to ``stack``; NVIDIA's DRA image is absent and pulled Never. The
    validation's images are not on the node either: its pods on a DRA node are test_validate's."""
    settings = host.settings(plane, NODE, PLUGIN_NAMESPACES[DRA_DAEMONSET], gpu_stack=stack,
                             scv_gpu_hosts="localhost", scv_gpu_kubeconfig=str(plane.admin_kubeconfig),
                             k8s_node_name=NODE, dra_driver_image=IMAGE, dra_driver_image_pull_policy="Never",
                             dra_driver_offer_timeout=90, dra_driver_validate=False)
    return play(ansible, host, ROOT / "playbooks" / "gpu_stack.yml", settings)


@pytest.fixture(scope="module")
def gpu_node(access, ansible, tmp_path_factory):
    """(kubelet, follower, host) of a GPU node on the device plugin, the scheduler and the controller manager's
    DaemonSet and ResourceClaim controllers running."""
    work = tmp_path_factory.mktemp("dra-node")
    cdi = work / "cdi"
    containerd = Containerd(work, containerd2(), [cdi])
    kubelet = Kubelet(access, work, NODE, containerd)
    scheduler = Scheduler(access, work / "scheduler")
    controllers = ControllerManager(access, work / "controller-manager",
                                    ["resourceclaim-controller", "daemonset-controller"])
    follower = StackFollower(access, kubelet, work, SCENARIO, cdi)
    with pytest.MonkeyPatch.context() as patch:
        host = DraHost(work, patch)
    host.generate_spec(SCENARIO)
    for namespace in PLUGIN_NAMESPACES.values():   # no ServiceAccount controller runs to make their default one
        access.kubectl("create", "namespace", namespace, check=False)
        access.kubectl("create", "serviceaccount", "default", "-n", namespace, check=False)
    try:
        with running_node(access, NODE, NAMESPACE, [containerd, kubelet, follower, scheduler, controllers]):
            try:
                deploy_device_plugin(ansible, access, host, work)
                wait_until(lambda: kubelet.allocatable("nvidia.com/gpu") == str(GPUS), 90,
                           "the device plugin's GPUs allocatable (follower errors %s)" % follower.errors, 0.5)
                yield kubelet, follower, host
            finally:
                # the plugins' pods go while the kubelet and the DaemonSet controller still run
                for name, namespace in PLUGIN_NAMESPACES.items():
                    access.kubectl("delete", "daemonset", name, "-n", namespace, "--ignore-not-found", check=False)
                    access.kubectl("delete", "pods", "--all", "-n", namespace, "--grace-period", "1",
                                   "--timeout", "60s", check=False)
    finally:
        access.kubectl("delete", "deviceclass", "gpu.nvidia.com", "mig.nvidia.com", "--ignore-not-found",
                       check=False)


@pytest.fixture(scope="module")
def to_dra(gpu_node, access, ansible):
    """The node moved to DRA by the playbook while a pod held a GPU through the device plugin:
    (playbook result, the pod's deletion seen, the playbook rerun)."""
    kubelet, follower, host = gpu_node
    job = device_plugin_pod("cuda-job")
    # a ReplicaSet's pod (a drain refuses bare pods); no ReplicaSet controller runs to replace it
    job["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "cuda-job",
                                           "controller": True, "uid": "2f1f0c9e-6a43-4d0e-9a51-7b3c1d2e4f60"}]
    create(access, job, cpu_pod("cpu-job"))
    for name in ("cuda-job", "cpu-job"):
        wait_until(lambda name=name: _phase(access, name) == "Running", 90, "pod %s Running (%s)" % (name, kubelet.log),
                   0.5)
    held = list(follower.device_plugin.allocated)
    cpu_uid = _pod(access, "cpu-job")["metadata"]["uid"]
    moved = switch(ansible, access, host, "dra")
    gone = _pod(access, "cuda-job") is None
    again = switch(ansible, access, host, "dra")
    return moved, held, gone, again, cpu_uid


@pytest.fixture
def dra_node(gpu_node, to_dra):
    """(kubelet, the running DRA plugin) once the node is on DRA."""
    kubelet, follower, _host = gpu_node
    if follower.dra is None:
        moved = to_dra[0]
        pytest.fail("the node was not moved to DRA (follower errors %s):\n%s" % (
            follower.errors, (moved.stdout + moved.stderr)[-3000:]))
    return kubelet, follower.dra


def device_plugin_pod(name):
    """A pod for the scheduler to place that asks for one nvidia.com/gpu, as pods written for the device plugin do."""
    pod = gpu_pod(name, NAMESPACE, None, 1)
    for key in ("nodeName", "tolerations"):
        pod["spec"].pop(key)
    return pod


def cpu_pod(name):
    """A ReplicaSet's pod that holds no GPU: a GPU stack switch leaves it running."""
    pod = device_plugin_pod(name)
    pod["spec"]["containers"][0].pop("resources")
    pod["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": name,
                                           "controller": True, "uid": "7c0d3e55-1b2a-4f6e-8d9c-0a1b2c3d4e5f"}]
    return pod


def node_state(node):
    """(stack label, unschedulable, our cordon mark) of a Node object."""
    return ((node["metadata"].get("labels") or {}).get("scv.gpu/gpu-stack"), bool(node["spec"].get("unschedulable")),
            (node["metadata"].get("annotations") or {}).get(MARK))


def published_slices(plane):
    """The specs of the node's ResourceSlices of driver gpu.nvidia.com, by name."""
    done = plane.kubectl("get", "resourceslices", "-o", "json", "--field-selector",
                         "spec.nodeName=%s,spec.driver=%s" % (NODE, DRIVER))
    return {item["metadata"]["name"]: item["spec"] for item in json.loads(done.stdout)["items"]}


def test_the_playbook_moves_a_device_plugin_node_to_dra_which_publishes_what_nvidias_plugin_does(
        access, gpu_node, to_dra):
    kubelet, follower, _host = gpu_node
    moved, held, gone, again, cpu_uid = to_dra
    assert moved.returncode == 0, moved.stdout + moved.stderr
    assert "Wait until a ResourceSlice of gpu.nvidia.com is published for node %s" % NODE in moved.stdout
    # The job held a GPU through the device plugin, and the drain ended it before the switch; the pod that holds
    # no GPU ran on, the same pod.
    assert held and held[0][0] in scenario_uuids(SCENARIO), held
    assert gone
    assert (_phase(access, "cpu-job"), _pod(access, "cpu-job")["metadata"]["uid"]) == ("Running", cpu_uid)
    # The DaemonSet controller put the DRA plugin's pod on the node once it was cordoned with our mark and
    # labelled; it is uncordoned now.
    assert [(stack, node_state(node)) for stack, node in follower.seen] == [
        ("device-plugin", (None, False, None)), ("dra", ("dra", True, "scv.gpu.gpu_stack"))]
    assert node_state(read_object(access, "node", NODE)) == ("dra", False, None)
    # The device plugin's pod left the node, once it was cordoned, labelled and drained; the kubelet stopped
    # offering nvidia.com/gpu.
    assert [(stack, node_state(node), pods) for stack, node, pods in follower.stopped] == [
        ("device-plugin", ("dra", True, "scv.gpu.gpu_stack"), ["cpu-job"])]
    assert DEVICE_PLUGIN_DAEMONSET not in follower.placed() and follower.device_plugin is None
    # and the playbook lifted its cordon only once the kubelet had stopped offering them
    assert kubelet.allocatable("nvidia.com/gpu") == "0"
    # What the node publishes is what NVIDIA's plugin published for these GPUs.
    node_uid = read_object(access, "node", NODE)["metadata"]["uid"]
    recorded = node_slices(SCENARIO, NODE, node_uid)
    assert published_slices(access) == {body["metadata"]["name"]: body["spec"] for body in recorded}
    assert len(follower.dra.devices) == GPUS
    # Run again, the node is on its stack: nothing changes.
    assert again.returncode == 0, again.stdout + again.stderr
    assert recap(again.stdout)["changed"] == 0, again.stdout


def claim_for(name, expression, kind="ResourceClaim"):
    """A ResourceClaim (or ResourceClaimTemplate) for exactly one device of class gpu.nvidia.com that
    ``expression`` (CEL) selects."""
    spec = {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1,
        "selectors": [{"cel": {"expression": expression}}]}}]}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": kind, "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"spec": spec} if kind == "ResourceClaimTemplate" else spec}


def pod_with_claim(name, claim=None, template=None):
    """A pod for the scheduler to place (no nodeName) whose container uses ResourceClaim ``claim``, or one made
    from ResourceClaimTemplate ``template``."""
    source = {"resourceClaimName": claim} if claim else {"resourceClaimTemplateName": template}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"hostNetwork": True, "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 1,
                     "resourceClaims": [dict(source, name="gpu")],
                     "containers": [{"name": "trainer", "image": WORKLOAD_IMAGE, "imagePullPolicy": "Never",
                                     "resources": {"claims": [{"name": "gpu"}]}}]}}


def create(plane, *bodies):
    for body in bodies:
        plane.kubectl("create", "-f", "-", input_text=json.dumps(body))


def _pod(plane, name):
    return read_object(plane, "pod", name, namespace=NAMESPACE, missing_ok=True)


def _phase(plane, name):
    pod = _pod(plane, name)
    return pod["status"].get("phase") if pod else None


def container_environment(plane, name):
    """{variable: value} of pod ``name``'s container process, found by its cgroup, which names the container."""
    status = _pod(plane, name)["status"]["containerStatuses"][0]
    container = status["containerID"].split("://", 1)[1]
    for entry in pathlib.Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and container in (entry / "cgroup").read_text():
                pairs = (entry / "environ").read_bytes().decode().split("\0")
                return dict(pair.split("=", 1) for pair in pairs if "=" in pair)
        except OSError:
            continue
    raise AssertionError("no process in a cgroup of container %s (pod %s)" % (container, name))


def _pod_series_labels(agent, gpu):
    """The labels of GPU ``gpu``'s DCGM_FI_DEV_GPU_UTIL series naming a pod, or None."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(agent.metrics_text()):
        for sample in family.samples:
            if sample.name == "DCGM_FI_DEV_GPU_UTIL" and sample.labels["gpu"] == str(gpu) and sample.labels.get("pod"):
                return sample.labels
    return None


def _dra_labels(agent, gpu):
    """The dra_* labels of GPU ``gpu``'s series naming a pod, or None."""
    labels = _pod_series_labels(agent, gpu)
    return None if labels is None else {key: value for key, value in labels.items() if key.startswith("dra_")}


def _label(agent, gpu, name):
    return (_pod_series_labels(agent, gpu) or {}).get(name)


def test_a_claim_for_an_h100_of_40_gib_is_placed_prepared_through_cdi_and_named_by_the_agent(
        access, agent_command, dra_node, tmp_path):
    kubelet, plugin = dra_node
    create(access, claim_for("h100", H100_40GIB, "ResourceClaimTemplate"), pod_with_claim("train", template="h100"))
    wait_until(lambda: _phase(access, "train") == "Running", 120, "pod train Running (see %s)" % kubelet.log, 0.5)
    pod = _pod(access, "train")
    assert pod["spec"]["nodeName"] == NODE

    # The controller made the pod's claim from the template; the scheduler allocated one device of the node's
    # pool, and the plugin prepared exactly that one.
    (made,) = pod["status"]["resourceClaimStatuses"]
    name = made["resourceClaimName"]
    claim = read_object(access, "resourceclaim", name, namespace=NAMESPACE)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"], result["request"]) == (DRIVER, NODE, "gpu"), result
    device = result["device"]
    assert plugin.prepared == {claim["metadata"]["uid"]: [device]}
    uuid = plugin.devices[device]["attributes"]["uuid"]["string"]
    gpu = scenario_uuids(SCENARIO).index(uuid)

    # containerd applied the plugin's CDI spec to the container
    environment = container_environment(access, "train")
    assert environment.get("NVIDIA_VISIBLE_DEVICES") == uuid, environment
    assert environment.get("SCV_TEST_DRA_CLAIM") == claim["metadata"]["uid"], environment

    agent = AgentProcess(agent_command, access, NODE, tmp_path, scenario=SCENARIO, extra=(
        "--pod-resources-socket", str(kubelet.pod_resources_socket), "--pod-resources-interval", "1",
        "--pod-logs-dir", str(kubelet.pod_logs), "--kubernetes-enable-pod-uid"))
    nobody = [("", "", "")]
    try:
        holder = [("train", NAMESPACE, "trainer")]
        agent.wait_for(lambda: pods_on_gpus(agent).get(gpu) == holder, 30)
        held = pods_on_gpus(agent)
        assert all(held[other] == nobody for other in range(GPUS) if other != gpu), held
        assert _dra_labels(agent, gpu) == {"dra_claim_name": name, "dra_claim_namespace": NAMESPACE,
                                           "dra_driver_name": DRIVER, "dra_pool_name": NODE,
                                           "dra_device_name": device}
        agent.wait_for(lambda: _label(agent, gpu, "pod_uid") == pod["metadata"]["uid"], 20)

        # The pod ends: the kubelet has the claim unprepared (its CDI spec goes), the agent forgets the pod, and
        # the controller deletes the claim it made.
        access.kubectl("delete", "pod", "train", "-n", NAMESPACE, "--grace-period", "1", "--timeout", "60s")
        wait_until(lambda: not plugin.prepared, 60, "claim %s unprepared" % name, 0.2)
        assert ("unprepare", claim["metadata"]["uid"]) in plugin.calls
        assert not plugin.cdi_spec(claim["metadata"]["uid"]).exists()
        agent.wait_for(lambda: all(gpus == nobody for gpus in pods_on_gpus(agent).values()), 30)
        wait_until(lambda: not read_object(access, "resourceclaim", name, namespace=NAMESPACE, missing_ok=True),
                   60, "claim %s deleted" % name, 0.5)
    finally:
        agent.stop()


def test_a_claim_no_gpu_satisfies_stays_pending_with_the_schedulers_reason(access, dra_node):
    _kubelet, plugin = dra_node
    too_big = "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('200Gi')) >= 0"
    create(access, claim_for("h100-200gib", too_big), pod_with_claim("giant", claim="h100-200gib"))

    def unschedulable():
        conditions = (_pod(access, "giant")["status"].get("conditions") or ())
        return next((item for item in conditions if item["type"] == "PodScheduled" and item["status"] == "False"),
                    None)

    wait_until(unschedulable, 60, "pod giant found unschedulable", 0.5)
    condition = unschedulable()
    assert condition["reason"] == "Unschedulable", condition
    assert "cannot allocate all claims" in condition["message"], condition
    assert _phase(access, "giant") == "Pending" and not _pod(access, "giant")["spec"].get("nodeName")
    claim = read_object(access, "resourceclaim", "h100-200gib", namespace=NAMESPACE)
    assert "allocation" not in claim.get("status", {}), claim
    assert all(uid != claim["metadata"]["uid"] for _call, uid in plugin.calls), plugin.calls
    access.kubectl("delete", "pod", "giant", "-n", NAMESPACE, "--grace-period", "1", "--timeout", "60s")


def test_the_playbook_moves_the_node_back_to_the_device_plugin(access, ansible, gpu_node, dra_node):
    kubelet, follower, host = gpu_node
    # a ReplicaSet's pod holding a GPU through its claim (a drain refuses bare pods)
    trainer = pod_with_claim("trainer-rs", template="h100-back")
    trainer["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "trainer-rs",
                                               "controller": True, "uid": "0d9b8a7c-6e5f-4a3b-9c2d-1e0f9a8b7c6d"}]
    create(access, claim_for("h100-back", H100_40GIB, "ResourceClaimTemplate"), trainer)
    wait_until(lambda: _phase(access, "trainer-rs") == "Running", 120, "pod trainer-rs Running (%s)" % kubelet.log,
               0.5)
    (claim_uid,) = dra_node[1].prepared
    back = switch(ansible, access, host, "device-plugin")
    assert back.returncode == 0, back.stdout + back.stderr
    # the drain ended the pod that held its GPU through DRA, and the kubelet had its claim unprepared
    assert _pod(access, "trainer-rs") is None
    assert ("unprepare", claim_uid) in dra_node[1].calls
    assert "Wait until the device plugin offers nvidia.com/gpu on node %s" % NODE in back.stdout
    assert [(stack, node_state(node)) for stack, node in follower.seen[-1:]] == [
        ("device-plugin", ("device-plugin", True, "scv.gpu.gpu_stack"))]
    assert node_state(read_object(access, "node", NODE)) == ("device-plugin", False, None)
    # The DRA plugin's pod left the node (cordoned, labelled, drained) and took its slices; the device plugin
    # offers the GPUs again.
    assert [(stack, node_state(node), pods) for stack, node, pods in follower.stopped[-1:]] == [
        ("dra", ("device-plugin", True, "scv.gpu.gpu_stack"), ["cpu-job"])]
    assert DRA_DAEMONSET not in follower.placed() and follower.dra is None
    assert published_slices(access) == {}
    assert kubelet.allocatable("nvidia.com/gpu") == str(GPUS)
    create(access, device_plugin_pod("cuda-job-2"))
    wait_until(lambda: _phase(access, "cuda-job-2") == "Running", 90, "pod cuda-job-2 Running (%s)" % kubelet.log,
               0.5)
    assert follower.device_plugin.allocated and follower.device_plugin.allocated[-1][0] in scenario_uuids(SCENARIO)
    assert not read_object(access, "pod", "cuda-job-2", namespace=NAMESPACE)["status"].get("resourceClaimStatuses")
