# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What every module that calls the Kubernetes API does first (private).

kubernetes.core's connection options (its ``k8s_auth_options`` doc fragment, its
``AUTH_ARG_SPEC``) plus ``request_timeout`` (the ``scv.gpu.k8s`` fragment); the
kubernetes library checked before anything else, as ``missing_required_lib`` reports it.
"""

from __future__ import annotations

import copy

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.kubernetes.core.plugins.module_utils.args_common import AUTH_ARG_SPEC
from ansible_collections.kubernetes.core.plugins.module_utils.k8s.core import AnsibleK8SModule

from ansible_collections.scv.gpu.plugins.module_utils.common.names import node_name_problem
from ansible_collections.scv.gpu.plugins.module_utils.kube.client import (
    DEFAULT_REQUEST_TIMEOUT,
    HAS_KUBERNETES,
    KUBERNETES_IMPORT_ERROR,
)


def api_module(options, **module_arguments):
    """The AnsibleModule of an API module whose own options are ``options``; fails at once when the
    kubernetes library is missing or ``request_timeout`` is not a positive number of seconds."""
    argument_spec = copy.deepcopy(AUTH_ARG_SPEC)
    argument_spec.update(request_timeout=dict(type="float", default=DEFAULT_REQUEST_TIMEOUT))
    argument_spec.update(options)
    module = AnsibleK8SModule(module_class=AnsibleModule, argument_spec=argument_spec, supports_check_mode=True,
                              check_k8s=False, **module_arguments)
    if not HAS_KUBERNETES:
        module.fail_json(msg=missing_required_lib("kubernetes"), exception=KUBERNETES_IMPORT_ERROR)
    if module.params["request_timeout"] <= 0:
        module.fail_json(msg="request_timeout: expected seconds > 0, got %s" % module.params["request_timeout"])
    return module


def check_node_name(module):
    """Fails ``module`` before any request when its ``name`` option is not a valid Node name."""
    problem = node_name_problem(module.params["name"])
    if problem:
        module.fail_json(msg="name: %s; nothing was sent to the API server" % problem)
