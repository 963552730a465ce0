"""Each pod's own memory and utilization on a shared GPU: processes tied to pods by their cgroup and the kubelet's
pod logs directory, NVML's per-process answers from the simulator, and the series the metrics make of them."""

from __future__ import annotations

import json
import os

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.agent.metrics import exposition
from ansible_collections.scv.gpu.plugins.module_utils.agent.pod_attribution import device_holders, device_replicas
from ansible_collections.scv.gpu.plugins.module_utils.agent.readings import Readings
from ansible_collections.scv.gpu.plugins.module_utils.agent.shares import PodShares, pod_figures
from ansible_collections.scv.gpu.plugins.module_utils.agent.xid import XidPolicy
from ansible_collections.scv.gpu.plugins.module_utils.kube.pod_processes import (
    PodNames,
    pod_uid_of_cgroup,
    pod_uid_of_pid,
)
from ansible_collections.scv.gpu.plugins.module_utils.nvml.session import Session

from harness.common import replace_json
from harness.paths import scenario_path

UID = "0f8e3c2a-51b7-4d9e-a6f0-1c2d3e4f5a6b"
MIB = 1 << 20


@pytest.mark.parametrize("text", [
    "0::/kubepods/besteffort/pod%s/5d1c9f0e8a7b" % UID,                                  # cgroupfs, v2
    "12:memory:/kubepods/burstable/pod%s/5d1c9f0e8a7b\n0::/\n" % UID,                   # cgroupfs, v1
    "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod%s.slice/cri-containerd-5d1c.scope"
    % UID.replace("-", "_"),                                                              # systemd's driver
], ids=["cgroupfs-v2", "cgroupfs-v1", "systemd"])
def test_a_pods_processes_name_its_uid_in_their_cgroup(text):
    assert pod_uid_of_cgroup(text) == UID


def test_a_static_pods_uid_and_processes_of_no_pod():
    assert pod_uid_of_cgroup("0::/kubepods/pod6e2a7d47c1f1e3f8b4b0e8f3f9e5c2a1/abc") == "6e2a7d47c1f1e3f8b4b0e8f3f9e5c2a1"
    assert pod_uid_of_cgroup("0::/system.slice/containerd.service") is None
    assert pod_uid_of_cgroup("0::/user.slice/podman-pod12.scope") is None
    assert pod_uid_of_pid(os.getpid()) is None            # this test runs in no pod
    assert pod_uid_of_pid(2 ** 22 + 7) is None            # no such process


def test_pod_names_come_from_the_logs_directory_listed_again_only_when_it_changes(tmp_path):
    (tmp_path / ("ml_train-0_%s" % UID)).mkdir()
    (tmp_path / "stray-file").write_text("")
    names = PodNames(str(tmp_path))
    assert names.names() == {UID: ("ml", "train-0")}
    assert names.names() == {UID: ("ml", "train-0")} and names.listings == 1
    (tmp_path / "lab_notebook_1234").mkdir()
    os.utime(tmp_path, ns=(1, 1))   # a new mtime, whatever the file system's step
    assert names.names()["1234"] == ("lab", "notebook") and names.listings == 2
    assert names.names(again=True) and names.listings == 3
    assert PodNames(str(tmp_path / "missing")).names() == {}


def test_a_pods_figures_sum_its_processes_and_tell_unknown_from_idle():
    use = {"memory": {1: 3 * MIB, 2: MIB, 3: 8 * MIB}, "utilization": {1: {"smUtil": 20.4}, 2: {"smUtil": 10}}}
    pods = {("a", "ns"): [1, 2], ("b", "ns"): [3], ("c", "ns"): [], ("d", "ns"): None}
    assert pod_figures(use, pods, idle=False) == {
        ("a", "ns"): {"memory": 4, "utilization": 30},
        ("b", "ns"): {"memory": 8},                         # busy, but never sampled: no utilization
        ("c", "ns"): {"memory": 0, "utilization": 0},       # holds the GPU, runs nothing on it
        ("d", "ns"): {}}                                    # its processes cannot be told
    assert pod_figures(use, pods, idle=True)[("b", "ns")] == {"memory": 8, "utilization": 0}
    # a process NVML sampled but did not list among those holding memory holds none
    assert pod_figures({"memory": {}, "utilization": {5: {"smUtil": 7}}}, {("e", "ns"): [5]}, idle=False) == {
        ("e", "ns"): {"memory": 0, "utilization": 7}}
    assert pod_figures({"memory": None, "utilization": None}, pods, idle=False)[("a", "ns")] == {}


def held(pod, *ids, container="c", namespace="ns"):
    return {"namespace": namespace, "pod": pod, "container": container, "resource": "nvidia.com/gpu",
            "device_ids": list(ids)}


class Holders:
    """A PodAttribution's answer without a kubelet."""

    def __init__(self, answer, cards):
        self.holders, self.replicas = device_holders(answer), device_replicas(answer)
        self.cards = {card["uuid"]: card["id"] for card in cards}

    def by_card(self, _cards):
        return {self.cards[device]: held for device, held in self.holders.items()}

    @staticmethod
    def mig_gpus():
        return set()

    def replicas_by_card(self, _cards):
        return {self.cards[device]: {holder: ",".join(sorted(numbers)) for holder, numbers in held.items()}
                for device, held in self.replicas.items()}


@pytest.fixture
def node(tmp_path, nvml_simulator):
    """A node of 8 H100s: a scenario, a /proc and a pod logs directory the test fills."""
    class Node:
        scenario = tmp_path / "scenario.json"
        data = json.loads(scenario_path("h100_sxm_x8").read_text())
        proc, logs = tmp_path / "proc", tmp_path / "pods"

        def pod(self, namespace, name, uid, *pids):
            (self.logs / ("%s_%s_%s" % (namespace, name, uid))).mkdir(parents=True)
            for pid in pids:
                (self.proc / str(pid)).mkdir(parents=True)
                (self.proc / str(pid) / "cgroup").write_text("0::/kubepods/besteffort/pod%s/ctr%d\n" % (uid, pid))

    found = Node()
    found.logs.mkdir()
    replace_json(found.scenario, found.data)
    nvml_simulator.use(found.scenario)
    return found


def read_shares(node, answer):
    readings = Readings(Session(), XidPolicy(), metrics=True)
    try:
        cards = readings.tick()["cardList"]
        readings.shares = PodShares(Holders(answer, cards), str(node.logs), str(node.proc))
        readings.scrape()
        return readings.shares, readings.facts()
    finally:
        readings.close()


def uid(number):
    return "%08x-0000-4000-8000-%012x" % (number, number)


def test_only_shared_gpus_are_read_and_their_replicas_are_kept(node, nvml_simulator):
    devices = node.data["devices"]
    answer = [held("a", devices[1]["uuid"] + "::0"), held("b", devices[1]["uuid"] + "::1"),
              held("c", devices[2]["uuid"]), held("d", devices[2]["uuid"]),          # two pods, no replicas
              held("e", devices[3]["uuid"] + "::4"),                                # one replica handed out
              held("whole", devices[0]["uuid"])]
    nvml_simulator.reset_calls()
    shares, _facts = read_shares(node, answer)
    assert {card: found["holders"] for card, found in shares.last.items()} == {
        1: {("a", "ns", "c"): "0", ("b", "ns", "c"): "1"}, 2: {("c", "ns", "c"): "", ("d", "ns", "c"): ""},
        3: {("e", "ns", "c"): "4"}}
    assert shares.reads == 3 and nvml_simulator.calls_of("nvmlDeviceGetComputeRunningProcesses_v3") >= 3


def test_a_node_without_sharing_makes_no_per_process_call(node, nvml_simulator):
    nvml_simulator.reset_calls()
    shares, _facts = read_shares(node, [held("a", node.data["devices"][1]["uuid"])])
    assert shares.last == {} and shares.reads == 0
    assert nvml_simulator.calls_of("nvmlDeviceGetComputeRunningProcesses_v3") == 0
    assert nvml_simulator.calls_of("nvmlDeviceGetProcessUtilization") == 0


def test_pods_are_matched_by_namespace_and_name_and_shown_on_their_series(node, nvml_simulator):
    gpu = node.data["devices"][1]
    gpu["processes"] = [{"pid": 501, "usedGpuMemory": 1024 * MIB, "smUtil": 30},
                        {"pid": 502, "usedGpuMemory": 512 * MIB, "smUtil": 10},
                        {"pid": 601, "usedGpuMemory": 2048 * MIB},
                        {"pid": 4000, "usedGpuMemory": 64 * MIB, "smUtil": 5}]
    replace_json(node.scenario, node.data)
    node.pod("ml", "a", uid(1), 501, 502)
    node.pod("ml", "b", uid(2), 601)
    node.pod("ml", "idle", uid(3))
    node.pod("other", "a", uid(4))     # the same name in another namespace holds nothing here
    answer = [held("a", gpu["uuid"] + "::0", namespace="ml"), held("b", gpu["uuid"] + "::1", namespace="ml"),
              held("idle", gpu["uuid"] + "::3", gpu["uuid"] + "::2", namespace="ml")]
    shares, facts = read_shares(node, answer)
    assert shares.last[1]["pods"] == {
        ("a", "ml"): {"uid": uid(1), "memory": 1536, "utilization": 40},
        ("b", "ml"): {"uid": uid(2), "memory": 2048},      # no sample: its utilization is not known
        ("idle", "ml"): {"uid": uid(3), "memory": 0, "utilization": 0}}
    text = exposition(lambda: snapshot(facts, shares, answer)).decode()
    whole = facts["cardList"][1]["usedMemory"]
    # the whole GPU, as before, and each holder with its pod's own figure, its pod's UID and its replicas
    assert series(text, "DCGM_FI_DEV_FB_USED") == [
        ("", "", "", "", "", whole), ("a", "ml", "c", "0", uid(1), 1536), ("b", "ml", "c", "1", uid(2), 2048),
        ("idle", "ml", "c", "2,3", uid(3), 0)]
    util = facts["cardList"][1]["gpuUtilization"]
    assert series(text, "DCGM_FI_DEV_GPU_UTIL") == [
        ("", "", "", "", "", util), ("a", "ml", "c", "0", uid(1), 40), ("idle", "ml", "c", "2,3", uid(3), 0)]
    # the other series: one per holder with the GPU's whole value, and its replicas; no pod_uid
    temp = facts["cardList"][1]["temperature"]
    assert series(text, "DCGM_FI_DEV_GPU_TEMP") == [
        ("a", "ml", "c", "0", None, temp), ("b", "ml", "c", "1", None, temp), ("idle", "ml", "c", "2,3", None, temp)]
    # an unshared GPU is as it was: no pod, no replica
    assert series(text, "DCGM_FI_DEV_FB_USED", gpu="0") == [("", "", "", "", "", facts["cardList"][0]["usedMemory"])]
    assert "scv_agent_shared_gpu_reads_total 1.0" in text


def series(text, metric, gpu="1"):
    """(pod, namespace, container, vgpu, pod_uid or None, value) of ``metric``'s series of GPU ``gpu``, sorted."""
    from prometheus_client.parser import text_string_to_metric_families

    found = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == metric and sample.labels["gpu"] == gpu:
                labels = sample.labels
                found.append((labels.get("pod", ""), labels.get("namespace", ""), labels.get("container", ""),
                              labels.get("vgpu", ""), labels.get("pod_uid"), sample.value))
    return sorted(found)


def snapshot(facts, shares, answer):
    holders = {}
    for entry in answer:
        holders.setdefault(1, []).append((entry["pod"], entry["namespace"], entry["container"]))
    return {"node": "n", "facts": facts, "last_xids": {}, "counters": {"scv_agent_shared_gpu_reads": shares.reads},
            "served": None, "pods": {key: sorted(value) for key, value in holders.items()}, "shares": shares.last}


def test_an_idle_gpu_needs_no_samples_and_pods_that_cannot_be_named_are_not_guessed(node, nvml_simulator):
    gpu = node.data["devices"][0]     # its utilization reads 0
    gpu["processes"] = [{"pid": 501, "usedGpuMemory": 100 * MIB, "smUtil": 30},
                        {"pid": 701, "usedGpuMemory": 300 * MIB}]
    replace_json(node.scenario, node.data)
    node.pod("ml", "a", uid(1), 501)
    node.pod("ml", "gone", uid(9), 701)
    for entry in node.logs.iterdir():
        if entry.name.endswith(uid(9)):
            entry.rmdir()             # its logs directory is not there: pod 701's pod cannot be named
    answer = [held("a", gpu["uuid"] + "::0", namespace="ml"), held("b", gpu["uuid"] + "::1", namespace="ml")]
    nvml_simulator.reset_calls()
    shares, _facts = read_shares(node, answer)
    assert nvml_simulator.calls_of("nvmlDeviceGetProcessUtilization") == 0
    # process 701's pod may be b: b is not known to run nothing; a, whose process is known, is
    assert shares.last[0]["pods"] == {("a", "ml"): {"uid": uid(1), "memory": 100, "utilization": 0},
                                      ("b", "ml"): {"uid": ""}}


def test_a_pod_newer_than_the_last_listing_is_found_and_one_that_cannot_be_named_is_warned_of_once(
        node, nvml_simulator, caplog):
    gpu = node.data["devices"][1]
    gpu["processes"] = [{"pid": 501, "usedGpuMemory": 100 * MIB}, {"pid": 502, "usedGpuMemory": 200 * MIB}]
    replace_json(node.scenario, node.data)
    node.pod("ml", "a", uid(1), 501)
    answer = [held("a", gpu["uuid"] + "::0", namespace="ml"), held("b", gpu["uuid"] + "::1", namespace="ml")]
    (node.proc / "502").mkdir(parents=True)
    (node.proc / "502" / "cgroup").write_text("0::/kubepods/pod%s/ctr\n" % uid(2))
    readings = Readings(Session(), XidPolicy(), metrics=True)
    try:
        cards = readings.tick()["cardList"]
        readings.shares = PodShares(Holders(answer, cards), str(node.logs), str(node.proc))
        for _scrape in range(3):
            readings.scrape()
        assert readings.shares.last[1]["pods"][("b", "ml")] == {"uid": ""}
        warned = [record for record in caplog.records if "does not name" in record.getMessage()]
        assert len(warned) == 1 and uid(2) in warned[0].getMessage()
        # b's logs directory appears within the timestamp step of the last listing: the unknown UID lists it again
        stamp = os.stat(node.logs).st_mtime_ns
        (node.logs / ("ml_b_%s" % uid(2))).mkdir()
        os.utime(node.logs, ns=(stamp, stamp))
        readings.scrape()
        assert readings.shares.last[1]["pods"][("b", "ml")] == {"uid": uid(2), "memory": 200}   # never sampled
    finally:
        readings.close()
