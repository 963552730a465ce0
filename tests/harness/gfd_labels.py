"""The labels node_labels would set for a simulator scenario, as the GFD fixture tests compare them with GFD's."""

from __future__ import annotations

import json

from ansible_collections.scv.gpu.plugins.module_utils.common.gpu_info import GATHER_SUBSETS
from ansible_collections.scv.gpu.plugins.module_utils.host.pci import nvidia_gpus
from ansible_collections.scv.gpu.plugins.module_utils.node.labels import desired_labels
from ansible_collections.scv.gpu.plugins.module_utils.nvml.collect import collect

from harness import pci_sysfs
from harness.paths import scenario_path

# Ours alone: gpu.present (the GPU Operator's selector) and the site's own key.
ONLY_OURS = {"nvidia.com/gpu.present", "gpu/nvidia"}


def our_labels(nvml_simulator, tmp_path, scenario, strategy):
    """(the labels, the fact) of ``scenario`` read through the real pynvml and gpu_facts' reader, its PCI bus
    built under ``tmp_path``."""
    nvml_simulator.use(scenario)
    fact = collect(list(GATHER_SUBSETS))
    pci_sysfs.build(json.loads(scenario_path(scenario).read_text()), str(tmp_path))
    fact["pci_gpus"] = nvidia_gpus(str(tmp_path))
    return desired_labels(fact, "gpu/nvidia", strategy), fact
