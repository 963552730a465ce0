"""playbooks/gpu_stack.yml against the real kube-apiserver: the cases around a node's move between the device
plugin and DRA (check mode, a node that never offers its GPUs, a node someone else cordoned).

The whole move on a real node (kubelet, containerd, the DaemonSet controller placing each stack's plugin, a drain
that ends a running GPU pod, the switch back) is in test_dra_kubelet.py. Here there is no kubelet or plugin: what
they would publish once the label switches the node's plugin is published by the test itself while the playbook
waits: for DRA, a ResourceSlice of driver gpu.nvidia.com created with the node's own credentials (the Node
authorizer allows a node exactly that, as it allows NVIDIA's kubelet plugin); for the device plugin, allocatable
nvidia.com/gpu in the Node's status, as the kubelet reports it. So the playbook's wait is the one a real node
meets. The host is simulated as in test_dra_driver.py. No kubelet runs pods, so the validation before the uncordon
is off but in the test of a node that fails it.
"""

from __future__ import annotations

import json
import re
import threading
import time

import pytest

from harness.ansible import recap
from harness.dra_host import DraHost, node_object, publish_slice, publish_status, put_node, suffix

GPU_NODE = {"nvidia.com/gpu.present": "true", "gpu/nvidia": "NVIDIA-GB200"}
SCENARIO = "gb200_nvl_x4"
MARK = "scv.gpu/cordoned-by"


@pytest.fixture
def host(tmp_path, monkeypatch):
    made = DraHost(tmp_path, monkeypatch)
    made.generate_spec(SCENARIO)
    return made


def switch(ansible, plane, host, node, stack, *extra, **more):
    # no kubelet runs pods here: validation is off but where a test turns it on (test_validate runs its pods)
    settings = host.settings(plane, node, "gpu-stack-%s" % suffix(ansible), gpu_stack=stack,
                             scv_gpu_hosts="localhost", scv_gpu_kubeconfig=str(plane.admin_kubeconfig),
                             k8s_node_name=node, dra_driver_offer_timeout=60, dra_driver_validate=False)
    settings.update(more)
    return ansible.playbook("playbooks/gpu_stack.yml", SCENARIO, "-e", json.dumps(settings), *extra)


class Plugin(threading.Thread):
    """Waits until the node is cordoned and labelled ``stack``, then publishes what that stack's plugin would."""

    def __init__(self, plane, node, stack):
        super().__init__(daemon=True)
        self.plane, self.node, self.stack, self.seen = plane, node, stack, None

    def run(self):
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            current = node_object(self.plane, self.node)
            if (current["metadata"].get("labels") or {}).get("scv.gpu/gpu-stack") == self.stack:
                self.seen = current
                break
            time.sleep(0.5)
        if self.stack == "dra":
            publish_status(self.plane, self.node, {"allocatable": {"nvidia.com/gpu": "0"}})
            publish_slice(self.plane, self.node, devices=4)
        else:
            self.plane.kubectl("delete", "resourceslices.resource.k8s.io", "%s-gpu.nvidia.com" % self.node,
                               "--ignore-not-found")
            publish_status(self.plane, self.node, {"allocatable": {"nvidia.com/gpu": "4"}})


class Claims(threading.Thread):
    """Polls the ResourceClaims of ``namespace`` until stopped, noting the DeviceClass each one asks for."""

    def __init__(self, plane, namespace):
        super().__init__(daemon=True)
        self.plane, self.namespace, self.classes = plane, namespace, {}
        self.stopping = threading.Event()

    def run(self):
        while not self.stopping.is_set():
            done = self.plane.kubectl("get", "resourceclaims.resource.k8s.io", "-n", self.namespace, "-o", "json",
                                      check=False)
            for claim in json.loads(done.stdout or "{}").get("items", []):
                self.classes[claim["metadata"]["name"]] = [request["exactly"]["deviceClassName"]
                                                           for request in claim["spec"]["devices"]["requests"]]
            self.stopping.wait(0.3)


def switched(ansible, plane, host, node, stack):
    plugin = Plugin(plane, node, stack)
    plugin.start()
    done = switch(ansible, plane, host, node, stack)
    plugin.join(timeout=130)
    assert done.returncode == 0, done.stdout + done.stderr
    return done, plugin.seen


@pytest.mark.every_ansible_line
def test_check_mode_reports_the_switch_and_changes_nothing(ansible, control_plane, host):
    plane = control_plane
    node = "stack-check-%s" % suffix(ansible)
    put_node(plane, node, dict(GPU_NODE), gpus=4)
    namespace = "gpu-stack-check-%s" % suffix(ansible)       # on a cluster that has none of the driver's objects
    plane.kubectl("delete", "namespace", namespace, "--ignore-not-found", "--wait=false")
    before = node_object(plane, node)

    checked = switch(ansible, plane, host, node, "dra", "--check", dra_driver_namespace=namespace)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert plane.kubectl("get", "namespace", namespace, check=False).returncode != 0
    assert recap(checked.stdout)["changed"] >= 2, checked.stdout       # the cordon and the label, at least
    after = node_object(plane, node)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert after["metadata"]["labels"] == before["metadata"]["labels"]
    assert ("Would create in the new namespace %s: ServiceAccount nvidia-dra-driver-gpu-kubelet-plugin, DaemonSet "
            "nvidia-dra-driver-gpu-kubelet-plugin" % namespace) in " ".join(checked.stdout.split())
    for task in ("Cordon and mark as ours node", "Switch the stack label of node %s" % node):
        assert re.search(r"TASK \[scv.gpu.dra_driver : %s[^\n]*\nchanged: " % re.escape(task), checked.stdout), task


def test_a_node_that_never_offers_or_still_offers_the_old_way_stays_cordoned_and_a_rerun_finishes_the_move(
        ansible, control_plane, host):
    plane = control_plane
    node = "stack-late-%s" % suffix(ansible)
    put_node(plane, node, dict(GPU_NODE), gpus=4)

    late = switch(ansible, plane, host, node, "dra", dra_driver_offer_timeout=4)
    assert late.returncode != 0
    output = " ".join(late.stdout.split())
    assert "Node %s offers no GPU through the dra stack after 4 s (no ResourceSlice of driver gpu.nvidia.com). " \
           "It stays cordoned" % node in output, output
    stuck = node_object(plane, node)
    assert stuck["spec"]["unschedulable"] is True and stuck["metadata"]["annotations"][MARK] == "scv.gpu.gpu_stack"

    # The DRA plugin publishes, but the device plugin still offers the GPUs: both stacks would hand them out.
    publish_slice(plane, node)
    both = switch(ansible, plane, host, node, "dra", dra_driver_offer_timeout=4)
    assert both.returncode != 0
    output = " ".join(both.stdout.split())
    assert "Node %s still offers its GPUs through the device plugin stack after 4 s (allocatable nvidia.com/gpu 4), " \
           "so both stacks would hand out the same GPUs. It stays cordoned" % node in output, output
    assert node_object(plane, node)["spec"]["unschedulable"] is True

    publish_status(plane, node, {"allocatable": {"nvidia.com/gpu": "0"}})
    resumed = switch(ansible, plane, host, node, "dra")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    after = node_object(plane, node)
    assert not after["spec"].get("unschedulable") and MARK not in (after["metadata"].get("annotations") or {})


def test_a_node_that_fails_its_validation_on_dra_stays_cordoned(ansible, control_plane, host):
    """Validation on: the node moves to DRA and publishes its ResourceSlice, but the workload pod, which asks for a
    GPU through a ResourceClaim of DeviceClass gpu.nvidia.com, never runs (no kubelet here): the node keeps our
    cordon and says which checks failed, and neither pod nor claim is left."""
    plane = control_plane
    node = "stack-validate-%s" % suffix(ansible)
    namespace = "stack-validate-%s" % suffix(ansible)
    put_node(plane, node, dict(GPU_NODE), gpus=4)
    # the namespace and its default ServiceAccount, which a cluster's controller manager would make
    plane.kubectl("create", "namespace", namespace, check=False)
    plane.kubectl("create", "serviceaccount", "default", "-n", namespace, check=False)

    plugin, claims = Plugin(plane, node, "dra"), Claims(plane, namespace)
    plugin.start()
    claims.start()
    try:
        done = switch(ansible, plane, host, node, "dra", dra_driver_validate=True,
                      dra_driver_validation={"timeout": 3, "namespace": namespace})
    finally:
        claims.stopping.set()
        claims.join()
    plugin.join(timeout=130)
    output = " ".join((done.stdout + done.stderr).split())
    assert done.returncode != 0, output
    assert "Node %s failed its validation on the dra stack: workload: pod " % node in output, output
    assert "The node stays cordoned, labelled scv.gpu/gpu-stack=dra." in output
    after = node_object(plane, node)
    assert after["metadata"]["labels"]["scv.gpu/gpu-stack"] == "dra"
    assert after["spec"]["unschedulable"] is True and after["metadata"]["annotations"][MARK] == "scv.gpu.gpu_stack"
    # the workload asked for its GPU the DRA way, through a claim of the driver's DeviceClass
    assert list(claims.classes.values()) == [["gpu.nvidia.com"]], claims.classes
    for kind in ("pods", "resourceclaims.resource.k8s.io"):
        assert not plane.kubectl("get", kind, "-n", namespace, "-o", "name").stdout.strip(), kind
    assert recap(done.stdout)["failed"] == 1


def test_a_node_cordoned_by_someone_else_is_switched_and_stays_cordoned(ansible, control_plane, host):
    plane = control_plane
    node = "stack-foreign-%s" % suffix(ansible)
    put_node(plane, node, dict(GPU_NODE), gpus=4)
    plane.kubectl("cordon", node)

    done, _seen = switched(ansible, plane, host, node, "dra")
    assert "was already cordoned by someone else" in done.stdout
    after = node_object(plane, node)
    assert after["metadata"]["labels"]["scv.gpu/gpu-stack"] == "dra"
    assert after["spec"]["unschedulable"] is True and MARK not in (after["metadata"].get("annotations") or {})
