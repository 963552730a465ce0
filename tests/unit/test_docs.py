"""The documentation stands on its own and stays current: the README's sections, the roles' pages."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_every_role_page_lists_the_variables_its_argument_spec_has():
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "role_docs.py"), "--check"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    for role in (ROOT / "roles").iterdir():
        assert (ROOT / "docs" / "roles" / ("%s.md" % role.name)).exists(), role.name


def test_the_readme_has_the_sections_collection_users_look_for_and_stays_a_readme():
    readme = (ROOT / "README.md").read_text()
    sections = re.findall(r"^## (.+)$", readme, re.M)
    for wanted in ("Included content", "Requirements", "Installing", "Testing", "Contributing", "Release notes",
                   "License"):
        assert wanted in sections
    assert readme.count("\n") <= 300


def test_every_local_link_in_the_docs_leads_somewhere():
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), "%s links to %s" % (page.relative_to(ROOT), target)


def test_the_collections_docs_do_not_lean_on_notes_outside_it():
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        assert "../shared" not in page.read_text(), page


# Where a file of this repository is named in backticks: `plugins/...`, `tests/...`, and so on.
_TOP = ("plugins", "roles", "tests", "tools", "docs", "benchmarks", "playbooks", "extensions", "changelogs",
        "meta", ".ci")


def _named_paths(text):
    for name in re.findall(r"`([^`\s]+)`", text):
        name = name.rstrip(".,:;")
        if name.split("/")[0] in _TOP and "/" in name and not re.search(r"[<>*{}$|]", name):
            yield name


def test_every_file_the_docs_name_exists():
    missing = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for name in _named_paths(page.read_text()):
            if not (ROOT / name).exists() and not list((ROOT / "roles").glob("*/" + name)):   # a role's own file
                missing.append("%s names %s" % (page.relative_to(ROOT), name))
    assert not missing, "\n".join(missing)
