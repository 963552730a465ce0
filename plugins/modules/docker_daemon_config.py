#!/usr/bin/python
# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: docker_daemon_config
short_description: Merge the NVIDIA runtime and other settings into Docker's daemon.json without losing any
version_added: 1.0.0
description:
  - Merges C(runtimes.nvidia) (the NVIDIA container runtime), optionally C(default-runtime=nvidia), and
    any other settings into Docker's C(daemon.json).
  - Every key the module does not set is kept as it was, including nested objects such as C(features),
    other runtimes, and keys this module has never heard of.
  - A missing or empty file counts as C({}). A file that is not valid JSON, whose top level is not an
    object, that gives a key twice in one object, that holds a number JSON cannot (C(NaN), C(Infinity),
    C(1e400), an integer beyond a 64-bit float), or that nests more than 500 levels deep, is refused with
    the file and position named, and left untouched.
  - The file is read as dockerd reads it, which the collection's tests check against dockerd itself - a
    leading byte order mark and white space around the document are skipped, and a top-level C(null)
    counts as C({}). dockerd also starts with a key given twice in one object, using one of the values;
    the module refuses that, because rewriting the file would mean choosing a value for you.
  - Values compare as JSON does, not as Python does, so an existing C(1) is not the C(true) a setting
    asks for, and C(1.0) is not C(1).
  - When O(path) is a symbolic link, the file it points at is merged into and written (atomically,
    keeping the link); the link itself stays as it is.
  - Before writing, the module reads the dockerd command line from the systemd unit and its
    drop-ins (expanding variables such as C($DOCKER_OPTS) from C(EnvironmentFile)). A setting that
    would end up both in daemon.json and as a dockerd flag stops Docker from starting, so the module
    fails and names both instead. C(runtimes) is the exception, because dockerd merges C(--add-runtime)
    flags with the file's runtimes; there only a runtime defined in both places is refused.
  - Before it writes, the module has Docker check the new file with C(dockerd --validate --config-file),
    in check mode too (see O(validate)). Docker refuses to start with a file it does not accept, for
    example a key it does not know or a value of the wrong type; the module then fails with dockerd's
    reason and writes nothing, and says whether the file was refused already before the merge.
  - Settings that contradict the other options (a C(default-runtime) other than C(nvidia) with
    O(default_runtime=true), a C(runtimes.nvidia) path other than O(runtime_path)) are refused.
author:
  - scv.gpu contributors (!UNKNOWN)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - scv.gpu.runtime_config_file
  - ansible.builtin.files
options:
  path:
    default: /etc/docker/daemon.json
  runtime_path:
    description: The NVIDIA container runtime's executable, written to C(runtimes.nvidia.path).
    type: path
    default: /usr/bin/nvidia-container-runtime
  runtime_args:
    description: C(runtimes.nvidia.runtimeArgs).
    type: list
    elements: str
    default: []
  default_runtime:
    description:
      - V(true) makes C(nvidia) Docker's default runtime, which SCV and the Volcano vGPU device plugin need.
      - V(false) removes C(default-runtime) if it names C(nvidia), and leaves any other default alone.
    type: bool
    default: true
  settings:
    description:
      - More daemon.json settings to merge, for example C(exec-opts), C(log-driver), C(log-opts),
        C(storage-driver), C(registry-mirrors), C(insecure-registries).
      - Objects merge key by key with what the file holds; lists and scalars replace it.
    type: dict
    default: {}
  check_unit_flags:
    description: Refuse to write a setting that dockerd also gets as a command-line flag from its systemd unit.
    type: bool
    default: true
  validate:
    description:
      - Whether the merged file is checked with C(dockerd --validate --config-file) before it is written.
      - V(auto) checks when O(dockerd) is found and has C(--validate) (Docker 23 and later), and otherwise
        says why not in RV(validation).
      - V(always) fails when the file cannot be checked; V(never) does not check.
      - Only a change is checked; an unchanged file is left as it is.
    type: str
    choices: [auto, always, never]
    default: auto
  dockerd:
    description: The dockerd that checks the file; a bare name is looked for in C(PATH), C(/usr/bin), C(/usr/sbin)
      and C(/usr/local/bin).
    type: str
    default: dockerd
  unit:
    description: The systemd unit that runs dockerd.
    type: str
    default: docker.service
  unit_search_paths:
    description: Where to look for the unit and its C(.d) drop-ins, in systemd's order of precedence.
    type: list
    elements: path
    default: [/etc/systemd/system, /run/systemd/system, /usr/local/lib/systemd/system, /usr/lib/systemd/system, /lib/systemd/system]
notes:
  - The runtime reads this file only when it starts; restart it after a change (the scv.gpu.container_toolkit
    role's handler does, only when the file changed).
  - The file keeps its indentation and key order; new keys are appended.
seealso:
  - name: Docker daemon configuration file
    description: The keys daemon.json accepts.
    link: https://docs.docker.com/reference/cli/dockerd/#daemon-configuration-file
"""

EXAMPLES = r"""
- name: Make nvidia Docker's default runtime, keeping every other setting
  scv.gpu.docker_daemon_config:
  register: daemon_json

- name: Restart Docker when daemon.json changed
  ansible.builtin.systemd_service:
    name: docker
    state: restarted
  when: daemon_json is changed

- name: SCV's deployment guide's daemon.json settings, merged
  scv.gpu.docker_daemon_config:
    backup: true
    settings:
      exec-opts: ["native.cgroupdriver=systemd"]
      log-driver: json-file
      log-opts:
        max-size: 100m
      storage-driver: overlay2
      registry-mirrors: ["https://mirror.example.com"]
      insecure-registries: ["registry.example.com:5000"]

- name: Add the nvidia runtime without making it the default
  scv.gpu.docker_daemon_config:
    default_runtime: false
"""

RETURN = r"""
extends_documentation_fragment:
  - scv.gpu.runtime_config_file
path:
  description: The file merged into, as given.
  returned: always
  type: str
  sample: /etc/docker/daemon.json
written_path:
  description: The file read and written; the target of O(path) when that is a symbolic link.
  returned: always
  type: str
  sample: /srv/config/docker/daemon.json
config:
  description: The daemon.json document after the merge (what the file holds, or would hold in check mode).
  returned: always
  type: dict
  sample: {"default-runtime": "nvidia", "runtimes": {"nvidia": {"path": "/usr/bin/nvidia-container-runtime", "runtimeArgs": []}}}
validation:
  description: Whether dockerd checked the new file, and with what result or why not.
  returned: always
  type: str
  sample: accepted by dockerd --validate
backup_file:
  sample: /etc/docker/daemon.json.12345.2026-11-22@04:00:00~
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_native

from ansible_collections.scv.gpu.plugins.module_utils.host.daemon_json import DaemonJsonError
from ansible_collections.scv.gpu.plugins.module_utils.host.docker_daemon import merged_daemon_json
from ansible_collections.scv.gpu.plugins.module_utils.host.files import apply_text
from ansible_collections.scv.gpu.plugins.module_utils.host.systemd import UNIT_DIRS


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", default="/etc/docker/daemon.json"),
            runtime_path=dict(type="path", default="/usr/bin/nvidia-container-runtime"),
            runtime_args=dict(type="list", elements="str", default=[]),
            default_runtime=dict(type="bool", default=True),
            settings=dict(type="dict", default={}),
            backup=dict(type="bool", default=False),
            check_unit_flags=dict(type="bool", default=True),
            validate=dict(type="str", default="auto", choices=["auto", "always", "never"]),
            dockerd=dict(type="str", default="dockerd"),
            unit=dict(type="str", default="docker.service"),
            unit_search_paths=dict(type="list", elements="path", default=list(UNIT_DIRS)),
        ),
        add_file_common_args=True,
        supports_check_mode=True,
    )
    path = module.params["path"]
    try:
        update = merged_daemon_json(module)
    except DaemonJsonError as error:
        module.fail_json(msg=str(error), path=path)
    except OSError as error:
        module.fail_json(msg="cannot read or check %s: %s" % (path, to_native(error)), path=path)
    target = update["target"]
    result = dict(changed=update["changed"], path=path, written_path=target, config=update["config"],
                  validation=update["validation"])
    apply_text(module, target, update["previous"], update["text"], result, module.params["backup"])
    file_args = module.load_file_common_arguments(module.params, path=target)
    if not module.check_mode or os.path.exists(target):
        result["changed"] = module.set_fs_attributes_if_different(file_args, result["changed"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
