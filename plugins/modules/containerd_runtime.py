#!/usr/bin/python
# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: containerd_runtime
short_description: Add the NVIDIA runtime to containerd's CRI configuration, keeping every other line
version_added: 1.0.0
description:
  - Adds the C(nvidia) runtime (C(runtime_type = "io.containerd.runc.v2"), C(BinaryName) the NVIDIA
    container runtime) to the CRI plugin of containerd's C(config.toml), for config version 2
    (containerd 1.x) and 3 (containerd 2.x).
  - runc's C(SystemdCgroup) option is carried over to the nvidia runtime, so both use the same cgroup driver.
  - Optionally makes C(nvidia) the default runtime (C(default_runtime_name)).
  - The file is edited in place, key by key; every other line and comment stays as it was. A drop-in
    under C(imports) is not used, because containerd 1.x replaces the whole CRI section with an
    imported file's and loses the main file's settings.
  - When the file is missing or empty, it starts from C(containerd config default).
  - The result is checked with a TOML parser before anything is written; a file this module cannot
    edit safely is refused with the reason, untouched.
author:
  - scv.gpu contributors (!UNKNOWN)
requirements:
  - Python 3.11 or newer on the managed host (tomllib), or on an older Python the host's python3-tomli package
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - scv.gpu.runtime_config_file
notes:
  - The runtime reads this file only when it starts; restart it after a change (the scv.gpu.container_toolkit
    role's handler does, only when the file changed).
options:
  path:
    default: /etc/containerd/config.toml
  runtime_path:
    description: The NVIDIA container runtime's executable (C(BinaryName)).
    type: path
    default: /usr/bin/nvidia-container-runtime
  default_runtime:
    description:
      - V(true) sets C(default_runtime_name = "nvidia").
      - V(false) puts it back to C(runc) if it was C(nvidia), and leaves any other default alone.
    type: bool
    default: false
  enable_cdi:
    description:
      - Set C(enable_cdi = true) in the CRI plugin, so that containers can ask for devices through CDI
        (containerd 1.7 and later; 1.6 ignores the key).
      - V(false) leaves the setting as it is.
    type: bool
    default: false
  containerd:
    description: The containerd executable, used for C(config default) when the file is missing or empty.
    type: path
    default: containerd
seealso:
  - module: scv.gpu.docker_daemon_config
"""

EXAMPLES = r"""
- name: Add the nvidia runtime to containerd
  scv.gpu.containerd_runtime:
  register: containerd_config

- name: Restart containerd when its configuration changed
  ansible.builtin.systemd_service:
    name: containerd
    state: restarted
  when: containerd_config is changed

- name: Make nvidia containerd's default runtime
  scv.gpu.containerd_runtime:
    default_runtime: true
    backup: true
"""

RETURN = r"""
extends_documentation_fragment:
  - scv.gpu.runtime_config_file
path:
  description: The file edited.
  returned: always
  type: str
  sample: /etc/containerd/config.toml
version:
  description: The config version (2 for containerd 1.x, 3 for containerd 2.x).
  returned: success
  type: int
  sample: 2
settings:
  description: The settings the module ensures, as table, key and value.
  returned: success
  type: list
  elements: dict
  sample: [{"table": 'plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia', "key": "runtime_type",
            "value": "io.containerd.runc.v2"}]
backup_file:
  sample: /etc/containerd/config.toml.1234.2026-11-22@05:00:00~
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_native

from ansible_collections.scv.gpu.plugins.module_utils.host.containerd import (
    ContainerdConfigError,
    add_runtime,
    parse,
    table_header,
)
from ansible_collections.scv.gpu.plugins.module_utils.host.files import apply_text, read_text


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", default="/etc/containerd/config.toml"),
            runtime_path=dict(type="path", default="/usr/bin/nvidia-container-runtime"),
            default_runtime=dict(type="bool", default=False),
            enable_cdi=dict(type="bool", default=False),
            containerd=dict(type="path", default="containerd"),
            backup=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    path = module.params["path"]
    try:
        previous = read_text(path)
    except (OSError, UnicodeDecodeError) as error:
        module.fail_json(msg="cannot read %s: %s" % (path, to_native(error)), path=path)

    base = previous
    if not (previous or "").strip():
        containerd = module.get_bin_path(module.params["containerd"])
        if containerd is None:
            module.fail_json(msg="%s is missing and containerd (%s) is not installed to write a default one; "
                                 "install containerd first" % (path, module.params["containerd"]), path=path)
        rc, base, err = module.run_command([containerd, "config", "default"])
        if rc != 0:
            module.fail_json(msg="containerd config default failed (%d): %s" % (rc, err), path=path)
        try:
            parse(base, "the output of `%s config default`" % containerd)
        except ContainerdConfigError as error:
            # not the user's file, which is missing or empty: the program that printed it
            module.fail_json(msg="%s is missing or empty, and `%s config default` printed no containerd "
                                 "configuration (%s): is %s containerd? Nothing was written"
                                 % (path, containerd, str(error).split(": ", 1)[-1].split("; fix it")[0],
                                    containerd), path=path)
    try:
        text, settings = add_runtime(base, path, module.params["runtime_path"], module.params["default_runtime"],
                                     module.params["enable_cdi"])
    except ContainerdConfigError as error:
        module.fail_json(msg=str(error), path=path)

    changed = text != previous
    result = dict(changed=changed, path=path, version=parse(text, path)["version"],
                  settings=[dict(table=table_header(table)[1:-1], key=key, value=value)
                            for table, key, value in settings])
    apply_text(module, path, previous, text, result, module.params["backup"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
