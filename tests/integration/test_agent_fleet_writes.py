"""A small fleet of agents against a real kube-apiserver whose audit log counts every request each node made.

The bounds of a fleet (``docs/scale.md``), asserted as counts:
- a health transition costs a node at most 3 writes: its Node condition, one Event and its Scv status;
- a card that flaps raises the count of the Event it already has instead of creating another;
- after an API server restart a node makes at most 2 requests in the first 20 s;
- at steady state a node makes no request but its watch;
- the API Priority and Fairness example of docs/scale.md puts the agents' Scv requests in their own level.
"""

from __future__ import annotations

import json
import pathlib
import time

import pytest

from harness.agent_fleet import audited_plane, by_kind, per_node, start_fleet, writes

SIZE = 4
APF_EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "examples" / "apf-scv-agents.yml"


@pytest.fixture(scope="module")
def fleet(agent_command, tmp_path_factory):
    work = tmp_path_factory.mktemp("fleet")
    plane = audited_plane(work / "plane")
    started = None
    try:
        plane.kubectl("apply", "-f", str(APF_EXAMPLE))
        started = start_fleet(plane, work / "agents", agent_command, SIZE)
        time.sleep(5)   # the watches are up
        yield started
    finally:
        if started is not None:
            started.stop()
        plane.stop()


def settled_requests(fleet, since, settle=6.0):
    """The nodes' requests from ``since``, once none came for ``settle`` seconds."""
    quiet_from = time.time()
    count = -1
    while time.time() - quiet_from < settle:
        time.sleep(1)
        now = len(fleet.plane.audit_log.requests(since))
        if now != count:
            count, quiet_from = now, time.time()
    return per_node(fleet.plane.audit_log.requests(since), fleet.nodes)


def events_of(fleet, reason):
    listed = json.loads(fleet.plane.kubectl("get", "events", "-n", "default", "-o", "json").stdout)["items"]
    return {item["involvedObject"]["name"]: item for item in listed
            if item.get("reason") == reason and item["involvedObject"]["name"] in fleet.nodes}


def assert_one_write_of_each(table, event_verb=None):
    """Each node wrote its condition, its Scv status and one Event (created, or counted on: ``event_verb``)
    once, and met no conflict."""
    for node, requests in table.items():
        kinds = by_kind(writes(requests))
        event = event_verb or ("create" if "create events" in kinds else "patch")
        assert kinds == {"patch nodes/status": 1, "update scvs/status": 1, "%s events" % event: 1}, (node, kinds)
        assert [request for request in requests if request.code == 409] == [], node


def test_a_fleet_wide_fault_and_its_recovery_cost_three_writes_a_node(fleet):
    at = fleet.lose_first_cards(True)
    fleet.wait_condition("False")
    assert_one_write_of_each(settled_requests(fleet, at), "create")
    assert set(events_of(fleet, "GPUUnhealthy")) == set(fleet.nodes)

    at = fleet.lose_first_cards(False)
    fleet.wait_condition("True")
    assert_one_write_of_each(settled_requests(fleet, at), "create")


def test_a_flapping_card_counts_on_its_event(fleet):
    before = events_of(fleet, "GPUUnhealthy")
    at = fleet.lose_first_cards(True)
    fleet.wait_condition("False")
    assert_one_write_of_each(settled_requests(fleet, at), "patch")
    after = events_of(fleet, "GPUUnhealthy")
    for node in fleet.nodes:
        assert after[node]["metadata"]["name"] == before[node]["metadata"]["name"]
        assert after[node]["count"] == before[node]["count"] + 1
    at = fleet.lose_first_cards(False)
    fleet.wait_condition("True")
    assert_one_write_of_each(settled_requests(fleet, at), "patch")


def test_steady_state_asks_nothing_but_the_watch(fleet):
    since = time.time()
    time.sleep(20)
    for node, requests in per_node(fleet.plane.audit_log.requests(since), fleet.nodes).items():
        assert [request.verb for request in requests if request.verb != "watch"] == [], node


def watching_again(fleet, since):
    """Whether every node has had a watch answered since ``since`` (a starting server may answer before /readyz)."""
    return all(any(request.verb == "watch" and request.code == 200 for request in mine)
               for mine in per_node(fleet.plane.audit_log.requests(since), fleet.nodes).values())


def test_an_api_server_restart_brings_at_most_two_requests_a_node_in_20_s(fleet):
    down = time.time()
    fleet.plane.stop_apiserver()
    time.sleep(10)
    fleet.plane.start_apiserver()
    ready = time.time()
    time.sleep(20)
    table = per_node(fleet.plane.audit_log.requests(ready, ready + 20), fleet.nodes)
    for node, requests in table.items():
        assert len(requests) <= 2, (node, by_kind(requests))
    # ... and every node is back: its watch, and a change reaches its Scv and Node in one write each, with no
    # conflict (the watch's first bookmark once replaced the version a write sends).
    fleet.wait(lambda: watching_again(fleet, down), 60, "every watch back")
    at = fleet.lose_first_cards(True)
    fleet.wait_condition("False")
    assert_one_write_of_each(settled_requests(fleet, at))
    at = fleet.lose_first_cards(False)
    fleet.wait_condition("True")
    assert_one_write_of_each(settled_requests(fleet, at))


def dispatched(plane, priority_level):
    """Requests API Priority and Fairness dispatched at ``priority_level``, by the API server's own count."""
    total = 0
    for line in plane.kubectl("get", "--raw", "/metrics").stdout.splitlines():
        if line.startswith("apiserver_flowcontrol_dispatched_requests_total{") and \
                'priority_level="%s"' % priority_level in line:
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


def test_the_apf_example_gives_the_agents_scv_requests_a_level_of_their_own(fleet):
    before = dispatched(fleet.plane, "scv-gpu-agents")
    at = fleet.lose_first_cards(True)
    fleet.wait_condition("False")
    settled_requests(fleet, at)
    fleet.lose_first_cards(False)
    fleet.wait_condition("True")
    # At least each node's Scv status write went through the level (its watch, begun earlier, may not count yet).
    assert dispatched(fleet.plane, "scv-gpu-agents") - before >= SIZE
