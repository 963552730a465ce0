"""The validation's checks, pods and reports, read back the way their readers read them (an XML parser for JUnit,
json for the conformance evidence)."""

from __future__ import annotations

import json
from xml.etree import ElementTree

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.node.validation import (
    FAILED, PASSED, SKIPPED, cdi_problems, check, conformance, container_outcome, isolation_problems, junit,
    missing_device_nodes, series_naming_pod, table, validation_pods)
from ansible_collections.scv.gpu.plugins.module_utils.node.validation_run import validate_pods

GPU_A, GPU_B = "GPU-5a7c0000-1f2e-4d3c-8b4a-9e8d7c6b5a40", "GPU-5a7c0001-1f2e-4d3c-8b4a-9e8d7c6b5a41"
RESULTS = [
    check("gpu-b", "workload", failure='container workload exited 1: CUDA error <no device> & "more"'),
    check("gpu-a", "workload"),
    check("gpu-a", "no_request"),
    check("gpu-b", "no_request"),
    check("gpu-a", "device_nodes", skipped="check mode"),
]


def test_an_unknown_check_is_refused():
    with pytest.raises(ValueError):
        check("gpu-a", "workloads")


def test_missing_device_nodes_name_uvm_tools_and_the_gpus_by_their_minors():
    present = {"nvidiactl", "nvidia-uvm", "nvidia0", "nvidia2"}
    assert missing_device_nodes(present, [0, 2, 3]) == ["nvidia-uvm-tools", "nvidia3"]
    assert missing_device_nodes(present | {"nvidia-uvm-tools", "nvidia3"}, [0, 2, 3]) == []


def test_a_cdi_spec_must_name_every_gpu_and_no_other():
    spec = {"devices": [{"name": "0"}, {"name": GPU_A}, {"name": "all"}]}
    assert cdi_problems(spec, [GPU_A]) == []
    assert cdi_problems(spec, [GPU_A, GPU_B]) == ["it lacks GPU %s" % GPU_B]
    assert cdi_problems(spec, []) == ["it names GPU %s, which the driver does not have" % GPU_A]
    assert cdi_problems({"kind": "nvidia.com/gpu"}, [GPU_A]) == ["it holds no device list"]
    assert cdi_problems(None, [GPU_A]) == ["it holds no device list"]


def test_isolation_needs_both_settings_and_nvidias_defaults_have_neither():
    isolated = {"accept-nvidia-visible-devices-envvar-when-unprivileged": False,
                "accept-nvidia-visible-devices-as-volume-mounts": True}
    assert isolation_problems(isolated) == []
    assert len(isolation_problems({})) == 2
    honoured = dict(isolated, **{"accept-nvidia-visible-devices-envvar-when-unprivileged": True})
    assert ["envvar-when-unprivileged" in problem for problem in isolation_problems(honoured)] == [True]
    # a string is not the boolean false the runtime needs
    assert len(isolation_problems(dict(isolated, **{
        "accept-nvidia-visible-devices-envvar-when-unprivileged": "false"}))) == 1


def test_the_workload_pod_asks_for_one_gpu_and_its_second_container_for_nothing():
    workload = {"image": "cuda-sample", "command": []}
    probe = {"image": "busybox", "command": ["sh", "-c", "true"], "pull_policy": "Never"}
    pods = validation_pods("gpu-a", "host-a", "run1", workload, probe, {"resource": "nvidia.com/gpu"})
    (checks, pod), (other_checks, other) = pods
    assert checks == {"workload": "workload", "second_container": "no-request"}
    assert other_checks == {"no_request": "probe"}
    first, second = pod["spec"]["containers"]
    assert first["resources"] == {"limits": {"nvidia.com/gpu": "1"}} and "command" not in first
    assert "resources" not in second and second["command"] == ["sh", "-c", "true"]
    assert {item["name"]: item["value"] for item in second["env"]}["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert pod["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "host-a"}
    assert pod["spec"]["restartPolicy"] == "Never" and "resourceClaims" not in pod["spec"]
    assert "resources" not in other["spec"]["containers"][0]
    claimed = validation_pods("gpu-a", "host-a", "run1", workload, probe, {"claim": "c1"})[0][1]
    assert claimed["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimName": "c1"}]
    assert claimed["spec"]["containers"][0]["resources"] == {"claims": [{"name": "gpu"}]}


@pytest.mark.parametrize("state, expected", [
    ({"terminated": {"exitCode": 0}}, (True, None)),
    ({"terminated": {"exitCode": 1, "message": "found /dev/nvidia0\n"}},
     (True, "container probe exited 1: found /dev/nvidia0")),
    ({"terminated": {"exitCode": 137, "reason": "OOMKilled"}}, (True, "container probe exited 137: OOMKilled")),
    ({"waiting": {"reason": "ErrImagePull", "message": "not found"}},
     (True, "container probe cannot start: ErrImagePull: not found")),
    ({"waiting": {"reason": "ContainerCreating"}}, (False, None)),
    ({"running": {}}, (False, None)),
])
def test_a_containers_outcome(state, expected):
    pod = {"status": {"containerStatuses": [{"name": "other", "state": {"running": {}}},
                                            {"name": "probe", "state": state}]}}
    assert container_outcome(pod, "probe") == expected


def test_the_table_has_a_row_per_node_and_a_column_per_check_then_every_failure():
    text = table(RESULTS)
    assert text.splitlines()[:4] == [
        "| node | device_nodes | workload | no_request |",
        "| --- | --- | --- | --- |",
        "| gpu-a | skip | pass | pass |",
        "| gpu-b | - | FAIL | pass |"]
    assert '- gpu-b, workload: container workload exited 1: CUDA error <no device> & "more"' in text
    assert "- gpu-a, device_nodes: check mode" in text


def test_junit_is_xml_with_a_suite_per_node_and_a_case_per_check():
    root = ElementTree.fromstring(junit(RESULTS))
    assert (root.get("tests"), root.get("failures"), root.get("skipped")) == ("5", "1", "1")
    suites = {suite.get("name"): suite for suite in root.findall("testsuite")}
    assert sorted(suites) == ["gpu-a", "gpu-b"]
    failed = suites["gpu-b"].find("testcase[@name='workload']/failure")
    assert failed.get("message") == 'container workload exited 1: CUDA error <no device> & "more"'
    assert suites["gpu-a"].find("testcase[@name='device_nodes']/skipped").get("message") == "check mode"
    assert suites["gpu-a"].find("testcase[@name='workload']").find("failure") is None


def test_the_conformance_evidence_maps_each_requirement_to_its_checks():
    evidence = json.loads(conformance(RESULTS))
    secure = evidence["requirements"]["secure_accelerator_access"]
    assert secure["level"] == "MUST" and secure["passed"] is False
    assert [(item["node"], item["check"], item["outcome"]) for item in secure["evidence"]] == [
        ("gpu-a", "no_request", PASSED), ("gpu-a", "workload", PASSED), ("gpu-b", "no_request", PASSED),
        ("gpu-b", "workload", FAILED)]
    assert evidence["requirements"]["accelerator_metrics"] == {"level": "MUST", "passed": None, "evidence": []}
    only_skipped = json.loads(conformance([check("gpu-a", "device_nodes", skipped="check mode")]))
    assert only_skipped["requirements"]["driver_runtime_management"]["passed"] is None
    passing = json.loads(conformance([check("gpu-a", "workload"), check("gpu-a", "no_request")]))
    assert passing["requirements"]["secure_accelerator_access"]["passed"] is True
    assert SKIPPED not in json.dumps(passing["requirements"])


EXPOSITION = """# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",pod="",namespace="",container=""} 0
DCGM_FI_DEV_GPU_UTIL{gpu="3",UUID="GPU-d",container="holder",namespace="scv-gpu-validation",pod="scv-validate-1-metrics"} 7
DCGM_FI_DEV_GPU_UTIL{gpu="4",UUID="GPU-e",pod="scv-validate-1-metrics",namespace="elsewhere"} 0
DCGM_FI_DEV_FB_USED{gpu="5",pod="scv-validate-1-metrics",namespace="scv-gpu-validation"} 10
DCGM_FI_DEV_GPU_UTIL{gpu="6",pod="a \\"quoted\\" pod",namespace="scv-gpu-validation",modelName="H100 {SXM}"} 1
"""


def test_the_series_naming_a_pod_are_found_by_its_pod_and_namespace_labels_only():
    found = series_naming_pod(EXPOSITION, "scv-gpu-validation", "scv-validate-1-metrics")
    assert [labels["gpu"] for labels in found] == ["3"]
    assert series_naming_pod(EXPOSITION, "scv-gpu-validation", 'a \\"quoted\\" pod')[0]["modelName"] == "H100 {SXM}"
    assert series_naming_pod(EXPOSITION, "scv-gpu-validation", "scv-validate-2-metrics") == []


REFUSED = ("Pod was rejected: Allocate failed due to no healthy devices present; cannot allocate unhealthy devices "
           "nvidia.com/gpu, which is unexpected")


def test_a_pod_the_kubelet_refused_has_ended_with_its_reason():
    refused = {"status": {"phase": "Failed", "reason": "UnexpectedAdmissionError", "message": REFUSED}}
    assert container_outcome(refused, "workload") == (
        True, "container workload never ran to its end, the pod failed: UnexpectedAdmissionError: " + REFUSED)
    assert container_outcome({"status": {"phase": "Pending"}}, "workload") == (False, None)
    evicted = {"status": {"phase": "Failed", "reason": "Evicted", "containerStatuses": [
        {"name": "workload", "state": {"running": {}}}]}}
    assert container_outcome(evicted, "workload")[1].endswith("the pod failed: Evicted:")


class FakeApi:
    """What validation_run asks the API server, answered from a script: the holder pod's phase over time."""

    def __init__(self, phases, labels=None, shared_running=None, offered=None, placed=True, workload_exit=0):
        self.phases, self.made, self.deleted = list(phases), [], []
        self.labels, self.shared_running, self.placed = dict(labels or {}), shared_running, placed
        self.workload_exit = workload_exit
        if offered is None:      # what a plugin sharing as the labels say offers
            offered = int(self.labels.get("nvidia.com/gpu.count", "8")) * int(
                self.labels.get("nvidia.com/gpu.replicas", "1"))
        self.offered = offered

    def node(self, name):
        return {"metadata": {"labels": dict(self.labels, **{"kubernetes.io/hostname": name})},
                "status": {"allocatable": {"cpu": "2", "nvidia.com/gpu": str(self.offered)}}}

    def namespace_exists(self, namespace):
        return True

    def create_in(self, namespace, body):
        self.made.append(body["metadata"]["name"])

    def delete_in(self, namespace, name):
        self.deleted.append(name)

    def current(self, namespace, name):
        if "-share-" in name:
            running = int(name.rsplit("-", 1)[1]) < self.shared_running
            return {"status": {"phase": "Running" if running else "Pending", "conditions": [] if running else [
                {"type": "PodScheduled", "status": "False", "message": "0/1 nodes are available: 1 Insufficient "
                                                                       "nvidia.com/gpu."}]}}
        if name.endswith("-workload") and self.placed == "refused":
            return {"spec": {"nodeName": "gpu-a"}, "status": {
                "phase": "Failed", "reason": "UnexpectedAdmissionError", "message": REFUSED}}
        if name.endswith("-workload") and not self.placed:
            return {"status": {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "message": "0/1 nodes are available: 1 Insufficient "
                                                                       "nvidia.com/gpu."}]}}
        if not name.endswith("-metrics"):
            container = name.endswith("-workload") and ["workload", "no-request"] or ["probe"]
            code = self.workload_exit if name.endswith("-workload") else 0
            return {"spec": {"nodeName": "gpu-a"},
                    "status": {"phase": "Failed" if code else "Succeeded",
                               "containerStatuses": [{"name": each, "state": {"terminated": {"exitCode": code}}}
                                                     for each in container]}}
        phase = self.phases.pop(0) if len(self.phases) > 1 else self.phases[0]
        return {"status": {"phase": phase}}


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def _run(api, read, hold=5):
    clock = Clock()
    metrics = {"url": "http://gpu-a:9400/metrics", "read": read, "hold": hold}
    found = validate_pods(api, "gpu-a", "scv-gpu-validation", {"image": "w"}, {"image": "p"},
                          {"resource": "nvidia.com/gpu"}, 30, metrics=metrics, clock=clock, sleep=clock.sleep)
    return {item["check"]: (item["outcome"], item["reason"]) for item in found}, clock.now


def test_the_metrics_check_passes_once_the_agent_names_the_holder_pod():
    api = FakeApi(["Pending", "Pending", "Running"])
    reads = []

    def read():
        reads.append(1)
        name = [made for made in api.made if made.endswith("-metrics")][0]
        return EXPOSITION.replace("scv-validate-1-metrics", name) if len(reads) >= 3 else EXPOSITION
    found = _run(api, read)[0]
    assert found["metrics"] == ("passed", "") and len(reads) == 3
    assert sorted(api.deleted) == sorted(api.made) and len(api.made) == 3


def test_the_metrics_check_fails_when_the_agent_never_names_the_pod_or_does_not_answer():
    found, now = _run(FakeApi(["Running"]), lambda: EXPOSITION, hold=5)
    outcome, reason = found["metrics"]
    assert outcome == FAILED and "served no DCGM_FI_DEV_GPU_UTIL series naming pod scv-gpu-validation/" in reason
    assert "in the 5 s" in reason and now <= 10

    def refused():
        raise ConnectionRefusedError(111, "Connection refused")
    outcome, reason = _run(FakeApi(["Running"]), refused)[0]["metrics"]
    assert outcome == FAILED and "http://gpu-a:9400/metrics cannot be read" in reason and "running" in reason


def test_a_holder_pod_that_never_runs_fails_the_metrics_check_and_is_deleted():
    api = FakeApi(["Pending"])
    found = _run(api, lambda: EXPOSITION)[0]
    assert found["metrics"][0] == FAILED and "within 30 s: container holder did not start" in found["metrics"][1]
    assert sorted(api.deleted) == sorted(api.made)


def test_without_a_metrics_url_the_check_is_skipped():
    api = FakeApi(["Running"])
    found = validate_pods(api, "gpu-a", "ns", {"image": "w"}, {"image": "p"}, {"resource": "nvidia.com/gpu"}, 30,
                          clock=Clock(), sleep=lambda _seconds: None)
    assert found[-1]["check"] == "metrics" and found[-1]["outcome"] == SKIPPED and len(api.made) == 2
    assert found[-2]["check"] == "sharing" and found[-2]["outcome"] == SKIPPED
    assert "nvidia.com/gpu.replicas is unset" in found[-2]["reason"]


def test_sharing_runs_one_more_pod_than_gpus_and_needs_them_all_running_at_once():
    shared = {"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.count": "2"}
    api = FakeApi(["Running"], shared, shared_running=3)
    clock = Clock()
    found = validate_pods(api, "gpu-a", "ns", {"image": "w"}, {"image": "p"}, {"resource": "nvidia.com/gpu"}, 30,
                          clock=clock, sleep=clock.sleep)
    assert found[3] == check("gpu-a", "sharing")
    assert len([name for name in api.made if "-share-" in name]) == 3 and sorted(api.deleted) == sorted(api.made)

    api = FakeApi(["Running"], shared, shared_running=2)
    clock = Clock()
    found = validate_pods(api, "gpu-a", "ns", {"image": "w"}, {"image": "p"}, {"resource": "nvidia.com/gpu"}, 30,
                          clock=clock, sleep=clock.sleep)
    assert found[3]["outcome"] == FAILED and sorted(api.deleted) == sorted(api.made)
    assert found[3]["reason"].startswith("2 of 3 pods asking for one nvidia.com/gpu each ran at once on a node of 2 "
                                         "GPUs shared 4 ways"), found[3]
    assert "not scheduled: 0/1 nodes are available: 1 Insufficient nvidia.com/gpu." in found[3]["reason"]


@pytest.mark.parametrize("labels", [{}, {"nvidia.com/gpu.replicas": "1", "nvidia.com/gpu.count": "8"},
                                    {"nvidia.com/gpu.replicas": "0", "nvidia.com/gpu.count": "0"}])
def test_a_node_that_shares_nothing_skips_the_sharing_check(labels):
    api = FakeApi(["Running"], labels)
    found = validate_pods(api, "gpu-a", "ns", {"image": "w"}, {"image": "p"}, {"resource": "nvidia.com/gpu"}, 30,
                          clock=Clock(), sleep=lambda _seconds: None)
    assert found[3]["check"] == "sharing" and found[3]["outcome"] == SKIPPED
    assert not [name for name in api.made if "-share-" in name]


def test_a_node_offering_fewer_than_its_labels_promise_fails_sharing_without_starting_a_pod():
    """Labels saying 8 GPUs shared 2 ways, allocatable 8: 9 pods can never run at once, and no timeout is waited."""
    api = FakeApi(["Running"], {"nvidia.com/gpu.replicas": "2", "nvidia.com/gpu.count": "8"}, offered=8)
    clock = Clock()
    found = validate_pods(api, "gpu-a", "ns", {"image": "w"}, {"image": "p"}, {"resource": "nvidia.com/gpu"}, 30,
                          clock=clock, sleep=clock.sleep)
    assert found[3]["outcome"] == FAILED and not [name for name in api.made if "-share-" in name]
    assert found[3]["reason"].startswith("the node offers 8 nvidia.com/gpu (its allocatable), fewer than the 9 pods "
                                         "asking for one each that its labels promise to run at once (8 GPUs shared "
                                         "2 ways)"), found[3]
    assert clock.now < 30

    api = FakeApi(["Running"], {"nvidia.com/gpu.replicas": "2", "nvidia.com/gpu.count": "8"}, offered=9,
                  shared_running=9)
    found = validate_pods(api, "gpu-a", "ns", {"image": "w"}, {"image": "p"}, {"resource": "nvidia.com/gpu"}, 30,
                          clock=Clock(), sleep=lambda _seconds: None)
    assert found[3] == check("gpu-a", "sharing") and len([name for name in api.made if "-share-" in name]) == 9


@pytest.mark.parametrize("placed, workload, how", [
    (False, "not scheduled: 0/1 nodes are available: 1 Insufficient nvidia.com/gpu.", "was never placed on the node"),
    ("refused", "the pod failed: UnexpectedAdmissionError: Pod was rejected: Allocate failed",
     "was refused by the node's kubelet (UnexpectedAdmissionError)")])
def test_when_the_workload_gets_no_gpu_the_checks_holding_one_are_not_tried(placed, workload, how):
    """No pod asking for a GPU fares better where the workload's got none: one timeout is waited at most, not three,
    and a pod the kubelet refused ends the wait at once."""
    api = FakeApi(["Running"], {"nvidia.com/gpu.replicas": "2", "nvidia.com/gpu.count": "8"}, placed=placed)
    found, now = _run(api, lambda: EXPOSITION)
    assert found["workload"][0] == FAILED and workload in found["workload"][1], found
    for name in ("sharing", "metrics"):
        assert found[name][0] == FAILED, found
        assert found[name][1].startswith("not tried: the workload pod scv-gpu-validation/scv-validate-"), found
        assert found[name][1].endswith("which asks for one GPU as they do, " + how), found
    assert found["no_request"] == ("passed", "")
    assert not [name for name in api.made if "-share-" in name or name.endswith("-metrics")], api.made
    assert now <= (31 if placed is False else 1) and sorted(api.deleted) == sorted(api.made)

    # a node sharing nothing still says so
    found = _run(FakeApi(["Running"], placed=False), lambda: EXPOSITION)[0]
    assert found["sharing"][0] == SKIPPED and found["metrics"][0] == FAILED


def test_a_workload_that_ran_and_failed_still_leaves_the_checks_holding_a_gpu_to_run():
    """Its pod got its GPU (its containers ran): sharing and metrics are tried as ever."""
    api = FakeApi(["Running"], {"nvidia.com/gpu.replicas": "2", "nvidia.com/gpu.count": "8"}, shared_running=9,
                  workload_exit=1)
    found = _run(api, lambda: EXPOSITION.replace("scv-validate-1-metrics", [
        made for made in api.made if made.endswith("-metrics")][0]) if api.made else EXPOSITION)[0]
    assert found["workload"][0] == FAILED and "exited 1" in found["workload"][1]
    assert found["sharing"] == ("passed", "") and not found["metrics"][1].startswith("not tried"), found
