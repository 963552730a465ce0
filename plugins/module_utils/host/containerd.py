# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""containerd's config.toml: the nvidia runtime added in place, every other line kept.

This file is private to the collection (see docs/architecture.md). containerd 1.x
replaces a whole plugin section with an imported file's (docs/containerd.md), so a
drop-in must carry a copy of the whole CRI section, which later edits of the main
file no longer reach: the main file is edited as text instead, key by key, and the
whole result is read back with a TOML parser before anything is written.
"""

from __future__ import annotations

import copy
import glob
import json
import os
import re

from ansible_collections.scv.gpu.plugins.module_utils.common.merge import deep_merge

# The collection's one TOML parser import (node.dra, node.validation_host and the modules take it from here):
# tomllib (Python 3.11 and newer); else tomli, its origin with the same API, which Ubuntu 22.04 and Debian package
# as python3-tomli; else None, and whoever reads TOML says so (TOML_NEEDS) or reads without it (host.toml_keys).
try:
    import tomllib
except ImportError:
    try:
        import tomli as tomllib
    except ImportError:
        tomllib = None
TOML_NEEDS = "Python 3.11 or newer, or the host's python3-tomli package"

# The CRI plugin's containerd table, by config version (containerd 1.x: 2, containerd 2.x: 3).
CRI_CONTAINERD = {
    2: ("plugins", "io.containerd.grpc.v1.cri", "containerd"),
    3: ("plugins", "io.containerd.cri.v1.runtime", "containerd"),
}
RUNTIME_TYPE = "io.containerd.runc.v2"


class ContainerdConfigError(Exception):
    """The config cannot be edited safely; the message names the file and what to do."""


class ContainerdImportError(ContainerdConfigError):
    """A file the config imports cannot be read."""


def parse(text, path):
    """The config as a dict; empty text is ``{}``."""
    if tomllib is None:
        raise ContainerdConfigError("reading %s needs %s on the managed host" % (path, TOML_NEEDS))
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ContainerdConfigError("%s is not valid TOML: %s; fix it, the file was left untouched"
                                    % (path, error)) from error


def config_version(config, path):
    version = config.get("version")
    if isinstance(version, str) and version.strip() in ("2", "3"):
        raise ContainerdConfigError(
            '%s has version = "%s", a string; containerd reads only an integer there: write version = %s '
            "(no quotes); nothing was written" % (path, version, version.strip()))
    if isinstance(version, float):
        raise ContainerdConfigError(
            "%s has version = %s, a float; containerd refuses it and reads only an integer: write version = %d; "
            "nothing was written" % (path, version, version) if version.is_integer() else
            "%s has version = %s; containerd reads only an integer (2 or 3); nothing was written" % (path, version))
    if isinstance(version, bool) or not isinstance(version, int) or version not in CRI_CONTAINERD:
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


def table_header(keys, literal=False):
    """``[a."b.c".d]`` for the key path ('a', 'b.c', 'd'); ``[a.'b.c'.d]`` with ``literal`` (the style of
    containerd 2's own default file and of the Kubernetes docs), where the key allows it."""
    def quoted(key):
        if re.fullmatch(r"[A-Za-z0-9_-]+", key):
            return key
        return "'%s'" % key if literal and not re.search(r"['\x00-\x1f\x7f]", key) else json.dumps(key)
    return "[" + ".".join(quoted(key) for key in keys) + "]"


_KEY_PART = re.compile(r"""\s*(?:"((?:[^"\\]|\\.)*)"|'([^']*)'|([A-Za-z0-9_-]+))\s*""")


def _header_keys(line):
    """The key path of a ``[table]`` header line (bare, "basic" and 'literal' keys), or None for anything else."""
    stripped = line.strip()
    if not stripped.startswith("[") or stripped.startswith("[["):
        return None
    keys, position = [], 1
    while True:
        match = _KEY_PART.match(stripped, position)
        if not match:
            return None
        basic, literal, bare = match.groups()
        keys.append(json.loads('"%s"' % basic) if basic is not None else literal if literal is not None else bare)
        position = match.end()
        if stripped.startswith("]", position):
            return tuple(keys)
        if not stripped.startswith(".", position):
            return None
        position += 1


def _header_at(text, index):
    """Whether the line starting at ``index`` is a table header (its first non-blank character is '[')."""
    while index < len(text) and text[index] in " \t":
        index += 1
    return text.startswith("[", index)


def _code_starts(text):
    """For each line of ``text``: whether it starts outside any value, and where its comment starts.

    Text inside \"\"\"...\"\"\" or \'\'\'...\'\'\' is never configuration, nor is a line inside an
    array or inline table that spans lines (``x = [`` then ``[1, 2],``: not a header); a '#'
    inside any string is not a comment. Returns [(outside, comment_column or None)], one per line.
    """
    lines, state, index, length, depth = [], None, 0, len(text), 0
    line_start, outside, comment = 0, True, None
    header = _header_at(text, 0)
    while index <= length:
        if index == length or text[index] == "\n":
            lines.append((outside, None if comment is None else comment - line_start))
            if index == length:
                break
            index += 1
            line_start, comment = index, None
            if state in ('"', "'"):
                state = None   # a single-line string cannot span lines (the parser reports it)
            outside = state is None and depth == 0
            header = outside and _header_at(text, index)
            continue
        char = text[index]
        if state is None:
            if char == "#":
                comment = index
                index = text.find("\n", index)
                index = length if index < 0 else index
                continue
            if text.startswith('"""', index) or text.startswith("'''", index):
                state, index = text[index:index + 3], index + 3
                continue
            if char in ('"', "'"):
                state = char
            elif char in "[{" and not header:
                depth += 1
            elif char in "]}" and not header:
                depth = max(0, depth - 1)
        elif state == '"':
            if char == "\\":
                index += 1
            elif char == '"':
                state = None
        elif state == "'":
            if char == "'":
                state = None
        elif state == '"""' and char == "\\":
            # an escape; a backslash that ends the line (TOML's line continuation) skips no newline
            index += 1 if text[index + 1:index + 2] not in ("\n", "") else 0
        elif state in ('"""', "'''") and text.startswith(state, index):
            # the string ends at the last quote of a run of 3 to 5: up to two quotes belong to its body
            run = len(text) - index - len(text[index:].lstrip(state[0]))
            state, index = None, index + min(run, 5)
            continue
        index += 1
    return lines


def _literal(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value)


def _newline_of(text):
    return "\r\n" if "\r\n" in text and text.count("\r\n") * 2 >= text.count("\n") else "\n"


def set_key(text, table, key, value):
    """``text`` with ``key = value`` in table ``table`` (a key path; ``()`` for a top-level key, which goes
    before the first table), other lines untouched.

    A rewritten line keeps its indentation, its inline comment and its line ending; a new line
    takes the file's line ending. Lines inside multi-line strings are never read as keys or headers.
    """
    lines = text.splitlines(keepends=True)
    starts = _code_starts(text)
    code = [starts[i][0] if i < len(starts) else True for i in range(len(lines))]
    newline = _newline_of(text)
    if not table:
        # A top-level key: among the lines before the first table, or added right before it.
        start = -1
    else:
        start = next((i for i, line in enumerate(lines) if code[i] and _header_keys(line) == tuple(table)), None)
    if start is None:
        if text and not text.endswith("\n"):
            text += newline
        literal = any(code[i] and re.match(r"\s*\[[^\]\"]*'", line) for i, line in enumerate(lines))
        return text + "%s%s%s  %s = %s%s" % (newline, table_header(table, literal), newline, key, _literal(value),
                                             newline)
    end = next((i for i in range(start + 1, len(lines)) if code[i] and lines[i].lstrip().startswith("[")),
               len(lines))
    pattern = re.compile(r"""^(\s*)(?:%s|"%s"|'%s')\s*=""" % ((re.escape(key),) * 3))
    for i in range(start + 1, end):
        match = pattern.match(lines[i]) if code[i] else None
        if match:
            ending = "\r\n" if lines[i].endswith("\r\n") else "\n" if lines[i].endswith("\n") else ""
            comment_at = starts[i][1]
            comment = ""
            if comment_at is not None:
                body = lines[i][:len(lines[i]) - len(ending)]
                spacing = re.search(r"\s*$", body[:comment_at]).group()
                comment = (spacing or " ") + body[comment_at:]
            lines[i] = "%s%s = %s%s%s" % (match.group(1), key, _literal(value), comment, ending)
            return "".join(lines)
    if start < 0:
        if end == len(lines) and lines and not lines[-1].endswith("\n"):
            lines[-1] += newline
        lines.insert(end, "%s = %s%s" % (key, _literal(value), newline))
        return "".join(lines)
    header_indent = re.match(r"^(\s*)", lines[start]).group(1).strip("\r\n")
    lines.insert(start + 1, "%s  %s = %s%s" % (header_indent, key, _literal(value), newline))
    return "".join(lines)


def donor_runtime(config, version):
    """The runtime whose place the nvidia runtime takes, and whose node-wide settings it shares: the CRI default
    runtime (``default_runtime_name``, runc when unset) where it is a runc-type runtime other than nvidia, else
    runc."""
    containerd = CRI_CONTAINERD[version]
    default = lookup(config, containerd + ("default_runtime_name",)) or "runc"
    body = lookup(config, containerd + ("runtimes", default))
    if default != "nvidia" and isinstance(body, dict) and body.get("runtime_type", RUNTIME_TYPE) == RUNTIME_TYPE:
        return default
    return "runc"


def desired_settings(config, version, binary, default_runtime, enable_cdi=False):
    """[(table key path, key, value)] that put the nvidia runtime in ``config`` (the configuration containerd runs
    with, imports merged in).

    From the runtime it stands in for (donor_runtime) the nvidia runtime takes what a GPU pod must share with every
    other pod of the node: the cgroup driver (``options.SystemdCgroup``, which must be the kubelet's) and the node's
    base OCI spec (``base_runtime_spec``: rlimits and the like). Not its ``Root`` (runc's own state folder) nor
    the annotations it passes (``pod_annotations``, ``container_annotations``), which belong to that runtime."""
    containerd = CRI_CONTAINERD[version]
    nvidia = containerd + ("runtimes", "nvidia")
    settings = [
        (nvidia, "runtime_type", RUNTIME_TYPE),
        (nvidia + ("options",), "BinaryName", binary),
    ]
    donor = containerd + ("runtimes", donor_runtime(config, version))
    systemd_cgroup = lookup(config, donor + ("options", "SystemdCgroup"))
    if isinstance(systemd_cgroup, bool):
        settings.append((nvidia + ("options",), "SystemdCgroup", systemd_cgroup))
    base_spec = lookup(config, donor + ("base_runtime_spec",))
    if isinstance(base_spec, str) and base_spec:
        settings.append((nvidia, "base_runtime_spec", base_spec))
    if default_runtime:
        settings.append((containerd, "default_runtime_name", "nvidia"))
    elif lookup(config, containerd + ("default_runtime_name",)) == "nvidia":
        settings.append((containerd, "default_runtime_name", "runc"))
    if enable_cdi:
        # enable_cdi belongs to the CRI plugin's own table (containerd 1.7 and later read it)
        settings.append((containerd[:-1], "enable_cdi", True))
    return settings


def resolve_imports(path, imports, version=3):
    """The files ``imports`` names, as containerd resolves them: relative to ``path``'s folder, globs expanded.

    containerd 1.6 expanded a relative glob from its working directory instead (``/`` under
    systemd); for a version 2 file, which 1.6 reads, those matches count too.
    """
    files = []
    for entry in imports if isinstance(imports, list) else []:
        if not isinstance(entry, str):
            continue
        resolved = os.path.normpath(entry if os.path.isabs(entry) else os.path.join(os.path.dirname(path), entry))
        if "*" not in entry:
            files.append(resolved)
            continue
        files.extend(sorted(glob.glob(resolved)))
        if version == 2 and not os.path.isabs(entry):
            files.extend(match for match in sorted(glob.glob(os.path.join("/", entry))) if match not in files)
    return files


def _read(path):
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def import_chain(config, version, path, read=_read, parser=None):
    """The files containerd merges over ``path``, in its order: [{path, imported_by, content, config}].

    containerd reads the main file's imports in order, then theirs (breadth first), each file once.
    ``parser(text, path)`` reads each file (default :func:`parse`).
    """
    parser = parser or parse
    chain, loaded = [], {os.path.normpath(path)}
    pending = [(imported, path) for imported in resolve_imports(path, config.get("imports"), version)]
    while pending:
        imported_path, importer = pending.pop(0)
        if imported_path in loaded:
            continue
        try:
            text = read(imported_path)
        except (OSError, UnicodeDecodeError) as error:
            raise ContainerdImportError("%s imports %s, which cannot be read (%s); containerd would not start "
                                        "either" % (importer, imported_path, error)) from error
        imported = parser(text, imported_path)
        chain.append({"path": imported_path, "imported_by": importer, "content": text, "config": imported})
        loaded.add(imported_path)
        nested = resolve_imports(imported_path, imported.get("imports"), version)
        pending.extend((each, imported_path) for each in nested)
    return chain


def effective_configs(config, version, path, read=_read, chain=None):
    """{rule: (config as containerd runs it, {plugin: the import that last set it})}, imports merged in.

    Imported files override the main file. containerd 1.x replaces each plugin section an
    import names as a whole; 2.x merges it key by key. A version 2 file may meet either,
    so both are returned for it. ``chain`` is :func:`import_chain`'s answer, when read already.
    """
    if chain is None:
        try:
            chain = import_chain(config, version, path, read)
        except ContainerdImportError as error:
            raise ContainerdConfigError("%s; nothing was written" % error) from error
    rules = ("replace", "merge") if version == 2 else ("merge",)
    results = {}
    for rule in rules:
        merged, sources = copy.deepcopy(config), {}
        for entry in chain:
            for plugin, section in (entry["config"].get("plugins") or {}).items():
                plugins = merged.setdefault("plugins", {})
                if rule == "replace" or not isinstance(plugins.get(plugin), dict) or not isinstance(section, dict):
                    plugins[plugin] = copy.deepcopy(section)
                else:
                    plugins[plugin] = deep_merge(plugins[plugin], section)
                sources[plugin] = entry["path"]
        results[rule] = (merged, sources)
    return results


def _overrides(config, version, path, settings, read):
    """[(setting, the value containerd would run with, the import that decides it)] where imports win."""
    found = []
    for rule, (merged, sources) in effective_configs(config, version, path, read).items():
        for table, key, value in settings:
            got = lookup(merged, table + (key,))
            if got != value:
                source = sources.get(table[1], path)
                found.append(("%s.%s" % (table_header(table)[1:-1], key), got, source, rule))
    return found


def _intended(config, settings):
    """``config`` with ``settings`` ([(table, key, value)]) set, tables made where missing; ``config`` untouched."""
    intended = copy.deepcopy(config)
    for table, key, value in settings:
        node = intended
        for name in table:
            node = node.setdefault(name, {})
        node[key] = value
    return intended


def _first_difference(expected, found, at=()):
    """The first key path (dotted) where ``found`` differs from ``expected``; None when they are the same."""
    if isinstance(expected, dict) and isinstance(found, dict):
        for key in sorted(set(expected) | set(found)):
            if key not in expected or key not in found:
                return ".".join(at + (key,))
            differs = _first_difference(expected[key], found[key], at + (key,))
            if differs is not None:
                return differs
        return None
    if expected != found or type(expected) is not type(found):
        return ".".join(at) or "the document"
    return None


def add_runtime(text, path, binary, default_runtime, enable_cdi=False, read=_read):
    """``(new_text, settings)``: the config with the nvidia runtime; ``text`` when nothing is missing.

    What counts is the configuration containerd runs with, imports merged in: when imports
    already give every setting, nothing is edited; when an import would override an edit,
    ContainerdConfigError names it. Raises ContainerdConfigError too when the result would
    not hold exactly the intended values (for example a table written inline, which is not edited).
    """
    config = parse(text, path)
    version = config_version(config, path)
    # what the runtime takes from the others is read where containerd reads it: the imports merged in
    running = effective_configs(config, version, path, read)["merge"][0] if config.get("imports") else config
    settings = desired_settings(running, version, binary, default_runtime, enable_cdi)
    if config.get("imports") and not _overrides(config, version, path, settings, read):
        return text, settings          # the effective configuration already holds the runtime
    new_text = text
    for table, key, value in settings:
        if lookup(config, table + (key,)) != value:
            new_text = set_key(new_text, table, key, value)
    if new_text == text and not config.get("imports"):
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
    # The whole document read back must be the old one plus exactly the keys this module owns: an edit that
    # turned text into keys (a line of a multi-line string read as a table or a key) or lost one is refused.
    differs = _first_difference(_intended(config, settings), result)
    if differs is not None:
        raise ContainerdConfigError(
            "%s: editing would change %s, which this module does not own (read back, the file would not be the old "
            "configuration plus the nvidia runtime's settings); add the nvidia runtime by hand; nothing was written"
            % (path, differs))
    overridden = _overrides(result, version, path, settings, read)
    if overridden:
        details = "; ".join(
            "%s would be %s, from %s%s" % (setting, "unset" if got is None else json.dumps(got), source,
                                           " (containerd 1.6 replaces the whole plugin section an import names)"
                                           if rule == "replace" else "")
            for setting, got, source, rule in overridden)
        raise ContainerdConfigError(
            "%s: its imports override what this module would write, and containerd runs with the imports merged "
            "in (they win): %s. Put the nvidia runtime in that import, or remove it from imports; nothing was "
            "written" % (path, details))
    return new_text, settings
