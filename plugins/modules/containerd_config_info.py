#!/usr/bin/python
# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: containerd_config_info
short_description: Read containerd's configuration file and every file it imports, as containerd finds them
version_added: 2.0.0
description:
  - Reads containerd's main configuration file and the files its C(imports) name, on the host, in the order
    containerd merges them. A relative entry is taken from the main file's folder, a glob is expanded (in
    name order), and an imported file's own C(imports) are followed too, each file once.
  - For a config C(version = 2) file, a relative glob is also expanded from C(/), as containerd 1.6 did.
  - Changes nothing. The M(scv.gpu.dra_driver) role judges CDI on what it returns, with the imports merged
    in as containerd merges them.
  - Fails, naming the file, when the main file or an import cannot be read or is not valid TOML, or when the
    config version is not 2 or 3; RV(content) still holds the main file when it was read.
  - The files are parsed with Python 3.11's C(tomllib), or on an older Python with the host's C(python3-tomli)
    package (Ubuntu 22.04, Debian). On a host with neither, only the top-level C(version) and C(imports) are
    read, which must then be a plain integer and an array of strings; the texts are returned whole for the
    controller to parse, and their TOML is checked there.
author:
  - scv.gpu contributors (!UNKNOWN)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
options:
  path:
    description: containerd's main configuration file.
    type: path
    default: /etc/containerd/config.toml
attributes:
  check_mode:
    support: full
    details: It only reads, so it runs the same in check mode.
  diff_mode:
    support: none
  platform:
    support: full
    platforms: posix
seealso:
  - module: scv.gpu.containerd_runtime
"""

EXAMPLES = r"""
- name: Read containerd's configuration and its imports
  scv.gpu.containerd_config_info:
  register: containerd_config

- name: Show the files containerd merges over its main file
  ansible.builtin.debug:
    msg: "{{ containerd_config.imports | map(attribute='path') | list }}"
"""

RETURN = r"""
path:
  description: The main file.
  returned: always
  type: str
  sample: /etc/containerd/config.toml
content:
  description: The main file's text; none when it cannot be read.
  returned: always
  type: str
  sample: "version = 3\nimports = ['/etc/containerd/conf.d/*.toml']\n"
version:
  description: The config version (2 for containerd 1.x, 3 for containerd 2.x).
  returned: success
  type: int
  sample: 3
imports:
  description: The imported files in the order containerd merges them (each one wins over those before it).
  returned: success
  type: list
  elements: dict
  contains:
    path:
      description: The file.
      type: str
    imported_by:
      description: The file whose C(imports) named it.
      type: str
    content:
      description: Its text.
      type: str
  sample: [{"path": /etc/containerd/conf.d/99-nvidia.toml, "imported_by": /etc/containerd/config.toml,
            "content": "version = 3\n"}]
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_native

from ansible_collections.scv.gpu.plugins.module_utils.host.containerd import (
    TOML_NEEDS,
    ContainerdConfigError,
    config_version,
    import_chain,
    parse,
)
from ansible_collections.scv.gpu.plugins.module_utils.host.containerd import tomllib
from ansible_collections.scv.gpu.plugins.module_utils.host.files import read_text
from ansible_collections.scv.gpu.plugins.module_utils.host.toml_keys import TomlKeysError, top_level_keys


def read_keys(text, path):
    """The config's ``version`` and ``imports``, without a TOML parser (neither tomllib nor tomli on the host);
    whoever reads the texts returned parses them whole."""
    try:
        return top_level_keys(text)
    except TomlKeysError as error:
        raise ContainerdConfigError("%s: %s; without %s, only plain integers and arrays of strings are read "
                                    "there" % (path, error, TOML_NEEDS)) from error


def main():
    module = AnsibleModule(
        argument_spec=dict(path=dict(type="path", default="/etc/containerd/config.toml")),
        supports_check_mode=True,
    )
    path = module.params["path"]
    try:
        content = read_text(path)
    except (OSError, UnicodeDecodeError) as error:
        module.fail_json(msg="%s cannot be read (%s)" % (path, to_native(error)), path=path, content=None)
    if content is None:
        module.fail_json(msg="%s cannot be read (it does not exist)" % path, path=path, content=None)
    try:
        parser = parse if tomllib is not None else read_keys
        config = parser(content, path)
        version = config_version(config, path)
        chain = import_chain(config, version, path, parser=parser)
    except ContainerdConfigError as error:
        module.fail_json(msg=str(error), path=path, content=content)
    module.exit_json(changed=False, path=path, content=content, version=version,
                     imports=[{key: entry[key] for key in ("path", "imported_by", "content")} for entry in chain])


if __name__ == "__main__":
    main()
