#!/usr/bin/python
# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_cordon
short_description: Cordon a Kubernetes node for maintenance, and uncordon only the nodes it cordoned
version_added: 1.0.0
description:
  - Cordons a node (C(spec.unschedulable=true)) and marks the cordon as its own with the annotation
    C(scv.gpu/cordoned-by=<owner>).
  - Uncordons a node only when that mark names O(owner). A node that someone else cordoned, before or
    during the maintenance, stays cordoned, and the result says so (RV(outcome=foreign)).
  - A node already cordoned by someone else is not marked, so the end of the maintenance leaves it as
    it was found.
  - Each write is a merge patch that carries the node's resourceVersion; a node changed meanwhile is
    read again.
author:
  - scv.gpu contributors (!UNKNOWN)
extends_documentation_fragment:
  - kubernetes.core.k8s_auth_options
  - scv.gpu.k8s
  - scv.gpu.node_name
  - ansible.builtin.action_common_attributes
options:
  state:
    description:
      - V(cordoned) cordons the node and marks the cordon as O(owner)'s.
      - V(uncordoned) lifts O(owner)'s cordon, and no other.
    type: str
    choices: [cordoned, uncordoned]
    required: true
  owner:
    description: Who cordons; the value of the C(scv.gpu/cordoned-by) annotation.
    type: str
    default: scv.gpu
attributes:
  check_mode:
    support: full
    details: The PATCH is a server-side dry run.
  diff_mode:
    support: full
    details: Shows C(unschedulable) and the annotation before and after.
  platform:
    support: full
    platforms: posix
notes:
  - "Run it from the controller (C(delegate_to: localhost))."
  - Draining is not this module's work; M(kubernetes.core.k8s_drain) evicts the pods of a cordoned node.
"""

EXAMPLES = r"""
- name: Cordon the node, remembering that we did
  scv.gpu.node_cordon:
    name: "{{ inventory_hostname }}"
    state: cordoned
    owner: driver-upgrade
  delegate_to: localhost

- name: Lift our cordon (a node that someone else cordoned stays cordoned)
  scv.gpu.node_cordon:
    name: "{{ inventory_hostname }}"
    state: uncordoned
    owner: driver-upgrade
  delegate_to: localhost
  register: uncordon

- name: Say when the node stays cordoned
  ansible.builtin.debug:
    msg: "{{ inventory_hostname }} stays cordoned: someone else cordoned it"
  when: uncordon.outcome == 'foreign'
"""

RETURN = r"""
outcome:
  description:
    - V(cordoned) or V(uncordoned) when this run changed the node (or would, in check mode).
    - V(ours) when the node already carries O(owner)'s cordon.
    - V(foreign) when someone else cordoned the node, or cordoned it again after our cordon was lifted by hand (the
      node's C(managedFields) say who set C(spec.unschedulable) last); it stays cordoned, and a stale mark of ours
      is removed.
    - V(schedulable) when there was no cordon to lift.
  returned: always
  type: str
  sample: foreign
unschedulable:
  description: Whether the node is cordoned now (or would be, in check mode).
  returned: always
  type: bool
  sample: true
cordoned_by:
  description: The field managers that own the node's C(spec.unschedulable) now (C(scv.gpu) for ours, C(kubectl) for
    C(kubectl cordon)); empty when nobody does or the API server does not say.
  returned: always
  type: list
  elements: str
  sample: [kubectl]
msg:
  description: Whose cordon it is, when the node stays cordoned for someone else.
  returned: when RV(outcome) is V(foreign)
  type: str
  sample: "node gpu-7 stays cordoned: its cordon is kubectl's, not ours"
"""

from ansible_collections.scv.gpu.plugins.module_utils.kube.client import NodeClient
from ansible_collections.scv.gpu.plugins.module_utils.kube.errors import ApiError
from ansible_collections.scv.gpu.plugins.module_utils.kube.module import api_module, check_node_name
from ansible_collections.scv.gpu.plugins.module_utils.node.cordon import ANNOTATION, cordon, cordoned_by, uncordon


def _view(node):
    return {"unschedulable": bool((node.get("spec") or {}).get("unschedulable")),
            "annotation": ((node.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION)}


def apply(client, name, state, owner, check_mode):
    """(before, after, outcome, changed)."""
    decide = cordon if state == "cordoned" else uncordon
    before, after, body = client.update(name, lambda node: decide(node, owner)[0], "the cordon", check_mode)
    # the outcome of the node as last read, the one the patch (if any) was made from
    return before, after, decide(before, owner)[1], body is not None


def main():
    module = api_module(dict(
        name=dict(type="str", required=True),
        state=dict(type="str", required=True, choices=["cordoned", "uncordoned"]),
        owner=dict(type="str", default="scv.gpu"),
    ))
    params = module.params
    check_node_name(module)
    if not params["owner"] or len(params["owner"]) > 253:
        module.fail_json(msg="owner: expected a non-empty name of up to 253 characters, got %r" % params["owner"])
    try:
        client = NodeClient.connect(module)
        before, after, outcome, changed = apply(client, params["name"], params["state"], params["owner"],
                                                module.check_mode)
    except ApiError as error:
        module.fail_json(msg=str(error))
    result = dict(changed=changed, outcome=outcome, unschedulable=_view(after)["unschedulable"],
                  cordoned_by=cordoned_by(after) or [])
    if outcome == "foreign":
        result["msg"] = "node %s stays cordoned: its cordon is %s's, not ours" % (
            params["name"], ", ".join(cordoned_by(before) or ["someone else"]))
    if module._diff:
        result["diff"] = {"before": _view(before), "after": _view(after)}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
