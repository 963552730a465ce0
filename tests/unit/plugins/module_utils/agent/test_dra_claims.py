"""Pods holding GPUs through DRA claims of NVIDIA's DRA driver: its device names read, claims kept per device and
holder, found on this node's cards and GPU instances, and served as dcgm-exporter's DRA labels."""

from __future__ import annotations

import threading

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.agent import dra_claims as dra
from ansible_collections.scv.gpu.plugins.module_utils.agent.metrics import families
from ansible_collections.scv.gpu.plugins.module_utils.agent.pod_attribution import PodAttribution

DRIVER = "gpu.nvidia.com"
CARDS = [{"id": 0, "uuid": "GPU-0"}, {"id": 1, "uuid": "GPU-1"}]
# minor numbers the other way round from the NVML index; GPU 1 has two GPU instances
LAYOUT = ({1: 0, 0: 1}, {1: {(19, 3): (13, "1g.10gb", "MIG-a"), (15, 0): (5, "1g.20gb+me", "MIG-b")}})


def claim(pod, container, name, *devices, namespace="ns", driver=DRIVER, pool="node"):
    return {"namespace": namespace, "pod": pod, "container": container, "resource": "", "device_ids": [],
            "claim_name": name, "claim_namespace": namespace,
            "claim_devices": [{"driver": driver, "pool": pool, "device": device, "cdi_devices": []}
                              for device in devices]}


@pytest.mark.parametrize("name, parsed", [
    ("gpu-0", (0, None)), ("gpu-12", (12, None)),
    ("gpu-3-mig-1g10gb-19-3", (3, (19, 3))), ("gpu-0-mig-1g10gb-me-20-6", (0, (20, 6))),
    ("gpu-0-counter-set", None), ("gpu-x", None), ("nvidia0", None), ("gpu-0-mig-1g10gb-19", None), ("", None)])
def test_device_names_of_nvidias_dra_driver(name, parsed):
    assert dra.device_name(name) == parsed


def test_claims_are_kept_per_device_and_holder_the_first_claim_winning_and_other_drivers_left_out():
    found = dra.claimed([
        {"namespace": "ns", "pod": "dp", "container": "c", "resource": "nvidia.com/gpu", "device_ids": ["GPU-0"]},
        claim("p", "c", "first", "gpu-0", "gpu-1"),
        claim("p", "c", "again", "gpu-1"),
        claim("q", "c", "shared", "gpu-1", namespace="other"),
        claim("p", "c", "nic", "gpu-0", driver="example.com"),
    ])
    assert found == {"gpu-0": {("p", "ns", "c"): ["first", "ns", DRIVER, "node", "gpu-0"]},
                     "gpu-1": {("p", "ns", "c"): ["first", "ns", DRIVER, "node", "gpu-1"],
                               ("q", "other", "c"): ["shared", "other", DRIVER, "node", "gpu-1"]}}


def test_devices_are_found_by_minor_number_and_gpu_instance_placement():
    claims = dra.claimed([claim("w", "c", "whole", "gpu-1"), claim("m", "c", "mig", "gpu-0-mig-1g10gb-19-3"),
                          claim("e", "c", "me", "gpu-0-mig-1g20gb-me-15-0"),
                          claim("x", "c", "gone", "gpu-0-mig-1g10gb-19-4"),    # no such placement (destroyed)
                          claim("y", "c", "far", "gpu-7")])                    # no such card here
    found = dra.units(claims, LAYOUT, CARDS)
    assert found == {0: {("w", "ns", "c"): ["whole", "ns", DRIVER, "node", "gpu-1", "", ""]},
                     (1, 13): {("m", "ns", "c"): ["mig", "ns", DRIVER, "node", "gpu-0-mig-1g10gb-19-3", "1g.10gb",
                                                  "MIG-a"]},
                     (1, 5): {("e", "ns", "c"): ["me", "ns", DRIVER, "node", "gpu-0-mig-1g20gb-me-15-0",
                                                 "1g.20gb+me", "MIG-b"]}}
    assert dra.units(claims, LAYOUT, CARDS[:1]) == {0: found[0]}     # card 1 not read (lost): none of its own
    names, table = dra.labels(found)
    assert names == dra.LABELS + dra.MIG_LABELS and table == found
    # whole GPUs alone: no MIG label names; nothing held: no names at all
    assert dra.labels({0: found[0]}) == (dra.LABELS, {0: {("w", "ns", "c"): ["whole", "ns", DRIVER, "node", "gpu-1"]}})
    assert dra.labels({}) == ((), {}) and dra.labels({0: {}}) == ((), {})


def test_pod_attribution_names_claim_holders_beside_the_device_plugins_until_the_kubelet_fails():
    answers = [[{"namespace": "ns", "pod": "dp", "container": "c", "resource": "nvidia.com/gpu", "device_ids": ["GPU-1"]},
                claim("w", "c", "whole", "gpu-1"), claim("m", "c", "mig", "gpu-0-mig-1g10gb-19-3")]]
    asked, failing = [], []

    def lister(_path, _timeout, _keep=None, drivers=None):
        asked.append(drivers)
        if failing:
            raise OSError("gone")
        return answers[0]

    pods = PodAttribution("/none", 10, threading.Event(), lister=lister)
    pods.learn(CARDS, dict, placements=lambda: LAYOUT)
    pods.refresh()
    assert asked == [frozenset({b"gpu.nvidia.com"})]
    assert pods.by_card(CARDS) == {0: [("w", "ns", "c")], 1: [("dp", "ns", "c")]}
    assert pods.by_instance(CARDS) == {(1, 13): [("m", "ns", "c")]}
    assert pods.dra_labels(CARDS)[1] == {0: {("w", "ns", "c"): ["whole", "ns", DRIVER, "node", "gpu-1", "", ""]},
                                         (1, 13): {("m", "ns", "c"): ["mig", "ns", DRIVER, "node",
                                                                      "gpu-0-mig-1g10gb-19-3", "1g.10gb", "MIG-a"]}}
    failing.append(True)
    pods.refresh()
    assert pods.by_card(CARDS) == {} and pods.by_instance(CARDS) == {} and pods.dra_labels(CARDS) == ((), {})


WHOLE = {"id": 0, "uuid": "GPU-0", "pciBusId": "00000000:18:00.0", "model": "NVIDIA H100 80GB HBM3",
         "usedMemory": 100, "freeMemory": 80000, "gpuUtilization": 7, "health": "Healthy"}


def test_the_claim_labels_follow_vgpu_and_come_before_the_pods_own_and_a_split_series_leaves_them_off_the_whole():
    holders = [("a", "ns", "c"), ("b", "ns", "c")]
    claims = {0: {("a", "ns", "c"): ["one", "ns", DRIVER, "node", "gpu-0"]}}
    share = {"split": {"memory": True, "utilization": False},
             "pods": {("a", "ns"): {"uid": "uid-a", "memory": 60}, ("b", "ns"): {"uid": "uid-b", "memory": 40}}}
    snapshot = {"node": "n", "facts": {"cardList": [WHOLE]}, "last_xids": {}, "counters": {}, "served": None,
                "pods": {0: holders}, "shares": {0: share}, "instances": {}, "dra": (dra.LABELS, claims),
                "pod_extra": (("team", "pod_uid"), {("a", "ns"): ["red", "uid-a"], ("b", "ns"): ["", "uid-b"]})}
    found = {name: [dict(zip(names, values), value=value) for values, value in rows]
             for name, _kind, _text, names, rows in families(snapshot)}
    util = {row["pod"]: row for row in found["DCGM_FI_DEV_GPU_UTIL"]}
    assert {key: util["a"][key] for key in dra.LABELS + ("team", "pod_uid", "vgpu")} == dict(
        zip(dra.LABELS, claims[0][("a", "ns", "c")]), team="red", pod_uid="uid-a", vgpu="")
    assert all(util["b"][key] == "" for key in dra.LABELS) and util["b"]["pod_uid"] == "uid-b"
    used = {row["pod"]: row for row in found["DCGM_FI_DEV_FB_USED"]}
    assert used[""]["value"] == 100 and all(used[""][key] == "" for key in dra.LABELS + ("pod_uid", "team"))
    assert (used["a"]["value"], used["a"]["pod_uid"], used["a"]["dra_claim_name"]) == (60, "uid-a", "one")
    assert (used["b"]["value"], used["b"]["pod_uid"], used["b"]["dra_claim_name"]) == (40, "uid-b", "")


def test_a_pod_label_named_as_a_claim_label_is_left_off_never_doubled():
    from ansible_collections.scv.gpu.plugins.module_utils.agent.pod_metadata import allowed_labels

    labels = {name.replace("_", "."): "spoof" for name in dra.LABELS + dra.MIG_LABELS}
    assert allowed_labels(dict(labels, app="x"), ()) == {"app": "x"}
