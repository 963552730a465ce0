# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""CRI-O's drop-ins in the order CRI-O reads them, from what ansible.builtin.find listed."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.scv.gpu.plugins.module_utils.host import crio_dropins


def scv_gpu_crio_drop_ins(files, root):
    """The paths of ``files`` (find's ``files``, recursive, links not followed) in CRI-O's reading order."""
    if not isinstance(files, list):
        raise AnsibleFilterError("crio_drop_ins: pass the files ansible.builtin.find listed")
    return crio_dropins.ordered(str(root), files)


class FilterModule:
    def filters(self):
        return {"crio_drop_ins": scv_gpu_crio_drop_ins}
