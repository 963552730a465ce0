# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Whether a CustomResourceDefinition, read by name from the API server, serves a version."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError


def scv_gpu_crd_serves(resources, version):
    """True when one of ``resources`` (kubernetes.core.k8s_info's list: the CRD, or nothing) serves ``version``."""
    if not isinstance(version, str) or not version:
        raise AnsibleFilterError("crd_serves: the version must be a name such as 'v1', got %r" % (version,))
    for crd in resources or []:
        versions = ((crd or {}).get("spec") or {}).get("versions") or []
        if any(entry.get("name") == version and entry.get("served") is True for entry in versions):
            return True
    return False


class FilterModule:
    def filters(self):
        return {"crd_serves": scv_gpu_crd_serves}
