"""Writes each role's variables, from its meta/argument_specs.yml, into docs/roles/<role>.md.

The table sits between two markers at the end of the page; the rest of the page is prose kept by
hand. With --check nothing is written, and the exit status is 1 when a page is not current.

    tools/role_docs.py [--check]
"""

from __future__ import annotations

import pathlib
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
BEGIN = "<!-- variables: written by tools/role_docs.py from meta/argument_specs.yml; do not edit -->"
END = "<!-- end of variables -->"


def _text(value):
    if isinstance(value, list):
        value = " ".join(str(item) for item in value)
    return " ".join(str(value).split()).replace("|", "\\|")


def _default(option):
    if "default" not in option:
        return "" if option.get("required") else "(unset)"
    value = option["default"]
    return "`%s`" % (yaml.safe_dump(value, default_flow_style=True, width=1000).strip().removesuffix("...").strip()
                     if not isinstance(value, str) or value == "" else value) if value != "" else '`""`'


def table(role):
    spec = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    lines = [BEGIN, "", "## Variables", ""]
    for entry_point, entry in spec.items():
        if len(spec) > 1:
            lines += ["### Entry point `%s`" % entry_point, ""]
        lines += [_text(entry.get("short_description", "")), "", "| variable | type | default | description |",
                  "| --- | --- | --- | --- |"]
        for name, option in sorted((entry.get("options") or {}).items()):
            kind = option.get("type", "str")
            if kind == "list" and option.get("elements"):
                kind = "list of %s" % option["elements"]
            choices = " One of: %s." % ", ".join("`%s`" % choice for choice in option["choices"]) \
                if option.get("choices") else ""
            required = " Required." if option.get("required") else ""
            description = _text(option.get("description", ""))
            lines.append("| `%s` | %s | %s | %s%s%s |" % (name, kind, _default(option), description, choices, required))
        lines.append("")
    lines.append(END)
    return "\n".join(lines) + "\n"


def render(page, role):
    text = page.read_text() if page.exists() else "# The `%s` role\n" % role
    head = text.split(BEGIN)[0].rstrip("\n") + "\n\n"
    return head + table(role)


def main(argv):
    check = "--check" in argv
    stale = []
    for role in sorted(path.name for path in (ROOT / "roles").iterdir() if (path / "meta" / "argument_specs.yml").exists()):
        page = ROOT / "docs" / "roles" / ("%s.md" % role)
        wanted = render(page, role)
        if not page.exists() or page.read_text() != wanted:
            stale.append(str(page.relative_to(ROOT)))
            if not check:
                page.write_text(wanted)
    if check and stale:
        sys.stderr.write("not current (run tools/role_docs.py): %s\n" % ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
