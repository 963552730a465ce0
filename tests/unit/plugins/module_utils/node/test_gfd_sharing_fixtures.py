"""Sharing labels and shared devices against what NVIDIA's GFD and device plugin did with the same config.

tests/fixtures/gfd/sharing/<scenario>-<strategy>-<config>.txt hold the labels GFD wrote with
``--config-file`` set to tools/gfd/sharing-configs/<config>.yaml, and
tests/fixtures/device-plugin/sharing/ what NVIDIA's device plugin advertised with it (each device ID),
what its Allocate granted and refused, or why it would not start (tools/gfd/make-fixtures). Ours must
give the same labels and the same device IDs, and refuse where they refused.
"""

from __future__ import annotations

import re

import pytest
import yaml

from ansible_collections.scv.gpu.plugins.module_utils.node.device_plugin import PluginRefusal, offered_devices, refusal
from ansible_collections.scv.gpu.plugins.module_utils.node.labels import (
    config_sharing,
    desired_labels,
    label_problem,
    mps_refusal,
)
from ansible_collections.scv.gpu.plugins.module_utils.node.sharing import one_config_problems

from harness.gfd_labels import ONLY_OURS, our_labels
from harness.paths import ROOT
from harness.real_kubelet import one_replica_each

GFD = ROOT / "tests" / "fixtures" / "gfd" / "sharing"
PLUGIN = ROOT / "tests" / "fixtures" / "device-plugin" / "sharing"
CONFIGS = ROOT / "tools" / "gfd" / "sharing-configs"
HEADER = re.compile(r"# scenario (\w+), --mig-strategy (\w+), config ([\w.-]+)")


def config_of(name):
    return yaml.safe_load((CONFIGS / ("%s.yaml" % name)).read_text())


def header(path):
    return HEADER.search(path.read_text()).groups()


def gfd_fixture(path):
    status = int(re.search(r"exit status (\d+)", path.read_text()).group(1))
    labels = dict(line.split("=", 1) for line in path.read_text().splitlines() if line and not line.startswith("#"))
    return status, labels


def plugin_fixture(path):
    """{resource: [device IDs]}, [(IDs asked, granted?)], the refusal at start (or None) and the reason it
    failed to start and kept trying (or None)."""
    advertised, allocations, refused, failed, resource = {}, [], None, None, None
    for line in path.read_text().splitlines():
        if line.startswith("refuses: "):
            refused = line[len("refuses: "):]
        elif line.startswith("fails to start: "):
            failed = line[len("fails to start: "):]
        elif line.startswith("resource "):
            resource = line.split()[1]
            advertised[resource] = []
        elif line.startswith("  device "):
            advertised[resource].append(line.split()[1])
        elif line.startswith("  allocate "):
            asked, outcome = line[len("  allocate "):].split(": ", 1)
            allocations.append((resource, asked.split(), outcome.startswith("granted")))
    return advertised, allocations, refused, failed


def test_the_fixtures_cover_every_kind_of_config():
    stems = {path.stem for path in GFD.glob("*.txt")}
    assert {"h100_sxm_x8-none-time-slicing-4", "h100_sxm_x8-none-mps-2", "h100_sxm_x8-none-time-slicing-4-renamed",
            "h100_mig_mixed-mixed-time-slicing-mig"} <= stems
    assert {path.stem for path in PLUGIN.glob("*.txt")} >= {"h100_sxm_x8-none-time-slicing-4-strict"}
    assert all("built from NVIDIA/k8s-device-plugin " in path.read_text()
               for path in list(GFD.glob("*.txt")) + list(PLUGIN.glob("*.txt")))


@pytest.mark.parametrize("path", sorted(GFD.glob("*.txt")), ids=lambda path: path.stem)
def test_sharing_labels_equal_gfd(nvml_simulator, tmp_path, path):
    scenario, strategy, name = header(path)
    config = config_of(name)
    status, gfd = gfd_fixture(path)
    ours, fact = our_labels(nvml_simulator, tmp_path, scenario, strategy)
    if status != 0:
        # GFD stops: the config is one the role refuses, or MPS on a node with MIG on, which node_labels refuses
        assert one_config_problems(name, config, strategy) or mps_refusal(fact), path.read_text()
        return
    ours = desired_labels(fact, "gpu/nvidia", strategy, config=config)
    # a value no Node may carry (a long name with a MIG profile after it) is left out, as test_gfd_fixtures shows
    expected = {key: value for key, value in gfd.items()
                if key != "nvidia.com/gpu.machine" and not label_problem(key, value)}
    assert {key: value for key, value in ours.items() if key not in ONLY_OURS} == expected


@pytest.mark.parametrize("path", sorted(PLUGIN.glob("*.txt")), ids=lambda path: path.stem)
def test_shared_devices_equal_what_nvidias_plugin_advertised(nvml_simulator, tmp_path, path):
    scenario, strategy, name = header(path)
    config = config_of(name)
    advertised, allocations, refused, failed = plugin_fixture(path)
    _ours, fact = our_labels(nvml_simulator, tmp_path, scenario, strategy)
    if failed:
        # no MPS control daemon on the node: the plugin serves nothing until one runs, which is why the
        # device_plugin role deploys it wherever a node's config asks for MPS
        assert "MPS daemon" in failed and config_sharing(config)[0] == "mps"
        return
    if refused:
        # refused at start: a config the role refuses, or one that offers what the plugin will not serve
        if not one_config_problems(name, config, strategy):
            assert refusal(fact, strategy, config), refused
            with pytest.raises(PluginRefusal):
                offered_devices(fact, strategy, config)
        return
    offered = {resource: sorted(ids) for resource, ids in offered_devices(fact, strategy, config).items() if ids}
    assert offered == {resource: sorted(ids) for resource, ids in advertised.items()}
    for resource, asked, granted in allocations:
        several = len(asked) > 1 and any("::" in device for device in asked)
        assert granted is not (several and one_replica_each(config)), (resource, asked)
