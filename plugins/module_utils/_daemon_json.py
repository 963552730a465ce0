# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Lossless merging into Docker's daemon.json, and dockerd flags read from systemd units.

This file is private to the collection (its name starts with ``_``). It is pure
apart from reading files, so that property-based tests can exercise the merge.
"""

from __future__ import annotations

import copy
import glob
import json
import os
import re
import shlex

RUNTIME_NAME = "nvidia"


class DaemonJsonError(Exception):
    """daemon.json cannot be used as it is; the message names the file and what to do."""


def _reject_duplicates(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError("the key %s appears more than once in one object" % json.dumps(key))
        seen[key] = value
    return seen


def parse(text, path):
    """The document in ``text`` (a dict); empty text is ``{}``.

    Raises DaemonJsonError naming ``path`` and the position for invalid JSON, a
    top level that is not an object, or a key given twice in one object (Docker
    would silently keep the last one; a merge must not pick for the user).
    """
    if not text.strip():
        return {}
    try:
        document = json.loads(text, object_pairs_hook=_reject_duplicates)
    except json.JSONDecodeError as error:
        raise DaemonJsonError("%s is not valid JSON: %s at line %d, column %d (character %d); fix it or "
                              "remove it, it was left untouched"
                              % (path, error.msg, error.lineno, error.colno, error.pos)) from error
    except ValueError as error:
        raise DaemonJsonError("%s: %s; keep one of them, the file was left untouched" % (path, error)) from error
    if not isinstance(document, dict):
        raise DaemonJsonError("%s holds a JSON %s at the top level, but daemon.json must be an object "
                              "({...}); the file was left untouched" % (path, type(document).__name__))
    return document


def _deep_merge(base, extra):
    """``extra`` merged into a copy of ``base``: objects merge key by key, anything else replaces."""
    merged = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def merge(document, runtime_path, runtime_args, default_runtime, settings):
    """The daemon.json document with the nvidia runtime and ``settings`` merged in.

    Every key that is not ``runtimes.nvidia.path``, ``runtimes.nvidia.runtimeArgs``,
    ``default-runtime`` or in ``settings`` is kept as it was. ``default_runtime``
    True makes nvidia the default; False removes ``default-runtime`` only when it
    names nvidia; None leaves it alone. ``settings`` merge deeply: objects key by
    key, lists and scalars replace.
    """
    merged = _deep_merge(document, settings or {})
    runtimes = merged.get("runtimes")
    if runtimes is None:
        runtimes = merged["runtimes"] = {}
    elif not isinstance(runtimes, dict):
        raise DaemonJsonError("runtimes is a JSON %s, but Docker expects an object of runtimes; "
                              "fix it in daemon.json first" % type(runtimes).__name__)
    nvidia = runtimes.get(RUNTIME_NAME)
    nvidia = dict(nvidia) if isinstance(nvidia, dict) else {}
    nvidia["path"] = runtime_path
    nvidia["runtimeArgs"] = list(runtime_args)
    runtimes[RUNTIME_NAME] = nvidia
    if default_runtime is True:
        merged["default-runtime"] = RUNTIME_NAME
    elif default_runtime is False and merged.get("default-runtime") == RUNTIME_NAME:
        del merged["default-runtime"]
    return merged


def render(document, previous_text=""):
    """The file's new text: the previous file's indentation (default 4 spaces), a final newline."""
    indent = 4
    match = re.search(r"^([ \t]+)\S", previous_text, re.MULTILINE)
    if match:
        indent = match.group(1) if "\t" in match.group(1) else len(match.group(1))
    return json.dumps(document, indent=indent, ensure_ascii=False) + "\n"


# ------------------------------------------------------- dockerd flags in units

# dockerd flags whose daemon.json key is not the flag's long name.
_FLAG_KEYS = {
    "H": "hosts", "host": "hosts",
    "D": "debug",
    "G": "group",
    "l": "log-level",
    "p": "pidfile",
    "g": "data-root", "graph": "data-root",
    "add-runtime": "runtimes",
    "authorization-plugin": "authorization-plugins",
    "default-ulimit": "default-ulimits",
    "dns-opt": "dns-opts",
    "exec-opt": "exec-opts",
    "insecure-registry": "insecure-registries",
    "label": "labels",
    "log-opt": "log-opts",
    "registry-mirror": "registry-mirrors",
    "storage-opt": "storage-opts",
}

_UNIT_DIRS = ("/etc/systemd/system", "/run/systemd/system", "/usr/local/lib/systemd/system",
              "/usr/lib/systemd/system", "/lib/systemd/system")


def _unit_lines(path):
    """(key, value) pairs of a unit file's [Service] section, continuation lines joined."""
    with open(path, encoding="utf-8", errors="replace") as unit:
        text = unit.read().replace("\\\n", " ")
    section = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        if section == "Service" and "=" in line:
            key, value = line.split("=", 1)
            yield key.strip(), value.strip()


def _environment_file(path):
    variables = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as env:
            for raw in env:
                line = raw.strip()
                if line and not line.startswith("#") and "=" in line:
                    key, value = line.split("=", 1)
                    words = shlex.split(value, comments=True) or [""]
                    variables[key.strip().replace("export ", "")] = " ".join(words)
    except OSError:
        pass
    return variables


def unit_files(unit="docker.service", search_paths=_UNIT_DIRS):
    """The unit file systemd would load and its drop-ins, in the order systemd applies them."""
    main = None
    for directory in search_paths:
        candidate = os.path.join(directory, unit)
        if os.path.isfile(candidate):
            main = candidate
            break
    dropins = {}
    for directory in reversed(search_paths):   # a drop-in earlier in the search path overrides a later one
        for path in glob.glob(os.path.join(directory, unit + ".d", "*.conf")):
            dropins[os.path.basename(path)] = path
    return ([main] if main else []) + [dropins[name] for name in sorted(dropins)]


def dockerd_flags(files):
    """{daemon.json key: "file: flag"} for the flags of dockerd's effective ExecStart."""
    exec_start, environment, source = [], {}, None
    for path in files:
        for key, value in _unit_lines(path):
            if key == "ExecStart":
                if value:
                    exec_start, source = [value], path
                else:
                    exec_start, source = [], None   # an empty ExecStart= resets the list
            elif key == "EnvironmentFile":
                environment.update(_environment_file(value.lstrip("-")))
            elif key == "Environment":
                for assignment in shlex.split(value):
                    if "=" in assignment:
                        name, _sep, assigned = assignment.partition("=")
                        environment[name] = assigned
    flags = {}
    for command in exec_start:
        expanded = re.sub(r"\$\{?(\w+)\}?", lambda m: environment.get(m.group(1), ""), command.lstrip("-@+!:"))
        for word in shlex.split(expanded)[1:]:
            if not word.startswith("-") or word == "-":
                continue
            name = word.lstrip("-").split("=", 1)[0]
            key = _FLAG_KEYS.get(name, name)
            flags.setdefault(key, "%s: %s" % (source, word.split("=", 1)[0]))
    return flags


def conflicts(document, flags):
    """daemon.json keys that dockerd also gets as flags (Docker then refuses to start)."""
    return sorted((key, flags[key]) for key in document if key in flags)
