# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Atomic writes of configuration files that other tools share.

This file is private to the collection (see docs/architecture.md).
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


def read_text(path):
    """The file's UTF-8 text, or None when it does not exist (OSError, UnicodeDecodeError otherwise)."""
    try:
        with open(path, "rb") as current:
            return current.read().decode("utf-8")
    except FileNotFoundError:
        return None


def apply_text(module, path, previous, text, result, backup=False):
    """Record ``text`` replacing ``previous`` in ``result`` and, outside check mode, write it.

    Adds the before/after diff when the task runs with --diff; when the text
    changed, keeps a backup (if asked) and writes atomically. Write errors fail
    the module naming the file.
    """
    if module._diff:
        result["diff"] = dict(before=previous or "", after=text, before_header=path, after_header=path)
    if text == previous or module.check_mode:
        return
    if backup and previous is not None:
        result["backup_file"] = module.backup_local(path)
    try:
        write_atomically(module, path, text)
    except OSError as error:
        module.fail_json(msg="cannot write %s: %s" % (path, error), path=path)
