"""GFD labels from the nvidia_gpu fact, and the patch that keeps foreign labels."""

from __future__ import annotations

import copy

import re

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.node.labels import (
    GFD_KEYS,
    config_sharing,
    desired_labels,
    label_changes,
    label_problem,
    mps_refusal,
    sanitise_product,
    valid_label_key,
)
from harness.label_expectations import LABELS
from harness.scenario_expectations import BY_SCENARIO


@pytest.mark.parametrize("name, value", [
    ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3"),
    ("TITAN Xp", "TITAN-Xp"),
    ("NVIDIA GeForce RTX 4090 (Laptop)", "NVIDIA-GeForce-RTX-4090-Laptop"),
    ("Quadro P620 /w 2GB", "Quadro-P620-w-2GB"),
    ("NVIDIA A100-SXM4-40GB", "NVIDIA-A100-SXM4-40GB"),
    ("  Tesla V100 ", "Tesla-V100"),
    ("x" * 80, "x" * 80),                              # GFD does not shorten a name
    ("NVIDIA RTX " + "A" * 52 + " -", "NVIDIA-RTX-" + "A" * 52),
])
def test_product_is_sanitised_as_gfd_does(name, value):
    assert sanitise_product(name) == value


LONG_NAME = "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition"


@pytest.mark.parametrize("strategy, key", [("single", "nvidia.com/gpu.product"),
                                           ("mixed", "nvidia.com/mig-1g.24gb.product")])
def test_a_label_no_node_may_carry_is_left_out_named_and_the_others_kept(strategy, key):
    """A 55-character GPU name is a valid product; with its MIG profile after it, 67 characters are not."""
    fact = {"nvml_available": True, "driver_version": "580.95.05", "cardList": [
        {"model": LONG_NAME, "totalMemory": 97887, "migEnabled": True,
         "migDevices": [{"profile": "1g.24gb", "attributes": {"multiprocessorCount": 46}}] * 4}]}
    refused = {}
    labels = desired_labels(fact, "gpu/nvidia", strategy, refused)
    assert key not in labels
    assert refused == {key: "the value 'NVIDIA-RTX-PRO-6000-Blackwell-Max-Q-Workstation-Edition-MIG-1g.24gb' is 67 "
                            "characters long, over the 63 a label value may have"}
    assert labels["gpu/nvidia"] == "NVIDIA-RTX-PRO-6000-Blackwell-Max-Q-Workstation-Edition"
    assert labels[key.replace("product", "count")] == "4" and labels["nvidia.com/cuda.driver-version.major"] == "580"
    assert desired_labels(fact, "gpu/nvidia", strategy) == labels       # without a dict to fill, the same labels


@pytest.mark.parametrize("key, value, problem", [
    ("nvidia.com/gpu.product", "x" * 63, None),
    ("nvidia.com/gpu.product", "x" * 64, "is 64 characters long, over the 63"),
    ("nvidia.com/gpu.product", "-x", "is not a valid label value"),
    ("nvidia.com/gpu.product", "", None),
    ("nvidia.com/" + "m" * 64, "x", "is not a valid label key"),
])
def test_label_problem_follows_the_api_servers_rules(key, value, problem):
    found = label_problem(key, value)
    assert found is None if problem is None else problem in found


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
    assert set(changes) == set(GFD_KEYS) - {"nvidia.com/vgpu.present", "nvidia.com/mig.strategy",
                                            "nvidia.com/gpu.clique"} | {"gpu/nvidia"}


CLUSTER = "7b968a6d-c8aa-45e1-9e07-e1e51be99c31"


def _fabric(state="completed", status="Success", cluster=CLUSTER, clique=4):
    fabric = {"state": state, "cliqueId": clique, "clusterUuid": cluster}
    if status:
        fabric["status"] = status
    return {"model": "NVIDIA GB200", "fabric": fabric}


@pytest.mark.parametrize("cards, clique", [
    ([_fabric(), _fabric()], CLUSTER + ".4"),
    ([_fabric(), _fabric(state="in progress", status=None, clique=9), {"model": "NVIDIA GB200"}], CLUSTER + ".4"),
    ([_fabric(), _fabric(status="Unknown Error", clique=9)], CLUSTER + ".4"),    # a failed GPU is not attached
    ([_fabric(), _fabric(clique=5)], None),                                     # cliques disagree
    ([_fabric(), _fabric(cluster="11111111-2222-3333-4444-555555555555")], None),   # clusters disagree
    ([_fabric(cluster="00000000-0000-0000-0000-000000000000")] * 2, None),      # a single HGX board
    ([_fabric(state="not started", status=None)], None),
    ([{"model": "NVIDIA GB200"}], None),                                        # no fabric subset read
])
def test_the_clique_label_follows_gfds_rule(cards, clique):
    labels = desired_labels({"nvml_available": True, "cardList": cards}, "gpu/nvidia")
    assert labels.get("nvidia.com/gpu.clique") == clique


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
    ("mixed", {"nvidia.com/gpu": 1, "nvidia.com/mig-1g.10gb": 2, "nvidia.com/mig-2g.20gb.me": 1}),
])
def test_what_the_device_plugin_offers_per_strategy(strategy, resources):
    from ansible_collections.scv.gpu.plugins.module_utils.node.device_plugin import device_plugin_resources
    assert device_plugin_resources(_mig_fact(), strategy) == resources


def _single(*cards):
    return {"nvml_available": True, "cardList": [
        {"model": "NVIDIA H100 80GB HBM3", "migEnabled": bool(profiles),
         "migDevices": [{"profile": profile} for profile in profiles or []]} if profiles is not None else
        {"model": "NVIDIA H100 80GB HBM3", "migEnabled": True, "migDevices": []} for profiles in cards]}


@pytest.mark.parametrize("fact, says", [
    (_mig_fact(), "its MIG devices are of 2 profiles (1g.10gb, 2g.20gb+me), and single takes one"),
    (_single(["1g.10gb"] * 7, None), "GPU 1 has MIG on and no MIG device"),
    (_single(["1g.10gb"] * 7, []), "GPU 1 has MIG off beside GPUs with it on"),
    ({"nvml_available": True, "cardList": [{"model": "A"}, {"health": "Unhealthy"}]},
     "GPU 1 cannot be read, and the plugin stops at the first GPU it cannot read"),
    ({"nvml_available": False, "nvml_error": "Driver Not Loaded"}, "NVML cannot be initialised (Driver Not Loaded)"),
])
def test_a_node_the_device_plugin_will_not_start_on_is_promised_nothing(fact, says):
    from ansible_collections.scv.gpu.plugins.module_utils.node.device_plugin import (
        PluginRefusal,
        device_plugin_resources,
        refusal,
    )
    assert says in refusal(fact, "single")
    with pytest.raises(PluginRefusal, match=re.escape(says)):
        device_plugin_resources(fact, "single")
    assert device_plugin_resources(_single(["1g.10gb"] * 7, ["1g.10gb"] * 7), "single") == {"nvidia.com/gpu": 14}


def test_the_refusal_filter_judges_the_node_as_a_layout_leaves_it():
    from ansible_collections.scv.gpu.plugins.filter.device_plugin_resources import (
        scv_gpu_device_plugin_refusal,
        scv_gpu_device_plugin_resources,
    )
    fact = _single([], [])
    mixed = [{"index": 0, "after": {"mig-enabled": True, "mig-devices": {"1g.10gb": 4, "3g.40gb": 1}}}]
    assert scv_gpu_device_plugin_refusal(fact, "single") == ""
    assert "GPU 1 has MIG off beside" in scv_gpu_device_plugin_refusal(fact, "single", [
        {"index": 0, "after": {"mig-enabled": True, "mig-devices": {"1g.10gb": 7}}}])
    assert "2 profiles (1g.10gb, 3g.40gb)" in scv_gpu_device_plugin_refusal(fact, "single", mixed + [
        dict(mixed[0], index=1)])
    assert scv_gpu_device_plugin_resources(fact, "mixed", mixed) == {
        "nvidia.com/gpu": 1, "nvidia.com/mig-1g.10gb": 4, "nvidia.com/mig-3g.40gb": 1}
    assert fact["cardList"][0]["migEnabled"] is False          # the fact given is not changed


def test_the_filter_refuses_an_unknown_strategy():
    from ansible.errors import AnsibleFilterError
    from ansible_collections.scv.gpu.plugins.filter.device_plugin_resources import scv_gpu_device_plugin_resources
    with pytest.raises(AnsibleFilterError, match="none, single or mixed, not 'mixd'"):
        scv_gpu_device_plugin_resources(_mig_fact(), "mixd")
    assert scv_gpu_device_plugin_resources(_mig_fact(), "mixed")["nvidia.com/mig-1g.10gb"] == 2


def test_the_mig_labels_of_a_strategy_left_behind_are_removed_and_look_alikes_kept():
    single = ["nvidia.com/gpu." + suffix for suffix in ("multiprocessors", "slices.gi", "slices.ci", "engines.copy",
                                                        "engines.decoder", "engines.encoder", "engines.jpeg",
                                                        "engines.ofa")]
    mixed = ["nvidia.com/mig-1g.10gb.count", "nvidia.com/mig-1g.10gb.product", "nvidia.com/mig-1g.10gb.memory",
             "nvidia.com/mig-2g.20gb.me.multiprocessors", "nvidia.com/mig-3g.40gb.engines.ofa"]
    foreign = ["nvidia.com/gpu.multiprocessors.total", "nvidia.com/mig-1g.10gb.owner", "nvidia.com/mig.config",
               "example.com/gpu.multiprocessors", "team"]
    current = {key: "1" for key in single + mixed + foreign}
    assert label_changes(current, {}, "gpu/nvidia") == {key: None for key in single + mixed}


def test_label_key_lengths_are_the_kubernetes_limits():
    """A name of up to 63 characters, a prefix of up to 253."""
    assert valid_label_key("x" * 63) and not valid_label_key("x" * 64)
    assert valid_label_key("a" * 253 + "/gpu") and not valid_label_key("a" * 254 + "/gpu")


@pytest.mark.parametrize("second", [{"migEnabled": False}, {"migEnabled": True, "migDevices": []}])
def test_strategy_single_with_a_gpu_that_is_no_mig_device_is_invalid(second):
    """GFD's rule: under strategy single every GPU must be split, into devices of one profile."""
    model = "NVIDIA H100 80GB HBM3"
    fact = {"nvml_available": True, "cardList": [
        {"model": model, "migEnabled": True, "migDevices": [{"profile": "1g.10gb"}, {"profile": "1g.10gb"}]},
        dict(second, model=model)]}
    labels = desired_labels(fact, "gpu/nvidia", "single")
    assert (labels["nvidia.com/gpu.product"], labels["nvidia.com/gpu.count"], labels["nvidia.com/gpu.memory"]) == (
        "NVIDIA-H100-80GB-HBM3-MIG-INVALID", "0", "0")
    fact["cardList"][1] = dict(fact["cardList"][0])
    labels = desired_labels(fact, "gpu/nvidia", "single")
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb" and labels["nvidia.com/gpu.count"] == "4"


def test_an_invalid_single_strategy_names_the_first_split_gpu():
    fact = {"nvml_available": True, "cardList": [
        {"model": "NVIDIA A100-SXM4-40GB", "migEnabled": False},
        {"model": "NVIDIA H100 80GB HBM3", "migEnabled": True, "migDevices": [{"profile": "1g.10gb"}]},
        {"model": "NVIDIA H200", "migEnabled": True, "migDevices": [{"profile": "1g.18gb"}]}]}
    assert desired_labels(fact, "gpu/nvidia", "single")["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-MIG-INVALID"


def test_versions_that_are_not_numbers_give_no_version_labels():
    fact = dict(BY_SCENARIO["titan_xp"], driver_version="open.kernel", cuda_driver_version="twelve.two")
    assert not [key for key in desired_labels(fact, "gpu/nvidia") if key.startswith("nvidia.com/cuda.")]


def test_pci_entries_without_a_usable_bus_address_tell_no_gpu_mode():
    fact = copy.deepcopy(BY_SCENARIO["titan_xp"])
    for card in fact["cardList"]:
        card.pop("pciBusId", None)
    fact["pci_gpus"] = ["not an entry", {"busId": "bogus", "class": "0x030200"}, {"class": "0x030200"}]
    assert desired_labels(fact, "gpu/nvidia")["nvidia.com/gpu.mode"] == "unknown"


def test_strategy_single_with_one_mig_device():
    fact = {"nvml_available": True, "cardList": [
        {"model": "NVIDIA H100 80GB HBM3", "migEnabled": True, "migDevices": [{"profile": "7g.80gb"}]}]}
    labels = desired_labels(fact, "gpu/nvidia", "single")
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-MIG-7g.80gb" and labels["nvidia.com/gpu.count"] == "1"


@pytest.mark.parametrize("version, parts", [
    ("535.104", ("535", "104", "")), ("535.104.05", ("535", "104", "05")), ("535", None), ("1.2.3.4", None)])
def test_driver_versions_of_two_or_three_parts_are_labelled(version, parts):
    labels = desired_labels(dict(BY_SCENARIO["titan_xp"], driver_version=version), "gpu/nvidia")
    found = tuple(labels.get("nvidia.com/cuda.driver-version." + name) for name in ("major", "minor", "revision"))
    assert found == (parts or (None, None, None))
    assert labels.get("nvidia.com/cuda.driver-version.full") == (version if parts else None)


def test_the_site_key_names_the_first_gpu_model_too():
    fact = copy.deepcopy(BY_SCENARIO["titan_xp"])
    fact["cardList"].append(dict(fact["cardList"][0], id=1, model="NVIDIA GeForce GTX 1080"))
    assert desired_labels(fact, "gpu/nvidia")["gpu/nvidia"] == "TITAN-Xp"


@pytest.mark.parametrize("version, full", [("12.2", "12.2"), ("12.4.1", "12.4"), ("12", None)])
def test_cuda_versions_of_two_parts_or_more_are_labelled(version, full):
    labels = desired_labels(dict(BY_SCENARIO["titan_xp"], cuda_driver_version=version), "gpu/nvidia")
    assert labels.get("nvidia.com/cuda.runtime-version.full") == full


@pytest.mark.parametrize("capability, labelled", [("8.6", ("8", "6")), ("0.0", None), ("8", None), (None, None)])
def test_compute_capability_labels_need_a_known_major_and_minor(capability, labelled):
    fact = copy.deepcopy(BY_SCENARIO["titan_xp"])
    fact["cardList"][0]["computeCapability"] = capability
    labels = desired_labels(fact, "gpu/nvidia")
    found = (labels.get("nvidia.com/gpu.compute.major"), labels.get("nvidia.com/gpu.compute.minor"))
    assert found == (labelled or (None, None))


@pytest.mark.parametrize("config, sharing", [
    (None, ("none", {})),
    ({"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 4}]}}},
     ("time-slicing", {"nvidia.com/gpu": (4, False)})),
    ({"sharing": {"mps": {"renameByDefault": True, "resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}},
     ("mps", {"nvidia.com/gpu": (2, True)})),
    # both blocks: the replicas come from mps whenever it is there, the strategy from whichever replicates
    ({"sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 1}]},
                  "timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}},
     ("time-slicing", {"nvidia.com/gpu": (1, False)})),
    # the first entry of a name counts
    ({"sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 3},
                                                {"name": "nvidia.com/gpu", "replicas": 5}]}}},
     ("time-slicing", {"nvidia.com/gpu": (3, False)})),
    # what the role would refuse does not break the labels: no replicas, no sharing
    ({"sharing": {"timeSlicing": {"resources": ["gpu", {"name": "gpu", "replicas": "4"}, {"replicas": True}]}}},
     ("none", {"nvidia.com/gpu": (0, False), None: (0, False)})),
    ({"sharing": ["timeSlicing"]}, ("none", {})),
])
def test_a_configs_sharing_is_read_as_gfd_reads_it(config, sharing):
    assert config_sharing(config) == sharing


def test_a_shared_gpu_is_labelled_shared_unless_renamed():
    fact = BY_SCENARIO["h100_sxm_x8"]
    slicing = {"sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}
    labels = desired_labels(fact, "gpu/nvidia", config=slicing)
    assert (labels["nvidia.com/gpu.product"], labels["nvidia.com/gpu.replicas"],
            labels["nvidia.com/gpu.sharing-strategy"], labels["nvidia.com/mps.capable"]) == (
        "NVIDIA-H100-80GB-HBM3-SHARED", "4", "time-slicing", "false")
    slicing["sharing"]["timeSlicing"]["renameByDefault"] = True
    assert desired_labels(fact, "gpu/nvidia", config=slicing)["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    mps = {"sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}}
    assert desired_labels(fact, "gpu/nvidia", config=mps)["nvidia.com/mps.capable"] == "true"
    # the site's key keeps the model: DaemonSets selecting on it reach shared and unshared nodes alike
    assert desired_labels(fact, "gpu/nvidia", config=mps)["gpu/nvidia"] == "NVIDIA-H100-80GB-HBM3"


def test_mps_is_refused_while_a_gpu_has_mig_on():
    assert mps_refusal(BY_SCENARIO["h100_sxm_x8"]) is None
    assert mps_refusal({"cardList": [{"index": 0}, {"index": 1, "migEnabled": True}]}) == (
        "MPS sharing is not supported while MIG is enabled (GPU 1)")
