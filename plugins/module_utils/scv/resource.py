# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The Scv resource type (``core.run-linux.com/v1``, cluster-scoped), as SCV defined it (private)."""

from __future__ import annotations

from ansible_collections.scv.gpu.plugins.module_utils.kube.api_resource import ApiResource

API_VERSION = "core.run-linux.com/v1"
KIND = "Scv"
CRD_NAME = "scvs.core.run-linux.com"
CRD_HINT = ("install it with the scv.gpu.scv_publish role, or: "
            "kubectl apply -f roles/scv_publish/files/scvs.core.run-linux.com.yml (in the scv.gpu collection)")

SCV = ApiResource(API_VERSION, KIND, "scvs", CRD_NAME, CRD_HINT)

# spec.updateInterval of an Scv created without one: how often an agent reads the GPUs, in ms.
DEFAULT_UPDATE_INTERVAL_MS = 1000
