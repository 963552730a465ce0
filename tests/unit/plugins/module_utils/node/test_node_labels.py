"""GFD labels from the nvidia_gpu fact, and the patch that keeps foreign labels."""

from __future__ import annotations

import copy

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.node.labels import (
    GFD_KEYS,
    desired_labels,
    label_changes,
    sanitise_product,
    valid_label_key,
)
from label_expectations import LABELS
from scenario_expectations import BY_SCENARIO


@pytest.mark.parametrize("name, value", [
    ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3"),
    ("TITAN Xp", "TITAN-Xp"),
    ("NVIDIA GeForce RTX 4090 (Laptop)", "NVIDIA-GeForce-RTX-4090-Laptop"),
    ("Quadro P620 /w 2GB", "Quadro-P620-w-2GB"),
    ("NVIDIA A100-SXM4-40GB", "NVIDIA-A100-SXM4-40GB"),
    ("  Tesla V100 ", "Tesla-V100"),
    ("x" * 80, "x" * 63),
    ("NVIDIA RTX " + "A" * 52 + " -", "NVIDIA-RTX-" + "A" * 52),
])
def test_product_is_sanitised_as_gfd_does(name, value):
    assert sanitise_product(name) == value
    assert len(value) <= 63


@pytest.mark.parametrize("scenario", sorted(LABELS))
def test_labels_per_scenario(scenario):
    assert desired_labels(BY_SCENARIO[scenario], "gpu/nvidia") == LABELS[scenario]


def test_mixed_models_name_the_first_gpu():
    fact = copy.deepcopy(BY_SCENARIO["titan_xp"])
    fact["cardList"].append(dict(fact["cardList"][0], id=1, model="NVIDIA GeForce GTX 1080"))
    labels = desired_labels(fact, "gpu/nvidia")
    # the labels describe the first model and count only its GPUs: no GTX 1080 is claimed a TITAN Xp
    assert labels["nvidia.com/gpu.product"] == "TITAN-Xp" and labels["nvidia.com/gpu.count"] == "1"


def test_site_key_is_configurable():
    labels = desired_labels(BY_SCENARIO["titan_xp"], "gpu/nividia")
    assert labels["gpu/nividia"] == "TITAN-Xp" and "gpu/nvidia" not in labels


def test_changes_set_differences_remove_stale_keep_foreign():
    current = {
        "kubernetes.io/hostname": "node-a",
        "team": "ml",
        "nvidia.com/gpu.deploy.dcgm": "true",          # in NVIDIA's namespace, but not ours
        "nvidia.com/gpu.count": "4",                    # stale value
        "nvidia.com/cuda.runtime-version.full": "11.8",  # stale: the new facts have no CUDA version
        "gpu/nvidia": "TITAN-Xp",                       # already right
    }
    desired = {"nvidia.com/gpu.count": "1", "gpu/nvidia": "TITAN-Xp", "nvidia.com/gpu.present": "true"}
    assert label_changes(current, desired, "gpu/nvidia") == {
        "nvidia.com/gpu.count": "1",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/cuda.runtime-version.full": None,
    }
    assert label_changes(dict(current, **desired, **{"nvidia.com/cuda.runtime-version.full": None}), desired,
                         "gpu/nvidia") == {"nvidia.com/cuda.runtime-version.full": None}


def test_no_changes_when_labels_match():
    desired = LABELS["h100_sxm_x8"]
    assert label_changes(dict(desired, other="x"), desired, "gpu/nvidia") == {}
    assert label_changes(None, {}, "gpu/nvidia") == {}


def test_a_node_that_lost_its_gpus_loses_every_label_of_ours():
    current = dict(LABELS["a100_mig"], team="ml")
    changes = label_changes(current, desired_labels(BY_SCENARIO["no_gpus"], "gpu/nvidia"), "gpu/nvidia")
    # GFD's one label for a node with no GPU, vgpu.present=false, stays
    assert changes == {key: None for key in LABELS["a100_mig"] if key != "nvidia.com/vgpu.present"}
    assert set(changes) == set(GFD_KEYS) - {"nvidia.com/vgpu.present", "nvidia.com/mig.strategy"} | {"gpu/nvidia"}


@pytest.mark.parametrize("key, valid", [
    ("gpu/nvidia", True), ("nvidia.com/gpu.product", True), ("gpu", True), ("example.com/a_b.c-d", True),
    ("Gpu/nvidia", False), ("gpu/", False), ("/gpu", False), ("gpu nvidia", False), ("a/b/c", False),
    ("x" * 64, False),
])
def test_label_key_validation(key, valid):
    assert valid_label_key(key) is valid


def _mig_fact():
    card = {"model": "NVIDIA H100 80GB HBM3", "migEnabled": True,
            "migDevices": [{"profile": "1g.10gb"}, {"profile": "1g.10gb"}, {"profile": "2g.20gb+me"}]}
    return {"nvml_available": True, "cardList": [card, {"model": "NVIDIA H100 80GB HBM3", "migEnabled": False}]}


@pytest.mark.parametrize("strategy, resources", [
    ("none", {"nvidia.com/gpu": 2}),
    ("single", {"nvidia.com/gpu": 3}),
    ("mixed", {"nvidia.com/gpu": 1, "nvidia.com/mig-1g.10gb": 2, "nvidia.com/mig-2g.20gb.me": 1}),
])
def test_what_the_device_plugin_offers_per_strategy(strategy, resources):
    from ansible_collections.scv.gpu.plugins.module_utils.node.labels import device_plugin_resources
    assert device_plugin_resources(_mig_fact(), strategy) == resources


def test_the_filter_refuses_an_unknown_strategy():
    from ansible.errors import AnsibleFilterError
    from ansible_collections.scv.gpu.plugins.filter.mig import scv_gpu_device_plugin_resources
    with pytest.raises(AnsibleFilterError, match="none, single or mixed, not 'mixd'"):
        scv_gpu_device_plugin_resources(_mig_fact(), "mixd")
    assert scv_gpu_device_plugin_resources(_mig_fact(), "mixed")["nvidia.com/mig-1g.10gb"] == 2
