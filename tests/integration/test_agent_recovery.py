"""The agent outlives what it depends on: the API server away, the Scv definition deleted and installed again,
the driver changed under it, absent at its start, or answering UNINITIALIZED once. A real agent process
against the real kube-apiserver, GPUs from the simulator.
"""

from __future__ import annotations

import json
import shutil
import time

from harness.agent import AgentProcess, change_scenario, gpu_condition_of
from harness.control_plane import read_object
from harness.paths import scenario_path


def test_survives_an_api_server_outage_and_publishes_when_it_returns(agent):
    agent.wait_for(lambda: agent.scv()["status"]["freeMemorySum"] == 11950, 20)
    # The first tick publishes, then ends (and starts the watch): until it has ended, /healthz says "starting".
    agent.wait_for(lambda: agent.healthz()[1]["detail"].endswith("; the API server answers"), 10)
    agent.plane.stop_apiserver()
    try:
        # Nothing changed, so no tick writes: /healthz still knows, from the watch, that the server is away.
        agent.wait_for(lambda: "; the API server has not answered for " in agent.healthz()[1]["detail"], 15)
        status, body = agent.healthz()
        assert status == 200 and body["status"] == "ok", body      # alive, waiting: no restart wanted
        agent.set_free_memory(2 * 2 ** 30)   # changes while the server is away
        time.sleep(4)
        assert agent.process.poll() is None, agent.log.read_text()
        assert agent.metrics()["scv_agent_errors_total"] >= 1
    finally:
        agent.plane.start_apiserver()
    agent.wait_for(lambda: agent.scv()["status"]["freeMemorySum"] == 2048, 40)
    agent.wait_for(lambda: agent.healthz()[1]["detail"].endswith("; the API server answers"), 10)


def test_nvml_stays_initialised_and_starts_anew_after_a_driver_change(agent):
    agent.wait_for(lambda: agent.metrics()["scv_agent_ticks_total"] >= 4, 20)
    metrics = agent.metrics()
    assert (metrics["scv_agent_nvml_inits_total"], metrics["scv_agent_nvml_static_reads_total"]) == (1, 1)
    assert metrics["scv_agent_nvml_seconds_total"] > 0

    def upgrade(scenario):
        scenario["driverVersion"] = "550.54.15"
        scenario["devices"][0]["maxClocks"]["memory"] = 5000   # a static reading: read again only in a new session
    writes = agent.count("writes")
    change_scenario(agent, upgrade)
    ticks = agent.count("ticks")
    # The first tick after the upgrade starts the new session: it waits out the event waiter's current wait (up to
    # XID_WAIT_MS: NVML is not shut down under it), and publishes.
    assert agent.tick_of("writes", writes, 10) <= ticks + 1
    assert agent.scv()["status"]["cardList"][0]["clock"] == 5000   # that write carried the new session's reading
    assert agent.metrics()["scv_agent_nvml_inits_total"] == 2
    assert "NVML initialised anew: RM has detected an NVML/RM version mismatch" in agent.log.read_text()


def test_a_transient_uninitialized_answer_is_retried_in_a_new_session_not_published(agent, api_requests):
    agent.wait_for(lambda: agent.scv()["status"]["cardList"][0]["health"] == "Healthy", 20)
    agent.wait_for(lambda: agent.metrics()["scv_agent_ticks_total"] >= 2, 10)
    before = api_requests.snapshot()
    change_scenario(agent, lambda scenario: scenario["devices"][0].update(
        errors={"nvmlDeviceGetMemoryInfo": {"error": "UNINITIALIZED", "times": 1}}))
    agent.wait_for(lambda: agent.metrics()["scv_agent_nvml_inits_total"] == 2, 5)
    time.sleep(1.5)
    writes = {key: count for key, count in api_requests.delta(before, api_requests.snapshot()).items()
              if key[0] not in ("GET", "LIST", "WATCH")}
    assert writes == {}                 # the card never looked Unhealthy
    assert agent.scv()["status"]["cardList"][0]["health"] == "Healthy"


def test_the_scv_definition_deleted_and_installed_again(agent):
    """The CRD goes (and every Scv with it) and comes back: the agent backs off, then creates its Scv again."""
    plane = agent.plane
    agent.wait_for(lambda: agent.scv()["status"]["cardList"][0]["model"] == "TITAN Xp", 20)
    definition = read_object(plane, "crd", "scvs.core.run-linux.com")
    for key in ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields"):
        definition["metadata"].pop(key, None)
    definition.pop("status", None)
    creates = agent.count("creates")
    plane.kubectl("delete", "crd", "scvs.core.run-linux.com")
    try:
        time.sleep(4)
        assert agent.process.poll() is None
        failing = agent.metrics()
        assert failing["scv_agent_errors_total"] >= 1
    finally:
        plane.kubectl("create", "-f", "-", input_text=json.dumps(definition))
    took = agent.wait_for_count("creates", creates, 40)
    assert took < 35, took          # within the longest backoff
    agent.wait_for(lambda: agent.scv()["status"]["cardList"][0]["model"] == "TITAN Xp", 10)


def test_an_agent_started_before_the_driver_publishes_no_gpu_then_every_gpu(access, agent_command, tmp_path):
    """nvmlInit fails (the driver is not loaded yet): the Scv offers nothing, the condition says why, the agent
    keeps trying, and the GPUs appear once the driver answers."""
    plane, node = access, "agent-before-driver"
    plane.kubectl("delete", "scv", node, "--ignore-not-found")
    plane.kubectl("delete", "node", node, "--ignore-not-found")
    plane.kubectl("create", "-f", "-", input_text=json.dumps(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}))
    agent = AgentProcess(agent_command, plane, node, tmp_path, scenario="driver_not_loaded")
    try:
        agent.wait_for(lambda: "status" in agent.scv(), 20)
        status = agent.scv()["status"]
        assert status.get("cardNumber", 0) == 0, status
        assert status.get("cardList", []) == [] and status.get("healthyCardNumber", 0) == 0
        assert status.get("totalMemorySum", 0) == 0
        condition = gpu_condition_of(plane, node)
        assert (condition["status"], condition["reason"]) == ("False", "NVMLUnavailable")
        assert "driver" in condition["message"].lower()
        writes = agent.count("writes")
        shutil.copy(scenario_path("h100_sxm_x8"), agent.scenario)
        ticks = agent.count("ticks")
        assert agent.tick_of("writes", writes, 10) <= ticks + 1   # the first tick after it tried nvmlInit again
        assert agent.scv()["status"]["cardNumber"] == 8
        agent.wait_for(lambda: gpu_condition_of(plane, node)["status"] == "True", 5)
        assert agent.process.poll() is None
    finally:
        agent.stop()
        plane.kubectl("delete", "scv", node, "--ignore-not-found")
        plane.kubectl("delete", "node", node, "--ignore-not-found")
