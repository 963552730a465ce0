#!/usr/bin/python
# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_gpu_drain
short_description: Evict the pods that hold GPUs from a Kubernetes node, and only those
version_added: 2.0.0
description:
  - Evicts the pods bound to a node that hold GPUs, and waits until they are gone. The node's other pods keep
    running, since a change of the node's GPU stack or driver need not stop its CPU-only work.
  - A pod holds a GPU when one of its containers or init containers requests, or is limited to, a resource that
    matches O(resources), or when a ResourceClaim it uses (named in C(spec.resourceClaims), or made for it from a
    template, C(status.resourceClaimStatuses)) was allocated devices by a driver in O(drivers).
  - DaemonSet pods, mirror (static) pods and finished pods (C(Succeeded), C(Failed)) are left alone, as
    C(kubectl drain) leaves them.
  - Evictions go through the Eviction API (C(policy/v1)), so PodDisruptionBudgets are honoured. An eviction a
    budget refuses (HTTP 429) is asked again every 2 seconds until O(timeout); then the task fails, naming the pod
    and the budget.
  - Like C(kubectl drain), it refuses a GPU pod that has no controller (nothing would start it again) unless
    O(force) is set, and one with emptyDir volumes unless O(delete_emptydir_data) is set. When one is refused,
    none is evicted.
  - An evicted pod is gone when the API server has no pod of that name, or has one with another UID (its
    controller replaced it). One still there at O(timeout) makes the task fail, naming it.
  - It does not cordon the node; cordon it first (M(scv.gpu.node_cordon)), or the scheduler may place GPU pods
    on it again.
author:
  - scv.gpu contributors (!UNKNOWN)
extends_documentation_fragment:
  - kubernetes.core.k8s_auth_options
  - scv.gpu.k8s
  - scv.gpu.node_name
  - ansible.builtin.action_common_attributes
options:
  resources:
    description:
      - The extended resources that make a pod a GPU pod; shell-style patterns (V(nvidia.com/mig-*)).
    type: list
    elements: str
    default: [nvidia.com/gpu, nvidia.com/gpu.shared, nvidia.com/mig-*]
  drivers:
    description:
      - The DRA drivers whose allocated devices make a pod a GPU pod. Empty to look at no ResourceClaim.
      - Reading claims needs C(resource.k8s.io/v1) (Kubernetes 1.34 or newer) where a pod uses one.
    type: list
    elements: str
    default: [gpu.nvidia.com]
  force:
    description: Evict GPU pods that no controller owns too. Nothing starts them again.
    type: bool
    default: false
  delete_emptydir_data:
    description: Evict GPU pods with emptyDir volumes too; their data is lost.
    type: bool
    default: false
  timeout:
    description: Seconds to evict the GPU pods and see them gone, retries of refused evictions included.
    type: int
    default: 600
attributes:
  check_mode:
    support: full
    details: Each eviction is a server-side dry run; pods a budget would refuse now are named in a warning.
  diff_mode:
    support: none
  platform:
    support: full
    platforms: posix
notes:
  - "Run it from the controller (C(delegate_to: localhost))."
  - It needs to list pods in all namespaces, create C(pods/eviction), and read C(resourceclaims) and
    C(poddisruptionbudgets).
seealso:
  - module: scv.gpu.node_cordon
  - module: kubernetes.core.k8s_drain
    description: Drains every pod of a node.
"""

EXAMPLES = r"""
- name: Cordon the node before its GPU driver changes
  scv.gpu.node_cordon:
    name: "{{ inventory_hostname }}"
    state: cordoned
    owner: gpu-maintenance
  delegate_to: localhost

- name: Evict the pods that hold its GPUs; CPU-only pods keep running
  scv.gpu.node_gpu_drain:
    name: "{{ inventory_hostname }}"
    timeout: 900
  delegate_to: localhost
  register: gpu_drain

- name: Name what was evicted
  ansible.builtin.debug:
    msg: "Evicted from {{ inventory_hostname }}: {{ gpu_drain.evicted | join(', ') or 'nothing' }}"

- name: Evict the pods with MIG devices only, bare pods included
  scv.gpu.node_gpu_drain:
    name: gpu-node-7
    resources: [nvidia.com/mig-*]
    drivers: []
    force: true
  delegate_to: localhost
"""

RETURN = r"""
evicted:
  description: The pods evicted (in check mode, those that would be), as C(namespace/name).
  returned: always
  type: list
  elements: str
  sample: [ml/trainer-7d9c-x2x4k]
holdings:
  description: What GPUs each evicted pod held, by C(namespace/name).
  returned: always
  type: dict
  sample: {ml/trainer-7d9c-x2x4k: [requests nvidia.com/gpu, claim trainer-gpu allocated by gpu.nvidia.com]}
kept:
  description: The node's other pods, left running, as C(namespace/name).
  returned: always
  type: list
  elements: str
  sample: [kube-system/node-exporter-8x2kq, web/frontend-5f6d-abcde]
"""

from ansible_collections.scv.gpu.plugins.module_utils.kube.errors import ApiError
from ansible_collections.scv.gpu.plugins.module_utils.kube.module import api_module, check_node_name
from ansible_collections.scv.gpu.plugins.module_utils.kube.pods import PodClient
from ansible_collections.scv.gpu.plugins.module_utils.node.gpu_drain import DrainFailed, Plan, dry_run, evict_all
from ansible_collections.scv.gpu.plugins.module_utils.node.gpu_pods import DEFAULT_DRIVERS, DEFAULT_RESOURCES


def main():
    module = api_module(dict(
        name=dict(type="str", required=True),
        resources=dict(type="list", elements="str", default=list(DEFAULT_RESOURCES)),
        drivers=dict(type="list", elements="str", default=list(DEFAULT_DRIVERS)),
        force=dict(type="bool", default=False),
        delete_emptydir_data=dict(type="bool", default=False),
        timeout=dict(type="int", default=600),
    ))
    params = module.params
    check_node_name(module)
    if params["timeout"] < 1:
        module.fail_json(msg="timeout: expected seconds >= 1, got %s; nothing was evicted" % params["timeout"])
    if not all(params["resources"]) or not all(params["drivers"]):
        module.fail_json(msg="resources, drivers: an empty entry matches nothing; remove it. Nothing was evicted")
    result = dict(changed=False, evicted=[], holdings={}, kept=[])
    try:
        client = PodClient.connect(module)
        plan = Plan(client, params["name"], params["resources"], params["drivers"], params["force"],
                    params["delete_emptydir_data"])
        result.update(holdings=plan.holdings(), kept=plan.left)
        if module.check_mode:
            for key, reason in dry_run(client, plan).items():
                module.warn("%s would not be evicted now: %s" % (key, reason))
            result["evicted"] = plan.keys
        else:
            result["evicted"] = evict_all(client, plan, params["timeout"])
    except DrainFailed as failure:
        result.update(evicted=failure.evicted, changed=bool(failure.evicted))
        module.fail_json(msg=str(failure), **result)
    except ApiError as error:
        module.fail_json(msg=str(error), **result)
    result["changed"] = bool(result["evicted"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
