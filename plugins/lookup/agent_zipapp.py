# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: agent_zipapp
short_description: Build the Scv agent as a zipapp on the controller
version_added: 1.0.0
description:
  - Builds C(scv-gpu-agent.pyz), the Scv agent that the scv.gpu.scv_agent role runs on each node, from this
    collection's own code, and returns the path of the file on the controller.
  - The archive holds the agent's entry module and every module of the collection it imports, found by
    following its imports; nothing is listed by hand. On the node it needs only Python 3.9 or newer,
    C(nvidia-ml-py) and C(PyYAML).
  - The build is reproducible (the same code gives the same bytes), so a copy task reports a change only when
    the agent's code changed.
  - The file lives in Ansible's local temporary folder, removed when the run ends.
author:
  - scv.gpu contributors (!UNKNOWN)
options: {}
"""

EXAMPLES = r"""
- name: Install the Scv agent's zipapp
  ansible.builtin.copy:
    src: "{{ lookup('scv.gpu.agent_zipapp') }}"
    dest: /opt/scv-gpu/agent/scv-gpu-agent.pyz
    mode: "0644"
"""

RETURN = r"""
_raw:
  description: The path of the zipapp on the controller.
  type: list
  elements: path
"""

import os

from ansible import constants as C
from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from ansible_collections.scv.gpu.plugins.plugin_utils._agent_zipapp import write


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        if terms:
            raise AnsibleLookupError("scv.gpu.agent_zipapp takes no terms, got %r" % (terms,))
        self.set_options(var_options=variables, direct=kwargs)
        destination = os.path.join(C.DEFAULT_LOCAL_TMP, "scv-gpu-agent.pyz")
        try:
            write(destination)
        except (OSError, SyntaxError) as error:
            raise AnsibleLookupError("cannot build the Scv agent's zipapp at %s: %s" % (destination, error)) from error
        return [destination]
