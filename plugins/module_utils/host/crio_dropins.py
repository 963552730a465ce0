# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The order in which CRI-O reads the drop-ins of its configuration folder (private to the collection).

CRI-O (pkg/config UpdateFromPath) walks the folder with Go's filepath.Walk and reads every entry that is not a
folder: each folder's names in byte order, depth first, a subfolder's files where its name falls among its
siblings ("a/z.conf" before "a.conf", as "a" sorts before "a.conf"). Walk does not follow links: a link to a file
is read through the link, a link to a folder is read as a file, which fails. The last file that sets a key decides.
"""

from __future__ import annotations

import os
import stat


def walk_key(root, path):
    """The key that sorts ``path`` (under ``root``) into filepath.Walk's order: its components, each as bytes."""
    relative = os.path.relpath(path, root)
    return tuple(os.fsencode(part) for part in relative.split(os.sep))


def ordered(root, entries):
    """The paths CRI-O reads from ``entries`` ({path, isdir}: what ansible.builtin.find listed under ``root``,
    recursively, links not followed), in the order it reads them; folders left out."""
    found = [entry["path"] for entry in entries or () if not entry.get("isdir")]
    return sorted(found, key=lambda path: walk_key(root, path))


def walk(root):
    """The paths CRI-O reads from folder ``root`` on this host, in its order; [] where ``root`` does not exist."""
    try:
        info = os.lstat(root)
    except FileNotFoundError:
        return []
    if not stat.S_ISDIR(info.st_mode):
        return [root]
    found = []
    for name in sorted(os.listdir(root), key=os.fsencode):
        path = os.path.join(root, name)
        if stat.S_ISDIR(os.lstat(path).st_mode):
            found += walk(path)
        else:
            found.append(path)
    return found
