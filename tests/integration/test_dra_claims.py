"""The claims of docs/dra-claims.md, each placed by the real kube-scheduler on nodes publishing what NVIDIA's DRA
kubelet plugin published for a simulator scenario (tests/fixtures/dra/).

No kubelet runs: each Node, and its ResourceSlices, are written with the node's own credentials, as the kubelet
and the plugin would (the Node authorizer and NodeRestriction check them). A pod the scheduler binds stays Pending
without a kubelet; what is checked is where it was bound and which devices its claim was allocated.
"""

from __future__ import annotations

import collections
import json
import re

import pytest
import yaml

from harness.common import wait_until
from harness.control_plane import read_object
from harness.paths import ROOT
from harness.scheduler import Scheduler

EXAMPLES = ROOT / "docs" / "examples" / "dra"
FIXTURES = ROOT / "tests" / "fixtures" / "dra"
NAMESPACE = "dra-claims"
DRIVER = "gpu.nvidia.com"
PLACED_WITHIN = 60

# node name -> the scenario whose recorded ResourceSlices it publishes
NODES = {
    "h100-x8": "h100_sxm_x8",          # 8 x H100 80GB HBM3, driver 550.54.15, compute capability 9.0
    "h100-driver-580": "h100_real",    # 1 x H100 80GB HBM3, driver 580.159.4
    "a100-mig": "a100_mig",            # A100-SXM4-40GB: GPU 0 as MIG 1g.5gb + 2g.10gb + 3g.20gb, GPU 1 whole
    "titan-xp": "titan_xp",            # 1 x TITAN Xp 12 GB, compute capability 6.1
    "gb200": "gb200_nvl_x4",           # 4 x GB200 (185 GiB), driver 580.95.5, compute capability 10.0
}

# example -> (the node it must be bound to, the devices its claim must be allocated), None: stays Pending
EXPECTED = {
    "model": ("titan-xp", ["gpu-0"]),
    "memory": ("gb200", ["gpu-0"]),
    "compute-capability": ("gb200", ["gpu-0"]),
    "driver": ("h100-driver-580", ["gpu-0"]),
    "count": ("h100-x8", ["gpu-%d" % minor for minor in range(8)]),
    "mig-profile": ("a100-mig", ["gpu-0-mig-3g20gb-9-0"]),
    "all-gpus": ("gb200", ["gpu-%d" % minor for minor in range(4)]),
    "pcie-root": ("h100-x8", ["gpu-0", "gpu-1"]),
    "prefer": ("a100-mig", ["gpu-1"]),
    "too-much-memory": None,
}


# the scheduler's verdict: the node it bound the pod to (None: Pending), the devices allocated, the request (or
# request/subrequest) each answers, the pod's PodScheduled condition
Verdict = collections.namedtuple("Verdict", "node devices requests condition")


def publish_node(plane, node, scenario):
    """The Node and the scenario's ResourceSlices, written as ``node`` itself (kubelet and DRA plugin)."""
    own = plane.node_kubeconfig(node)
    allocatable = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    plane.kubectl("create", "-f", "-", kubeconfig=own, input_text=json.dumps({  # status too, as a kubelet registers
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": {"nvidia.com/gpu.present": "true"}},
        "status": {"capacity": allocatable, "allocatable": allocatable,
                   "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                   "message": "the test stands in for the kubelet"}]}}))
    # kube-apiserver's TaintNodesByCondition taints a new Node not-ready; the node lifecycle controller
    # (kube-controller-manager, not run here) lifts it once the node reports Ready
    plane.kubectl("patch", "node", node, "--type=merge", "-p", '{"spec":{"taints":null}}')
    uid = read_object(plane, "node", node)["metadata"]["uid"]
    recorded = json.loads((FIXTURES / ("%s.json" % scenario)).read_text())
    for number, piece in enumerate(recorded["resourceSlices"]):
        piece = json.loads(json.dumps(piece))
        metadata = piece["metadata"]
        metadata.pop("generateName", None)
        metadata["name"] = "%s-%s-%d" % (node, DRIVER, number)
        for owner in metadata.get("ownerReferences", []):
            owner.update(name=node, uid=uid)
        piece["spec"]["nodeName"] = node
        piece["spec"]["pool"]["name"] = node
        plane.kubectl("create", "-f", "-", kubeconfig=own, input_text=json.dumps(piece))


@pytest.fixture(scope="module")
def cluster(control_plane, tmp_path_factory):
    """The control plane with the DeviceClasses, the GPU nodes and their slices, and a running kube-scheduler."""
    plane = control_plane
    plane.kubectl("apply", "-f", str(EXAMPLES / "deviceclasses.yaml"))
    plane.kubectl("create", "namespace", NAMESPACE)
    plane.kubectl("create", "serviceaccount", "default", "-n", NAMESPACE)  # no controller manager makes it here
    for node, scenario in NODES.items():
        publish_node(plane, node, scenario)
    scheduler = Scheduler(plane, tmp_path_factory.mktemp("kube-scheduler")).start()
    try:
        yield scheduler
    finally:
        scheduler.stop()
        for node in NODES:
            plane.kubectl("delete", "resourceslices", "--field-selector", "spec.nodeName=%s" % node, check=False)
            plane.kubectl("delete", "node", node, check=False)


def documents(path):
    """The objects of an example file: one YAML document each, a v1 List."""
    return yaml.safe_load(path.read_text())["items"]


def submit(plane, claim_and_pod):
    """Creates the example's objects in the test namespace; returns (claim name, pod name)."""
    names = {document["kind"]: document["metadata"]["name"] for document in claim_and_pod}
    for document in claim_and_pod:
        plane.kubectl("create", "-n", NAMESPACE, "-f", "-", input_text=json.dumps(document))
    return names["ResourceClaim"], names["Pod"]


def remove(plane, claim, pod):
    """The pod and claim gone, so the claim's devices are free for the next example (no controller manager here
    takes the scheduler's finalizer off a claim whose pod is gone)."""
    plane.kubectl("delete", "pod", pod, "-n", NAMESPACE, "--grace-period=0", "--force", check=False)
    plane.kubectl("patch", "resourceclaim", claim, "-n", NAMESPACE, "--type=merge",
                  "-p", '{"metadata":{"finalizers":null}}', check=False)
    plane.kubectl("delete", "resourceclaim", claim, "-n", NAMESPACE, "--wait=true", check=False)


def scheduled_condition(pod):
    return next((condition for condition in pod["status"].get("conditions", [])
                 if condition["type"] == "PodScheduled"), None)


def outcome(plane, scheduler, claim, pod):
    """Waits for the scheduler's verdict on ``pod``; a Verdict."""
    seen = {}

    def decided():
        seen["pod"] = read_object(plane, "pod", pod, NAMESPACE)
        condition = scheduled_condition(seen["pod"]) or {}
        return seen["pod"]["spec"].get("nodeName") or condition.get("reason") == "Unschedulable"

    wait_until(decided, PLACED_WITHIN, "kube-scheduler to place pod %s" % pod, step=0.2, log=scheduler.log)
    node = seen["pod"]["spec"].get("nodeName")
    if node:  # the claim's allocation is written before the binding
        allocation = read_object(plane, "resourceclaim", claim, NAMESPACE)["status"]["allocation"]
        results = allocation["devices"]["results"]
        assert {result["driver"] for result in results} == {DRIVER}
        assert {result["pool"] for result in results} == {node}, results
        assert allocation["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [node]
        return Verdict(node, natural(result["device"] for result in results),
                       sorted(result["request"] for result in results), scheduled_condition(seen["pod"]))
    status = read_object(plane, "resourceclaim", claim, NAMESPACE).get("status", {})
    assert "allocation" not in status, status
    return Verdict(None, [], [], scheduled_condition(seen["pod"]))


def natural(names):
    return sorted(names, key=lambda name: [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)])


def placed(plane, scheduler, claim_and_pod):
    """Submits an example, waits for the scheduler's verdict, removes it again; what ``outcome`` answers."""
    claim, pod = submit(plane, claim_and_pod)
    try:
        return outcome(plane, scheduler, claim, pod)
    finally:
        remove(plane, claim, pod)


def assert_pending(verdict):
    node, condition = verdict.node, verdict.condition
    assert node is None
    assert condition["status"] == "False" and condition["reason"] == "Unschedulable", condition
    assert "cannot allocate all claims" in condition["message"], condition


@pytest.mark.parametrize("example", sorted(EXPECTED))
def test_each_documented_claim_is_placed_where_the_page_says(cluster, control_plane, example):
    claim_and_pod = documents(EXAMPLES / ("%s.yaml" % example))
    verdict = placed(control_plane, cluster, claim_and_pod)
    if EXPECTED[example] is None:
        assert_pending(verdict)
        return
    assert (verdict.node, verdict.devices) == EXPECTED[example], verdict.condition
    if example == "prefer":   # the second choice, since no node has an H200
        assert verdict.requests == ["gpu/a100"]
    node = verdict.node
    # and no other node would do: with that one cordoned, the claim fits nowhere
    control_plane.kubectl("cordon", node)
    try:
        assert_pending(placed(control_plane, cluster, claim_and_pod))
    finally:
        control_plane.kubectl("uncordon", node)


def edited(example, old, new):
    """The example's documents with ``old`` replaced by ``new`` in its claim's first CEL expression."""
    claim_and_pod = documents(EXAMPLES / ("%s.yaml" % example))
    claim = next(document for document in claim_and_pod if document["kind"] == "ResourceClaim")
    selector = claim["spec"]["devices"]["requests"][0]["exactly"]["selectors"][0]["cel"]
    assert old in selector["expression"], (example, selector)
    selector["expression"] = selector["expression"].replace(old, new)
    claim["metadata"]["name"] += "-edge"
    for document in claim_and_pod:
        if document["kind"] == "Pod":
            document["metadata"]["name"] += "-edge"
            document["spec"]["resourceClaims"][0]["resourceClaimName"] = claim["metadata"]["name"]
    return claim_and_pod


@pytest.mark.parametrize("example, old, new, expected", [
    # a GB200 has 189471 MiB: exactly that fits, one MiB more fits nothing
    ("memory", "quantity('100Gi')", "quantity('189471Mi')", ("gb200", ["gpu-0"])),
    ("memory", "quantity('100Gi')", "quantity('189472Mi')", None),
    # only the H100s' driver 580.159.4 is at least 580.159.4; nothing has 580.159.5
    ("driver", "semver('570.0.0')", "semver('580.159.4')", ("h100-driver-580", ["gpu-0"])),
    ("driver", "semver('570.0.0')", "semver('580.159.5')", None),
    ("compute-capability", "semver('10.0.0')", "semver('10.0.1')", None),
])
def test_thresholds_are_compared_at_their_edge(cluster, control_plane, example, old, new, expected):
    verdict = placed(control_plane, cluster, edited(example, old, new))
    assert ((verdict.node, verdict.devices) if verdict.node else None) == expected


def test_a_pod_asking_for_nvidia_com_gpu_gets_a_device_through_the_class(cluster, control_plane):
    """The class gpu.nvidia.com names nvidia.com/gpu as its extendedResourceName: the API server keeps it, and the
    scheduler serves a pod that asks for that resource, as pods written for the device plugin do, from a DRA node's
    devices through a claim it makes itself. The pod is held to the TITAN Xp node, which has one GPU."""
    kept = read_object(control_plane, "deviceclass", "gpu.nvidia.com")["spec"]
    assert kept.get("extendedResourceName") == "nvidia.com/gpu", kept
    only_titan = {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": ["titan-xp"]}]}]}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "counted", "namespace": NAMESPACE},
           "spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": only_titan}},
                    "containers": [{"name": "main", "image": "registry.invalid/cuda:latest",
                                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    control_plane.kubectl("create", "-f", "-", input_text=json.dumps(pod))
    claim = None
    try:
        def bound():
            return read_object(control_plane, "pod", "counted", NAMESPACE)["spec"].get("nodeName")

        wait_until(bound, PLACED_WITHIN, "kube-scheduler to place pod counted", step=0.2, log=cluster.log)
        status = read_object(control_plane, "pod", "counted", NAMESPACE)["status"]
        claim = status["extendedResourceClaimStatus"]["resourceClaimName"]
        allocation = read_object(control_plane, "resourceclaim", claim, NAMESPACE)["status"]["allocation"]
        results = allocation["devices"]["results"]
        assert [(result["driver"], result["pool"], result["device"]) for result in results] == [
            (DRIVER, "titan-xp", "gpu-0")], results
    finally:
        remove(control_plane, claim or "none", "counted")
