# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""systemd unit files as systemd finds and reads them: search path, drop-ins, [Service] keys (private)."""

from __future__ import annotations

import glob
import os
import shlex

# systemd's unit search path for the system manager, in its order of precedence.
UNIT_DIRS = ("/etc/systemd/system", "/run/systemd/system", "/usr/local/lib/systemd/system",
             "/usr/lib/systemd/system", "/lib/systemd/system")


def unit_lines(path):
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


def environment_file(path):
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


def unit_files(unit="docker.service", search_paths=UNIT_DIRS):
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
