#!/usr/bin/python
# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_runtime_config
short_description: Set keys of the NVIDIA container runtime's config.toml, keeping every other line
version_added: 2.0.0
description:
  - Sets keys of the NVIDIA container toolkit's configuration file (C(/etc/nvidia-container-runtime/config.toml)),
    which C(nvidia-container-runtime), its hooks and C(nvidia-ctk) read, such as
    C(accept-nvidia-visible-devices-envvar-when-unprivileged) or C(nvidia-container-runtime.mode).
  - The file is edited in place, key by key; every other line and comment stays as it was. A missing file is
    created with the settings alone (the toolkit takes its defaults for the rest).
  - The whole result is read back with a TOML parser and must be the file as it was plus the settings; an edit
    that would change anything else (a key also set as a dotted key or inline table) is refused, the file untouched.
author:
  - scv.gpu contributors (!UNKNOWN)
requirements:
  - Python 3.11 or newer on the managed host (tomllib), or on an older Python the host's python3-tomli package
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - scv.gpu.runtime_config_file
notes:
  - The runtime and its hooks read the file each time a container is created; nothing needs a restart.
options:
  path:
    default: /etc/nvidia-container-runtime/config.toml
  settings:
    description:
      - The keys to set, each named by its table path and key, joined by dots (C(nvidia-container-runtime.mode));
        a top-level key by its name alone.
      - Values are booleans, numbers, strings or lists of strings.
    type: dict
    required: true
seealso:
  - module: scv.gpu.containerd_runtime
  - module: scv.gpu.docker_daemon_config
"""

EXAMPLES = r"""
- name: Give GPUs to unprivileged containers only through device requests, never their environment
  scv.gpu.nvidia_runtime_config:
    settings:
      accept-nvidia-visible-devices-envvar-when-unprivileged: false
      accept-nvidia-visible-devices-as-volume-mounts: true
    backup: true

- name: Inject devices from the CDI specification
  scv.gpu.nvidia_runtime_config:
    settings:
      nvidia-container-runtime.mode: cdi
"""

RETURN = r"""
extends_documentation_fragment:
  - scv.gpu.runtime_config_file
path:
  description: The file edited.
  returned: always
  type: str
  sample: /etc/nvidia-container-runtime/config.toml
settings:
  description: The settings the module ensures.
  returned: success
  type: dict
  sample: {"accept-nvidia-visible-devices-envvar-when-unprivileged": false}
backup_file:
  sample: /etc/nvidia-container-runtime/config.toml.1234.2026-11-28@05:00:00~
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_native

from ansible_collections.scv.gpu.plugins.module_utils.host.files import apply_text, read_text
from ansible_collections.scv.gpu.plugins.module_utils.host.toolkit_config import ToolkitConfigError, apply_settings


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", default="/etc/nvidia-container-runtime/config.toml"),
            settings=dict(type="dict", required=True),
            backup=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    path, settings = module.params["path"], module.params["settings"]
    try:
        previous = read_text(path)
    except (OSError, UnicodeDecodeError) as error:
        module.fail_json(msg="cannot read %s: %s" % (path, to_native(error)), path=path)
    try:
        text = apply_settings(previous, path, settings)
    except ToolkitConfigError as error:
        module.fail_json(msg=str(error), path=path)
    result = dict(changed=text != previous, path=path, settings=settings)
    apply_text(module, path, previous, text, result, module.params["backup"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
