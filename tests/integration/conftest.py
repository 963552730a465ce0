"""Fixtures of the integration tests: the control plane, Ansible on each ansible-core line, the agent.

The ``ansible`` fixture gives each environment SCV_GPU_ANSIBLE_VENVS lists (harness/ansible.py);
``make integration`` runs every test on the newest ansible-core line, then the tests marked
``every_ansible_line`` on ansible-core 2.19.
"""

from __future__ import annotations

import json

import pytest

from harness.agent import AgentProcess, install_agent, node_for
from harness.ansible import Ansible, venvs
from harness.control_plane import ControlPlane, install_scv_crd
from harness.kubelet_podresources import StandInKubelet, generate
from harness.prometheus import build as build_prometheus
from harness.stalled_server import StalledServer


def pytest_collection_modifyitems(items):
    """A test marked every_ansible_line that never runs Ansible would run twice for nothing."""
    idle = [item.nodeid for item in items
            if item.get_closest_marker("every_ansible_line") and "ansible" not in item.fixturenames]
    if idle:
        raise pytest.UsageError("marked every_ansible_line but not using the ansible fixture: %s" % ", ".join(idle))


@pytest.fixture(scope="session", params=venvs(), ids=lambda v: v.name)
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
    done = Ansible(venvs()[0]).playbook(str(playbook), "titan_xp")
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


@pytest.fixture(scope="module")
def prometheus_bin():
    """Prometheus's binary, built once (tools/prometheus/build)."""
    return build_prometheus()


@pytest.fixture
def stalled_server():
    """A server that takes connections and never answers (``harness.stalled_server``)."""
    server = StalledServer()
    yield server
    server.close()


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """The pod-resources API's Python code, generated once per module."""
    return generate(tmp_path_factory.mktemp("podresources"))


@pytest.fixture
def kubelet(generated, tmp_path):
    """A stand-in kubelet serving the pod-resources API on a socket of the test's; set its ``pods``."""
    with StandInKubelet(generated, tmp_path / "kubelet.sock") as server:
        yield server
