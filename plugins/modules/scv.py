#!/usr/bin/python
# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: scv
short_description: Publish a node's GPU facts as an Scv custom resource
version_added: 1.0.0
description:
  - Creates, updates or deletes the C(Scv) object (C(core.run-linux.com/v1), cluster-scoped) that
    describes one Kubernetes node's NVIDIA GPUs, in the form SCV defined and schedulers such as
    Yoda-Scheduler read.
  - The object is named after the node. It is created with C(spec.updateInterval) when missing;
    an existing spec is never overwritten unless O(force_spec=true).
  - The status is written through the status subresource, and only when the GPU data differ
    from what the object holds (SCV's rule compares the card list, C(cardNumber),
    C(totalMemorySum) and C(freeMemorySum)). C(updateTime) is set on every write. A rerun with
    unchanged GPUs makes no write and reports no change.
  - The module gathers nothing itself. Pass the C(nvidia_gpu) fact that M(scv.gpu.gpu_facts)
    returned for the node, so the module can run from the controller against the API server.
  - Each card is published with SCV's fields (C(id), C(model), C(totalMemory), C(freeMemory),
    C(clock), C(core), C(power), C(bandwidth), C(health)), plus C(healthReasons), C(uuid),
    C(pciBusId), C(computeCapability) and C(family). Telemetry is left out because it changes
    every second. The status also carries C(healthyCardNumber). Zero values are omitted, as
    SCV's Go types omit them.
author:
  - scv.gpu contributors (!UNKNOWN)
requirements:
  - the C(scvs.core.run-linux.com) custom resource definition in the cluster (the scv.gpu.scv_publish role installs it)
extends_documentation_fragment:
  - kubernetes.core.k8s_auth_options
  - scv.gpu.k8s
  - ansible.builtin.action_common_attributes
options:
  name:
    description: The Kubernetes node's name, which is the Scv object's name.
    type: str
    required: true
  gpu_facts:
    description:
      - The node's C(nvidia_gpu) fact from M(scv.gpu.gpu_facts), for example
        C("{{ hostvars[item].ansible_facts.nvidia_gpu }}").
      - Required when O(state=present).
    type: dict
  update_interval:
    description:
      - C(spec.updateInterval) for a new object, in milliseconds (how often an agent re-reads the GPUs).
      - An existing object's value is kept unless O(force_spec=true).
    type: int
    default: 1000
  force_spec:
    description: Overwrite an existing object's C(spec.updateInterval) when it differs from O(update_interval).
    type: bool
    default: false
  state:
    description: V(present) publishes the facts; V(absent) deletes the object.
    type: str
    choices: [present, absent]
    default: present
attributes:
  check_mode:
    support: full
    details:
      - Uses a server-side dry run, so the API server validates (and admission checks) every write.
      - When the object does not exist yet, only its creation can be dry-run; the status that
        would follow is reported but not validated.
  diff_mode:
    support: full
    details: Shows the object's spec and status before and after.
  platform:
    support: full
    platforms: posix
notes:
  - "Run it once per node, from the controller or wherever the API is reachable (C(delegate_to: localhost))."
  - A node identity (C(system:node:<name>)) may write only its own Scv when the scv.gpu.scv_publish role's
    admission policy is installed.
  - Conflicts (HTTP 409) from concurrent writers are retried up to five times.
seealso:
  - module: scv.gpu.gpu_facts
  - module: kubernetes.core.k8s
"""

EXAMPLES = r"""
- name: Read the GPUs on every GPU node
  scv.gpu.gpu_facts:

- name: Publish each node's Scv from the controller
  scv.gpu.scv:
    name: "{{ scv_gpu_node_name | default(inventory_hostname) }}"
    gpu_facts: "{{ ansible_facts.nvidia_gpu }}"
    kubeconfig: ~/.kube/config
  delegate_to: localhost

- name: Publish with a 5 s interval, replacing an interval someone else set
  scv.gpu.scv:
    name: gpu-node-1
    gpu_facts: "{{ hostvars['gpu-node-1'].ansible_facts.nvidia_gpu }}"
    update_interval: 5000
    force_spec: true
  delegate_to: localhost

- name: Remove a decommissioned node's Scv
  scv.gpu.scv:
    name: gpu-node-9
    state: absent
  delegate_to: localhost
"""

RETURN = r"""
scv:
  description: The Scv object as the API server returned it after the last write (or as read, when nothing was written).
  returned: when O(state=present)
  type: dict
  sample:
    apiVersion: core.run-linux.com/v1
    kind: Scv
    metadata:
      name: gpu02-poweredge-t420
      resourceVersion: "22929326"
    spec:
      updateInterval: 1000
    status:
      cardList:
        - id: 0
          model: TITAN Xp
          totalMemory: 12194
          freeMemory: 11950
          clock: 5705
          core: 1911
          power: 250
          bandwidth: 15760
          health: Healthy
          uuid: GPU-8d3c1f0a-6b2e-4a1d-9c7e-2f4b6a8d0c1e
          pciBusId: "00000000:01:00.0"
          computeCapability: "6.1"
          family: pascal
      cardNumber: 1
      healthyCardNumber: 1
      totalMemorySum: 12194
      freeMemorySum: 11950
      updateTime: "2026-11-22T04:00:00Z"
created:
  description: Whether the object was created (or would be, in check mode).
  returned: when O(state=present)
  type: bool
  sample: false
spec_updated:
  description: Whether C(spec.updateInterval) was overwritten because of O(force_spec).
  returned: when O(state=present)
  type: bool
  sample: false
status_updated:
  description: Whether the status was written because the GPU data differed.
  returned: when O(state=present)
  type: bool
  sample: true
"""

from ansible_collections.scv.gpu.plugins.module_utils.kube.client import ResourceClient
from ansible_collections.scv.gpu.plugins.module_utils.kube.errors import ApiError
from ansible_collections.scv.gpu.plugins.module_utils.kube.module import api_module, check_node_name
from ansible_collections.scv.gpu.plugins.module_utils.scv.publisher import publish, remove
from ansible_collections.scv.gpu.plugins.module_utils.scv.resource import DEFAULT_UPDATE_INTERVAL_MS, SCV
from ansible_collections.scv.gpu.plugins.module_utils.scv.status import facts_problems


def main():
    module = api_module(dict(
        name=dict(type="str", required=True),
        gpu_facts=dict(type="dict"),
        update_interval=dict(type="int", default=DEFAULT_UPDATE_INTERVAL_MS),
        force_spec=dict(type="bool", default=False),
        state=dict(type="str", choices=["present", "absent"], default="present"),
    ), required_if=[("state", "present", ("gpu_facts",))])
    params = module.params
    check_node_name(module)
    if params["update_interval"] < 1:
        module.fail_json(msg="update_interval: expected milliseconds >= 1, got %d" % params["update_interval"])
    if params["state"] == "present":
        problems = facts_problems(params["gpu_facts"])
        if problems:
            module.fail_json(msg="gpu_facts for node %s is not usable: %s" % (params["name"], "; ".join(problems)))

    try:
        client = ResourceClient.connect(module, SCV)
        if params["state"] == "present":
            result = publish(client, params["name"], params["gpu_facts"], params["update_interval"],
                             params["force_spec"], module.check_mode)
        else:
            result = remove(client, params["name"], module.check_mode)
    except ApiError as error:
        module.fail_json(msg=str(error))

    for warning in result.pop("warnings", []):
        module.warn(warning)
    before, after = result.pop("before"), result.pop("after")
    if module._diff:
        result["diff"] = {"before": before, "after": after}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
