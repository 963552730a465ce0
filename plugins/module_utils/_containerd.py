# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""containerd's config.toml: the nvidia runtime added in place, every other line kept.

This file is private to the collection (its name starts with ``_``). containerd 1.x
replaces a whole plugin section with an imported file's (docs/containerd.md), so
the runtime cannot be a drop-in there: the main file is edited as text, key by
key, and the result is checked with a TOML parser before anything is written.
"""

from __future__ import annotations

import json
import re

try:
    import tomllib
except ImportError:  # Python < 3.11 on the managed host
    tomllib = None

# The CRI plugin's containerd table, by config version (containerd 1.x: 2, containerd 2.x: 3).
CRI_CONTAINERD = {
    2: ("plugins", "io.containerd.grpc.v1.cri", "containerd"),
    3: ("plugins", "io.containerd.cri.v1.runtime", "containerd"),
}
RUNTIME_TYPE = "io.containerd.runc.v2"


class ContainerdConfigError(Exception):
    """The config cannot be edited safely; the message names the file and what to do."""


def parse(text, path):
    """The config as a dict; empty text is ``{}``."""
    if tomllib is None:
        raise ContainerdConfigError("editing %s needs Python 3.11 or newer (tomllib) on the managed host" % path)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ContainerdConfigError("%s is not valid TOML: %s; fix it, the file was left untouched"
                                    % (path, error)) from error


def config_version(config, path):
    version = config.get("version")
    if version not in CRI_CONTAINERD:
        raise ContainerdConfigError(
            "%s has config version %s; this role edits version 2 (containerd 1.x) and 3 (containerd 2.x): "
            "run `containerd config migrate`, or start from `containerd config default`; nothing was written"
            % (path, "(none)" if version is None else version))
    return version


def lookup(config, keys):
    node = config
    for key in keys:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def table_header(keys):
    """``[a."b.c".d]`` for the key path ('a', 'b.c', 'd')."""
    return "[" + ".".join(key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key) for key in keys) + "]"


def _header_keys(line):
    """The key path of a ``[table]`` header line, or None for anything else."""
    stripped = line.strip()
    if not stripped.startswith("[") or stripped.startswith("[["):
        return None
    body = stripped[1:stripped.index("]")] if "]" in stripped else ""
    return tuple(part.strip().strip('"') for part in re.findall(r'\s*(?:"[^"]*"|[^."]+)\s*', body))


def _literal(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value)


def set_key(text, table, key, value):
    """``text`` with ``key = value`` in table ``table`` (a key path), other lines untouched."""
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if _header_keys(line) == tuple(table)), None)
    if start is None:
        if text and not text.endswith("\n"):
            text += "\n"
        return text + "\n%s\n  %s = %s\n" % (table_header(table), key, _literal(value))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].lstrip().startswith("[")), len(lines))
    pattern = re.compile(r"^(\s*)%s\s*=" % re.escape(key))
    for i in range(start + 1, end):
        match = pattern.match(lines[i])
        if match:
            newline = "\n" if lines[i].endswith("\n") else ""
            lines[i] = "%s%s = %s%s" % (match.group(1), key, _literal(value), newline)
            return "".join(lines)
    header_indent = re.match(r"^(\s*)", lines[start]).group(1)
    lines.insert(start + 1, "%s  %s = %s\n" % (header_indent, key, _literal(value)))
    return "".join(lines)


def desired_settings(config, version, binary, default_runtime, enable_cdi=False):
    """[(table key path, key, value)] that put the nvidia runtime in ``config``."""
    containerd = CRI_CONTAINERD[version]
    nvidia = containerd + ("runtimes", "nvidia")
    settings = [
        (nvidia, "runtime_type", RUNTIME_TYPE),
        (nvidia + ("options",), "BinaryName", binary),
    ]
    systemd_cgroup = lookup(config, containerd + ("runtimes", "runc", "options", "SystemdCgroup"))
    if isinstance(systemd_cgroup, bool):
        settings.append((nvidia + ("options",), "SystemdCgroup", systemd_cgroup))
    if default_runtime:
        settings.append((containerd, "default_runtime_name", "nvidia"))
    elif lookup(config, containerd + ("default_runtime_name",)) == "nvidia":
        settings.append((containerd, "default_runtime_name", "runc"))
    if enable_cdi:
        # enable_cdi belongs to the CRI plugin's own table (containerd 1.7 and later read it)
        settings.append((containerd[:-1], "enable_cdi", True))
    return settings


def add_runtime(text, path, binary, default_runtime, enable_cdi=False):
    """``(new_text, settings)``: the config with the nvidia runtime; ``text`` when nothing is missing.

    Raises ContainerdConfigError when the result would not hold exactly the
    intended values (for example a table written inline, which is not edited).
    """
    config = parse(text, path)
    version = config_version(config, path)
    settings = desired_settings(config, version, binary, default_runtime, enable_cdi)
    new_text = text
    for table, key, value in settings:
        if lookup(config, table + (key,)) != value:
            new_text = set_key(new_text, table, key, value)
    if new_text == text:
        return text, settings
    try:
        result = parse(new_text, path)
    except ContainerdConfigError:
        result = None   # our edit clashes with how the file is written
    if result is None or lookup(result, ("version",)) != version or \
            any(lookup(result, t + (k,)) != v for t, k, v in settings):
        raise ContainerdConfigError(
            "%s defines the CRI runtime tables in a form this module does not edit (inline tables or dotted "
            "keys); add the nvidia runtime by hand or write the tables out; nothing was written" % path)
    unchanged = {key: value for key, value in config.items() if key != "plugins"}
    if {key: value for key, value in result.items() if key != "plugins"} != unchanged:
        raise ContainerdConfigError("%s: editing would change settings outside the CRI plugin; nothing was written"
                                    % path)
    return new_text, settings
