"""Writes each role's variables, from its meta/argument_specs.yml, into docs/roles/<role>.md.

The table sits between two markers at the end of the page; the rest of the page is prose kept by
hand. A page with the series markers gets, between them, the table of the DCGM series the agent
serves, from plugins/module_utils/nvml/series.py. With --check nothing is written, and the exit
status is 1 when a page is not current.

    tools/role_docs.py [--check]
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
BEGIN = "<!-- variables: written by tools/role_docs.py from meta/argument_specs.yml; do not edit -->"
END = "<!-- end of variables -->"
SERIES_BEGIN = "<!-- series: written by tools/role_docs.py from plugins/module_utils/nvml/series.py; do not edit -->"
SERIES_END = "<!-- end of series -->"
SERIES_FILE = ROOT / "plugins" / "module_utils" / "nvml" / "series.py"


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


def series_table():
    """The series table's rows as a Markdown table (the module holds data only: it is loaded from its file)."""
    spec = importlib.util.spec_from_file_location("scv_gpu_series", SERIES_FILE)
    series = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(series)
    lines = [SERIES_BEGIN, "", "| series | card fact | NVML source | read | help |", "| --- | --- | --- | --- | --- |"]
    for row in series.SERIES:
        fact = ".".join(row.fact)
        unit = "".join(" %s %d" % (sign, number) for sign, number in zip("×÷", row.scale or ()) if number != 1)
        lines.append("| `%s` | `%s`%s | `%s` | %s | %s |" % (
            row.name, fact, unit, row.source, series.CADENCES[row.cadence], _text(row.help)))
    return "\n".join(lines + ["", SERIES_END])


def render(page, role):
    text = page.read_text() if page.exists() else "# The `%s` role\n" % role
    head = text.split(BEGIN)[0].rstrip("\n") + "\n\n"
    if SERIES_BEGIN in head:
        before, rest = head.split(SERIES_BEGIN, 1)
        head = before + series_table() + rest.split(SERIES_END, 1)[1]
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
