"""node_labels against what NVIDIA's GPU feature discovery (GFD) wrote for the same GPUs.

tests/fixtures/gfd/<scenario>-<strategy>.txt hold the labels GFD printed with ``--oneshot`` on
the NVML simulator, each scenario's sysfs PCI tree mounted over /sys/bus/pci/devices
(tools/gfd/make-fixtures, which names the GFD commit in each file). Here the same scenario goes
through the real pynvml and gpu_facts' reader, and the labels ours would set must equal GFD's,
but for the documented differences below.
"""

from __future__ import annotations

import re

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.common.gpu_info import GATHER_SUBSETS
from ansible_collections.scv.gpu.plugins.module_utils.node.device_plugin import (
    PluginRefusal,
    device_plugin_resources,
    laid_out,
    refusal,
)
from ansible_collections.scv.gpu.plugins.module_utils.node.labels import desired_labels, label_problem
from ansible_collections.scv.gpu.plugins.module_utils.nvml.collect import collect

from harness.gfd_labels import ONLY_OURS, our_labels
from harness.paths import ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "gfd"
# The GFD label of the machine's DMI type, not of its GPUs: node_labels leaves it out.
NOT_OURS = re.compile(r"^nvidia\.com/gpu\.machine$")
# Where GFD picks one model of several at random (its per-model labels come from a Go map).
PER_MODEL = {"nvidia.com/gpu." + name for name in ("product", "count", "memory", "family", "compute.major",
                                                   "compute.minor", "replicas", "sharing-strategy")}


def read_fixture(path):
    header = re.search(r"# scenario (\S+), --mig-strategy (\S+), exit status (\d+)", path.read_text())
    labels = dict(line.split("=", 1) for line in path.read_text().splitlines() if line and not line.startswith("#"))
    return header.group(1), header.group(2), int(header.group(3)), labels


FIXTURE_FILES = sorted(FIXTURES.glob("*.txt"))


def test_every_scenario_has_a_fixture_per_strategy():
    scenarios = sorted(path.stem for path in (ROOT / "tests" / "nvml_simulator" / "scenarios").glob("*.json"))
    wanted = ["%s-%s" % (scenario, strategy) for scenario in scenarios for strategy in ("none", "single", "mixed")]
    assert sorted(path.stem for path in FIXTURE_FILES) == sorted(wanted)
    assert all("gpu-feature-discovery built from NVIDIA/k8s-device-plugin " in path.read_text()
               for path in FIXTURE_FILES)


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=lambda path: path.stem)
def test_labels_equal_gfd(nvml_simulator, tmp_path, path):
    scenario, strategy, status, gfd = read_fixture(path)
    ours, fact = our_labels(nvml_simulator, tmp_path, scenario, strategy)
    if status != 0:
        # GFD stops at the first card it cannot read and labels nothing (a lost card), or finds
        # no driver. Ours labels the cards that answer, and a driverless node from its PCI bus.
        assert gfd == {}
        usable = [card for card in fact.get("cardList", []) if card.get("model")]
        assert ours.get("nvidia.com/gpu.count", "0") == str(len(usable))
        return
    # GFD writes a label the API server would refuse (a long GPU name with its MIG profile after it, over 63
    # characters); NFD then drops it alone. node_labels leaves it out and names it, and sets the others.
    refused = {key for key, value in gfd.items() if label_problem(key, value)}
    expected = {key: value for key, value in gfd.items() if not NOT_OURS.match(key) and key not in refused}
    got = {key: value for key, value in ours.items() if key not in ONLY_OURS}
    models = {card["model"] for card in fact["cardList"] if card.get("model")}
    if len(models) > 1:
        # GFD's per-model labels describe one of the models; ours always the first GPU's.
        group = [card for card in fact["cardList"] if card.get("model") == fact["cardList"][0]["model"]]
        assert got["nvidia.com/gpu.product"] == group[0]["model"].replace(" ", "-")
        assert got["nvidia.com/gpu.count"] == str(len(group))
        assert expected["nvidia.com/gpu.product"] in {model.replace(" ", "-") for model in models}
        expected = {key: value for key, value in expected.items() if key not in PER_MODEL}
        got = {key: value for key, value in got.items() if key not in PER_MODEL}
    assert got == expected


def test_a_long_gpu_name_costs_the_node_only_the_label_gfd_makes_too_long(nvml_simulator, tmp_path):
    """NVIDIA's long product names (RTX PRO 6000 Blackwell Max-Q Workstation Edition) with a MIG profile after
    them are over 63 characters in GFD's own output: only that label is left out, and named."""
    for strategy, key in (("single", "nvidia.com/gpu.product"), ("mixed", "nvidia.com/mig-1g.24gb.product")):
        gfd = read_fixture(FIXTURES / ("rtx_pro_6000_mig-%s.txt" % strategy))[3]
        assert len(gfd[key]) == 67 and label_problem(key, gfd[key])
        nvml_simulator.use("rtx_pro_6000_mig")
        fact = collect(list(GATHER_SUBSETS))
        refused = {}
        ours = desired_labels(fact, "gpu/nvidia", strategy, refused=refused)
        assert key not in ours and list(refused) == [key], refused
        assert ours["nvidia.com/gpu.product" if strategy == "mixed" else "nvidia.com/gpu.count"] == {
            "mixed": "NVIDIA-RTX-PRO-6000-Blackwell-Max-Q-Workstation-Edition", "single": "4"}[strategy]
        assert all(label_problem(name, value) is None for name, value in ours.items())


def test_a_heterogeneous_node_is_labelled_by_its_first_model(nvml_simulator, tmp_path):
    ours, fact = our_labels(nvml_simulator, tmp_path, "health_reasons", "none")
    models = [card["model"] for card in fact["cardList"]]
    assert len(set(models)) == 3
    assert ours["nvidia.com/gpu.product"] == "NVIDIA-A30"
    assert ours["nvidia.com/gpu.count"] == str(models.count("NVIDIA A30"))
    assert ours["nvidia.com/gpu.memory"] == str(fact["cardList"][0]["totalMemory"])


def test_fixtures_cover_each_mig_case():
    """The MIG cases the labels must get right are in the fixtures, as GFD wrote them."""
    single = {read_fixture(path)[0]: read_fixture(path)[3] for path in FIXTURES.glob("*-single.txt")}
    assert single["h100_mig_all_1g"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"
    assert single["h100_mig_all_1g"]["nvidia.com/gpu.count"] == "14"
    for invalid in ("a100_mig", "h100_mig_mixed", "h100_mig_empty"):
        assert single[invalid]["nvidia.com/gpu.product"].endswith("-MIG-INVALID")
        assert single[invalid]["nvidia.com/gpu.count"] == "0"
    mixed = read_fixture(FIXTURES / "h100_mig_mixed-mixed.txt")[3]
    assert {key for key in mixed if key.endswith(".count")} == {
        "nvidia.com/gpu.count", "nvidia.com/mig-1g.10gb.count", "nvidia.com/mig-2g.20gb.count",
        "nvidia.com/mig-3g.40gb.count", "nvidia.com/mig-7g.80gb.count"}
    graphics = read_fixture(FIXTURES / "titan_xp-none.txt")[3]
    assert graphics["nvidia.com/gpu.mode"] == "graphics"


PLUGIN_FIXTURES = sorted((ROOT / "tests" / "fixtures" / "device-plugin").glob("*.txt"))


def plugin_fixture(path):
    """(scenario, strategy, the resources NVIDIA's device plugin served, whether it refused to start)."""
    text = path.read_text()
    scenario, strategy = re.search(r"# scenario (\w+), --mig-strategy (\w+)", text).groups()
    lines = text.splitlines()
    served = {line.split(" ", 1)[1] for line in lines if line.startswith("serves ")}
    return scenario, strategy, served, any(line.startswith("refuses: ") for line in lines)


@pytest.mark.parametrize("path", PLUGIN_FIXTURES, ids=lambda path: path.stem)
def test_the_resources_equal_what_nvidias_device_plugin_serves(nvml_simulator, tmp_path, path):
    """device_plugin_resources (what the mig_layout role waits for) names the resources NVIDIA's
    device plugin started to serve on the same GPUs; where the plugin refused to start, it promises
    nothing and refusal() gives the reason."""
    scenario, strategy, served, refused = plugin_fixture(path)
    ours, fact = our_labels(nvml_simulator, tmp_path, scenario, strategy)
    if refused:
        assert refusal(fact, strategy), path.read_text()
        with pytest.raises(PluginRefusal):
            device_plugin_resources(fact, strategy)
        return
    assert refusal(fact, strategy) is None
    resources = device_plugin_resources(fact, strategy)
    assert {name for name, count in resources.items() if count} == served


MIG_SCENARIOS = ["h100_mig_all_1g", "h100_mig_empty", "h100_mig_mixed"]


@pytest.mark.parametrize("strategy", ["single", "mixed"])
@pytest.mark.parametrize("start, goal", [(a, b) for a in MIG_SCENARIOS for b in MIG_SCENARIOS if a != b])
def test_a_node_is_judged_as_a_layout_will_leave_it(nvml_simulator, tmp_path, start, goal, strategy):
    """A node judged before a layout (its facts now, and the plan's after states) is judged as the
    plugin judged the scenario that has that layout already."""
    _ours, before = our_labels(nvml_simulator, tmp_path / "a", start, strategy)
    _ours, after = our_labels(nvml_simulator, tmp_path / "b", goal, strategy)
    plan = [{"index": index, "after": {"mig-enabled": bool(card.get("migEnabled")), "mig-devices": {
        profile: [device["profile"] for device in card.get("migDevices") or []].count(profile)
        for profile in {device["profile"] for device in card.get("migDevices") or []}}}}
        for index, card in enumerate(after["cardList"])]
    _goal, _strategy, served, refused = plugin_fixture(FIXTURES.parent / "device-plugin" / (
        "%s-%s.txt" % (goal, strategy)))
    judged = laid_out(before, plan)
    assert bool(refusal(judged, strategy)) is refused
    if not refused:
        assert {name for name, count in device_plugin_resources(judged, strategy).items() if count} == served
