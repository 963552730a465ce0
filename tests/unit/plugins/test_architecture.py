"""The house rules of docs/architecture.md, checked on the code: layers, who may import the agent, sizes."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
PLUGINS = ROOT / "plugins"
UTILS = PLUGINS / "module_utils"
PREFIX = "ansible_collections.scv.gpu.plugins.module_utils."

# A package may import its own modules and those of packages in lower layers, nothing else.
LAYERS = {"common": 0, "nvml": 1, "host": 1, "kube": 1, "scv": 2, "node": 2, "agent": 3}
# What only the modules (on the controller, with kubernetes.core) use: the agent has its own client.
MODULES_ONLY = {"kube.client", "kube.module"}
MAX_FILE_LINES, MAX_CLASS_LINES, MAX_FUNCTION_LINES = 500, 200, 80


def imports(path):
    """The module_utils modules a file imports (as ``package.module``), inside functions too."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + ["%s.%s" % (node.module, alias.name) for alias in node.names]
        for name in names:
            if name.startswith(PREFIX):
                parts = name[len(PREFIX):].split(".")
                found.add(".".join(parts[:2]) if len(parts) > 1 and (UTILS / parts[0] / (parts[1] + ".py")).exists()
                          else parts[0])
    return found


def layer_violations(package, imported):
    """Why ``package`` may not import each of ``imported`` (``package.module`` names)."""
    problems = []
    for name in sorted(imported):
        other = name.split(".")[0]
        if other not in LAYERS:
            problems.append("%s imports %s, which is in no package of docs/architecture.md" % (package, name))
        elif other != package and LAYERS[other] >= LAYERS[package]:
            problems.append("%s (layer %d) imports %s (layer %d): only lower layers may be imported"
                            % (package, LAYERS[package], name, LAYERS[other]))
        elif package == "agent" and name in MODULES_ONLY:
            problems.append("agent imports %s, the modules' client: the agent has its own (kube.rest_client)" % name)
    return problems


def util_files():
    return sorted(path for path in UTILS.rglob("*.py") if path.name != "__init__.py")


def test_module_utils_holds_only_the_packages_of_the_layer_rule():
    assert sorted(path.name for path in UTILS.iterdir() if path.name != "__pycache__") == sorted(LAYERS)
    for package in LAYERS:
        assert (UTILS / package / "__init__.py").read_text() == ""   # ansible-test wants them empty


@pytest.mark.parametrize("path", util_files(), ids=lambda path: str(path.relative_to(UTILS)))
def test_each_package_imports_only_lower_layers(path):
    package = path.relative_to(UTILS).parts[0]
    assert layer_violations(package, imports(path) - {package}) == []


def test_the_rule_catches_an_upward_import_a_sibling_and_the_modules_client():
    assert layer_violations("nvml", {"agent.xid"}) == [
        "nvml (layer 1) imports agent.xid (layer 3): only lower layers may be imported"]
    assert layer_violations("kube", {"scv.resource"})
    assert layer_violations("nvml", {"host.pci"})           # siblings in one layer stay apart
    assert layer_violations("agent", {"kube.client"})
    assert layer_violations("agent", {"kube.errors", "scv.publisher", "nvml.session", "common.merge"}) == []


@pytest.mark.parametrize("path", sorted(p for p in PLUGINS.rglob("*.py") if "module_utils" not in p.parts),
                         ids=lambda path: str(path.relative_to(PLUGINS)))
def test_no_module_or_plugin_imports_the_agent(path):
    assert not [name for name in imports(path) if name.split(".")[0] == "agent"]


def oversized(path, main_allowed=False):
    source = path.read_text()
    found = []
    if source.count("\n") > MAX_FILE_LINES:
        found.append("%s: %d lines" % (path.name, source.count("\n")))
    for node in ast.walk(ast.parse(source)):
        length = getattr(node, "end_lineno", 0) - getattr(node, "lineno", 0) + 1
        if isinstance(node, ast.ClassDef) and length > MAX_CLASS_LINES:
            found.append("class %s: %d lines" % (node.name, length))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and length > MAX_FUNCTION_LINES:
            if not (main_allowed and node.name == "main"):
                found.append("function %s: %d lines" % (node.name, length))
    return found


@pytest.mark.parametrize("path", sorted(PLUGINS.rglob("*.py")), ids=lambda path: str(path.relative_to(PLUGINS)))
def test_size_limits(path):
    assert oversized(path, main_allowed=path.parent.name == "modules") == []


def test_the_size_check_can_fail(tmp_path):
    big = tmp_path / "big.py"
    big.write_text("def long():\n" + "    x = 1\n" * 90 + "\n\nclass Big:\n" + "    y = 1\n" * 201 + "\n" * 300)
    assert oversized(big) == ["big.py: 595 lines", "function long: 91 lines", "class Big: 202 lines"]
    main = tmp_path / "main.py"
    main.write_text("def main():\n" + "    x = 1\n" * 90)
    assert oversized(main, main_allowed=True) == [] and oversized(main) == ["function main: 91 lines"]


def test_the_map_names_every_module_utils_file_in_its_packages_paragraph():
    """docs/architecture.md has a paragraph per package; each file of the package is named there in backticks."""
    import re
    doc = (ROOT / "docs" / "architecture.md").read_text()
    paragraphs = {found.group(1): found.group(2) for found in re.finditer(
        r"\*\*`(\w+)`\*\* \(layer \d\)\.(.*?)(?=\n\*\*`|\n## )", doc, re.S)}
    missing = []
    for package in sorted(path for path in (ROOT / "plugins" / "module_utils").iterdir()
                          if path.is_dir() and not path.name.startswith("__")):
        text = paragraphs.get(package.name, "")
        missing += ["%s/%s" % (package.name, module.stem) for module in sorted(package.glob("*.py"))
                    if module.stem != "__init__" and "`%s`" % module.stem not in text]
    assert not missing, "docs/architecture.md does not name: %s" % ", ".join(missing)


def test_no_test_module_imports_another():
    """What tests share lives in tests/harness; a test module imported by another runs its module-level code
    twice and ties the two together."""
    found = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += ["%s imports %s" % (path.relative_to(ROOT), name) for name in names
                      if name.split(".")[-1].startswith("test_")]
    assert not found, found


def test_no_two_module_utils_files_share_a_basename():
    """A basename names one file: 'pods' in a log, a traceback or the map leaves no doubt which."""
    seen = {}
    for path in sorted((ROOT / "plugins" / "module_utils").rglob("*.py")):
        if path.stem != "__init__":
            seen.setdefault(path.stem, []).append(str(path.relative_to(ROOT)))
    assert not {name: paths for name, paths in seen.items() if len(paths) > 1}


def test_no_benchmark_edits_sys_path():
    """Benchmarks find the collection and the harness as the tests do, through PYTHONPATH (the Makefile's)."""
    editing = [str(path.relative_to(ROOT)) for path in sorted((ROOT / "benchmarks").glob("*.py"))
               if "sys.path" in path.read_text()]
    assert not editing, editing


# The one dependency rule (docs/architecture.md): what the agent may import beyond the standard library, and
# which of those only inside a function, loaded when a setting asks for it.
AGENT_PACKAGES = {"pynvml": "top", "yaml": "top", "bcrypt": "function"}


def third_party(path):
    """{top-level name: 'top' or 'function'} of what ``path`` imports outside the standard library and the
    collection; 'function' where every import of it is inside a function."""
    import sys
    tree = ast.parse(path.read_text(), filename=str(path))
    found = {}

    def visit(node, inside):
        for child in ast.iter_child_nodes(node):
            nested = inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            names = []
            if isinstance(child, ast.Import):
                names = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom) and child.module and not child.level:
                names = [child.module]
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in ("__future__", "ansible_collections"):
                    found[top] = "top" if found.get(top) == "top" or not nested else "function"
            visit(child, nested)
    visit(tree, False)
    return found


def agent_closure():
    """The module_utils files the agent runs: its package's, and every file of a lower floor they import, and so
    on down."""
    todo = sorted((UTILS / "agent").glob("*.py"))
    seen = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in imports(path):
            target = UTILS / (name.replace(".", "/") + ".py")
            if target.exists():
                todo.append(target)
    return sorted(seen)


def dependency_violations(paths, allowed):
    problems = []
    for path in paths:
        shown = path.relative_to(UTILS) if path.is_relative_to(UTILS) else path.name
        for name, where in sorted(third_party(path).items()):
            if name not in allowed:
                problems.append("%s imports %s, which the agent may not use" % (shown, name))
            elif allowed[name] == "function" and where == "top":
                problems.append("%s imports %s at load time; import it where a setting asks for it" % (shown, name))
    return problems


def test_the_agent_uses_only_the_packages_of_the_dependency_rule():
    closure = agent_closure()
    assert UTILS / "nvml" / "session.py" in closure and UTILS / "kube" / "rest_client.py" in closure
    assert dependency_violations(closure, AGENT_PACKAGES) == []
    # every package the rule allows is used: a rule wider than the code is not checked
    assert set().union(*(third_party(path) for path in closure)) == set(AGENT_PACKAGES)


def test_the_dependency_rule_catches_a_library_and_a_load_time_import(tmp_path):
    module = tmp_path / "module.py"
    module.write_text("import json\nimport prometheus_client.core\nfrom yaml import safe_load\nimport bcrypt\n\n\n"
                      "def later():\n    import pynvml\n    from . import sibling\n")
    assert third_party(module) == {"prometheus_client": "top", "yaml": "top", "bcrypt": "top", "pynvml": "function"}
    assert dependency_violations([module], AGENT_PACKAGES) == [
        "module.py imports bcrypt at load time; import it where a setting asks for it",
        "module.py imports prometheus_client, which the agent may not use"]
