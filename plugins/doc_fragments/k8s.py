# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations


class ModuleDocFragment:
    """What the collection's Kubernetes API modules share beside kubernetes.core's connection options:
    the request timeout, and their membership of the scv.gpu.k8s action group."""

    DOCUMENTATION = r"""
requirements:
  - kubernetes (Python) >= 24.2.0
options:
  request_timeout:
    description:
      - Seconds to wait for the API server's answer to each request, discovery included.
      - A server that accepts the connection and never answers makes the task fail after this long
        with a message that says so; a request that timed out is not sent again.
    type: float
    default: 30
attributes:
  action_group:
    description: Use C(group/scv.gpu.k8s) in C(module_defaults) to set defaults for this module.
    support: full
    membership:
      - scv.gpu.k8s
"""
