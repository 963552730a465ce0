"""Writes the scv_agent role's copies of facts whose home is elsewhere, so that they cannot drift.

- The agent's limits: the bounds, types and defaults of the agent's numeric settings, and its log
  levels, come from OPTIONS in plugins/module_utils/agent/config.py. They go into the role's
  vars/main.yml (the range check of tasks/main.yml), its defaults/main.yml and its
  meta/argument_specs.yml (type, default, choices and a "From LOW to HIGH UNIT." line).
- The agent's pinned packages come from the role's files/requirements.txt, which `make
  agent-wheels` reads too; they go into the argument spec's default of scv_agent_python_packages.

With --check nothing is written, and the exit status is 1 when a file is not current.
tools/role_docs.py then writes docs/roles/scv_agent.md from the argument specs.

    tools/scv_agent_role.py [--check]
"""

from __future__ import annotations

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
ROLE = ROOT / "roles" / "scv_agent"
REQUIREMENTS = ROLE / "files" / "requirements.txt"
HEADER = ("# Written by tools/scv_agent_role.py from the agent's OPTIONS (plugins/module_utils/agent/config.py);\n"
          "# do not edit: change the agent's bounds there and run the tool again.\n")

# Each bounded setting of the agent, as the role's variable and the unit its messages name.
LIMITS = (
    ("scv_agent_default_interval", "default-interval", "milliseconds"),
    ("scv_agent_watch_timeout", "watch-timeout", "seconds"),
    ("scv_agent_request_timeout", "request-timeout", "seconds"),
    ("scv_agent_api_qps", "api-qps", "requests a second"),
    ("scv_agent_api_burst", "api-burst", "requests"),
    ("scv_agent_counters_interval", "counters-interval", "seconds"),
    ("scv_agent_static_refresh", "static-refresh", "seconds"),
    ("scv_agent_xid_hold", "xid-hold", "seconds"),
    ("scv_agent_pod_resources_interval", "pod-resources-interval", "seconds"),
)
# Unset, the role leaves these to the agent's default (the argument spec has no default).
OPTIONAL = ("scv_agent_default_interval",)


def _agent_config():
    sys.path.insert(0, str(ROOT / "build" / "collections"))
    try:
        from ansible_collections.scv.gpu.plugins.module_utils.agent import config
    except ImportError as error:
        raise SystemExit("cannot import the agent's config (%s): run make collection first" % error)
    return config


def _number(value):
    return str(int(value)) if float(value).is_integer() else repr(value)


def limits():
    """[(variable, low, high, unit, kind, default)] from OPTIONS; every bounded option has its variable."""
    config = _agent_config()
    options = {name: (convert, default) for name, convert, default, _reloadable, _help in config.OPTIONS}
    bounded = {name for name, (convert, _default) in options.items() if hasattr(convert, "minimum")}
    mapped = {option for _variable, option, _unit in LIMITS}
    if bounded != mapped:
        raise SystemExit("the agent's bounded options %s and the role's LIMITS %s differ: add or remove the role's "
                         "variable in tools/scv_agent_role.py" % (sorted(bounded), sorted(mapped)))
    found = []
    for variable, option, unit in LIMITS:
        convert, default = options[option]
        found.append((variable, convert.minimum, convert.maximum, unit, convert.kind.__name__, default))
    return found, config.LOG_LEVELS, options["log-level"][1]


def packages():
    """The requirement lines of files/requirements.txt, comments left out."""
    return [line.split("#")[0].strip() for line in REQUIREMENTS.read_text().splitlines()
            if line.split("#")[0].strip()]


def vars_file(found):
    lines = ["---", HEADER.rstrip("\n"),
             "# tasks/main.yml checks these before anything changes; the agent refuses the same values at start.",
             "scv_agent_limits:"]
    for variable, low, high, unit, _kind, _default in found:
        if variable in OPTIONAL:   # left out of the check while unset
            value, given = "{{ %s | default(none) }}" % variable, '"{{ %s is defined }}"' % variable
        else:
            value, given = "{{ %s }}" % variable, "true"
        lines += ["  - name: %s" % variable, '    value: "%s"' % value, "    given: %s" % given,
                  "    low: %s" % _number(low), "    high: %s" % _number(high), "    unit: %s" % unit]
    return "\n".join(lines) + "\n"


def _block(lines, variable):
    """The first and last index of the option's lines in the argument specs."""
    start = lines.index("      %s:" % variable)
    end = start + 1
    while end < len(lines) and (lines[end].startswith("       ") or not lines[end].strip()):
        end += 1
    return start, end


def _set(lines, start, end, key, text, variable):
    for index in range(start, end):
        if lines[index].startswith("        %s:" % key):
            lines[index] = "        %s: %s" % (key, text)
            return
    raise SystemExit("roles/scv_agent/meta/argument_specs.yml: %s has no %s line" % (variable, key))


def argument_specs(text, found, levels, level_default, pinned):
    lines = text.split("\n")
    for variable, low, high, unit, kind, default in found:
        start, end = _block(lines, variable)
        bounds = [index for index in range(start, end) if re.match(r"^          - From \S+ to \S+ ", lines[index])]
        if len(bounds) != 1:
            raise SystemExit("roles/scv_agent/meta/argument_specs.yml: %s's description needs one item "
                             "'- From LOW to HIGH UNIT.'" % variable)
        line = "          - From %s to %s %s" % (_number(low), _number(high), unit)
        if variable in OPTIONAL:
            line += "; unset, the agent's default (%s)" % _number(default)
        lines[bounds[0]] = line + "."
        _set(lines, start, end, "type", kind, variable)
        if variable not in OPTIONAL:
            _set(lines, start, end, "default", _number(default), variable)
    start, end = _block(lines, "scv_agent_log_level")
    _set(lines, start, end, "choices", "[%s]" % ", ".join(levels), "scv_agent_log_level")
    _set(lines, start, end, "default", level_default, "scv_agent_log_level")
    start, end = _block(lines, "scv_agent_python_packages")
    _set(lines, start, end, "default", "[%s]" % ", ".join(pinned), "scv_agent_python_packages")
    return "\n".join(lines)


def defaults(text, found, level_default):
    for variable, _low, _high, _unit, _kind, default in found:
        prefix = "# " if variable in OPTIONAL else ""
        text, count = re.subn(r"(?m)^%s%s: .*$" % (re.escape(prefix), variable),
                              "%s%s: %s" % (prefix, variable, _number(default)), text)
        if count != 1:
            raise SystemExit("roles/scv_agent/defaults/main.yml: expected one line '%s%s: ...'" % (prefix, variable))
    text, count = re.subn(r"(?m)^scv_agent_log_level: .*$", "scv_agent_log_level: %s" % level_default, text)
    if count != 1:
        raise SystemExit("roles/scv_agent/defaults/main.yml: expected one line 'scv_agent_log_level: ...'")
    return text


def main(argv):
    check = "--check" in argv
    found, levels, level_default = limits()
    pinned = packages()
    wanted = {
        ROLE / "vars" / "main.yml": lambda _text: vars_file(found),
        ROLE / "meta" / "argument_specs.yml": lambda text: argument_specs(text, found, levels, level_default, pinned),
        ROLE / "defaults" / "main.yml": lambda text: defaults(text, found, level_default),
    }
    stale = []
    for path, render in wanted.items():
        current = path.read_text() if path.exists() else ""
        text = render(current)
        if text != current:
            stale.append(str(path.relative_to(ROOT)))
            if not check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    if check and stale:
        sys.stderr.write("not current (run tools/scv_agent_role.py, then tools/role_docs.py): %s\n"
                         % ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
