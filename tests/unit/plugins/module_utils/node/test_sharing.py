"""Device plugin configs (time-slicing, MPS): each rule refuses with the key named, good configs pass."""

from __future__ import annotations

import copy
import pathlib

import pytest
import yaml

from ansible_collections.scv.gpu.plugins.module_utils.node import sharing

TS = {"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}
MPS = {"sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}}
CONFIGS = {"ts-4": TS, "mps-2": MPS}


def configs_with(name, path, value):
    """CONFIGS with one value set (path: keys and indexes into config ``name``); value DELETE removes it."""
    configs = copy.deepcopy(CONFIGS)
    target = configs[name]
    for key in path[:-1]:
        target = target[key]
    if value is DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return configs


DELETE = object()
UUID = "5a4f8c2e-7f0b-4e55-9c3a-1b2d3e4f5a6b"
TS_RESOURCE = ("sharing", "timeSlicing", "resources", 0)
MPS_RESOURCE = ("sharing", "mps", "resources", 0)


def problems(configs, mig_strategy="none", default="ts-4", choice=""):
    return sharing.config_problems(configs, mig_strategy, default, choice)


@pytest.mark.parametrize("configs, default, choice", [
    (CONFIGS, "ts-4", ""),
    (CONFIGS, "ts-4", "mps-2"),
    ({"only": TS}, "", ""),                                  # one config is the default by itself
    ({}, "", ""),                                            # no configs: today's behaviour
    (None, "", ""),
    ({"plain": {"version": "v1"}, "ts-4": TS}, "plain", ""),  # a config may share nothing
    ({"ts": {"sharing": {"timeSlicing": {"renameByDefault": True, "failRequestsGreaterThanOne": False,
                                         "resources": [{"name": "gpu", "replicas": 10, "devices": "all"},
                                                       {"name": "nvidia.com/mig-1g.10gb", "replicas": 2,
                                                        "rename": "mig-1g.10gb.shared"}]}}}}, "", ""),
])
def test_good_configs_pass(configs, default, choice):
    strategy = "mixed" if "ts" in (configs or {}) else "none"
    assert sharing.config_problems(configs, strategy, default, choice) == []


@pytest.mark.parametrize("name, path, value, message", [
    ("ts-4", ("version",), "v2",
     "device_plugin_configs['ts-4'].version: 'v2' is a version the device plugin does not read; write v1 or leave it "
     "out"),
    ("mps-2", MPS_RESOURCE + ("replicas",), 1,
     "device_plugin_configs['mps-2'].sharing.mps.resources[0].replicas: 1 is fewer than 2, and the device plugin "
     "shares a device among 2 or more replicas; set 2 or more, or leave the resource out to offer it unshared"),
    ("ts-4", TS_RESOURCE + ("replicas",), "4",
     "device_plugin_configs['ts-4'].sharing.timeSlicing.resources[0].replicas: '4' is not a whole number; write one "
     "of 2 or more, unquoted"),
    ("ts-4", TS_RESOURCE + ("replicas",), 2.5,
     "device_plugin_configs['ts-4'].sharing.timeSlicing.resources[0].replicas: 2.5 is not a whole number"),
    ("ts-4", TS_RESOURCE + ("replicas",), True,
     "device_plugin_configs['ts-4'].sharing.timeSlicing.resources[0].replicas: True is not a whole number"),
    ("ts-4", TS_RESOURCE + ("replicas",), DELETE,
     "device_plugin_configs['ts-4'].sharing.timeSlicing.resources[0].replicas: missing"),
    ("ts-4", TS_RESOURCE + ("name",), DELETE,
     "device_plugin_configs['ts-4'].sharing.timeSlicing.resources[0].name: missing"),
    ("ts-4", TS_RESOURCE + ("name",), "",
     "device_plugin_configs['ts-4'].sharing.timeSlicing.resources[0].name: '' is not a resource name"),
    ("ts-4", TS_RESOURCE + ("name",), "nvidia.com/gpus",
     "device_plugin_configs['ts-4'].sharing.timeSlicing.resources[0].name: the device plugin offers no resource "
     "nvidia.com/gpus, so it would share nothing; name nvidia.com/gpu"),
    ("ts-4", TS_RESOURCE + ("name",), "nvidia.com/mig-1g.10gb",
     "device_plugin_configs['ts-4'].sharing.timeSlicing.resources[0].name: nvidia.com/mig-1g.10gb is offered only "
     "under the mixed MIG strategy, and device_plugin_mig_strategy is none; name nvidia.com/gpu, or set "
     "device_plugin_mig_strategy: mixed"),
    ("ts-4", TS_RESOURCE + ("devices",), "some",
     "device_plugin_configs['ts-4'].sharing.timeSlicing.resources[0].devices: 'some' is not a device selection the "
     "device plugin accepts; write all"),
    ("ts-4", TS_RESOURCE + ("devices",), 0,
     "device_plugin_configs['ts-4'].sharing.timeSlicing.resources[0].devices: 0 is not a device selection"),
    ("ts-4", TS_RESOURCE + ("devices",), ["GPU-xyz"],
     "device_plugin_configs['ts-4'].sharing.timeSlicing.resources[0].devices: ['GPU-xyz'] is not a device selection"),
    ("ts-4", TS_RESOURCE + ("devices",), [],
     "device_plugin_configs['ts-4'].sharing.timeSlicing.resources[0].devices: [] is not a device selection"),
    ("ts-4", TS_RESOURCE + ("devices",), [-1],
     "device_plugin_configs['ts-4'].sharing.timeSlicing.resources[0].devices: [-1] is not a device selection"),
    ("ts-4", TS_RESOURCE + ("devices",), 1,
     "device_plugin_configs['ts-4'].sharing.timeSlicing.resources[0].devices: the device plugin ignores a device "
     "selection and shares every device of the resource; remove devices, or write all"),
    ("ts-4", TS_RESOURCE + ("devices",), [0, "1", "0:1", "GPU-%s" % UUID, "MIG-%s" % UUID, "MIG-GPU-%s/1/0" % UUID],
     "device_plugin_configs['ts-4'].sharing.timeSlicing.resources[0].devices: the device plugin ignores"),
    ("ts-4", TS_RESOURCE + ("rename",), "Shared_GPU",
     "device_plugin_configs['ts-4'].sharing.timeSlicing.resources[0].rename: nvidia.com/Shared_GPU is not a "
     "resource name the device plugin accepts"),
    ("ts-4", TS_RESOURCE + ("rename",), "g" * 53,           # 64 characters with the prefix
     "device_plugin_configs['ts-4'].sharing.timeSlicing.resources[0].rename: nvidia.com/%s is not a resource name"
     % ("g" * 53)),
    ("ts-4", TS_RESOURCE + ("rename",), "g" * 52,           # 63: a name, but one the plugin ignores
     "device_plugin_configs['ts-4'].sharing.timeSlicing.resources[0].rename: the device plugin ignores rename"),
    ("ts-4", TS_RESOURCE + ("rename",), "",
     "device_plugin_configs['ts-4'].sharing.timeSlicing.resources[0].rename: '' is not a resource name"),
    ("ts-4", TS_RESOURCE + ("rename",), "gpu.shared",
     "device_plugin_configs['ts-4'].sharing.timeSlicing.resources[0].rename: the device plugin ignores rename and "
     "offers the replicas as the resource itself, or as <name>.shared with renameByDefault: true; remove rename"),
    ("ts-4", TS_RESOURCE + ("replica",), 4,
     "device_plugin_configs['ts-4'].sharing.timeSlicing.resources[0].replica: the device plugin does not know this "
     "key in a shared resource and would ignore it; known keys are name, rename, devices, replicas"),
    ("ts-4", TS_RESOURCE, "nvidia.com/gpu",
     "device_plugin_configs['ts-4'].sharing.timeSlicing.resources[0]: 'nvidia.com/gpu' is not a mapping"),
    ("ts-4", ("sharing", "timeSlicing", "resources"), [],
     "device_plugin_configs['ts-4'].sharing.timeSlicing.resources: [] is not a non-empty list; the device plugin "
     "refuses a sharing block without resources"),
    ("ts-4", ("sharing", "timeSlicing", "resources"), DELETE,
     "device_plugin_configs['ts-4'].sharing.timeSlicing.resources: missing"),
    ("ts-4", ("sharing", "timeSlicing", "renameByDefault"), "yes",
     "device_plugin_configs['ts-4'].sharing.timeSlicing.renameByDefault: 'yes' is not true or false"),
    ("mps-2", ("sharing", "mps", "failRequestsGreaterThanOne"), 1,
     "device_plugin_configs['mps-2'].sharing.mps.failRequestsGreaterThanOne: 1 is not true or false"),
    ("ts-4", ("sharing", "timeSlicing", "replicas"), 4,
     "device_plugin_configs['ts-4'].sharing.timeSlicing.replicas: the device plugin does not know this key in "
     "sharing.timeSlicing and would ignore it"),
    ("ts-4", ("sharing", "timeSlicing"), None,
     "device_plugin_configs['ts-4'].sharing.timeSlicing: None is not a mapping"),
    ("ts-4", ("sharing", "timeslicing"), {"resources": []},
     "device_plugin_configs['ts-4'].sharing.timeslicing: the device plugin does not know this key in sharing and "
     "would ignore it; known keys are timeSlicing, mps"),
    ("ts-4", ("sharing", "mps"), MPS["sharing"]["mps"],
     "device_plugin_configs['ts-4'].sharing: sets both timeSlicing and mps, and the device plugin would use mps and "
     "ignore timeSlicing; keep one"),
    ("ts-4", ("sharing",), [],
     "device_plugin_configs['ts-4'].sharing: [] is not a mapping"),
    ("ts-4", ("flags",), {"migStrategy": "single"},
     "device_plugin_configs['ts-4'].flags.migStrategy: 'single' differs from device_plugin_mig_strategy (none), "
     "which the plugin's MIG_STRATEGY and the node labels follow; leave migStrategy out"),
    ("ts-4", ("flags",), "none",
     "device_plugin_configs['ts-4'].flags: 'none' is not a mapping"),
    ("ts-4", ("resources",), {"gpus": [{"pattern": "*", "name": "gpu"}]},
     "device_plugin_configs['ts-4'].resources: the device plugin ignores custom resource names; remove it"),
    ("ts-4", ("Sharing",), {},
     "device_plugin_configs['ts-4'].Sharing: the device plugin does not know this key in a config and would ignore "
     "it; known keys are version, flags, resources, sharing, imex"),
])
def test_each_rule_names_the_key_and_what_to_do(name, path, value, message):
    found = problems(configs_with(name, path, value))
    assert any(problem.startswith(message) for problem in found), found


def test_a_resource_listed_twice_is_named_with_its_first_place():
    configs = copy.deepcopy(CONFIGS)
    configs["ts-4"]["sharing"]["timeSlicing"]["resources"].append({"name": "gpu", "replicas": 2})
    assert problems(configs) == [
        "device_plugin_configs['ts-4'].sharing.timeSlicing.resources[1].name: nvidia.com/gpu is listed already at "
        "resources[0]; list each resource once"]


def test_the_same_mig_strategy_in_a_config_is_accepted():
    assert problems(configs_with("ts-4", ("flags",), {"migStrategy": "none"})) == []


def test_a_config_that_is_no_mapping_is_named():
    assert problems({"ts-4": ["timeSlicing"]}) == [
        "device_plugin_configs['ts-4']: ['timeSlicing'] is not a mapping; write {version: v1, sharing: "
        "{timeSlicing: {...}}}"]


@pytest.mark.parametrize("name", ["Bad name!", "-ts", "x" * 64, "", 4, "ts/4"])
def test_a_name_that_cannot_be_a_label_value_or_configmap_key_is_refused(name):
    found = [problem for problem in sharing.config_problems({name: TS}, "none", "", "")
             if problem.startswith("device_plugin_configs: ")]
    assert len(found) == 1 and repr(name) in found[0], found


def test_mps_on_mig_resources_and_under_mixed_is_refused():
    configs = configs_with("mps-2", MPS_RESOURCE + ("name",), "nvidia.com/mig-1g.10gb")
    found = problems(configs, mig_strategy="mixed")
    assert "device_plugin_configs['mps-2'].sharing.mps: the device plugin does not run MPS under the mixed MIG " \
           "strategy; set device_plugin_mig_strategy to none or single, or use timeSlicing" in found
    assert "device_plugin_configs['mps-2'].sharing.mps.resources[0].name: nvidia.com/mig-1g.10gb is a MIG device, " \
           "and the device plugin does not share MIG devices with MPS; use timeSlicing for MIG devices" in found
    assert problems(CONFIGS, mig_strategy="single") == []


@pytest.mark.parametrize("profile", ["1g.10gb", "1c.2g.20gb", "1g.10gb+me", "1g.24gb+gfx", "7g.80gb"])
def test_mig_profiles_are_resources_under_mixed(profile):
    configs = configs_with("ts-4", TS_RESOURCE + ("name",), "nvidia.com/mig-" + profile)
    del configs["mps-2"]                                      # MPS has no place under mixed
    assert problems(configs, mig_strategy="mixed") == []


def test_the_mixed_strategy_suggests_mig_resources():
    found = problems(configs_with("ts-4", TS_RESOURCE + ("name",), "mig-big"), mig_strategy="mixed")
    assert found[0].endswith("name nvidia.com/gpu or nvidia.com/mig-<profile> (such as nvidia.com/mig-1g.10gb)")


@pytest.mark.parametrize("default, choice, message", [
    ("", "", "device_plugin_default_config: unset, and device_plugin_configs has 2 configs (mps-2, ts-4); name the "
             "one a node without device_plugin_config gets"),
    ("ts-8", "", "device_plugin_default_config: 'ts-8' is not a config of device_plugin_configs (mps-2, ts-4); "
                 "name one of them"),
    ("ts-4", "mps", "device_plugin_config: 'mps' is not a config of device_plugin_configs (mps-2, ts-4); name one "
                    "of them"),
])
def test_the_default_and_the_choice_must_name_a_config(default, choice, message):
    assert problems(CONFIGS, default=default, choice=choice) == [message]


def test_a_choice_without_configs_is_refused():
    assert sharing.config_problems({}, "none", "ts-4", "mps-2") == [
        "device_plugin_default_config is set, but device_plugin_configs is empty; define the config there, or leave "
        "device_plugin_default_config unset",
        "device_plugin_config is set, but device_plugin_configs is empty; define the config there, or leave "
        "device_plugin_config unset"]


def test_configs_need_the_nvidia_flavor_and_a_mapping_and_a_known_strategy():
    assert sharing.config_problems(CONFIGS, "none", "ts-4", "", "gke") == [
        "device_plugin_configs: configs are read by NVIDIA's device plugin only, and device_plugin_flavor is gke; "
        "set device_plugin_flavor: nvidia or leave device_plugin_configs empty"]
    assert sharing.config_problems(["ts-4"]) == [
        "device_plugin_configs: ['ts-4'] is not a mapping of config names to configs"]
    assert sharing.config_problems(CONFIGS, "mixd", "ts-4") == [
        "device_plugin_mig_strategy: 'mixd' is none, single or mixed"]


def test_completed_fills_in_version_and_the_mig_strategy_and_keeps_the_rest():
    done = sharing.completed(MPS, "single")
    assert done == {"version": "v1", "flags": {"migStrategy": "single"}, "sharing": MPS["sharing"]}
    assert list(done) == ["version", "flags", "sharing"]
    assert "flags" not in MPS                                 # the input is left alone
    kept = sharing.completed({"flags": {"migStrategy": "none", "failOnInitError": False}}, "single")
    assert kept["flags"] == {"migStrategy": "none", "failOnInitError": False}


def test_the_default_is_the_only_config_when_none_is_named():
    assert sharing.default_config({"a": TS}, "") == "a"
    assert sharing.default_config(CONFIGS, "") == ""
    assert sharing.default_config(CONFIGS, "mps-2") == "mps-2"
    assert sharing.uses_mps(CONFIGS, "mps-2") and not sharing.uses_mps(CONFIGS, "ts-4")
    assert not sharing.uses_mps(CONFIGS, "absent") and not sharing.uses_mps(None, "mps-2")
    assert sharing.sharing_kind({"version": "v1"}) is None and sharing.sharing_kind({"sharing": []}) is None
    assert sharing.resource_name("gpu") == "nvidia.com/gpu" == sharing.resource_name("nvidia.com/gpu")


def card(capability, mig=False):
    return {"computeCapability": capability, "migEnabled": mig}


def test_mps_is_refused_on_a_host_with_mig_enabled():
    fact = {"cardList": [card("8.0"), card("8.0", mig=True)]}
    assert sharing.host_problems(CONFIGS, "mps-2", fact, "gpu-1") == [
        "node gpu-1: config 'mps-2' shares its GPUs with MPS, but MIG is enabled on GPU 1, and MPS cannot share MIG "
        "devices; choose a timeSlicing config for this host (device_plugin_config), or disable MIG"]
    assert sharing.host_problems(CONFIGS, "ts-4", fact, "gpu-1") == []


@pytest.mark.parametrize("capabilities, replicas, limit, gpu", [
    (("9.0", "6.1"), 17, 16, 1), (("7.0", "9.0"), 17, 16, 0), (("7.4",), 17, 16, 0), (("9.0", "7.5"), 49, 48, 0), (("8.0",), 49, 48, 0)])
def test_mps_replicas_beyond_the_clients_a_gpu_takes_are_refused(capabilities, replicas, limit, gpu):
    configs = configs_with("mps-2", MPS_RESOURCE + ("replicas",), replicas)
    fact = {"cardList": [card(capability) for capability in capabilities]}
    assert sharing.host_problems(configs, "mps-2", fact, "gpu-1") == [
        "node gpu-1: device_plugin_configs['mps-2'].sharing.mps.resources[0].replicas: %d is more than the %d clients "
        "an MPS server takes on GPU %d (compute capability %s); set %d or fewer"
        % (replicas, limit, gpu, capabilities[gpu], limit)]
    fitting = configs_with("mps-2", MPS_RESOURCE + ("replicas",), limit)
    assert sharing.host_problems(fitting, "mps-2", fact, "gpu-1") == []


def test_hosts_whose_facts_say_nothing_pass():
    assert sharing.host_problems(CONFIGS, "mps-2", {"nvml_available": False}, "n") == []
    assert sharing.host_problems(CONFIGS, "mps-2", {"cardList": [{"computeCapability": ""}]}, "n") == []
    assert sharing.host_problems(CONFIGS, "mps-2", None, "n") == []


# The configs NVIDIA's binaries were run with for the fixtures (tools/gfd/sharing-configs): what NVIDIA refuses
# and what it ignores is refused here; what it serves as written passes.
NVIDIA_CONFIGS = pathlib.Path(__file__).resolve().parents[5] / "tools" / "gfd" / "sharing-configs"
REFUSED_EVERYWHERE = {"bad-devices", "bad-no-replicas", "bad-no-resources", "bad-replicas-0", "bad-replicas-1",
                      "bad-resource-name", "bad-version",                      # NVIDIA refuses them
                      "mps-and-time-slicing", "unknown-resource", "time-slicing-4-custom-ignored",   # it ignores
                      "mps-mig"}                                               # MPS on MIG


@pytest.mark.parametrize("path", sorted(NVIDIA_CONFIGS.glob("*.yaml")), ids=lambda path: path.stem)
def test_the_configs_nvidia_was_run_with_are_judged_as_nvidia_judged_them(path):
    config = yaml.safe_load(path.read_text())
    for strategy in ("none", "single", "mixed"):
        found = sharing.config_problems({path.stem: config}, strategy)
        mps = sharing.sharing_kind(config) == "mps"
        refused = (path.stem in REFUSED_EVERYWHERE or (mps and strategy == "mixed")
                   or (path.stem == "time-slicing-mig" and strategy != "mixed"))
        assert bool(found) == refused, (strategy, found)


@pytest.mark.parametrize("name, capability, refused", [("mps-20", "6.1", True), ("mps-20", "9.0", False),
                                                       ("mps-49", "9.0", True), ("mps-2", "6.1", False)])
def test_the_mps_replica_limits_nvidia_recorded(name, capability, refused):
    configs = {name: yaml.safe_load((NVIDIA_CONFIGS / (name + ".yaml")).read_text())}
    assert bool(sharing.host_problems(configs, name, {"cardList": [card(capability)]}, "n")) == refused
