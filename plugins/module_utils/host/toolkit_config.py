# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The NVIDIA container runtime's config.toml: settings put in place, every other line kept (private).

This file is private to the collection (see docs/architecture.md). The file is NVIDIA's, shared with
``nvidia-ctk config`` and the site: it is edited as text, key by key (containerd's editor, which knows TOML's
strings and comments), and the whole result is read back with a TOML parser and compared with the file as it
was plus the settings, so that an edit that would change anything else, or not take effect, is refused.
"""

from __future__ import annotations

import copy

from ansible_collections.scv.gpu.plugins.module_utils.host.containerd import ContainerdConfigError, parse, set_key


class ToolkitConfigError(Exception):
    """The file cannot be edited safely; the message names the file, the key and what to do."""


def key_path(dotted):
    """("nvidia-container-runtime", "mode") for "nvidia-container-runtime.mode"."""
    parts = tuple(dotted.split("."))
    if not all(parts):
        raise ToolkitConfigError("%r is not a key path (table.key, with no empty part)" % dotted)
    return parts


def apply_settings(text, path, settings):
    """``text`` (None: no file) with each ``{"table.key": value}`` of ``settings`` set; raises
    ToolkitConfigError when the file is no TOML or the edit would not give exactly the file plus the settings."""
    try:
        before = parse(text or "", path)
    except ContainerdConfigError as error:
        raise ToolkitConfigError(str(error)) from error
    expected = copy.deepcopy(before)
    new = text or ""
    for dotted, value in settings.items():
        if not isinstance(value, (bool, int, str)) and not (
                isinstance(value, list) and all(isinstance(item, str) for item in value)):
            raise ToolkitConfigError("%s: %s must be a boolean, a number, a string or a list of strings, not %r"
                                     % (path, dotted, value))
        keys = key_path(dotted)
        table = expected
        for part in keys[:-1]:
            table = table.setdefault(part, {})
            if not isinstance(table, dict):
                raise ToolkitConfigError("%s: %s is not a table, so %s cannot be set; fix the file, it was left "
                                         "untouched" % (path, ".".join(keys[:keys.index(part) + 1]), dotted))
        table[keys[-1]] = value
        new = set_key(new, keys[:-1], keys[-1], value)
    try:
        after = parse(new, path)
    except ContainerdConfigError as error:
        raise ToolkitConfigError(
            "%s: setting %s in place would leave no valid TOML (%s); the file sets one of them in a form this "
            "edit does not follow (a dotted key or an inline table): write it as a key of its table, "
            "the file was left untouched" % (path, ", ".join(settings), error)) from error
    if after != expected:
        raise ToolkitConfigError(
            "%s: setting %s in place would not give the file plus these settings (a dotted key or an inline table "
            "sets one of them elsewhere); write them as keys of their tables, the file was left untouched"
            % (path, ", ".join(settings)))
    return new
