"""Pods that got GPUs through Dynamic Resource Allocation claims of NVIDIA's DRA driver (gpu.nvidia.com), named on
the series of the GPU or GPU instance they hold with dcgm-exporter's DRA labels: the pod-resources client against a
stand-in kubelet speaking the kubelet's own protobuf (generated from its published api.proto), and a real agent
process on the simulator, its Scv written to the real kube-apiserver."""

from __future__ import annotations

import json

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.kube import podresources
from harness.agent import AgentProcess
from harness.kubelet_podresources import StandInKubelet, claim_pod, generate, pod
from harness.paths import ROOT, scenario_path, scenario_uuids

DRIVER = "gpu.nvidia.com"
DRA = ("dra_claim_name", "dra_claim_namespace", "dra_driver_name", "dra_pool_name", "dra_device_name")
MIXED = json.loads(scenario_path("h100_mig_mixed").read_text())


def series(agent, name):
    """{(gpu, GPU_I_ID or None): [labels of each sample]} of ``name`` on the agent's /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    found = {}
    for family in text_string_to_metric_families(agent.metrics_text()):
        for sample in family.samples:
            if sample.name == name:
                found.setdefault((sample.labels["gpu"], sample.labels.get("GPU_I_ID")), []).append(sample.labels)
    return found


def held_by(agent, name="DCGM_FI_DEV_FB_FREE"):
    """{(gpu, GPU_I_ID): sorted [(pod, namespace, container, dra labels..., dra_mig_profile, dra_mig_device_uuid)]}
    of the series that name a pod."""
    return {key: sorted(tuple(labels.get(label, "") for label in ("pod", "namespace", "container") + DRA + (
        "dra_mig_profile", "dra_mig_device_uuid")) for labels in rows if labels.get("pod"))
        for key, rows in series(agent, name).items() if any(labels.get("pod") for labels in rows)}


def test_the_claims_of_each_container_are_read_beside_its_devices(kubelet):
    kubelet.pods = [
        pod("train", "ml", ("trainer", [("nvidia.com/gpu", ["GPU-aaaa"])])),
        claim_pod("infer", "serving", ("server", [("gpus", [(DRIVER, "node-a", "gpu-1"), (DRIVER, "node-a", "gpu-2")]),
                                                  ("nic", [("example.com", "net", "eth1")])]),
                  ("sidecar", [])),
    ]
    kubelet.pods[0]["containers"][0]["dynamic"] = [("shared", "team", [(DRIVER, "node-a", "gpu-0-mig-1g10gb-19-3",
                                                                       ["k8s.gpu.nvidia.com/claim=a", "cdi/x=y"])])]
    held = podresources.list_pod_resources(kubelet.socket, timeout=5)
    claims = [{key: entry[key] for key in ("pod", "container", "claim_name", "claim_namespace", "claim_devices")}
              for entry in held if "claim_name" in entry]
    assert held[0] == {"namespace": "ml", "pod": "train", "container": "trainer", "resource": "nvidia.com/gpu",
                       "device_ids": ["GPU-aaaa"]}
    assert claims == [
        {"pod": "train", "container": "trainer", "claim_name": "shared", "claim_namespace": "team", "claim_devices": [
            {"driver": DRIVER, "pool": "node-a", "device": "gpu-0-mig-1g10gb-19-3",
             "cdi_devices": ["k8s.gpu.nvidia.com/claim=a", "cdi/x=y"]}]},
        {"pod": "infer", "container": "server", "claim_name": "gpus", "claim_namespace": "serving", "claim_devices": [
            {"driver": DRIVER, "pool": "node-a", "device": "gpu-1", "cdi_devices": ["k8s.gpu.nvidia.com/claim=gpus-gpu-1"]},
            {"driver": DRIVER, "pool": "node-a", "device": "gpu-2", "cdi_devices": ["k8s.gpu.nvidia.com/claim=gpus-gpu-2"]}]},
        {"pod": "infer", "container": "server", "claim_name": "nic", "claim_namespace": "serving", "claim_devices": [
            {"driver": "example.com", "pool": "net", "device": "eth1", "cdi_devices": ["k8s.example.com/claim=nic-eth1"]}]},
    ]
    # the decoder against protobuf's own encoder; with drivers, another driver's devices (and claims) left out
    message = kubelet.answer().SerializeToString()
    assert podresources.decode_list_response(message) == held
    kept = podresources.decode_list_response(message, drivers={DRIVER.encode()})
    assert [entry.get("claim_name") for entry in kept] == [None, "shared", "gpus"]


def test_a_gpu_held_through_a_claim_names_its_pods_with_the_claims_labels_until_they_end(
        access, agent_command, node, tmp_path, kubelet):
    uuids = scenario_uuids("h100_sxm_x8")
    kubelet.pods = [
        claim_pod("train", "ml", ("trainer", [("big", [(DRIVER, node, "gpu-3"), (DRIVER, node, "gpu-4")])])),
        # one claim shared by two containers of a pod: both on the GPU's series
        claim_pod("notebook", "lab", ("jupyter", [("one", [(DRIVER, node, "gpu-5")])]),
                  ("exporter", [("one", [(DRIVER, node, "gpu-5")])])),
        claim_pod("web", "shop", ("nginx", [("nic", [("example.com", node, "gpu-6")])])),   # another driver
        pod("old", "ml", ("job", [("nvidia.com/gpu", [uuids[0]])])),                         # the device plugin's
    ]
    agent = AgentProcess(agent_command, access, node, tmp_path, scenario="h100_sxm_x8",
                         extra=("--pod-resources-socket", kubelet.socket, "--pod-resources-interval", "1"))
    try:
        agent.wait_for(lambda: ("3", None) in held_by(agent), 20)
        held = held_by(agent)
        blank = ("",) * 7
        assert held == {
            ("0", None): [("old", "ml", "job") + blank],
            ("3", None): [("train", "ml", "trainer", "big", "ml", DRIVER, node, "gpu-3", "", "")],
            ("4", None): [("train", "ml", "trainer", "big", "ml", DRIVER, node, "gpu-4", "", "")],
            ("5", None): [("notebook", "lab", "exporter", "one", "lab", DRIVER, node, "gpu-5", "", ""),
                          ("notebook", "lab", "jupyter", "one", "lab", DRIVER, node, "gpu-5", "", "")]}
        assert series(agent, "DCGM_FI_DEV_FB_FREE")[("3", None)][0]["UUID"] == uuids[3]
        # no MIG device is held: no dra_mig_* label names at all
        assert "dra_mig_profile" not in agent.metrics_text()
        kubelet.pods = kubelet.pods[1:]                  # the training pod ended
        agent.wait_for(lambda: ("3", None) not in held_by(agent), 5)
        assert sorted(held_by(agent)) == [("0", None), ("5", None)]
        kubelet.pods = kubelet.pods[2:]                  # and the notebook: no DRA label is left
        agent.wait_for(lambda: sorted(held_by(agent)) == [("0", None)], 5)
        assert "dra_claim_name" not in agent.metrics_text()
    finally:
        agent.stop()


@pytest.fixture
def mig_agent(access, agent_command, tmp_path, node):
    """An agent on two H100s with MIG on (four GPU instances and one), pods from a stand-in kubelet."""
    with StandInKubelet(generate(tmp_path / "generated"), tmp_path / "kubelet.sock") as kubelet:
        agent = AgentProcess(agent_command, access, node, tmp_path, scenario="h100_mig_mixed",
                             extra=("--pod-resources-socket", kubelet.socket, "--pod-resources-interval", "1"))
        try:
            yield agent, kubelet, node
        finally:
            agent.stop()


def test_a_mig_device_held_through_a_claim_names_its_pod_on_its_gpu_instance(mig_agent):
    agent, kubelet, node = mig_agent
    # the names NVIDIA's DRA driver gave these MIG devices on this scenario (tests/fixtures/dra/h100_mig_mixed.json)
    published = json.loads((ROOT / "tests" / "fixtures" / "dra" / "h100_mig_mixed.json").read_text())
    uuid_of = {device["name"]: device["attributes"]["uuid"]["string"]
               for piece in published["resourceSlices"] for device in piece["spec"]["devices"]}
    instance_of = {entry["uuid"]: str(entry["gpuInstanceId"])
                   for device in MIXED["devices"] for entry in device["migDevices"]}
    small, whole = "gpu-0-mig-1g10gb-19-3", "gpu-1-mig-7g80gb-0-0"
    kubelet.pods = [claim_pod("infer", "ml", ("server", [("small", [(DRIVER, node, small)])])),
                    claim_pod("train", "ml", ("trainer", [("whole", [(DRIVER, node, whole)])]))]
    small_key, whole_key = ("0", instance_of[uuid_of[small]]), ("1", instance_of[uuid_of[whole]])
    agent.wait_for(lambda: small_key in held_by(agent), 20)
    assert held_by(agent) == {
        small_key: [("infer", "ml", "server", "small", "ml", DRIVER, node, small, "1g.10gb", uuid_of[small])],
        whole_key: [("train", "ml", "trainer", "whole", "ml", DRIVER, node, whole, "7g.80gb", uuid_of[whole])]}
    assert series(agent, "DCGM_FI_DEV_FB_FREE")[small_key][0]["GPU_I_PROFILE"] == "1g.10gb"
    kubelet.pods = []
    agent.wait_for(lambda: held_by(agent) == {}, 20)
