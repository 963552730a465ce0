"""Runs the collection through the real ansible and ansible-playbook commands.

SCV_GPU_ANSIBLE_VENVS lists the virtual environments to test with, one per
ansible-core line (``make integration`` passes .venv and, where Python 3.11
exists beside a newer Python, .venv-ansible-2.19). Every test runs once per
environment.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from harness.agent import AgentProcess, install_agent, node_for
from harness.control_plane import ControlPlane, install_scv_crd
from harness.paths import COLLECTIONS, ROOT, SIMULATOR_DIR, scenario_path
from harness.stalled_server import StalledServer


def _venvs():
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

    def playbook(self, playbook, scenario, *extra):
        command = [
            str(self.venv / "bin" / "ansible-playbook"), "-i", "localhost,", "-c", "local",
            "-e", "ansible_python_interpreter=%s" % self.python, str(ROOT / playbook),
        ] + list(extra)
        return subprocess.run(command, env=self.env(scenario), capture_output=True, text=True, check=False)


def recap(stdout, host="localhost"):
    """The PLAY RECAP counters of one host, as ints: {'ok': 3, 'changed': 1, ...}."""
    for line in stdout.splitlines():
        name, sep, counters = line.partition(" : ")
        if sep and name.strip() == host and "ok=" in counters:
            return {key: int(value) for key, value in (item.split("=") for item in counters.split())}
    raise AssertionError("no PLAY RECAP line for %s in:\n%s" % (host, stdout))


@pytest.fixture(scope="session", params=_venvs(), ids=lambda v: v.name)
def ansible(request):
    return Ansible(request.param)


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory):
    """A real etcd + kube-apiserver on 127.0.0.1 for the whole session, stopped even when tests fail."""
    plane = ControlPlane(tmp_path_factory.mktemp("control-plane") / "plane")
    try:
        plane.start()
        yield plane
    finally:
        plane.stop()


@pytest.fixture
def scv_crd(control_plane):
    """The Scv CRD, installed (again, if a test removed it)."""
    install_scv_crd(control_plane)
    return control_plane


class ApiRequests:
    """Counts from kube-apiserver's apiserver_request_total for one resource (Scv objects unless told)."""

    def __init__(self, plane):
        self.plane = plane

    def snapshot(self, resource="scvs"):
        metrics = self.plane.kubectl("get", "--raw", "/metrics").stdout
        counts = {}
        for line in metrics.splitlines():
            if not line.startswith("apiserver_request_total{") or 'resource="%s"' % resource not in line:
                continue
            labels = dict(part.split("=", 1) for part in line[line.index("{") + 1:line.index("}")].split(","))
            labels = {key: value.strip('"') for key, value in labels.items()}
            key = (labels["verb"], labels.get("subresource", ""), labels.get("dry_run", ""))
            counts[key] = counts.get(key, 0) + int(float(line.rsplit(" ", 1)[1]))
        return counts

    @staticmethod
    def delta(before, after):
        return {key: after[key] - before.get(key, 0) for key in after if after[key] != before.get(key, 0)}


@pytest.fixture
def api_requests(control_plane):
    return ApiRequests(control_plane)


@pytest.fixture(scope="module")
def access(control_plane, tmp_path_factory):
    """The CRD, RBAC and admission policy, installed by the scv_publish role as a site would."""
    playbook = tmp_path_factory.mktemp("access") / "access.yml"
    playbook.write_text(
        "- hosts: localhost\n  gather_facts: false\n  roles:\n    - role: scv.gpu.scv_publish\n"
        "      vars:\n        scv_publish_kubeconfig: %s\n        scv_publish_state: absent\n"
        "        scv_publish_node_name: agent-access-check\n" % control_plane.admin_kubeconfig)
    done = Ansible(_venvs()[0]).playbook(str(playbook), "titan_xp")
    assert done.returncode == 0, done.stdout + done.stderr
    return control_plane


@pytest.fixture(scope="session")
def agent_command(tmp_path_factory):
    """The agent as the scv_agent role installs it: its zipapp in a venv with only the role's packages."""
    return install_agent(tmp_path_factory.mktemp("agent-install"))


@pytest.fixture
def node(access, request):
    """A node name of the test's own, with no Scv before or after it."""
    name = node_for(request)
    access.kubectl("delete", "scv", name, "--ignore-not-found")
    yield name
    access.kubectl("delete", "scv", name, "--ignore-not-found")


@pytest.fixture
def agent(access, agent_command, tmp_path, request):
    """An agent on a simulated TITAN Xp, publishing the Scv of a node of the test's own (no Node object)."""
    plane = access
    name = node_for(request)
    plane.kubectl("delete", "scv", name, "--ignore-not-found")
    started = AgentProcess(agent_command, plane, name, tmp_path)
    yield started
    started.stop()
    plane.kubectl("delete", "scv", name, "--ignore-not-found")


@pytest.fixture
def agent_on_node(access, agent_command, tmp_path, request):
    """An agent whose Node exists (created as the kubelet would have), on 8 simulated H100s.

    Tests parametrize it indirectly with extra agent arguments.
    """
    plane = access
    name = node_for(request)
    plane.kubectl("delete", "node", name, "--ignore-not-found")
    plane.kubectl("delete", "events", "-n", "default", "--field-selector", "involvedObject.name=%s" % name)
    plane.kubectl("create", "-f", "-", input_text=json.dumps(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}))
    extra = getattr(request, "param", ())
    started = AgentProcess(agent_command, plane, name, tmp_path, scenario="h100_sxm_x8", extra=extra)
    yield started
    started.stop()
    plane.kubectl("delete", "scv", name, "--ignore-not-found")
    plane.kubectl("delete", "node", name, "--ignore-not-found")


@pytest.fixture
def stalled_server():
    """A server that takes connections and never answers (``harness.stalled_server``)."""
    server = StalledServer()
    yield server
    server.close()
