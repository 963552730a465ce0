"""Ansible's own commands, run against localhost from one virtual environment per ansible-core line.

SCV_GPU_ANSIBLE_VENVS lists the environments (``make integration`` passes one at a time: the newest
line for every test, then ansible-core 2.19 for the tests marked ``every_ansible_line``); without
it, the environment running pytest.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

from harness.paths import COLLECTIONS, ROOT, SIMULATOR_DIR, scenario_path


def venvs():
    listed = os.environ.get("SCV_GPU_ANSIBLE_VENVS", "").split()
    return [pathlib.Path(v).absolute() for v in listed] or [pathlib.Path(sys.prefix)]


class Ansible:
    """One virtual environment's ansible commands, run against localhost."""

    def __init__(self, venv):
        self.venv = venv
        self.python = venv / "bin" / "python"
        self.version = subprocess.run(
            [str(self.python), "-c", "import ansible.release as r; print(r.__version__)"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()

    def env(self, scenario=None, simulator=True):
        env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "NVMLSIM_CONFIG")}
        env.update(ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS), ANSIBLE_NOCOWS="1", ANSIBLE_FORCE_COLOR="0",
                   ANSIBLE_LOCAL_TEMP=str(ROOT / "build" / "ansible-tmp"))
        if simulator:
            assert (SIMULATOR_DIR / "libnvidia-ml.so.1").is_file(), "build the simulator first: make simulator"
            env["LD_LIBRARY_PATH"] = str(SIMULATOR_DIR)
        if scenario:
            # a name among the shipped scenarios, or the path of a copy a test may change
            env["NVMLSIM_CONFIG"] = str(scenario if isinstance(scenario, pathlib.Path) else scenario_path(scenario))
        return env

    def module(self, args=None, scenario=None, simulator=True, check=False, interpreter=None,
               name="scv.gpu.gpu_facts", diff=False):
        """Runs a module ad hoc on localhost; returns (succeeded, result)."""
        command = [
            str(self.venv / "bin" / "ansible"), "localhost", "-i", "localhost,", "-c", "local",
            "-m", name,
            "-e", "ansible_python_interpreter=%s" % (interpreter or self.python),
        ]
        if args:
            command += ["-a", json.dumps(args)]
        if check:
            command.append("--check")
        if diff:
            command.append("--diff")
        done = subprocess.run(command, env=self.env(scenario, simulator), capture_output=True, text=True, check=False)
        self.last_output = done.stdout + done.stderr
        head, sep, payload = done.stdout.partition(" => ")
        assert sep, "unexpected ansible output:\n%s\n%s" % (done.stdout, done.stderr)
        result, _end = json.JSONDecoder().raw_decode(payload)
        return head.rsplit("\n", 1)[-1].endswith(("SUCCESS", "CHANGED")), result

    def modules(self, calls, directory, scenario=None, simulator=True):
        """Runs several module calls as the tasks of one play on localhost (one ansible-playbook start instead of
        one ad hoc run each); returns (succeeded, result) for each (module name, args) of ``calls``, in order."""
        directory = pathlib.Path(directory)
        results = directory / "module-results.json"
        tasks = [{"name": "call %d" % index, module: args, "register": "call_%d" % index, "ignore_errors": True}
                 for index, (module, args) in enumerate(calls)]
        everything = "[%s]" % ", ".join("call_%d" % index for index in range(len(calls)))
        tasks.append({"name": "results", "ansible.builtin.copy": {
            "content": "{{ %s | to_json }}" % everything, "dest": str(results), "mode": "0600"}})
        play = directory / "module-calls.yml"
        play.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": tasks}]))
        done = self.playbook(play, scenario, simulator=simulator)
        self.last_output = done.stdout + done.stderr
        assert done.returncode == 0 and results.is_file(), "the calls' play failed:\n%s" % self.last_output
        return [(not result.get("failed", False), result) for result in json.loads(results.read_text())]

    def playbook(self, playbook, scenario, *extra, simulator=True, wrap=None):
        """``wrap``: turns the command into the one run (a mount namespace of a driver root's, for one)."""
        command = [
            str(self.venv / "bin" / "ansible-playbook"), "-i", "localhost,", "-c", "local",
            "-e", "ansible_python_interpreter=%s" % self.python, str(ROOT / playbook),
        ] + list(extra)
        if wrap is not None:
            command = wrap(command)
        return subprocess.run(command, env=self.env(scenario, simulator), capture_output=True, text=True, check=False)


def recap(stdout, host="localhost"):
    """The PLAY RECAP counters of one host, as ints: {'ok': 3, 'changed': 1, ...}."""
    for line in stdout.splitlines():
        name, sep, counters = line.partition(" : ")
        if sep and name.strip() == host and "ok=" in counters:
            return {key: int(value) for key, value in (item.split("=") for item in counters.split())}
    raise AssertionError("no PLAY RECAP line for %s in:\n%s" % (host, stdout))
