"""The agent publishes its node's Scv, run for real (a subprocess) against the real kube-apiserver, GPUs from
the simulator: a change within one interval, nothing written while nothing changes, a deleted Scv created
again, the interval the Scv asks for, and no write storm from two agents for one node.

It authenticates as the node (system:node:<name>) after the scv_publish role installed the RBAC and the
admission policy, as on a cluster. Request counts come from the agent's own metrics and from kube-apiserver's
apiserver_request_total.
"""

from __future__ import annotations

import json
import time

from harness.agent import AgentProcess


def test_publishes_then_an_unchanged_interval_makes_no_request(agent, api_requests):
    agent.wait_for(lambda: agent.scv()["status"]["cardList"][0]["model"] == "TITAN Xp", 20)
    scv = agent.scv()
    assert scv["spec"] == {"updateInterval": 1000}
    assert scv["status"]["freeMemorySum"] == 11950
    agent.wait_for(lambda: agent.metrics()["scv_agent_ticks_total"] >= 2, 10)

    before_agent, before_server = agent.metrics(), api_requests.snapshot()
    time.sleep(3.5)
    after_agent, after_server = agent.metrics(), api_requests.snapshot()
    assert after_agent["scv_agent_ticks_total"] - before_agent["scv_agent_ticks_total"] >= 3
    assert after_agent["scv_agent_api_requests_total"] == before_agent["scv_agent_api_requests_total"]
    writes = {key: count for key, count in api_requests.delta(before_server, after_server).items()
              if key[0] not in ("GET", "LIST", "WATCH")}
    assert writes == {}


def test_a_memory_change_is_published_within_one_interval(agent):
    agent.wait_for(lambda: agent.scv()["status"]["freeMemorySum"] == 11950, 20)
    writes = agent.count("writes")
    agent.set_free_memory(6 * 2 ** 30)   # 6144 MiB free
    ticks = agent.count("ticks")        # the tick under way may have read the card before the change
    assert agent.tick_of("writes", writes, 5) <= ticks + 1   # the first tick after the change wrote it
    status = agent.scv()["status"]      # and that write carried the change
    assert status["freeMemorySum"] == 6144 and status["cardList"][0]["freeMemory"] == 6144


def test_a_deleted_scv_is_created_again_within_one_interval(agent):
    agent.wait_for(lambda: agent.scv() is not None and agent.scv().get("status"), 20)
    agent.wait_for(lambda: agent.metrics()["scv_agent_api_requests_total"] >= 4, 10)  # the watch is up
    first_uid = agent.scv()["metadata"]["uid"]
    agent.plane.kubectl("delete", "scv", agent.node)
    ticks = agent.count("ticks")
    assert agent.tick_of("creates", 1, 5) <= ticks + 1       # the first tick after the delete made it again
    assert agent.count("creates") == 2
    agent.wait_for(lambda: agent.scv()["metadata"]["uid"] != first_uid and agent.scv().get("status"), 5)


def test_a_changed_update_interval_is_honoured(agent):
    agent.wait_for(lambda: agent.scv() is not None, 20)
    agent.plane.kubectl("patch", "scv", agent.node, "--type=merge", "-p", '{"spec": {"updateInterval": 3000}}')
    time.sleep(1.0)  # the watch brings the new interval
    before = agent.metrics()["scv_agent_ticks_total"]
    time.sleep(6.2)
    ticks = agent.metrics()["scv_agent_ticks_total"] - before
    assert 2 <= ticks <= 3, ticks
    agent.plane.kubectl("patch", "scv", agent.node, "--type=merge", "-p", '{"spec": {"updateInterval": 500}}')
    time.sleep(1.0)
    before = agent.metrics()["scv_agent_ticks_total"]
    time.sleep(3.0)
    ticks = agent.metrics()["scv_agent_ticks_total"] - before
    assert 5 <= ticks <= 7, ticks


def test_two_agents_for_one_node_make_no_write_storm(access, agent_command, tmp_path):
    """A second agent started for the same node by mistake: both publish the same status, so after the
    first round neither writes while nothing changes, and a change is written about once, not in a loop.
    Once their readings differ, the contest is seen, told (log, Event, metric) and not fought."""
    plane, node = access, "agent-twice"
    plane.kubectl("delete", "scv", node, "--ignore-not-found")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = AgentProcess(agent_command, plane, node, tmp_path / "a")
    second = AgentProcess(agent_command, plane, node, tmp_path / "b")
    try:
        first.wait_for(lambda: first.scv()["status"]["cardList"][0]["model"] == "TITAN Xp", 20)
        time.sleep(3)

        def writes():
            return sum(agent.metrics()["scv_agent_writes_total"] + agent.metrics()["scv_agent_creates_total"]
                       for agent in (first, second))
        settled = writes()
        time.sleep(5)
        assert writes() == settled                    # nothing changed: nobody wrote
        first.set_free_memory(2 ** 30)
        second.set_free_memory(2 ** 30)
        first.wait_for(lambda: first.scv()["status"]["freeMemorySum"] == 1024, 5)
        time.sleep(3)
        assert writes() - settled <= 2, writes() - settled

        # Now they disagree about the card (two hosts under one name): each would write its own back at every
        # tick. One sees the other's writes, says so, and stops.
        first.set_free_memory(3 * 2 ** 30)

        def contested():
            return [agent for agent in (first, second) if agent.metrics()["scv_agent_scv_contested"] == 1]
        first.wait_for(contested, 30)
        log = contested()[0].log.read_text()
        assert "changed the status of Scv agent-twice 3 times in 300 s, each time to other readings" in log, log
        events = json.loads(plane.kubectl("get", "events", "-n", "default", "-o", "json", "--field-selector",
                                          "reason=ScvContested,involvedObject.name=%s" % node).stdout)["items"]
        assert events and events[0]["involvedObject"]["kind"] == "Scv" and events[0]["type"] == "Warning"
        fought = writes()
        time.sleep(10)
        assert writes() - fought <= 2, writes() - fought   # where they wrote at every tick, each 1 s
        for agent in (first, second):
            assert agent.process.poll() is None
    finally:
        first.stop()
        second.stop()
        plane.kubectl("delete", "scv", node, "--ignore-not-found")
