"""The series of a GPU with MIG on, as dcgm-exporter serves them by default: none of the GPU's own, one set per GPU
instance with its profile and ID, its own memory and engine activity, the GPU's other readings repeated, and
neither the GPU's PCIe traffic nor its last XID."""

from __future__ import annotations

from ansible_collections.scv.gpu.plugins.module_utils.agent.metrics import INSTANCE_LABELS, families
from harness.agent_samples import INSTANCES, MIG, WHOLE


def _series(pods=None, instance_pods=None, last_xids=None):
    snapshot = {"node": "n", "facts": {"cardList": [WHOLE, MIG], "driver_version": "580"},
                "last_xids": last_xids or {}, "counters": {}, "served": None, "pods": pods, "shares": {},
                "instances": INSTANCES, "instance_pods": instance_pods or {}, "instance_replicas": {}}
    found = {}
    for name, _kind, _text, names, rows in families(snapshot):
        found[name] = [(dict(zip(names, values)), value) for values, value in rows]
    return found


def _by_unit(rows):
    return {(labels["gpu"], labels.get("GPU_I_ID", "")): value for labels, value in rows}


def test_each_instance_has_its_own_memory_and_activity_and_the_gpu_none_of_its_own():
    found = _series()
    assert _by_unit(found["DCGM_FI_DEV_FB_USED"]) == {("0", ""): 100, ("1", "1"): 13, ("1", "5"): 13}
    assert _by_unit(found["DCGM_FI_DEV_GPU_TEMP"]) == {("0", ""): 41, ("1", "1"): 50, ("1", "5"): 50}
    assert _by_unit(found["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"]) == {("1", "1"): 0.35}
    labels = {labels.get("GPU_I_ID"): labels for labels, _value in found["DCGM_FI_DEV_FB_USED"]}
    assert (labels["5"]["GPU_I_PROFILE"], labels["5"]["UUID"], labels["5"]["device"]) == ("1g.10gb", "GPU-1", "nvidia1")
    assert labels[""]["GPU_I_PROFILE"] == ""      # a whole GPU's series: no instance labels (empty is none)


def test_pcie_traffic_and_the_last_xid_stay_off_instances():
    found = _series(last_xids={0: 13, 1: 79})
    assert _by_unit(found["DCGM_FI_PROF_PCIE_TX_BYTES"]) == {("0", ""): 2.0 * 1048576}
    assert _by_unit(found["DCGM_FI_DEV_XID_ERRORS"]) == {("0", ""): 13}
    assert _by_unit(found["DCGM_FI_DEV_GPU_UTIL"]) == {("0", ""): 7}


def test_pods_are_named_on_the_instance_they_hold():
    found = _series(pods={0: [("whole", "ns", "c")]}, instance_pods={(1, 5): [("small", "ns", "c")]})
    named = {(labels["gpu"], labels["GPU_I_ID"]): labels["pod"] for labels, _value in found["DCGM_FI_DEV_GPU_TEMP"]}
    assert named == {("0", ""): "whole", ("1", "1"): "", ("1", "5"): "small"}


def test_a_node_without_instances_has_no_instance_labels():
    snapshot = {"node": "n", "facts": {"cardList": [WHOLE]}, "last_xids": {}, "counters": {}, "served": None,
                "pods": None, "instances": {}}
    assert all(not set(INSTANCE_LABELS) & set(names) for _name, _kind, _text, names, _rows in families(snapshot))
