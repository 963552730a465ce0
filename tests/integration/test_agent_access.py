"""What a node identity (system:node:<name>, NodeRestriction) lets the agent do: its own Scv and Node status,
not another node's, and not its own taints. A real agent process, and the agent's REST client, against the
real kube-apiserver.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from harness.agent import gpu_condition_of
from harness.control_plane import read_object
from harness.paths import SIMULATOR_DIR, scenario_path


def test_a_node_cannot_set_another_nodes_condition(access, tmp_path):
    from ansible_collections.scv.gpu.plugins.module_utils.kube.errors import ApiError
    from ansible_collections.scv.gpu.plugins.module_utils.kube.rest_client import RestClient
    from ansible_collections.scv.gpu.plugins.module_utils.scv.resource import SCV
    from ansible_collections.scv.gpu.plugins.module_utils.agent.condition import condition_patch

    plane = access
    for name in ("condition-own", "condition-victim"):
        plane.kubectl("delete", "node", name, "--ignore-not-found")
        plane.kubectl("create", "-f", "-", input_text=json.dumps(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}))
    try:
        client = RestClient.from_file(str(plane.node_kubeconfig("condition-own")), resource=SCV)
        patch = condition_patch("False", "GPUUnhealthy", "test", "2026-11-22T00:00:00Z", "2026-11-22T00:00:00Z")
        client.patch_node_status("condition-own", patch)
        assert gpu_condition_of(plane, "condition-own")["status"] == "False"
        with pytest.raises(ApiError) as denied:
            client.patch_node_status("condition-victim", patch)
        assert denied.value.status == 403
        assert gpu_condition_of(plane, "condition-victim") is None
    finally:
        for name in ("condition-own", "condition-victim"):
            plane.kubectl("delete", "node", name, "--ignore-not-found")


def test_what_a_node_identity_may_do_to_its_own_taints(access):
    """NodeRestriction lets a kubelet write its Node's status, not its taints: a taint needs another identity."""
    from ansible_collections.scv.gpu.plugins.module_utils.kube.errors import ApiError
    from ansible_collections.scv.gpu.plugins.module_utils.kube.rest_client import RestClient
    from ansible_collections.scv.gpu.plugins.module_utils.scv.resource import SCV

    plane = access
    plane.kubectl("delete", "node", "taint-own", "--ignore-not-found")
    plane.kubectl("create", "-f", "-", input_text=json.dumps(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "taint-own"}}))
    try:
        client = RestClient.from_file(str(plane.node_kubeconfig("taint-own")), resource=SCV)
        taint = {"spec": {"taints": [{"key": "scv.gpu/unhealthy", "effect": "NoSchedule"}]}}
        with pytest.raises(ApiError) as denied:
            client.patch_node("taint-own", taint)
        assert denied.value.status == 403
        assert "is not allowed to modify taints" in str(denied.value)
        plane.kubectl("taint", "node", "taint-own", "scv.gpu/unhealthy=:NoSchedule")   # the admin may
        node = read_object(plane, "node", "taint-own")
        assert node["spec"]["taints"][0]["key"] == "scv.gpu/unhealthy"
    finally:
        plane.kubectl("delete", "node", "taint-own", "--ignore-not-found")


def test_a_node_cannot_publish_another_nodes_scv(access, agent_command, tmp_path):
    plane = access
    victim = "agent-victim"
    plane.kubectl("delete", "scv", victim, "--ignore-not-found")
    env = dict(os.environ, LD_LIBRARY_PATH=str(SIMULATOR_DIR), NVMLSIM_CONFIG=str(scenario_path("titan_xp")))
    process = subprocess.Popen(
        agent_command + ["--kubeconfig", str(plane.node_kubeconfig("agent-intruder")), "--node-name", victim],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(4)
    process.terminate()
    output = process.communicate(timeout=15)[0]
    assert "may only write its own Scv" in output or "forbidden" in output.lower(), output
    assert plane.kubectl("get", "scv", victim, check=False).returncode != 0
