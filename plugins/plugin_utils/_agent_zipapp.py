# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The Scv agent as one zipapp, built from the collection's own files (private to the collection).

The files are not listed anywhere: ``import_closure`` follows the agent's imports of
``ansible_collections.scv.gpu`` (at any depth, inside functions too) from its entry module,
so the archive holds exactly what the agent imports and cannot drift from the code. Third-party
imports (pynvml, PyYAML) come from the host's virtual environment.

The archive is reproducible: the same sources give the same bytes, so the role copies it
again only when the code changed.

    python -m ansible_collections.scv.gpu.plugins.plugin_utils._agent_zipapp OUT.pyz
"""

from __future__ import annotations

import ast
import hashlib
import io
import os
import sys
import zipfile

PACKAGE = "ansible_collections.scv.gpu"
ENTRY_MODULE = PACKAGE + ".plugins.module_utils.agent.main"
MAIN = (
    "# The scv-gpu-agent zipapp, built by the scv.gpu collection.\n"
    "import sys\n"
    "from %s import main\n"
    "sys.exit(main())\n" % ENTRY_MODULE
)
# 1980-01-01, the earliest time a zip entry holds: no build time in the archive.
FIXED_TIME = (1980, 1, 1, 0, 0, 0)


def collection_root():
    """The folder that holds galaxy.yml/MANIFEST.json: three levels above this file."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _module_file(root, module):
    """The source file of ``module`` (a name under PACKAGE) in the collection at ``root``; None if none."""
    relative = module[len(PACKAGE):].lstrip(".").split(".")
    base = os.path.join(root, *relative) if relative != [""] else root
    for candidate in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(candidate):
            return candidate
    return None


def _imported(tree):
    """Every module name under PACKAGE that ``tree`` imports, with ``from X import name`` also as X.name."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update("%s.%s" % (node.module, alias.name) for alias in node.names)
    return {name for name in names if name == PACKAGE or name.startswith(PACKAGE + ".")}


def import_closure(root=None, entry=ENTRY_MODULE):
    """{module name: source path} of ``entry`` and everything under PACKAGE it imports, transitively."""
    root = root or collection_root()
    found, pending = {}, [entry]
    while pending:
        module = pending.pop()
        if module in found:
            continue
        path = _module_file(root, module)
        if path is None:
            if module == entry:
                raise FileNotFoundError("no source for %s under %s" % (entry, root))
            continue  # ``from package import name`` where name is not a module
        found[module] = path
        with open(path, "rb") as handle:
            tree = ast.parse(handle.read(), filename=path)
        pending.extend(_imported(tree) - set(found))
    return found


def build(root=None):
    """The zipapp's bytes."""
    closure = import_closure(root)
    entries = {}
    for module, path in closure.items():
        archive_path = module.replace(".", "/") + (".py" if not path.endswith("__init__.py") else "/__init__.py")
        with open(path, "rb") as handle:
            entries[archive_path] = handle.read()
    # Regular packages (an empty __init__.py each), so that nothing outside the archive can
    # add to, or shadow, ansible_collections.scv.gpu on the node.
    for archive_path in list(entries):
        parts = archive_path.split("/")[:-1]
        for depth in range(1, len(parts) + 1):
            entries.setdefault("/".join(parts[:depth]) + "/__init__.py", b"")
    entries["__main__.py"] = MAIN.encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for archive_path in sorted(entries):
            info = zipfile.ZipInfo(archive_path, date_time=FIXED_TIME)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, entries[archive_path], compresslevel=9)
    return buffer.getvalue()


def write(destination, root=None):
    """Writes the zipapp to ``destination`` (atomically); returns its SHA-256."""
    data = build(root)
    staged = "%s.tmp-%d" % (destination, os.getpid())
    with open(staged, "wb") as handle:
        handle.write(data)
    os.replace(staged, destination)
    return hashlib.sha256(data).hexdigest()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.stderr.write("usage: python -m %s OUT.pyz\n" % __name__)
        return 2
    print("%s  %s" % (write(argv[0]), argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
