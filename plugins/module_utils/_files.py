# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Atomic writes of configuration files that other tools share.

This file is private to the collection (its name starts with ``_``).
"""

from __future__ import annotations

import os
import tempfile

from ansible.module_utils.common.text.converters import to_bytes


def write_atomically(module, path, text):
    """Write ``text`` to ``path`` through a temporary file renamed over it.

    AnsibleModule.atomic_move keeps an existing file's owner, mode and SELinux
    context; a new file gets the usual umask-derived mode. The temporary file is
    removed whatever happens.
    """
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        os.makedirs(directory, 0o755)
    handle, temporary = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), dir=directory)
    try:
        with os.fdopen(handle, "wb") as new:
            new.write(to_bytes(text))
        module.atomic_move(temporary, path, unsafe_writes=module.params.get("unsafe_writes", False))
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
