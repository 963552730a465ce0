#!/usr/bin/python
# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_labels
short_description: Label a Kubernetes node with its GPUs, as GPU feature discovery does
version_added: 1.0.0
description:
  - Sets the labels NVIDIA's GPU feature discovery (GFD) writes, which manifests and schedulers select on,
    from the C(nvidia_gpu) fact of M(scv.gpu.gpu_facts) - C(nvidia.com/gpu.product) (the GPU name with
    characters outside C([A-Za-z0-9-_. ]) removed and spaces turned into C(-)), C(gpu.count),
    C(gpu.memory) (MiB), C(gpu.family), C(gpu.compute.major) and C(minor), C(gpu.mode) (C(compute),
    C(graphics) or C(unknown), from the GPUs' PCI class), C(cuda.driver-version.major), C(minor),
    C(revision) and C(full), C(cuda.runtime-version.major), C(minor) and C(full), the older
    C(cuda.driver.major), C(minor), C(rev) and C(cuda.runtime.major), C(minor), C(mig.capable),
    C(vgpu.present), C(gpu.clique) (C(<cluster UUID>.<clique ID>) of the NVLink fabric the GPUs are attached
    to, on multi-node NVLink systems; it needs the facts' C(fabric) subset), and the MIG labels of
    O(mig_strategy) - plus C(nvidia.com/gpu.present=true) and O(gpu_label_key) set to the product.
  - How the node's device plugin shares its GPUs, from the config O(plugin_config) names - C(gpu.replicas),
    C(gpu.sharing-strategy) (C(none), C(time-slicing) or C(mps)), C(mps.capable), C(-SHARED) after the product of
    a shared resource that is not renamed, and their C(mig-<profile>.*) twins under the C(mixed) strategy. With
    no config, GFD's defaults - one replica, no sharing, no MPS.
  - C(gpu.machine), the DMI machine type, is not set.
  - These labels are the module's own. One that no longer applies (a card removed, the driver
    unreadable, another MIG layout) is removed. Every other label of the node is left as it is.
  - A node whose driver sees no GPU keeps only C(nvidia.com/vgpu.present), as GFD writes it.
  - A node whose NVML cannot be read (no driver yet, or a broken one) but whose PCI bus has NVIDIA GPUs
    (the fact's C(pci_gpus)) keeps only C(nvidia.com/gpu.present=true) and O(gpu_label_key), set to
    the model NVML will report for that device ID (C(pci-10de-<device>) where the collection's table
    does not know it). A driver-installer DaemonSet that selects on either then reaches the node
    before any driver runs. GFD labels nothing there.
  - A node where some GPUs answer and one is lost is labelled from the GPUs that answer; GFD labels
    nothing.
  - A label whose value no Node may carry - over 63 characters, as a long GPU name with a MIG profile
    after it can be - is left out with a warning, and named in RV(left_out); the node gets its other
    labels. GFD writes such a value as it is, and nfd-master leaves that one label out in the same way.
  - With several GPU models in one node, the GPU labels describe the first GPU's model and count only
    the GPUs of that model. GFD describes one of the models, chosen at random on each run; this is
    always one of its answers, and always the same one.
  - One GET per run, and one merge PATCH only when a label differs; the PATCH carries the
    node's resourceVersion, so a concurrent change is retried rather than overwritten.
extends_documentation_fragment:
  - kubernetes.core.k8s_auth_options
  - scv.gpu.k8s
  - scv.gpu.node_name
  - ansible.builtin.action_common_attributes
author:
  - scv.gpu contributors (!UNKNOWN)
options:
  gpu_facts:
    description: The C(nvidia_gpu) fact that M(scv.gpu.gpu_facts) returned for the node.
    type: dict
    required: true
  gpu_label_key:
    description:
      - The site's own label key for GPU nodes, set to the sanitised model (some community GPU-node guides
        label nodes C(gpu/nividia=<model>) by hand). The scv.gpu DaemonSets select on it.
    type: str
    default: gpu/nvidia
  mig_strategy:
    description:
      - The MIG strategy of the node's device plugin, which decides the labels of MIG-enabled GPUs, as GPU
        feature discovery's C(--mig-strategy) does.
      - C(none) labels whole GPUs only. C(single) labels the node's MIG devices as its GPUs - C(gpu.product)
        C(<model>-MIG-<profile>), C(gpu.count) the MIG devices, C(gpu.memory) and the profile's
        C(gpu.multiprocessors), C(gpu.slices.gi), C(gpu.slices.ci) and C(gpu.engines.*) - or, when they are not
        all of one profile (or some GPU has MIG off, or no MIG device), C(<model>-MIG-INVALID) with count and
        memory 0. C(mixed) adds C(nvidia.com/mig-<profile>.count), C(product), C(memory), C(multiprocessors),
        C(slices.gi), C(slices.ci) and C(engines.*) for each profile. Both set C(nvidia.com/mig.strategy).
    type: str
    choices: [none, single, mixed]
    default: none
  plugin_configs:
    description:
      - The device plugin's named configs, in NVIDIA's config format (C(version), C(flags), C(sharing)), as the
        scv.gpu.device_plugin role deploys them. Empty - the plugin runs without a config.
    type: dict
    default: {}
  plugin_config:
    description:
      - The name of the config in O(plugin_configs) the node's device plugin uses (its
        C(nvidia.com/device-plugin.config) label, or the default config). Required when O(plugin_configs) is set.
      - A config that asks for MPS on a node with a MIG-enabled GPU fails the module before anything is sent,
        as NVIDIA's plugin and GFD refuse it.
    type: str
attributes:
  check_mode:
    support: full
    details: The PATCH is a server-side dry run, so the API server validates it.
  diff_mode:
    support: full
    details: Shows the node's labels before and after.
  platform:
    support: full
    platforms: posix
notes:
  - "Run it from the controller (C(delegate_to: localhost)), once per node."
"""

EXAMPLES = r"""
- name: Read the GPUs
  scv.gpu.gpu_facts:

- name: Label the node
  scv.gpu.node_labels:
    name: "{{ inventory_hostname }}"
    gpu_facts: "{{ ansible_facts.nvidia_gpu }}"
    kubeconfig: ~/.kube/config
  delegate_to: localhost
  register: labels

- name: Select H100 nodes in a pod spec with these labels
  ansible.builtin.debug:
    msg: "nodeAffinity on nvidia.com/gpu.product In [{{ labels.labels['nvidia.com/gpu.product'] }}]"
"""

RETURN = r"""
labels:
  description: The labels of this module that the node carries now (or would, in check mode).
  returned: always
  type: dict
  sample: {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "gpu/nvidia": "NVIDIA-H100-80GB-HBM3"}
changes:
  description: The labels set (with their value) and removed (null) by this run.
  returned: always
  type: dict
  sample: {"nvidia.com/gpu.count": "8", "nvidia.com/mig.capable": null}
left_out:
  description: Labels that were due but that no Node may carry, each with the reason; the others are set.
  returned: always
  type: dict
  sample: {"nvidia.com/mig-1g.24gb.product": "the value 'NVIDIA-RTX-PRO-6000-Blackwell-Max-Q-Workstation-Edition-MIG-1g.24gb'
    is 67 characters long, over the 63 a label value may have"}
"""

from ansible_collections.scv.gpu.plugins.module_utils.kube.client import NodeClient
from ansible_collections.scv.gpu.plugins.module_utils.kube.errors import ApiError
from ansible_collections.scv.gpu.plugins.module_utils.kube.module import api_module, check_node_name
from ansible_collections.scv.gpu.plugins.module_utils.node.labels import (
    MIG_STRATEGIES,
    config_sharing,
    desired_labels,
    label_changes,
    mps_refusal,
    valid_label_key,
)


def apply(client, name, desired, key, check_mode):
    """(labels before, labels after, the changes) once our labels are set."""

    def decide(node):
        changes = label_changes(node["metadata"].get("labels") or {}, desired, key)
        return {"metadata": {"labels": changes}} if changes else None

    before, after, body = client.update(name, decide, "the labels", check_mode)
    return (before["metadata"].get("labels") or {}, after["metadata"].get("labels") or {},
            body["metadata"]["labels"] if body else {})


def chosen_config(module, params):
    """The node's device plugin config, or None; fails the module where NVIDIA's tools would refuse it."""
    configs, name = params["plugin_configs"], params["plugin_config"]
    if not configs:
        return None
    if name not in configs:
        module.fail_json(msg="plugin_config %r names no config of plugin_configs (%s); choose one of them for node %s. "
                             "Nothing was sent to the API server" % (name, ", ".join(sorted(configs)), params["name"]))
    config = configs[name]
    if not isinstance(config, dict):
        module.fail_json(msg="plugin_configs[%r] is not a mapping: write it in NVIDIA's config format (version, "
                             "flags, sharing). Nothing was sent to the API server" % name)
    refusal = mps_refusal(params["gpu_facts"]) if config_sharing(config)[0] == "mps" else None
    if refusal:
        module.fail_json(msg="node %s: config %r shares its GPUs with MPS, but %s. Choose a time-slicing config "
                             "for this node, or turn MIG off. Nothing was sent to the API server"
                             % (params["name"], name, refusal))
    return config


def main():
    module = api_module(dict(
        name=dict(type="str", required=True),
        gpu_facts=dict(type="dict", required=True),
        gpu_label_key=dict(type="str", default="gpu/nvidia", no_log=False),
        mig_strategy=dict(type="str", default="none", choices=list(MIG_STRATEGIES)),
        plugin_configs=dict(type="dict", default={}),
        plugin_config=dict(type="str"),
    ))
    params = module.params
    check_node_name(module)
    if not valid_label_key(params["gpu_label_key"]):
        module.fail_json(msg="gpu_label_key %r is not a valid Kubernetes label key (an optional DNS prefix and "
                             "'/', then up to 63 letters, digits, '-', '_' or '.')" % params["gpu_label_key"])
    config = chosen_config(module, params)
    refused = {}
    ours = desired_labels(params["gpu_facts"], params["gpu_label_key"], params["mig_strategy"], refused, config)
    for key, problem in sorted(refused.items()):
        # the API server would refuse the whole patch for one such label: it alone is left out
        module.warn("the label %s is left out, the node keeps the others: %s" % (key, problem))
    try:
        client = NodeClient.connect(module)
        before, after, changes = apply(client, params["name"], ours, params["gpu_label_key"], module.check_mode)
    except ApiError as error:
        module.fail_json(msg=str(error))
    result = dict(changed=bool(changes), changes=changes, left_out=refused,
                  labels={key: value for key, value in after.items() if key in ours})
    if module._diff:
        result["diff"] = {"before": {"labels": before}, "after": {"labels": after}}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
