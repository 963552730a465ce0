# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What a client needs to know of an API resource: where it is served and how to explain its absence (private)."""

from __future__ import annotations

# The field manager both clients name in every write (server-side field ownership).
FIELD_MANAGER = "scv.gpu"


class ApiResource:
    """A resource type: ``api_version`` (``v1`` or ``group/version``), ``kind``, the ``plural`` of its URLs.

    A custom resource also names its definition (``crd_name``) and how to install it
    (``install_hint``), so that a missing definition is reported as such.
    """

    def __init__(self, api_version, kind, plural, crd_name=None, install_hint=None):
        self.api_version = api_version
        self.kind = kind
        self.plural = plural
        self.crd_name = crd_name
        self.install_hint = install_hint

    @property
    def base_path(self):
        """The URL path of the resource's collection (cluster-scoped)."""
        root = "/api/" if "/" not in self.api_version else "/apis/"
        return root + self.api_version + "/" + self.plural


NODE = ApiResource("v1", "Node", "nodes")
