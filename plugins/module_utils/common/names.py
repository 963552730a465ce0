# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Kubernetes object names, checked before any request is made (private)."""

from __future__ import annotations

import re

# A Node's name (and so its Scv's) is a DNS subdomain (RFC 1123), as the API server checks it.
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
DNS_SUBDOMAIN_MAX = 253


def object_name_problem(name, kind="node"):
    """Why ``name`` cannot name a ``kind`` object (a DNS subdomain: Nodes, Scvs), or None when it can."""
    if not isinstance(name, str) or not name:
        return "a %s name is needed, got %r" % (kind, name)
    if len(name) > DNS_SUBDOMAIN_MAX or not DNS_SUBDOMAIN.fullmatch(name):
        return ("%r is not a Kubernetes %s name: lower-case letters, digits, '-' and '.', starting and ending "
                "with a letter or digit, at most 253 characters" % (name, kind))
    return None


def node_name_problem(name):
    """Why ``name`` cannot be a node's (and its Scv's) name, or None when it can."""
    return object_name_problem(name, "node")
