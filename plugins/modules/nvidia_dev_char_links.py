#!/usr/bin/python
# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_dev_char_links
short_description: Link /dev/char/<major>:<minor> to the NVIDIA device nodes
version_added: 2.0.0
description:
  - runc, where systemd manages the containers' cgroups, names each device of a container by its
    C(/dev/char/<major>:<minor>) link. The NVIDIA driver's device nodes (C(/dev/nvidia0), C(/dev/nvidiactl),
    C(/dev/nvidia-uvm), C(/dev/nvidia-caps/*), ...) are not made by udev, so they have none, and a
    C(systemctl daemon-reload) takes the GPUs from running containers ("Failed to initialize NVML - Unknown Error").
  - Makes the missing links, and replaces those that no longer reach their node (the driver came back with another
    major number), each as a relative link such as C(../nvidia0), in one rename. Other links in C(/dev/char) are
    left alone.
  - It links the nodes that exist; C(nvidia-ctk system create-dev-char-symlinks --create-all), which the
    C(scv.gpu.container_toolkit) role's udev rule runs whenever the driver binds, also makes the missing nodes.
author:
  - scv.gpu contributors (!UNKNOWN)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
options:
  dev:
    description: Where devtmpfs is mounted; tests point it at a prepared folder.
    type: path
    default: /dev
attributes:
  check_mode:
    support: full
    details: Says which links it would make.
  diff_mode:
    support: full
    details: The links, as C(major:minor -> target) lines, before and after.
  platform:
    support: full
    platforms: posix
"""

EXAMPLES = r"""
- name: Link /dev/char to the NVIDIA device nodes
  scv.gpu.nvidia_dev_char_links:
  register: dev_char

- name: Say what was linked
  ansible.builtin.debug:
    msg: "{{ dev_char.message }}"
"""

RETURN = r"""
links:
  description:
    - One entry per NVIDIA device node - C(link), C(target) (relative to C(/dev/char)), C(device), and C(state) as
      found, C(ok), C(missing) or C(wrong) (dangling, or it reaches another node).
  returned: always
  type: list
  elements: dict
  sample: [{"link": "/dev/char/195:0", "target": "../nvidia0", "device": "/dev/nvidia0", "state": "missing"}]
message:
  description: What the links needed.
  returned: always
  type: str
  sample: "195:0 missing for /dev/nvidia0"
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.scv.gpu.plugins.module_utils.host.dev_char import (
    DevCharError,
    describe,
    link_states,
    make_links,
    summary,
)


def main():
    module = AnsibleModule(argument_spec=dict(dev=dict(type="path", default="/dev")), supports_check_mode=True)
    dev = module.params["dev"]
    states = link_states(dev)
    changed = any(entry["state"] != "ok" for entry in states)
    result = dict(changed=changed, links=states, message=summary(states, dev))
    if module._diff:
        before, after = describe(states)
        result["diff"] = dict(before=before, after=after, before_header="%s/char" % dev, after_header="%s/char" % dev)
    if changed and not module.check_mode:
        try:
            make_links(states)
        except DevCharError as error:
            module.fail_json(msg=str(error), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
