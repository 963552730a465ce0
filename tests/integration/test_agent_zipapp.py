"""The agent's zipapp runs with nothing but the standard library and the role's packages (nvidia-ml-py, PyYAML,
and bcrypt where a web config names users): no Prometheus client, no HTTP/2 library."""

from __future__ import annotations

import json
import pathlib
import subprocess
import zipfile

from harness.paths import AGENT_ROLE, SIMULATOR_DIR, scenario_path

# Imports every module in the archive, then reports every module loaded from outside the standard library.
PROBE = r"""
import importlib, json, sys, sysconfig, zipfile
archive = sys.argv[1]
sys.path.insert(0, archive)
for name in zipfile.ZipFile(archive).namelist():
    if name.endswith(".py") and name != "__main__.py":
        importlib.import_module(name[:-3].replace("/", ".").removesuffix(".__init__"))
stdlib = {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib")}
outside = {}
for module in list(sys.modules.values()):
    path = getattr(module, "__file__", None)
    if path and not any(path.startswith(prefix) for prefix in stdlib):
        outside[module.__name__] = path
print(json.dumps(outside))
"""


# The distributions named, and every one they require (extras left out), from the environment's metadata.
REQUIRED = r"""
import importlib.metadata, json, re, sys
todo, seen = list(sys.argv[1:]), set()
while todo:
    name = todo.pop()
    if name.lower() in seen:
        continue
    seen.add(name.lower())
    for requirement in importlib.metadata.requires(name) or []:
        if "extra ==" not in requirement:
            todo.append(re.split(r"[ ;<>=!~\[(]", requirement, maxsplit=1)[0])
print(json.dumps(sorted(seen)))
"""


def test_every_module_in_the_archive_imports_with_only_the_roles_packages(agent_command):
    python, archive = agent_command
    done = subprocess.run([python, "-I", "-c", PROBE, archive], capture_output=True, text=True, check=False,
                          env={"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(SIMULATOR_DIR)})
    assert done.returncode == 0, done.stderr
    outside = json.loads(done.stdout)
    ours = {name for name, path in outside.items() if path.startswith(archive + "/")}
    assert ours == {name[:-3].replace("/", ".").removesuffix(".__init__")
                    for name in zipfile.ZipFile(archive).namelist() if name.endswith(".py") and name != "__main__.py"}
    others = {name.split(".")[0] for name in set(outside) - ours}
    assert others <= {"pynvml", "yaml", "_yaml"}, others

    installed = subprocess.run([str(pathlib.Path(python).parent / "pip"), "list", "--format=json"],
                               capture_output=True, text=True, check=True).stdout

    def normal(name):
        return name.lower().replace("_", "-")
    listed = [line.split("==")[0] for line in
              [pin for pin in (line.split("#")[0].strip() for line in (AGENT_ROLE / "files" / "requirements.txt").read_text().splitlines()) if pin]]
    # the role's packages and what they require, and nothing else: no HTTP/2 or HPACK library
    closure = subprocess.run([python, "-I", "-c", REQUIRED] + listed, capture_output=True, text=True, check=True)
    wanted = {normal(name) for name in json.loads(closure.stdout)}
    assert not {"h2", "hpack", "hyperframe", "prometheus-client"} & wanted
    assert {normal(package["name"]) for package in json.loads(installed)} - {"pip", "setuptools"} == wanted


def test_the_archive_runs_as_the_service_does(agent_command):
    done = subprocess.run(agent_command + ["--help"], capture_output=True, text=True, check=False,
                          env={"PATH": "/usr/bin:/bin", "NVMLSIM_CONFIG": str(scenario_path("titan_xp"))})
    assert done.returncode == 0, done.stderr
    assert "--kubeconfig" in done.stdout and "--request-timeout" in done.stdout
