"""GPU health as the agent reports it: an unusable card leaves the Scv's cardList, the Node's GPUHealthy
condition and events follow failures and recoveries, an XID arrives within a second, and an identity allowed
to taint makes the agent taint the node. A real agent process against the real kube-apiserver, GPUs from the
simulator.
"""

from __future__ import annotations

import json
import time

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.nvml.fabric import FABRIC_NOT_STARTED

from harness.agent import AgentProcess, change_scenario, gpu_condition_of, node_events, node_for
from harness.control_plane import read_object


def test_gpu_errors_make_the_card_unhealthy_not_the_agent_stop(agent):
    agent.wait_for(lambda: agent.scv()["status"]["cardList"][0]["health"] == "Healthy", 20)
    scenario = json.loads(agent.scenario.read_text())
    scenario["devices"][0]["errors"] = {"nvmlDeviceGetMemoryInfo": "UNKNOWN"}
    staged = agent.scenario.with_suffix(".new")
    staged.write_text(json.dumps(scenario))
    staged.rename(agent.scenario)
    # an unusable card leaves cardList (what schedulers count) for unhealthyCardList
    agent.wait_for(lambda: agent.scv()["status"]["unhealthyCardList"][0]["health"] == "Unhealthy", 5)
    status = agent.scv()["status"]
    assert "reading the memory information failed" in status["unhealthyCardList"][0]["healthReasons"][0]
    assert status.get("cardList", []) == [] and status.get("cardNumber", 0) == 0


def test_an_unhealthy_gpu_sets_the_node_condition_and_recovery_clears_it(agent_on_node):
    agent, plane = agent_on_node, agent_on_node.plane
    agent.wait_for(lambda: gpu_condition_of(plane, agent.node)["status"] == "True", 20)
    healthy = gpu_condition_of(plane, agent.node)
    assert (healthy["reason"], healthy["message"]) == ("GPUsHealthy", "all 8 GPUs are healthy")
    assert node_events(plane, agent.node) == []          # starting healthy is no transition

    writes = agent.count("condition_writes")
    change_scenario(agent, lambda scenario: scenario["devices"][3].update(errors={"*": "GPU_IS_LOST"}))
    ticks = agent.count("ticks")
    assert agent.tick_of("condition_writes", writes, 5) <= ticks + 1   # the first tick after the loss wrote it
    lost = gpu_condition_of(plane, agent.node)
    assert lost["status"] == "False"    # that write carried it
    assert lost["reason"] == "GPUUnhealthy"
    assert lost["message"].startswith("1 of 8 GPUs unhealthy. GPU 3") and "GPU is lost" in lost["message"]
    assert lost["lastTransitionTime"] >= healthy["lastTransitionTime"]
    agent.wait_for(lambda: node_events(plane, agent.node) == [("Warning", "GPUUnhealthy")], 5)

    change_scenario(agent, lambda scenario: scenario["devices"][3].pop("errors"))
    agent.wait_for(lambda: gpu_condition_of(plane, agent.node)["status"] == "True", 5)
    agent.wait_for(lambda: node_events(plane, agent.node) == [("Warning", "GPUUnhealthy"), ("Normal", "GPUsHealthy")], 5)
    metrics = agent.metrics()
    assert metrics["scv_agent_events_total"] == 2
    # healthy, lost (the message may change once: the first read still knew the card's UUID), healthy
    assert 3 <= metrics["scv_agent_condition_writes_total"] <= 4


def test_a_deleted_node_is_looked_for_not_written_at_every_tick_and_gets_its_condition_back(agent_on_node):
    """The Node is deleted, then a GPU fails: the condition's write meets 404. The agent then looks for the
    Node every 10 s instead of writing at every tick, and sets the condition once the Node is back."""
    agent, plane = agent_on_node, agent_on_node.plane
    agent.wait_for(lambda: gpu_condition_of(plane, agent.node)["status"] == "True", 20)
    plane.kubectl("delete", "node", agent.node)
    change_scenario(agent, lambda scenario: scenario["devices"][3].update(errors={"*": "GPU_IS_LOST"}))
    agent.wait_for(lambda: "there is no Node %s" % agent.node in agent.log.read_text(), 5)
    before = agent.metrics()["scv_agent_api_requests_total"]
    time.sleep(5)
    # Five ticks with a changed condition and no Node: at most one look for it, not a PATCH at every tick.
    assert agent.metrics()["scv_agent_api_requests_total"] - before <= 1
    writes = agent.count("condition_writes")
    plane.kubectl("create", "-f", "-", input_text=json.dumps(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": agent.node}}))
    took = agent.wait_for_count("condition_writes", writes, 15)
    # The next look for the Node, 10 s after the last, comes with the first tick after that: within one interval
    # (1 s) and the ticks' own work, given room here for a machine running the whole suite beside it.
    assert took < 10 + 1.0 + 2.0, took
    assert gpu_condition_of(plane, agent.node)["status"] == "False"
    assert gpu_condition_of(plane, agent.node)["message"].startswith("1 of 8 GPUs unhealthy. GPU 3")


@pytest.mark.parametrize("agent_on_node", [("--default-interval", "5000", "--xid-hold", "3")], indirect=True)
def test_an_xid_reaches_the_scv_and_the_node_within_a_second_not_an_interval(agent_on_node):
    agent, plane = agent_on_node, agent_on_node.plane
    agent.wait_for(lambda: gpu_condition_of(plane, agent.node)["status"] == "True", 20)
    agent.wait_for(lambda: agent.scv()["spec"]["updateInterval"] == 5000, 5)
    # Just after a tick, so that the next is 5 s away: a write well before that can only be the event's.
    ticks, writes = agent.count("ticks"), agent.count("condition_writes")
    agent.wait_for_count("ticks", ticks, 8)
    change_scenario(agent, lambda scenario: scenario["devices"][5].update(xids=[{"xid": 79, "afterMs": 0}]))
    took = agent.wait_for_count("condition_writes", writes, 5)
    assert took < 3.0, took
    assert gpu_condition_of(plane, agent.node)["status"] == "False"
    message = gpu_condition_of(plane, agent.node)["message"]
    assert "GPU 5 (GPU-5a7c0005-1f2e-4d3c-8b4a-9e8d7c6b5a45)" in message
    assert "XID 79 at " in message and "GPU has fallen off the bus; reboot the node" in message
    status = agent.scv()["status"]
    assert [card["id"] for card in status["unhealthyCardList"]] == [5] and status["cardNumber"] == 7
    agent.wait_for(lambda: node_events(plane, agent.node) == [("Warning", "GPUUnhealthy")], 5)
    assert agent.metrics()["scv_agent_xid_events_total"] == 1
    # --xid-hold 3: the card counts as healthy again 3 s after the XID, at the next tick (5 s)
    agent.wait_for(lambda: gpu_condition_of(plane, agent.node)["status"] == "True", 12)
    assert agent.scv()["status"]["cardNumber"] == 8


@pytest.mark.parametrize("agent_on_node", [("--counters-interval", "3")], indirect=True)
def test_a_gpu_whose_nvlink_fabric_stops_is_unhealthy_within_a_counters_interval(agent_on_node):
    """Fabric Manager stops on an HGX board: the fabric is read every counters interval, not at every tick,
    and its state reaches the Scv, the Node's condition and an Event; trained again, the GPU is healthy."""
    agent, plane = agent_on_node, agent_on_node.plane
    agent.wait_for(lambda: gpu_condition_of(plane, agent.node)["status"] == "True", 20)
    assert agent.scv()["status"]["cardList"][3]["health"] == "Healthy"
    writes = agent.count("condition_writes")
    change_scenario(agent, lambda scenario: scenario["devices"][3]["fabric"].update(state=1))
    took = agent.wait_for_count("condition_writes", writes, 10)
    assert took < 3 + 1.0 + 2.0, took   # a counters interval (3 s), then the next tick (1 s), and its work
    assert gpu_condition_of(plane, agent.node)["status"] == "False"
    message = gpu_condition_of(plane, agent.node)["message"]
    assert message.startswith("1 of 8 GPUs unhealthy. GPU 3") and "NVLink fabric has not started" in message
    unhealthy = agent.scv()["status"]["unhealthyCardList"]
    assert [(card["id"], card["healthReasons"]) for card in unhealthy] == [(3, [FABRIC_NOT_STARTED])]
    agent.wait_for(lambda: node_events(plane, agent.node) == [("Warning", "GPUUnhealthy")], 5)

    change_scenario(agent, lambda scenario: scenario["devices"][3]["fabric"].update(state=3))
    agent.wait_for(lambda: gpu_condition_of(plane, agent.node)["status"] == "True", 10)
    agent.wait_for(lambda: node_events(plane, agent.node) == [("Warning", "GPUUnhealthy"), ("Normal", "GPUsHealthy")], 5)


@pytest.mark.parametrize("agent_on_node", [("--xid-action", "79=none")], indirect=True)
def test_an_xid_whose_action_is_none_leaves_the_card_healthy(agent_on_node):
    agent, plane = agent_on_node, agent_on_node.plane
    agent.wait_for(lambda: gpu_condition_of(plane, agent.node)["status"] == "True", 20)
    change_scenario(agent, lambda scenario: scenario["devices"][5].update(xids=[{"xid": 79, "afterMs": 0}]))
    agent.wait_for(lambda: agent.metrics()["scv_agent_xid_events_total"] == 1, 5)
    time.sleep(1.5)
    assert gpu_condition_of(plane, agent.node)["status"] == "True"
    assert agent.scv()["status"]["cardNumber"] == 8


def test_with_an_identity_allowed_to_taint_the_agent_taints_an_unhealthy_node_and_untaints_it(
        access, agent_command, tmp_path, request):
    plane = access
    node = node_for(request)
    plane.kubectl("delete", "node", node, "--ignore-not-found")
    plane.kubectl("create", "-f", "-", input_text=json.dumps(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node},
         "spec": {"taints": [{"key": "site/maintenance", "effect": "PreferNoSchedule"}]}}))
    plane.kubectl("apply", "-f", "-", input_text=json.dumps({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "scv-gpu-tainter"},
         "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "scv-gpu-tainter"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "scv-gpu-tainter"},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "scv-gpu-tainter"}]}]}))
    tainter = plane.kubeconfig("tainter", "scv-gpu-tainter", "scv-gpu-tainters")
    agent = AgentProcess(agent_command, plane, node, tmp_path, scenario="h100_sxm_x8",
                         extra=("--taint-kubeconfig", str(tainter)))

    def taints():
        """Our taint and the site's; the API server's own not-ready taint is kept by the agent too (asserted)."""
        spec = read_object(plane, "node", node)["spec"]
        keys = [(taint["key"], taint["effect"]) for taint in spec.get("taints", [])]
        assert ("node.kubernetes.io/not-ready", "NoSchedule") in keys
        return sorted(key for key in keys if not key[0].startswith("node.kubernetes.io/"))
    try:
        agent.wait_for(lambda: gpu_condition_of(plane, agent.node)["status"] == "True", 20)
        assert taints() == [("site/maintenance", "PreferNoSchedule")]
        change_scenario(agent, lambda scenario: scenario["devices"][1].update(errors={"*": "GPU_IS_LOST"}))
        agent.wait_for(lambda: taints() == [("scv.gpu/gpu-unhealthy", "NoSchedule"),
                                            ("site/maintenance", "PreferNoSchedule")], 5)
        change_scenario(agent, lambda scenario: scenario["devices"][1].pop("errors"))
        agent.wait_for(lambda: taints() == [("site/maintenance", "PreferNoSchedule")], 10)
        assert agent.metrics()["scv_agent_taint_changes_total"] == 2
    finally:
        agent.stop()
        plane.kubectl("delete", "scv", node, "--ignore-not-found")
        plane.kubectl("delete", "node", node, "--ignore-not-found")
