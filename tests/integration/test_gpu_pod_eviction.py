"""The GPU stack switch drains only the pods that hold GPUs: scv.gpu.node_gpu_drain against the real kube-apiserver.

No kubelet runs. Pods are bound to the Node by name and, where a budget must count them, reported Running and Ready
through their status as a kubelet would; a ResourceClaim's allocation is written into its status as the scheduler
would. An evicted pod is only marked for deletion by the API server (a graceful delete); the test stands in for the
kubelet and deletes it once it is marked, so the module's wait for it to be gone ends as on a real node.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time

import pytest

from harness.control_plane import read_object
from harness.dra_host import DraHost, node_object, publish_slice, publish_status, put_node, suffix

SCENARIO = "gb200_nvl_x4"
MARK = "scv.gpu/cordoned-by"
OWNER = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "controller": True}


@pytest.fixture
def host(tmp_path, monkeypatch):
    made = DraHost(tmp_path, monkeypatch)
    made.generate_spec(SCENARIO)
    return made


@pytest.fixture
def node(ansible, control_plane, request):
    """A GPU Node and a namespace of its own, both named after the test; gone afterwards."""
    plane = control_plane
    name = "evict-%s-%s" % (hashlib.sha1(request.node.name.encode()).hexdigest()[:6], suffix(ansible))
    put_node(plane, name, {"nvidia.com/gpu.present": "true"}, gpus=4)
    plane.kubectl("create", "namespace", name)
    plane.kubectl("create", "serviceaccount", "default", "-n", name)   # no controller manager makes it here
    yield name
    plane.kubectl("delete", "namespace", name, "--wait=false", check=False)
    plane.kubectl("delete", "pods", "--all", "-n", name, "--grace-period=0", "--force", check=False)
    plane.kubectl("delete", "node", name, check=False)


def create(plane, body):
    return json.loads(plane.kubectl("create", "-o", "json", "-f", "-", input_text=json.dumps(body)).stdout)


def make_pod(plane, node, name, limits=None, claim=None, owned=True, labels=None, running=False):
    """A pod bound to ``node`` (a ReplicaSet's unless ``owned`` is false); ``running``: reported Running and Ready."""
    metadata = {"name": name, "namespace": node, "labels": labels or {"app": name}}
    if owned:
        metadata["ownerReferences"] = [dict(OWNER, name=name, uid="6d2a9a52-8b0e-4c5e-9d7f-%012d" % len(name))]
    spec = {"nodeName": node, "containers": [{"name": "main", "image": "registry.example.com/cuda:12",
                                              "resources": {"limits": limits or {"cpu": "1"}}}]}
    if claim:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
        spec["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    made = create(plane, {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec})
    if running:
        ready = {"type": "Ready", "status": "True", "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        plane.kubectl("patch", "pod", name, "-n", node, "--subresource=status", "--type=merge", "-p",
                      json.dumps({"status": {"phase": "Running", "conditions": [ready]}}))
    return made["metadata"]["uid"]


def make_allocated_claim(plane, node, name):
    """A ResourceClaim whose devices gpu.nvidia.com allocated on ``node``, as the scheduler writes it."""
    create(plane, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                   "metadata": {"name": name, "namespace": node},
                   "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}})
    plane.kubectl("patch", "resourceclaim", name, "-n", node, "--subresource=status", "--type=merge", "-p", json.dumps(
        {"status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": node, "device": "gpu-0"}]}}}}))


class Kubelet(threading.Thread):
    """Stands in for the node's kubelet: deletes each pod the API server marked for deletion a second after it saw
    the mark (its containers stopping), noting the node's stack label then; once the node is labelled dra, reports
    no allocatable nvidia.com/gpu (the device plugin's pod has gone) and publishes its ResourceSlice as the DRA
    plugin does."""

    STOPPING_S = 1.0

    def __init__(self, plane, node):
        super().__init__(daemon=True)
        self.plane, self.node, self.stop, self.removed, self.marked = plane, node, threading.Event(), {}, {}

    def run(self):
        published = False
        while not self.stop.wait(0.3):
            pods = json.loads(self.plane.kubectl("get", "pods", "-n", self.node, "-o", "json").stdout)["items"]
            for pod in pods:
                if pod["metadata"].get("deletionTimestamp"):
                    seen = self.marked.setdefault(pod["metadata"]["uid"], time.monotonic())
                    if time.monotonic() - seen < self.STOPPING_S:
                        continue
                    labels = node_object(self.plane, self.node)["metadata"].get("labels") or {}
                    self.removed[pod["metadata"]["name"]] = labels.get("scv.gpu/gpu-stack")
                    self.plane.kubectl("delete", "pod", pod["metadata"]["name"], "-n", self.node, "--grace-period=0",
                                       "--force", check=False)
            labels = node_object(self.plane, self.node)["metadata"].get("labels") or {}
            if not published and labels.get("scv.gpu/gpu-stack") == "dra":
                publish_status(self.plane, self.node, {"allocatable": {"nvidia.com/gpu": "0"}})
                publish_slice(self.plane, self.node)
                published = True

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *_exc):
        self.stop.set()
        self.join(timeout=10)


def switch(ansible, plane, host, node, **more):
    # no kubelet runs pods here, so no validation pod would (test_validate runs its pods)
    settings = host.settings(plane, node, "gpu-evict-%s" % suffix(ansible), gpu_stack="dra",
                             scv_gpu_hosts="localhost", scv_gpu_kubeconfig=str(plane.admin_kubeconfig),
                             k8s_node_name=node, dra_driver_offer_timeout=60, dra_driver_validate=False)
    settings.update(more)
    return ansible.playbook("playbooks/gpu_stack.yml", SCENARIO, "-e", json.dumps(settings))


def drain(ansible, plane, node, check=False, **options):
    return ansible.module(dict(name=node, kubeconfig=str(plane.admin_kubeconfig), **options), check=check,
                          simulator=False, name="scv.gpu.node_gpu_drain")


def pod_or_none(plane, node, name):
    return read_object(plane, "pod", name, node, missing_ok=True)


def test_the_switch_evicts_the_gpu_pods_and_the_cpu_pod_stays(ansible, control_plane, host, node):
    plane = control_plane
    make_pod(plane, node, "trainer", limits={"nvidia.com/gpu": "1"})
    make_allocated_claim(plane, node, "inference-gpu")
    make_pod(plane, node, "inference", claim="inference-gpu")
    cpu_uid = make_pod(plane, node, "web")

    with Kubelet(plane, node) as kubelet:
        done = switch(ansible, plane, host, node)
    assert done.returncode == 0, done.stdout + done.stderr
    # both GPU pods were evicted while the node still ran the device plugin; the CPU pod was not touched
    assert kubelet.removed == {"trainer": None, "inference": None}
    assert pod_or_none(plane, node, "trainer") is None and pod_or_none(plane, node, "inference") is None
    web = pod_or_none(plane, node, "web")
    assert web["metadata"]["uid"] == cpu_uid and not web["metadata"].get("deletionTimestamp")
    after = node_object(plane, node)
    assert after["metadata"]["labels"]["scv.gpu/gpu-stack"] == "dra" and not after["spec"].get("unschedulable")
    assert "TASK [scv.gpu.dra_driver : Drain the GPU pods of node %s]" % node in done.stdout


def test_drain_pods_all_drains_the_cpu_pods_too(ansible, control_plane, host, node):
    plane = control_plane
    make_pod(plane, node, "web")

    with Kubelet(plane, node) as kubelet:
        done = switch(ansible, plane, host, node, dra_driver_drain_pods="all")
    assert done.returncode == 0, done.stdout + done.stderr
    assert kubelet.removed == {"web": None} and pod_or_none(plane, node, "web") is None
    assert "TASK [scv.gpu.dra_driver : Drain node %s]" % node in done.stdout


def test_a_budget_that_forbids_the_eviction_stops_the_switch_and_the_node_stays_cordoned(
        ansible, control_plane, host, node):
    plane = control_plane
    make_pod(plane, node, "trainer", limits={"nvidia.com/gpu": "1"}, running=True)
    budget = create(plane, {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                            "metadata": {"name": "trainers", "namespace": node},
                            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "trainer"}}}})
    # as the disruption controller counts it: one pod healthy, one needed, no disruption allowed
    plane.kubectl("patch", "pdb", "trainers", "-n", node, "--subresource=status", "--type=merge", "-p", json.dumps(
        {"status": {"observedGeneration": budget["metadata"]["generation"], "disruptionsAllowed": 0,
                    "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1}}))

    started = time.monotonic()
    done = switch(ansible, plane, host, node, dra_driver_drain_timeout=5)
    assert done.returncode != 0
    output = " ".join(done.stdout.split())
    assert ("Node %s still has GPU pods after 5 s: %s/trainer was not evicted: PodDisruptionBudget %s/trainers "
            "(disruptionsAllowed 0) refuses it" % (node, node, node)) in output, output
    assert time.monotonic() - started >= 5
    trainer = pod_or_none(plane, node, "trainer")
    assert trainer is not None and not trainer["metadata"].get("deletionTimestamp")
    stuck = node_object(plane, node)
    assert stuck["spec"]["unschedulable"] is True and stuck["metadata"]["annotations"][MARK] == "scv.gpu.gpu_stack"
    assert "scv.gpu/gpu-stack" not in (stuck["metadata"].get("labels") or {})     # the label waits for the drain


def test_check_mode_names_the_gpu_pods_and_evicts_nothing(ansible, control_plane, node):
    plane = control_plane
    uid = make_pod(plane, node, "trainer", limits={"nvidia.com/mig-1g.10gb": "1"})
    make_pod(plane, node, "web")

    succeeded, result = drain(ansible, plane, node, check=True)
    assert succeeded, result
    assert result["changed"] is True and result["evicted"] == ["%s/trainer" % node], result
    assert result["holdings"] == {"%s/trainer" % node: ["requests nvidia.com/mig-1g.10gb"]}
    assert result["kept"] == ["%s/web" % node]
    trainer = pod_or_none(plane, node, "trainer")
    assert trainer["metadata"]["uid"] == uid and not trainer["metadata"].get("deletionTimestamp")


def test_a_bare_gpu_pod_is_refused_unless_forced(ansible, control_plane, node):
    plane = control_plane
    make_pod(plane, node, "notebook", limits={"nvidia.com/gpu": "1"}, owned=False)
    owned_uid = make_pod(plane, node, "trainer", limits={"nvidia.com/gpu": "1"})

    succeeded, result = drain(ansible, plane, node, timeout=5)
    assert not succeeded
    assert ("these GPU pods cannot be evicted, so none was: %s/notebook (requests nvidia.com/gpu): it has no "
            "controller" % node) in result["msg"], result
    assert result["changed"] is False and result["evicted"] == []
    assert not pod_or_none(plane, node, "trainer")["metadata"].get("deletionTimestamp")
    assert pod_or_none(plane, node, "trainer")["metadata"]["uid"] == owned_uid

    with Kubelet(plane, node) as kubelet:
        succeeded, result = drain(ansible, plane, node, force=True, timeout=30)
        # the module returned once both were gone, not once they were marked
        assert pod_or_none(plane, node, "notebook") is None and pod_or_none(plane, node, "trainer") is None
    assert succeeded, result
    assert sorted(result["evicted"]) == ["%s/notebook" % node, "%s/trainer" % node] and result["changed"] is True
    assert sorted(kubelet.removed) == ["notebook", "trainer"]


def test_an_evicted_pod_that_its_kubelet_never_finishes_fails_the_drain_naming_it(ansible, control_plane, node):
    plane = control_plane
    make_pod(plane, node, "trainer", limits={"nvidia.com/gpu": "1"})

    succeeded, result = drain(ansible, plane, node, timeout=2)     # no kubelet deletes it
    assert not succeeded
    assert ("Node %s still has GPU pods after 2 s: %s/trainer was evicted but is still there (its kubelet on Node %s "
            "has not stopped it" % (node, node, node)) in result["msg"], result
    assert result["changed"] is True and result["evicted"] == ["%s/trainer" % node]
    assert pod_or_none(plane, node, "trainer")["metadata"].get("deletionTimestamp")
