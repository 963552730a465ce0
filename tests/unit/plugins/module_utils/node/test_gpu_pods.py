"""Which pods of a node hold GPUs, and which of those a drain may evict."""

from __future__ import annotations

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.kube.pods import refusal_reason
from ansible_collections.scv.gpu.plugins.module_utils.node.gpu_pods import (
    DEFAULT_DRIVERS,
    DEFAULT_RESOURCES,
    budgets_of,
    claim_names,
    gpu_holdings,
    refusal,
    select,
    selects,
    why_left,
)

REPLICA_SET = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "job", "controller": True, "uid": "1"}
DAEMON_SET = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "exporter", "controller": True, "uid": "2"}


def pod(name="job-1", containers=None, init=None, claims=None, claim_statuses=None, owner="ReplicaSet",
        phase="Running", annotations=None, volumes=None, labels=None):
    owner = REPLICA_SET if owner == "ReplicaSet" else owner
    metadata = {"name": name, "namespace": "ml", "uid": "uid-" + name, "labels": labels or {}}
    if owner:
        metadata["ownerReferences"] = [owner]
    if annotations:
        metadata["annotations"] = annotations
    spec = {"nodeName": "gpu-1", "containers": containers or [container()]}
    if init:
        spec["initContainers"] = init
    if claims:
        spec["resourceClaims"] = claims
    if volumes:
        spec["volumes"] = volumes
    status = {"phase": phase}
    if claim_statuses:
        status["resourceClaimStatuses"] = claim_statuses
    return {"metadata": metadata, "spec": spec, "status": status}


def container(requests=None, limits=None):
    resources = {}
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    return {"name": "main", "image": "registry.example.com/cuda:12", "resources": resources}


def allocated(*drivers):
    return {"status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": driver, "pool": "gpu-1", "device": "gpu-%d" % index}
        for index, driver in enumerate(drivers)]}}}}


CLAIMS = {("ml", "job-1-gpu-x7k2q"): allocated("gpu.nvidia.com"),
          ("ml", "shared-gpus"): allocated("gpu.nvidia.com", "gpu.nvidia.com"),
          ("ml", "nic"): allocated("sriovnetwork.example.com"),
          ("ml", "pending"): {"status": {}},
          ("other", "shared-gpus"): allocated("sriovnetwork.example.com")}


def claim_of(namespace, name):
    return CLAIMS.get((namespace, name))


def holdings(subject, resources=DEFAULT_RESOURCES, drivers=DEFAULT_DRIVERS):
    return gpu_holdings(subject, resources, drivers, claim_of)


@pytest.mark.parametrize("subject, expected", [
    (pod(containers=[container(limits={"nvidia.com/gpu": "1"})]), ["requests nvidia.com/gpu"]),
    (pod(containers=[container(requests={"nvidia.com/gpu.shared": "1", "cpu": "2"})]),
     ["requests nvidia.com/gpu.shared"]),
    (pod(containers=[container(limits={"nvidia.com/mig-1g.10gb": "2"})]), ["requests nvidia.com/mig-1g.10gb"]),
    (pod(containers=[container(requests={"cpu": "2", "memory": "1Gi"}), container()]), []),
    # another vendor's, and a name that only starts like ours
    (pod(containers=[container(limits={"amd.com/gpu": "1", "nvidia.com/gpus": "1"})]), []),
    # a second container holds it
    (pod(containers=[container(), container(limits={"nvidia.com/gpu": "1"})]), ["requests nvidia.com/gpu"]),
    # an init container (a sidecar) holds it
    (pod(init=[container(limits={"nvidia.com/gpu": "1"})]), ["requests nvidia.com/gpu"]),
    # a limit of zero, however spelt, holds no GPU: the pod is not a GPU pod and stays
    (pod(containers=[container(limits={"nvidia.com/gpu": "0"}, requests={"nvidia.com/gpu": "0"})]), []),
    (pod(containers=[container(limits={"nvidia.com/gpu": 0}), container(limits={"nvidia.com/gpu": "0.0"})]), []),
    (pod(containers=[container(limits={"nvidia.com/gpu": "0"}), container(limits={"nvidia.com/gpu": "2"})]),
     ["requests nvidia.com/gpu"]),
])
def test_a_pod_holds_the_gpu_resources_its_containers_ask_for(subject, expected):
    assert holdings(subject) == expected


def test_the_patterns_are_a_parameter():
    mig = pod(containers=[container(limits={"nvidia.com/mig-3g.20gb": "1"})])
    whole = pod(containers=[container(limits={"nvidia.com/gpu": "1"})])
    assert holdings(mig, resources=["nvidia.com/mig-*"]) == ["requests nvidia.com/mig-3g.20gb"]
    assert holdings(whole, resources=["nvidia.com/mig-*"]) == []
    assert holdings(pod(containers=[container(limits={"example.com/fpga": "1"})]),
                    resources=["example.com/*"]) == ["requests example.com/fpga"]


@pytest.mark.parametrize("subject, expected", [
    # made from a template, named in the pod's status
    (pod(claims=[{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
         claim_statuses=[{"name": "gpu", "resourceClaimName": "job-1-gpu-x7k2q"}]),
     ["claim job-1-gpu-x7k2q allocated by gpu.nvidia.com"]),
    # named in the spec, shared with other pods
    (pod(claims=[{"name": "gpus", "resourceClaimName": "shared-gpus"}]),
     ["claim shared-gpus allocated by gpu.nvidia.com"]),
    # another driver's devices, a claim not allocated yet, a claim that is gone, a template not yet made into one
    (pod(claims=[{"name": "net", "resourceClaimName": "nic"}]), []),
    (pod(claims=[{"name": "gpu", "resourceClaimName": "pending"}]), []),
    (pod(claims=[{"name": "gpu", "resourceClaimName": "deleted"}]), []),
    (pod(claims=[{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
         claim_statuses=[{"name": "gpu", "resourceClaimName": None}]), []),
])
def test_a_pod_holds_the_gpus_of_its_claims_that_a_gpu_driver_allocated(subject, expected):
    assert holdings(subject) == expected


def test_claims_are_read_in_the_pods_namespace_and_drivers_are_a_parameter():
    other = pod(claims=[{"name": "gpus", "resourceClaimName": "shared-gpus"}])
    other["metadata"]["namespace"] = "other"
    assert holdings(other) == []
    nic = pod(claims=[{"name": "net", "resourceClaimName": "nic"}])
    assert holdings(nic, drivers=["sriovnetwork.example.com"]) == ["claim nic allocated by sriovnetwork.example.com"]
    shared = pod(claims=[{"name": "gpus", "resourceClaimName": "shared-gpus"}])
    assert holdings(shared, drivers=[]) == []


def test_a_pod_with_both_is_named_with_both():
    both = pod(containers=[container(limits={"nvidia.com/gpu": "1"})],
               claims=[{"name": "gpus", "resourceClaimName": "shared-gpus"}])
    assert holdings(both) == ["requests nvidia.com/gpu", "claim shared-gpus allocated by gpu.nvidia.com"]


def test_claim_names_come_from_spec_and_status_once_each():
    both = pod(claims=[{"name": "a", "resourceClaimName": "shared-gpus"}, {"name": "b", "resourceClaimTemplateName": "t"}],
               claim_statuses=[{"name": "b", "resourceClaimName": "job-1-b-abcde"}])
    assert claim_names(both) == ["job-1-b-abcde", "shared-gpus"]


GPU = [container(limits={"nvidia.com/gpu": "1"})]


@pytest.mark.parametrize("subject, reason", [
    (pod(containers=GPU, owner=DAEMON_SET), "DaemonSet"),
    (pod(containers=GPU, owner=None, annotations={"kubernetes.io/config.mirror": "9f3c"}), "mirror"),
    (pod(containers=GPU, phase="Succeeded"), "finished"),
    (pod(containers=GPU, phase="Failed"), "finished"),
    (pod(containers=GPU, phase="Pending"), None),
    (pod(containers=GPU), None),
])
def test_daemonset_mirror_and_finished_pods_are_left(subject, reason):
    assert why_left(subject) == reason


def test_select_evicts_the_gpu_pods_and_leaves_the_rest():
    pods = [pod("train", containers=GPU), pod("web"), pod("exporter", containers=GPU, owner=DAEMON_SET),
            pod("static", containers=GPU, owner=None, annotations={"kubernetes.io/config.mirror": "x"}),
            pod("done", containers=GPU, phase="Succeeded"),
            pod("infer", claims=[{"name": "gpus", "resourceClaimName": "shared-gpus"}])]
    asked = []

    def reading(namespace, name):
        asked.append((namespace, name))
        return claim_of(namespace, name)

    chosen, left = select(pods, DEFAULT_RESOURCES, DEFAULT_DRIVERS, reading)
    assert [(entry["metadata"]["name"], held) for entry, held in chosen] == [
        ("train", ["requests nvidia.com/gpu"]), ("infer", ["claim shared-gpus allocated by gpu.nvidia.com"])]
    assert left == ["ml/web", "ml/exporter", "ml/static", "ml/done"]
    assert asked == [("ml", "shared-gpus")]     # only the claims of pods that may be evicted are read


@pytest.mark.parametrize("subject, force, emptydir, expected", [
    (pod(containers=GPU), False, False, None),
    (pod(containers=GPU, owner=None), False, False, "it has no controller"),
    (pod(containers=GPU, owner=None), True, False, None),
    (pod(containers=GPU, owner=dict(REPLICA_SET, controller=False)), False, False, "it has no controller"),
    (pod(containers=GPU, volumes=[{"name": "scratch", "emptyDir": {}}]), False, False, "its emptyDir data"),
    (pod(containers=GPU, volumes=[{"name": "scratch", "emptyDir": {}}]), False, True, None),
    (pod(containers=GPU, volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "d"}}]), False, False,
     None),
])
def test_refusal_keeps_kubectl_drains_care(subject, force, emptydir, expected):
    reason = refusal(subject, force, emptydir)
    assert (reason if reason is None else reason[:len(expected)]) == expected


def test_the_budgets_of_a_pod_are_those_whose_selector_picks_it():
    def budget(name, selector, allowed=0):
        spec = {} if selector is None else {"selector": selector}
        return {"metadata": {"name": name, "namespace": "ml"}, "spec": spec,
                "status": {"disruptionsAllowed": allowed}}

    subject = pod(labels={"app": "trainer", "tier": "gpu"})
    budgets = [budget("trainers", {"matchLabels": {"app": "trainer"}}),
               budget("web", {"matchLabels": {"app": "web"}}, 1),
               budget("gpu-tier", {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu"]}]}),
               budget("everything", {}, 3),
               budget("nothing", None)]
    assert budgets_of(subject, budgets) == ["ml/trainers (disruptionsAllowed 0)", "ml/gpu-tier (disruptionsAllowed 0)",
                                            "ml/everything (disruptionsAllowed 3)"]


@pytest.mark.parametrize("expression, expected", [
    ({"key": "app", "operator": "NotIn", "values": ["web"]}, True),
    ({"key": "app", "operator": "NotIn", "values": ["trainer"]}, False),
    ({"key": "app", "operator": "Exists"}, True),
    ({"key": "zone", "operator": "Exists"}, False),
    ({"key": "zone", "operator": "DoesNotExist"}, True),
    ({"key": "app", "operator": "Gt", "values": ["1"]}, False),
])
def test_selector_expressions(expression, expected):
    assert selects({"matchExpressions": [expression]}, {"app": "trainer"}) is expected


def test_a_429s_reason_names_the_budget_the_server_names():
    body = ('{"kind":"Status","status":"Failure","message":"Cannot evict pod as it would violate the pod\'s '
            'disruption budget.","reason":"TooManyRequests","details":{"causes":[{"reason":"DisruptionBudget",'
            '"message":"The disruption budget trainers needs 1 healthy pods and has 1 currently"}]},"code":429}')
    assert refusal_reason(body) == ("Cannot evict pod as it would violate the pod's disruption budget. The disruption "
                                    "budget trainers needs 1 healthy pods and has 1 currently")
    assert refusal_reason(b"not json") == "not json"
