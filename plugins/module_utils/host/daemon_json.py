# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Lossless merging into Docker's daemon.json, and dockerd flags read from systemd units.

This file is private to the collection (see docs/architecture.md). It is pure
apart from reading files, so that property-based tests can exercise the merge.
"""

from __future__ import annotations

import json
import math
import re
import shlex

from ansible_collections.scv.gpu.plugins.module_utils.common.merge import deep_merge
from ansible_collections.scv.gpu.plugins.module_utils.common.value_kinds import json_kind
from ansible_collections.scv.gpu.plugins.module_utils.host.systemd import environment_file, unit_lines

RUNTIME_NAME = "nvidia"
# Far deeper than any daemon.json setting nests (four levels), and within what Python's parser reads
# on every supported version (about 990 levels). dockerd reads up to 10000; deeper documents are
# refused here before anything recursive (copy, merge, render) touches them.
MAX_DEPTH = 500
# What dockerd trims around the whole file before it parses (Unicode's White_Space characters), and
# the byte order mark it skips at the very start.
_SPACE = "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a" \
         "\u2028\u2029\u202f\u205f\u3000"
_BOM = "\ufeff"
# What `dockerd --validate` prints when the dockerd is older than Docker 23, which added the flag.
NO_VALIDATE_FLAG = "unknown flag: --validate"


class DaemonJsonError(Exception):
    """daemon.json cannot be used as it is; the message names the file and what to do."""


def _reject_duplicates(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError("the key %s appears more than once in one object" % json.dumps(key))
        seen[key] = value
    return seen


class _BadNumber(Exception):
    """A number literal that JSON (and dockerd) cannot hold: NaN, Infinity, or out of range."""

    def __init__(self, literal):
        super().__init__(literal)
        self.literal = literal


def _refuse_constant(literal):
    raise _BadNumber(literal)


def _finite_float(literal):
    value = float(literal)
    if math.isinf(value):
        raise _BadNumber(literal)
    return value


def _float_range_int(literal):
    # dockerd reads a number it has no type for (runtime options, say) as a 64-bit float: an integer
    # of any length is accepted while that float is finite. float() first: int() of a literal of more
    # than 4300 digits is refused outright, and every such literal is beyond a float anyway.
    _finite_float(literal)
    return int(literal)


# Strings (skipped) and the number-like literals of a JSON text, in order.
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|-?Infinity|NaN|-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?')


def _line_and_column(text, literal):
    """Where ``literal`` first stands as a value (not inside a string) in ``text``: (line, column), 1-based."""
    for match in _TOKENS.finditer(text):
        if match.group() == literal:
            offset = match.start()
            return text.count("\n", 0, offset) + 1, offset - (text.rfind("\n", 0, offset) + 1) + 1
    return 0, 0


def depth(document):
    """How deep arrays and objects nest in ``document`` (a scalar is 0), without recursion."""
    deepest, pending = 0, [(document, 1)]
    while pending:
        value, level = pending.pop()
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        if level <= MAX_DEPTH:
            pending.extend((child, level + 1) for child in children)
    return deepest


def _blank_ends(text):
    """``text`` without a leading byte order mark, and with the white space dockerd trims around it
    turned into spaces (newlines kept), so that positions in messages stay those of the file."""
    text = text[1:] if text.startswith(_BOM) else text
    core = text.strip(_SPACE)
    if not core:
        return ""
    start = len(text) - len(text.lstrip(_SPACE))
    end = start + len(core)

    def spaces(part):
        return re.sub("[^\n]", " ", part)

    return spaces(text[:start]) + core + spaces(text[end:])


def parse(text, path):
    """The document in ``text`` (a dict), read as dockerd reads daemon.json.

    As dockerd does, it skips a leading byte order mark and the white space around the document,
    and takes an empty file or a top-level ``null`` as no settings (``{}``). The tests hold every
    such decision against ``dockerd --validate``.

    Raises DaemonJsonError naming ``path`` and the position for invalid JSON, a number dockerd
    cannot read (NaN, Infinity, 1e400, an integer beyond a 64-bit float), a top level that is not
    an object: dockerd refuses all of these. Two more are refused although dockerd reads them: a
    key given twice in one object (dockerd keeps one of the values; a rewrite must not pick for the
    user), and nesting deeper than MAX_DEPTH.
    """
    text = _blank_ends(text)
    if not text:
        return {}
    try:
        document = json.loads(text, object_pairs_hook=_reject_duplicates, parse_constant=_refuse_constant,
                              parse_float=_finite_float, parse_int=_float_range_int)
    except json.JSONDecodeError as error:
        raise DaemonJsonError("%s is not valid JSON: %s at line %d, column %d (character %d); fix it or "
                              "remove it, it was left untouched"
                              % (path, error.msg, error.lineno, error.colno, error.pos)) from error
    except _BadNumber as error:
        line, column = _line_and_column(text, error.literal)
        raise DaemonJsonError("%s: %s at line %d, column %d is not a number dockerd can read (it reads numbers "
                              "as 64-bit floats: finite, at most about 1.8e308) and dockerd refuses the file. Fix "
                              "it; the file was left untouched" % (path, error.literal[:40], line, column)) from None
    except RecursionError:
        raise DaemonJsonError("%s nests arrays or objects deeper than Python's parser goes; no daemon.json "
                              "needs more than a few levels. Fix it; the file was left untouched" % path) from None
    except ValueError as error:
        raise DaemonJsonError("%s: %s. dockerd starts with it and uses one of the values, but rewriting the file "
                              "would mean choosing one for you: keep one of them; the file was left untouched"
                              % (path, error)) from error
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise DaemonJsonError("%s holds a JSON %s at the top level, but daemon.json must be an object "
                              "({...}); the file was left untouched" % (path, json_kind(document)))
    if depth(document) > MAX_DEPTH:
        raise DaemonJsonError("%s nests arrays or objects more than %d levels deep, more than this module "
                              "reads; no daemon.json setting needs more than four. Fix it; the file was left "
                              "untouched" % (path, MAX_DEPTH))
    return document


def canonical(document):
    """A text equal for two documents exactly when JSON says they are equal.

    Python says ``1 == True`` and ``1 == 1.0``; JSON (and dockerd) do not, so
    comparisons go through this instead of ``==``. Object key order does not count.
    """
    return json.dumps(document, sort_keys=True, ensure_ascii=True)


def _contradictions(runtime_path, runtime_args, default_runtime, settings):
    """What ``settings`` asks that the module's own options ask otherwise."""
    found = []
    if "default-runtime" in settings:
        wanted = settings["default-runtime"]
        if default_runtime is True and wanted != RUNTIME_NAME:
            found.append("settings sets default-runtime to %s, but default_runtime is true (nvidia): set "
                         "default_runtime: false (or null) to choose another default" % json.dumps(wanted))
        elif default_runtime is False and wanted == RUNTIME_NAME:
            found.append("settings sets default-runtime to nvidia, but default_runtime is false: set "
                         "default_runtime: true instead")
    nvidia = (settings.get("runtimes") or {}).get(RUNTIME_NAME) if isinstance(settings.get("runtimes"), dict) else None
    if isinstance(nvidia, dict):
        if "path" in nvidia and nvidia["path"] != runtime_path:
            found.append("settings sets runtimes.nvidia.path to %s, but runtime_path is %s: set runtime_path "
                         "instead" % (json.dumps(nvidia["path"]), runtime_path))
        if "runtimeArgs" in nvidia and canonical(nvidia["runtimeArgs"]) != canonical(list(runtime_args)):
            found.append("settings sets runtimes.nvidia.runtimeArgs to %s, but runtime_args is %s: set "
                         "runtime_args instead" % (json.dumps(nvidia["runtimeArgs"]), json.dumps(list(runtime_args))))
    return found


def merge(document, runtime_path, runtime_args, default_runtime, settings):
    """The daemon.json document with the nvidia runtime and ``settings`` merged in.

    Every key that is not ``runtimes.nvidia.path``, ``runtimes.nvidia.runtimeArgs``,
    ``default-runtime`` or in ``settings`` is kept as it was. ``default_runtime``
    True makes nvidia the default; False removes ``default-runtime`` only when it
    names nvidia; None leaves it alone. ``settings`` merge deeply: objects key by
    key, lists and scalars replace. Settings that contradict the other options raise
    DaemonJsonError rather than lose silently.
    """
    problems = _contradictions(runtime_path, runtime_args, default_runtime, settings or {})
    if problems:
        raise DaemonJsonError("; ".join(problems) + "; nothing was written")
    merged = deep_merge(document, settings or {})
    runtimes = merged.get("runtimes")
    if runtimes is None:
        runtimes = merged["runtimes"] = {}
    elif not isinstance(runtimes, dict):
        raise DaemonJsonError("runtimes is a JSON %s, but Docker expects an object of runtimes; "
                              "fix it in daemon.json first" % json_kind(runtimes))
    nvidia = runtimes.get(RUNTIME_NAME)
    if nvidia is not None and not isinstance(nvidia, dict):
        raise DaemonJsonError("runtimes.nvidia is a JSON %s, but Docker expects an object (the runtime's path and "
                              "arguments) and refuses the file as it is; fix it or remove it in daemon.json first"
                              % json_kind(nvidia))
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
    """The file's new text: the previous file's indentation (default 4 spaces), a final newline.

    Text stays as it was written (UTF-8, not escaped), except lone surrogates: a file may
    spell one as an escape (``"\\udc80"``), which UTF-8 cannot encode, so it is written back
    as that escape.
    """
    indent = 4
    match = re.search(r"^([ \t]+)\S", previous_text, re.MULTILINE)
    if match:
        indent = match.group(1) if "\t" in match.group(1) else len(match.group(1))
    text = json.dumps(document, indent=indent, ensure_ascii=False) + "\n"
    return re.sub("[\ud800-\udfff]", lambda lone: "\\u%04x" % ord(lone.group()), text)


def validation_verdict(rc, output):
    """What ``dockerd --validate --config-file FILE`` said: (True, None) accepted, (None, why) it cannot
    tell (a dockerd before Docker 23, or it did not finish), (False, dockerd's message) refused."""
    text = " ".join(output.split())
    if rc == 0:
        return True, None
    if NO_VALIDATE_FLAG in text:
        return None, "this dockerd has no --validate (Docker 23 added it)"
    if rc == 124:
        return None, "dockerd --validate did not finish within the time allowed"
    # "unable to configure the Docker daemon with file FILE: REASON": the temporary file's name says nothing
    reason = re.sub(r"^.*?unable to configure the Docker daemon with file \S+: ", "", text)
    return False, reason or "dockerd --validate failed (exit status %d) and printed nothing" % rc


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


def dockerd_flags(files):
    """{daemon.json key: "file: flag"} for the flags of dockerd's effective ExecStart."""
    exec_start, environment, source = [], {}, None
    for path in files:
        for key, value in unit_lines(path):
            if key == "ExecStart":
                if value:
                    exec_start, source = [value], path
                else:
                    exec_start, source = [], None   # an empty ExecStart= resets the list
            elif key == "EnvironmentFile":
                environment.update(environment_file(value.lstrip("-")))
            elif key == "Environment":
                for assignment in shlex.split(value):
                    if "=" in assignment:
                        name, _sep, assigned = assignment.partition("=")
                        environment[name] = assigned
    flags = {}
    for command in exec_start:
        expanded = re.sub(r"\$\{?(\w+)\}?", lambda m: environment.get(m.group(1), ""), command.lstrip("-@+!:"))
        words = shlex.split(expanded)[1:]
        for index, word in enumerate(words):
            if not word.startswith("-") or word == "-":
                continue
            name, has_value, value = word.lstrip("-").partition("=")
            key = _FLAG_KEYS.get(name, name)
            if key == "runtimes":
                # dockerd merges --add-runtime with the file's runtimes: only a runtime defined in
                # both places is a conflict. The flag's value is name=path.
                value = value if has_value else (words[index + 1] if index + 1 < len(words) else "")
                key = "runtimes.%s" % value.partition("=")[0]
            flags.setdefault(key, "%s: %s" % (source, word.split("=", 1)[0]))
    return flags


def conflicts(document, flags):
    """daemon.json keys that dockerd also gets as flags (Docker then refuses to start).

    ``runtimes`` is the one key dockerd merges with its flags; there, a runtime defined in
    both places (``runtimes.<name>``) is the conflict.
    """
    found = []
    for key in document:
        if key == "runtimes" and isinstance(document[key], dict):
            found.extend(("runtimes.%s" % name, flags["runtimes.%s" % name]) for name in document[key]
                         if "runtimes.%s" % name in flags)
        elif key in flags:
            found.append((key, flags[key]))
    return sorted(found)
