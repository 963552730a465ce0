# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations


class ModuleDocFragment:
    """The ``name`` option of the modules that write on one Node."""

    DOCUMENTATION = r"""
options:
  name:
    description:
      - The Kubernetes node's name, a DNS subdomain (lower case, at most 253 characters), checked before any request
        is made.
    type: str
    required: true
"""
