# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations


class ModuleDocFragment:
    """The request timeout of the modules that call the Kubernetes API."""

    DOCUMENTATION = r"""
options:
  request_timeout:
    description:
      - Seconds to wait for the API server's answer to each request, discovery included.
      - A server that accepts the connection and never answers makes the task fail after this long
        with a message that says so; a request that timed out is not sent again.
    type: float
    default: 30
"""
