"""The scv_agent role's limits, types, defaults and pins have one home each: the agent's OPTIONS and the
role's files/requirements.txt. tools/scv_agent_role.py writes the role's copies; these tests fail when a
copy is not current."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import yaml

from ansible_collections.scv.gpu.plugins.module_utils.agent import config

ROOT = pathlib.Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "scv_agent"


def _option(variable):
    name = variable.removeprefix("scv_agent_").replace("_", "-")
    return next(option for option in config.OPTIONS if option[0] == name)


def test_the_roles_copies_are_current():
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "scv_agent_role.py"), "--check"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_the_role_checks_every_bounded_setting_of_the_agent_with_the_agents_own_bounds():
    limits = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["scv_agent_limits"]
    bounded = {option[0]: option[1] for option in config.OPTIONS if hasattr(option[1], "minimum")}
    assert {_option(limit["name"])[0] for limit in limits} == set(bounded)
    for limit in limits:
        convert = bounded[_option(limit["name"])[0]]
        assert (limit["low"], limit["high"]) == (convert.minimum, convert.maximum), limit["name"]
        assert limit["value"].startswith("{{ %s " % limit["name"])


def test_the_argument_specs_and_defaults_say_what_the_agent_takes():
    options = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    for limit in yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["scv_agent_limits"]:
        variable = limit["name"]
        _name, convert, default, _reloadable, _help = _option(variable)
        spec = options[variable]
        assert spec["type"] == convert.kind.__name__, variable
        assert "From %s to %s %s" % (limit["low"], limit["high"], limit["unit"]) in spec["description"][-1]
        if "default" in spec:
            assert spec["default"] == default == defaults[variable], variable
    assert options["scv_agent_log_level"]["choices"] == list(config.LOG_LEVELS)
    assert options["scv_agent_log_level"]["default"] == defaults["scv_agent_log_level"] == _option("log_level")[2]


def test_the_argument_spec_shows_the_pins_of_the_requirements_file():
    pins = [line.split("#")[0].strip() for line in (ROLE / "files" / "requirements.txt").read_text().splitlines()
            if line.split("#")[0].strip()]
    options = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    assert options["scv_agent_python_packages"]["default"] == pins
    assert {"nvidia-ml-py", "PyYAML", "bcrypt"} == {pin.split("==")[0] for pin in pins}
    assert "requirements.txt" in (ROLE / "defaults" / "main.yml").read_text()
