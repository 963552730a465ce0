# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The top-level ``version`` and ``imports`` of a containerd config, read without a TOML parser.

This file is private to the collection (see docs/architecture.md). A managed host older than Python
3.11 has no ``tomllib``; what a read-only module must find there to follow containerd's imports is
only these two keys, which sit before the first table. Their values are read as TOML writes them:
an integer, and an array of basic ("...") or literal ('...') strings, over several lines, with
comments and a trailing comma. Anything else under these keys is refused; the other keys are not
read at all (whoever reads the texts parses them whole).
"""

from __future__ import annotations

import json
import re

_KEY = re.compile(r"""^\s*(?:(version|imports)|"(version|imports)"|'(version|imports)')\s*=\s*""")
_TABLE = re.compile(r"^\s*\[")
_INTEGER = re.compile(r"^([+-]?\d+)\s*(?:#.*)?$")
_FLOAT = re.compile(r"^([+-]?\d+\.\d+)\s*(?:#.*)?$")
_COMMENT = re.compile(r"^\s*(?:#.*)?$")
_BASIC = re.compile(r'"((?:[^"\\\n]|\\.)*)"')
_LITERAL = re.compile(r"'([^'\n]*)'")


class TomlKeysError(ValueError):
    """The keys' values are not what this reader reads."""


def top_level_keys(text):
    """{"version": int, "imports": [str]} as far as ``text`` sets them before its first table."""
    found = {}
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        if _TABLE.match(line):
            break
        match = _KEY.match(line)
        index += 1
        if not match:
            continue
        key = next(group for group in match.groups() if group)
        rest = line[match.end():]
        if key == "version":
            found["version"] = _version(rest.strip())
            continue
        values, closed = _scan(rest)
        while not closed and index < len(lines):     # the array goes on over the next lines
            rest += "\n" + lines[index]
            index += 1
            values, closed = _scan(rest)
        if not closed:
            raise TomlKeysError("imports = %s is not an array of strings" % rest.strip())
        found["imports"] = values
    return found


def _version(text):
    """An integer; a string or a float as such, for the caller to refuse in its own words."""
    for pattern, kind in ((_INTEGER, int), (_FLOAT, float)):
        number = pattern.match(text)
        if number:
            return kind(number.group(1))
    for pattern in (_BASIC, _LITERAL):
        string = pattern.match(text)
        if string and _COMMENT.match(text[string.end():]):
            return string.group(1)
    raise TomlKeysError("version = %s is not an integer" % text)


def _basic(body):
    """A basic string's value: TOML's escapes are JSON's, but for \\U and \\e, which this reader refuses."""
    try:
        return json.loads('"%s"' % body)
    except ValueError as error:
        raise TomlKeysError("imports holds a string this reader cannot read: \"%s\"" % body) from error


def _scan(text):
    """([strings], whether the array ended) of an array of strings written at the start of ``text``."""
    position = len(text) - len(text.lstrip())
    if not text.startswith("[", position):
        raise TomlKeysError("imports = %s is not an array" % text.strip())
    position += 1
    values, expect_value = [], True
    while position < len(text):
        char = text[position]
        if char in " \t\r\n":
            position += 1
        elif char == "#":
            newline = text.find("\n", position)
            position = len(text) if newline < 0 else newline
        elif char == "]":
            return values, True
        elif char == "," and not expect_value:
            expect_value, position = True, position + 1
        elif char in "\"'" and expect_value:
            match = (_BASIC if char == '"' else _LITERAL).match(text, position)
            if not match:
                raise TomlKeysError("imports holds a string this reader cannot read: %s" % text.strip())
            values.append(_basic(match.group(1)) if char == '"' else match.group(1))
            expect_value, position = False, match.end()
        else:
            raise TomlKeysError("imports = %s is not an array of strings" % text.strip())
    return values, False
