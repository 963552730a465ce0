"""GPUs given through Dynamic Resource Allocation, end to end on a real node: the real kube-scheduler allocates a
ResourceClaim from the ResourceSlices of driver ``gpu.nvidia.com``, the real kubelet has the claim prepared by the
DRA kubelet plugin and hands its CDI devices to containerd 2 (CDI enabled), whose container gets the device's
environment, and the agent names the pod on the GPU it got, with the claim's DRA labels, until the pod ends.

The plugin is the tests' own (``harness.dra_plugin``), publishing what NVIDIA's plugin publishes for
``h100_sxm_x8`` (tests/fixtures/dra). kube-controller-manager runs its ResourceClaim controller alone, which makes
a pod's claims from their templates and deletes them once the pod ends. One containerd, kubelet, scheduler,
controller manager and plugin serve the whole module.
"""

from __future__ import annotations

import json
import pathlib
import subprocess

import pytest

from harness.agent import AgentProcess, pods_on_gpus
from harness.common import wait_until
from harness.control_plane import read_object
from harness.controller_manager import ControllerManager
from harness.dra_plugin import DRIVER, DraPlugin
from harness.paths import ROOT, scenario_uuids
from harness.real_kubelet import WORKLOAD_IMAGE, Containerd, Kubelet, running_node
from harness.scheduler import Scheduler

NODE = "dra-gpu-node"
NAMESPACE = "dra-ml"
SCENARIO = "h100_sxm_x8"
DEVICE_CLASS = ROOT / "tests" / "fixtures" / "dra-device-class-gpu.yaml"
# one H100 with at least 40 GiB, read from what the driver publishes
H100_40GIB = ("device.attributes['gpu.nvidia.com'].productName.matches('H100') && "
              "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0")


def containerd2():
    """The folder of containerd 2, its runc shim and ctr (tools/containerd/build): containerd with CDI."""
    done = subprocess.run([str(ROOT / "tools" / "containerd" / "build")], capture_output=True, text=True, check=False)
    assert done.returncode == 0, "tools/containerd/build failed:\n%s" % done.stderr[-4000:]
    return pathlib.Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def dra_node(access, tmp_path_factory):
    """(kubelet, plugin) of a node whose GPUs are offered through DRA only, the scheduler running."""
    work = tmp_path_factory.mktemp("dra-node")
    cdi = work / "cdi"
    containerd = Containerd(work, containerd2() / "containerd", [cdi])
    kubelet = Kubelet(access, work, NODE, containerd)
    scheduler = Scheduler(access, work / "scheduler")
    claims = ControllerManager(access, work / "controller-manager", ["resourceclaim-controller"])
    plugin = DraPlugin(access, kubelet, work, SCENARIO, cdi)
    access.kubectl("apply", "-f", str(DEVICE_CLASS))
    try:
        with running_node(access, NODE, NAMESPACE, [containerd, kubelet, plugin, scheduler, claims]):
            yield kubelet, plugin
    finally:
        access.kubectl("delete", "-f", str(DEVICE_CLASS), "--ignore-not-found", check=False)


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
        assert all(held[other] == nobody for other in range(8) if other != gpu), held
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
